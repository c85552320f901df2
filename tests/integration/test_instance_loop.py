"""InstanceLoop against a real Redis stream: what a delay window's batch holds, and how a
request whose deadline passes while it executes is answered and counted."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import numpy as np
import redis
import redis.asyncio
import redis.exceptions
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.broker.codec import decode_response, encode_request
from sluice.broker.consumer import Delivery, StreamConsumer
from sluice.broker.keys import WORKER_GROUP, KeySchema
from sluice.broker.messages import InferRequestMessage, WireTensor
from sluice.broker.producer import PAYLOAD_FIELD
from sluice.broker.scheduling import ShapeKeys, StreamLayout, scheduling_policy
from sluice.broker.stats_store import StatsShard, open_stats_shard, read_stats
from sluice.gpu_workers.answers import output_datatypes
from sluice.gpu_workers.backends.base import InferRequest, InferResponse
from sluice.gpu_workers.loop import InstanceLoop

CONFIG = """
name: "m" max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 20000 }
"""
WINDOW_NS = 20_000_000


async def _read_stats(redis_url: str, keys: KeySchema) -> dict[str, int]:
    """Version 1 of model "m" as the gateway reads it: gateway hash and shards added up."""
    client = redis.asyncio.Redis.from_url(redis_url, protocol=2)
    try:
        (stats,) = await read_stats(client, keys, [("m", 1)])
    finally:
        await client.aclose()
    return stats.counters


class _Recorder:
    """A backend answering its input and noting the size of each execution."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse]:
        self.batches.append([r.request_id for r in requests])
        return [InferResponse({"OUTPUT0": r.inputs["INPUT0"]}) for r in requests]


class _LateArrival:
    """A consumer whose first non-blocking read inside the window is followed at once by
    one more request: it is queued while the instance sleeps out the window's end."""

    def __init__(self, consumer: StreamConsumer, arrive: object) -> None:
        self._consumer = consumer
        self._arrive = arrive
        self.polls = 0

    def read(self, count: int, block_ms: int | None) -> list[Delivery]:
        deliveries = self._consumer.read(count=count, block_ms=block_ms)
        if block_ms is None:
            self.polls += 1
            if self.polls == 1:
                self._arrive()  # type: ignore[operator]
        return deliveries

    def __getattr__(self, name: str) -> object:
        return getattr(self._consumer, name)


def _request(
    n: int, enqueued_ns: int, reply_to: str, deadline_ns: int | None = None
) -> InferRequestMessage:
    return InferRequestMessage(
        request_id=f"r{n}",
        client_id="",
        model="m",
        version=1,
        inputs=(WireTensor("INPUT0", "INT32", (1, 1), np.int32(n).tobytes()),),
        outputs=(),
        parameters={},
        reply_to=reply_to,
        deadline_ns=enqueued_ns + 10**10 if deadline_ns is None else deadline_ns,
        enqueued_ns=enqueued_ns,
    )


def test_a_request_queued_while_the_window_closes_joins_the_batch(
    redis_url: str, key_prefix: str
) -> None:
    """Triton's batch holds every request enqueued before the delay ran out: one that
    arrives after the instance's last poll but before the window's end is read before
    the batch is formed, not left for the next execution."""
    client = redis.Redis.from_url(redis_url, protocol=2, socket_timeout=5)
    config = text_format.Parse(CONFIG, ModelConfig())
    layout = StreamLayout(KeySchema(key_prefix), "m", 1, scheduling_policy(config))
    stream, reply = layout.stream(0), f"{key_prefix}reply:g"
    start = time.time_ns()
    now = [start]

    def arrive() -> None:
        client.xadd(stream, {PAYLOAD_FIELD: encode_request(_request(2, now[0], reply))})

    real = StreamConsumer(client, layout.streams(), "instance-0")
    real.ensure_groups()
    consumer = _LateArrival(real, arrive)
    backend = _Recorder()
    loop = InstanceLoop(
        consumer,  # type: ignore[arg-type]
        backend,  # type: ignore[arg-type]
        layout,
        ShapeKeys(config),
        output_datatypes(config),
        None,
        batching=True,
        clock=lambda: now[0],
    )
    try:
        client.xadd(stream, {PAYLOAD_FIELD: encode_request(_request(1, start, reply))})
        loop.step()  # blocks until r1 is read: it opens a 20 ms window
        now[0] = start + WINDOW_NS - 200_000  # 200 µs left: poll (empty), r2 comes, sleep
        loop.step()
        now[0] = start + WINDOW_NS + 1  # the window is over
        loop.step()
        real.flush()
        assert backend.batches == [["r1", "r2"]]
        answers = {decode_response(p).request_id for p in client.lrange(reply, 0, -1)}
        assert answers == {"r1", "r2"}
    finally:
        real.close()
        client.delete(stream, reply)
        client.close()


