"""Async jobs against a real ``sluice serve`` (its gateway, its Celery job worker, Redis):
submit, poll, outputs, failures, cancellation, 404s, expiry, listing, bulk rows."""

from __future__ import annotations

import gzip
import json
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
from e2e_support import Server, tritonclient_body
from jobs_support import (
    JSONL,
    add_sub_body,
    add_sub_row,
    check_add_sub_output,
    get,
    jsonl,
    lines,
    stream_length,
    submit,
    wait_state,
)

from sluice.jobs import JobClient, JobError


def test_single_job_json_outputs_equal_the_synchronous_answer(server: Server) -> None:
    body = add_sub_body([float(i) for i in range(16)], [2.0] * 16, id="my-request")
    job_id = submit(server.base, "add_sub", body)
    job = wait_state(server.base, job_id)
    sync = requests.post(f"{server.base}/v2/models/add_sub/infer", json=body, timeout=30).json()
    assert job["state"] == "SUCCESS"
    assert job["outputs"] == sync["outputs"]
    assert job["outputs"][0]["data"] == [i + 2.0 for i in range(16)]
    assert (job["id"], job["kind"], job["model_name"], job["model_version"]) == (
        job_id, "single", "add_sub", "1",
    )  # fmt: skip
    assert job["request_id"] == "my-request"
    assert job["created_at"] <= job["started_at"] <= job["finished_at"] < job["expires_at"]


def test_single_job_binary_tensors_in_and_out(server: Server) -> None:
    import tritonclient.http as httpclient

    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 0.5, np.float32)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")]
    body, length = tritonclient_body(
        {"INPUT0": (a, "FP32", True), "INPUT1": (b, "FP32", True)}, outputs
    )
    job_id = submit(
        server.base, "add_sub", body, headers={"Inference-Header-Content-Length": str(length)}
    )
    wait_state(server.base, job_id)
    reply = requests.get(f"{server.base}/v2/jobs/{job_id}", timeout=30)
    assert reply.headers["Content-Type"] == "application/octet-stream"
    header_length = int(reply.headers["Inference-Header-Content-Length"])
    result = httpclient.InferResult.from_response_body(reply.content, header_length=header_length)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response()["state"] == "SUCCESS"


