"""The job API's JSON shapes and its metric families, without Redis."""

from __future__ import annotations

from sluice.api.handlers.jobs import JobView, count_rows
from sluice.api.http.jobs import bulk_input_file, job_fields
from sluice.api.metrics.jobs import JobMetrics
from sluice.broker.job_records import JobKind, JobRecord
from sluice.broker.states import JobState

S = 1_000_000_000


def _record(**changes: object) -> JobRecord:
    record = JobRecord(
        id="j", kind=JobKind.SINGLE, model="m", version=None, state=JobState.PENDING,
        created_ns=10 * S, deadline_ns=100 * S, ttl_s=5,
    )  # fmt: skip
    for name, value in changes.items():
        setattr(record, name, value)
    return record


def test_a_pending_single_job() -> None:
    assert job_fields(JobView(_record())) == {
        "id": "j", "kind": "single", "state": "PENDING", "model_name": "m",
        "model_version": "", "created_at": 10.0, "started_at": None, "finished_at": None,
        "expires_at": 105.0,
    }  # fmt: skip


def test_a_failed_job_has_the_synchronous_status() -> None:
    record = _record(
        state=JobState.FAILURE, version=2, started_ns=11 * S, finished_ns=12 * S,
        error="Request timeout expired", code="UNAVAILABLE",
    )  # fmt: skip
    fields = job_fields(JobView(record))
    assert (fields["error"], fields["status"]) == ("Request timeout expired", 503)
    assert (fields["model_version"], fields["finished_at"], fields["expires_at"]) == (
        "2",
        12.0,
        17.0,
    )


def test_a_bulk_job_reports_its_rows() -> None:
    record = _record(kind=JobKind.BULK, state=JobState.STARTED, total=9, model_version=1)
    fields = job_fields(JobView(record, completed=4, failed=1))
    assert fields["request_counts"] == {"total": 9, "completed": 4, "failed": 1}
    assert fields["output_url"] == "/v2/jobs/j/output"
    assert fields["errors_url"] == "/v2/jobs/j/errors"
    assert fields["model_version"] == "1"


def test_rows_and_bulk_files_are_told_apart() -> None:
    assert count_rows(b'{"a":1}\n\n  \n{"b":2}') == 2
    assert bulk_input_file(b'{"input_file": "m/rows.jsonl"}', "application/json") == "m/rows.jsonl"
    assert bulk_input_file(b'{"input_file": "x", "inputs": []}', "") is None  # an infer body
    assert bulk_input_file(b'{"inputs": []}', "") is None
    assert bulk_input_file(b'{"input_file": "x"}', "application/octet-stream") is None


def test_job_metric_families() -> None:
    metrics = JobMetrics(store=None)  # type: ignore[arg-type]
    counters = {
        ("submitted", "bulk", "m"): 3,
        ("success", "bulk", "m"): 1,
        ("rows_completed", "bulk", "m"): 100,
        ("rows_failed", "bulk", "m"): 4,
    }
    active = [("m", JobState.STARTED), ("m", JobState.PENDING), ("n", JobState.PENDING)]
    families = {f.name: f for f in metrics.build(counters, active, now_s=10.0)}
    assert families["sluice_jobs_submitted"].samples == [({"model": "m", "kind": "bulk"}, 3)]
    assert families["sluice_jobs_failed"].samples == []
    assert families["sluice_job_rows"].samples == [
        ({"model": "m", "outcome": "completed"}, 100),
        ({"model": "m", "outcome": "failed"}, 4),
    ]
    assert families["sluice_jobs_running"].samples == [({"model": "m"}, 1), ({"model": "n"}, 0)]
    assert families["sluice_jobs_pending"].samples == [({"model": "m"}, 1), ({"model": "n"}, 1)]
    assert families["sluice_job_rows_per_second"].samples == [({"model": "m"}, 0.0)]
    counters[("rows_completed", "bulk", "m")] = 300
    again = {f.name: f for f in metrics.build(counters, [], now_s=12.0)}
    assert again["sluice_job_rows_per_second"].samples == [({"model": "m"}, 100.0)]
