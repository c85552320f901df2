"""The sequence batcher beside Triton 2.51, one run, printed as ratios; and what a
failover costs.

A stateful GRU cell (``benchmarks/assets/gru_sequence_model.py``: numpy, 64 inputs,
``--hidden`` units, one step per request) runs as the same ``model.py`` in Triton's Python
backend (``../shared/bench/start_triton.sh``) and in ``sluice serve`` (with a private
``redis-server`` on a Unix socket), ``oldest`` strategy, one instance each, the state
kept by the model by correlation id. Sluice also serves ``gru_state``, the same cell
with its state as implicit state kept in Redis (Sluice's own way, the one that survives
the loss of an instance; Triton's Python backend does not feed implicit state back).
perf_analyzer drives ``--conc`` concurrent sequences of ``--length`` steps (random
inputs) over gRPC and HTTP, Triton then Sluice, ``--pairs`` times; every row gives
throughput, p50, p99 and the mean batch size, every pair Sluice's ratios to Triton.

Then the failover: ``gru_failover`` (implicit state, two instances) runs ``--sequences``
sequences from client threads that wait for each answer; the instance holding the most
live sequences is SIGKILLed, and the time from the kill to each moved sequence's next
answer is printed. Every answer is checked against the cell run in this process.

  .venv/bin/python benchmarks/bench_sequences.py
  .venv/bin/python benchmarks/bench_sequences.py --pairs 1 --interval-ms 3000 --kills 1

Exit code: 0 when the median ratios of the ``gru`` rows meet the targets (throughput at
least ``--target-throughput`` × Triton's, p99 at most ``--target-p99`` × Triton's) and
every failover answer was exact; 1 otherwise; 2 when the anchors are missing or a server
does not start.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import redis
import tritonclient.grpc as grpcclient

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_anchors import ANCHORS, BENCH, model_counts, stop_server
from peers import start_sluice, start_triton

import sluice.gpu_workers.backends.python  # noqa: F401  (registers triton_python_backend_utils)
from sluice.broker.redis_server import start_private_redis, stop_private_redis

PERF_ANALYZER = ANCHORS / "perf_analyzer"
MODEL_FILE = Path(__file__).resolve().parent / "assets" / "gru_sequence_model.py"

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 32
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 64 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ {hidden} ] }} ]
parameters {{ key: "hidden" value {{ string_value: "{hidden}" }} }}
sequence_batching {{
  max_sequence_idle_microseconds: 5000000
  oldest {{
    max_candidate_sequences: 64
    preferred_batch_size: [ 16, 32 ]
    max_queue_delay_microseconds: 1000
  }}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }}
  ]{state}
}}
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""

STATE = """
  state [
    {{
      input_name: "STATE_IN"
      output_name: "STATE_OUT"
      data_type: TYPE_FP32
      dims: [ {hidden} ]
      initial_state {{ data_type: TYPE_FP32 dims: [ {hidden} ] zero_data: true name: "zero" }}
    }}
  ]"""


def write_repository(root: Path, sluice: bool, hidden: int) -> Path:
    """The model repository of Triton (``gru``) or Sluice (``gru``, ``gru_state``,
    ``gru_failover``)."""
    models = [("gru", "", 1)]
    if sluice:
        models += [("gru_state", STATE, 1), ("gru_failover", STATE, 2)]
    for name, state, count in models:
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(MODEL_FILE, root / name / "1" / "model.py")
        text = CONFIG.format(name=name, state=state.format(hidden=hidden), count=count,
                             hidden=hidden)  # fmt: skip
        (root / name / "config.pbtxt").write_text(text)
    return root


def perf_analyzer(
    args: argparse.Namespace, model: str, ports: tuple[int, int], protocol: str, out: Path
) -> dict:
    """One perf_analyzer run against the server on ``ports`` (HTTP, gRPC): infer/s, p50
    and p99 (µs) of its CSV row, and the mean batch size from the server's statistics."""
    http = f"127.0.0.1:{ports[0]}"
    url = http if protocol == "http" else f"127.0.0.1:{ports[1]}"
    before = model_counts(http, model)
    command = [
        str(PERF_ANALYZER), "-m", model, "-u", url, "-i", protocol,
        "--concurrency-range", str(args.conc), "--sequence-length", str(args.length),
        "--measurement-interval", str(args.interval_ms), "--max-trials", "4",
        "--stability-percentage", "50", "-f", str(out),
    ]  # fmt: skip
    limit_s = 5 * args.interval_ms / 1000 + 90
    subprocess.run(command, check=True, capture_output=True, timeout=limit_s)
    after = model_counts(http, model)
    with out.open() as f:
        row = next(csv.DictReader(f))
    return {
        "infer_per_s": float(row["Inferences/Second"]),
        "p50_us": float(row["p50 latency"]),
        "p99_us": float(row["p99 latency"]),
        "batch": round((after[0] - before[0]) / max(1, after[1] - before[1]), 1),
    }


