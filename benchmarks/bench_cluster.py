"""The gateway's Redis Cluster connection against redis-py's asyncio ``RedisCluster``.

Starts a 3-primary, 3-replica Redis Cluster on loopback ports (as the tests do), then,
in one event loop, runs ``--concurrency`` coroutines that each send a gateway's request
command (``XADD`` of a 2 KiB entry on one of three model streams, one per primary,
trimmed so the streams stay small) one after the other for ``--duration`` seconds,
through

* ``sluice``: ``broker.cluster_multiplex.ClusterMultiplexedConnection`` (one connection
  per primary, the commands of one loop iteration in one write per node), and
* ``redis-py``: ``redis.asyncio.cluster.RedisCluster.execute_command`` (a pooled
  connection per command).

Prints commands/s, p50/p99 latency and the process's CPU time per command of each, and
the ratios sluice / redis-py measured in the same run.

    .venv/bin/python benchmarks/bench_cluster.py --duration 5 --concurrency 1 32
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis.asyncio.cluster

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from cluster_support import start_cluster, stop_cluster  # noqa: E402

from sluice.broker.cluster_multiplex import ClusterMultiplexedConnection  # noqa: E402

#: streams of three models whose hash tags land on the three primaries
STREAMS = ("bench:{add_sub}:q:1", "bench:{add_sub_a}:q:1", "bench:{digits}:q:1")
PAYLOAD = b"x" * 2048


async def _run(
    send: Callable[[str], Awaitable[object]], concurrency: int, duration_s: float
) -> dict[str, float]:
    latencies: list[float] = []
    stop_at = time.monotonic() + duration_s

    async def one(index: int) -> None:
        stream = STREAMS[index % len(STREAMS)]
        while time.monotonic() < stop_at:
            start = time.perf_counter()
            await send(stream)
            latencies.append(time.perf_counter() - start)

    cpu = time.process_time()
    wall = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(concurrency)))
    wall = time.monotonic() - wall
    cpu = time.process_time() - cpu
    latencies.sort()
    count = len(latencies)
    return {
        "cmd_s": count / wall,
        "p50_us": latencies[count // 2] * 1e6,
        "p99_us": latencies[min(count - 1, int(count * 0.99))] * 1e6,
        "cpu_us": cpu / count * 1e6,
    }


def _xadd(stream: str) -> tuple[object, ...]:
    return ("XADD", stream, "MAXLEN", "~", 1000, "*", "m", PAYLOAD)


async def _measure(url: str, concurrency: int, duration_s: float) -> dict[str, dict[str, float]]:
    sluice = ClusterMultiplexedConnection(url, 10.0)
    await sluice.start()
    nodes = [redis.asyncio.cluster.ClusterNode(*a) for a in sluice._map.seeds]
    pyredis = redis.asyncio.cluster.RedisCluster(startup_nodes=nodes, protocol=2)
    await pyredis.initialize()
    try:
        out = {
            "sluice": await _run(lambda s: sluice.call(*_xadd(s)), concurrency, duration_s),
            "redis-py": await _run(
                lambda s: pyredis.execute_command(*_xadd(s)), concurrency, duration_s
            ),
        }
    finally:
        await sluice.stop()
        await pyredis.aclose()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        cluster = start_cluster(Path(folder) / "cluster")
        try:
            print("clients  client     cmd/s   p50 µs   p99 µs  CPU µs/cmd")
            for concurrency in args.concurrency:
                rows = asyncio.run(_measure(cluster.url, concurrency, args.duration))
                for name, row in rows.items():
                    print(
                        f"{concurrency:7d}  {name:8s} {row['cmd_s']:8.0f} {row['p50_us']:8.0f} "
                        f"{row['p99_us']:8.0f} {row['cpu_us']:10.1f}"
                    )
                ours, theirs = rows["sluice"], rows["redis-py"]
                ratio = {k: ours[k] / theirs[k] for k in ours}
                print(
                    f"{concurrency:7d}  ratio    {ratio['cmd_s']:8.2f}x {ratio['p50_us']:7.2f}x "
                    f"{ratio['p99_us']:7.2f}x {ratio['cpu_us']:9.2f}x  (sluice / redis-py)"
                )
        finally:
            stop_cluster(cluster)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