@pytest.mark.parametrize(
    "model, body",
    [
        ("add_sub", add_sub_body([1.0] * 15, [1.0] * 16)),  # wrong element count
        ("add_sub", {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32"}]}),
        ("add_sub", {"inputs": []}),
        ("nosuch", add_sub_body([1.0] * 16, [1.0] * 16)),  # unknown model: 404
    ],
)
def test_a_bad_request_is_refused_at_submission_as_the_synchronous_call(
    server: Server, model: str, body: dict
) -> None:
    sync = requests.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=30)
    job = requests.post(f"{server.base}/v2/models/{model}/jobs", json=body, timeout=30)
    assert sync.status_code in (400, 404)
    assert (job.status_code, job.json()) == (sync.status_code, sync.json())


def test_a_failed_job_carries_the_reason_and_the_synchronous_status(server: Server) -> None:
    body = {"inputs": [{"name": "X", "shape": [1, 1], "datatype": "INT32", "data": [-1]}]}
    sync = requests.post(f"{server.base}/v2/models/raiser/infer", json=body, timeout=30)
    job = wait_state(server.base, submit(server.base, "raiser", body))
    assert job["state"] == "FAILURE"
    assert (job["status"], job["error"]) == (sync.status_code, sync.json()["error"])
    assert job["status"] == 400 and "negative input" in job["error"]
    assert "outputs" not in job


def test_cancel_takes_a_queued_job_off_its_stream(server: Server) -> None:
    """``slow`` holds its one instance 4 s with the first job; the second job's request
    waits on the stream; DELETE revokes it and its entry leaves the stream before the
    instance is free, so only the first job runs."""
    stream = f"{server.key_prefix}{{slow}}:q:1"
    holding = {
        "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}],
        "parameters": {"sleep_ms": 4000},
    }
    first = submit(server.base, "slow", holding)
    deadline = time.monotonic() + 30
    while stream_length(server.redis_url, stream)[1] != 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # until the instance holds the first request
    queued = dict(holding, parameters={"sleep_ms": 0})
    second = submit(server.base, "slow", queued)
    wait_state(server.base, second, ("STARTED",))
    while stream_length(server.redis_url, stream) != (2, 1) and time.monotonic() < deadline:
        time.sleep(0.05)  # the second request is on the stream, not taken
    assert stream_length(server.redis_url, stream) == (2, 1)
    reply = requests.delete(f"{server.base}/v2/jobs/{second}", timeout=30)
    assert reply.status_code == 200 and reply.json()["state"] == "REVOKED"
    while stream_length(server.redis_url, stream)[0] != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stream_length(server.redis_url, stream) == (1, 1)  # only the first is left
    assert wait_state(server.base, first)["state"] == "SUCCESS"
    assert get(server.base, second)["state"] == "REVOKED"
    again = requests.delete(f"{server.base}/v2/jobs/{first}", timeout=30)
    assert again.json()["state"] == "SUCCESS"  # a finished job stays as it is


def test_a_cancelled_bulk_job_stays_as_the_cancellation_left_it(server: Server) -> None:
    """DELETE in the middle of a bulk job of 5000 rows: the job answers REVOKED with its
    counts, and 2 s later its state, counts, ``finished_at`` and output lines are the
    same (no row is written or counted once it is final)."""
    body = jsonl([add_sub_row(i) for i in range(5000)])
    job_id = submit(server.base, "add_sub", body, headers=JSONL)
    deadline = time.monotonic() + 60
    while get(server.base, job_id)["request_counts"]["completed"] < 50:
        assert time.monotonic() < deadline, "no rows answered within 60 s"
        time.sleep(0.05)
    reply = requests.delete(f"{server.base}/v2/jobs/{job_id}", timeout=30)
    assert reply.status_code == 200
    cancelled = reply.json()
    assert cancelled["state"] == "REVOKED"
    counts = cancelled["request_counts"]
    assert 50 <= counts["completed"] < 5000 and counts["failed"] == 0
    time.sleep(2.0)
    later = get(server.base, job_id)
    assert (later["state"], later["request_counts"], later["finished_at"]) == (
        "REVOKED", counts, cancelled["finished_at"],
    )  # fmt: skip
    output = lines(server.base, job_id, "output")
    assert len(output) == counts["completed"]
    assert lines(server.base, job_id, "errors") == []


def test_an_unknown_job_is_404(server: Server) -> None:
    for method in ("GET", "DELETE"):
        reply = requests.request(method, f"{server.base}/v2/jobs/0123456789abcdef", timeout=30)
        assert reply.status_code == 404
        assert reply.json() == {
            "error": "unknown job '0123456789abcdef' (never submitted, or expired)"
        }
    reply = requests.get(f"{server.base}/v2/jobs/0123456789abcdef/output", timeout=30)
    assert reply.status_code == 404


def test_a_finished_job_expires_after_its_ttl(server: Server) -> None:
    body = add_sub_body([1.0] * 16, [1.0] * 16)
    reply = requests.post(f"{server.base}/v2/models/add_sub/jobs?ttl_secs=1", json=body, timeout=30)
    job_id = reply.json()["id"]
    job = wait_state(server.base, job_id)
    assert job["state"] == "SUCCESS"
    assert job["expires_at"] == pytest.approx(job["finished_at"] + 1, abs=0.002)
    deadline = time.monotonic() + 30
    status = 200
    while status == 200 and time.monotonic() < deadline:
        time.sleep(0.2)
        status = requests.get(f"{server.base}/v2/jobs/{job_id}", timeout=30).status_code
    assert status == 404
    listed = requests.get(f"{server.base}/v2/jobs?model=add_sub&limit=1000", timeout=30).json()
    assert job_id not in {j["id"] for j in listed["jobs"]}
    bad = requests.post(f"{server.base}/v2/models/add_sub/jobs?ttl_secs=0", json=body, timeout=30)
    assert (bad.status_code, bad.json()["error"]) == (
        400, "'ttl_secs' must be between 1 and 2592000, got 0",
    )  # fmt: skip


def test_jobs_are_listed_by_model_and_state(server: Server) -> None:
    add_sub = submit(server.base, "add_sub", add_sub_body([3.0] * 16, [1.0] * 16))
    digits = submit(
        server.base,
        "digits",
        {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]},
    )
    for job_id in (add_sub, digits):
        assert wait_state(server.base, job_id)["state"] == "SUCCESS"
    base = f"{server.base}/v2/jobs"
    of_add_sub = requests.get(f"{base}?model=add_sub&state=SUCCESS", timeout=30).json()["jobs"]
    ids = [j["id"] for j in of_add_sub]
    assert add_sub in ids and digits not in ids
    assert {(j["model_name"], j["state"]) for j in of_add_sub} == {("add_sub", "SUCCESS")}
    created = [j["created_at"] for j in of_add_sub]
    assert created == sorted(created, reverse=True)  # newest first
    of_digits = requests.get(f"{base}?model=digits", timeout=30).json()["jobs"]
    assert digits in [j["id"] for j in of_digits]
    assert requests.get(f"{base}?state=REVOKED&model=digits", timeout=30).json() == {"jobs": []}
    assert len(requests.get(f"{base}?limit=1", timeout=30).json()["jobs"]) == 1
    bad = requests.get(f"{base}?state=DONE", timeout=30)
    assert bad.status_code == 400
    assert bad.json()["error"] == (
        "unknown job state 'DONE'; states: PENDING, STARTED, SUCCESS, FAILURE, REVOKED"
    )


