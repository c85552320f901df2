"""GPU check: the MLP (512→2048→2048→10, FP32) on CUDA, Sluice over HTTP vs in-process torch.

Usage (on a machine with a CUDA device and a CUDA build of torch)::

    python benchmarks/bench_gpu.py --duration 5 --concurrency 1 8 32

One run

(a) exports the MLP as TorchScript and times it in this process on ``cuda:0``: batch 1
    and batches 8/32/128, each call copying its input from host memory and its output
    back (as a server must), for ``--duration`` seconds each → infer/s (samples/s);
(b) starts ``sluice serve`` on a repository holding that file as model ``mlp_gpu``
    (``platform: "pytorch_libtorch"``, ``KIND_GPU`` × ``--instances`` on GPU 0,
    ``max_batch_size: 128``, dynamic batching with ``--queue-delay-us``), on free ports
    with a key prefix of its own (its keys are deleted at the end), against
    ``--redis-url`` (a private ``redis-server`` is started when none answers);
(c) drives it at each ``--concurrency`` with that many client processes, each one
    ``tritonclient.http`` client sending batch-1 requests of distinct random inputs, and
    checks every answer against the in-process result (max abs error printed);
(d) prints, per row, infer/s, p50/p99 in µs, the ratio to in-process batch 1 and to the
    best in-process batch, the server's CPU per request (Sluice's process tree and
    Redis, from /proc), the mean GPU utilization NVML reported during the row and the
    average batch size the dynamic batcher formed (from the statistics extension).

Nothing is asserted; every loop is bounded in time; the server is stopped at the end.
Exit code 2 when CUDA is not available.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_anchors import model_counts, redis_cpu_ticks, tree_cpu_ticks  # noqa: E402

from sluice.broker.redis_server import (  # noqa: E402
    delete_prefix,
    free_port,
    redis_answers,
    start_private_redis,
)

MODEL = "mlp_gpu"
CONFIG = """
name: "mlp_gpu"
platform: "pytorch_libtorch"
max_batch_size: 128
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 512 ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay} }}
instance_group [ {{ kind: {kind} count: {count}{gpus} }} ]
"""


def build_mlp(torch: Any) -> Any:
    """The benchmark MLP, FP32 [n, 512] → [n, 10], seeded, in eval mode."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(512, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 10),
    ).eval()


def in_process(
    torch: Any, module: Any, batch: int, duration_s: float, device: str
) -> tuple[float, float]:
    """Sequential calls on ``device`` with host copies both ways → (samples/s, p50 µs)."""
    x = np.random.default_rng(batch).standard_normal((batch, 512)).astype(np.float32)
    latencies: list[float] = []
    with torch.inference_mode():
        for _ in range(50):  # warm-up: kernels chosen, caches filled
            module(torch.from_numpy(x).to(device)).cpu()
        end = time.perf_counter() + duration_s
        while (start := time.perf_counter()) < end:
            module(torch.from_numpy(x).to(device)).cpu().numpy()
            latencies.append(time.perf_counter() - start)
    samples = len(latencies) * batch
    return samples / sum(latencies), float(np.median(latencies) * 1e6)


def _client(url: str, seed: int, start_at: float, end_at: float, out: Any) -> None:
    """One client process: batch-1 requests until ``end_at`` (monotonic seconds)."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url, network_timeout=30)
    rng = np.random.default_rng(seed)
    latencies: list[float] = []
    checks: list[tuple[np.ndarray, np.ndarray]] = []
    errors = 0
    while (now := time.monotonic()) < end_at:
        x = rng.standard_normal((1, 512)).astype(np.float32)
        tensor = httpclient.InferInput("INPUT__0", [1, 512], "FP32")
        tensor.set_data_from_numpy(x)
        try:
            y = client.infer(MODEL, [tensor]).as_numpy("OUTPUT__0")
        except Exception:
            errors += 1
            continue
        if now >= start_at:
            latencies.append(time.monotonic() - now)
            if len(checks) < 20:
                checks.append((x, y))
    client.close()
    out.put((latencies, checks, errors))


class GpuUtilization(threading.Thread):
    """Samples NVML's GPU 0 utilization every 50 ms while running."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[float] = []
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            return
        while not self._halt.wait(0.05):
            self.samples.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)

    def stop(self) -> float:
        """Stop sampling → mean utilization in % (NaN without NVML)."""
        self._halt.set()
        self.join(2)
        return float(np.mean(self.samples)) if self.samples else float("nan")


def drive(
    url: str, concurrency: int, duration_s: float, warmup_s: float, reference: Any, pid: int
) -> dict[str, float]:
    """One row: ``concurrency`` client processes for ``warmup_s`` + ``duration_s``."""
    import torch

    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start_at = time.monotonic() + 1.0 + warmup_s
    end_at = start_at + duration_s
    procs = [
        ctx.Process(target=_client, args=(url, 1000 * concurrency + i, start_at, end_at, out))
        for i in range(concurrency)
    ]
    for proc in procs:
        proc.start()
    time.sleep(max(0.0, start_at - time.monotonic()))
    counts0 = model_counts(url, MODEL)
    ticks0 = tree_cpu_ticks(pid) + redis_cpu_ticks()
    gpu = GpuUtilization()
    gpu.start()
    time.sleep(max(0.0, end_at - time.monotonic()))
    ticks1 = tree_cpu_ticks(pid) + redis_cpu_ticks()
    counts1 = model_counts(url, MODEL)
    utilization = gpu.stop()
    latencies: list[float] = []
    errors = 0
    max_err = 0.0
    for _ in procs:
        got, checks, errs = out.get(timeout=duration_s + 60)
        latencies += got
        errors += errs
        for x, y in checks:
            with torch.inference_mode():
                expected = reference(torch.from_numpy(x)).numpy()
            max_err = max(max_err, float(np.abs(y - expected).max()))
    for proc in procs:
        proc.join(10)
    lat = np.array(latencies)
    cpu_us = (ticks1 - ticks0) / os.sysconf("SC_CLK_TCK") * 1e6 / max(1, lat.size)
    return {
        "infer_s": lat.size / duration_s,
        "p50": float(np.percentile(lat, 50) * 1e6) if lat.size else float("nan"),
        "p99": float(np.percentile(lat, 99) * 1e6) if lat.size else float("nan"),
        "errors": errors,
        "max_err": max_err,
        "cpu_us": cpu_us,
        "gpu_util": utilization,
        "avg_batch": (counts1[0] - counts0[0]) / max(1, counts1[1] - counts0[1]),
    }


