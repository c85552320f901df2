"""Reply routing on the gateway side: one reader per gateway process.

Workers ``RPUSH`` each encoded response onto the reply key of the gateway that
queued the request (``KeySchema.reply``). One asyncio task per gateway pops
them in batches (``BLMPOP … COUNT``) and resolves the waiting future by
request id. A response nobody waits for (a duplicate after pending-entry
recovery, or one whose request already timed out) is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable

import redis.asyncio
import redis.exceptions

from broker.codec import CodecError, decode_response
from broker.errors import ErrorCode, SluiceError
from broker.messages import InferResponseMessage

logger = logging.getLogger(__name__)

#: how long one blocking pop waits before it is re-issued, in seconds.
_POP_BLOCK_S = 1.0
#: most responses taken per round trip.
_POP_COUNT = 256


class ReplyRouter:
    """Resolves response futures of one gateway process.

    Args:
        url: Redis URL; the reader holds a connection of its own (it blocks in ``BLMPOP``).
        reply_key: this gateway's reply list.
    """

    def __init__(self, url: str, reply_key: str) -> None:
        # no socket timeout on the connection (redis-py would wrap every write in a task);
        # each read is bounded below instead
        self._pool = redis.asyncio.ConnectionPool.from_url(
            url, protocol=2, socket_timeout=None, socket_connect_timeout=5
        )
        self.reply_key = reply_key
        self._waiting: dict[str, asyncio.Future[InferResponseMessage]] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the reader task (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._read_forever(), name="sluice-reply-reader")

    async def stop(self) -> None:
        """Stop the reader and fail every request still waiting (UNAVAILABLE)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(SluiceError(ErrorCode.UNAVAILABLE, "Server exiting"))
        self._waiting.clear()
        await self._pool.disconnect()

    def expect(
        self,
        request_id: str,
        deadline_ns: int,
        on_cancel: Callable[[], None] | None = None,
    ) -> asyncio.Future[InferResponseMessage]:
        """Register interest in ``request_id`` before its ``XADD`` reaches Redis (a worker
        cannot answer earlier; the gateway writes queued commands at the end of the loop
        iteration).

        The future fails with UNAVAILABLE "Request timeout expired" once the wall-clock
        ``deadline_ns`` passes; however it ends (answered, failed, cancelled), the
        registration and the timer go with it.

        Args:
            request_id: the request's id (its response carries it).
            deadline_ns: wall-clock deadline, ns since the epoch.
            on_cancel: called (from a done callback, so it must not raise) when the
                future is cancelled: the client went away before its answer.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[InferResponseMessage] = loop.create_future()
        self._waiting[request_id] = future
        # a timer handle, not asyncio.wait_for: no wrapper task per request
        timer = loop.call_later(max(0.0, (deadline_ns - time.time_ns()) / 1e9), _expire, future)
        future.add_done_callback(functools.partial(self._done, request_id, timer, on_cancel))
        return future

    def _done(
        self,
        request_id: str,
        timer: asyncio.TimerHandle,
        on_cancel: Callable[[], None] | None,
        future: asyncio.Future[InferResponseMessage],
    ) -> None:
        timer.cancel()
        if self._waiting.get(request_id) is future:
            del self._waiting[request_id]
        if on_cancel is not None and future.cancelled():
            on_cancel()

    async def _read_forever(self) -> None:
        conn = self._pool.make_connection()
        try:
            await self._pop_forever(conn)
        finally:
            await conn.disconnect(nowait=True)

    async def _pop_forever(self, conn: redis.asyncio.Connection) -> None:
        backoff_s = 0.05
        command = conn.pack_command(
            "BLMPOP", _POP_BLOCK_S, 1, self.reply_key, "LEFT", "COUNT", _POP_COUNT
        )
        while True:
            try:
                await conn.send_packed_command(command, check_health=False)
                async with asyncio.timeout(_POP_BLOCK_S + 5):
                    popped = await conn.read_response()
                backoff_s = 0.05
            except TimeoutError:
                logger.warning("reply reader: Redis did not answer BLMPOP; reconnecting")
                await conn.disconnect(nowait=True)
                continue
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                logger.warning("reply reader lost Redis (%s); retrying in %.2fs", exc, backoff_s)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 2.0)
                continue
            if not popped:
                continue
            for payload in popped[1]:
                self._deliver(payload)

    def _deliver(self, payload: bytes) -> None:
        try:
            response = decode_response(payload)
        except CodecError:
            logger.exception("dropping an undecodable reply")
            return
        future = self._waiting.pop(response.request_id, None)
        if future is None or future.done():
            logger.debug("dropping reply for %s: nobody waits for it", response.request_id)
            return
        future.set_result(response)


def _expire(future: asyncio.Future[InferResponseMessage]) -> None:
    if not future.done():
        future.set_exception(SluiceError(ErrorCode.UNAVAILABLE, "Request timeout expired"))
