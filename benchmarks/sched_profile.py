"""Where a loaded server's time goes, per process: CPU, run-queue waits, context switches.

Drives a server that is **already running** (Sluice or Triton) with wrk, closed loop at
``--conc`` connections, on the anchors' prebuilt request body for ``--model`` (binary
tensors, ``/tmp/anchors/bodies``; ``../shared/bench/setup_anchors.sh`` writes them), and
reads the kernel's accounting before and after the measured run:

* ``/proc/<pid>/stat``: user and system CPU (clock ticks);
* ``/proc/<pid>/task/<tid>/schedstat``: time on a CPU, time runnable but waiting on a run
  queue, timeslices (ns, summed over the threads alive at both reads);
* ``/proc/<pid>/task/<tid>/status``: voluntary switches (the thread blocked: a read, a
  wait) and involuntary ones (it was preempted);
* ``/proc/stat``: the machine's user / system / softirq / idle / steal shares;
* the server's statistics extension: executions, mean batch size and ``compute_infer``
  per execution over the run.

It prints one row per process that used CPU, per request. On a 2-vCPU VM the rows show
which process is the bottleneck (runs or waits for a CPU nearly all the time) and which
has slack (blocks often), and how much a request pays in wake-up delays::

  .venv/bin/python benchmarks/sched_profile.py --url 127.0.0.1:8000 --model mlp_fp32

Processes that start or exit during the run (wrk itself) are left out; wrk's own CPU is
printed apart (its children's times).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_anchors import ANCHORS, BENCH, model_stats

#: /proc/stat's cpu line, in order.
MACHINE_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@dataclass(frozen=True, slots=True)
class ProcSample:
    """One process's counters at one moment (threads summed)."""

    command: str
    user_ticks: int
    system_ticks: int
    run_ns: int
    wait_ns: int
    timeslices: int
    voluntary: int
    involuntary: int


@dataclass(frozen=True, slots=True)
class ProcRow:
    """One process's share of a run, per request: CPU in µs (user, system), run-queue
    wait in µs, timeslices and context switches per request."""

    pid: int
    command: str
    user_us: float
    system_us: float
    wait_us: float
    timeslices: float
    voluntary: float
    involuntary: float

    @property
    def cpu_us(self) -> float:
        return self.user_us + self.system_us


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:  # the process or thread exited meanwhile
        return None


