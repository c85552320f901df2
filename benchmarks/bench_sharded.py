"""One hot model on a Redis Cluster: its queue on one primary, then split over shards.

Usage::

    python benchmarks/bench_sharded.py [--shards 1 3] [--instances 6] [--sleep-ms 5] \\
        [--seconds 8] [--per-instance 2]

Starts a 3-primary, 3-replica Redis Cluster on loopback ports (as the tests do) and,
for each count of ``--shards``, ``sluice serve`` on it with one model: a Python model
that sleeps ``--sleep-ms`` per execution and uses no CPU (``bench_scaling``'s), batch 1,
``--instances`` instances, its queue split over that many shards (``queue_shards``).
A closed loop of ``--per-instance`` × instances keep-alive HTTP connections sends batch-1
requests for ``--seconds`` after ``--warmup`` s.

Per primary it prints, per request: the commands on the model's queue streams (``XADD``,
``XREADGROUP``, ``XACK``, ``XDEL``), the model's commands (all but the gateway's reply
list's ``RPUSH``, ``EXPIRE``, ``BLMPOP``: the queue, the instances' statistics and
latency histograms, heartbeats) and the time Redis spent in them (``INFO
commandstats``), all commands, and Redis CPU (``INFO cpu`` user + sys), each net of what
that primary does unloaded (measured for ``--idle`` s before and subtracted at its
rate); each primary's share of these, and the largest deviation of a share from an even
third. With one shard the model's commands all land on one primary; with three, a third
on each (each instance's statistics live under the tag of the shard it waits on). The
gateway's reply list is in one slot by the gateway's id, so with one gateway its
primary carries the answers' commands too. Nothing is asserted; every wait is bounded.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from bench_scaling import MODEL, closed_loop, write_model  # noqa: E402
from cluster_support import Cluster, start_cluster, stop_cluster  # noqa: E402
from e2e_support import start_server, stop_server  # noqa: E402

#: the commands of a request on its model's queue streams
QUEUE_COMMANDS = ("xadd", "xreadgroup", "xack", "xdel", "evalsha")
#: the commands on a gateway's reply list (a slot by the gateway's id, not the model's)
REPLY_COMMANDS = ("rpush", "expire", "blmpop")


class Counters:
    """``INFO commandstats`` (calls and µs per command) and ``INFO cpu`` of one node."""

    def __init__(self, port: int) -> None:
        self._client = redis.Redis(port=port, socket_timeout=10)

    def read(self) -> tuple[dict[str, tuple[int, int]], float]:
        stats = self._client.info("commandstats")
        calls = {
            name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for name, v in stats.items()
        }
        cpu = self._client.info("cpu")
        return calls, float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


@dataclass
class Primary:
    """One primary's figures of one run, per request."""

    port: int
    queue_commands: float
    commands: float
    model_commands: float
    model_us: float
    cpu_us: float
    top: str


def _primaries(cluster: Cluster) -> list[int]:
    return sorted(cluster.primaries())


