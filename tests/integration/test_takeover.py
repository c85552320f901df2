"""Connections redis-py opens and Sluice then reads itself, over the URL forms redis-py
handles: a Unix socket and a password with a database number. The gateway's
callback-read connections (``broker.takeover``) and the instance loop's
:class:`broker.direct.DirectConnection`."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from sluice.broker.codec import encode_response
from sluice.broker.direct import DirectConnection
from sluice.broker.messages import InferResponseMessage
from sluice.broker.multiplex import MultiplexedConnection
from sluice.broker.replies import ReplyRouter


@contextlib.contextmanager
def _redis_server(listen: list[str], url: str) -> Iterator[None]:
    """A redis-server with password ``s3cret`` persisting nothing, listening as ``listen``
    says, while the block runs; ``url`` reaches it (waited for up to 10 s)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    workdir = Path(tempfile.mkdtemp(prefix="sluice-test-redis-"))
    process = subprocess.Popen(
        ["redis-server", *listen, "--save", "", "--appendonly", "no", "--dir", str(workdir),
         "--requirepass", "s3cret"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis.from_url(url).ping():
                    break
            except redis.exceptions.ConnectionError:
                pass
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        yield
    finally:
        process.kill()
        process.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def unix_redis(tmp_path: Path) -> Iterator[Path]:
    """A private redis-server listening on a Unix socket only, with a password."""
    path = tmp_path / "redis.sock"
    with _redis_server(["--port", "0", "--unixsocket", str(path)], f"unix://:s3cret@{path}"):
        yield path


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


class _CountingSocket:
    """A socket that counts its ``recv`` calls (each one a wake-up of a blocked thread)."""

    def __init__(self, sock: object) -> None:
        self._sock = sock
        self.recvs = 0

    def recv(self, nbytes: int) -> bytes:
        self.recvs += 1
        return self._sock.recv(nbytes)  # type: ignore[attr-defined, no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


@pytest.fixture
def tcp_redis() -> Iterator[str]:
    """A private redis-server on a loopback TCP port, with a password; its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"redis://:s3cret@127.0.0.1:{port}/3"
    with _redis_server(["--port", str(port), "--bind", "127.0.0.1"], url):
        yield url


def test_a_blocking_read_wakes_the_reader_once(unix_redis: Path) -> None:
    """On a Unix socket, with ``last_blocks`` the replies of the commands before a blocking
    read (answered at once) do not wake the reader: it reads once, when the blocking read
    is answered. Without it, the early replies take a read of their own."""
    url = f"unix://:s3cret@{unix_redis}?db=3"
    counts = _blocking_reads(
        url, redis.Redis(unix_socket_path=str(unix_redis), password="s3cret", db=3)
    )
    assert counts[True] == 1
    assert counts[False] >= 2  # the early replies came first, in one read or two


def test_a_blocking_read_over_tcp_reads_as_replies_come(tcp_redis: str) -> None:
    """Over TCP no low-water mark is set (Linux would not wake a reader that took the
    early replies for a last reply shorter than the mark): every reply still arrives,
    and a read that times out after several early replies ends at its timeout."""
    counts = _blocking_reads(tcp_redis, redis.Redis.from_url(tcp_redis))
    assert counts[True] >= 1 and counts[False] >= 1


def _blocking_reads(url: str, writer: redis.Redis) -> dict[bool, int]:
    """Blocking reads through a DirectConnection, answered by an entry written 0.2 s later,
    with and without ``last_blocks``, after replies of several lengths; asserts every
    reply and that a timed-out read ends in time. Returns the ``recv`` calls of the
    plain case per ``last_blocks``."""
    client = redis.Redis.from_url(url, socket_timeout=5, protocol=2)
    direct = DirectConnection(client)
    counts: dict[bool, int] = {}
    try:
        assert direct.pipeline([("PING",)]) == [b"PONG"]
        counting = _CountingSocket(direct._sock)
        direct._sock = counting  # type: ignore[assignment]
        read = ("XREAD", "COUNT", 10, "BLOCK", 5000, "STREAMS", "s", "$")

        def entry_later(value: str) -> threading.Timer:
            timer = threading.Timer(0.2, lambda: writer.xadd("s", {"v": value}))
            timer.start()
            return timer

        for last_blocks in (True, False):
            counting.recvs = 0
            timer = entry_later(f"lb-{last_blocks}")
            direct.send([("RPUSH", "answers", "a"), ("EXPIRE", "answers", 60)])
            replies = direct.pipeline(
                [("XACK", "s", "g", "1-1"), ("HSET", "h", "f", 1), read], last_blocks
            )
            timer.join()
            assert replies[:2] == [0, 1 if last_blocks else 0]
            assert replies[2][0][1][0][1] == [b"v", f"lb-{last_blocks}".encode()]
            counts[last_blocks] = counting.recvs

        # longer and error replies before it: read as they come, each reply in its place
        writer.set("k", "x" * 200)
        timer = entry_later("after-long")
        replies = direct.pipeline([("GET", "k"), ("HSET", "k", "f", 1), read], True)
        timer.join()
        assert replies[0] == b"x" * 200
        assert isinstance(replies[1], redis.exceptions.ResponseError)
        assert replies[2][0][1][0][1] == [b"v", b"after-long"]

        # a read that times out (nil, the shortest reply) after several early replies
        # ends at its timeout, not at the socket's
        for _ in range(3):
            started = time.monotonic()
            direct.send([("RPUSH", "answers", "b")])
            replies = direct.pipeline(
                [("EXPIRE", "answers", 60), ("XACK", "s", "g", "1-1"),
                 ("XREAD", "BLOCK", 100, "STREAMS", "s", "$")],
                True,
            )  # fmt: skip
            assert replies == [1, 0, None]
            assert time.monotonic() - started < 2
        assert direct.pipeline([("LRANGE", "answers", 0, -1)]) == [[b"a", b"a", b"b", b"b", b"b"]]
    finally:
        direct.close()
        client.close()
        writer.close()
    return counts
