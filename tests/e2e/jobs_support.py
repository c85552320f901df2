"""Helpers of the async job tests: request bodies, submitting, polling until final."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import redis
import requests

FINAL = ("SUCCESS", "FAILURE", "REVOKED")
JSONL = {"Content-Type": "application/jsonl"}


def add_sub_body(a: list[float], b: list[float], **extra: Any) -> dict[str, Any]:
    """A JSON infer request of ``add_sub`` (INPUT0 = a, INPUT1 = b, each [1, 16])."""
    return {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": a},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": b},
        ],
        **extra,
    }


def add_sub_row(i: int) -> dict[str, Any]:
    """Bulk row ``i`` of ``add_sub``: INPUT0 = i, INPUT1 = 1 (so OUTPUT0 = i + 1)."""
    return add_sub_body([float(i)] * 16, [1.0] * 16, custom_id=f"row-{i}")


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    """Rows as a JSON-lines body."""
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def submit(base: str, model: str, body: bytes | dict[str, Any], **kwargs: Any) -> str:
    """POST a job; returns its id (asserts the 202 and its Location)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = requests.post(f"{base}/v2/models/{model}/jobs", data=data, timeout=30, **kwargs)
    assert reply.status_code == 202, reply.text
    job = reply.json()
    assert reply.headers["Location"] == f"/v2/jobs/{job['id']}"
    return job["id"]


def get(base: str, job_id: str) -> dict[str, Any]:
    """The job's JSON (the JSON part of a binary answer)."""
    reply = requests.get(f"{base}/v2/jobs/{job_id}", timeout=30)
    assert reply.status_code == 200, reply.text
    length = reply.headers.get("Inference-Header-Content-Length")
    return json.loads(reply.content[: int(length)] if length else reply.content)


def wait_state(
    base: str, job_id: str, states: tuple[str, ...] = FINAL, timeout_s: float = 90.0
) -> dict[str, Any]:
    """Poll the job until its state is one of ``states``; connection errors (a gateway
    restarting) are waited out. Fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            job = get(base, job_id)
        except requests.RequestException:
            time.sleep(0.2)
            continue
        if job["state"] in states:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not in {states} within {timeout_s} s: {job}")


def lines(base: str, job_id: str, which: str) -> list[dict[str, Any]]:
    """A bulk job's output or errors lines."""
    reply = requests.get(f"{base}/v2/jobs/{job_id}/{which}", timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("application/jsonl")
    return [json.loads(line) for line in reply.content.splitlines() if line.strip()]


def check_add_sub_output(output: list[dict[str, Any]], rows: range) -> None:
    """Each row of ``rows`` answered exactly once, with OUTPUT0 = i + 1, OUTPUT1 = i - 1."""
    ids = [line["custom_id"] for line in output]
    assert len(ids) == len(set(ids)) == len(rows)
    assert set(ids) == {f"row-{i}" for i in rows}
    for line in output:
        i = int(line["custom_id"].split("-")[1])
        by_name = {o["name"]: o for o in line["response"]["outputs"]}
        assert by_name["OUTPUT0"]["data"] == [i + 1.0] * 16
        assert by_name["OUTPUT1"]["data"] == [i - 1.0] * 16


def stream_length(redis_url: str, key: str) -> tuple[int, int]:
    """(entries, entries an instance holds) of a model stream."""
    client = redis.Redis.from_url(redis_url)
    try:
        length = int(client.xlen(key))
        try:
            pending = int(client.xpending(key, "instances")["pending"])
        except redis.exceptions.ResponseError:
            pending = 0
        return length, pending
    finally:
        client.close()


def ones(shape: tuple[int, ...]) -> np.ndarray:
    """FP32 ones."""
    return np.ones(shape, np.float32)
