"""StreamConsumer against a real Redis: one-trip finish, raw reads, reconnects, lost scripts."""

from __future__ import annotations

import time

import pytest
import redis

from broker.codec import decode_response, encode_request
from broker.consumer import REPLY_TTL_S, StreamConsumer
from broker.keys import WORKER_GROUP
from broker.messages import InferRequestMessage, InferResponseMessage, WireTensor
from broker.producer import PAYLOAD_FIELD
from broker.stats_store import ExecutionTimes, StatsDelta, decode_stats


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


@pytest.fixture
def client(redis_url: str):
    c = redis.Redis.from_url(
        redis_url, protocol=2, socket_timeout=5, client_name="consumer-under-test"
    )
    yield c
    c.close()


def test_finish_replies_acks_and_counts_in_one_trip(client: redis.Redis, key_prefix: str) -> None:
    stream, stats = f"{key_prefix}{{m}}:q:1", f"{key_prefix}{{m}}:stats:1"
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
        counters = decode_stats(client.hgetall(stats))
        assert counters.get("success_count") == 4
        assert counters.get("success_ns") == 400
        assert counters.get("inference_count") == 4
        assert counters.get("execution_count") == 1
        assert counters.get("batch:4:count") == 1
        assert counters.get("batch:4:compute_infer_ns") == 20
        assert counters.get("last_inference_ms") == 1234
    finally:
        consumer.close()


def test_reconnects_after_kill_and_reloads_flushed_scripts(
    client: redis.Redis, key_prefix: str, redis_url: str
) -> None:
    stream, stats = f"{key_prefix}{{m}}:q:1", f"{key_prefix}{{m}}:stats:1"
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
        deliveries = consumer.read(count=1, block_ms=100)  # a new connection, transparently
        assert [d.message.request_id for d in deliveries] == ["r7"]
        client.script_flush()  # as after a Redis restart: EVALSHA answers NOSCRIPT
        delta = StatsDelta()
        delta.failure(request_ns=50, reason="OTHER")
        consumer.finish([], deliveries, stats, delta)
        assert client.xlen(stream) == 0
        assert decode_stats(client.hgetall(stats)).get("fail_reason:OTHER") == 1
    finally:
        consumer.close()


def test_deferred_finish_travels_with_the_next_read(client: redis.Redis, key_prefix: str) -> None:
    stream, stats = f"{key_prefix}{{m}}:q:1", f"{key_prefix}{{m}}:stats:1"
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
        assert client.llen(reply) == 0  # held back
        client.xadd(stream, {PAYLOAD_FIELD: encode_request(_request(2, reply))})
        second = consumer.read(count=1, block_ms=100)
        assert [d.message.request_id for d in second] == ["r2"]
        assert [decode_response(p).request_id for p in client.lrange(reply, 0, -1)] == ["r1"]
        assert client.xpending(stream, WORKER_GROUP)["pending"] == 1  # only r2 now
        consumer.finish([(reply, InferResponseMessage("r2", "m", 1))], second, defer=True)
        consumer.flush()
        assert client.llen(reply) == 2
        assert client.xlen(stream) == 0
    finally:
        consumer.close()
