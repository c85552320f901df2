"""Cancelling a queued request against a real Redis: ``Producer.cancel`` (the
``CANCEL_QUEUED`` script) and :meth:`Submission.submit`'s future being cancelled."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio

from sluice.api.app import build_dataplane
from sluice.api.dataplane import DataPlane
from sluice.api.models import ModelView, build_view
from sluice.api.settings import GatewaySettings
from sluice.broker.errors import SluiceError
from sluice.broker.keys import WORKER_GROUP
from sluice.broker.messages import WireTensor
from sluice.broker.model_store import ModelRecord, VersionState
from sluice.broker.multiplex import MultiplexedConnection
from sluice.broker.producer import PAYLOAD_FIELD, Producer
from sluice.broker.settings import RedisSettings
from sluice.broker.states import ModelState

STREAM = "{m}:q:1"
STATS = "{m}:stats:1"
_INPUT = (WireTensor("IN", "FP32", (1, 1), b"\0\0\x80?"),)


def _view(max_queue_size: int = 0) -> ModelView:
    config = {
        "name": "m",
        "backend": "python",
        "max_batch_size": 8,
        "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}],
    }
    if max_queue_size:
        config["dynamic_batching"] = {"default_queue_policy": {"max_queue_size": max_queue_size}}
    record = ModelRecord("m", json.dumps(config), {1: VersionState(ModelState.READY)})
    return build_view(record)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    c = redis.asyncio.Redis.from_url(redis_url, protocol=2)
    yield c
    await c.aclose()


@pytest.fixture
async def dataplane(
    redis_url: str, key_prefix: str, client: redis.asyncio.Redis
) -> AsyncIterator[DataPlane]:
    settings = GatewaySettings(redis=RedisSettings(url=redis_url, key_prefix=key_prefix))
    dp = build_dataplane(settings, client)
    await dp.connection.start()
    await dp.router.start()
    yield dp
    await dp.router.stop()
    await dp.connection.stop()


def _submit(dp: DataPlane, view: ModelView, n: int) -> asyncio.Future:
    return dp.submission.submit(f"r{n}", view, 1, "", _INPUT, (), {})


async def _until(
    predicate: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 5.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def _stats(client: redis.asyncio.Redis, key: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in (await client.hgetall(key)).items()}


# -- the script ------------------------------------------------------------------------------


async def test_a_queued_entry_is_deleted_and_counted_once(
    connection: MultiplexedConnection, client: redis.asyncio.Redis, key_prefix: str
) -> None:
    stream, stats = key_prefix + STREAM, key_prefix + STATS
    await client.xgroup_create(stream, WORKER_GROUP, id="0", mkstream=True)
    entry = await client.xadd(stream, {PAYLOAD_FIELD: b"x"})
    producer = Producer(connection)
    assert await producer.cancel(stream, entry, stats, 1234) is True
    assert await client.xlen(stream) == 0
    assert await _stats(client, stats) == {
        "fail_count": 1,
        "fail_ns": 1234,
        "fail_reason:CANCELED": 1,
        "cancel_ns": 1234,
    }
    # a second cancellation of the same entry finds nothing and counts nothing
    assert await producer.cancel(stream, entry, stats, 99) is False
    assert (await _stats(client, stats))["fail_count"] == 1


async def test_an_entry_an_instance_took_is_left_alone(
    connection: MultiplexedConnection, client: redis.asyncio.Redis, key_prefix: str
) -> None:
    stream, stats = key_prefix + STREAM, key_prefix + STATS
    await client.xgroup_create(stream, WORKER_GROUP, id="0", mkstream=True)
    taken = await client.xadd(stream, {PAYLOAD_FIELD: b"taken"})
    queued = await client.xadd(stream, {PAYLOAD_FIELD: b"queued"})
    await client.xreadgroup(WORKER_GROUP, "instance-0", {stream: ">"}, count=1)
    producer = Producer(connection)
    assert await producer.cancel(stream, taken, stats, 10) is False
    assert [e for e, _ in await client.xrange(stream)] == [taken, queued]
    assert await _stats(client, stats) == {}
    assert await producer.cancel(stream, queued, stats, 10) is True
    assert [e for e, _ in await client.xrange(stream)] == [taken]


async def test_a_stream_no_instance_has_joined_yet(
    connection: MultiplexedConnection, client: redis.asyncio.Redis, key_prefix: str
) -> None:
    stream, stats = key_prefix + STREAM, key_prefix + STATS
    entry = await client.xadd(stream, {PAYLOAD_FIELD: b"x"})  # no consumer group
    assert await Producer(connection).cancel(stream, entry, stats, 5) is True
    assert await client.xlen(stream) == 0
    assert (await _stats(client, stats))["fail_reason:CANCELED"] == 1


# -- through the DataPlane -------------------------------------------------------------------


async def test_cancelling_the_future_takes_the_request_off_its_stream(
    dataplane: DataPlane, client: redis.asyncio.Redis, key_prefix: str
) -> None:
    stream, stats = key_prefix + STREAM, key_prefix + STATS
    future = _submit(dataplane, _view(), 1)
    await _until(lambda: _xlen(client, stream, 1), "the request is queued")
    future.cancel()
    await _until(lambda: _xlen(client, stream, 0), "the request is taken off")
    counted = await _stats(client, stats)
    assert counted["fail_count"] == counted["fail_reason:CANCELED"] == 1
    assert counted["fail_ns"] > 0

    # not while the gateway exits: what the server cancels then (gRPC's grace period,
    # uvicorn's shutdown timeout) is taken off by drop_unanswered, uncounted
    future = _submit(dataplane, _view(), 2)
    await _until(lambda: _xlen(client, stream, 1), "the request is queued")
    dataplane.begin_shutdown()
    future.cancel()
    for _ in range(5):
        await asyncio.sleep(0)  # the done callbacks run; a cancellation would queue its script
    await dataplane.connection.call("PING")  # ... and it would have run before this answer
    assert await client.xlen(stream) == 1
    assert await _stats(client, stats) == counted
    assert await dataplane.queue.drop_unanswered() == 1


async def test_cancelled_before_the_xadd_answers(
    dataplane: DataPlane, client: redis.asyncio.Redis, key_prefix: str
) -> None:
    stream, stats = key_prefix + STREAM, key_prefix + STATS
    for max_queue_size in (0, 4):  # plain XADD, and the bounded script
        future = _submit(dataplane, _view(max_queue_size), max_queue_size)
        future.cancel()  # in the same loop iteration: the XADD has not even left
        await _until(
            lambda n=max_queue_size: _counted(client, stats, 1 if n == 0 else 2),
            "the request is counted",
        )
        assert await client.xlen(stream) == 0


async def test_a_request_an_instance_took_still_runs(
    dataplane: DataPlane,
    client: redis.asyncio.Redis,
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="sluice.api.handlers.queueing")
    stream, stats = key_prefix + STREAM, key_prefix + STATS
    await client.xgroup_create(stream, WORKER_GROUP, id="0", mkstream=True)
    future = _submit(dataplane, _view(), 1)
    await _until(lambda: _xlen(client, stream, 1), "the request is queued")
    await client.xreadgroup(WORKER_GROUP, "instance-0", {stream: ">"}, count=1)
    future.cancel()

    async def logged() -> bool:
        return any("already taken by an instance" in r.getMessage() for r in caplog.records)

    await _until(logged, "the cancellation is refused")
    assert await client.xlen(stream) == 1
    assert await _stats(client, stats) == {}


async def test_max_queue_size_counts_right_after_a_cancellation(
    dataplane: DataPlane, client: redis.asyncio.Redis, key_prefix: str
) -> None:
    """``BOUNDED_XADD`` counts queued = length - pending: an instance holds one request,
    one more is queued (max_queue_size 1); the queued one cancelled, a new one fits."""
    stream = key_prefix + STREAM
    view = _view(max_queue_size=1)
    await client.xgroup_create(stream, WORKER_GROUP, id="0", mkstream=True)
    running = _submit(dataplane, view, 1)
    await _until(lambda: _xlen(client, stream, 1), "the first request is queued")
    await client.xreadgroup(WORKER_GROUP, "instance-0", {stream: ">"}, count=1)
    queued = _submit(dataplane, view, 2)
    await _until(lambda: _xlen(client, stream, 2), "the second request is queued")
    with pytest.raises(SluiceError, match="Exceeds maximum queue size"):
        await _submit(dataplane, view, 3)
    queued.cancel()
    await _until(lambda: _xlen(client, stream, 1), "the second request is taken off")
    later = _submit(dataplane, view, 4)
    await _until(lambda: _xlen(client, stream, 2), "the fourth request is queued")
    assert not later.done()  # queued, not refused
    for future in (running, later):
        future.cancel()


async def _xlen(client: redis.asyncio.Redis, stream: str, length: int) -> bool:
    return int(await client.xlen(stream)) == length


async def _counted(client: redis.asyncio.Redis, stats: str, count: int) -> bool:
    return (await _stats(client, stats)).get("fail_reason:CANCELED", 0) == count
