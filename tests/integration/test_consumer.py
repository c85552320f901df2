"""StreamConsumer against a real Redis: one-trip finish, raw reads, reconnects, statistics."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio

from sluice.broker.codec import decode_response, encode_request
from sluice.broker.consumer import REPLY_TTL_S, StreamConsumer
from sluice.broker.keys import WORKER_GROUP, KeySchema
from sluice.broker.messages import InferRequestMessage, InferResponseMessage, WireTensor
from sluice.broker.producer import PAYLOAD_FIELD
from sluice.broker.stats_store import (
    ExecutionTimes,
    StatsDelta,
    StatsShard,
    decode_stats,
    fold_stats_shards,
    read_stats,
)


def _request(n: int, reply_to: str) -> InferRequestMessage:
    now = time.time_ns()
    return InferRequestMessage(
        request_id=f"r{n}",
        client_id="",
        model="m",
        version=1,
        inputs=(WireTensor("INPUT0", "INT32", (1, 1), n.to_bytes(4, "little")),),
        outputs=(),
        parameters={},
        reply_to=reply_to,
        deadline_ns=now + 10**10,
        enqueued_ns=now,
    )


def _shard(key_prefix: str) -> StatsShard:
    keys = KeySchema(key_prefix)
    return StatsShard(keys.stats_shard("m", 1, "instance-0"), keys.stats_shards("m", 1))


@pytest.fixture
def client(redis_url: str):
    c = redis.Redis.from_url(
        redis_url, protocol=2, socket_timeout=5, client_name="consumer-under-test"
    )
    yield c
    c.close()


def test_finish_replies_acks_and_counts_in_one_trip(client: redis.Redis, key_prefix: str) -> None:
    stream, stats = f"{key_prefix}{{m}}:q:1", _shard(key_prefix)
    gateways = [f"{key_prefix}reply:a", f"{key_prefix}reply:b"]
    consumer = StreamConsumer(client, [stream], "instance-0")
    try:
        consumer.ensure_groups()
        for n in range(4):
            client.xadd(stream, {PAYLOAD_FIELD: encode_request(_request(n, gateways[n % 2]))})
        deliveries = consumer.read(count=10, block_ms=100)
        assert [d.message.request_id for d in deliveries] == ["r0", "r1", "r2", "r3"]
        assert [d.message.inputs[0].data for d in deliveries] == [
            n.to_bytes(4, "little") for n in range(4)
        ]
        delta = StatsDelta()
        delta.execution(4, ExecutionTimes(10, 20, 30))
        delta.successes(
            count=len(deliveries), inferences=len(deliveries), request_ns=100 * len(deliveries),
            queue_ns=5 * len(deliveries), times=ExecutionTimes(10, 20, 30), now_ms=1234,
        )  # fmt: skip
        consumer.finish(
            [
                (d.message.reply_to, InferResponseMessage(d.message.request_id, "m", 1))
                for d in deliveries
            ],
            deliveries,
            stats,
            delta,
        )
        assert [decode_response(p).request_id for p in client.lrange(gateways[0], 0, -1)] == [
            "r0",
            "r2",
        ]
        assert [decode_response(p).request_id for p in client.lrange(gateways[1], 0, -1)] == [
            "r1",
            "r3",
        ]
        assert 0 < client.ttl(gateways[0]) <= REPLY_TTL_S
        assert client.xlen(stream) == 0
        assert client.xpending(stream, WORKER_GROUP)["pending"] == 0
        counters = decode_stats(client.hgetall(stats.key))
        assert counters.get("success_count") == 4
        assert counters.get("success_ns") == 400
        assert counters.get("inference_count") == 4
        assert counters.get("execution_count") == 1
        assert counters.get("batch:4:count") == 1
        assert counters.get("batch:4:compute_infer_ns") == 20
        assert counters.get("last_inference_ms") == 1234
        assert client.smembers(stats.registry) == {stats.key.encode()}
        # the next batch writes totals of the fields it changed
        client.xadd(stream, {PAYLOAD_FIELD: encode_request(_request(9, gateways[0]))})
        more = consumer.read(count=10, block_ms=100)
        delta = StatsDelta()
        delta.failure(request_ns=70, reason="BACKEND")
        consumer.finish([], more, stats, delta)
        counters = decode_stats(client.hgetall(stats.key))
        assert counters.get("success_count") == 4
        assert counters.get("fail_count") == 1
        assert counters.get("fail_ns") == 70
        assert counters.get("fail_reason:BACKEND") == 1
    finally:
        consumer.close()


def test_reconnects_after_kill(client: redis.Redis, key_prefix: str, redis_url: str) -> None:
    stream, stats = f"{key_prefix}{{m}}:q:1", _shard(key_prefix)
    consumer = StreamConsumer(client, [stream], "instance-0")
    try:
        consumer.ensure_groups()
        assert consumer.read(count=1, block_ms=None) == []
        # a connection of its own: sharing the client's pool, it could kill the very
        # connection it sends the next CLIENT KILL on (a reset, now and then)
        admin = redis.Redis.from_url(redis_url, protocol=2, socket_timeout=5)
        ids = [c["id"] for c in admin.client_list() if c.get("name") == "consumer-under-test"]
        assert len(ids) >= 2  # the client's own connection and the consumer's direct one
        for client_id in ids:
            admin.client_kill_filter(_id=client_id)
        admin.close()
        client.xadd(stream, {PAYLOAD_FIELD: encode_request(_request(7, f"{key_prefix}reply"))})
        # the lost connection is reported, not retried behind the caller's back (a read
        # whose reply was lost may have delivered entries: the caller reads them again)
        with pytest.raises(redis.exceptions.ConnectionError):
            consumer.read(count=1, block_ms=100)
        deliveries = consumer.read(count=1, block_ms=100)  # a new connection
        assert [d.message.request_id for d in deliveries] == ["r7"]
        delta = StatsDelta()
        delta.failure(request_ns=50, reason="OTHER")
        consumer.finish([], deliveries, stats, delta)
        assert client.xlen(stream) == 0
        assert decode_stats(client.hgetall(stats.key)).get("fail_reason:OTHER") == 1
    finally:
        consumer.close()


def _wait_length(client: redis.Redis, key: str, length: int, timeout_s: float = 2.0) -> int:
    """The list's length once it is ``length`` (another connection's write is served in
    Redis's own order), or what it is at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (found := client.llen(key)) != length and time.monotonic() < deadline:
        time.sleep(0.005)
    return found