class _Slow(_Recorder):
    """A backend during whose execution the (test) clock moves on to ``until``."""

    def __init__(self, now: list[int], until: int) -> None:
        super().__init__()
        self._now = now
        self._until = until

    def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse]:
        self._now[0] = self._until
        return super().execute(requests)


def _counted_loop(
    client: redis.Redis, keys: KeySchema, backend: object, now: list[int]
) -> tuple[InstanceLoop, StreamConsumer, str, StatsShard]:
    """An instance of model "m" (:data:`CONFIG`) on its stream, with a statistics shard,
    on the clock ``now[0]``: (loop, consumer, stream, shard)."""
    config = text_format.Parse(CONFIG, ModelConfig())
    layout = StreamLayout(keys, "m", 1, scheduling_policy(config))
    shard = open_stats_shard(client, keys, "m", 1, "instance-0")
    consumer = StreamConsumer(client, layout.streams(), "instance-0")
    consumer.ensure_groups()
    loop = InstanceLoop(
        consumer,
        backend,  # type: ignore[arg-type]
        layout,
        ShapeKeys(config),
        output_datatypes(config),
        shard,
        batching=True,
        clock=lambda: now[0],
    )
    return loop, consumer, layout.stream(0), shard


def test_a_request_whose_deadline_passes_during_execution_is_a_timeout_not_a_success(
    redis_url: str, key_prefix: str
) -> None:
    """The gateway answered "Request timeout expired" when the deadline passed; the
    instance answers and counts it the same way (a failure, reason REJECTED) instead of
    counting a success nobody received. Its batch mate, still in time, succeeds."""
    client = redis.Redis.from_url(redis_url, protocol=2, socket_timeout=5)
    keys = KeySchema(key_prefix)
    start = time.time_ns()
    now = [start]
    backend = _Slow(now, until=start + WINDOW_NS + 10_000_000)
    loop, consumer, stream, shard = _counted_loop(client, keys, backend, now)
    reply = f"{key_prefix}reply:g"
    try:
        late = _request(1, start, reply, deadline_ns=start + WINDOW_NS + 5_000_000)
        for message in (late, _request(2, start, reply)):
            client.xadd(stream, {PAYLOAD_FIELD: encode_request(message)})
        loop.step()  # reads both: the window opens
        now[0] = start + WINDOW_NS + 1  # window over, r1's deadline still ahead
        loop.step()  # executes both; the clock passes r1's deadline meanwhile
        consumer.flush()
        assert backend.batches == [["r1", "r2"]]
        answers = {a.request_id: a for a in map(decode_response, client.lrange(reply, 0, -1))}
        assert answers["r1"].error is not None
        assert (answers["r1"].error.code, answers["r1"].error.message) == (
            "UNAVAILABLE",
            "Request timeout expired",
        )
        assert (
            answers["r2"].error is None and answers["r2"].outputs[0].data == np.int32(2).tobytes()
        )
        stats = asyncio.run(_read_stats(redis_url, keys))
        assert stats["success_count"] == 1
        assert stats["inference_count"] == 1
        assert stats["fail_count"] == 1
        assert stats["fail_reason:REJECTED"] == 1
        assert stats["execution_count"] == 1
        assert stats["batch:2:count"] == 1
    finally:
        consumer.close()
        client.delete(stream, reply, shard.key, shard.registry)
        client.close()


def _clients(client: redis.Redis) -> list[dict[str, str]]:
    return client.client_list()  # type: ignore[return-value]


def test_entries_a_lost_read_delivered_are_taken_back_after_the_connection_drops(
    redis_url: str, key_prefix: str
) -> None:
    """A read whose reply is lost (the connection killed while Redis answered) leaves
    its entries pending for this live instance, where no claim of a dead instance's
    entries would find them. The loop sees the lost connection (no silent retry),
    reconnects and reads its own pending entries again: the request is answered."""
    name = f"{key_prefix}loop"
    client = redis.Redis.from_url(redis_url, protocol=2, socket_timeout=5, client_name=name)
    test = redis.Redis.from_url(redis_url, protocol=2, socket_timeout=5)
    config = text_format.Parse(CONFIG, ModelConfig())
    layout = StreamLayout(KeySchema(key_prefix), "m", 1, scheduling_policy(config))
    stream, reply = layout.stream(0), f"{key_prefix}reply:g"
    consumer = StreamConsumer(client, layout.streams(), "instance-0")
    consumer.ensure_groups()
    backend = _Recorder()
    loop = InstanceLoop(
        consumer, backend, layout, ShapeKeys(config), output_datatypes(config), None,  # type: ignore[arg-type]
        batching=True,
    )  # fmt: skip
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while not any(c.get("name") == name and c["cmd"] == "xreadgroup" for c in _clients(test)):
            assert time.monotonic() < deadline, "the loop never blocked on its stream"
            time.sleep(0.01)
        # the lost read: r1 is delivered to instance-0 in one transaction with its XADD,
        # so the loop's own blocked read does not get it
        with test.pipeline(transaction=True) as pipe:
            pipe.xadd(stream, {PAYLOAD_FIELD: encode_request(_request(1, time.time_ns(), reply))})
            pipe.xreadgroup(WORKER_GROUP, "instance-0", {stream: ">"}, count=10)
            pipe.execute()
        assert test.xpending(stream, WORKER_GROUP)["pending"] == 1
        ids = [c["id"] for c in _clients(test) if c.get("name") == name]
        for client_id in ids:
            test.client_kill_filter(_id=client_id)
        answer = test.blpop([reply], timeout=5)
        assert answer is not None, "the delivered entry was never taken back"
        assert decode_response(answer[1]).request_id == "r1"
        assert backend.batches == [["r1"]]
        deadline = time.monotonic() + 5
        while test.xpending(stream, WORKER_GROUP)["pending"]:
            assert time.monotonic() < deadline, "r1 was answered but never acknowledged"
            time.sleep(0.01)
    finally:
        loop.stopping.set()
        thread.join(10)
        consumer.close()
        client.delete(stream, reply)
        client.close()
        test.close()


