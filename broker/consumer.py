"""The worker's side of a model version's streams: read, reply, acknowledge, recover.

One model instance is one consumer of the consumer group ``WORKER_GROUP`` on
each stream of its model version (one stream per priority level), so
instances share the load with no coordinator. After replying, an entry is
acknowledged and deleted, so a stream only holds work that is queued or in
flight. Entries left pending by an instance that died are claimed by a live
one (``XCLAIM``) once the dead instance's heartbeat is older than a bound.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import redis
import redis.exceptions

from sluice.broker.cluster import is_cluster_client
from sluice.broker.cluster_direct import ClusterDirectConnection
from sluice.broker.codec import CodecError, decode_request, encode_response
from sluice.broker.direct import DirectConnection
from sluice.broker.errors import BROKER_OUTAGE
from sluice.broker.keys import WORKER_GROUP, hash_tag
from sluice.broker.messages import InferRequestMessage, InferResponseMessage
from sluice.broker.producer import PAYLOAD_FIELD
from sluice.broker.sequences import DONE_FIELD, STEP_FIELD
from sluice.broker.stats_store import StatsDelta, StatsShard

logger = logging.getLogger(__name__)

#: longest wait of a read on the home slot of a queue split over several slots of a Redis
#: Cluster before the other slots are read again, in ms (``StreamConsumer.read``).
SHARD_POLL_MS = 10

#: reply lists expire this long after their last push, in seconds, so the
#: list of a gateway that died does not stay in Redis.
REPLY_TTL_S = 300


@dataclass(slots=True)
class Delivery:
    """One stream entry handed to this instance."""

    stream: str
    entry_id: bytes
    message: InferRequestMessage
    deliveries: int = 1
    """How many times an instance was handed this entry (> 1 after a crash)."""
    step: int = 0
    """A sequence step's number within its correlation id (0: not a sequence step)."""
    known_done: int = 0
    """A sequence step's ``done`` count when it was queued (``broker.sequences``)."""


