"""The job store against a real Redis: state changes happen once, rows are written once,
leases exclude each other, expiry and listing."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from sluice.broker.job_records import JobKind, JobRecord
from sluice.broker.job_store import JobStore
from sluice.broker.keys import KeySchema
from sluice.broker.states import JobState


@pytest.fixture
async def store(redis_url: str, key_prefix: str) -> AsyncIterator[JobStore]:
    client = redis.asyncio.Redis.from_url(redis_url, protocol=2)
    yield JobStore(client, KeySchema(key_prefix))
    await client.aclose()


def _record(
    job_id: str, model: str = "m", kind: JobKind = JobKind.SINGLE, ttl_s: int = 60
) -> JobRecord:
    now = time.time_ns()
    return JobRecord(
        id=job_id,
        kind=kind,
        model=model,
        version=None,
        state=JobState.PENDING,
        created_ns=now,
        deadline_ns=now + 3_600_000_000_000,
        ttl_s=ttl_s,
    )


async def test_a_job_reaches_a_final_state_once(store: JobStore) -> None:
    record = _record("a1")
    await store.create(record, b"payload")
    assert (await store.get("a1")).state is JobState.PENDING
    assert await store.input("a1") == b"payload"
    assert await store.transition(record, JobState.STARTED, attempts=1)
    assert await store.transition(record, JobState.STARTED, attempts=2)  # taken over
    first = _record("a1")
    assert await store.transition(record, JobState.SUCCESS, model_version=3)
    # a second worker with its own copy of the record comes too late
    first.state = JobState.STARTED
    assert not await store.transition(first, JobState.FAILURE, error="late")
    assert first.state is JobState.SUCCESS  # what Redis holds
    assert not await store.transition(record, JobState.REVOKED)
    got = await store.get("a1")
    assert (got.state, got.model_version, got.attempts, got.error) == (
        JobState.SUCCESS, 3, 2, "",
    )  # fmt: skip
    assert 0 < got.started_ns <= got.finished_ns
    counters = await store.counters()
    assert counters[("submitted", "single", "m")] == 1
    assert counters[("success", "single", "m")] == 1
    assert ("failure", "single", "m") not in counters


async def test_finished_keys_expire_after_the_ttl(store: JobStore, redis_url: str) -> None:
    record = _record("b1", ttl_s=7)
    await store.create(record, b"x")
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        keys = store.keys
        assert await client.ttl(keys.job("b1")) > 3600  # until the deadline and a ttl more
        await store.store_result(record, b"answer")
        await store.transition(record, JobState.STARTED)
        await store.transition(record, JobState.SUCCESS)
        for key in (keys.job("b1"), keys.job_input("b1"), keys.job_result("b1")):
            assert 0 < await client.ttl(key) <= 7
        assert not await store.store_result(record, b"again")  # the first answer stays
        assert await store.result("b1") == b"answer"
        await client.delete(keys.job("b1"))  # what expiry does
        assert await store.get("b1") is None
        assert not await store.transition(record, JobState.FAILURE)
    finally:
        await client.aclose()


async def test_each_row_is_written_once(store: JobStore) -> None:
    record = _record("c1", kind=JobKind.BULK)
    await store.create(record, b"rows")
    assert await store.write_rows(record, [(1, b"o1"), (2, b"o2")], [(3, b"e3")]) == (2, 1)
    # a second run answers rows 2 and 3 again: neither is written twice, nor moves
    assert await store.write_rows(record, [(2, b"o2'"), (3, b"o3"), (4, b"o4")], []) == (1, 0)
    assert await store.done_rows("c1") == {1, 2, 3, 4}
    assert await store.row_counts(["c1"]) == [(3, 1)]
    assert await store.row_lines("c1", errors=False) == [1, 2, 4]
    assert await store.rows("c1", False, [1, 2, 3, 4]) == [b"o1", b"o2", b"o4"]
    assert await store.rows("c1", True, [3]) == [b"e3"]
    counters = await store.counters()
    assert counters[("rows_completed", "bulk", "m")] == 3
    assert counters[("rows_failed", "bulk", "m")] == 1


@pytest.mark.parametrize("final", [JobState.REVOKED, JobState.FAILURE, JobState.SUCCESS])
async def test_a_final_job_takes_no_more_rows(store: JobStore, final: JobState) -> None:
    """Rows of a job answered after it became final (cancelled) are neither written nor
    counted: the write refuses (None) and the rows and counters stay."""
    job_id = f"f-{final.value}"
    record = _record(job_id, model="final", kind=JobKind.BULK)
    await store.create(record, b"rows")
    await store.transition(record, JobState.STARTED)
    assert await store.write_rows(record, [(1, b"o1")], []) == (1, 0)
    worker = _record(job_id, model="final", kind=JobKind.BULK)  # the worker's own copy
    worker.state = JobState.STARTED
    assert await store.transition(record, final)  # e.g. the gateway's DELETE
    assert await store.write_rows(worker, [(2, b"o2"), (3, b"o3")], [(4, b"e4")]) is None
    assert await store.row_counts([job_id]) == [(1, 0)]
    assert await store.done_rows(job_id) == {1}
    counters = await store.counters()
    assert counters[("rows_completed", "bulk", "final")] == 1
    assert ("rows_failed", "bulk", "final") not in counters


async def test_a_gone_job_takes_no_rows(store: JobStore) -> None:
    record = _record("g1", kind=JobKind.BULK)  # never created, or expired
    assert await store.write_rows(record, [(1, b"o1")], []) is None
    assert await store.row_counts(["g1"]) == [(0, 0)]


async def test_a_lease_is_held_by_one_token(store: JobStore, redis_url: str) -> None:
    assert await store.take_lease("d1", "w1", 5000)
    assert not await store.take_lease("d1", "w2", 5000)
    assert await store.renew_lease("d1", "w1", 5000)
    assert not await store.renew_lease("d1", "w2", 5000)
    await store.release_lease("d1", "w2")  # not its lease: nothing happens
    assert not await store.take_lease("d1", "w2", 5000)
    await store.release_lease("d1", "w1")
    assert await store.take_lease("d1", "w2", 50)
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await client.delete(store.keys.job_lease("d1"))  # what the expiry does
    finally:
        await client.aclose()
    assert not await store.renew_lease("d1", "w2", 5000)
    assert await store.take_lease("d1", "w3", 5000)


async def test_listing_filters_and_forgets_expired_jobs(store: JobStore, redis_url: str) -> None:
    records = [_record("e1", "m1"), _record("e2", "m2"), _record("e3", "m1")]
    for offset, record in enumerate(records):
        record.created_ns += offset * 1_000_000
        await store.create(record, b"")
    await store.transition(records[0], JobState.REVOKED)
    assert [r.id for r in await store.recent(None, None, 10)] == ["e3", "e2", "e1"]
    assert [r.id for r in await store.recent("m1", None, 10)] == ["e3", "e1"]
    assert [r.id for r in await store.recent("m1", JobState.REVOKED, 10)] == ["e1"]
    assert [r.id for r in await store.recent(None, None, 1)] == ["e3"]
    assert sorted(r.id for r in await store.active()) == ["e2", "e3"]
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await client.delete(store.keys.job("e2"))
        assert [r.id for r in await store.recent(None, None, 10)] == ["e3", "e1"]
        assert await client.zscore(store.keys.jobs_index(), "e2") is None
        assert [r.id for r in await store.active()] == ["e3"]
        assert not await client.sismember(store.keys.jobs_active(), "e2")
    finally:
        await client.aclose()


async def test_index_entries_older_than_any_job_are_dropped(store: JobStore) -> None:
    old = _record("f1")
    old.created_ns -= 3600 * 1_000_000_000  # an hour ago
    await store.create(old, b"")
    await store.create(_record("f2"), b"", keep_index_s=600)  # jobs live 10 min at most
    assert [r.id for r in await store.recent(None, None, 10)] == ["f2"]