def test_deferred_finish_travels_with_the_next_read(client: redis.Redis, key_prefix: str) -> None:
    """The answers leave at once, without waiting for Redis's reply; the acknowledgements
    and statistics wait for the next read (one write and one round trip per batch)."""
    stream, stats = f"{key_prefix}{{m}}:q:1", _shard(key_prefix)
    reply = f"{key_prefix}reply:a"
    consumer = StreamConsumer(client, [stream], "instance-0")
    try:
        consumer.ensure_groups()
        client.xadd(stream, {PAYLOAD_FIELD: encode_request(_request(1, reply))})
        first = consumer.read(count=1, block_ms=100)
        delta = StatsDelta()
        delta.failure(request_ns=1, reason="OTHER")
        consumer.finish(
            [(reply, InferResponseMessage("r1", "m", 1))], first, stats, delta, defer=True
        )
        assert _wait_length(client, reply, 1) == 1  # the answer is out
        assert client.xpending(stream, WORKER_GROUP)["pending"] == 1  # not acknowledged yet
        assert not client.exists(stats.key)  # nor counted
        client.xadd(stream, {PAYLOAD_FIELD: encode_request(_request(2, reply))})
        second = consumer.read(count=1, block_ms=100)
        assert [d.message.request_id for d in second] == ["r2"]
        assert [decode_response(p).request_id for p in client.lrange(reply, 0, -1)] == ["r1"]
        assert client.xpending(stream, WORKER_GROUP)["pending"] == 1  # only r2 now
        assert decode_stats(client.hgetall(stats.key)).get("fail_reason:OTHER") == 1
        consumer.finish([(reply, InferResponseMessage("r2", "m", 1))], second, defer=True)
        consumer.flush()
        assert client.llen(reply) == 2
        assert client.xlen(stream) == 0
    finally:
        consumer.close()


