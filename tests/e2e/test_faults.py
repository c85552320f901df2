"""The fault suite: each fault of :data:`fault_support.FAULTS` injected into a fresh
deployment under a steady load over HTTP, gRPC, a gRPC stream (and async jobs where the
fault is the job worker's). No accepted request is lost or answered twice, none gets
another's answer, every error is one a client may retry (503 / UNAVAILABLE at once, or
the connection of a killed gateway; none waits for its deadline but where Redis lost
the request), only the killed process is restarted, and the load is
served again (``benchmarks/faults.py`` prints the same rows as a table)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fault_support import FAULTS, run_fault, table

pytestmark = pytest.mark.e2e

#: faults after which a request may run twice, by design: the killed instance's batch is
#: claimed and run again by its peer (its gateway answers once); a killed job worker's
#: single jobs send their request again (each job still ends once)
MAY_RUN_TWICE = {"SIGKILL an instance", "SIGKILL the job worker"}
#: faults that end client connections without an answer: a gateway's, or every one
CLOSE_CONNECTIONS = {
    "SIGKILL a gateway (of two on one port)",
    "SIGKILL the supervisor, started again",
}
#: fault -> processes restarted ("exited with code" in the log): the one killed
RESTARTS = {"SIGKILL an instance": 1, "SIGKILL a gateway (of two on one port)": 1,
            "SIGKILL the job worker": 1}  # fmt: skip


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_under_load_loses_nothing_and_answers_once(fault: str, tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    row = run_fault(fault, tmp_path)
    report = f"{table([row])}\n{row.samples}"
    print("\n" + report)
    assert row.lost == 0, report
    assert row.twice == 0, report
    if fault not in MAY_RUN_TWICE:
        assert row.ran_twice == 0, report
    allowed = {"503", "UNAVAILABLE", "stream error"}
    if fault in CLOSE_CONNECTIONS:
        allowed |= {"conn", "CANCELLED"}
    if fault == "Redis restarted empty":  # what it lost while queued ends at its deadline
        allowed.add("deadline")
    assert set(row.errors) - {"refused (not accepted)"} <= allowed, report
    assert row.restarts == RESTARTS.get(fault, 0), report
    # every kind of client was served, and served again after the fault
    assert row.recovered and row.ok > 20, report
    expected_kinds = {"http", "grpc", "stream"} | ({"job"} if FAULTS[fault][1] else set())
    assert set(row.by_kind) == expected_kinds, row.by_kind
    # a new sluice serve waits for the killed one's lease (5 s) and loads the model
    assert row.recovery_s < (60 if fault == "SIGKILL the supervisor, started again" else 30), report
