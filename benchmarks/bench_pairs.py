"""Sluice against Triton in interleaved pairs: one model, one concurrency, wrk over HTTP.

``bench_anchors.py`` measures every row once; on a 2-core VM whose speed drifts by
±10-15% within minutes, one row per server cannot settle a 10% target. This script
starts both servers side by side (Triton 2.51 from ``../shared/bench/start_triton.sh``
on ``/tmp/anchors/models``; ``sluice serve`` on ``/tmp/anchors/models-onnx`` with a
private ``redis-server`` on a Unix socket) and drives them in turn with the same wrk
load (binary tensors), Triton then Sluice, ``--pairs`` times. Each pair's ratio
(Sluice's infer/s over Triton's) is measured minutes apart at most, so drift mostly
cancels; it prints every run, each pair's ratio and the median ratio, and per run the
server's CPU per request (µs, its process tree; Sluice's Redis apart) and how busy the
machine was (%), and each server's mean batch size over the run (its statistics).

  .venv/bin/python benchmarks/bench_pairs.py                        # MLP, c=32, 5 pairs
  .venv/bin/python benchmarks/bench_pairs.py --model identity_fp32 --conc 1 --pairs 7

Exit code: 0 when the median ratio is at least ``--target`` (default 1.0: issue 3's
MLP c=32 target), 1 when it is not, 2 when the anchors are missing or a server does
not start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_anchors import (
    ANCHORS,
    BENCH,
    model_counts,
    redis_cpu_ticks,
    stop_server,
)
from peers import start_sluice, start_triton

from sluice.broker.redis_server import start_private_redis, stop_private_redis

#: the anchors' client venv runs ``anchors_tools.py`` (wrk with CPU accounting)
CLIENT_PYTHON = ANCHORS / "venv-client" / "bin" / "python"


def _wrk(args: argparse.Namespace, port: int, pid: int, label: str, jsonl: Path) -> dict:
    """One wrk run (``--warmup`` s not recorded, then ``--duration`` s) against ``port``;
    the row ``anchors_tools.py`` wrote (infer/s, p50 µs, server CPU µs per request of
    ``pid``'s process tree, machine busy %)."""
    body = ANCHORS / "bodies" / f"{args.model}.bin"
    header_length = (ANCHORS / "bodies" / f"{args.model}.bin.hl").read_text().strip()
    command = [
        str(CLIENT_PYTHON), str(BENCH / "anchors_tools.py"), "wrk",
        "--url", f"127.0.0.1:{port}", "--model", args.model, "--conc", str(args.conc),
        "--duration", str(args.duration), "--warmup", str(args.warmup),
        "--body", str(body), "--hl", header_length, "--server-pid", str(pid),
        "--label", label, "--jsonl", str(jsonl),
    ]  # fmt: skip
    subprocess.run(
        command, check=True, capture_output=True, timeout=args.duration + args.warmup + 90
    )
    return json.loads(jsonl.read_text().splitlines()[-1])


def _run(args: argparse.Namespace, port: int, pid: int, label: str, jsonl: Path) -> dict:
    """:func:`_wrk` with the run's mean batch size (inferences per execution, warm-up
    included) added as ``batch``."""
    before = model_counts(f"127.0.0.1:{port}", args.model)
    row = _wrk(args, port, pid, label, jsonl)
    after = model_counts(f"127.0.0.1:{port}", args.model)
    row["batch"] = round((after[0] - before[0]) / max(1, after[1] - before[1]), 1)
    return row


def measure(args: argparse.Namespace, out: Path) -> list[tuple[dict, dict]]:
    """Start both servers, run the pairs, stop both; returns (Triton row, Sluice row) pairs.

    Raises:
        SystemExit: (2) a server did not start.
    """
    private, redis_url = start_private_redis()
    triton = sluice = None
    pairs: list[tuple[dict, dict]] = []
    try:
        triton = start_triton(ANCHORS / "models", args.triton_port, out)
        sluice = start_sluice(
            ANCHORS / "models-onnx", args.sluice_port, redis_url,
            f"pairs-{uuid.uuid4().hex[:8]}:", out / "sluice.log",
        )  # fmt: skip
        tick = os.sysconf("SC_CLK_TCK")
        for index in range(args.pairs):
            row_t = _run(args, args.triton_port, triton.pid, "triton", out / "runs.jsonl")
            redis0 = redis_cpu_ticks(private.pid)
            row_s = _run(args, args.sluice_port, sluice.pid, "sluice", out / "runs.jsonl")
            redis_s = (redis_cpu_ticks(private.pid) - redis0) / tick
            # Redis's CPU spans the warm-up too: per request of both, by the run's rate
            total = row_s["requests"] * (args.duration + args.warmup) / args.duration
            row_s["redis_cpu_us_per_req"] = round(redis_s / max(total, 1) * 1e6, 1)
            pairs.append((row_t, row_s))
            print(
                f"pair {index + 1}: Triton {row_t['infer_per_s']:.0f}/s, Sluice "
                f"{row_s['infer_per_s']:.0f}/s, ratio "
                f"{row_s['infer_per_s'] / row_t['infer_per_s']:.2f}",
                flush=True,
            )
    finally:
        for server in (sluice, triton):
            if server is not None:
                stop_server(server)
        stop_private_redis(private)
    return pairs


def report(pairs: list[tuple[dict, dict]], args: argparse.Namespace) -> float:
    """Print the table and the median ratio; returns the median ratio."""
    print(f"\n{args.model} c={args.conc}, wrk over HTTP, binary tensors, {args.duration} s runs")
    print(
        "| pair | Triton infer/s | p50 µs | CPU µs/req | busy % | batch | Sluice infer/s "
        "| p50 µs | CPU µs/req | Redis µs/req | busy % | batch | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for index, (t, s) in enumerate(pairs, 1):
        ratio = s["infer_per_s"] / t["infer_per_s"]
        ratios.append(ratio)
        print(
            f"| {index} | {t['infer_per_s']:.0f} | {t['p50_us']:.0f} | "
            f"{t['server_cpu_us_per_req']} | {t['machine_cpu_busy_pct']} | {t['batch']} | "
            f"{s['infer_per_s']:.0f} | {s['p50_us']:.0f} | {s['server_cpu_us_per_req']} | "
            f"{s['redis_cpu_us_per_req']} | {s['machine_cpu_busy_pct']} | {s['batch']} | "
            f"{ratio:.2f} |"
        )
    median = statistics.median(ratios)
    print(
        f"\nratio Sluice/Triton: median {median:.2f} (min {min(ratios):.2f}, "
        f"max {max(ratios):.2f}, {len(ratios)} pairs)"
    )
    return median


def positive(text: str) -> int:
    """argparse type: an integer ≥ 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["mlp_fp32", "identity_fp32"], default="mlp_fp32")
    parser.add_argument("--conc", type=positive, default=32)
    parser.add_argument("--pairs", type=positive, default=5)
    parser.add_argument("--duration", type=positive, default=6, help="seconds per run")
    parser.add_argument("--warmup", type=positive, default=2, help="seconds before each run")
    parser.add_argument("--triton-port", type=int, default=28300)
    parser.add_argument("--sluice-port", type=int, default=28400)
    parser.add_argument("--target", type=float, default=1.0, help="median ratio to meet")
    parser.add_argument("--out", type=Path, default=None, help="folder for logs and runs")
    args = parser.parse_args()
    missing = [
        p
        for p in (CLIENT_PYTHON, BENCH / "start_triton.sh", ANCHORS / "models-onnx")
        if not p.exists()
    ]
    if missing:
        print(
            f"anchors missing ({', '.join(map(str, missing))}): run "
            "../shared/bench/setup_anchors.sh",
            file=sys.stderr,
        )
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="sluice-pairs-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"run folder: {out}", flush=True)
    try:
        pairs = measure(args, out)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    median = report(pairs, args)
    met = median >= args.target
    print(f"{'MET ' if met else 'MISS'} median ratio {median:.2f} (target >= {args.target})")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
