"""Queueing requests onto a model version's stream (gateway side)."""

from __future__ import annotations

import redis.asyncio
import redis.exceptions

from broker.codec import encode_request
from broker.errors import ErrorCode, SluiceError
from broker.keys import KeySchema
from broker.messages import InferRequestMessage

#: stream entry field that holds the encoded request.
PAYLOAD_FIELD = b"m"


async def enqueue(
    client: redis.asyncio.Redis, keys: KeySchema, message: InferRequestMessage
) -> None:
    """``XADD`` one request to ``sluice:{model}:q:<version>``.

    Raises:
        SluiceError: UNAVAILABLE when Redis cannot be reached.
    """
    try:
        await client.xadd(
            keys.queue(message.model, message.version), {PAYLOAD_FIELD: encode_request(message)}
        )
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        raise SluiceError(
            ErrorCode.UNAVAILABLE,
            f"broker unavailable for model '{message.model}': {exc}",
            model=message.model,
        ) from exc