def test_a_bulk_job_answers_each_row_once_and_reports_bad_lines(server: Server) -> None:
    rows = [json.dumps(add_sub_row(i)) for i in range(200)]
    sync_bad = add_sub_body([1.0] * 15, [1.0] * 16, custom_id="short")
    rows[10:10] = [
        "{not json",
        json.dumps(sync_bad),
        json.dumps(add_sub_body([1.0] * 16, [1.0] * 16)),  # no custom_id
        json.dumps(add_sub_row(3)),  # custom_id of line 4 again
        "   ",  # blank: not a row
    ]
    body = ("\n".join(rows) + "\n").encode()
    job_id = submit(server.base, "add_sub", body, headers=JSONL)
    job = wait_state(server.base, job_id)
    assert job["state"] == "SUCCESS"
    assert job["request_counts"] == {"total": 204, "completed": 200, "failed": 4}
    check_add_sub_output(lines(server.base, job_id, "output"), range(200))
    errors = lines(server.base, job_id, "errors")
    sync = requests.post(f"{server.base}/v2/models/add_sub/infer", json=sync_bad, timeout=30)
    assert [(e["custom_id"], e["line"], e["status"]) for e in errors] == [
        (None, 11, 400), ("short", 12, 400), (None, 13, 400), ("row-3", 14, 400),
    ]  # fmt: skip
    assert errors[0]["error"].startswith("failed to parse the request JSON buffer:")
    assert errors[1]["error"] == sync.json()["error"]
    assert errors[2]["error"] == "line 13 of the bulk job of model 'add_sub' has no 'custom_id'"
    assert errors[3]["error"] == (
        "line 14 of the bulk job of model 'add_sub': 'custom_id' 'row-3' is also on line 4"
    )


def test_a_compressed_bulk_body_is_decompressed(server: Server) -> None:
    """A JSON-lines body sent with Content-Encoding gzip or deflate is undone as for
    infer (it was split into garbage rows that all failed)."""
    body = ("\n".join(json.dumps(add_sub_row(i)) for i in range(50)) + "\n").encode()
    for encoding, packed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        job_id = submit(
            server.base, "add_sub", packed, headers={**JSONL, "Content-Encoding": encoding}
        )
        job = wait_state(server.base, job_id)
        assert job["request_counts"] == {"total": 50, "completed": 50, "failed": 0}, encoding
        check_add_sub_output(lines(server.base, job_id, "output"), range(50))


