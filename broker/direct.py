"""A dedicated Redis connection for one thread's hot path (the instance loop).

redis-py's client methods check a connection out of the pool, wrap each call in
retries and events and parse replies into dicts; on the worker's per-batch path
that costs more CPU than the round trip itself. :class:`DirectConnection` lets
redis-py open the connection (TCP, Unix socket or TLS, ``AUTH``, ``SELECT``), then
writes a whole pipeline packed by :func:`broker.resp.pack_pipeline` with one
``sendall`` and parses the replies with its own hiredis reader, reading the socket
only when the reader needs more bytes (redis-py's ``read_response`` per reply costs
more CPU per round trip than parsing the whole reply buffer at once).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from typing import Any

import hiredis
import redis
import redis.exceptions

from sluice.broker.resp import pack_pipeline
from sluice.broker.takeover import reply_parser

Command = Sequence[object]

#: most bytes taken off the socket per ``recv``.
_RECV_BYTES = 65536
#: fewest bytes of one RESP2 reply (``:0\r\n``; Redis sends no empty status reply).
MIN_REPLY_BYTES = 4


class DirectConnection:
    """One connection of the client's pool, held by one thread.

    A lost connection raises and is opened again by the next pipeline; it is not retried
    here: a command whose reply was lost may have run, and only the caller knows what
    that means (an ``XREADGROUP`` may have delivered entries to this consumer that
    nobody will see: the instance loop reads its consumer's pending entries again,
    ``InstanceLoop._resume``). The instance loop sends plain commands only, no
    scripts. Reads and writes wait at most the client's ``socket_timeout``.

    Args:
        client: the process's synchronous client (its URL and timeouts are used).
    """

    def __init__(self, client: redis.Redis) -> None:
        self._conn = client.connection_pool.make_connection()
        self._sock: socket.socket | None = None
        self._reader: hiredis.Reader = reply_parser()
        #: replies of commands sent by :meth:`send` and not read yet.
        self._owed = 0
        #: the socket's ``SO_RCVLOWAT`` (bytes).
        self._lowat = 1
        #: the connection is a Unix socket (where a low-water mark is safe: see pipeline).
        self._unix = False

    def send(self, commands: Sequence[Command]) -> None:
        """Send ``commands`` in one write without waiting for their replies: the next
        :meth:`pipeline` reads them first (and raises the first error reply among them).

        Raises:
            redis.exceptions.ConnectionError, redis.exceptions.TimeoutError: as
                :meth:`pipeline`; the commands may have run.
        """
        sock = self._sock or self._open()
        try:
            sock.sendall(pack_pipeline(commands))
        except OSError as exc:
            raise self._lost(exc) from exc
        self._owed += len(commands)

    def pipeline(
        self, commands: Sequence[Command], last_blocks: bool = False, keep_owed: bool = False
    ) -> list[Any]:
        """Send ``commands`` in one write and read their replies in order.

        With ``last_blocks`` (the last command is a blocking read, answered only when an
        entry arrives or its timeout passes) on a Unix socket, the socket's receive
        low-water mark (``SO_RCVLOWAT``) is set to one byte more than the shortest replies
        of the commands before it (:data:`MIN_REPLY_BYTES` each) could take, so those
        replies, answered at once, do not wake the thread on their own: it wakes once,
        when the blocking read is answered (the shortest answer, a timeout's nil, has 5
        bytes). Longer replies wake it early; it then reads on as they come. One wake-up
        instead of two per batch lowers the instance's CPU per request. Not on TCP:
        Linux wakes a TCP reader only when the bytes it has not taken yet reach the mark,
        so a reader that took the early replies would sleep through a short last reply
        until the socket timeout.

        With ``keep_owed`` the replies of the commands sent by :meth:`send` come first in
        the list, error replies among them returned, not raised (a Redis Cluster's
        redirections are followed by the caller, ``broker.cluster_direct``).

        Returns:
            One raw reply per command (RESP2, bytes); an error reply is returned as the
            ``ResponseError`` redis-py would raise for it, not raised.

        Raises:
            redis.exceptions.ConnectionError, redis.exceptions.TimeoutError: the
                connection was lost (the commands may have run), Redis is unreachable or
                does not answer within the socket timeout, or it answers with an error
                redis-py counts as a connection error (``LOADING`` after a restart:
                ``BusyLoadingError``). The connection is closed; the next call opens one.
        """
        sock = self._sock or self._open()
        reader = self._reader
        try:
            sock.sendall(pack_pipeline(commands))
            replies: list[Any] = []
            owed = self._owed
            wanted = owed + len(commands)
            lowat = MIN_REPLY_BYTES * (wanted - 1) + 1 if last_blocks and self._unix else 1
            if lowat != self._lowat:
                self._set_lowat(lowat)
            woken = False
            while len(replies) < wanted:
                reply = reader.gets()
                if reply is False:
                    if woken and self._lowat != 1:
                        self._set_lowat(1)  # woken early (longer replies): read as they come
                    data = sock.recv(_RECV_BYTES)
                    woken = True
                    if not data:
                        raise redis.exceptions.ConnectionError("Redis closed the connection")
                    reader.feed(data)
                else:
                    replies.append(reply)
        except (OSError, hiredis.ProtocolError) as exc:
            raise self._lost(exc) from exc
        except redis.exceptions.ConnectionError:
            self.close()
            raise
        self._owed = 0
        for reply in replies:
            if isinstance(reply, redis.exceptions.ConnectionError):
                self.close()
                raise reply
        if keep_owed:
            return replies
        for reply in replies[:owed]:
            if isinstance(reply, redis.exceptions.ResponseError):
                raise reply
        return replies[owed:] if owed else replies

    def _set_lowat(self, nbytes: int) -> None:
        sock = self._sock
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
        self._lowat = nbytes

    def _lost(self, exc: BaseException) -> redis.exceptions.RedisError:
        """Close the connection after a failed read or write; redis-py's error for it
        (``TimeoutError`` for a socket timeout, else ``ConnectionError``)."""
        self.close()
        if isinstance(exc, (TimeoutError, BlockingIOError)):  # SO_RCVTIMEO / SO_SNDTIMEO
            return redis.exceptions.TimeoutError(f"Redis did not answer in time: {exc}")
        if isinstance(exc, hiredis.ProtocolError):
            return redis.exceptions.ConnectionError(f"protocol error: {exc}")
        return redis.exceptions.ConnectionError(f"Redis connection lost: {exc}")

    def _open(self) -> socket.socket:
        """Connect through redis-py (handshake included) and take its socket.

        Raises:
            redis.exceptions.ConnectionError, redis.exceptions.TimeoutError: as redis-py.
        """
        conn = self._conn
        conn.connect()
        sock = getattr(conn, "_sock", None)
        if not isinstance(sock, socket.socket):
            conn.disconnect()
            raise redis.exceptions.ConnectionError(
                f"redis-py {redis.__version__} keeps no socket on its connection; "
                "Sluice's instance loop needs redis-py's Connection._sock (redis>=5)"
            )
        # Blocking mode with kernel timeouts: Python's own timeout polls before each recv,
        # and poll ignores SO_RCVLOWAT on a Unix socket; a blocking recv honours it.
        timeout = sock.gettimeout()
        sock.settimeout(None)
        if timeout:
            whole = int(timeout)
            value = struct.pack("ll", whole, int((timeout - whole) * 1e6))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        self._sock = sock
        self._lowat = 1
        self._unix = sock.family == socket.AF_UNIX
        self._reader = reply_parser()
        return sock

    def close(self) -> None:
        """Close the connection (idempotent); the next pipeline opens a new one."""
        self._sock = None
        self._owed = 0
        self._conn.disconnect()
