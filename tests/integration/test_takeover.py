"""Connections redis-py opens and Sluice then reads itself, over the URL forms redis-py
handles: a Unix socket and a password with a database number. The gateway's
callback-read connections (``broker.takeover``) and the instance loop's
:class:`broker.direct.DirectConnection`."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker.codec import encode_response
from broker.direct import DirectConnection
from broker.messages import InferResponseMessage
from broker.multiplex import MultiplexedConnection
from broker.replies import ReplyRouter


@pytest.fixture
def unix_redis() -> Iterator[Path]:
    """A private redis-server listening on a Unix socket only, with a password."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    workdir = Path(tempfile.mkdtemp(prefix="sluice-unix-redis-"))
    socket = workdir / "redis.sock"
    process = subprocess.Popen(
        ["redis-server", "--port", "0", "--unixsocket", str(socket), "--save", "",
         "--appendonly", "no", "--dir", str(workdir), "--requirepass", "s3cret"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis(unix_socket_path=str(socket), password="s3cret").ping():
                    break
            except redis.exceptions.ConnectionError:
                pass
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        yield socket
    finally:
        process.kill()
        process.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


async def test_commands_and_answers_travel_over_a_unix_socket_with_auth_and_db(
    unix_redis: Path,
) -> None:
    url = f"unix://:s3cret@{unix_redis}?db=3"
    connection = MultiplexedConnection(url, timeout_s=5.0)
    router = ReplyRouter(url, "reply:gw")
    await connection.start()
    await router.start()
    try:
        futures = [router.expect(f"r{i}", time.time_ns() + 10**10) for i in range(20)]
        await asyncio.gather(
            *(
                connection.call(
                    "RPUSH", "reply:gw", encode_response(InferResponseMessage(f"r{i}", "m", 1))
                )
                for i in range(20)
            )
        )
        answers = await asyncio.wait_for(asyncio.gather(*futures), 5)
        assert [a.request_id for a in answers] == [f"r{i}" for i in range(20)]
        assert await connection.call("SET", "where", "db3") == b"OK"
    finally:
        await router.stop()
        await connection.stop()
    check = redis.Redis(unix_socket_path=str(unix_redis), password="s3cret", db=3)
    assert check.get("where") == b"db3"  # the URL's database was selected
    assert redis.Redis(unix_socket_path=str(unix_redis), password="s3cret").get("where") is None


def test_direct_connection_pipelines_reopens_and_bounds_its_waits(unix_redis: Path) -> None:
    """One write per pipeline, replies in order, an error reply returned (not raised);
    a connection killed by Redis raises once, then is opened again (handshake included;
    no silent retry, which would hide a read whose entries were delivered); a reply that does
    not come within the socket timeout raises redis-py's TimeoutError, and the next
    pipeline works."""
    url = f"unix://:s3cret@{unix_redis}?db=3"
    client = redis.Redis.from_url(url, socket_timeout=0.3)
    direct = DirectConnection(client)
    try:
        replies = direct.pipeline(
            [("SET", "k", "v"), ("HSET", "k", "f", 1), ("GET", "k"), ("RPUSH", "l", *range(300))]
        )
        assert replies[0] == b"OK"
        assert isinstance(replies[1], redis.exceptions.ResponseError)
        assert "WRONGTYPE" in str(replies[1])
        assert replies[2:] == [b"v", 300]
        big = direct.pipeline([("LRANGE", "l", 0, -1)] * 50)  # replies span many reads
        assert all(r == [str(i).encode() for i in range(300)] for r in big)

        killer = redis.Redis(unix_socket_path=str(unix_redis), password="s3cret")
        assert killer.client_kill_filter(_type="normal", skipme=True) >= 1
        with pytest.raises(redis.exceptions.ConnectionError):
            direct.pipeline([("GET", "k")])  # not retried: the caller decides what ran
        assert direct.pipeline([("GET", "k")]) == [b"v"]  # opened again, db 3 selected

        with pytest.raises(redis.exceptions.TimeoutError):
            direct.pipeline([("BLPOP", "empty", 2)])
        assert direct.pipeline([("GET", "k")]) == [b"v"]

        # sent ahead: the next pipeline reads those replies first and returns its own
        direct.send([("RPUSH", "ahead", "a"), ("RPUSH", "ahead", "b")])
        assert direct.pipeline([("LRANGE", "ahead", 0, -1)]) == [[b"a", b"b"]]
        direct.send([("HSET", "k", "f", 1)])  # an error reply among them is raised
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            direct.pipeline([("GET", "k")])
        assert direct.pipeline([("GET", "k")]) == [b"v"]  # nothing left owed
    finally:
        direct.close()
        client.close()
