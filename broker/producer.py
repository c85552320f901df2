"""Queueing requests onto a model version's stream (gateway side).

``max_queue_size`` (Triton ``ModelQueuePolicy``) is enforced at ``XADD`` time by
a Lua script (``broker.scripts.BOUNDED_XADD``), atomically: a request is refused
when the stream already holds that many entries that no instance has taken yet
(stream length minus the consumer group's pending count). A request whose client
cancels it while it is still queued is taken off its stream again (:meth:`Producer.cancel`).
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from sluice.broker.codec import encode_request
from sluice.broker.errors import BROKER_OUTAGE, ErrorCode, FailureReason, SluiceError
from sluice.broker.keys import WORKER_GROUP, hash_tag
from sluice.broker.messages import InferRequestMessage
from sluice.broker.multiplex import MultiplexedConnection
from sluice.broker.scripts import BOUNDED_XADD, CANCEL_QUEUED
from sluice.broker.sequences import SEQ_SUBMIT, SequenceStepInfo, missing_start
from sluice.broker.stats_store import StatsDelta

#: stream entry field that holds the encoded request.
PAYLOAD_FIELD = b"m"

QUEUE_FULL = "Exceeds maximum queue size"


class Producer:
    """Puts requests on streams; one per gateway process.

    Args:
        connection: the gateway's multiplexed connection (``XADD`` of concurrent
            requests share writes).
    """

    def __init__(self, connection: MultiplexedConnection) -> None:
        self._connection = connection
        connection.keep_loaded(BOUNDED_XADD, CANCEL_QUEUED)

    def submit(
        self, stream: str, message: InferRequestMessage, max_queue_size: int = 0
    ) -> asyncio.Future[Any]:
        """Queue one request on ``stream`` now; the future ends when Redis has taken it.

        No await: the ``XADD`` leaves with this event-loop iteration's other commands.

        Args:
            stream: the stream of the request's model version and priority level.
            message: the request.
            max_queue_size: Triton ``max_queue_size`` of the level; 0 = unbounded.

        Returns:
            A future of the new entry's id (bytes, what ``XADD`` answers; :meth:`cancel`
            takes it), that raises ``SluiceError`` UNAVAILABLE "Exceeds maximum queue size"
            when the queue is full, or a ``redis.exceptions.RedisError`` when Redis cannot
            be reached or does not answer (:func:`enqueue_error` turns it into Triton's).
        """
        payload = encode_request(message)
        if max_queue_size <= 0:
            return self._connection.call("XADD", stream, "*", PAYLOAD_FIELD, payload)
        return asyncio.ensure_future(self._bounded(stream, message.model, payload, max_queue_size))

    async def _bounded(self, stream: str, model: str, payload: bytes, max_queue_size: int) -> bytes:
        entry_id = await self._connection.script(
            BOUNDED_XADD, [stream], [max_queue_size, WORKER_GROUP, payload]
        )
        if not entry_id:
            raise SluiceError(ErrorCode.UNAVAILABLE, QUEUE_FULL, model=model)
        return bytes(entry_id)

    async def cancel(
        self,
        stream: str,
        entry_id: bytes,
        stats_key: str,
        request_ns: int,
        reason: FailureReason = FailureReason.CANCELED,
    ) -> bool:
        """Take a cancelled request off ``stream`` and count it as failed, reason CANCELED,
        if no instance has taken it yet (Triton ``request_cancellation.md``: a request
        cancelled while it waits in the scheduler queue is not executed; Triton counts it
        in ``nv_inference_request_failure{reason="CANCELED"}``). A request whose queue
        timeout or deadline passed is taken off the same way, with ``reason`` REJECTED.

        One script (``broker.scripts.CANCEL_QUEUED``), atomic: the entry is deleted only
        when it is not in the consumer group's pending list, so an instance that already
        read it runs it (its answer finds nobody waiting and is dropped). The
        ``max_queue_size`` count (stream length minus pending) stays right.

        Args:
            stream: the stream the request was queued on.
            entry_id: its entry id, as :meth:`submit`'s future gave it.
            stats_key: the model version's statistics hash (``KeySchema.stats``).
            request_ns: how long the request lived before it was cancelled, in ns
                (added to ``fail_ns``).
            reason: the failure reason it is counted with.

        Returns:
            True when the entry was taken off and counted; False when an instance holds
            it (or it is no longer on the stream).

        Raises:
            redis.exceptions.RedisError: Redis unreachable or silent (``MultiplexedConnection``).
        """
        delta = StatsDelta()
        delta.failure(request_ns=request_ns, reason=reason)
        if hash_tag(stream) == hash_tag(stats_key):
            done = await self._connection.script(
                CANCEL_QUEUED, [stream, stats_key], [WORKER_GROUP, entry_id, delta.counter_text()]
            )
            return bool(done)
        # a queue shard of its own slot (``StreamLayout``): a Redis Cluster runs a script
        # on one slot only, so the counts follow once the entry is off its stream
        done = await self._connection.script(CANCEL_QUEUED, [stream], [WORKER_GROUP, entry_id, ""])
        if done:
            await self._connection.run_all(
                [("HINCRBY", stats_key, name, n) for name, n in delta.counts.items()]
            )
        return bool(done)


async def submit_step(
    connection: MultiplexedConnection,
    keys: tuple[str, str, str],
    message: InferRequestMessage,
    step: SequenceStepInfo,
    stale_ns: int,
    expire_ms: int,
) -> bytes:
    """Queue one step of a sequence on the stream of the instance the sequence is bound
    to (``broker.sequences.SEQ_SUBMIT``).

    Args:
        connection: the gateway's multiplexed connection.
        keys: the sequence hash, the version's instances hash and the sequence stream
            key without its instance name.
        message: the request.
        step: its correlation id and flags.
        stale_ns: heartbeat age past which an instance counts as gone, in ns.
        expire_ms: how long the sequence's hash lives without another step, in ms.

    Returns:
        The new entry's id.

    Raises:
        SluiceError: INVALID_ARG (no START on a sequence that is not live) or UNAVAILABLE
            (the model has no instance).
        redis.exceptions.RedisError: Redis unreachable.
    """
    sequence_key, instances_key, stream_prefix = keys
    reply = await connection.script(
        SEQ_SUBMIT,
        [sequence_key, instances_key],
        [
            int(step.start), int(step.end), time.time_ns(), stale_ns,
            random.getrandbits(31), expire_ms, encode_request(message), stream_prefix,
        ],
    )  # fmt: skip
    if reply[0] == 0:
        raise missing_start(message.model, step.corrid)
    if reply[0] == -1:
        raise SluiceError(
            ErrorCode.UNAVAILABLE,
            f"model '{message.model}' version {message.version} has no instance to run "
            f"sequence {step.corrid}",
            model=message.model,
        )
    return bytes(reply[0])


def enqueue_error(exc: BaseException, model: str) -> BaseException:
    """What a failed :meth:`Producer.submit` means to the client: a ``SluiceError`` as is,
    Redis unreachable, silent or full (:data:`BROKER_OUTAGE`) as UNAVAILABLE "broker
    unavailable for model ..."; anything else unchanged."""
    if isinstance(exc, BROKER_OUTAGE):
        return SluiceError(
            ErrorCode.UNAVAILABLE, f"broker unavailable for model '{model}': {exc}", model=model
        )
    return exc
