"""Bulk job throughput against synchronous throughput, and synchronous latency during it.

Usage::

    python benchmarks/bench_jobs.py [--model digits] [--rows 100000] [--seconds 10] \\
        [--concurrency 32] [--priority-levels] [--redis-url redis://127.0.0.1:6379/0]

Starts ``sluice serve`` (one job worker) on a copy of the example model, then, in one
run:

(a) synchronous load alone: ``--concurrency`` keep-alive HTTP connections sending batch-1
    requests of the model (binary tensors) for ``--seconds``: infer/s, p50, p99;
(b) a bulk job of ``--rows`` JSON-lines rows of the same model, alone, with a progress
    line: rows/s = rows / (finished - started);
(c) the same bulk job again while the synchronous load of (a) runs until it ends: the
    synchronous p50 and p99 during it.

It prints (b) as a ratio to (a)'s infer/s and (c)'s p99 as a ratio to (a)'s, against the
targets (at least 1.0x; at most 2x). ``--priority-levels`` gives the copied model two
priority levels (default 1), so the bulk rows go at level 2. The load generator is a few
lines of asyncio over raw sockets (a request written, its response read by
Content-Length), so it costs little CPU beside the server. Nothing is asserted; every
loop is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))


@dataclass
class Load:
    """One closed-loop load run: requests answered, errors, the window, latencies (s)."""

    requests: int
    errors: int
    seconds: float
    latencies: list[float]

    @property
    def per_s(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def pct_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies, q) * 1e3) if self.latencies else float("nan")


def _bodies(model: str, count: int) -> tuple[bytes, list[bytes]]:
    """A binary batch-1 infer request of ``model`` (HTTP request bytes) and ``count``
    JSON rows (with ``custom_id``) for the bulk job."""
    rng = np.random.default_rng(0)
    if model == "digits":
        arrays = {"input": (rng.random((1, 64)) * 16).astype(np.float32)}
    else:
        arrays = {f"INPUT{i}": rng.random((1, 16)).astype(np.float32) for i in (0, 1)}
    header = {
        "inputs": [
            {"name": n, "shape": [1, a.shape[1]], "datatype": "FP32",
             "parameters": {"binary_data_size": a.nbytes}}
            for n, a in arrays.items()
        ],
        "parameters": {"binary_data_output": True},
    }  # fmt: skip
    text = json.dumps(header).encode()
    body = text + b"".join(a.tobytes() for a in arrays.values())
    request = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: bench\r\n"
        f"Inference-Header-Content-Length: {len(text)}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    rows = []
    for i in range(count):
        data = {n: (rng.random(a.shape[1]) * 16).round(3).tolist() for n, a in arrays.items()}
        row = {
            "custom_id": f"r{i}",
            "inputs": [
                {"name": n, "shape": [1, len(v)], "datatype": "FP32", "data": v}
                for n, v in data.items()
            ],
        }
        rows.append(json.dumps(row).encode())
    return request, rows


async def _client(
    host: str, port: int, request: bytes, stop_at: float, stop: threading.Event, load: Load
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.monotonic() < stop_at and not stop.is_set():
            started = time.perf_counter()
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await asyncio.wait_for(reader.readexactly(length), 30)
            if head.startswith(b"HTTP/1.1 200"):
                load.requests += 1
                load.latencies.append(time.perf_counter() - started)
            else:
                load.errors += 1
    finally:
        writer.close()


def closed_loop(
    url: str, request: bytes, concurrency: int, seconds: float, stop: threading.Event | None = None
) -> Load:
    """``concurrency`` connections sending ``request`` until ``seconds`` pass (or ``stop``)."""
    host, port = url.rsplit(":", 1)
    load = Load(0, 0, 0.0, [])
    stop = stop or threading.Event()

    async def run() -> None:
        stop_at = time.monotonic() + seconds
        await asyncio.gather(
            *(_client(host, int(port), request, stop_at, stop, load) for _ in range(concurrency))
        )

    started = time.monotonic()
    asyncio.run(run())
    load.seconds = time.monotonic() - started
    return load


def _bulk(url: str, model: str, body: bytes, timeout_s: float) -> tuple[dict, float]:
    """Run one bulk job (progress on standard error); the job and its rows per second."""
    from sluice.jobs import JobClient

    reply = urllib.request.urlopen(
        urllib.request.Request(
            f"http://{url}/v2/models/{model}/jobs",
            data=body,
            headers={"Content-Type": "application/jsonl"},
        ),
        timeout=300,
    )
    job_id = json.loads(reply.read())["id"]
    job = JobClient(url, timeout_s=300).wait(job_id, poll_s=1.0, timeout_s=timeout_s)
    return job, job["request_counts"]["total"] / (job["finished_at"] - job["started_at"])


def _with_levels(config: Path) -> None:
    """Give a copied model two priority levels (default 1) in its dynamic batcher."""
    text = config.read_text()
    levels = "priority_levels: 2\n  default_priority_level: 1\n"
    if "dynamic_batching {" in text:
        text = text.replace("dynamic_batching {", "dynamic_batching {\n  " + levels, 1)
    else:
        text += "dynamic_batching {\n  " + levels + "}\n"
    config.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="digits", choices=["digits", "add_sub"])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=10.0, help="the synchronous window")
    parser.add_argument("--concurrency", type=int, default=32, help="synchronous connections")
    parser.add_argument("--priority-levels", action="store_true")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--timeout", type=float, default=1800.0, help="longest bulk job wait, s")
    args = parser.parse_args(argv)

    from e2e_support import start_server, stop_server

    request, rows = _bodies(args.model, args.rows)
    body = b"\n".join(rows) + b"\n"
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-jobs-"))
    repo = work / "models"
    shutil.copytree(ROOT / "examples" / "model_repository" / args.model, repo / args.model)
    if args.priority_levels:
        _with_levels(repo / args.model / "config.pbtxt")
    print(f"starting sluice serve on {repo} ...", flush=True)
    server = start_server(repo, args.redis_url, work / "serve.log")
    url = f"127.0.0.1:{server.http_port}"
    c = args.concurrency
    try:
        closed_loop(url, request, c, 2.0)  # warm-up
        alone = closed_loop(url, request, c, args.seconds)
        print(
            f"(a) sync c={c} alone: {alone.per_s:,.0f} infer/s, p50 {alone.pct_ms(50):.2f} ms, "
            f"p99 {alone.pct_ms(99):.2f} ms"
        )
        print(f"(b) bulk job of {args.rows:,} rows alone:", flush=True)
        job, rows_per_s = _bulk(url, args.model, body, args.timeout)
        print(f"    {job['state']}, {job['request_counts']}, {rows_per_s:,.0f} rows/s")
        print(f"(c) bulk job of {args.rows:,} rows with sync c={c} beside it:", flush=True)
        stop = threading.Event()
        during: list[Load] = []
        load = threading.Thread(
            target=lambda: during.append(closed_loop(url, request, c, args.timeout, stop))
        )
        load.start()
        job2, rows_per_s2 = _bulk(url, args.model, body, args.timeout)
        stop.set()
        load.join(60)
        sync = during[0] if during else Load(0, 0, 0.0, [])
        print(
            f"    {job2['state']}, {rows_per_s2:,.0f} rows/s; sync {sync.per_s:,.0f} infer/s, "
            f"p50 {sync.pct_ms(50):.2f} ms, p99 {sync.pct_ms(99):.2f} ms, {sync.errors} errors"
        )
        print()
        print("| measure | value | target |")
        print("| --- | --- | --- |")
        print(f"| (a) sync infer/s, c={c} | {alone.per_s:,.0f} | |")
        print(f"| (b) bulk rows/s, {args.rows:,} rows | {rows_per_s:,.0f} | |")
        print(f"| (b) ÷ (a) | {rows_per_s / alone.per_s:.2f} | ≥ 1.0 |")
        print(f"| (a) sync p99 alone, ms | {alone.pct_ms(99):.2f} | |")
        print(f"| (c) sync p99 during the bulk job, ms | {sync.pct_ms(99):.2f} | |")
        print(f"| (c) ÷ (a) p99 | {sync.pct_ms(99) / alone.pct_ms(99):.2f} | ≤ 2.0 |")
        print(f"| (c) sync infer/s, bulk rows/s | {sync.per_s:,.0f}, {rows_per_s2:,.0f} | |")
    finally:
        code = stop_server(server)
        print(f"sluice serve exited with {code}; log: {work / 'serve.log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
