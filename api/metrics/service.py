"""The gateway's metrics service: one read of Redis per scrape, host gauges on a timer."""

from __future__ import annotations

import asyncio
import logging
import time

import redis.asyncio
import redis.exceptions

from sluice.api.metrics.exposition import Family, render
from sluice.api.metrics.families import model_families
from sluice.api.metrics.host import HostSampler
from sluice.api.metrics.jobs import JobMetrics
from sluice.api.metrics.snapshot import read_versions
from sluice.api.periodic import Periodic
from sluice.api.settings import MetricsSettings
from sluice.broker.job_store import JobStore
from sluice.broker.keys import KeySchema
from sluice.broker.latency_window import parse_quantiles

__all__ = ["CACHE_GAUGES", "MetricsService"]

#: Triton's response cache gauges (name, help), as Triton 2.51 writes them; Sluice's
#: cache is one per deployment, so every gateway reports the same values.
CACHE_GAUGES = (
    ("nv_cache_util", "Cache utilization [0.0 - 1.0]"),
    ("nv_cache_num_entries", "Number of responses stored in response cache"),
    ("nv_cache_num_hits", "Number of cache hits in response cache"),
    ("nv_cache_num_misses", "Number of cache misses in response cache"),
    ("nv_cache_num_lookups", "Number of cache lookups in response cache"),
    ("nv_cache_num_evictions", "Number of cache evictions in response cache"),
    ("nv_cache_lookup_duration", "Total cache lookup duration (hit and miss), in microseconds"),
    ("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds"),
)

logger = logging.getLogger(__name__)

#: longest wait of a scrape on Redis, in s (under Prometheus's default 10 s scrape timeout).
REDIS_DEADLINE_S = 5.0


class MetricsService:
    """Builds the ``/metrics`` exposition of one gateway process.

    Args:
        settings: the metrics settings (which families, refresh interval).
        client: the gateway's Redis client.
        keys: the deployment's key schema.
    """

    def __init__(
        self,
        settings: MetricsSettings,
        client: redis.asyncio.Redis,
        keys: KeySchema,
        cache_size_bytes: int = 0,
    ) -> None:
        self.settings = settings
        self._cache_size = cache_size_bytes
        self._redis = client
        self._keys = keys
        self.host = HostSampler(cpu=settings.cpu, gpu=settings.gpu)
        self.jobs = JobMetrics(JobStore(client, keys))
        self._timer = Periodic(
            "sluice-host-metrics", settings.interval_ms / 1000, self._refresh_host
        )
        self._quantiles = (
            parse_quantiles(settings.summary_quantiles) if settings.summary_latencies else None
        )
        if settings.histogram_latencies:
            logger.warning(
                "--metrics-config histogram_latencies is accepted but not implemented "
                "(Triton's only histogram is for decoupled models' first responses)"
            )

    async def start(self) -> None:
        """Take a first host reading and refresh it every ``interval_ms``."""
        if not (self.settings.cpu or self.settings.gpu):
            return
        self._timer.start()

    async def stop(self) -> None:
        """Stop the refresh task."""
        await self._timer.stop()

    async def _refresh_host(self) -> None:
        await asyncio.to_thread(self.host.refresh)

    async def exposition(self) -> bytes:
        """The Prometheus text of every family, model values read from Redis now.

        Raises:
            redis.exceptions.RedisError: Redis unreachable, or silent for
                :data:`REDIS_DEADLINE_S` (a stalled Redis answers a scrape in time
                with an error instead of after Prometheus's 10 s scrape timeout).
        """
        try:
            async with asyncio.timeout(REDIS_DEADLINE_S):
                samples = await read_versions(
                    self._redis, self._keys, latencies=self._quantiles is not None
                )
                cache = await self._cache_families() if self._cache_size else []
                jobs = await self.jobs.families()
        except TimeoutError as exc:
            raise redis.exceptions.TimeoutError(
                f"Redis did not answer within {REDIS_DEADLINE_S:g} s"
            ) from exc
        families = model_families(
            samples,
            time.time_ns() // 1_000_000,
            counter_latencies=self.settings.counter_latencies,
            summary_quantiles=self._quantiles,
            cache=bool(self._cache_size),
        )
        return render([*families, *self.host.families(), *cache, *jobs])

    async def _cache_families(self) -> list[Family]:
        """Triton's response cache gauges: utilization and entries (the cache in Redis)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(self._keys.cache_bytes())
            pipe.zcard(self._keys.cache_lru())
            pipe.hgetall(self._keys.cache_stats())
            held, entries, raw = await pipe.execute()
        counts = {k.decode(): int(v) for k, v in (raw or {}).items()}
        values = {
            "nv_cache_util": min(1.0, int(held or 0) / self._cache_size),
            "nv_cache_num_entries": int(entries or 0),
            "nv_cache_num_hits": counts.get("hits", 0),
            "nv_cache_num_misses": counts.get("misses", 0),
            "nv_cache_num_lookups": counts.get("lookups", 0),
            "nv_cache_num_evictions": counts.get("evictions", 0),
            "nv_cache_lookup_duration": counts.get("lookup_ns", 0) // 1000,
            "nv_cache_insertion_duration": counts.get("insert_ns", 0) // 1000,
        }
        families = []
        for name, help_text in CACHE_GAUGES:
            family = Family(name, "gauge", help_text)
            family.add({}, values[name])
            families.append(family)
        return families
