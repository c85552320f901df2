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

import hiredis
import redis.asyncio
import redis.exceptions

from sluice.broker.cluster import MAP_TIMEOUT_S, SlotMap, is_cluster, parse_cluster_url, redirection
from sluice.broker.codec import CodecError, decode_response
from sluice.broker.errors import TIMEOUT_TEXT, ErrorCode, SluiceError
from sluice.broker.messages import InferResponseMessage
from sluice.broker.outage import OutageLog
from sluice.broker.resp import pack_pipeline
from sluice.broker.response_stream import ResponseStream
from sluice.broker.takeover import RedisProtocol, open_with, reply_parser

logger = logging.getLogger(__name__)

#: how long one blocking pop waits before it is re-issued, in seconds.
_POP_BLOCK_S = 1.0
#: most responses taken per round trip.
_POP_COUNT = 256
#: blocking pops queued on the connection at once; more are sent when at most
#: ``_POP_REFILL_AT`` are left: one write per 16 answers instead of one per answer (each
#: write also wakes Redis, so fewer writes save both the gateway's and Redis's CPU). A
#: retired connection's queued pops end within 32 × ``_POP_BLOCK_S``, inside
#: ``_RETIRED_CLOSE_S``.
_POPS_QUEUED = 32
_POP_REFILL_AT = 16
#: a connection given up for a stalled one is closed at the latest this long after, in s.
_RETIRED_CLOSE_S = 60.0


class ReplyRouter:
    """Resolves response futures of one gateway process.

    Args:
        url: Redis URL; the reader holds a connection of its own (it blocks in ``BLMPOP``).
        reply_key: this gateway's reply list.
        client_name: the reader connection's name in Redis (``CLIENT SETNAME``), if any.
    """

    def __init__(self, url: str, reply_key: str, client_name: str | None = None) -> None:
        self._client_name = client_name
        self._cluster = parse_cluster_url(url) if is_cluster(url) else None
        self._slots = SlotMap(self._cluster.seeds) if self._cluster else None
        self._pool = self._make_pool(url)
        self.reply_key = reply_key
        self._waiting: dict[str, asyncio.Future[InferResponseMessage]] = {}
        #: decoupled requests' response streams, by request id
        self.streams: dict[str, ResponseStream] = {}
        self._task: asyncio.Task[None] | None = None

    def _make_pool(self, url: str) -> redis.asyncio.ConnectionPool:
        # no socket timeout on the connection; a stalled one is noticed by the popper
        if is_cluster(url):
            url = self._cluster.node_url(self._cluster.seeds[0])  # type: ignore[union-attr]
        return redis.asyncio.ConnectionPool.from_url(
            url, protocol=2, socket_timeout=None, socket_connect_timeout=5,
            client_name=self._client_name,
        )  # fmt: skip

    async def _cluster_pool(self) -> redis.asyncio.ConnectionPool:
        """The pool of the primary serving the reply list's slot now (the map is read
        again first, so a failover or a migrated slot is followed).

        Raises:
            redis.exceptions.ConnectionError: no node of the cluster answered.
        """
        assert self._cluster is not None and self._slots is not None
        await self._slots.refresh_async(self._cluster, MAP_TIMEOUT_S)
        address = self._slots.node_for(self.reply_key) or self._slots.any_node()
        url = self._cluster.node_url(address)
        if self._pool.connection_kwargs.get("port") != address[1] or (
            self._pool.connection_kwargs.get("host") != address[0]
        ):
            await self._pool.disconnect()
            self._pool = self._make_pool(url)
        return self._pool

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
        for stream in list(self.streams.values()):
            stream.fail(SluiceError(ErrorCode.UNAVAILABLE, "Server exiting"))
        await self._pool.disconnect()

    @property
    def waiting(self) -> int:
        """How many requests wait for their answer (or their responses) now."""
        return len(self._waiting) + len(self.streams)

    def fail_waiting(self, error: SluiceError) -> int:
        """Fail every request still waiting with ``error`` (the gateway is stopping and
        nothing can answer them any more); returns how many."""
        failed = 0
        for future in list(self._waiting.values()):
            if not future.done():
                future.set_exception(error)
                failed += 1
        for stream in list(self.streams.values()):
            stream.fail(error)
            failed += 1
        return failed

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

    def expect_stream(
        self, request_id: str, deadline_ns: int, write_credit: Callable[[int], None]
    ) -> ResponseStream:
        """Register a decoupled request before its ``XADD`` (as :meth:`expect`): its
        responses go to the stream returned, which fails with UNAVAILABLE "Request timeout
        expired" once the wall-clock ``deadline_ns`` passes."""
        stream = ResponseStream(request_id, write_credit)
        self.streams[request_id] = stream
        loop = asyncio.get_running_loop()
        timer = loop.call_later(
            max(0.0, (deadline_ns - time.time_ns()) / 1e9),
            stream.fail, SluiceError(ErrorCode.UNAVAILABLE, TIMEOUT_TEXT),
        )  # fmt: skip

        def closed() -> None:
            timer.cancel()
            if self.streams.get(request_id) is stream:
                del self.streams[request_id]

        stream.on_close(closed)
        return stream

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
        """Connect, pop until the connection is lost or stalls, connect again (backoff)."""
        command = pack_pipeline(
            [("BLMPOP", _POP_BLOCK_S, 1, self.reply_key, "LEFT", "COUNT", _POP_COUNT)]
        )
        backoff_s = 0.05
        outage = OutageLog(logger, "reply reader")
        while True:
            popper = _Popper(self._deliver, command)
            try:
                pool = self._pool if self._cluster is None else await self._cluster_pool()
                transport = await open_with(pool, popper, _POP_BLOCK_S + 5)
            except (redis.exceptions.RedisError, TimeoutError, OSError) as exc:
                outage.failed(exc)  # one line per outage, retried with backoff
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 2.0)
                continue
            outage.ok()
            backoff_s = 0.05
            try:
                await popper.watch()
            except BaseException:
                transport.abort()  # the gateway is stopping
                raise
            # A stalled connection is not dropped: the pops queued on it may still run
            # once Redis goes on, and what they pop must reach the waiting requests. It
            # takes no new pops and closes once its queue is answered (or after a bound).
            popper.retire()
            asyncio.get_running_loop().call_later(_RETIRED_CLOSE_S, transport.abort)

    def _deliver(self, payload: bytes) -> None:
        try:
            response = decode_response(payload)
        except CodecError:
            logger.exception("dropping an undecodable reply")
            return
        stream = self.streams.get(response.request_id)
        if stream is not None:
            stream.push(response)
            return
        future = self._waiting.pop(response.request_id, None)
        if future is None or future.done():
            logger.debug("dropping reply for %s: nobody waits for it", response.request_id)
            return
        future.set_result(response)


