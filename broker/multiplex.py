"""One Redis connection shared by every coroutine of a gateway process.

Commands issued during one event-loop tick are written together (one write, one
pipeline; in a tick that runs longer, every ``FLUSH_AFTER_NS``); replies come back
in order on the same connection and resolve each caller's future. This is Redis
pipelining applied across concurrent requests: at concurrency 32 one ``XADD``
write carries many requests, at concurrency 1 a command costs one write and one
read callback instead of redis-py's pool checkout, retry wrapper and per-call
timeout task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import redis.asyncio
import redis.exceptions

from broker.resp import pack_pipeline
from broker.scripts import Script

logger = logging.getLogger(__name__)

#: a command queued while the oldest one waiting has waited this long (in ns) sends them
#: all at once from the caller's stack, instead of at the next loop iteration.
FLUSH_AFTER_NS = 200_000


class MultiplexedConnection:
    """Pipelines the commands of many coroutines over one connection.

    Every wait is bounded: a watchdog fails every command in flight with
    ``TimeoutError`` (and reconnects) when Redis has not answered for
    ``timeout_s``. A lost connection fails the commands in flight with
    ``ConnectionError``; the next command reconnects.

    Args:
        url: Redis URL (``redis://``, ``rediss://``, ``unix://``).
        timeout_s: longest wait for a reply, in s; also the connect timeout.
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        self._pool = redis.asyncio.ConnectionPool.from_url(
            url, protocol=2, socket_timeout=None, socket_connect_timeout=timeout_s
        )
        self._timeout_ns = int(timeout_s * 1e9)
        self._conn: Any = None
        self._outbox: list[tuple[Sequence[object], asyncio.Future[Any]]] = []
        self._outbox_since_ns = 0
        self._inflight: deque[asyncio.Future[Any]] = deque()
        self._wake = asyncio.Event()
        self._progress_ns = time.monotonic_ns()
        self._tasks: list[asyncio.Task[None]] = []
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the writer and the watchdog (idempotent)."""
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._write_forever(), name="sluice-redis-writer"),
                asyncio.create_task(self._watch_forever(), name="sluice-redis-watchdog"),
            ]

    async def stop(self) -> None:
        """Stop the tasks, fail what is waiting (``ConnectionError``), close the connection."""
        for task in [*self._tasks, *([self._reader] if self._reader else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self._reader = None
        self._fail_all(redis.exceptions.ConnectionError("connection closed"))
        if self._conn is not None:
            await self._conn.disconnect()
        await self._pool.disconnect()

    def call(self, *args: object) -> asyncio.Future[Any]:
        """Queue one command; the future resolves to its raw reply (RESP2, bytes).

        The future raises ``redis.exceptions.ResponseError`` for an error reply,
        ``ConnectionError`` / ``TimeoutError`` when Redis is unreachable or silent.
        """
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if not self._tasks:
            future.set_exception(redis.exceptions.ConnectionError("connection not started"))
            return future
        outbox = self._outbox
        outbox.append((args, future))
        if len(outbox) == 1:
            self._outbox_since_ns = time.monotonic_ns()
            self._wake.set()
        elif time.monotonic_ns() - self._outbox_since_ns >= FLUSH_AFTER_NS:
            self._send_now()
        return future

    async def script(self, script: Script, keys: list[str], args: list[object]) -> Any:
        """Run ``script`` with ``EVALSHA``, loading it first if Redis does not know it.

        Raises:
            redis.exceptions.RedisError: as :meth:`call`.
        """
        try:
            return await self.call(*script.command(keys, args))
        except redis.exceptions.NoScriptError:
            await self.call("SCRIPT", "LOAD", script.body)
            return await self.call(*script.command(keys, args))

    def _send_now(self) -> None:
        """Write the outbox from the caller's stack.

        One loop iteration can run for milliseconds (a gateway parsing dozens of requests
        that arrived together); the writer task would send their commands only after all
        of them, while model instances sit idle (MLP at 32 clients: the first queued
        ``XADD`` waited 0.5-0.7 ms at p50 and 2 ms at p90). Sent only on a connection whose
        reader runs (so its handshake is over) and whose write buffer is empty; otherwise
        the writer task sends them as usual.
        """
        conn = self._conn
        writer = getattr(conn, "_writer", None)  # redis-py's asyncio.StreamWriter
        if (
            self._reader is None
            or writer is None
            or writer.is_closing()
            or writer.transport.get_write_buffer_size()
        ):
            return
        batch = self._take_outbox()
        if batch:
            writer.write(self._send_order(batch))

    def _take_outbox(self) -> list[tuple[Sequence[object], asyncio.Future[Any]]]:
        """Empty the outbox; commands whose caller stopped waiting are not sent."""
        batch, self._outbox = self._outbox, []
        return [(args, f) for args, f in batch if not f.done()]

    def _send_order(self, batch: list[tuple[Sequence[object], asyncio.Future[Any]]]) -> bytes:
        """Mark ``batch`` in flight (its replies come back in this order) and pack it."""
        if not self._inflight:
            self._progress_ns = time.monotonic_ns()
        self._inflight.extend(f for _, f in batch)
        return pack_pipeline([args for args, _ in batch])

    # -- tasks -------------------------------------------------------------------------------

    async def _write_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch = self._take_outbox()
            if not batch:
                continue
            try:
                conn = await self._connected()
                packed = self._send_order(batch)
                await conn.send_packed_command([packed], check_health=False)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(_as_redis_error(exc))
                await self._reset(exc)

    async def _connected(self) -> Any:
        if self._conn is None:
            self._conn = self._pool.make_connection()
        if not self._conn.is_connected:
            await self._conn.connect()
            self._reader = asyncio.create_task(
                self._read_forever(self._conn), name="sluice-redis-reader"
            )
        return self._conn

    async def _read_forever(self, conn: Any) -> None:
        while True:
            try:
                reply = await conn.read_response(disconnect_on_error=False)
            except redis.exceptions.ResponseError as exc:
                reply = exc
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if conn is self._conn:
                    self._reader = None
                    await self._reset(exc)
                return
            self._progress_ns = time.monotonic_ns()
            if not self._inflight:
                logger.error("Redis sent a reply nobody asked for; reconnecting")
                await self._reset(redis.exceptions.ConnectionError("unexpected reply"))
                return
            future = self._inflight.popleft()
            if future.done():
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _watch_forever(self) -> None:
        period_s = min(1.0, self._timeout_ns / 4e9)
        while True:
            await asyncio.sleep(period_s)
            if self._inflight and time.monotonic_ns() - self._progress_ns > self._timeout_ns:
                logger.warning(
                    "Redis did not answer for %.1f s; reconnecting", self._timeout_ns / 1e9
                )
                await self._reset(redis.exceptions.TimeoutError("Timeout reading from Redis"))

    async def _reset(self, exc: BaseException) -> None:
        """Drop the connection and fail the commands in flight (their error says they were
        sent, so they may have run: an ``XADD`` may still be executed by an instance)."""
        error = _as_redis_error(exc)
        sent = type(error)(f"{error} (sent before the connection was lost: it may have run)")
        self._fail_all(sent, outbox=False)
        if self._outbox:
            self._wake.set()  # queued after the failure: sent on a new connection
        reader, self._reader = self._reader, None
        conn, self._conn = self._conn, None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)

    def _fail_all(self, exc: BaseException, outbox: bool = True) -> None:
        futures = list(self._inflight)
        self._inflight.clear()
        if outbox:
            futures.extend(f for _, f in self._outbox)
            self._outbox = []
        for future in futures:
            if not future.done():
                future.set_exception(exc)


def _as_redis_error(exc: BaseException) -> redis.exceptions.RedisError:
    if isinstance(exc, redis.exceptions.RedisError):
        return exc
    return redis.exceptions.ConnectionError(f"{type(exc).__name__}: {exc}")