def sample(pid: int) -> ProcSample | None:
    """The counters of ``pid`` now; None when it exited."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    command = (_read(f"/proc/{pid}/cmdline") or "").replace("\0", " ").strip()
    command = command or stat[stat.index("(") + 1 : stat.rindex(")")]
    run = wait = slices = voluntary = involuntary = 0
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in threads:
        schedstat = _read(f"/proc/{pid}/task/{tid}/schedstat")
        status = _read(f"/proc/{pid}/task/{tid}/status")
        if schedstat is None or status is None:
            continue
        on_cpu, queued, count = (int(x) for x in schedstat.split()[:3])
        run, wait, slices = run + on_cpu, wait + queued, slices + count
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                voluntary += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                involuntary += int(line.split()[1])
    return ProcSample(
        command, int(fields[11]), int(fields[12]), run, wait, slices, voluntary, involuntary
    )


def snapshot() -> dict[int, ProcSample]:
    """Every process on the machine: pid -> its counters."""
    found: dict[int, ProcSample] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (taken := sample(int(name))) is not None:
            found[int(name)] = taken
    return found


def machine_times() -> list[int]:
    """The machine's cumulative CPU times from ``/proc/stat`` (clock ticks, in
    :data:`MACHINE_FIELDS` order)."""
    with open("/proc/stat") as handle:
        values = handle.readline().split()[1:]
    return [int(v) for v in values[: len(MACHINE_FIELDS)]]


def machine_shares(before: list[int], after: list[int]) -> dict[str, float]:
    """Each :data:`MACHINE_FIELDS` entry's share of the machine's time between two
    :func:`machine_times` reads, in % (zero shares left out)."""
    spent = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(spent) or 1
    return {n: round(100 * v / total, 1) for n, v in zip(MACHINE_FIELDS, spent, strict=True) if v}


def rows(
    before: dict[int, ProcSample],
    after: dict[int, ProcSample],
    requests: int,
    tick_hz: int,
    min_cpu_us: float = 0.5,
) -> list[ProcRow]:
    """Per-request rows of the processes alive at both snapshots whose CPU per request
    is at least ``min_cpu_us`` µs, the busiest first.

    Raises:
        ValueError: ``requests`` < 1.
    """
    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    us_per_tick = 1e6 / tick_hz
    found: list[ProcRow] = []
    for pid, end in after.items():
        start = before.get(pid)
        if start is None or start.command != end.command:
            continue
        row = ProcRow(
            pid,
            end.command,
            (end.user_ticks - start.user_ticks) * us_per_tick / requests,
            (end.system_ticks - start.system_ticks) * us_per_tick / requests,
            (end.wait_ns - start.wait_ns) / 1e3 / requests,
            (end.timeslices - start.timeslices) / requests,
            (end.voluntary - start.voluntary) / requests,
            (end.involuntary - start.involuntary) / requests,
        )
        if row.cpu_us >= min_cpu_us:
            found.append(row)
    return sorted(found, key=lambda r: r.cpu_us, reverse=True)


def infer_stats(address: str, model: str) -> tuple[int, int, int]:
    """(inference_count, execution_count, compute_infer ns summed over requests) of
    ``model``, all versions (:func:`bench_anchors.model_stats`)."""
    stats = model_stats(address, model)
    return (
        sum(int(s.get("inference_count", 0)) for s in stats),
        sum(int(s.get("execution_count", 0)) for s in stats),
        sum(int(s["inference_stats"]["compute_infer"]["ns"]) for s in stats),
    )


def _wrk(args: argparse.Namespace, seconds: int) -> dict:
    body = Path(args.body or ANCHORS / "bodies" / f"{args.model}.bin")
    header_length = Path(f"{body}.hl").read_text().strip() if Path(f"{body}.hl").exists() else ""
    env = dict(os.environ, BODY_FILE=str(body), HDR_LEN=header_length or "json", MODEL=args.model)
    command = [
        "wrk", "-t1", f"-c{args.conc}", f"-d{seconds}s", "--latency", "--timeout", "10s",
        "-s", str(BENCH / "v2_infer.lua"), f"http://{args.url}",
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=seconds + 60)
    lines = [x for x in done.stdout.splitlines() if x.startswith("WRKJSON ")]
    if not lines:
        raise SystemExit(f"wrk gave no summary: {done.stdout[-500:]} {done.stderr[-500:]}")
    return json.loads(lines[0][len("WRKJSON ") :])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="127.0.0.1:8000", help="the server's HTTP host:port")
    parser.add_argument("--model", default="mlp_fp32")
    parser.add_argument("--conc", type=int, default=32, help="wrk connections")
    parser.add_argument("--duration", type=int, default=8, help="measured seconds")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of load not measured")
    parser.add_argument("--body", help="request body (default: the anchors' binary body)")
    parser.add_argument("--top", type=int, default=8, help="rows printed")
    args = parser.parse_args(argv)

    if args.warmup > 0:
        _wrk(args, args.warmup)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    counts0, machine0, procs0 = infer_stats(args.url, args.model), machine_times(), snapshot()
    result = _wrk(args, args.duration)
    procs1, machine1, counts1 = snapshot(), machine_times(), infer_stats(args.url, args.model)
    wrk_usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    requests = int(result["requests"])
    if requests < 1:
        raise SystemExit("no request was answered")
    rate = requests / (result["duration_us"] / 1e6)
    wrk_us = (
        ((wrk_usage.ru_utime - children.ru_utime) + (wrk_usage.ru_stime - children.ru_stime))
        * 1e6
        / requests
    )
    executions = counts1[1] - counts0[1]
    inferences = counts1[0] - counts0[0]
    print(
        f"{args.model} c={args.conc} on {args.url}: {rate:.0f} infer/s, p50 "
        f"{result['p50_us']:.0f} µs, p99 {result['p99_us']:.0f} µs, wrk {wrk_us:.1f} µs CPU/req"
    )
    if executions > 0:
        # compute_infer counts an execution's time once per request it held
        infer_us = (counts1[2] - counts0[2]) / max(1, inferences) / 1e3
        print(f"executions {executions}, mean batch {inferences / executions:.1f}, "
              f"compute_infer {infer_us:.0f} µs per execution")  # fmt: skip
    shares = machine_shares(machine0, machine1)
    print("machine: " + ", ".join(f"{name} {share}%" for name, share in shares.items()))
    print("| pid | CPU µs/req | user | system | run-queue wait µs/req | timeslices/req "
          "| voluntary/req | involuntary/req | command |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows(procs0, procs1, requests, os.sysconf("SC_CLK_TCK"))[: args.top]:
        print(
            f"| {row.pid} | {row.cpu_us:.1f} | {row.user_us:.1f} | {row.system_us:.1f} | "
            f"{row.wait_us:.1f} | {row.timeslices:.2f} | {row.voluntary:.2f} | "
            f"{row.involuntary:.2f} | {row.command[:80]} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
