"""MultiplexedConnection against a real Redis: ordering, isolation, loss and silence."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.exceptions

from sluice.broker.multiplex import MultiplexedConnection
from sluice.broker.scripts import Script


async def test_concurrent_calls_get_their_own_replies(connection: MultiplexedConnection) -> None:
    values = [f"value-{i}".encode() for i in range(300)]
    replies = await asyncio.gather(*(connection.call("ECHO", v) for v in values))
    assert replies == values


async def test_a_long_loop_iteration_sends_its_commands_as_it_goes(
    connection: MultiplexedConnection, redis_url: str, key_prefix: str
) -> None:
    """Commands queued over more than ``FLUSH_AFTER_NS`` of one loop iteration leave
    without waiting for the iteration's end (a gateway parsing a burst of requests must
    not hold back their ``XADD`` while instances idle); every reply still reaches its
    own caller, in order."""
    key = f"{key_prefix}burst"
    await connection.call("PING")  # connected, reader running
    observer = redis.Redis.from_url(redis_url)
    futures = [connection.call("RPUSH", key, "a")]  # no await until the end: one iteration
    time.sleep(0.0003)
    futures.append(connection.call("RPUSH", key, "b"))  # the oldest waited > 200 µs: sent
    futures.append(connection.call("RPUSH", key, "c"))  # waits for the iteration's end
    deadline = time.monotonic() + 2
    while observer.llen(key) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.05)
    assert observer.lrange(key, 0, -1) == [b"a", b"b"]
    assert await asyncio.gather(*futures) == [1, 2, 3]
    assert observer.lrange(key, 0, -1) == [b"a", b"b", b"c"]
    observer.close()


async def test_error_reply_fails_only_its_own_call(
    connection: MultiplexedConnection, key_prefix: str
) -> None:
    key = f"{key_prefix}counter"
    good1 = connection.call("INCR", key)
    bad = connection.call("HGET", key, "field")  # a string key: WRONGTYPE
    good2 = connection.call("INCR", key)
    assert await good1 == 1
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        await bad
    assert await good2 == 2


async def test_killed_connection_fails_waiters_then_reconnects(
    connection: MultiplexedConnection, redis_url: str, key_prefix: str
) -> None:
    await connection.call("CLIENT", "SETNAME", "mux-under-test")
    blocked = connection.call("BLPOP", f"{key_prefix}never", 10)
    await asyncio.sleep(0.2)
    admin = redis.Redis.from_url(redis_url)
    try:
        killed = 0
        for client in admin.client_list():
            if client.get("name") == "mux-under-test":
                admin.client_kill_filter(_id=client["id"])
                killed += 1
        assert killed == 1
    finally:
        admin.close()
    started = time.monotonic()
    with pytest.raises(redis.exceptions.ConnectionError, match="sent before the connection"):
        await asyncio.wait_for(blocked, 5)
    assert time.monotonic() - started < 5
    assert await connection.call("ECHO", b"after") == b"after"


async def test_silent_redis_times_out(redis_url: str, key_prefix: str) -> None:
    conn = MultiplexedConnection(redis_url, timeout_s=0.5)
    await conn.start()
    try:
        started = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            await asyncio.wait_for(conn.call("BLPOP", f"{key_prefix}never", 0), 10)
        assert time.monotonic() - started < 3
        assert await conn.call("ECHO", b"again") == b"again"
    finally:
        await conn.stop()


async def test_unknown_script_is_loaded_then_run(
    connection: MultiplexedConnection, key_prefix: str
) -> None:
    script = Script(f"-- {key_prefix}\nreturn redis.call('INCRBY', KEYS[1], ARGV[1])")
    assert await connection.script(script, [f"{key_prefix}n"], [5]) == 5
    assert await connection.script(script, [f"{key_prefix}n"], [5]) == 10


async def test_call_before_start_fails_at_once(redis_url: str) -> None:
    conn = MultiplexedConnection(redis_url, timeout_s=1.0)
    with pytest.raises(redis.exceptions.ConnectionError, match="not started"):
        await conn.call("PING")


async def test_kept_scripts_are_loaded_before_the_first_command(
    redis_url: str, key_prefix: str
) -> None:
    """``keep_loaded``: the scripts reach Redis ahead of everything else on a new
    connection, and at once on an open one, so an ``EVALSHA`` never meets ``NOSCRIPT``
    (and is never overtaken by a later command while it is loaded and sent again)."""
    first = Script(f"-- kept before connecting {key_prefix}\nreturn 1")
    later = Script(f"-- kept while connected {key_prefix}\nreturn 2")
    admin = redis.Redis.from_url(redis_url)
    conn = MultiplexedConnection(redis_url, timeout_s=5.0)
    await conn.start()
    try:
        conn.keep_loaded(first)
        assert admin.script_exists(first.sha) == [False]
        assert await conn.call(*first.command([], [])) == 1  # EVALSHA, first command
        conn.keep_loaded(later)
        assert await conn.call(*later.command([], [])) == 2
        assert admin.script_exists(first.sha, later.sha) == [True, True]
    finally:
        await conn.stop()
        admin.close()