class StreamConsumer:
    """Reads a model version's streams as one consumer of the instance group.

    Reads and finishes go through a :class:`DirectConnection` of their own (one
    thread, the instance loop, uses them; one per primary of a Redis Cluster:
    ``broker.cluster_direct``); recovery (``XPENDING``/``XCLAIM``) uses the
    client.

    Args:
        client: a synchronous Redis client (RESP2 replies, bytes).
        streams: the version's stream keys, highest priority first.
        consumer: this instance's name within the group.
        home: a stream of the hash slot whose streams a read waits on when the streams
            span several slots of a Redis Cluster (default: the first stream's).
        shards: the queue shards of each priority level (``StreamLayout.shards``). With
            several, a read takes ⌈count / shards⌉ entries per stream, so that an instance
            holds about a batch, not a batch per shard (what it holds runs even if its
            client cancels), and hands them over in the order the gateways queued them
            (their ``enqueued_ns``), not stream by stream, so that a level's requests
            reach the batcher in arrival order.
    """

    def __init__(
        self,
        client: redis.Redis,
        streams: Sequence[str],
        consumer: str,
        home: str | None = None,
        shards: int = 1,
    ) -> None:
        self._redis = client
        self._direct: DirectConnection | ClusterDirectConnection
        self._cluster = is_cluster_client(client)
        if self._cluster:
            self._direct = ClusterDirectConnection(client)
        else:
            self._direct = DirectConnection(client)
        self.consumer = consumer
        self._home = hash_tag(home or streams[0])
        self._shards = max(1, shards)
        self.streams: list[str] = []
        self._groups: list[list[str]] = []
        self._set_streams(streams)
        #: finish commands held back to travel with the next read (see ``finish(defer=True)``)
        self._deferred: list[tuple[object, ...]] = []
        #: commands sent ahead (:meth:`send_ahead`) whose replies were not read yet
        self._sent: list[tuple[object, ...]] = []

    def ensure_groups(self) -> None:
        """Create the consumer group (and stream) of every stream if missing."""
        for stream in self.streams:
            ensure_group(self._redis, stream)

    def adopt(self, stream: str) -> bool:
        """Read ``stream`` too from now on (the sequence stream of an instance that is
        gone: its queued steps run here); False when it is read already."""
        if stream in self.streams:
            return False
        ensure_group(self._redis, stream)
        self._set_streams([*self.streams, stream])
        return True

    def abandon(self, stream: str) -> None:
        """Stop reading an adopted ``stream`` (:meth:`adopt`)."""
        if stream in self.streams:
            self._set_streams([s for s in self.streams if s != stream])

    def _set_streams(self, streams: Sequence[str]) -> None:
        """Read ``streams`` from now on: in one ``XREADGROUP``, or on a Redis Cluster one
        per hash slot (a command's keys must share a slot there), the home slot's first."""
        self.streams = list(streams)
        if not self._cluster:
            self._groups = [self.streams] if self.streams else []
            return
        groups: dict[str, list[str]] = {}
        for stream in self.streams:
            groups.setdefault(hash_tag(stream), []).append(stream)
        home = groups.pop(self._home, None)
        self._groups = [home, *groups.values()] if home else list(groups.values())

    def _read_command(
        self, streams: Sequence[str], count: int, block_ms: int | None, own_pending: bool
    ) -> tuple[object, ...]:
        block = () if block_ms is None else ("BLOCK", max(1, block_ms))
        start = "0" if own_pending else ">"
        return (
            "XREADGROUP", "GROUP", WORKER_GROUP, self.consumer, "COUNT", count, *block,
            "STREAMS", *streams, *[start] * len(streams),
        )  # fmt: skip

    def read(self, count: int, block_ms: int | None, own_pending: bool = False) -> list[Delivery]:
        """Take up to ``count`` new entries per stream.

        Deferred finish commands go first, in the same write. Streams in several hash
        slots of a Redis Cluster (a sharded queue, ``StreamLayout``) are read with one
        ``XREADGROUP`` per slot in the same round trip, without waiting; when none has an
        entry, a second read waits on the home slot's streams (the shard this instance
        waits on: other instances wait on the others) for at most :data:`SHARD_POLL_MS`,
        so an entry of a shard no instance waits on is taken within that time.

        Args:
            count: most entries per priority level (per stream; split over a level's
                shards).
            block_ms: wait at most this long (≥ 1 ms) for an entry; ``None`` = do not wait.
            own_pending: read this consumer's pending entries instead of new ones
                (``XREADGROUP`` with id ``0``; their :attr:`Delivery.deliveries` is 1,
                though Redis counts one more delivery).

        Raises:
            redis.exceptions.RedisError: Redis unreachable, or a deferred finish failed.
                When Redis is unreachable the deferred commands are kept for the next
                read or :meth:`flush`.
        """
        if self._shards > 1 and not own_pending:
            count = -(-count // self._shards)
        if len(self._groups) == 1:
            read = self._read_command(self._groups[0], count, block_ms, own_pending)
            deliveries = self._decode(
                self._run_deferred(read, last_blocks=block_ms is not None)[-1]
            )
        else:
            reads = [self._read_command(g, count, None, own_pending) for g in self._groups]
            replies = self._run_deferred(*reads)[-len(reads) :] if reads else []
            deliveries = [d for reply in replies for d in self._decode(reply)]
            if not deliveries and block_ms is not None and not own_pending and reads:
                wait_ms = min(block_ms, SHARD_POLL_MS)
                wait = self._read_command(self._groups[0], count, wait_ms, False)
                deliveries = self._decode(self._run_deferred(wait, last_blocks=True)[-1])
        if self._shards > 1 and len(deliveries) > 1:
            deliveries.sort(key=_arrival)
        return deliveries

    def flush(self) -> None:
        """Send the deferred finish commands now (before a new execution, before stopping).

        Raises:
            redis.exceptions.RedisError: Redis unreachable (the commands are kept for the
                next read or flush) or a script failed.
        """
        if self._deferred or self._sent:
            self._run_deferred()

    def defer(self, commands: Sequence[tuple[object, ...]]) -> None:
        """Hold plain ``commands`` back to travel with the next read or flush (their
        replies are checked for errors like a finish's)."""
        self._deferred.extend(commands)

    def _run_deferred(self, *more: tuple[object, ...], last_blocks: bool = False) -> list[object]:
        """The deferred commands and ``more`` in one round trip. When Redis cannot be
        reached, or refuses one of them for want of memory (:data:`BROKER_OUTAGE`: the
        others ran, an ``XACK`` perhaps, but an answer's ``RPUSH`` did not), the deferred
        ones are kept (they may have run: replies are dropped as duplicates by the
        gateway, ``XACK``/``XDEL`` are idempotent, statistics are written as totals) and
        the connection is dropped, so that no reply of the lost round trip is read as one
        of the next."""
        deferred, self._deferred = self._deferred, []
        sent, self._sent = self._sent, []
        try:
            return self._run([*deferred, *more], last_blocks)
        except BROKER_OUTAGE:
            self._deferred = [*sent, *deferred, *self._deferred]
            self._direct.close()
            raise

    def read_own_pending(self, count: int = 1000) -> list[Delivery]:
        """Entries this consumer name was given but never acknowledged (a restarted instance).

        They are re-claimed (``XCLAIM``), which counts one more delivery, so an entry that
        kills its instance every time is noticed (:attr:`Delivery.deliveries`).
        """
        return self._claim_pending(self.consumer, 0, count)

    def claim_from(self, dead: str, min_idle_ms: int, count: int = 1000) -> list[Delivery]:
        """Claim the pending entries of consumer ``dead`` that have been idle ≥ ``min_idle_ms``."""
        claimed = self._claim_pending(dead, min_idle_ms, count)
        if claimed:
            logger.warning("claimed %d entries of dead instance %s", len(claimed), dead)
        return claimed

    def _claim_pending(self, owner: str, min_idle_ms: int, count: int) -> list[Delivery]:
        claimed: list[Delivery] = []
        for stream in self.streams:
            pending = self._redis.xpending_range(
                stream, WORKER_GROUP, min="-", max="+", count=count, consumername=owner
            )
            if not pending:
                continue
            times = {p["message_id"]: int(p["times_delivered"]) for p in pending}
            entries = self._redis.xclaim(
                stream, WORKER_GROUP, self.consumer, min_idle_ms, list(times)
            )
            for delivery in self._decode([[stream.encode(), entries]]):
                delivery.deliveries = times.get(delivery.entry_id, 0) + 1
                claimed.append(delivery)
        return claimed

    def finish(
        self,
        responses: Sequence[tuple[str, InferResponseMessage]],
        entries: Sequence[Delivery],
        stats: StatsShard | None = None,
        delta: StatsDelta | None = None,
        defer: bool = False,
        before: Sequence[tuple[object, ...]] = (),
    ) -> None:
        """Push each ``(reply_key, response)``, XACK + XDEL ``entries``, add ``delta`` to ``stats``.

        One round trip of plain commands: ``RPUSH`` and ``EXPIRE`` (renewed TTL,
        :data:`REPLY_TTL_S`) per reply list, ``XACK`` and ``XDEL`` per stream, and the
        shard's ``HSET`` of totals (:meth:`StatsShard.apply`; ``stats`` None: nothing is
        counted). No script: Redis writes a blocked gateway its answer only after the
        whole pipeline ran, so every µs of it delays the answer, and a script costs Redis
        several times the time of the same plain commands. Each command may run twice
        (a pipeline retried after a lost connection) without harm: ``XACK``/``XDEL`` are
        idempotent, the ``HSET`` writes totals, the gateway drops a duplicate reply.
        With ``defer`` the ``RPUSH``/``EXPIRE`` leave at once in a write of their own,
        without waiting for Redis's reply (:meth:`send_ahead`), and the rest waits for
        the next :meth:`read` or :meth:`flush` and shares its write and round trip: the
        answers do not wait for the loop's bookkeeping. Without ``defer`` everything is
        sent and its replies read at once;
        either way commands that could not reach Redis are kept for the next read or flush.
        ``before``: commands that go ahead of the replies in the same write (the commits
        of sequence steps, ``broker.sequences.SEQ_COMMIT``).

        Raises:
            redis.exceptions.RedisError: Redis unreachable.
        """
        commands = [*before, *_pushes(responses)]
        if defer and commands:
            self.send_ahead(commands)
            commands = []
        by_stream: dict[str, list[bytes]] = {}
        for delivery in entries:
            by_stream.setdefault(delivery.stream, []).append(delivery.entry_id)
        for stream, ids in by_stream.items():
            commands.append(("XACK", stream, WORKER_GROUP, *ids))
            commands.append(("XDEL", stream, *ids))
        if stats is not None and delta is not None:
            commands.extend(stats.apply(delta))
        self._deferred.extend(commands)
        if not defer:
            self.flush()  # kept for the next read or flush if Redis cannot be reached

    def send_replies(
        self,
        responses: Sequence[tuple[str, InferResponseMessage]],
        then: Sequence[tuple[object, ...]] = (),
        before: Sequence[tuple[object, ...]] = (),
    ) -> None:
        """Push each ``(reply_key, response)`` now (:meth:`send_ahead`), followed in the
        same write by the plain commands ``then`` (the statistics that count them), before
        the execution's other bookkeeping: its :meth:`finish` follows with no responses.

        Raises:
            redis.exceptions.RedisError: Redis unreachable (the commands are kept).
        """
        commands = [*before, *_pushes(responses), *then]
        if commands:
            self.send_ahead(commands)

    def send_ahead(self, commands: Sequence[tuple[object, ...]]) -> None:
        """Send plain ``commands`` now without waiting for Redis's reply (read with the
        next round trip); until that round trip succeeds they are kept, to be sent again
        if the connection is lost (they may have run: see :meth:`finish`).

        Raises:
            redis.exceptions.RedisError: Redis unreachable (the commands are kept).
        """
        self._sent.extend(commands)
        try:
            self._direct.send(commands)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            self._deferred = [*self._sent, *self._deferred]
            self._sent = []
            raise

    def _run(
        self, commands: Sequence[tuple[object, ...]], last_blocks: bool = False
    ) -> list[object]:
        """One pipelined round trip; the first error reply is raised."""
        replies = self._direct.pipeline(commands, last_blocks)
        for reply in replies:
            if isinstance(reply, redis.exceptions.ResponseError):
                raise reply
        return replies

    def close(self) -> None:
        """Close the direct connection."""
        self._direct.close()

    def _decode(self, reply: object) -> list[Delivery]:
        deliveries: list[Delivery] = []
        bad: list[Delivery] = []
        for raw_stream, entries in reply or ():  # type: ignore[union-attr]
            stream = raw_stream.decode() if isinstance(raw_stream, bytes) else raw_stream
            for entry_id, fields in entries:
                if fields is None:  # deleted while pending
                    continue
                try:
                    message = decode_request(_payload(fields))
                except (CodecError, KeyError):
                    logger.exception("dropping undecodable entry %s on %s", entry_id, stream)
                    bad.append(Delivery(stream, entry_id, None))  # type: ignore[arg-type]
                    continue
                delivery = Delivery(stream, entry_id, message)
                if len(fields) > 2:  # a sequence step: its number and done count
                    _step_fields(delivery, fields)
                deliveries.append(delivery)
        if bad:
            self.finish([], bad)
        return deliveries


def _arrival(delivery: Delivery) -> int:
    return delivery.message.enqueued_ns


def _pushes(responses: Sequence[tuple[str, InferResponseMessage]]) -> list[tuple[object, ...]]:
    """``RPUSH`` (the encoded responses) and ``EXPIRE`` (:data:`REPLY_TTL_S`) per reply list."""
    by_reply: dict[str, list[bytes]] = {}
    for reply_key, response in responses:
        by_reply.setdefault(reply_key, []).append(encode_response(response))
    commands: list[tuple[object, ...]] = []
    for key, payloads in by_reply.items():
        commands.append(("RPUSH", key, *payloads))
        commands.append(("EXPIRE", key, REPLY_TTL_S))
    return commands


def ensure_group(client: redis.Redis, stream: str) -> None:
    """``XGROUP CREATE stream WORKER_GROUP 0 MKSTREAM``, ignoring BUSYGROUP."""
    try:
        client.xgroup_create(stream, WORKER_GROUP, id="0", mkstream=True)
    except redis.exceptions.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def _step_fields(delivery: Delivery, fields: object) -> None:
    """Set a sequence step's number and known ``done`` count from its entry's fields."""
    pairs = fields.items() if isinstance(fields, dict) else zip(*[iter(fields)] * 2, strict=False)  # type: ignore[call-overload]
    for name, value in pairs:
        if name == STEP_FIELD:
            delivery.step = int(value)
        elif name == DONE_FIELD:
            delivery.known_done = int(value)


def _payload(fields: object) -> bytes:
    """The request bytes of an entry's fields: a raw ``[name, value, …]`` list or a dict."""
    if type(fields) is list and len(fields) == 2 and fields[0] == PAYLOAD_FIELD:
        return fields[1]  # what the gateway's XADD writes
    if isinstance(fields, dict):
        return fields[PAYLOAD_FIELD]
    items = iter(fields)  # type: ignore[call-overload]
    for name, value in zip(items, items, strict=False):
        if name == PAYLOAD_FIELD:
            return value
    raise KeyError(PAYLOAD_FIELD)
