"""Async jobs through faults: the job worker SIGKILLed while single and bulk jobs run, the
gateway restarted while clients poll, ``sluice serve`` restarted during a bulk job. Every
accepted job finishes once, with the right results; each bulk row appears once in the
output; rows done before the kill are not run again (the model's inference count);
nothing stays PENDING or STARTED.

The server's job worker has a short visibility timeout and lease
(``SLUICE_JOB_WORKER__*``), so a killed worker's tasks come back within seconds.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests
from e2e_support import Server, repository_of, start_server, stop_server
from fault_support import FAST_JOB_RECOVERY, child_pid
from jobs_support import (
    JSONL,
    add_sub_body,
    add_sub_row,
    check_add_sub_output,
    get,
    jsonl,
    lines,
    submit,
    wait_state,
)

from sluice.broker.keys import KeySchema
from sluice.broker.redis_server import delete_prefix
from sluice.jobs import JobClient


@pytest.fixture(scope="module")
def faulty(
    model_repository: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A ``sluice serve`` of ``add_sub`` and ``slow`` whose processes the tests kill."""
    where = tmp_path_factory.mktemp("jobs-faults")
    repo = repository_of(model_repository, where / "models", "add_sub", "slow")
    server = start_server(repo, redis_url, where / "serve.log", env=FAST_JOB_RECOVERY)
    yield server
    assert stop_server(server) == 0, server.log()


def _kill_child(server: Server, module: str) -> int:
    """SIGKILL the child running ``module`` and wait until the supervisor started
    another; returns the new pid."""
    old = child_pid(server, module)
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            new = child_pid(server, module)
        except AssertionError:
            new = old
        if new != old:
            return new
        time.sleep(0.1)
    raise AssertionError(f"{module} not restarted:\n{server.log()}")


def _inference_count(server: Server, model: str) -> int:
    reply = requests.get(f"{server.base}/v2/models/{model}/stats", timeout=30)
    return int(reply.json()["model_stats"][0]["inference_stats"]["success"]["count"])


def _succeeded(server: Server, kind: str) -> float:
    for line in requests.get(server.metrics_url, timeout=30).text.splitlines():
        if line.startswith(f'sluice_jobs_succeeded{{kind="{kind}",'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_single_jobs_survive_a_killed_job_worker(faulty: Server) -> None:
    """Six jobs of ``slow`` (3 s each) are running when the job worker is killed: each
    ends SUCCESS once (counted once), with its own input echoed, run again by the next
    worker."""
    before = _succeeded(faulty, "single")
    jobs = {}
    for value in range(6):
        body = {
            "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32", "data": [value]}],
            "parameters": {"sleep_ms": 3000},
        }
        jobs[submit(faulty.base, "slow", body)] = float(value)
    for job_id in jobs:
        wait_state(faulty.base, job_id, ("STARTED",))
    _kill_child(faulty, "sluice.job_workers.main")
    assert {get(faulty.base, j)["state"] for j in jobs} == {"STARTED"}  # none done before it
    for job_id, value in jobs.items():
        job = wait_state(faulty.base, job_id, timeout_s=120)
        assert job["state"] == "SUCCESS", job
        outputs = {o["name"]: o["data"] for o in job["outputs"]}
        assert outputs["OUT"] == [value]
    assert _succeeded(faulty, "single") - before == len(jobs)  # each finished once


def test_a_bulk_job_survives_a_killed_job_worker(faulty: Server) -> None:
    """10,000 rows; the job worker is killed once a few hundred are written: the job ends
    with each row answered once, and the rows written before the kill are not run again
    (the model answers at most a few windows of rows more than there are rows)."""
    total = 10_000
    before = _inference_count(faulty, "add_sub")
    succeeded = _succeeded(faulty, "bulk")
    job_id = submit(
        faulty.base, "add_sub", jsonl([add_sub_row(i) for i in range(total)]), headers=JSONL
    )
    deadline = time.monotonic() + 60
    done = 0
    while done < 300 and time.monotonic() < deadline:
        done = get(faulty.base, job_id)["request_counts"]["completed"]
        time.sleep(0.02)
    assert 300 <= done < total, "the job ran too fast to be killed in the middle"
    _kill_child(faulty, "sluice.job_workers.main")
    job = wait_state(faulty.base, job_id, timeout_s=180)
    assert job["state"] == "SUCCESS", job
    assert job["request_counts"] == {"total": total, "completed": total, "failed": 0}
    check_add_sub_output(lines(faulty.base, job_id, "output"), range(total))
    assert lines(faulty.base, job_id, "errors") == []
    ran = _inference_count(faulty, "add_sub") - before
    assert total <= ran < total + 1000, ran
    assert _succeeded(faulty, "bulk") - succeeded == 1