def test_the_statistics_that_count_a_batch_leave_with_its_answers(
    redis_url: str, key_prefix: str
) -> None:
    """An executed batch's answers and the statistics that count them go out in one write,
    before the instance reads again (the acknowledgements wait for that read): a client
    that reads the statistics once it has its answer finds it counted. Sent only with the
    next read, they could be missing for milliseconds while the instance is preempted."""
    client = redis.Redis.from_url(redis_url, protocol=2, socket_timeout=5)
    keys = KeySchema(key_prefix)
    start = time.time_ns()
    now = [start]
    backend = _Recorder()
    loop, consumer, stream, shard = _counted_loop(client, keys, backend, now)
    reply = f"{key_prefix}reply:g"
    try:
        client.xadd(stream, {PAYLOAD_FIELD: encode_request(_request(1, start, reply))})
        loop.step()  # reads it: the window opens
        now[0] = start + WINDOW_NS + 1
        loop.step()  # executes it and sends the answer; no read follows yet
        assert backend.batches == [["r1"]]
        deadline = time.monotonic() + 5
        while not client.llen(reply):
            assert time.monotonic() < deadline, "no answer"
            time.sleep(0.001)
        stats = asyncio.run(_read_stats(redis_url, keys))
        assert (stats["success_count"], stats["inference_count"]) == (1, 1)
        assert stats["execution_count"] == 1
        assert int(client.xpending(stream, WORKER_GROUP)["pending"]) == 1  # acked later
        consumer.flush()
        assert int(client.xpending(stream, WORKER_GROUP)["pending"]) == 0
    finally:
        consumer.close()
        client.delete(stream, reply, shard.key, shard.registry)
        client.close()


class _FlushFailsOnce:
    """A consumer whose first flush before an execution fails as a lost connection does."""

    def __init__(self, consumer: StreamConsumer) -> None:
        self._consumer = consumer
        self.failed = False

    def flush(self) -> None:
        if not self.failed:
            self.failed = True
            raise redis.exceptions.ConnectionError("connection lost (test)")
        self._consumer.flush()

    def __getattr__(self, name: str) -> object:
        return getattr(self._consumer, name)


def test_a_batch_taken_when_the_connection_drops_is_run_once_redis_answers(
    redis_url: str, key_prefix: str
) -> None:
    """The flush that sends the previous answers before a batch runs can find Redis gone
    after the batch left the batcher: its requests are not kept as held (where the read
    of this instance's pending entries would skip them), so they run after the outage."""
    client = redis.Redis.from_url(redis_url, protocol=2, socket_timeout=5)
    config = text_format.Parse(CONFIG, ModelConfig())
    layout = StreamLayout(KeySchema(key_prefix), "m", 1, scheduling_policy(config))
    stream, reply = layout.stream(0), f"{key_prefix}reply:g"
    real = StreamConsumer(client, layout.streams(), "instance-0")
    real.ensure_groups()
    consumer = _FlushFailsOnce(real)
    backend = _Recorder()
    loop = InstanceLoop(
        consumer, backend, layout, ShapeKeys(config), output_datatypes(config), None,  # type: ignore[arg-type]
        batching=True,
    )  # fmt: skip
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        client.xadd(stream, {PAYLOAD_FIELD: encode_request(_request(1, time.time_ns(), reply))})
        answer = client.blpop([reply], timeout=5)
        assert consumer.failed
        assert answer is not None, "the batch taken before the failed flush never ran"
        assert decode_response(answer[1]).request_id == "r1"
        assert backend.batches == [["r1"]]
    finally:
        loop.stopping.set()
        thread.join(10)
        real.close()
        client.delete(stream, reply)
        client.close()