def test_bulk_rows_go_at_the_lowest_priority_level(server: Server) -> None:
    """``slow_priority`` (levels 1 and 2, one instance, batches of 1) is held by a
    synchronous request at level 1: a row without a priority waits on the level-2
    stream, a row asking for priority 1 on the level-1 stream."""
    streams = {level: f"{server.key_prefix}{{slow_priority}}:q:1:p{level}" for level in (1, 2)}
    holding = {
        "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}],
        "parameters": {"sleep_ms": 3000, "priority": 1},
    }
    url = f"{server.base}/v2/models/slow_priority/infer"
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(requests.post, url, json=holding, timeout=60)
        deadline = time.monotonic() + 30
        while stream_length(server.redis_url, streams[1])[1] != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        row = {"inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32", "data": [5.0]}]}
        rows = [dict(row, custom_id="a"), dict(row, custom_id="b", parameters={"priority": 1})]
        job_id = submit(server.base, "slow_priority", jsonl(rows), headers=JSONL)
        waiting = {1: (2, 1), 2: (1, 0)}  # (entries, taken): the held request, then the rows
        while time.monotonic() < deadline and any(
            stream_length(server.redis_url, streams[level]) != want
            for level, want in waiting.items()
        ):
            time.sleep(0.05)
        assert {lv: stream_length(server.redis_url, streams[lv]) for lv in (1, 2)} == waiting
        assert held.result().status_code == 200
    assert wait_state(server.base, job_id)["state"] == "SUCCESS"
    output = lines(server.base, job_id, "output")
    assert [(o["custom_id"], o["response"]["outputs"][0]["data"]) for o in output] == [
        ("a", [5.0]), ("b", [5.0]),
    ]  # fmt: skip


def test_a_bulk_job_reads_a_file_of_the_model_repository(server: Server, model_repository) -> None:
    (model_repository / "add_sub" / "rows.jsonl").write_bytes(
        jsonl([add_sub_row(i) for i in range(5)])
    )
    client = JobClient(server.http_url)
    job_id = client.submit_bulk_file("add_sub", "add_sub/rows.jsonl")
    assert client.wait(job_id, progress=False)["request_counts"]["completed"] == 5
    check_add_sub_output(list(client.output(job_id)), range(5))
    for path in ("../etc/passwd", "/etc/passwd", "add_sub/none.jsonl"):
        with pytest.raises(JobError) as refused:
            client.submit_bulk_file("add_sub", path)
        assert refused.value.status == 400 and f"'{path}'" in refused.value.message


def test_bulk_bodies_obey_the_body_limit(server: Server) -> None:
    """The session server's limit is 8 MiB, as for infer requests."""
    body = b"x" * (8 * 1024 * 1024 + 1)
    job = requests.post(
        f"{server.base}/v2/models/add_sub/jobs", data=body, headers=JSONL, timeout=30
    )
    sync = requests.post(f"{server.base}/v2/models/add_sub/infer", data=body, timeout=30)
    assert (job.status_code, job.json()) == (sync.status_code, sync.json())
    empty = requests.post(
        f"{server.base}/v2/models/add_sub/jobs", data=b"\n", headers=JSONL, timeout=30
    )
    assert (empty.status_code, empty.json()) == (
        400, {"error": "bulk job of model 'add_sub' has no rows"},
    )  # fmt: skip


