"""perf_analyzer with and without system shared memory, same server, same run.

For each protocol and concurrency, runs Triton's perf_analyzer in pairs back to back
against a running server: ``--shared-memory none`` (tensors in the requests and
responses) and ``--shared-memory system`` (perf_analyzer creates POSIX shared-memory
regions, registers them with the server, and its requests name them instead of carrying
the tensors), the pair's order alternating from one run to the next, ``--rounds`` pairs
per cell. Prints the median throughput, p50 and p99 of each mode and the median of the
pairs' throughput ratios system / none (a pair runs within seconds, so machine noise hits
both of its halves alike). The server must run on the same host as this script (shared
memory is local). Every perf_analyzer run is killed after a bounded time, and one that
fails (perf_analyzer gives up on an unstable measurement on a loaded machine) is run again
once. With ``--server-pid`` (the server's process-group leader) it also prints the
server's CPU time per request (its process tree, from ``/proc``; Redis not counted), the
figure least moved by other load on the machine.

Usage:
    python benchmarks/bench_shared_memory.py --http-url 127.0.0.1:8000 --grpc-url 127.0.0.1:8001 \
        [--model add_sub] [--batch 1] [--concurrency 1 8] [--interval-ms 3000] [--trials 4] \
        [--rounds 3] [--server-pid PID]

Needs ``/tmp/anchors/perf_analyzer`` (benchmarks/README.md, section 3). Works against
Triton as well (point the URLs at it) for a peer row of the same kind.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench_anchors import model_counts, tree_cpu_ticks

PERF_ANALYZER = Path("/tmp/anchors/perf_analyzer")


@dataclass(frozen=True, slots=True)
class Measurement:
    """One perf_analyzer run's figures: infer/s, latencies in µs, and the server's CPU
    time per request in µs (nan when not measured)."""

    throughput: float
    p50_us: int
    p99_us: int
    cpu_us: float = float("nan")


def run_perf_analyzer(
    binary: Path,
    protocol: str,
    url: str,
    model: str,
    batch: int,
    concurrency: int,
    shared_memory: str,
    interval_ms: int,
    trials: int,
    extra: list[str] | None = None,
) -> Measurement:
    """One perf_analyzer run at one concurrency, killed after ``trials`` windows + 60 s.

    Raises:
        RuntimeError: perf_analyzer failed or wrote no figures (its output's tail).
        subprocess.TimeoutExpired: it ran past its bound.
    """
    with tempfile.TemporaryDirectory(prefix="bench-shm-") as folder:
        report = Path(folder) / "pa.csv"
        command = [
            str(binary), "-m", model, "-u", url, "-i", protocol, "-b", str(batch),
            "--concurrency-range", f"{concurrency}:{concurrency}",
            "--shared-memory", shared_memory, "-p", str(interval_ms),
            "--max-trials", str(trials), "-s", "1000", "-f", str(report), *(extra or []),
        ]  # fmt: skip
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=trials * interval_ms / 1000 * 2 + 60,
            check=False,
        )
        if done.returncode != 0 or not report.exists():
            output = (done.stdout + done.stderr)[-800:]
            raise RuntimeError(f"perf_analyzer failed ({done.returncode}): {output}")
        with report.open() as handle:
            row = next(csv.DictReader(handle))
    return Measurement(
        float(row["Inferences/Second"]), int(row["p50 latency"]), int(row["p99 latency"])
    )


def _median(runs: list[Measurement]) -> Measurement:
    """Each figure's median over ``runs``."""
    return Measurement(
        statistics.median(r.throughput for r in runs),
        int(statistics.median(r.p50_us for r in runs)),
        int(statistics.median(r.p99_us for r in runs)),
        statistics.median(r.cpu_us for r in runs),
    )


def _extra(args: argparse.Namespace) -> list[str]:
    """perf_analyzer arguments for ``--shape`` and ``--output-shm-size``."""
    extra = [f"--shape={shape}" for shape in args.shape]
    if args.output_shm_size:
        extra.append(f"--output-shared-memory-size={args.output_shm_size}")
    return extra


def measure(args: argparse.Namespace, protocol: str, concurrency: int, mode: str) -> Measurement:
    """One perf_analyzer run (again once if it fails), with the server's CPU per request
    when ``args.server_pid`` is set.

    Raises:
        RuntimeError: it failed twice.
    """
    url = args.http_url if protocol == "http" else args.grpc_url
    for attempt in (1, 2):
        ticks = tree_cpu_ticks(args.server_pid) if args.server_pid else 0
        count = model_counts(args.http_url, args.model)[0] if args.server_pid else 0
        try:
            result = run_perf_analyzer(
                args.perf_analyzer, protocol, url, args.model, args.batch, concurrency,
                mode, args.interval_ms, args.trials, _extra(args),
            )  # fmt: skip
        except (RuntimeError, subprocess.TimeoutExpired):
            if attempt == 2:
                raise
            continue
        if not args.server_pid:
            return result
        ticks = tree_cpu_ticks(args.server_pid) - ticks
        count = model_counts(args.http_url, args.model)[0] - count
        cpu_us = ticks / os.sysconf("SC_CLK_TCK") * 1e6 / max(count, 1)
        return Measurement(result.throughput, result.p50_us, result.p99_us, cpu_us)
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-url", default="127.0.0.1:8000")
    parser.add_argument("--grpc-url", default="127.0.0.1:8001")
    parser.add_argument("--protocols", nargs="+", default=["http", "grpc"])
    parser.add_argument("--model", default="add_sub")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--interval-ms", type=int, default=3000, help="measurement window")
    parser.add_argument("--trials", type=int, default=4, help="windows per run at most")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of runs per cell")
    parser.add_argument("--perf-analyzer", type=Path, default=PERF_ANALYZER)
    parser.add_argument("--server-pid", type=int, help="count this process tree's CPU")
    parser.add_argument(
        "--shape", nargs="*", default=[], help="perf_analyzer --shape values (NAME:d1,d2)"
    )
    parser.add_argument(
        "--output-shm-size", type=int, help="bytes per output region (perf_analyzer: 100 KiB)"
    )
    args = parser.parse_args(argv)
    if not args.perf_analyzer.exists():
        print(f"{args.perf_analyzer} not found: see benchmarks/README.md, section 3")
        return 2

    print(
        f"model={args.model} batch={args.batch} window={args.interval_ms} ms "
        f"rounds={args.rounds} perf_analyzer (medians)"
    )
    print(
        f"{'protocol':>8} | {'conc':>4} | {'none infer/s':>12} | {'shm infer/s':>11} | "
        f"{'ratio':>5} | {'none p50/p99 µs':>15} | {'shm p50/p99 µs':>14} | "
        f"{'CPU µs/req none/shm':>19}"
    )
    order = ["none", "system"]
    for protocol in args.protocols:
        for concurrency in args.concurrency:
            runs: dict[str, list[Measurement]] = {"none": [], "system": []}
            ratios = []
            for _ in range(args.rounds):
                for mode in order:
                    runs[mode].append(measure(args, protocol, concurrency, mode))
                order.reverse()  # the other one first next time: drift hits both alike
                ratios.append(runs["system"][-1].throughput / runs["none"][-1].throughput)
            none, shm = (_median(runs[mode]) for mode in ("none", "system"))
            print(
                f"{protocol:>8} | {concurrency:>4} | {none.throughput:>12.1f} | "
                f"{shm.throughput:>11.1f} | {statistics.median(ratios):>5.2f} | "
                f"{f'{none.p50_us}/{none.p99_us}':>15} | {f'{shm.p50_us}/{shm.p99_us}':>14} | "
                f"{f'{none.cpu_us:.0f}/{shm.cpu_us:.0f}':>19}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
