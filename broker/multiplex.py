"""One Redis connection shared by every coroutine of a gateway process.

Commands issued during one event-loop tick are written together (one write, one
pipeline; in a tick that runs longer, every ``FLUSH_AFTER_NS``); replies come back
in order on the same connection and resolve each caller's future from the
transport's data callback. This is Redis pipelining applied across concurrent
requests: at concurrency 32 one ``XADD`` write carries many requests, at
concurrency 1 a command costs one write and one read callback instead of
redis-py's pool checkout, retry wrapper, per-call timeout task and reader task.
redis-py still opens each connection (URL, TLS, AUTH, SELECT); hiredis parses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import hiredis
import redis.asyncio
import redis.exceptions

from sluice.broker.resp import pack_pipeline
from sluice.broker.scripts import Script
from sluice.broker.takeover import RedisProtocol, open_with, reply_parser

logger = logging.getLogger(__name__)

#: a command queued while the oldest one waiting has waited this long (in ns) sends them
#: all at once from the caller's stack, instead of at the next loop iteration.
FLUSH_AFTER_NS = 200_000

#: what the error of a command that was written before its connection was lost ends with.
MAY_HAVE_RUN = "(sent before the connection was lost: it may have run)"

_Batch = list[tuple[Sequence[object], "asyncio.Future[Any]"]]


class MultiplexedConnection:
    """Pipelines the commands of many coroutines over one connection.

    Every wait is bounded: a watchdog fails every command in flight with
    ``TimeoutError`` (and drops the connection) when Redis has not answered for
    ``timeout_s``. A lost connection fails the commands in flight with
    ``ConnectionError``; the next command connects again.

    Args:
        url: Redis URL (``redis://``, ``rediss://``, ``unix://``).
        timeout_s: longest wait for a reply, in s; also the connect timeout.
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        self._pool = redis.asyncio.ConnectionPool.from_url(
            url, protocol=2, socket_timeout=None, socket_connect_timeout=timeout_s
        )
        self._timeout_s = timeout_s
        self._timeout_ns = int(timeout_s * 1e9)
        self._link: _Link | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._outbox: _Batch = []
        self._outbox_since_ns = 0
        self._flush_scheduled = False
        self._watchdog: asyncio.Task[None] | None = None
        #: scripts loaded first on every connection (:meth:`keep_loaded`), by SHA1
        self._scripts: dict[str, Script] = {}

    async def start(self) -> None:
        """Start the watchdog (idempotent); the first command connects."""
        self.open()

    def open(self) -> None:
        """:meth:`start` from a running event loop's synchronous code."""
        if self._watchdog is None:
            self._watchdog = asyncio.create_task(
                self._watch_forever(), name="sluice-redis-watchdog"
            )

    async def stop(self) -> None:
        """Stop, fail what is waiting (``ConnectionError``), close the connection."""
        for task in (self._watchdog, self._connecting):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._watchdog = self._connecting = None
        closed = redis.exceptions.ConnectionError("connection closed")
        self._fail_outbox(closed)
        link, self._link = self._link, None
        if link is not None:
            link.close(closed)
        await self._pool.disconnect()

    def call(self, *args: object) -> asyncio.Future[Any]:
        """Queue one command; the future resolves to its raw reply (RESP2, bytes).

        The future raises ``redis.exceptions.ResponseError`` for an error reply,
        ``ConnectionError`` / ``TimeoutError`` when Redis is unreachable or silent.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self._watchdog is None:
            future.set_exception(redis.exceptions.ConnectionError("connection not started"))
            return future
        outbox = self._outbox
        outbox.append((args, future))
        if len(outbox) == 1:
            self._outbox_since_ns = time.monotonic_ns()
            if not self._flush_scheduled:
                self._flush_scheduled = True
                loop.call_soon(self._flush)
        elif time.monotonic_ns() - self._outbox_since_ns >= FLUSH_AFTER_NS:
            # One loop iteration can run for milliseconds (a gateway parsing dozens of
            # requests that arrived together); written only at its end, the first queued
            # XADD would wait that long while model instances sit idle.
            self._send()
        return future

    async def run_all(self, commands: Sequence[Sequence[object]]) -> list[Any]:
        """Queue every command (one write with this loop iteration's others) and await
        their replies, in order.

        Raises:
            redis.exceptions.RedisError: as :meth:`call`, the first failure.
        """
        return list(await asyncio.gather(*(self.call(*command) for command in commands)))

    def keep_loaded(self, *scripts: Script) -> None:
        """Have Redis know ``scripts`` before any other command of each connection: a
        ``SCRIPT LOAD`` each, first on every new connection (a Redis restarted without
        its data forgot them, and a reconnect follows) and now on an open one.

        Otherwise the first ``EVALSHA`` after a restart gets ``NOSCRIPT`` and is sent
        again after a ``SCRIPT LOAD`` (:meth:`script`): two round trips, during which a
        later command can overtake it (a response cache insert answered after the next
        identical request's lookup: a miss).
        """
        for script in scripts:
            self._scripts[script.sha] = script
            if self._link is not None:
                _ignore(self.call("SCRIPT", "LOAD", script.body))

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

    # -- writing -----------------------------------------------------------------------------

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._send()

    def _send(self) -> None:
        """Write the outbox now, or connect first (the commands wait for the connection)."""
        if not self._outbox:
            return
        link = self._link
        if link is not None and not link.usable:
            link.close(redis.exceptions.ConnectionError("connection closed"))  # -> _lost
            return
        if link is None:
            if self._connecting is None and self._watchdog is not None:
                self._connecting = asyncio.create_task(self._connect(), name="sluice-redis-connect")
            return
        batch, self._outbox = self._outbox, []
        link.send([(args, f) for args, f in batch if not f.done()])

    async def _connect(self) -> None:
        """Open a connection (:func:`broker.takeover.open_with`) read by a :class:`_Link`.
        A failure fails the commands waiting for it."""
        link = _Link()
        try:
            await open_with(self._pool, link, self._timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._connecting = None
            self._fail_outbox(_as_redis_error(exc))
            return
        link.on_lost = self._lost
        self._link = link
        self._connecting = None
        if self._scripts:
            loop = asyncio.get_running_loop()
            loads: _Batch = []
            for script in self._scripts.values():
                future: asyncio.Future[Any] = loop.create_future()
                _ignore(future)
                loads.append((("SCRIPT", "LOAD", script.body), future))
            self._outbox[:0] = loads
        self._send()

    # -- failures ----------------------------------------------------------------------------

    def _lost(self, link: _Link) -> None:
        """The link's connection closed (its in-flight commands were failed)."""
        if self._link is link:
            self._link = None
        if self._outbox:
            self._send()  # queued after the failure: sent on a new connection

    async def _watch_forever(self) -> None:
        period_s = min(1.0, self._timeout_ns / 4e9)
        while True:
            await asyncio.sleep(period_s)
            link = self._link
            if link is not None and link.stalled_for_ns() > self._timeout_ns:
                logger.warning("Redis did not answer for %.1f s; reconnecting", self._timeout_s)
                link.close(redis.exceptions.TimeoutError("Timeout reading from Redis"))

    def _fail_outbox(self, exc: BaseException) -> None:
        batch, self._outbox = self._outbox, []
        for _, future in batch:
            if not future.done():
                future.set_exception(exc)


def _ignore(future: asyncio.Future[Any]) -> None:
    """Retrieve ``future``'s outcome when it ends (nobody awaits it; a failure is seen
    again by the command it was for)."""
    future.add_done_callback(lambda f: f.cancelled() or f.exception())


class _Link(RedisProtocol):
    """One open connection: writes pipelines, resolves their futures in reply order."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._parser = reply_parser()
        self._inflight: deque[asyncio.Future[Any]] = deque()
        self._progress_ns = time.monotonic_ns()
        self._error: BaseException | None = None
        self.on_lost: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._transport is None:
            self._transport = transport  # type: ignore[assignment]

    def send(self, batch: _Batch) -> None:
        """Write ``batch`` (a usable link only: :meth:`MultiplexedConnection._send` checks)."""
        if not batch:
            return
        if not self._inflight:
            self._progress_ns = time.monotonic_ns()
        self._inflight.extend(f for _, f in batch)
        self._transport.write(pack_pipeline([args for args, _ in batch]))

    @property
    def usable(self) -> bool:
        """Open and not closing."""
        transport = self._transport
        return self._error is None and transport is not None and not transport.is_closing()

    def stalled_for_ns(self) -> int:
        """How long replies have been due without one arriving, in ns (0: none due)."""
        return time.monotonic_ns() - self._progress_ns if self._inflight else 0

    def data_received(self, data: bytes) -> None:
        self._parser.feed(data)
        inflight = self._inflight
        try:
            while (reply := self._parser.gets()) is not False:
                if not inflight:
                    logger.error("Redis sent a reply nobody asked for; reconnecting")
                    self.close(redis.exceptions.ConnectionError("unexpected reply"))
                    return
                future = inflight.popleft()
                if future.done():
                    continue
                if isinstance(reply, redis.exceptions.RedisError):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        except hiredis.ProtocolError as exc:
            logger.error("unparsable reply from Redis (%s); reconnecting", exc)
            self.close(redis.exceptions.ConnectionError(f"protocol error: {exc}"))
            return
        self._progress_ns = time.monotonic_ns()

    def eof_received(self) -> bool:
        return False  # the transport closes: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.close(
            _as_redis_error(exc) if exc else redis.exceptions.ConnectionError("connection closed")
        )

    def close(self, exc: BaseException) -> None:
        """Close the connection and fail the commands in flight (their error says they were
        sent, so they may have run: an ``XADD`` may still be executed by an instance)."""
        if self._error is not None:
            return
        error = _as_redis_error(exc)
        self._error = type(error)(f"{error} {MAY_HAVE_RUN}")
        futures, self._inflight = self._inflight, deque()
        for future in futures:
            if not future.done():
                future.set_exception(self._error)
        if self._transport is not None:
            self._transport.abort()
        if self.on_lost is not None:
            self.on_lost(self)


def _as_redis_error(exc: BaseException) -> redis.exceptions.RedisError:
    if isinstance(exc, redis.exceptions.RedisError):
        return exc
    return redis.exceptions.ConnectionError(f"{type(exc).__name__}: {exc}")