def test_the_python_client_submits_waits_and_fetches(server: Server, capsys) -> None:
    import sys

    client = JobClient(server.http_url)
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    job_id = client.submit("add_sub", {"INPUT0": a, "INPUT1": a})
    assert client.wait(job_id, progress=sys.stdout)["state"] == "SUCCESS"
    outputs = client.result(job_id)
    np.testing.assert_array_equal(outputs["OUTPUT0"], 2 * a)
    np.testing.assert_array_equal(outputs["OUTPUT1"], 0 * a)
    bulk = client.submit_bulk("add_sub", [add_sub_row(i) for i in range(50)])
    done = client.wait(bulk, progress=sys.stdout)
    assert done["request_counts"] == {"total": 50, "completed": 50, "failed": 0}
    with pytest.raises(JobError, match="is a bulk job: read its output"):
        client.result(bulk)
    assert len(list(client.output(bulk))) == 50
    printed = capsys.readouterr().out
    assert f"job {job_id} SUCCESS" in printed
    assert "] 100% 50/50 rows, 0 failed," in printed
    assert [j["id"] for j in client.list(model="add_sub", limit=2)] == [bulk, job_id]
    with pytest.raises(JobError) as failed:
        client.result(client.submit("raiser", {"X": np.array([[-1]], np.int32)}, binary=False))
    assert failed.value.status in (400, 409)


def test_job_metrics(server: Server) -> None:
    before = _job_samples(server)
    job_id = submit(server.base, "add_sub", add_sub_body([1.0] * 16, [1.0] * 16))
    wait_state(server.base, job_id)
    bulk = submit(server.base, "add_sub", jsonl([add_sub_row(i) for i in range(7)]), headers=JSONL)
    wait_state(server.base, bulk)
    after = _job_samples(server)
    for name, labels, delta in [
        ("sluice_jobs_submitted", 'kind="single",model="add_sub"', 1),
        ("sluice_jobs_succeeded", 'kind="single",model="add_sub"', 1),
        ("sluice_jobs_submitted", 'kind="bulk",model="add_sub"', 1),
        ("sluice_jobs_succeeded", 'kind="bulk",model="add_sub"', 1),
        ("sluice_job_rows", 'model="add_sub",outcome="completed"', 7),
    ]:
        key = f"{name}{{{labels}}}"
        assert after.get(key, 0) - before.get(key, 0) == delta, key
    assert 'sluice_jobs_running{model="add_sub"}' in after


def _job_samples(server: Server) -> dict[str, float]:
    text = requests.get(server.metrics_url, timeout=30).text
    samples = {}
    for line in text.splitlines():
        if line.startswith(("sluice_jobs", "sluice_job_")):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_the_dashboard_lists_jobs(server: Server) -> None:
    job_id = submit(
        server.base, "add_sub", jsonl([add_sub_row(i) for i in range(20)]), headers=JSONL
    )
    wait_state(server.base, job_id)
    deadline = time.monotonic() + 30
    entry = None
    while entry is None and time.monotonic() < deadline:
        data = requests.get(f"{server.base}/dashboard/data", timeout=5).json()
        entry = next((j for j in data["jobs"] if j["id"] == job_id), None)
        time.sleep(0.5)  # sampled every 2 s
    assert entry is not None
    assert {k: entry[k] for k in ("kind", "model", "state", "total", "completed", "failed")} == {
        "kind": "bulk", "model": "add_sub", "state": "SUCCESS",
        "total": 20, "completed": 20, "failed": 0,
    }  # fmt: skip
    page = requests.get(f"{server.base}/dashboard", timeout=5).text
    assert '<table id="jobs">' in page and "renderJobs" in page


def test_a_bulk_job_on_a_sharded_queue_answers_each_row_once(server: Server) -> None:
    """slow_pair_sharded's queue is split over three shards: the job's rows spread over
    them, each answered once with its own value (the job watches all three streams'
    traffic for its fair share)."""
    rows = [
        {
            "custom_id": f"row-{i}",
            "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32", "data": [float(i)]}],
            "outputs": [{"name": "OUT"}],
        }
        for i in range(120)
    ]
    body = ("\n".join(json.dumps(r) for r in rows) + "\n").encode()
    job_id = submit(server.base, "slow_pair_sharded", body, headers=JSONL)
    job = wait_state(server.base, job_id)
    assert job["state"] == "SUCCESS", job
    assert job["request_counts"] == {"total": 120, "completed": 120, "failed": 0}
    output = lines(server.base, job_id, "output")
    got = {line["custom_id"]: line["response"]["outputs"][0]["data"] for line in output}
    assert got == {f"row-{i}": [float(i)] for i in range(120)}
