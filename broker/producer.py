"""Queueing requests onto a model version's stream (gateway side).

``max_queue_size`` (Triton ``ModelQueuePolicy``) is enforced at ``XADD`` time by
a Lua script, atomically: a request is refused when the stream already holds
that many entries that no instance has taken yet (stream length minus the
consumer group's pending count).
"""

from __future__ import annotations

import redis.asyncio
import redis.exceptions

from broker.codec import encode_request
from broker.errors import ErrorCode, SluiceError
from broker.keys import WORKER_GROUP
from broker.messages import InferRequestMessage

#: stream entry field that holds the encoded request.
PAYLOAD_FIELD = b"m"

QUEUE_FULL = "Exceeds maximum queue size"

_BOUNDED_XADD = """
local max = tonumber(ARGV[1])
local len = redis.call('XLEN', KEYS[1])
if len >= max then
  local ok, pending = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[2])
  local taken = 0
  if ok and pending then taken = pending[1] end
  if len - taken >= max then return 0 end
end
redis.call('XADD', KEYS[1], '*', 'm', ARGV[3])
return 1
"""


class Producer:
    """Puts requests on streams; one per gateway process.

    Args:
        client: the gateway's Redis client.
    """

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._redis = client
        self._bounded = client.register_script(_BOUNDED_XADD)

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
                Redis cannot be reached.
        """
        payload = encode_request(message)
        try:
            if max_queue_size <= 0:
                await self._redis.xadd(stream, {PAYLOAD_FIELD: payload})
                return
            added = await self._bounded(keys=[stream], args=[max_queue_size, WORKER_GROUP, payload])
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise SluiceError(
                ErrorCode.UNAVAILABLE,
                f"broker unavailable for model '{message.model}': {exc}",
                model=message.model,
            ) from exc
        if not added:
            raise SluiceError(ErrorCode.UNAVAILABLE, QUEUE_FULL, model=message.model)
