"""Reading a Redis connection in a transport callback after redis-py opened it.

redis-py's asyncio connection does what a URL asks when it connects (TCP, Unix
socket or TLS, ``AUTH``, ``SELECT``, ``CLIENT SETNAME``), then reads through an
``asyncio.StreamReader`` and a task per reply. On a gateway's hot connections that
task wake-up per reply cost more CPU than parsing the reply, so once connected the
transport is handed to a :class:`RedisProtocol`, which parses with hiredis in
``data_received``.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

import hiredis
import redis
import redis.asyncio
import redis.exceptions
from redis._parsers.base import BaseParser


class RedisProtocol(asyncio.Protocol):
    """A protocol that takes over a connection redis-py opened (:func:`open_with`)."""

    #: the ``asyncio.StreamWriter`` redis-py opened the connection with: held while the
    #: protocol is, because a collected stream writer closes its transport
    stream_writer: object = None


P = TypeVar("P", bound=RedisProtocol)


def reply_parser() -> hiredis.Reader:
    """A hiredis reader that returns each error reply as the exception redis-py raises
    for it (redis-py's own mapping: ``NOSCRIPT`` -> ``NoScriptError``, ``LOADING`` ->
    ``BusyLoadingError``, a ``ConnectionError``, ...), as an object, not raised."""
    return hiredis.Reader(replyError=BaseParser.parse_error)


async def open_with(
    pool: redis.asyncio.ConnectionPool, protocol: P, timeout_s: float
) -> asyncio.Transport:
    """Open a connection of ``pool`` (redis-py does the handshake) and make ``protocol``
    its protocol (``connection_made`` is called with the transport).

    Args:
        pool: the pool whose URL and options the connection takes.
        protocol: receives the connection's data from now on.
        timeout_s: longest wait for the connection and its handshake, in s.

    Raises:
        redis.exceptions.RedisError, OSError: Redis refused or could not be reached
            (or this redis-py keeps its streams elsewhere: ``ConnectionError`` saying so).
        TimeoutError: no connection within ``timeout_s``.
    """
    conn = pool.make_connection()
    async with asyncio.timeout(timeout_s):
        await conn.connect()
    writer = getattr(conn, "_writer", None)
    if not isinstance(writer, asyncio.StreamWriter):  # redis-py >= 4.2 keeps its streams here
        await conn.disconnect()
        raise redis.exceptions.ConnectionError(
            f"redis-py {redis.__version__} keeps no asyncio stream writer on its connection; "
            "Sluice's gateway needs redis-py's asyncio Connection._writer (redis>=5)"
        )
    conn._reader = conn._writer = None  # redis-py's Connection no longer owns it
    transport: asyncio.Transport = writer.transport  # type: ignore[union-attr]
    protocol.stream_writer = writer
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    return transport
