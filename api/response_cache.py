"""The gateway's side of the response cache: look up, answer a hit, store what ran.

A request for a model with ``response_cache { enable: true }``, on a server started
with ``--cache-config local,size=<bytes>``, is first looked up in Redis
(``broker.response_cache``). A hit is answered at once with the stored outputs under
the request's own id and never reaches a model instance; a miss is queued as usual,
and its answer, when it succeeded, is stored for the next identical request.

Statistics as Triton counts them (docs/reference/model-configuration.md, Response
cache): a hit counts in ``success``,
``queue`` (0 ns) and ``cache_hit`` (the lookup's duration), and in the request and queue
latency summaries, not in ``compute_*``, ``inference_count`` or ``execution_count``; a
miss counts in ``cache_miss`` with the lookup and insert durations, and runs (and
counts) as any request. A lookup that
Redis fails is treated as a miss; a failed insert only loses the entry.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Callable

import redis.exceptions

from sluice.broker.codec import CodecError, decode_response, encode_response
from sluice.broker.keys import KeySchema
from sluice.broker.latency_window import LatencyRecorder
from sluice.broker.messages import InferRequestMessage, InferResponseMessage
from sluice.broker.multiplex import MultiplexedConnection
from sluice.broker.response_cache import CACHE_INSERT, CACHE_LOOKUP, request_digest

__all__ = ["ResponseCache"]

logger = logging.getLogger(__name__)

Enqueue = Callable[[], "asyncio.Future[InferResponseMessage]"]


class ResponseCache:
    """Response cache of one gateway process (the entries are shared through Redis).

    Args:
        connection: the gateway's multiplexed Redis connection.
        keys: the deployment's key schema.
        size_bytes: the most bytes of encoded responses the cache holds (> 0).
    """

    def __init__(self, connection: MultiplexedConnection, keys: KeySchema, size_bytes: int) -> None:
        self._connection = connection
        connection.keep_loaded(CACHE_LOOKUP, CACHE_INSERT)  # an insert never waits on NOSCRIPT
        self._keys = keys
        self.size_bytes = size_bytes
        self._lru = keys.cache_lru()
        self._bytes = keys.cache_bytes()
        self._stats = keys.cache_stats()
        #: statistics and inserts being written (kept referenced until done)
        self._background: set[asyncio.Future[None]] = set()

    def submit(
        self, message: InferRequestMessage, enqueue: Enqueue
    ) -> asyncio.Future[InferResponseMessage]:
        """Answer ``message`` from the cache, or run ``enqueue`` (which queues it and
        returns the future of its response) and store a successful answer.

        Args:
            message: the request, validated; keyed on its ``load_id`` (the serving
                version's ``VersionState.load_id``) with its inputs and outputs.
            enqueue: queues the request; returns the future of its response.

        Returns:
            The future of the response. Cancelling it (the client went away) before the
            lookup returned queues nothing; after, it cancels the queued request.
        """
        loop = asyncio.get_running_loop()
        outer: asyncio.Future[InferResponseMessage] = loop.create_future()
        load_id = message.load_id
        entry = self._keys.cache_entry(
            request_digest(
                message.model,
                message.version,
                load_id,
                message.inputs,
                message.outputs,
                message.classification,
            )
        )
        started = time.perf_counter_ns()
        lookup = asyncio.ensure_future(
            self._connection.script(CACHE_LOOKUP, [entry, self._lru], [time.time_ns() // 10**6])
        )
        lookup.add_done_callback(
            functools.partial(self._looked_up, outer, message, entry, load_id, enqueue, started)
        )
        return outer

    def _looked_up(
        self,
        outer: asyncio.Future[InferResponseMessage],
        message: InferRequestMessage,
        entry: str,
        load_id: str,
        enqueue: Enqueue,
        started: int,
        lookup: asyncio.Future[bytes | None],
    ) -> None:
        lookup_ns = time.perf_counter_ns() - started
        if outer.done():  # the client went away while it was looked up
            return
        found: InferResponseMessage | None = None
        if not lookup.cancelled():
            if lookup.exception() is not None:
                logger.debug("response cache lookup failed: %s", lookup.exception())
            elif lookup.result():
                try:
                    found = decode_response(lookup.result())
                except CodecError:
                    logger.warning("dropping an undecodable response cache entry %s", entry)
        if found is not None and found.error is not None:
            found = None  # never stored; read as a miss
        self._count_cache(
            {"hits" if found is not None else "misses": 1, "lookups": 1, "lookup_ns": lookup_ns}
        )
        if found is not None:
            outer.set_result(dataclasses.replace(found, request_id=message.request_id))
            self._count(
                message,
                {
                    "success_count": 1,
                    "success_ns": lookup_ns,
                    "queue_count": 1,
                    "cache_hit_count": 1,
                    "cache_hit_ns": lookup_ns,
                },
            )
            return
        try:
            inner = enqueue()
        except BaseException as exc:  # refused at once (queue full, shutting down, ...)
            outer.set_exception(exc)
            return
        outer.add_done_callback(lambda f: inner.cancel() if f.cancelled() else None)
        inner.add_done_callback(
            functools.partial(self._answered, outer, message, entry, load_id, lookup_ns)
        )

    def _answered(
        self,
        outer: asyncio.Future[InferResponseMessage],
        message: InferRequestMessage,
        entry: str,
        load_id: str,
        lookup_ns: int,
        inner: asyncio.Future[InferResponseMessage],
    ) -> None:
        if outer.done():
            return
        if inner.cancelled():
            outer.cancel()
            return
        if (exc := inner.exception()) is not None:
            outer.set_exception(exc)
            return
        response = inner.result()
        outer.set_result(response)
        # only successful answers are stored (Triton), and only under the load that
        # computed them: during a reload an instance of the older load may still answer
        # a request keyed on the new one
        if response.error is None and response.load_id == load_id:
            self._spawn(self._store(message, entry, response, lookup_ns))

    async def _store(
        self,
        message: InferRequestMessage,
        entry: str,
        response: InferResponseMessage,
        lookup_ns: int,
    ) -> None:
        started = time.perf_counter_ns()
        payload = encode_response(dataclasses.replace(response, request_id=""))
        evicted = 0
        try:
            evicted = await self._connection.script(
                CACHE_INSERT,
                [entry, self._lru, self._bytes],
                [payload, self.size_bytes, time.time_ns() // 10**6],
            )
        except redis.exceptions.RedisError as exc:
            logger.debug("response cache insert failed: %s", exc)
        insert_ns = time.perf_counter_ns() - started
        self._count_cache({"evictions": max(0, int(evicted)), "insert_ns": insert_ns})
        await self._write_counts(
            message, {"cache_miss_count": 1, "cache_miss_ns": lookup_ns + insert_ns}
        )

    def _count(self, message: InferRequestMessage, counts: dict[str, int]) -> None:
        self._spawn(self._write_counts(message, counts))

    def _count_cache(self, counts: dict[str, int]) -> None:
        """Add ``counts`` to the cache's own counters (Triton's ``nv_cache_*`` gauges)."""
        self._spawn(self._run([("HINCRBY", self._stats, k, n) for k, n in counts.items()]))

    async def _write_counts(self, message: InferRequestMessage, counts: dict[str, int]) -> None:
        """Add ``counts`` to the version's gateway statistics hash; a hit (it counts a
        success) also goes into the latency summaries, which include cached requests
        (Triton): its end-to-end time is its lookup, its queue time 0."""
        key = self._keys.stats(message.model, message.version)
        commands: list[tuple[object, ...]] = [
            ("HINCRBY", key, name, n) for name, n in counts.items()
        ]
        if "success_count" in counts:  # not a model inference: no last_inference
            now_ns = time.time_ns()
            hit = LatencyRecorder(self._keys.latency_window(message.model, message.version))
            hit.observe("request", counts["success_ns"] // 1000, now_ns)
            hit.observe("queue", 0, now_ns)
            commands += hit.flush(now_ns, force=True)
        await self._run(commands)

    async def _run(self, commands: list[tuple[object, ...]]) -> None:
        """Counters: a Redis that fails them only loses them."""
        try:
            await self._connection.run_all(commands)
        except redis.exceptions.RedisError as exc:
            logger.debug("response cache counters not written: %s", exc)

    def _spawn(self, work: object) -> None:
        task = asyncio.ensure_future(work)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)
