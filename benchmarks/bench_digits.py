"""Batch-1 digits benchmark: Sluice over HTTP vs in-process onnxruntime, in one run.

Usage::

    python benchmarks/bench_digits.py --url 127.0.0.1:8000 \\
        --model-repository examples/model_repository --duration 10 --concurrency 1 8

Measures

(a) in-process onnxruntime on ``<repo>/digits/1/model.onnx``: sequential batch-1
    calls for ``--duration`` seconds (infer/s, p50, p99);
(b) Sluice over HTTP with ``tritonclient.http`` at each ``--concurrency``: that
    many threads, each with its own client, sending batch-1 requests of real
    held-out digit images (binary tensors) for ``--duration`` seconds,

and prints a table where each Sluice row carries its ratio to in-process ORT
(throughput ratio, and p50 ratio). Nothing is asserted. Every loop is bounded in
time. The Python client itself costs a few hundred microseconds of CPU per
request, so at high concurrency on few cores it may be the bottleneck; use
``benchmarks/perf_analyzer.sh`` for throughput ceilings.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODEL = "digits"


@dataclass
class Result:
    """One benchmark row."""

    name: str
    requests: int
    errors: int
    wall_s: float
    latencies_s: np.ndarray

    @property
    def infer_per_s(self) -> float:
        """Completed batch-1 inferences per second."""
        return self.requests / self.wall_s if self.wall_s > 0 else 0.0

    def pct_ms(self, q: float) -> float:
        """Latency percentile ``q`` (0-100) in milliseconds; NaN when nothing completed."""
        if self.latencies_s.size == 0:
            return float("nan")
        return float(np.percentile(self.latencies_s, q) * 1e3)


def _load_build_models() -> ModuleType:
    """Import ``examples/build_models.py`` by path."""
    path = ROOT / "examples" / "build_models.py"
    spec = importlib.util.spec_from_file_location("sluice_examples_build_models", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bench_ort(model_path: Path, images: np.ndarray, duration_s: float, warmup_s: float) -> Result:
    """Sequential batch-1 ``session.run`` calls for ``duration_s`` seconds."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    sess = ort.InferenceSession(
        str(model_path), sess_options=so, providers=["CPUExecutionProvider"]
    )
    rows = [np.ascontiguousarray(images[i : i + 1]) for i in range(len(images))]
    n = len(rows)
    end = time.perf_counter() + warmup_s
    i = 0
    while time.perf_counter() < end:
        sess.run(["label"], {"input": rows[i % n]})
        i += 1
    lat: list[float] = []
    start = time.perf_counter()
    end = start + duration_s
    i = 0
    now = start
    while now < end:
        t0 = time.perf_counter()
        sess.run(["label"], {"input": rows[i % n]})
        now = time.perf_counter()
        lat.append(now - t0)
        i += 1
    return Result("onnxruntime in-process", len(lat), 0, now - start, np.asarray(lat))


