"""Queueing requests onto a model version's stream (gateway side).

``max_queue_size`` (Triton ``ModelQueuePolicy``) is enforced at ``XADD`` time by
a Lua script (``broker.scripts.BOUNDED_XADD``), atomically: a request is refused
when the stream already holds that many entries that no instance has taken yet
(stream length minus the consumer group's pending count).
"""

from __future__ import annotations

import redis.exceptions

from broker.codec import encode_request
from broker.errors import ErrorCode, SluiceError
from broker.keys import WORKER_GROUP
from broker.messages import InferRequestMessage
from broker.multiplex import MultiplexedConnection
from broker.scripts import BOUNDED_XADD

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

    async def enqueue(
        self, stream: str, message: InferRequestMessage, max_queue_size: int = 0
    ) -> None:
        """``XADD`` one request to ``stream``, refusing it when the queue is full.

        Args:
            stream: the stream of the request's model version and priority level.
            message: the request.
            max_queue_size: Triton ``max_queue_size`` of the level; 0 = unbounded.

        Raises:
            SluiceError: UNAVAILABLE "Exceeds maximum queue size" when full, or when
                Redis cannot be reached or does not answer.
        """
        payload = encode_request(message)
        try:
            if max_queue_size <= 0:
                await self._connection.call("XADD", stream, "*", PAYLOAD_FIELD, payload)
                return
            added = await self._connection.script(
                BOUNDED_XADD, [stream], [max_queue_size, WORKER_GROUP, payload]
            )
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise SluiceError(
                ErrorCode.UNAVAILABLE,
                f"broker unavailable for model '{message.model}': {exc}",
                model=message.model,
            ) from exc
        if not added:
            raise SluiceError(ErrorCode.UNAVAILABLE, QUEUE_FULL, model=message.model)
