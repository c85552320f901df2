"""What the ``/dashboard`` plots show: samples of every model version, kept in memory.

Every ``interval_s`` the gateway reads all versions from Redis
(:func:`api.metrics.snapshot.read_versions`) and keeps, per READY version, a
bounded series of (time, throughput in inferences/s, average request latency in
ms over the interval, queue depth). Rates come from the difference of two
consecutive readings of the shared counters, so every gateway plots the same.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio
import redis.exceptions

from sluice.api.metrics.snapshot import VersionSample, read_versions
from sluice.api.periodic import Periodic
from sluice.broker.job_records import JobKind
from sluice.broker.job_store import JobStore
from sluice.broker.keys import KeySchema

__all__ = ["DashboardHistory", "Point"]

#: the newest jobs the jobs panel lists.
JOBS_SHOWN = 15

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Point:
    """One plotted moment of one version.

    Attributes:
        t_ms: sample time, ms since the epoch.
        throughput: successful inferences per second since the previous sample.
        latency_ms: average successful request duration since the previous sample, ms
            (None when no request finished).
        queue_depth: requests not yet taken, at the sample.
        failures_per_s: failed requests per second since the previous sample.
    """

    t_ms: int
    throughput: float
    latency_ms: float | None
    queue_depth: int
    failures_per_s: float


@dataclass(slots=True)
class _Series:
    points: deque[Point]
    last: VersionSample | None = None
    last_ms: int = 0


@dataclass(slots=True)
class DashboardHistory:
    """Samples Redis on a timer and answers the dashboard's JSON.

    Args:
        client: the gateway's Redis client.
        keys: the deployment's key schema.
        interval_s: seconds between samples.
        keep_s: seconds of history kept per version.
    """

    client: redis.asyncio.Redis
    keys: KeySchema
    interval_s: float = 2.0
    keep_s: float = 600.0
    _series: dict[tuple[str, int], _Series] = field(default_factory=dict)
    _latest: list[VersionSample] = field(default_factory=list)
    _timer: Periodic | None = None
    #: the jobs panel: the newest jobs, and each bulk job's rows done at the last sample
    _jobs: list[dict[str, Any]] = field(default_factory=list)
    _rows_done: dict[str, tuple[int, int]] = field(default_factory=dict)

    async def start(self) -> None:
        """Start sampling."""
        self._timer = Periodic("sluice-dashboard", self.interval_s, self.sample)
        self._timer.start()

    async def stop(self) -> None:
        """Stop sampling."""
        if self._timer is not None:
            await self._timer.stop()

    async def sample(self, now_ms: int | None = None) -> None:
        """Read every version once and extend the series."""
        samples = await read_versions(self.client, self.keys, ready_only=False)
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        self.record(samples, now)
        await self.sample_jobs(now)

    async def sample_jobs(self, now_ms: int) -> None:
        """Read the newest jobs for the jobs panel (rows per second of a bulk job: since
        the previous sample)."""
        store = JobStore(self.client, self.keys)
        records = await store.recent(None, None, JOBS_SHOWN)
        counts = await store.row_counts([r.id for r in records])
        jobs, done = [], {}
        for record, (completed, failed) in zip(records, counts, strict=True):
            rows = completed + failed
            before = self._rows_done.get(record.id)
            rate = 0.0
            if before is not None and now_ms > before[1]:
                rate = max(0, rows - before[0]) * 1000 / (now_ms - before[1])
            done[record.id] = (rows, now_ms)
            bulk = record.kind is JobKind.BULK
            jobs.append(
                {
                    "id": record.id,
                    "kind": record.kind.value,
                    "model": record.model,
                    "state": record.state.value,
                    "created_ms": record.created_ns // 1_000_000,
                    "total": record.total if bulk else None,
                    "completed": completed if bulk else None,
                    "failed": failed if bulk else None,
                    "rows_per_s": round(rate, 1) if bulk else None,
                    "error": record.error,
                }
            )
        self._jobs, self._rows_done = jobs, done

    def record(self, samples: list[VersionSample], now_ms: int) -> None:
        """Add one reading taken at ``now_ms`` (pure; the sampler and tests call it)."""
        self._latest = samples
        size = max(2, int(self.keep_s / self.interval_s) + 1)
        seen: set[tuple[str, int]] = set()
        for sample in samples:
            if not sample.ready:
                continue
            key = (sample.model, sample.version)
            seen.add(key)
            series = self._series.setdefault(key, _Series(deque(maxlen=size)))
            previous, elapsed_s = series.last, (now_ms - series.last_ms) / 1000
            throughput = failures = 0.0
            latency: float | None = None
            if previous is not None and elapsed_s > 0:
                inferences = sample.stats.get("inference_count") - previous.stats.get(
                    "inference_count"
                )
                done = sample.stats.get("success_count") - previous.stats.get("success_count")
                ns = sample.stats.get("success_ns") - previous.stats.get("success_ns")
                failed = sample.stats.get("fail_count") - previous.stats.get("fail_count")
                throughput = max(0, inferences) / elapsed_s
                failures = max(0, failed) / elapsed_s
                latency = ns / done / 1e6 if done > 0 else None
            series.points.append(Point(now_ms, throughput, latency, sample.queue.depth, failures))
            series.last, series.last_ms = sample, now_ms
        for key in [k for k in self._series if k not in seen]:
            del self._series[key]  # unloaded: its history goes with it

    def data(self, now_ms: int | None = None) -> dict[str, Any]:
        """The body of ``GET /dashboard/data``."""
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        models = []
        for sample in self._latest:
            series = self._series.get((sample.model, sample.version))
            models.append(
                {
                    "name": sample.model,
                    "version": str(sample.version),
                    "state": sample.state,
                    "reason": sample.reason,
                    "instances": len(sample.instances),
                    "instances_live": sample.live_instances,
                    "queue_depth": sample.queue.depth,
                    "pending": sample.queue.pending,
                    "oldest_age_s": sample.queue.oldest_age_s(now),
                    "success": sample.stats.get("success_count"),
                    "failure": sample.stats.get("fail_count"),
                    "inference_count": sample.stats.get("inference_count"),
                    "execution_count": sample.stats.get("execution_count"),
                    "series": [
                        {
                            "t": p.t_ms,
                            "throughput": round(p.throughput, 3),
                            "latency_ms": None if p.latency_ms is None else round(p.latency_ms, 3),
                            "queue_depth": p.queue_depth,
                            "failures_per_s": round(p.failures_per_s, 3),
                        }
                        for p in (series.points if series is not None else ())
                    ],
                }
            )
        return {
            "now_ms": now,
            "interval_s": self.interval_s,
            "window_s": self.keep_s,
            "models": models,
            "jobs": self._jobs,
        }
