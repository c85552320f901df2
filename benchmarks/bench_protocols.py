"""gRPC vs HTTP on the same model, same run: throughput and p50/p99 latency side by side.

Drives a running Sluice (or Triton) with the unmodified ``tritonclient.http`` (binary
tensors) and ``tritonclient.grpc`` clients, one client per worker thread, each
(protocol, concurrency) pair for a bounded time after a short warm-up.

Usage:
    python benchmarks/bench_protocols.py --http-url 127.0.0.1:18600 --grpc-url 127.0.0.1:18601 \
        [--model add_sub] [--concurrency 1 8] [--seconds 5] [--batch 1]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


@dataclass(frozen=True, slots=True)
class Result:
    """One (protocol, concurrency) measurement."""

    protocol: str
    concurrency: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def throughput(self) -> float:
        """Requests per second."""
        return self.requests / self.seconds


def _inputs(module: object, model: str, batch: int) -> tuple[list[object], list[object]]:
    """Binary input tensors and requested outputs for ``add_sub`` or ``digits``."""
    rng = np.random.default_rng(0)
    if model == "digits":
        arrays = {"input": rng.random((batch, 64), dtype=np.float32) * 16}
        outputs = ["label"]
    else:
        arrays = {
            "INPUT0": rng.random((batch, 16), dtype=np.float32),
            "INPUT1": rng.random((batch, 16), dtype=np.float32),
        }
        outputs = ["OUTPUT0", "OUTPUT1"]
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), "FP32")  # type: ignore[attr-defined]
        if module is httpclient:
            tensor.set_data_from_numpy(array, binary_data=True)
            wanted = [httpclient.InferRequestedOutput(o, binary_data=True) for o in outputs]
        else:
            tensor.set_data_from_numpy(array)
            wanted = [grpcclient.InferRequestedOutput(o) for o in outputs]
        inputs.append(tensor)
    return inputs, wanted


def _client_factory(protocol: str, url: str) -> Callable[[], object]:
    if protocol == "http":
        return lambda: httpclient.InferenceServerClient(url, concurrency=1, network_timeout=60)
    return lambda: grpcclient.InferenceServerClient(url)


def run_one(
    protocol: str, url: str, model: str, batch: int, concurrency: int, seconds: float
) -> Result:
    """Run ``concurrency`` closed-loop workers for ``seconds`` (after 1 s of warm-up)."""
    module = httpclient if protocol == "http" else grpcclient
    make_client = _client_factory(protocol, url)
    start_at = time.monotonic() + 1.0
    stop_at = start_at + seconds
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        client = make_client()
        inputs, outputs = _inputs(module, model, batch)
        mine = latencies[index]
        try:
            while True:
                t0 = time.monotonic()
                if t0 >= stop_at:
                    break
                client.infer(model, inputs, outputs=outputs)  # type: ignore[attr-defined]
                t1 = time.monotonic()
                if t0 >= start_at:
                    mine.append(t1 - t0)
        except BaseException as exc:  # report, do not hang the run
            errors.append(exc)
        finally:
            client.close()  # type: ignore[attr-defined]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 60)
    if errors:
        raise RuntimeError(f"{protocol} c={concurrency}: {errors[0]!r}")
    flat = sorted(x for per in latencies for x in per)
    if not flat:
        raise RuntimeError(f"{protocol} c={concurrency}: no request finished in the window")
    p99 = flat[min(len(flat) - 1, int(len(flat) * 0.99))]
    return Result(
        protocol, concurrency, len(flat), seconds, statistics.median(flat) * 1e3, p99 * 1e3
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-url", default="127.0.0.1:8000")
    parser.add_argument("--grpc-url", default="127.0.0.1:8001")
    parser.add_argument("--model", default="add_sub", choices=["add_sub", "digits"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured window per cell")
    args = parser.parse_args(argv)

    print(f"model={args.model} batch={args.batch} window={args.seconds:.0f}s binary tensors")
    print(f"{'conc':>4} | {'protocol':>8} | {'infer/s':>9} | {'p50 ms':>7} | {'p99 ms':>7}")
    for concurrency in args.concurrency:
        for protocol, url in (("grpc", args.grpc_url), ("http", args.http_url)):
            r = run_one(protocol, url, args.model, args.batch, concurrency, args.seconds)
            print(
                f"{concurrency:>4} | {protocol:>8} | {r.throughput:>9.1f} | "
                f"{r.p50_ms:>7.2f} | {r.p99_ms:>7.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