class _Popper(RedisProtocol):
    """Keeps several ``BLMPOP`` commands queued on one connection and hands each popped
    response to ``deliver`` from the transport's data callback.

    Redis runs a blocked client's next pipelined command as soon as the one before it
    is answered, so a queue of pops costs one write per few answers. Re-issuing one pop
    per answer costs a socket write on the answer path of every request, and reading
    through redis-py a reader task's wake-up per answer. Each queued pop waits
    at most :data:`_POP_BLOCK_S`, so one answer is due within that bound while pops
    are queued.

    Args:
        deliver: called with each popped payload (bytes).
        command: one packed ``BLMPOP`` command.
    """

    def __init__(self, deliver: Callable[[bytes], None], command: bytes) -> None:
        self._deliver = deliver
        self._command = command
        self._parser = reply_parser()
        self._transport: asyncio.Transport | None = None
        self._queued = 0
        self._retiring = False
        self._last_reply_ns = time.monotonic_ns()
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._transport is None:
            self._transport = transport  # type: ignore[assignment]
            self._refill()

    def retire(self) -> None:
        """Queue no more pops; close the connection once the queued ones are answered."""
        self._retiring = True
        self._refill()

    def _refill(self) -> None:
        transport = self._transport
        if self._retiring:
            if self._queued <= 0 and transport is not None:
                transport.close()
            return
        if transport is not None and not transport.is_closing():
            transport.write(self._command * (_POPS_QUEUED - self._queued))
            self._queued = _POPS_QUEUED

    def data_received(self, data: bytes) -> None:
        self._parser.feed(data)
        try:
            while (reply := self._parser.gets()) is not False:
                self._queued -= 1
                self._last_reply_ns = time.monotonic_ns()
                if redirection(reply) is not None:
                    # a Redis Cluster moved the reply list's slot (a failover, a
                    # migration): the reader connects to the slot's new primary
                    self._set_lost()
                elif isinstance(reply, redis.exceptions.RedisError):
                    logger.warning("reply reader: BLMPOP failed: %s", reply)
                elif reply:
                    for payload in reply[1]:
                        self._deliver(payload)
        except hiredis.ProtocolError:
            logger.exception("reply reader: unparsable reply from Redis; reconnecting")
            self._set_lost()
            return
        if self._queued <= _POP_REFILL_AT or self._retiring:
            self._refill()

    def eof_received(self) -> bool:
        self._set_lost()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            logger.warning("reply reader lost Redis (%s); reconnecting", exc)
        self._set_lost()

    def _set_lost(self) -> None:
        if not self._lost.done():
            self._lost.set_result(None)

    async def watch(self) -> None:
        """Return when the connection is lost, or when Redis answered no pop for
        :data:`_POP_BLOCK_S` + 5 s (a stalled Redis; the caller reconnects)."""
        limit_ns = int((_POP_BLOCK_S + 5) * 1e9)
        while not self._lost.done():
            await asyncio.wait([self._lost], timeout=1.0)
            if time.monotonic_ns() - self._last_reply_ns > limit_ns:
                logger.warning("reply reader: Redis did not answer BLMPOP; reconnecting")
                return


def _expire(future: asyncio.Future[InferResponseMessage]) -> None:
    if not future.done():
        future.set_exception(SluiceError(ErrorCode.UNAVAILABLE, TIMEOUT_TEXT))