def test_jobs_finish_while_the_gateway_restarts_under_polling_clients(faulty: Server) -> None:
    """Clients poll with :meth:`JobClient.wait` (connection errors waited out) while the
    gateway is killed and restarted: every job ends SUCCESS with its results."""
    client = JobClient(faulty.http_url, timeout_s=5)
    singles = {
        submit(faulty.base, "add_sub", add_sub_body([float(i)] * 16, [1.0] * 16)): i
        for i in range(5)
    }
    bulk = submit(
        faulty.base, "add_sub", jsonl([add_sub_row(i) for i in range(3000)]), headers=JSONL
    )
    slow = submit(
        faulty.base,
        "slow",
        {
            "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32", "data": [7.0]}],
            "parameters": {"sleep_ms": 3000},
        },
    )
    results: dict[str, dict] = {}

    def poll(job_id: str) -> None:
        results[job_id] = client.wait(job_id, progress=False, poll_s=0.1, timeout_s=120)

    threads = [threading.Thread(target=poll, args=(j,)) for j in [*singles, bulk, slow]]
    for thread in threads:
        thread.start()
    _kill_child(faulty, "sluice.api.gateway")
    for thread in threads:
        thread.join(150)
    assert not any(t.is_alive() for t in threads)
    assert {j: r["state"] for j, r in results.items()} == dict.fromkeys(results, "SUCCESS")
    for job_id, i in singles.items():
        assert results[job_id]["outputs"][0]["data"] == [i + 1.0] * 16
    assert results[slow]["outputs"][0]["data"] == [7.0]
    check_add_sub_output(lines(faulty.base, bulk, "output"), range(3000))


def test_a_bulk_job_survives_a_restart_of_sluice_serve(
    model_repository: Path, redis_url: str, tmp_path: Path
) -> None:
    """``sluice serve`` is stopped (Ctrl-C) in the middle of a bulk job and started again
    on the same Redis and prefix: the job goes on from the rows written and ends with
    each row once; the new server's model runs about what was left."""
    repo = repository_of(model_repository, tmp_path / "models", "add_sub")
    prefix = f"sluice-e2e-{uuid.uuid4().hex[:8]}:"
    total = 20_000
    server = start_server(repo, redis_url, tmp_path / "first.log", key_prefix=prefix)
    try:
        job_id = submit(
            server.base, "add_sub", jsonl([add_sub_row(i) for i in range(total)]), headers=JSONL
        )
        deadline = time.monotonic() + 60
        while get(server.base, job_id)["request_counts"]["completed"] < 1000:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert stop_server(server) == 0, server.log()
        broker = redis.Redis.from_url(redis_url)
        written = int(broker.hlen(KeySchema(prefix).job_output(job_id)))
        broker.close()
        assert 1000 <= written < total
        server = start_server(repo, redis_url, tmp_path / "second.log", key_prefix=prefix)
        job = wait_state(server.base, job_id, timeout_s=180)
        assert job["state"] == "SUCCESS", job
        assert job["request_counts"] == {"total": total, "completed": total, "failed": 0}
        check_add_sub_output(lines(server.base, job_id, "output"), range(total))
        ran = _inference_count(server, "add_sub")  # the new server counts from zero
        assert total - written <= ran < total - written + 1000, (ran, written)
    finally:
        stop_server(server)
        delete_prefix(redis_url, prefix)