def _gpu_cell(utilization: float) -> str:
    """Mean GPU utilization as printed: one decimal, ``-`` without NVML readings."""
    return "-" if np.isnan(utilization) else f"{utilization:.1f}"


def _start_server(
    repo: Path, redis_url: str, log: Path, prefix: str
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    grpc_port = free_port()
    metrics_port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sluice.cli",
            "serve",
            "--model-repository",
            str(repo),
            "--http-port",
            str(port),
            "--http-address",
            "127.0.0.1",
            "--grpc-port",
            str(grpc_port),
            "--grpc-address",
            "127.0.0.1",
            "--metrics-port",
            str(metrics_port),
            "--redis-url",
            redis_url,
            "--key-prefix",
            prefix,
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    import requests

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sluice serve exited:\n{log.read_text()}")
        try:
            if (
                requests.get(
                    f"http://127.0.0.1:{port}/v2/models/{MODEL}/ready", timeout=1
                ).status_code
                == 200
            ):
                return process, port
        except requests.RequestException:
            pass
        time.sleep(0.2)
    process.terminate()
    raise RuntimeError(f"sluice serve not ready within 180 s:\n{log.read_text()}")


def _number(kind: type, low: float, strict: bool) -> Any:
    """argparse type: a ``kind`` above ``low`` (``strict``) or at least ``low``."""

    def parse(text: str) -> Any:
        value = kind(text)
        if value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {low}, got {text}")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    positive_s, seconds = _number(float, 0, True), _number(float, 0, False)
    positive, count = _number(int, 0, True), _number(int, 0, False)
    parser.add_argument("--duration", type=positive_s, default=5.0, help="seconds per row")
    parser.add_argument("--warmup", type=seconds, default=1.0, help="seconds before each row")
    parser.add_argument("--concurrency", type=positive, nargs="+", default=[1, 8, 32])
    parser.add_argument("--instances", type=positive, default=1, help="KIND_GPU instances")
    parser.add_argument("--queue-delay-us", type=count, default=500)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cpu: KIND_CPU, a dry run of this script on a machine without GPU",
    )
    args = parser.parse_args(argv)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: torch sees no CUDA device", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}")
    reference = build_mlp(torch)
    scripted = torch.jit.script(reference)
    module = torch.jit.script(build_mlp(torch)).to(args.device)
    rows: list[tuple[str, float, float]] = []
    for batch in (1, 8, 32, 128):
        rate, p50 = in_process(torch, module, batch, args.duration, args.device)
        rows.append((f"in-process torch {args.device} batch {batch}", rate, p50))
        print(f"{rows[-1][0]:<36} {rate:>10.0f} samples/s  p50 {p50:>8.0f} µs", flush=True)
    batch1 = rows[0][1]
    best = max(rate for _, rate, _ in rows)

    private = None
    redis_url = args.redis_url
    if not redis_answers(redis_url):
        private, redis_url = start_private_redis()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        (repo / MODEL / "1").mkdir(parents=True)
        scripted.save(str(repo / MODEL / "1" / "model.pt"))
        (repo / MODEL / "config.pbtxt").write_text(
            CONFIG.format(
                delay=args.queue_delay_us,
                count=args.instances,
                kind="KIND_GPU" if args.device == "cuda" else "KIND_CPU",
                gpus=" gpus: [ 0 ]" if args.device == "cuda" else "",
            )
        )
        prefix = f"sluice-bench-gpu-{uuid.uuid4().hex[:8]}:"
        server, port = _start_server(repo, redis_url, Path(tmp) / "serve.log", prefix)
        try:
            print(
                f"\n{'sluice http (batch 1)':<24} {'infer/s':>8} {'p50 µs':>8} "
                f"{'p99 µs':>8} {'/b1':>6} {'/best':>6} {'cpu µs':>7} {'gpu %':>6} "
                f"{'batch':>6} {'errors':>6} {'max err':>8}"
            )
            for concurrency in args.concurrency:
                row = drive(
                    f"127.0.0.1:{port}",
                    concurrency,
                    args.duration,
                    args.warmup,
                    reference,
                    server.pid,
                )
                print(
                    f"{'c=' + str(concurrency):<24} {row['infer_s']:>8.0f} {row['p50']:>8.0f} "
                    f"{row['p99']:>8.0f} {row['infer_s'] / batch1:>6.2f} "
                    f"{row['infer_s'] / best:>6.2f} {row['cpu_us']:>7.0f} "
                    f"{_gpu_cell(row['gpu_util']):>6} {row['avg_batch']:>6.1f} "
                    f"{row['errors']:>6} "
                    f"{row['max_err']:>8.1e}",
                    flush=True,
                )
        finally:
            server.send_signal(2)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
            delete_prefix(redis_url, prefix)
            if private is not None:
                private.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