def test_answers_sent_ahead_are_sent_again_after_a_lost_connection(
    client: redis.Redis, key_prefix: str, redis_url: str
) -> None:
    """An answer written without waiting for Redis's reply is kept until a round trip
    succeeds: a connection lost in between sends it again with the acknowledgements (a
    duplicate, which the gateway drops, rather than an answer that may be lost)."""
    stream = f"{key_prefix}{{m}}:q:1"
    reply = f"{key_prefix}reply:a"
    consumer = StreamConsumer(client, [stream], "instance-0")
    try:
        consumer.ensure_groups()
        client.xadd(stream, {PAYLOAD_FIELD: encode_request(_request(1, reply))})
        first = consumer.read(count=1, block_ms=100)
        consumer.finish([(reply, InferResponseMessage("r1", "m", 1))], first, defer=True)
        assert _wait_length(client, reply, 1) == 1
        admin = redis.Redis.from_url(redis_url, protocol=2, socket_timeout=5)
        for c in admin.client_list():
            if c.get("name") == "consumer-under-test":
                admin.client_kill_filter(_id=c["id"])
        admin.close()
        with pytest.raises(redis.exceptions.ConnectionError):
            consumer.read(count=1, block_ms=100)
        assert consumer.read(count=1, block_ms=None) == []  # a new connection: resent
        answers = [decode_response(p).request_id for p in client.lrange(reply, 0, -1)]
        assert answers == ["r1", "r1"]
        assert client.xlen(stream) == 0 and client.xpending(stream, WORKER_GROUP)["pending"] == 0
    finally:
        consumer.close()


def test_statistics_are_totals_sent_twice_without_harm_and_rewritten_whole(
    client: redis.Redis, key_prefix: str
) -> None:
    stream, stats = f"{key_prefix}{{m}}:q:1", _shard(key_prefix)
    reply = f"{key_prefix}reply:a"
    consumer = StreamConsumer(client, [stream], "instance-0")
    try:
        consumer.ensure_groups()
        for n in range(2):
            client.xadd(stream, {PAYLOAD_FIELD: encode_request(_request(n, reply))})
            taken = consumer.read(count=1, block_ms=100)
            delta = StatsDelta()
            delta.execution(1, ExecutionTimes(1, 2, 3))
            delta.successes(
                count=1, inferences=1, request_ns=10, queue_ns=1,
                times=ExecutionTimes(1, 2, 3), now_ms=1000 + n,
            )  # fmt: skip
            consumer.finish([], taken, stats, delta)
        # a pipeline retried after a lost connection runs its HSET again: no change
        again = StatsDelta()
        again.execution(1, ExecutionTimes(1, 2, 3))
        for command in stats.apply(again):
            client.execute_command(*command)
            client.execute_command(*command)
        counters = decode_stats(client.hgetall(stats.key))
        assert counters.get("execution_count") == 3
        assert counters.get("batch:1:count") == 3
        assert counters.get("success_count") == 2
        assert counters.get("last_inference_ms") == 1001
        # Redis lost its data: after the loop marks the shard unregistered, the next
        # execution writes every total and lists the shard again
        client.delete(stats.key, stats.registry)
        stats.registered = False
        delta = StatsDelta()
        delta.failure(request_ns=5, reason="OTHER")
        consumer.finish([], [], stats, delta)
        counters = decode_stats(client.hgetall(stats.key))
        assert counters.get("execution_count") == 3
        assert counters.get("success_count") == 2
        assert counters.get("fail_count") == 1
        assert counters.get("last_inference_ms") == 1001
        assert client.smembers(stats.registry) == {stats.key.encode()}
    finally:
        consumer.close()


def test_a_folded_shard_moves_into_the_version_hash_once(
    client: redis.Redis, key_prefix: str, redis_url: str
) -> None:
    keys = KeySchema(key_prefix)
    base = keys.stats("m", 1)
    client.hset(base, mapping={"fail_count": 2, "last_inference_ms": 900})
    shard = _shard(key_prefix)
    delta = StatsDelta()
    delta.failure(request_ns=4, reason="OTHER")
    delta.last_inference_ms = 800  # older than the gateway's: the later one stays
    for command in shard.apply(delta):
        client.execute_command(*command)

    async def totals() -> dict[str, int]:
        reader = redis.asyncio.Redis.from_url(redis_url, protocol=2)
        try:
            (stats,) = await read_stats(reader, keys, [("m", 1)])
        finally:
            await reader.aclose()
        return stats.counters

    expected = {"fail_count": 3, "fail_ns": 4, "fail_reason:OTHER": 1, "last_inference_ms": 900}
    assert asyncio.run(totals()) == expected
    client.script_flush()  # as after a Redis restart: the reading script is sent whole
    assert asyncio.run(totals()) == expected
    for _ in range(2):  # the supervisor may fold what the instance folded at its exit
        fold_stats_shards(client, keys, "m", 1, ["instance-0"])
        assert asyncio.run(totals()) == expected
    assert client.exists(shard.key) == 0
    assert client.smembers(shard.registry) == set()
    client.delete(base)