def run(cluster: Cluster, shards: int, args: argparse.Namespace, work: Path) -> None:
    repo = work / f"repo{shards}"
    write_model(repo, args.sleep_ms, 1)
    config = repo / MODEL / "config.pbtxt"
    text = config.read_text().replace("count: 1", f"count: {args.instances}")
    text += f'parameters {{ key: "queue_shards" value: {{ string_value: "{shards}" }} }}\n'
    config.write_text(text)
    server = start_server(
        repo, cluster.url, work / f"serve{shards}.log", "--job-workers", "0", timeout_s=300
    )
    try:
        ports = _primaries(cluster)
        counters = {p: Counters(p) for p in ports}
        idle0 = {p: c.read() for p, c in counters.items()}
        time.sleep(args.idle)
        idle1 = {p: c.read() for p, c in counters.items()}
        before = {p: c.read() for p, c in counters.items()}
        started = time.monotonic()
        window = closed_loop(
            [server.http_port], args.per_instance * args.instances, args.warmup, args.seconds
        )
        elapsed = time.monotonic() - started
        after = {p: c.read() for p, c in counters.items()}
    finally:
        stop_server(server)
    sent = window.answered + window.errors
    whole = max(1, round(sent * elapsed / args.seconds))  # Redis counts the warm-up too
    rows: list[Primary] = []
    for port in ports:
        calls: dict[str, float] = {}
        usec: dict[str, float] = {}
        for name, (n1, u1) in after[port][0].items():
            if name == "info":
                continue
            idle_n = idle1[port][0].get(name, (0, 0))[0] - idle0[port][0].get(name, (0, 0))[0]
            idle_u = idle1[port][0].get(name, (0, 0))[1] - idle0[port][0].get(name, (0, 0))[1]
            n0, u0 = before[port][0].get(name, (0, 0))
            calls[name] = n1 - n0 - idle_n / args.idle * elapsed
            usec[name] = u1 - u0 - idle_u / args.idle * elapsed
        model = [name for name in calls if name not in REPLY_COMMANDS]
        idle_cpu = (idle1[port][1] - idle0[port][1]) / args.idle * elapsed
        rows.append(
            Primary(
                port,
                sum(calls.get(name, 0.0) for name in QUEUE_COMMANDS) / whole,
                sum(calls.values()) / whole,
                sum(calls[name] for name in model) / whole,
                sum(usec[name] for name in model) / whole,
                (after[port][1] - before[port][1] - idle_cpu) / whole * 1e6,
                " ".join(
                    f"{name}:{n / whole:.2f}"
                    for name, n in sorted(calls.items(), key=lambda kv: -kv[1])[:5]
                    if n / whole >= 0.05
                ),
            )
        )
    report(shards, window.answered / args.seconds, window.errors, rows)


def report(shards: int, rate: float, errors: int, rows: list[Primary]) -> None:
    def share(value: float, total: float) -> float:
        return max(0.0, value) / (total or 1.0)

    queue_total = sum(r.queue_commands for r in rows)
    model_total = sum(r.model_commands for r in rows)
    model_us_total = sum(max(0.0, r.model_us) for r in rows)
    cpu_total = sum(max(0.0, r.cpu_us) for r in rows)
    print(f"\nqueue_shards {shards}: {rate:.0f} infer/s, {errors} errors")
    print(
        "| primary | queue cmds/req | model's cmds/req | all cmds/req | model's cmd µs/req "
        "| Redis CPU µs/req | share: queue / model's cmds / their µs / CPU | most called |"
    )
    print("| ---: " * 7 + "| --- |")
    for row in rows:
        shares = " / ".join(
            f"{share(v, t):.0%}"
            for v, t in (
                (row.queue_commands, queue_total),
                (row.model_commands, model_total),
                (row.model_us, model_us_total),
                (row.cpu_us, cpu_total),
            )
        )
        print(
            f"| {row.port} | {row.queue_commands:.2f} | {row.model_commands:.2f} "
            f"| {row.commands:.2f} | {row.model_us:.1f} | {row.cpu_us:.0f} | {shares} "
            f"| {row.top} |"
        )
    even = 1 / len(rows)

    def deviation(values: list[float]) -> float:
        total = sum(max(0.0, v) for v in values)
        return max(abs(share(v, total) - even) / even for v in values)

    print(
        "largest deviation from even: queue commands "
        f"{deviation([r.queue_commands for r in rows]):.0%}, the model's commands "
        f"{deviation([r.model_commands for r in rows]):.0%} (their time "
        f"{deviation([r.model_us for r in rows]):.0%}), Redis CPU with the gateway's reply "
        f"list {deviation([r.cpu_us for r in rows]):.0%}; Redis CPU per request, all "
        f"primaries: {sum(r.cpu_us for r in rows):.0f} µs"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--instances", type=int, default=6)
    parser.add_argument("--sleep-ms", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--idle", type=float, default=3.0)
    parser.add_argument("--per-instance", type=int, default=2)
    args = parser.parse_args(argv)
    if shutil.which("redis-server") is None:
        print("redis-server is not installed", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-sharded-") as folder:
        work = Path(folder)
        cluster = start_cluster(work / "cluster")
        try:
            for shards in args.shards:
                run(cluster, shards, args, work)
        finally:
            stop_cluster(cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main())
