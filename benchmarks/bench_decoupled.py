"""Decoupled models beside Triton 2.51, one run, printed as ratios.

The same decoupled Python model (``benchmarks/assets/decoupled_count_model.py``: one
request, ``--responses`` responses of one INT32 each, then the final flag) runs in
Triton's Python backend (``../shared/bench/start_triton.sh``) and in ``sluice serve``
(with a private ``redis-server`` on a Unix socket), one instance each. Client processes
(tritonclient, gRPC streaming, one stream per simulated user) send a request, read
all its responses, and send the next, for ``--duration`` seconds at each concurrency in
``--conc``; Triton and Sluice alternate ``--pairs`` times. Each row gives responses
per second and the time from sending a request to its first response (p50, p99); each
pair Sluice's ratios to Triton.

  .venv/bin/python benchmarks/bench_decoupled.py
  .venv/bin/python benchmarks/bench_decoupled.py --conc 1 16 --duration 8 --pairs 1

Exit code: 0 when the medians meet the targets (responses per second at the highest
concurrency at least ``--target-rate`` × Triton's; first response at concurrency 1 at
most ``--target-first`` × Triton's), 1 otherwise, 2 when the anchors are missing or a
server does not start.
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import client_load
from bench_anchors import ANCHORS, BENCH, stop_server
from client_load import Tally
from peers import start_sluice, start_triton

from sluice.broker.redis_server import start_private_redis, stop_private_redis

MODEL_FILE = Path(__file__).resolve().parent / "assets" / "decoupled_count_model.py"
CONFIG = """name: "count"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def write_repository(root: Path) -> Path:
    (root / "count" / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(MODEL_FILE, root / "count" / "1" / "model.py")
    (root / "count" / "config.pbtxt").write_text(CONFIG)
    return root


def _user(url: str, responses: int, index: int, stop_at: float, tally: Tally) -> None:
    """One simulated user (:mod:`client_load`): one stream, a loop of request -> all
    ``responses`` responses; records the time to each request's first response."""
    import tritonclient.grpc as grpcclient

    arrived: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: arrived.put(error or result))
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([responses], dtype=np.int32))
    try:
        while time.monotonic() < stop_at:
            sent = time.perf_counter()
            client.async_stream_infer("count", [tensor])
            for k in range(responses):
                item = arrived.get(timeout=60)
                if isinstance(item, Exception):
                    raise item
                if k == 0:
                    tally.samples_s.append(time.perf_counter() - sent)
            tally.answers += responses
    finally:
        client.stop_stream()
        client.close()


def measure_once(args: argparse.Namespace, url: str, conc: int) -> dict:
    """``conc`` streams over up to four client processes for ``--duration`` s."""
    load = client_load.drive(_user, (url, args.responses), conc, args.duration, url)
    return {
        "responses_per_s": load.per_s,
        "first_p50_ms": load.ms(0.5),
        "first_p99_ms": load.ms(0.99),
        "requests": len(load.samples_s),
    }


def measure(args: argparse.Namespace, out: Path) -> list[dict]:
    """Start both servers, run the pairs, stop both; one row per run."""
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[name] = "1"
    private, redis_url = start_private_redis()
    triton = sluice = None
    rows: list[dict] = []
    try:
        triton = start_triton(write_repository(out / "triton"), args.triton_port, out)
        sluice = start_sluice(
            write_repository(out / "sluice"), args.sluice_port, redis_url,
            f"decbench-{uuid.uuid4().hex[:8]}:", out / "sluice.log",
        )  # fmt: skip
        for pair in range(1, args.pairs + 1):
            for conc in args.conc:
                for server, port in (("triton", args.triton_port), ("sluice", args.sluice_port)):
                    row = measure_once(args, f"127.0.0.1:{port + 1}", conc)
                    row.update(server=server, conc=conc, pair=pair)
                    rows.append(row)
                    print(
                        f"pair {pair} c={conc:<3} {server:6} {row['responses_per_s']:8.0f} "
                        f"responses/s, first response p50 {row['first_p50_ms']:6.2f} ms "
                        f"p99 {row['first_p99_ms']:6.2f} ms ({row['requests']} requests)",
                        flush=True,
                    )
    finally:
        for process in (sluice, triton):
            if process is not None:
                stop_server(process)
        stop_private_redis(private)
    return rows


def report(rows: list[dict], args: argparse.Namespace) -> bool:
    """Print the ratios; whether the targets are met."""
    print(f"\n{args.responses} responses per request, gRPC streaming, {args.duration} s runs")
    print("| concurrency | pair | responses/s ratio | first response p50 ratio |")
    print("|---|---|---|---|")
    medians: dict[int, tuple[float, float]] = {}
    for conc in args.conc:
        ratios = []
        for pair in range(1, args.pairs + 1):
            [t] = [r for r in rows if (r["server"], r["conc"], r["pair"]) == ("triton", conc, pair)]
            [s] = [r for r in rows if (r["server"], r["conc"], r["pair"]) == ("sluice", conc, pair)]
            ratio = (
                s["responses_per_s"] / t["responses_per_s"],
                s["first_p50_ms"] / t["first_p50_ms"],
            )
            ratios.append(ratio)
            print(f"| {conc} | {pair} | {ratio[0]:.2f} | {ratio[1]:.2f} |")
        medians[conc] = (
            statistics.median(r[0] for r in ratios),
            statistics.median(r[1] for r in ratios),
        )
        print(f"median c={conc}: responses/s {medians[conc][0]:.2f}x, first response "
              f"{medians[conc][1]:.2f}x")  # fmt: skip
    top, low = max(args.conc), min(args.conc)
    return medians[top][0] >= args.target_rate and medians[low][1] <= args.target_first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conc", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--responses", type=int, default=100, help="responses per request")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--triton-port", type=int, default=28700)
    parser.add_argument("--sluice-port", type=int, default=28800)
    parser.add_argument("--target-rate", type=float, default=1.0)
    parser.add_argument("--target-first", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=None, help="folder for logs")
    args = parser.parse_args()
    if not (BENCH / "start_triton.sh").exists() or not (ANCHORS / "triton-dist").exists():
        print("anchors missing: run ../shared/bench/setup_anchors.sh", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="sluice-decbench-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"run folder: {out}", flush=True)
    try:
        rows = measure(args, out)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    met = report(rows, args)
    print(f"{'MET' if met else 'MISS'} targets: responses/s at c={max(args.conc)} >= "
          f"{args.target_rate}x Triton, first response at c={min(args.conc)} <= "
          f"{args.target_first}x Triton")  # fmt: skip
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
