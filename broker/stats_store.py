"""Inference statistics kept in Redis, added to by every process (Triton's statistics extension).

A version's statistics are the sum of several hashes with the same fields:

* ``KeySchema.stats``: what the gateways count (a request rejected at the door, one
  cancelled in the queue), incremented with ``HINCRBY`` (a cancellation inside the
  script ``broker.scripts.CANCEL_QUEUED``);
* one ``KeySchema.stats_shard`` per model instance (:class:`StatsShard`): the instance
  keeps its totals in memory and writes the fields an execution changed, as totals,
  with one ``HSET`` in the same pipeline that acknowledges the batch. An ``HSET`` of
  totals costs Redis several times less than a script of ``HINCRBY``, and it is on the
  critical path of every answer (Redis writes a waiting gateway its answer only after
  the rest of the instance's pipeline ran), and sending it twice (a pipeline
  retried after a lost connection) counts nothing twice. The shards are listed in
  ``KeySchema.stats_shards``; an instance started again under its name goes on from
  its shard's totals, a stopping one (and the supervisor, for the instances it
  retires) folds its shard into the gateway hash (:func:`fold_stats_shards`), so
  shards do not pile up with reloads and scaling.

A version whose queue is split over shards (``queue_shards``) keeps each instance's shard,
shard list and fold-target hash under the hash tag of the queue shard the instance waits
on, so that a Redis Cluster spreads these writes with the queue; the tags in use are
listed in ``KeySchema.stats_tags`` (the model's own is always read).

:func:`read_stats` reads each tag's hashes in one script (a shard folded meanwhile
counts once: a fold stays within its tag) and adds them up (``last_inference_ms``: the
latest).
Field names:

* ``success_count``/``success_ns``, ``fail_count``/``fail_ns``, ``queue_count``/``queue_ns``,
  ``compute_input_count``/``_ns``, ``compute_infer_count``/``_ns``,
  ``compute_output_count``/``_ns`` — per request, durations in ns (Triton: a request in a
  batch is charged the whole batch's compute durations);
* ``inference_count`` (Σ batch sizes of successful requests), ``execution_count``;
* ``batch:<n>:count`` and ``batch:<n>:compute_{input,infer,output}_ns`` per executed batch size;
* ``fail_reason:<REASON>`` with Triton's metric reasons REJECTED, CANCELED, BACKEND, OTHER;
  ``cancel_ns`` (the CANCELED ones' share of ``fail_ns``);
* ``last_inference_ms`` (ms since the epoch).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio

from sluice.broker.errors import FailureReason
from sluice.broker.keys import KeySchema
from sluice.broker.latency_window import live_bucket_keys
from sluice.broker.scripts import FOLD_STATS, READ_STATS

FAIL_REASONS = tuple(FailureReason)
_DURATIONS = ("queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True, slots=True)
class ExecutionTimes:
    """Durations of one model execution (a batch), in ns."""

    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int


@dataclass(slots=True)
class StatsDelta:
    """Counter increments of one version, gathered in memory: added to an instance's
    :class:`StatsShard`, or sent by a gateway as ``HINCRBY`` commands or one script
    argument (:meth:`counter_text` for ``broker.scripts.CANCEL_QUEUED``)."""

    counts: dict[str, int] = field(default_factory=dict)
    last_inference_ms: int = 0

    def add(self, name: str, value: int) -> None:
        self.counts[name] = self.counts.get(name, 0) + value

    def execution(self, batch_size: int, times: ExecutionTimes) -> None:
        """One execution of ``batch_size`` (Triton ``execution_count``, ``batch_stats``)."""
        self.add("execution_count", 1)
        prefix = f"batch:{batch_size}:"
        self.add(prefix + "count", 1)
        self.add(prefix + "compute_input_ns", times.compute_input_ns)
        self.add(prefix + "compute_infer_ns", times.compute_infer_ns)
        self.add(prefix + "compute_output_ns", times.compute_output_ns)

    def successes(
        self,
        *,
        count: int,
        inferences: int,
        request_ns: int,
        queue_ns: int,
        times: ExecutionTimes,
        now_ms: int,
    ) -> None:
        """``count`` successful requests of one execution, added at once.

        Args:
            count: requests that succeeded.
            inferences: Σ of their batch sizes (a request without a batch dimension
                counts 1; Triton ``inference_count``).
            request_ns: Σ of their end-to-end durations, in ns.
            queue_ns: Σ of their queue durations, in ns.
            times: the execution's compute durations, charged to every request
                (Triton: a request in a batch is charged the whole batch's durations).
            now_ms: completion time, ms since the epoch (``last_inference_ms``).
        """
        counts = self.counts
        get = counts.get
        for name, ns in (
            ("success", request_ns),
            ("queue", queue_ns),
            ("compute_input", count * times.compute_input_ns),
            ("compute_infer", count * times.compute_infer_ns),
            ("compute_output", count * times.compute_output_ns),
        ):
            counts[name + "_count"] = get(name + "_count", 0) + count
            counts[name + "_ns"] = get(name + "_ns", 0) + ns
        counts["inference_count"] = get("inference_count", 0) + inferences
        if now_ms > self.last_inference_ms:
            self.last_inference_ms = now_ms

    def failure(self, *, request_ns: int, reason: FailureReason) -> None:
        """One failed request; ``reason`` is one of :data:`FAIL_REASONS`. A CANCELED one's
        duration is also kept apart (``cancel_ns``): it never reached the model, so it has
        no response to count in ``response_stats``."""
        self.add("fail_count", 1)
        self.add("fail_ns", max(0, request_ns))
        self.add(f"fail_reason:{reason}", 1)
        if reason == FailureReason.CANCELED:
            self.add("cancel_ns", max(0, request_ns))

    def counter_text(self) -> str:
        """The increments as ``"field delta field delta …"`` (``scripts.CANCEL_QUEUED``)."""
        return " ".join([f"{name} {value}" for name, value in self.counts.items()])


class StatsShard:
    """One model instance's statistics: totals in memory, written to its own hash.

    Args:
        key: the instance's hash (``KeySchema.stats_shard``).
        registry: the version's set of shards (``KeySchema.stats_shards``).
        totals: the hash's current fields (an instance started again goes on from them).
        tag: the hash tag of ``key`` when it is not the model's own (a queue shard's).
        tags_key: the version's set of such tags (``KeySchema.stats_tags``).
    """

    def __init__(
        self,
        key: str,
        registry: str,
        totals: Mapping[str, int] | None = None,
        tag: str | None = None,
        tags_key: str | None = None,
    ) -> None:
        self.key = key
        self.registry = registry
        self.totals: dict[str, int] = dict(totals or {})
        #: the hash tag the shard lives under (None: the model's own)
        self.tag = tag
        self._tag_listing: list[tuple[object, ...]] = (
            [("SADD", tags_key, tag)] if tag is not None and tags_key is not None else []
        )
        #: False until the shard was written whole and listed in the registry; set back to
        #: False after Redis was unreachable (it may have restarted without its data)
        self.registered = False

    def apply(self, delta: StatsDelta) -> list[tuple[object, ...]]:
        """Add ``delta`` to the totals; the commands that write them: one ``HSET`` of the
        fields it changed, as totals (sending it twice changes nothing), or of every
        field and an ``SADD`` to the registry while :attr:`registered` is False."""
        totals = self.totals
        changed: list[object] = []
        for name, value in delta.counts.items():
            total = totals.get(name, 0) + value
            totals[name] = total
            changed += (name, total)
        if delta.last_inference_ms > totals.get("last_inference_ms", 0):
            totals["last_inference_ms"] = delta.last_inference_ms
            changed += ("last_inference_ms", delta.last_inference_ms)
        if not self.registered:
            self.registered = True
            fields = [x for item in totals.items() for x in item]
            listing = [("SADD", self.registry, self.key), *self._tag_listing]
            if not fields:
                return listing
            return [("HSET", self.key, *fields), *listing]
        return [("HSET", self.key, *changed)] if changed else []


def open_stats_shard(
    client: redis.Redis,
    keys: KeySchema,
    model: str,
    version: int,
    instance: str,
    tag: str | None = None,
) -> StatsShard:
    """The shard of instance ``instance``, with the totals its hash holds already (an
    instance started again under the same name goes on counting from them).

    Raises:
        redis.exceptions.RedisError: Redis unreachable.
    """
    tag = None if tag == model else tag
    key = keys.stats_shard(model, version, instance, tag)
    totals = {k.decode(): int(v) for k, v in client.hgetall(key).items()}
    return StatsShard(
        key, keys.stats_shards(model, version, tag), totals, tag, keys.stats_tags(model, version)
    )


def _tags(client: redis.Redis, keys: KeySchema, model: str, version: int) -> list[str | None]:
    """The hash tags holding the version's statistics: None (the model's own) first."""
    return _with_own(client.smembers(keys.stats_tags(model, version)))


def _with_own(listed: Iterable[bytes | str]) -> list[str | None]:
    """None (the model's own tag) and the listed tags, sorted."""
    return [None, *sorted(t.decode() if isinstance(t, bytes) else t for t in listed)]


def fold_stats_shards(
    client: redis.Redis, keys: KeySchema, model: str, version: int, instances: Sequence[str]
) -> None:
    """Add the shards of stopped instances to the version's gateway hash and delete them
    (``broker.scripts.FOLD_STATS``), so that shards do not pile up with reloads; an
    instance that never wrote one is skipped.

    Raises:
        redis.exceptions.RedisError: Redis unreachable.
    """
    tags = _tags(client, keys, model, version)
    with client.pipeline(transaction=False) as pipe:
        for tag in tags:
            base, registry = keys.stats(model, version, tag), keys.stats_shards(model, version, tag)
            for instance in instances:
                shard = keys.stats_shard(model, version, instance, tag)
                pipe.execute_command("EVAL", FOLD_STATS.body, 3, base, shard, registry)
        pipe.execute()


def reset_version_stats(client: redis.Redis, keys: KeySchema, model: str, version: int) -> None:
    """Forget a version's statistics before it is loaded again: its gateway hash, every
    instance shard, the shard list and its latency histograms. Triton creates a new
    model, with zeroed statistics and metrics, on each load; call it before the
    version's instances start (they read their shards' totals when they do).

    Raises:
        redis.exceptions.RedisError: Redis unreachable.
    """
    for tag in _tags(client, keys, model, version):
        registry = keys.stats_shards(model, version, tag)
        shards = [s.decode() if isinstance(s, bytes) else s for s in client.smembers(registry)]
        windows = live_bucket_keys(keys.latency_window(model, version, tag), time.time_ns())
        # one tag's keys share a slot: one DEL each (a cluster refuses a DEL across slots)
        client.delete(keys.stats(model, version, tag), registry, *shards, *windows)
    client.delete(keys.stats_tags(model, version))


def merge_stats(hashes: Sequence[Mapping[bytes, bytes]]) -> VersionStats:
    """Add up ``HGETALL`` replies of a version's hashes (``last_inference_ms``: the latest)."""
    counters: dict[str, int] = {}
    for raw in hashes:
        for k, v in raw.items():
            name, value = k.decode(), int(v)
            if name == "last_inference_ms":
                counters[name] = max(counters.get(name, 0), value)
            else:
                counters[name] = counters.get(name, 0) + value
    return VersionStats(counters)


async def read_tags(
    client: redis.asyncio.Redis, keys: KeySchema, versions: Sequence[tuple[str, int]]
) -> list[list[str | None]]:
    """The hash tags holding each version's statistics and latency histograms: None (the
    model's own) first, then those of its queue shards, in one round trip.

    Raises:
        redis.exceptions.RedisError: Redis unreachable.
    """
    if not versions:
        return []
    async with client.pipeline(transaction=False) as pipe:
        for model, version in versions:
            pipe.smembers(keys.stats_tags(model, version))
        replies = await pipe.execute()
    return [_with_own(listed) for listed in replies]


async def read_stats(
    client: redis.asyncio.Redis,
    keys: KeySchema,
    versions: Sequence[tuple[str, int]],
    tags: Sequence[Sequence[str | None]] | None = None,
) -> list[VersionStats]:
    """The statistics of each ``(model, version)``: its gateway hash and instance shards
    added up, each tag's read at once (``broker.scripts.READ_STATS``: a shard folded
    into its tag's hash while it is read counts once), in one round trip after
    :func:`read_tags` (``tags``: what it returned, read already).

    Raises:
        redis.exceptions.RedisError: Redis unreachable.
    """
    if not versions:
        return []
    if tags is None:
        tags = await read_tags(client, keys, versions)
    async with client.pipeline(transaction=False) as pipe:
        for (model, version), version_tags in zip(versions, tags, strict=True):
            for tag in version_tags:
                base = keys.stats(model, version, tag)
                registry = keys.stats_shards(model, version, tag)
                pipe.execute_command("EVAL", READ_STATS.body, 2, base, registry)
        replies = iter(await pipe.execute())
    return [
        merge_stats([_pairs(flat) for _ in version_tags for flat in next(replies)])
        for version_tags in tags
    ]


def _pairs(flat: Sequence[bytes]) -> dict[bytes, bytes]:
    """A raw ``HGETALL`` reply inside a script's reply: [field, value, ...]."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


@dataclass(frozen=True, slots=True)
class VersionStats:
    """One version's statistics, decoded from its hash."""

    counters: dict[str, int] = field(default_factory=dict)

    def get(self, name: str) -> int:
        return self.counters.get(name, 0)

    def batch_sizes(self) -> list[int]:
        """Executed batch sizes, ascending."""
        sizes = {int(k.split(":")[1]) for k in self.counters if k.startswith("batch:")}
        return sorted(sizes)


def decode_stats(raw: Mapping[bytes, bytes]) -> VersionStats:
    """Decode ``HGETALL`` of a stats hash."""
    return VersionStats({k.decode(): int(v) for k, v in raw.items()})


def triton_model_stats(name: str, version: int, stats: VersionStats) -> dict[str, Any]:
    """One ``model_stats`` entry in Triton's JSON shape (docs/reference/http-protocol.md)."""

    def pair(prefix: str) -> dict[str, int]:
        return {"count": stats.get(f"{prefix}_count"), "ns": stats.get(f"{prefix}_ns")}

    inference_stats = {
        "success": pair("success"),
        "fail": pair("fail"),
        **{d: pair(d) for d in _DURATIONS},
        "cache_hit": pair("cache_hit"),
        "cache_miss": pair("cache_miss"),
    }
    batch_stats = []
    for size in stats.batch_sizes():
        count = stats.get(f"batch:{size}:count")
        batch_stats.append(
            {
                "batch_size": size,
                "compute_input": {
                    "count": count,
                    "ns": stats.get(f"batch:{size}:compute_input_ns"),
                },
                "compute_infer": {
                    "count": count,
                    "ns": stats.get(f"batch:{size}:compute_infer_ns"),
                },
                "compute_output": {
                    "count": count,
                    "ns": stats.get(f"batch:{size}:compute_output_ns"),
                },
            }
        )
    response_stats: dict[str, Any] = {}
    # a request cancelled in the queue never reached the model: no response of it counts
    failed_responses = {
        "count": stats.get("fail_count") - stats.get(f"fail_reason:{FailureReason.CANCELED}"),
        "ns": max(0, stats.get("fail_ns") - stats.get("cancel_ns")),
    }
    # responses the model produced: a response cache hit never reached it (Triton)
    model_successes = {
        "count": stats.get("success_count") - stats.get("cache_hit_count"),
        "ns": max(0, stats.get("success_ns") - stats.get("cache_hit_ns")),
    }
    if model_successes["count"] or failed_responses["count"]:
        # One response per request (no decoupled models): index "0" of each request.
        response_stats["0"] = {
            "compute_infer": pair("compute_infer"),
            "compute_output": pair("compute_output"),
            "success": model_successes,
            "fail": failed_responses,
            "empty_response": {"count": 0, "ns": 0},
            # Triton counts here responses a backend ended as cancelled; Sluice's models
            # never see a cancellation (a cancelled request runs whole or not at all)
            "cancel": {"count": 0, "ns": 0},
        }
    return {
        "name": name,
        "version": str(version),
        "last_inference": stats.get("last_inference_ms"),
        "inference_count": stats.get("inference_count"),
        "execution_count": stats.get("execution_count"),
        "inference_stats": inference_stats,
        "response_stats": response_stats,
        "batch_stats": batch_stats,
        "memory_usage": [],
    }
