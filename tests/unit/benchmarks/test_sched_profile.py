"""``benchmarks/sched_profile.py``: per-request rows from the kernel's counters."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from e2e_support import load_module


def _bench():  # type: ignore[no-untyped-def]
    return load_module("benchmarks/sched_profile.py", "sched_profile")


def test_rows_are_per_request_deltas_busiest_first() -> None:
    """CPU ticks become µs per request, schedstat ns become µs per request; processes
    missing at either read, reused pids (another command) and idle ones are left out."""
    bench = _bench()
    sample = bench.ProcSample  # type: ignore[attr-defined]
    before = {
        10: sample("gateway", 100, 50, 10**9, 10**8, 1000, 10, 5),
        11: sample("instance", 500, 10, 5 * 10**9, 10**8, 100, 1, 1),
        12: sample("old", 0, 0, 0, 0, 0, 0, 0),
        13: sample("idle", 7, 7, 0, 0, 0, 0, 0),
    }
    after = {
        10: sample("gateway", 180, 70, 2 * 10**9, 3 * 10**8, 3000, 110, 1005),
        11: sample("instance", 700, 12, 7 * 10**9, 1.1e8, 300, 101, 201),
        12: sample("new command", 900, 0, 0, 0, 0, 0, 0),
        13: sample("idle", 7, 7, 0, 0, 0, 0, 0),
        14: sample("started later", 900, 0, 0, 0, 0, 0, 0),
    }
    # 100 Hz ticks (10 ms each), 1000 requests: one tick per request-thousand = 10 µs/req
    found = bench.rows(before, after, requests=1000, tick_hz=100)  # type: ignore[attr-defined]
    assert [r.command for r in found] == ["instance", "gateway"]
    instance, gateway = found
    assert (instance.user_us, instance.system_us, instance.cpu_us) == (2000.0, 20.0, 2020.0)
    assert (gateway.user_us, gateway.system_us) == (800.0, 200.0)
    assert gateway.wait_us == pytest.approx(200.0)  # 2e8 ns over 1000 requests
    assert instance.wait_us == pytest.approx(10.0)
    assert (gateway.timeslices, gateway.voluntary, gateway.involuntary) == (2.0, 0.1, 1.0)
    with pytest.raises(ValueError, match="requests must be >= 1, got 0"):
        bench.rows(before, after, requests=0, tick_hz=100)  # type: ignore[attr-defined]


def test_machine_shares_in_percent_without_zeros() -> None:
    bench = _bench()
    before = [100, 0, 20, 300, 0, 0, 5, 0]
    after = [250, 0, 40, 320, 0, 0, 15, 0]  # 150 user, 20 system, 20 idle, 10 softirq
    assert bench.machine_shares(before, after) == {  # type: ignore[attr-defined]
        "user": 75.0,
        "system": 10.0,
        "idle": 10.0,
        "softirq": 5.0,
    }


def test_sample_reads_a_busy_child_and_none_once_it_exited() -> None:
    """A real process: its CPU and time on a CPU grow while it spins, the command line is
    its own; once reaped it reads as None."""
    bench = _bench()
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 0.6: pass"]
    )
    try:
        time.sleep(0.1)
        first = bench.sample(child.pid)  # type: ignore[attr-defined]
        time.sleep(0.3)
        second = bench.sample(child.pid)  # type: ignore[attr-defined]
    finally:
        child.wait(timeout=10)
    assert first is not None and second is not None
    assert "while time.time()" in second.command
    assert second.run_ns > first.run_ns
    assert second.user_ticks + second.system_ticks >= first.user_ticks + first.system_ticks
    assert bench.sample(child.pid) is None  # type: ignore[attr-defined]
    assert os.getpid() in bench.snapshot()  # type: ignore[attr-defined]