def _model_module() -> object:
    spec = importlib.util.spec_from_file_location("gru_sequence_model", MODEL_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def failover(
    args: argparse.Namespace, ports: tuple[int, int], redis_url: str, prefix: str
) -> list[float]:
    """Kill the instance of ``gru_failover`` that holds the most live sequences while
    ``--sequences`` client threads step through theirs; returns, per moved sequence, the
    seconds from the kill to its next answer.

    Raises:
        AssertionError: an answer differs from the in-process cell (beyond 1e-5), or a
            request failed.
    """
    gru = _model_module()
    wx, wh = gru.weights(args.hidden)  # type: ignore[attr-defined]
    steps, kill_after = 12, 4
    rng = np.random.default_rng(11)
    inputs = rng.standard_normal((args.sequences, steps, 1, 64)).astype(np.float32)
    answered: dict[int, list[tuple[float, np.ndarray]]] = {}
    errors: list[str] = []
    killed = threading.Event()
    arrived = threading.Barrier(args.sequences + 1)

    def client(index: int) -> None:
        sid = 9000 + index
        connection = grpcclient.InferenceServerClient(f"127.0.0.1:{ports[1]}")
        out = answered.setdefault(sid, [])
        try:
            for k in range(steps):
                if k == kill_after:
                    arrived.wait(60)
                    killed.wait(60)
                tensor = grpcclient.InferInput("INPUT", [1, 64], "FP32")
                tensor.set_data_from_numpy(inputs[index, k])
                result = connection.infer(
                    "gru_failover", [tensor], sequence_id=sid,
                    sequence_start=k == 0, sequence_end=k == steps - 1,
                )  # fmt: skip
                out.append((time.monotonic(), result.as_numpy("OUTPUT")))
        except Exception as exc:  # the check below reports it
            errors.append(f"sequence {sid}: {exc}")
            arrived.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.sequences)]
    for thread in threads:
        thread.start()
    arrived.wait(60)
    store = redis.Redis.from_url(redis_url)
    holders = {}
    for index in range(args.sequences):
        key = f"{prefix}{{gru_failover}}:seq:1:u:{9000 + index}"
        holders[9000 + index] = (store.hget(key, "inst") or b"").decode()
    records = store.hgetall(f"{prefix}{{gru_failover}}:instances:1")
    store.close()
    victim = max(set(holders.values()), key=list(holders.values()).count)
    pid = json.loads(records[victim.encode()])["pid"]
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    killed.set()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    moved = []
    for index in range(args.sequences):
        sid = 9000 + index
        h = np.zeros((1, args.hidden), np.float32)
        for k, (_, got) in enumerate(answered[sid]):
            h = gru.cell(inputs[index, k], h, wx, wh)  # type: ignore[attr-defined]
            assert np.abs(got - h).max() < 1e-5, (sid, k)
        assert len(answered[sid]) == steps, sid
        if holders[sid] == victim:
            moved.append(answered[sid][kill_after][0] - killed_at)
    return moved


def _instances_ready(redis_url: str, prefix: str, count: int, timeout_s: float = 60) -> bool:
    """Wait (bounded) until ``gru_failover`` has ``count`` READY instance records."""
    store = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            records = store.hgetall(f"{prefix}{{gru_failover}}:instances:1").values()
            if sum(json.loads(r).get("state") == "READY" for r in records) >= count:
                return True
            time.sleep(0.2)
        return False
    finally:
        store.close()


