"""One read of every model version's counters, queues and instances from Redis.

Every process adds to the same stats hash (``broker.stats_store``), so any gateway
reading it reports the totals of all workers. Queue facts come from the version's
streams (one per priority level): entries are deleted once answered, so a stream
holds only requests not yet taken (``depth``) and requests taken but not yet
acknowledged (``pending``, the consumer group's pending count).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio
from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.broker.keys import WORKER_GROUP, KeySchema
from sluice.broker.latency_window import AGE_BUCKETS, merge_windows, window_keys
from sluice.broker.model_store import AsyncModelStore, VersionState, count_live
from sluice.broker.scheduling import stream_layout
from sluice.broker.states import ModelState
from sluice.broker.stats_store import VersionStats, read_stats, read_tags

__all__ = ["QueueFacts", "VersionSample", "read_versions"]


@dataclass(frozen=True, slots=True)
class QueueFacts:
    """Queue state of one model version, summed over its priority streams.

    Attributes:
        depth: entries no instance has taken yet.
        pending: entries taken by an instance and not yet acknowledged.
        oldest_ms: enqueue time (ms since the epoch, from the entry id) of the oldest
            entry not yet taken; None when ``depth`` is 0.
    """

    depth: int = 0
    pending: int = 0
    oldest_ms: int | None = None

    def oldest_age_s(self, now_ms: int) -> float:
        """Age of the oldest queued entry, in seconds (0 when none is queued)."""
        return 0.0 if self.oldest_ms is None else max(0, now_ms - self.oldest_ms) / 1000.0


@dataclass(frozen=True, slots=True)
class VersionSample:
    """What one read found about one model version.

    Attributes:
        model: model name.
        version: version number.
        state: Triton state name (READY, LOADING, UNAVAILABLE, …).
        reason: why it is in that state ("" if nothing to say).
        stats: the statistics counters (only read for READY versions).
        queue: stream facts (only read for READY versions).
        instances: instance name -> state for every instance on record.
        live_instances: READY instances whose heartbeat is fresh.
        latencies: kind (``broker.latency_window.KINDS``) -> histogram (bin floor µs ->
            count) of the last 60 s; read only when asked for (summary metrics).
        load_s: how long the version's last load took, in s (None: not recorded).
        response_cache: the model's config enables the response cache.
    """

    model: str
    version: int
    state: str
    reason: str = ""
    stats: VersionStats = field(default_factory=VersionStats)
    queue: QueueFacts = field(default_factory=QueueFacts)
    instances: dict[str, str] = field(default_factory=dict)
    live_instances: int = 0
    latencies: dict[str, dict[int, int]] = field(default_factory=dict)
    load_s: float | None = None
    response_cache: bool = False

    @property
    def ready(self) -> bool:
        return self.state == ModelState.READY.value


def _parse_config(config_raw: bytes | None) -> ModelConfig | None:
    """A published config (protobuf JSON); None when missing or unreadable."""
    try:
        return json_format.Parse(config_raw or b"{}", ModelConfig(), ignore_unknown_fields=True)
    except Exception:
        return None


def _streams(keys: KeySchema, model: str, version: int, config: ModelConfig | None) -> list[str]:
    try:
        layout = stream_layout(keys, model, version, config) if config is not None else None
    except Exception:
        layout = None
    if layout is None:
        return [keys.queue(model, version)]
    return layout.streams()


def _field(entry: dict[Any, Any], name: str) -> Any:
    value = entry.get(name, entry.get(name.encode()))
    return value.decode() if isinstance(value, bytes) else value


async def read_versions(
    client: redis.asyncio.Redis,
    keys: KeySchema,
    *,
    ready_only: bool = True,
    latencies: bool = False,
) -> list[VersionSample]:
    """Every model version on record, sorted by (model, version), in three round trips.

    Args:
        client: a Redis client (RESP2, bytes replies).
        keys: the deployment's key schema.
        ready_only: leave out versions that are not READY (Triton's per-model series
            exist only while a version is loaded).
        latencies: also read the READY versions' latency histograms of the last 60 s
            (:attr:`VersionSample.latencies`).
    """
    store = AsyncModelStore(client, keys)
    names = await store.model_names()
    async with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.get(keys.config(name))
            pipe.hgetall(keys.state(name))
        raw = await pipe.execute() if names else []
    found: list[tuple[str, int, str, str, list[str]]] = []
    load_secs: dict[tuple[str, int], float] = {}
    cached_models: set[str] = set()
    for i, name in enumerate(names):
        config_raw, states_raw = raw[2 * i], raw[2 * i + 1]
        config = _parse_config(config_raw)
        if config is not None and config.response_cache.enable:
            cached_models.add(name)
        for version_raw, state_raw in states_raw.items():
            state = VersionState.from_json(state_raw)
            version = int(version_raw)
            if ready_only and state.state is not ModelState.READY:
                continue
            streams = _streams(keys, name, version, config)
            if state.load_s is not None:
                load_secs[(name, version)] = state.load_s
            found.append((name, version, state.state.value, state.reason, streams))
    found.sort(key=lambda f: (f[0], f[1]))

    ready = [f for f in found if f[2] == ModelState.READY.value]
    ready_versions = [(f[0], f[1]) for f in ready]
    tags = await read_tags(client, keys, ready_versions)
    version_stats = await read_stats(client, keys, ready_versions, tags)
    now_ns = time.time_ns()
    async with client.pipeline(transaction=False) as pipe:
        for (name, version, _, _, streams), version_tags in zip(ready, tags, strict=True):
            pipe.hgetall(keys.instances(name, version))
            for stream in streams:
                pipe.xinfo_groups(stream)
                pipe.xlen(stream)
            if latencies:
                for tag in version_tags:
                    for key in window_keys(keys.latency_window(name, version, tag), now_ns):
                        pipe.hgetall(key)
        replies = await pipe.execute(raise_on_error=False) if ready else []

    facts: dict[tuple[str, int], tuple[VersionStats, dict[str, str], int]] = {}
    histograms: dict[tuple[str, int], dict[str, dict[int, int]]] = {}
    tails: list[tuple[tuple[str, int], str, str]] = []  # (version, stream, last delivered id)
    counts: dict[tuple[str, int], list[int]] = {}
    position = 0
    for (name, version, _, _, streams), stats, version_tags in zip(
        ready, version_stats, tags, strict=True
    ):
        instances_raw = replies[position]
        position += 1
        states, live = count_live(instances_raw if isinstance(instances_raw, dict) else {}, now_ns)
        facts[(name, version)] = (stats, states, live)
        depth = pending = 0
        for stream in streams:
            groups, length = replies[position], replies[position + 1]
            position += 2
            length = length if isinstance(length, int) else 0
            group = (
                next((g for g in groups if _field(g, "name") == WORKER_GROUP), None)
                if isinstance(groups, list)
                else None
            )
            taken = int(_field(group, "pending") or 0) if group else 0
            waiting = max(0, length - taken)
            depth += waiting
            pending += taken
            if waiting:
                last = _field(group, "last-delivered-id") if group else None
                tails.append(((name, version), stream, str(last or "0-0")))
        counts[(name, version)] = [depth, pending]
        if latencies:
            windows = replies[position : position + AGE_BUCKETS * len(version_tags)]
            position += AGE_BUCKETS * len(version_tags)
            histograms[(name, version)] = merge_windows(w for w in windows if isinstance(w, dict))

    oldest: dict[tuple[str, int], int] = {}
    if tails:
        async with client.pipeline(transaction=False) as pipe:
            for _, stream, last in tails:
                pipe.xrange(stream, min=f"({last}", max="+", count=1)
            entries = await pipe.execute(raise_on_error=False)
        for (version_key, _, _), entry in zip(tails, entries, strict=True):
            if isinstance(entry, list) and entry:
                entry_id = entry[0][0]
                ms = int(
                    (entry_id.decode() if isinstance(entry_id, bytes) else entry_id).split("-")[0]
                )
                oldest[version_key] = min(ms, oldest.get(version_key, ms))

    samples: list[VersionSample] = []
    for name, version, state, reason, _ in found:
        if (name, version) not in facts:
            samples.append(VersionSample(name, version, state, reason))
            continue
        stats, states, live = facts[(name, version)]
        depth, pending = counts[(name, version)]
        samples.append(
            VersionSample(
                name,
                version,
                state,
                reason,
                stats,
                QueueFacts(depth, pending, oldest.get((name, version))),
                states,
                live,
                histograms.get((name, version), {}),
                load_secs.get((name, version)),
                name in cached_models,
            )
        )
    return samples
