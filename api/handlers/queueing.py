"""Queueing an inference request on its model version's stream, and taking it off again.

A request goes to the stream of its priority level (``broker.scheduling.StreamLayout``)
with an ``XADD`` through the multiplexed connection (``broker.producer``) and its answer
comes back on this gateway's reply key (``broker.replies``); the key schema and the path
of a request are in docs/architecture.md. A request a client gave up on leaves its
stream if no instance has taken it yet (Triton ``docs/user_guide/request_cancellation.md``;
docs/reference/model-configuration.md, Cancellation).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from typing import Any

import redis.asyncio

from sluice.api.handlers.shutdown import Shutdown
from sluice.api.handlers.stream_watch import InstanceWatch
from sluice.api.models import ModelView
from sluice.broker.codec import CodecError, decode_request
from sluice.broker.errors import TIMEOUT_TEXT, ErrorCode, FailureReason, SluiceError
from sluice.broker.keys import KeySchema
from sluice.broker.messages import InferRequestMessage, InferResponseMessage
from sluice.broker.model_store import LIVE_HEARTBEAT_NS
from sluice.broker.multiplex import MultiplexedConnection
from sluice.broker.producer import (
    PAYLOAD_FIELD,
    QUEUE_FULL,
    Producer,
    enqueue_error,
    submit_step,
)
from sluice.broker.replies import ReplyRouter
from sluice.broker.response_stream import ResponseStream
from sluice.broker.scheduling import StreamLayout
from sluice.broker.sequences import SequenceStepInfo
from sluice.broker.stats_store import StatsDelta
from sluice.repository.validate import queue_shards

__all__ = ["RequestQueue"]

logger = logging.getLogger(__name__)


class RequestQueue:
    """The queues of every model version, as this gateway sends to them.

    Args:
        client: the gateway's Redis client.
        connection: the multiplexed connection requests are queued through.
        keys: the deployment's key schema.
        router: this gateway's reply router (answers come there).
        shutdown: the gateway's shutdown state.
        socket_timeout_s: longest wait for Redis to take a cancelled request off, in s.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        connection: MultiplexedConnection,
        keys: KeySchema,
        router: ReplyRouter,
        shutdown: Shutdown,
        socket_timeout_s: float,
    ) -> None:
        self._redis = client
        self._connection = connection
        self._producer = Producer(connection)
        self._keys = keys
        self._router = router
        self._shutdown = shutdown
        self._socket_timeout_s = socket_timeout_s
        #: (model, version) -> its stream layout, rebuilt when the view's policy changes
        self._layouts: dict[tuple[str, int], StreamLayout] = {}
        #: (model, version) of a sharded queue -> requests queued on it so far: the next
        #: goes to the next shard (begun at random, so that gateways do not move in step)
        self._turns: dict[tuple[str, int], int] = {}
        #: rejection counts and cancellations being written (kept referenced until done)
        self._background: set[asyncio.Future[None]] = set()
        #: fails a decoupled request's responses when the instance sending them dies
        self._watch = InstanceWatch(client, keys)

    def enqueue(
        self,
        message: InferRequestMessage,
        view: ModelView,
        step: SequenceStepInfo | None = None,
    ) -> asyncio.Future[InferResponseMessage]:
        """Queue ``message`` on its priority level's stream; the future of its answer.

        The ``XADD`` leaves with this event-loop iteration's others. The future fails
        with ``SluiceError`` UNAVAILABLE when Redis refuses the request (queue full:
        Triton ``max_queue_size``) or cannot be reached. Cancelling it takes the request
        off its stream if no instance has taken it yet (:meth:`_cancelled`).

        A step of a sequence (``step``) goes to the stream of the instance its sequence is
        bound to (:func:`~sluice.broker.producer.submit_step`); it fails with INVALID_ARG
        without START on a sequence that is not live. A cancelled step stays queued and
        runs: the steps after it wait for it, in order.
        """
        model, resolved = message.model, message.version
        if step is not None and view.sequence is not None:
            return self._enqueue_step(message, view, step)
        now_ns = message.enqueued_ns
        stream, level, max_queue_size = self._route(message, view)
        # the XADD leaves at the end of this loop iteration: registered below before any
        # reply can come; its future keeps the entry id for a cancellation
        queued = self._producer.submit(stream, message, max_queue_size)
        future = self._router.expect(
            message.request_id,
            message.deadline_ns,
            functools.partial(self._cancelled, stream, model, resolved, now_ns, queued),
        )
        queued.add_done_callback(functools.partial(self._queued, future, model, resolved, now_ns))
        timeout_ns = view.policy.timeout_ns(level, _requested_timeout_us(message))
        if timeout_ns is not None and view.policy.queue_policy(level).timeout_action == "REJECT":
            self._reject_at(now_ns + timeout_ns, future, stream, model, resolved, now_ns, queued)
        future.add_done_callback(
            functools.partial(self._deadline_passed, stream, model, resolved, now_ns, queued)
        )
        return future

    def _route(self, message: InferRequestMessage, view: ModelView) -> tuple[str, int, int]:
        """The stream of ``message``'s priority level (in the next queue shard, turn by
        turn, when the model's queue is split), the level and the stream's
        ``max_queue_size`` (the level's, split over the shards)."""
        model, resolved = message.model, message.version
        layout = self._layouts.get((model, resolved))
        if layout is None or layout.policy is not view.policy:
            shards = queue_shards(view.config)
            layout = StreamLayout(self._keys, model, resolved, view.policy, shards)
            self._layouts[(model, resolved)] = layout
        level = layout.level_of(int(message.parameters.get("priority", 0) or 0))
        shard = 0
        if layout.shards > 1:
            turn = self._turns.get((model, resolved), random.randrange(layout.shards)) + 1
            self._turns[(model, resolved)] = turn
            shard = turn % layout.shards
        limit = layout.shard_limit(view.policy.queue_policy(level).max_queue_size)
        return layout.stream(level, shard), level, limit

    def enqueue_stream(self, message: InferRequestMessage, view: ModelView) -> ResponseStream:
        """Queue a request to a decoupled model; its responses arrive on the stream
        returned (:mod:`sluice.broker.response_stream`). Cancelling the stream takes the
        request off its queue if no instance has taken it yet, else tells the model
        (``is_cancelled()``). A refused ``XADD`` fails the stream."""
        model, resolved = message.model, message.version
        stream_key, _, max_queue_size = self._route(message, view)
        queued = self._producer.submit(stream_key, message, max_queue_size)
        credit_key = self._keys.stream_credit(message.request_id)
        ttl_ms = max(1, (message.deadline_ns - time.time_ns()) // 1_000_000)

        def write_credit(count: int) -> None:
            written = self._connection.call("SET", credit_key, count, "PX", ttl_ms)
            written.add_done_callback(_ignore_result)

        responses = self._router.expect_stream(
            message.request_id, message.deadline_ns, write_credit
        )
        responses.model, responses.version = model, resolved
        responses.on_cancel(
            functools.partial(
                self._cancelled, stream_key, model, resolved, message.enqueued_ns, queued
            )
        )
        failed = asyncio.get_running_loop().create_future()
        failed.add_done_callback(
            lambda f: responses.fail(f.exception()) if f.exception() else None  # type: ignore[arg-type]
        )
        queued.add_done_callback(
            functools.partial(self._queued, failed, model, resolved, message.enqueued_ns)
        )
        self._watch.add(responses)
        return responses

    def _deadline_passed(
        self,
        stream: str,
        model: str,
        version: int,
        enqueued_ns: int,
        queued: asyncio.Future[Any],
        future: asyncio.Future[InferResponseMessage],
    ) -> None:
        """The client was answered "Request timeout expired" at the request's deadline:
        take the request off its stream if no instance has taken it yet, so that it never
        runs and no longer counts against ``max_queue_size`` (an instance that holds it
        refuses it before running it)."""
        if future.cancelled() or not isinstance(future.exception(), SluiceError):
            return
        if future.exception().message == TIMEOUT_TEXT:  # type: ignore[union-attr]
            self._queue_timeout(future, stream, model, version, enqueued_ns, queued)

    def _reject_at(
        self,
        when_ns: int,
        future: asyncio.Future[InferResponseMessage],
        stream: str,
        model: str,
        version: int,
        enqueued_ns: int,
        queued: asyncio.Future[Any],
    ) -> None:
        """At ``when_ns`` (wall clock), the request's queue timeout (Triton
        ``ModelQueuePolicy`` with ``timeout_action: REJECT``): if no instance has taken
        it yet it is taken off its stream and refused with UNAVAILABLE "Request timeout
        expired", counted as a failure, reason REJECTED, at its timeout even while every
        instance of the model is busy. One an instance holds is the instance's to
        refuse (before it runs) or to run (it started before its timeout)."""
        loop = asyncio.get_running_loop()
        timer = loop.call_later(
            max(0.0, (when_ns - time.time_ns()) / 1e9),
            self._queue_timeout, future, stream, model, version, enqueued_ns, queued,
        )  # fmt: skip
        future.add_done_callback(lambda _: timer.cancel())

    def _queue_timeout(
        self,
        future: asyncio.Future[InferResponseMessage],
        stream: str,
        model: str,
        version: int,
        enqueued_ns: int,
        queued: asyncio.Future[Any],
    ) -> None:
        """Take the request off its stream (in the background) if no instance has taken
        it; then fail ``future`` unless it is already done."""
        if self._shutdown.exiting or not queued.done():
            return
        if queued.cancelled() or queued.exception() is not None:
            return  # never queued: the client has its error
        task = asyncio.ensure_future(
            self._reject_queued(future, stream, queued.result(), model, version, enqueued_ns)
        )
        self._background.add(task)
        task.add_done_callback(self._cancel_ended)

    async def _reject_queued(
        self,
        future: asyncio.Future[InferResponseMessage],
        stream: str,
        entry_id: bytes,
        model: str,
        version: int,
        enqueued_ns: int,
    ) -> None:
        async with asyncio.timeout(self._socket_timeout_s):
            taken = await self._producer.cancel(
                stream, entry_id, self._keys.stats(model, version),
                time.time_ns() - enqueued_ns, FailureReason.REJECTED,
            )  # fmt: skip
        if taken and not future.done():
            future.set_exception(SluiceError(ErrorCode.UNAVAILABLE, TIMEOUT_TEXT, model=model))

    def _enqueue_step(
        self, message: InferRequestMessage, view: ModelView, step: SequenceStepInfo
    ) -> asyncio.Future[InferResponseMessage]:
        model, version = message.model, message.version
        assert view.sequence is not None
        idle_ms = view.sequence.spec.idle_us // 1000
        waits_ms = max(0, message.deadline_ns - message.enqueued_ns) // 1_000_000
        queued = asyncio.ensure_future(
            submit_step(
                self._connection,
                (
                    self._keys.sequence(model, version, step.tag),
                    self._keys.instances(model, version),
                    self._keys.sequence_queue(model, version, ""),
                ),
                message,
                step,
                LIVE_HEARTBEAT_NS,
                max(1, idle_ms + waits_ms),
            )
        )
        future = self._router.expect(message.request_id, message.deadline_ns)
        queued.add_done_callback(
            functools.partial(self._queued, future, model, version, message.enqueued_ns)
        )
        return future

    def _queued(
        self,
        future: asyncio.Future[InferResponseMessage],
        model: str,
        version: int,
        enqueued_ns: int,
        queued: asyncio.Future[Any],
    ) -> None:
        """Redis answered the ``XADD``: a refusal or an unreachable Redis fails the request
        (a queue-full refusal counts as a failure, reason REJECTED, lasting from the
        request's arrival until now, as Triton's request statistics)."""
        if queued.cancelled():
            error: BaseException = SluiceError(
                ErrorCode.UNAVAILABLE, "Server exiting: request not queued", model=model
            )
        elif (exc := queued.exception()) is None:
            return
        else:
            error = enqueue_error(exc, model)
        if isinstance(error, SluiceError) and error.message == QUEUE_FULL:
            delta = StatsDelta()
            delta.failure(
                request_ns=max(0, time.time_ns() - enqueued_ns), reason=FailureReason.REJECTED
            )
            self.count(model, version, delta)
        if not future.done():
            future.set_exception(error)

    def count(self, model: str, version: int, delta: StatsDelta) -> None:
        """Add ``delta`` to the version's gateway statistics hash, in the background (a
        rejection, an ensemble request); a failure to write it is logged."""
        task = asyncio.ensure_future(self._add_counts(model, version, delta))
        self._background.add(task)
        task.add_done_callback(self._counted)

    async def _add_counts(self, model: str, version: int, delta: StatsDelta) -> None:
        key = self._keys.stats(model, version)
        commands: list[tuple[object, ...]] = [
            ("HINCRBY", key, name, n) for name, n in delta.counts.items()
        ]
        if delta.last_inference_ms:
            commands.append(("HSET", key, "last_inference_ms", delta.last_inference_ms))
        await self._connection.run_all(commands)

    def _counted(self, task: asyncio.Future[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.warning("could not count a request in the statistics: %s", exc)

    def _cancelled(
        self,
        stream: str,
        model: str,
        version: int,
        enqueued_ns: int,
        queued: asyncio.Future[Any],
    ) -> None:
        """The client cancelled the request (gRPC cancellation or deadline, HTTP connection
        lost): take it off its stream if no instance has taken it yet (in the background,
        once the ``XADD`` has answered). Not while the server exits: what is cancelled then
        is mostly the server's doing (gRPC's grace period, uvicorn's shutdown timeout; a
        client's own cancellation is not told apart), and :meth:`drop_unanswered` takes
        what is left, uncounted. Never raises (it runs in a done callback); a failed
        cancellation is logged (:meth:`_cancel_ended`)."""
        if self._shutdown.exiting:
            return
        if not queued.done():
            queued.add_done_callback(
                functools.partial(self._cancelled, stream, model, version, enqueued_ns)
            )
            return
        if queued.cancelled() or queued.exception() is not None:
            return  # never queued
        task = asyncio.ensure_future(
            self._cancel_queued(stream, queued.result(), model, version, enqueued_ns)
        )
        self._background.add(task)
        task.add_done_callback(self._cancel_ended)

    async def _cancel_queued(
        self, stream: str, entry_id: bytes, model: str, version: int, enqueued_ns: int
    ) -> None:
        async with asyncio.timeout(self._socket_timeout_s):
            taken = await self._producer.cancel(
                stream,
                entry_id,
                self._keys.stats(model, version),
                time.time_ns() - enqueued_ns,
            )
        logger.debug(
            "cancelled request of model '%s' version %d (entry %s): %s",
            model,
            version,
            entry_id.decode(),
            "taken off the queue" if taken else "already taken by an instance, it runs",
        )

    def _cancel_ended(self, task: asyncio.Future[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.warning(
                "could not take a cancelled request off its queue: %s",
                "Redis did not answer in time" if isinstance(exc, TimeoutError) else exc,
            )

    async def drop_unanswered(self) -> int:
        """At exit, after :meth:`ReplyRouter.stop` answered every waiting client: take this
        gateway's requests that are still queued off their streams, so no instance runs
        them later (Triton drops what it has not run when it exits; a later server on the
        same Redis would otherwise run them and count them). Returns how many it took.

        An instance that already holds one of them still runs it; its answer is dropped.

        Raises:
            redis.exceptions.RedisError: Redis unreachable.
        """
        dropped = 0
        for layout in list(self._layouts.values()):
            for stream in layout.streams():
                ids: list[bytes] = []
                start: bytes | str = "-"
                while True:
                    entries = await self._redis.xrange(stream, min=start, max="+", count=500)
                    for entry_id, fields in entries:
                        try:
                            reply_to = decode_request(fields[PAYLOAD_FIELD]).reply_to
                        except (CodecError, KeyError):
                            continue
                        if reply_to == self._router.reply_key:
                            ids.append(entry_id)
                    if len(entries) < 500:
                        break
                    start = b"(" + entries[-1][0]
                if ids:
                    dropped += int(await self._redis.xdel(stream, *ids))
        return dropped


def _requested_timeout_us(message: InferRequestMessage) -> int | None:
    """The request's ``timeout`` parameter in µs (None: absent or 0, "not given")."""
    timeout = message.parameters.get("timeout") if message.parameters else None
    return int(timeout) if isinstance(timeout, int) and timeout > 0 else None


def _ignore_result(future: asyncio.Future[Any]) -> None:
    """Retrieve a fire-and-forget command's outcome (a lost credit write only slows the
    producer down until the next one)."""
    if not future.cancelled():
        future.exception()
