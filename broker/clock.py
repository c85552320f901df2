"""Whether this host's wall clock agrees with the Redis host's.

Instance heartbeats, request deadlines and sequence idle times are wall-clock times
(``time.time_ns()``) written on one host and compared on another: a gateway takes an
instance whose heartbeat looks older than 5 s for dead (not ready), an instance claims
the requests of a peer whose heartbeat looks that old, and an instance answers a
request whose deadline looks past without running it. Hosts whose clocks are seconds
apart get those wrong. Every gateway and instance therefore compares its clock with
Redis's ``TIME`` when it starts and logs a warning naming the offset when it exceeds
:data:`SKEW_WARN_S`; the clocks themselves are the operator's (NTP, chrony).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import redis
import redis.asyncio
import redis.exceptions

__all__ = [
    "SKEW_WARN_S",
    "check_clock",
    "check_clock_async",
    "clock_offset_s",
    "clock_offset_s_async",
    "skew_warning",
]

#: an offset from Redis's clock above this many seconds is logged at start
SKEW_WARN_S = 1.0


def _offset(before: float, reply: tuple[int, int], after: float) -> float:
    seconds, micros = reply
    return seconds + micros / 1e6 - (before + after) / 2


def clock_offset_s(client: redis.Redis) -> float:
    """The Redis host's wall clock minus this host's, in s (``TIME``, taken at the middle
    of its round trip).

    Raises:
        redis.exceptions.RedisError: Redis unreachable.
    """
    before = time.time()
    reply = client.time()
    return _offset(before, reply, time.time())


async def clock_offset_s_async(client: redis.asyncio.Redis) -> float:
    """:func:`clock_offset_s` for an asyncio client.

    Raises:
        redis.exceptions.RedisError: Redis unreachable.
    """
    before = time.time()
    reply = await client.time()
    return _offset(before, reply, time.time())


def skew_warning(offset_s: float, logger: logging.Logger) -> bool:
    """Log a warning when ``offset_s`` (:func:`clock_offset_s`) exceeds
    :data:`SKEW_WARN_S` either way; whether it did."""
    if abs(offset_s) <= SKEW_WARN_S:
        return False
    logger.warning(
        "this host's clock is %.1f s %s the Redis host's: heartbeats and request deadlines "
        "are compared across hosts, so instances may be taken for dead or requests for "
        "expired; synchronize the clocks (NTP, chrony)",
        abs(offset_s),
        "behind" if offset_s > 0 else "ahead of",
    )
    return True


def check_clock(client: redis.Redis, logger: logging.Logger) -> None:
    """:func:`skew_warning` of :func:`clock_offset_s`; a Redis that does not answer (or
    answers ``TIME`` with something else than seconds and µs) is left to the caller's own
    first command."""
    with contextlib.suppress(redis.exceptions.RedisError, TypeError, ValueError):
        skew_warning(clock_offset_s(client), logger)


async def check_clock_async(
    client: redis.asyncio.Redis, logger: logging.Logger, timeout_s: float = 2.0
) -> None:
    """:func:`check_clock` for an asyncio client, given up after ``timeout_s`` (a gateway
    starts, not ready, while Redis does not answer)."""
    with contextlib.suppress(redis.exceptions.RedisError, TimeoutError, TypeError, ValueError):
        async with asyncio.timeout(timeout_s):
            skew_warning(await clock_offset_s_async(client), logger)
