"""A dedicated Redis connection for one thread's hot path (the instance loop).

redis-py's client methods check a connection out of the pool, wrap each call in
retries and events and parse replies into dicts; on the worker's per-batch path
that costs more CPU than the round trip itself. :class:`DirectConnection` keeps
redis-py's connection and hiredis parser, packs with :func:`broker.resp.pack_pipeline`
and skips the rest: it owns one connection, sends a command or a whole pipeline in
one write and returns the raw replies (RESP2, bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
import redis.exceptions

from broker.resp import pack_pipeline

Command = Sequence[object]


class DirectConnection:
    """One connection of the client's pool, held by one thread.

    A lost connection is re-opened once per pipeline (a command whose reply was lost may
    have run; callers' commands tolerate that: ``XACK`` is idempotent, a duplicate
    reply is dropped by the gateway). The instance loop sends plain commands only, no
    scripts.

    Args:
        client: the process's synchronous client (its URL and timeouts are used).
    """

    def __init__(self, client: redis.Redis) -> None:
        self._conn = client.connection_pool.make_connection()

    def pipeline(self, commands: Sequence[Command]) -> list[Any]:
        """Send ``commands`` in one write and read their replies in order.

        Returns:
            One raw reply per command; an error reply is returned as a
            ``ResponseError`` instance, not raised.

        Raises:
            redis.exceptions.ConnectionError, redis.exceptions.TimeoutError: Redis is
                unreachable twice in a row, or does not answer within the socket timeout.
        """
        try:
            return self._round_trip(commands)
        except redis.exceptions.ConnectionError:
            self._conn.disconnect()
            return self._round_trip(commands)

    def _round_trip(self, commands: Sequence[Command]) -> list[Any]:
        conn = self._conn
        conn.send_packed_command([pack_pipeline(commands)], check_health=False)
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except redis.exceptions.ResponseError as exc:
                replies.append(exc)
        return replies

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._conn.disconnect()
