"""gRPC vs HTTP: Sluice beside the floor its two front-end libraries set, in one run.

Starts ``floor_server.py`` (identity answered in the front end: uvicorn for HTTP,
``grpc.aio`` for gRPC, nothing else) and ``sluice serve`` on the anchors' ONNX repository,
then drives each with perf_analyzer on ``identity_fp32`` (binary tensors, batch 1) over
HTTP and gRPC at each concurrency. Per row: throughput, p50/p99, and server CPU per
request (the server's process tree, plus Redis for Sluice), counted from the servers'
own request counters. Then, per server, gRPC ÷ HTTP for throughput and CPU.

The floor rows say what a request costs in each library before any serving logic; when
the gRPC floor alone costs more CPU per request than Sluice's whole HTTP path, gRPC
cannot match HTTP on a machine whose cores are all busy.

Usage (needs ``../shared/bench/setup_anchors.sh`` for perf_analyzer and the models):
    .venv/bin/python benchmarks/bench_grpc_floor.py [--conc 1 32] [--window-ms 2000]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench_anchors import ANCHORS, ROOT, redis_cpu_ticks, tree_cpu_ticks

PA = ANCHORS / "perf_analyzer"
MODEL = "identity_fp32"
TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Server:
    """A server under test: its ports, process group leader and request counter."""

    name: str
    http_port: int
    grpc_port: int
    process: subprocess.Popen[bytes]
    with_redis: bool

    def served(self) -> int:
        """Requests answered so far (Sluice: the model's success count)."""
        path = f"/v2/models/{MODEL}/stats" if self.with_redis else "/floor/count"
        url = f"http://127.0.0.1:{self.http_port}{path}"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        if self.with_redis:
            return sum(m["inference_stats"]["success"]["count"] for m in body["model_stats"])
        return int(body["count"])

    def cpu_ticks(self) -> int:
        """utime+stime of the server's process tree (and Redis), in clock ticks."""
        return tree_cpu_ticks(self.process.pid) + (redis_cpu_ticks() if self.with_redis else 0)


def _wait_ready(server: Server, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    url = f"http://127.0.0.1:{server.http_port}/v2/models/{MODEL}/ready"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if server.process.poll() is not None or time.monotonic() > end:
            raise SystemExit(f"{server.name} did not become ready (exit {server.process.poll()})")
        time.sleep(0.3)


def start_servers(log_dir: Path) -> list[Server]:
    """The floor server on 28100/28101 and Sluice on 28000-28002 (never the harness's ports)."""
    python = str(ROOT / ".venv" / "bin" / "python")
    floor = [python, str(ROOT / "benchmarks" / "floor_server.py"),
             "--http-port", "28100", "--grpc-port", "28101"]  # fmt: skip
    sluice = [
        str(ROOT / ".venv" / "bin" / "sluice"), "serve",
        "--model-repository", str(ANCHORS / "models-onnx"),
        "--http-port", "28000", "--grpc-port", "28001", "--metrics-port", "28002",
        "--key-prefix", f"floor-{uuid.uuid4().hex[:8]}:",
    ]  # fmt: skip
    servers = []
    for name, command, http, grpc_port, redis in (
        ("floor", floor, 28100, 28101, False),
        ("sluice", sluice, 28000, 28001, True),
    ):
        log = open(log_dir / f"{name}.log", "wb")  # noqa: SIM115 (lives as long as the server)
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
        )
        servers.append(Server(name, http, grpc_port, process, redis))
    for server in servers:
        _wait_ready(server, 120)
    return servers


def measure(server: Server, protocol: str, concurrency: int, window_ms: int, out: Path) -> dict:
    """One perf_analyzer run (bounded); returns the row."""
    port = server.grpc_port if protocol == "grpc" else server.http_port
    table = out / f"{server.name}_{protocol}_c{concurrency}.csv"
    command = [
        str(PA), "-m", MODEL, "-u", f"127.0.0.1:{port}", "-i", protocol, "-b", "1",
        "--concurrency-range", f"{concurrency}:{concurrency}", "-p", str(window_ms),
        "-s", "100", "-r", "6", "--percentile", "99", "-f", str(table),
    ]  # fmt: skip
    limit = 6 * window_ms / 1000 + 60
    subprocess.run(command[:-2], capture_output=True, timeout=limit, check=False)  # warm-up
    served, ticks = server.served(), server.cpu_ticks()
    done = subprocess.run(command, capture_output=True, text=True, timeout=limit, check=False)
    requests = server.served() - served
    cpu_s = (server.cpu_ticks() - ticks) / TICK
    if done.returncode != 0 or not table.exists():
        raise SystemExit(f"perf_analyzer failed on {server.name} {protocol}: {done.stdout[-400:]}")
    with open(table) as handle:
        row = next(csv.DictReader(handle))
    return {
        "server": server.name,
        "protocol": protocol,
        "concurrency": concurrency,
        "infer_per_s": float(row["Inferences/Second"]),
        "p50_us": float(row["p50 latency"]),
        "p99_us": float(row["p99 latency"]),
        "cpu_us_per_req": cpu_s / requests * 1e6 if requests else float("nan"),
    }


def report(rows: list[dict]) -> None:
    """The rows, then gRPC ÷ HTTP per server and concurrency."""
    print("| server | proto | c | infer/s | p50 us | p99 us | server CPU us/req |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['server']} | {r['protocol']} | {r['concurrency']} | {r['infer_per_s']:.0f} "
            f"| {r['p50_us']:.0f} | {r['p99_us']:.0f} | {r['cpu_us_per_req']:.0f} |"
        )
    print("\n| server | c | gRPC/HTTP infer/s | gRPC/HTTP CPU per request |")
    print("|---|---|---|---|")
    index = {(r["server"], r["protocol"], r["concurrency"]): r for r in rows}
    for (server, protocol, concurrency), grpc_row in index.items():
        http_row = index.get((server, "http", concurrency))
        if protocol != "grpc" or http_row is None:
            continue
        print(
            f"| {server} | {concurrency} | {grpc_row['infer_per_s'] / http_row['infer_per_s']:.2f} "
            f"| {grpc_row['cpu_us_per_req'] / http_row['cpu_us_per_req']:.2f} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conc", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--window-ms", type=int, default=2000, help="perf_analyzer window")
    parser.add_argument("--out", type=Path, default=None, help="folder for CSVs and logs")
    args = parser.parse_args(argv)
    if not PA.exists() or not (ANCHORS / "models-onnx").exists():
        print("anchors missing: run `bash ../shared/bench/setup_anchors.sh` first", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="grpc-floor-"))
    out.mkdir(parents=True, exist_ok=True)
    servers = start_servers(out)
    rows = []
    try:
        for server in servers:
            for concurrency in args.conc:
                for protocol in ("http", "grpc"):
                    rows.append(measure(server, protocol, concurrency, args.window_ms, out))
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        for server in servers:
            os.killpg(server.process.pid, signal.SIGINT)
        for server in servers:
            try:
                server.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.process.pid, signal.SIGKILL)
    report(rows)
    print(f"\nCSVs and logs: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