def bench_sluice(
    url: str,
    images: np.ndarray,
    concurrency: int,
    duration_s: float,
    warmup_s: float,
    timeout_s: float,
) -> Result:
    """Run ``concurrency`` threads (one HTTP client each) of batch-1 requests for ``duration_s``."""
    import tritonclient.http as httpclient

    n = len(images)
    barrier = threading.Barrier(concurrency + 1)
    lats: list[list[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    first_error: list[str] = []
    window: dict[str, float] = {}

    def worker(k: int) -> None:
        client = httpclient.InferenceServerClient(
            url=url, connection_timeout=timeout_s, network_timeout=timeout_s
        )
        inp = httpclient.InferInput("input", [1, 64], "FP32")
        out = [httpclient.InferRequestedOutput("label")]
        i = k  # each thread starts on a different image
        try:
            barrier.wait()
            warm_end = window["start"]
            while time.perf_counter() < warm_end:  # warm-up (not recorded)
                inp.set_data_from_numpy(images[i % n : i % n + 1])
                with contextlib.suppress(Exception):  # errors are counted in the timed phase
                    client.infer(MODEL, inputs=[inp], outputs=out)
                i += 1
            end = window["end"]
            mine = lats[k]
            while True:
                t0 = time.perf_counter()
                if t0 >= end:
                    break
                inp.set_data_from_numpy(images[i % n : i % n + 1])
                try:
                    client.infer(MODEL, inputs=[inp], outputs=out)
                    mine.append(time.perf_counter() - t0)
                except Exception as exc:
                    errors[k] += 1
                    if not first_error:
                        first_error.append(f"{type(exc).__name__}: {exc}")
                    if time.perf_counter() - t0 < 0.001:
                        time.sleep(0.01)  # don't spin on an instant failure (e.g. refused)
                i += 1
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(concurrency)]
    for t in threads:
        t.start()
    now = time.perf_counter()
    window["start"] = now + warmup_s
    window["end"] = now + warmup_s + duration_s
    barrier.wait()
    for t in threads:
        # a request in flight at the deadline may take up to timeout_s more
        t.join(timeout=max(0.0, window["end"] - time.perf_counter()) + timeout_s + 5.0)
    all_lat = np.asarray([x for lst in lats for x in lst])
    res = Result(
        f"sluice http c={concurrency}", int(all_lat.size), sum(errors), duration_s, all_lat
    )
    if first_error:
        print(
            f"  sluice c={concurrency}: {res.errors} errors, first: {first_error[0]}",
            file=sys.stderr,
        )
    if any(t.is_alive() for t in threads):
        print(
            f"  sluice c={concurrency}: some threads still blocked after the deadline",
            file=sys.stderr,
        )
    return res


def _fmt(x: float, spec: str) -> str:
    """Format a float, or '-' for NaN/inf."""
    return "-" if not np.isfinite(x) else format(x, spec)


def print_table(ref: Result, rows: list[Result]) -> None:
    """Print one row per result, Sluice rows with ratios to ``ref``."""
    header = (
        f"{'run':<26} {'infer/s':>10} {'p50 us':>9} {'p99 us':>9} {'n':>8} {'err':>5} "
        f"{'thr/ORT':>8} {'p50/ORT':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in [ref, *rows]:
        if r is ref:
            thr_ratio, p50_ratio = "", ""
        else:
            thr_ratio = _fmt(
                r.infer_per_s / ref.infer_per_s if ref.infer_per_s else float("nan"), ".3g"
            )
            p50_ratio = _fmt(r.pct_ms(50) / ref.pct_ms(50), ".3g")
        print(
            f"{r.name:<26} {r.infer_per_s:>10.1f} {_fmt(r.pct_ms(50) * 1e3, '.1f'):>9} "
            f"{_fmt(r.pct_ms(99) * 1e3, '.1f'):>9} {r.requests:>8} {r.errors:>5} "
            f"{thr_ratio:>8} {p50_ratio:>8}"
        )
    print(
        "\nthr/ORT: Sluice infer/s divided by in-process ORT infer/s "
        "(higher is better, 1.0 = no server overhead);\n"
        "p50/ORT: Sluice p50 latency divided by in-process ORT p50 (lower is better)."
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        description="digits batch-1: Sluice HTTP vs in-process onnxruntime"
    )
    parser.add_argument("--url", default="127.0.0.1:8000", help="Sluice HTTP host:port")
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=ROOT / "examples" / "model_repository",
        help="repository holding digits/1/model.onnx (for the in-process reference)",
    )
    parser.add_argument(
        "--duration", type=float, default=10.0, help="seconds measured per run (default 10)"
    )
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="unrecorded seconds before each run (default 1)"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[1, 8],
        help="Sluice client threads, one run each",
    )
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="per-request HTTP timeout in seconds"
    )
    parser.add_argument(
        "--skip-server", action="store_true", help="only run the in-process ORT reference"
    )
    args = parser.parse_args(argv)
    if args.duration <= 0 or args.warmup < 0 or any(c < 1 for c in args.concurrency):
        parser.error("--duration must be > 0, --warmup >= 0, --concurrency values >= 1")

    model_path = args.model_repository / MODEL / "1" / "model.onnx"
    if not model_path.is_file():
        print(
            f"error: {model_path} not found; run `python examples/build_models.py` first",
            file=sys.stderr,
        )
        return 2
    images, _ = _load_build_models().digits_test_split()
    images = np.ascontiguousarray(images, dtype=np.float32)

    if not args.skip_server:
        import tritonclient.http as httpclient

        try:
            c = httpclient.InferenceServerClient(
                url=args.url, connection_timeout=5.0, network_timeout=5.0
            )
            ready = c.is_model_ready(MODEL)
            c.close()
        except Exception as exc:
            print(
                f"error: cannot reach the server at {args.url}: {type(exc).__name__}: {exc}",
                file=sys.stderr,
            )
            return 2
        if not ready:
            print(f"error: model '{MODEL}' is not ready on {args.url}", file=sys.stderr)
            return 2

    print(
        f"digits batch 1, {len(images)} held-out images cycled, {args.duration:g}s per run "
        f"(+{args.warmup:g}s warm-up), url {args.url}",
        flush=True,
    )
    ref = bench_ort(model_path, images, args.duration, args.warmup)
    print(f"  done: {ref.name}", flush=True)
    rows: list[Result] = []
    if not args.skip_server:
        for conc in args.concurrency:
            r = bench_sluice(args.url, images, conc, args.duration, args.warmup, args.timeout)
            print(f"  done: {r.name}", flush=True)
            rows.append(r)
    print()
    print_table(ref, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
