"""The hot-path connections on a real Redis Cluster (3 primaries, 3 replicas, started
here): routing by slot, replies in order, ``ASK`` during a migration, ``MOVED`` after it,
and a failover (``broker.cluster_direct``, ``broker.cluster_multiplex``)."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Iterator

import pytest
import redis
from cluster_support import (
    Cluster,
    failover,
    model_slot,
    start_cluster,
    stop_cluster,
)

from sluice.broker.cluster import slot_of, sync_client
from sluice.broker.cluster_direct import ClusterDirectConnection
from sluice.broker.cluster_multiplex import ClusterMultiplexedConnection

#: hash tags on the three primaries of a fresh cluster (slots 3313, 6621, 12149)
TAGS = ("add_sub_a", "add_sub", "digits")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server and redis-cli are needed for a Redis Cluster")
    running = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield running
    stop_cluster(running)


@pytest.fixture
def client(cluster: Cluster) -> Iterator[redis.Redis]:
    made = sync_client(cluster.url, protocol=2, socket_timeout=10)
    yield made
    made.close()


def _key(tag: str, name: str) -> str:
    return f"t-{uuid.uuid4().hex[:6]}:{{{tag}}}:{name}"


def _start_migration(cluster: Cluster, slot: int) -> tuple[int, int]:
    """Mark ``slot`` MIGRATING on its primary and IMPORTING on another; (source, target)."""
    source = cluster.slot_owner(slot)
    target = next(p for p in cluster.primaries() if p != source)
    cluster.node(target).execute_command(
        "CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(source)
    )
    cluster.node(source).execute_command(
        "CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(target)
    )
    return source, target


def _finish_migration(cluster: Cluster, slot: int, target: int) -> None:
    for port in cluster.primaries():
        cluster.node(port).execute_command(
            "CLUSTER", "SETSLOT", slot, "NODE", cluster.node_id(target)
        )


def test_direct_pipeline_spans_primaries_in_order(cluster: Cluster, client: redis.Redis) -> None:
    keys = [_key(tag, "k") for tag in TAGS]
    assert len({cluster.slot_owner(slot_of(k)) for k in keys}) == 3
    direct = ClusterDirectConnection(client)
    try:
        sets = [("SET", k, f"v{i}") for i, k in enumerate(keys)]
        gets = [("GET", k) for k in reversed(keys)]
        assert direct.pipeline([*sets, *gets]) == [b"OK"] * 3 + [b"v2", b"v1", b"v0"]
        direct.send([("RPUSH", keys[0] + ":l", "a"), ("RPUSH", keys[2] + ":l", "b", "c")])
        assert direct.pipeline([("LLEN", keys[2] + ":l")], keep_owed=True) == [1, 2, 2]
        stream = keys[1] + ":q"
        direct.pipeline([("XGROUP", "CREATE", stream, "g", "0", "MKSTREAM")])
        client.xadd(stream, {"m": b"x"})
        read = ("XREADGROUP", "GROUP", "g", "c", "COUNT", 5, "BLOCK", 500, "STREAMS", stream, ">")
        replies = direct.pipeline([("INCR", keys[0] + ":n"), read], last_blocks=True)
        assert replies[0] == 1
        assert replies[1][0][0] == stream.encode() and replies[1][0][1][0][1] == [b"m", b"x"]
    finally:
        direct.close()


def test_direct_follows_ask_during_a_migration_and_moved_after(
    cluster: Cluster, client: redis.Redis
) -> None:
    tag = "mig-direct"
    slot = model_slot(tag)
    key, absent = _key(tag, "moved"), _key(tag, "new")
    client.set(key, "before")
    direct = ClusterDirectConnection(client)
    try:
        assert direct.pipeline([("GET", key)]) == [b"before"]
        source, target = _start_migration(cluster, slot)
        cluster.node(source).execute_command(
            "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", key
        )
        # the key is on the importing node now: ASK; a new key goes there too
        assert direct.pipeline([("GET", key), ("SET", absent, "x"), ("GET", absent)]) == [
            b"before", b"OK", b"x"
        ]  # fmt: skip
        _finish_migration(cluster, slot, target)
        assert direct.pipeline([("GET", key)]) == [b"before"]  # MOVED, then the new node
        assert cluster.slot_owner(slot) == target
    finally:
        direct.close()


def test_multiplexed_follows_ask_moved_and_a_failover(cluster: Cluster) -> None:
    tag = "mig-multiplex"
    slot = model_slot(tag)
    key, later = _key(tag, "moved"), _key(tag, "later")

    async def scenario() -> None:
        connection = ClusterMultiplexedConnection(cluster.url, 10.0)
        await connection.start()
        try:
            assert await connection.call("SET", key, "v") == b"OK"
            source, target = _start_migration(cluster, slot)
            cluster.node(source).execute_command(
                "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", key
            )
            assert await connection.run_all([("GET", key), ("SET", later, "w")]) == [b"v", b"OK"]
            _finish_migration(cluster, slot, target)
            assert await connection.call("GET", later) == b"w"
            promoted = await asyncio.to_thread(failover, cluster, target)
            assert cluster.slot_owner(slot) == promoted
            assert await connection.run_all([("GET", key), ("GET", later)]) == [b"v", b"w"]
        finally:
            await connection.stop()

    asyncio.run(scenario())