def measure(args: argparse.Namespace, out: Path) -> tuple[list[dict], list[float]]:
    """Start both servers, run the pairs and the failovers, stop both.

    Returns:
        One row per run (server, model, protocol, pair and perf_analyzer's figures) and
        the failover times in s.

    Raises:
        SystemExit: a server did not start.
    """
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(args.blas_threads)  # both servers' models inherit it
    private, redis_url = start_private_redis()
    prefix = f"seqbench-{uuid.uuid4().hex[:8]}:"
    triton = sluice = None
    rows: list[dict] = []
    moved: list[float] = []
    triton_ports = (args.triton_port, args.triton_port + 1)
    sluice_ports = (args.sluice_port, args.sluice_port + 1)
    triton_repo = write_repository(out / "triton", False, args.hidden)
    try:
        triton = start_triton(triton_repo, args.triton_port, out)
        sluice = start_sluice(
            write_repository(out / "sluice", True, args.hidden), args.sluice_port, redis_url,
            prefix, out / "sluice.log",
        )  # fmt: skip
        runs = [("triton", "gru", triton_ports), ("sluice", "gru", sluice_ports)]
        runs.append(("sluice", "gru_state", sluice_ports))
        for pair in range(1, args.pairs + 1):
            for protocol in args.protocols:
                for server, model, ports in runs:
                    csv_path = out / f"{server}-{model}-{protocol}-{pair}.csv"
                    row = perf_analyzer(args, model, ports, protocol, csv_path)
                    row.update(server=server, model=model, protocol=protocol, pair=pair)
                    rows.append(row)
                    print(
                        f"pair {pair} {protocol:4} {server:6} {model:9} "
                        f"{row['infer_per_s']:7.0f}/s p50 {row['p50_us'] / 1000:6.2f} ms "
                        f"p99 {row['p99_us'] / 1000:6.2f} ms batch {row['batch']}",
                        flush=True,
                    )
        for _ in range(args.kills):
            if not _instances_ready(redis_url, prefix, 2):
                raise SystemExit("gru_failover did not get two READY instances")
            times = failover(args, sluice_ports, redis_url, prefix)
            print(f"failover: {len(times)} sequences moved, next answers "
                  f"{min(times):.2f}-{max(times):.2f} s after the kill", flush=True)  # fmt: skip
            moved += times
    finally:
        for process in (sluice, triton):
            if process is not None:
                stop_server(process)
        stop_private_redis(private)
    return rows, moved


def report(rows: list[dict], moved: list[float], args: argparse.Namespace) -> bool:
    """Print the ratio table; whether the targets are met."""
    print(f"\n{args.conc} concurrent sequences of {args.length} steps, perf_analyzer, "
          f"{args.interval_ms} ms windows")  # fmt: skip
    print("| protocol | Sluice model | pair | throughput ratio | p50 ratio | p99 ratio |")
    print("|---|---|---|---|---|---|")
    met = True
    for protocol in args.protocols:
        for model in ("gru", "gru_state"):
            ratios = []
            for pair in range(1, args.pairs + 1):
                [t] = [r for r in rows if r["server"] == "triton" and r["protocol"] == protocol
                       and r["pair"] == pair]  # fmt: skip
                [s] = [r for r in rows if r["server"] == "sluice" and r["model"] == model
                       and r["protocol"] == protocol and r["pair"] == pair]  # fmt: skip
                ratio = (
                    s["infer_per_s"] / t["infer_per_s"], s["p50_us"] / t["p50_us"],
                    s["p99_us"] / t["p99_us"],
                )  # fmt: skip
                ratios.append(ratio)
                print(f"| {protocol} | {model} | {pair} | {ratio[0]:.2f} | {ratio[1]:.2f} | "
                      f"{ratio[2]:.2f} |")  # fmt: skip
            throughput = statistics.median(r[0] for r in ratios)
            p99 = statistics.median(r[2] for r in ratios)
            print(f"median {protocol} {model}: throughput {throughput:.2f}x, p99 {p99:.2f}x")
            if model == "gru":
                met &= throughput >= args.target_throughput and p99 <= args.target_p99
    if moved:
        median, worst = statistics.median(moved), max(moved)
        print(f"failover: {len(moved)} sequences moved over {args.kills} kills; next answer "
              f"after the kill: median {median:.2f} s, max {worst:.2f} s")  # fmt: skip
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conc", type=int, default=32, help="concurrent sequences")
    parser.add_argument("--length", type=int, default=20, help="steps per sequence")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--interval-ms", type=int, default=5000, help="perf_analyzer window")
    parser.add_argument("--protocols", nargs="+", default=["grpc", "http"])
    parser.add_argument("--sequences", type=int, default=16, help="sequences per failover")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256, help="the GRU's hidden units")
    parser.add_argument(
        "--blas-threads", type=int, default=1,
        help="numpy's BLAS threads in both servers' model processes (its idle threads "
        "spin: on a small machine they take a core from the server)",
    )  # fmt: skip
    parser.add_argument("--triton-port", type=int, default=28500)
    parser.add_argument("--sluice-port", type=int, default=28600)
    parser.add_argument("--target-throughput", type=float, default=1.0)
    parser.add_argument("--target-p99", type=float, default=1.5)
    parser.add_argument("--out", type=Path, default=None, help="folder for logs and CSVs")
    args = parser.parse_args()
    if not PERF_ANALYZER.exists() or not (BENCH / "start_triton.sh").exists():
        print("anchors missing: run ../shared/bench/setup_anchors.sh", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="sluice-seqbench-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"run folder: {out}", flush=True)
    try:
        rows, moved = measure(args, out)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    met = report(rows, moved, args)
    print(f"{'MET' if met else 'MISS'} targets: throughput >= {args.target_throughput}x "
          f"Triton, p99 <= {args.target_p99}x (gru rows), exact failover answers")  # fmt: skip
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
