"""Job records, job requests, job states and the jobs' Celery configuration, without Redis."""

from __future__ import annotations

import pytest

from sluice.broker.celery_app import JOB_QUEUE, celery_url, job_app
from sluice.broker.job_records import (
    JobKind,
    JobRecord,
    JobRequest,
    decode_job_request,
    encode_job_request,
)
from sluice.broker.keys import KeySchema
from sluice.broker.messages import RequestedOutput, WireTensor
from sluice.broker.states import JOB_TRANSITIONS, JobState


def test_a_record_survives_the_hash() -> None:
    record = JobRecord(
        id="abc", kind=JobKind.BULK, model="m", version=2, state=JobState.STARTED,
        created_ns=1, deadline_ns=9, ttl_s=60, started_ns=2, total=5, source="body",
        priority=3, attempts=1, error="e", code="INTERNAL",
    )  # fmt: skip
    fields = record.to_fields()
    assert fields["version"] == "2" and fields["state"] == "STARTED" and "id" not in fields
    raw = {k.encode(): v.encode() for k, v in fields.items()}
    assert JobRecord.from_fields("abc", raw) == record
    no_version = JobRecord.from_fields("x", {**fields, "version": ""})
    assert no_version.version is None


def test_a_hash_that_is_no_record_is_refused() -> None:
    with pytest.raises(ValueError, match="job x: record without 'state'"):
        JobRecord.from_fields("x", {"kind": "single", "model": "m"})


def test_a_job_request_survives_msgpack() -> None:
    request = JobRequest(
        client_id="c",
        inputs=(WireTensor("IN", "FP32", (1, 2), b"\x00" * 8), WireTensor("S", "BYTES", (1,), b"")),
        outputs=(RequestedOutput("OUT", True, 0), RequestedOutput("CLS", False, 3)),
        parameters={"priority": 1, "x": "y"},
        binary_data_output=True,
    )
    assert decode_job_request(encode_job_request(request)) == request
    with pytest.raises(ValueError, match="undecodable job request"):
        decode_job_request(b"\xc1")


def test_job_states_and_their_moves() -> None:
    assert [s for s in JobState if s.final] == [
        JobState.SUCCESS,
        JobState.FAILURE,
        JobState.REVOKED,
    ]
    for state in JobState:
        assert (not JOB_TRANSITIONS[state]) == state.final
    assert JobState.STARTED in JOB_TRANSITIONS[JobState.STARTED]  # taken over after a crash
    assert JobState.SUCCESS not in JOB_TRANSITIONS[JobState.PENDING]


def test_a_jobs_keys_share_its_hash_tag() -> None:
    keys = KeySchema("p:")
    assert keys.job_keys("j1") == [
        "p:job:{j1}", "p:job:{j1}:input", "p:job:{j1}:result", "p:job:{j1}:output",
        "p:job:{j1}:errors",
    ]  # fmt: skip
    assert keys.job_lease("j1") == "p:job:{j1}:lease"
    assert keys.celery_prefix() == "p:jobs:celery:"


def test_the_celery_app_acknowledges_late_and_redelivers_soon() -> None:
    app = job_app("redis://h:6379/2", KeySchema("p:"), visibility_timeout_s=7)
    conf = app.conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost and conf.task_track_started
    assert conf.worker_prefetch_multiplier == 1
    assert conf.worker_send_task_events and conf.task_send_sent_event
    assert conf.task_default_queue == JOB_QUEUE
    assert conf.broker_transport_options == {
        "global_keyprefix": "p:jobs:celery:",
        "visibility_timeout": 7,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }
    assert conf.result_backend_transport_options == {"global_keyprefix": "p:jobs:celery:"}
    assert conf.result_backend == "redis://h:6379/2"
    assert job_app("redis://h", KeySchema(), results=False).conf.result_backend is None


def test_celery_urls() -> None:
    assert celery_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert (
        celery_url("unix:///tmp/d/redis.sock?db=3")
        == "redis+socket:///tmp/d/redis.sock?virtual_host=3"
    )
