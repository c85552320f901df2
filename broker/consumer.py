"""The worker's side of a model stream: read, reply, acknowledge (synchronous).

One model instance is one consumer of the consumer group ``WORKER_GROUP`` on
its model version's stream, so instances share the load with no coordinator.
After replying, an entry is acknowledged and deleted so the stream only holds
work that is queued or in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import redis
import redis.exceptions

from broker.codec import CodecError, decode_request, encode_response
from broker.keys import WORKER_GROUP, KeySchema
from broker.messages import InferRequestMessage, InferResponseMessage
from broker.producer import PAYLOAD_FIELD

logger = logging.getLogger(__name__)

#: reply lists expire this long after their last push, in seconds, so the
#: list of a gateway that died does not stay in Redis.
REPLY_TTL_S = 300


@dataclass(frozen=True, slots=True)
class Delivery:
    """One stream entry handed to this instance."""

    entry_id: bytes
    message: InferRequestMessage


class StreamConsumer:
    """Reads a model version's stream as one consumer of the instance group.

    Args:
        client: a synchronous Redis client (RESP2 replies, bytes).
        keys: the key schema.
        model: model name.
        version: model version.
        consumer: this instance's name within the group.
    """

    def __init__(
        self, client: redis.Redis, keys: KeySchema, model: str, version: int, consumer: str
    ) -> None:
        self._redis = client
        self.stream = keys.queue(model, version)
        self.consumer = consumer

    def ensure_group(self) -> None:
        """Create the consumer group (and stream) if missing; reads start at the first entry."""
        ensure_group(self._redis, self.stream)

    def read(self, count: int, block_ms: int) -> list[Delivery]:
        """Take up to ``count`` new entries, waiting at most ``block_ms`` (never 0 = forever).

        Undecodable entries are acknowledged, deleted and logged.
        """
        block_ms = max(1, block_ms)
        reply = self._redis.xreadgroup(
            WORKER_GROUP, self.consumer, {self.stream: ">"}, count=count, block=block_ms
        )
        deliveries: list[Delivery] = []
        bad: list[bytes] = []
        for _stream, entries in reply or ():
            for entry_id, fields in entries:
                try:
                    deliveries.append(Delivery(entry_id, decode_request(fields[PAYLOAD_FIELD])))
                except (CodecError, KeyError):
                    logger.exception("dropping undecodable entry %s on %s", entry_id, self.stream)
                    bad.append(entry_id)
        if bad:
            self.finish([], bad)
        return deliveries

    def finish(
        self, responses: Sequence[tuple[str, InferResponseMessage]], entry_ids: Sequence[bytes]
    ) -> None:
        """Push each ``(reply_key, response)``, then XACK + XDEL ``entry_ids``: one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        for reply_key, response in responses:
            pipe.rpush(reply_key, encode_response(response))
            pipe.expire(reply_key, REPLY_TTL_S)
        if entry_ids:
            pipe.xack(self.stream, WORKER_GROUP, *entry_ids)
            pipe.xdel(self.stream, *entry_ids)
        pipe.execute()


def ensure_group(client: redis.Redis, stream: str) -> None:
    """``XGROUP CREATE stream WORKER_GROUP 0 MKSTREAM``, ignoring BUSYGROUP."""
    try:
        client.xgroup_create(stream, WORKER_GROUP, id="0", mkstream=True)
    except redis.exceptions.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
