"""The gateway's metrics service: one read of Redis per scrape, host gauges on a timer."""

from __future__ import annotations

import asyncio
import logging
import time

import redis.asyncio
import redis.exceptions

from api.metrics.exposition import Family, render
from api.metrics.families import model_families
from api.metrics.host import HostSampler
from api.metrics.snapshot import read_versions
from api.periodic import Periodic
from api.settings import MetricsSettings
from broker.keys import KeySchema
from broker.latency_window import parse_quantiles

__all__ = ["MetricsService"]

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
        return render([*families, *self.host.families(), *cache])

    async def _cache_families(self) -> list[Family]:
        """Triton's response cache gauges: utilization and entries (the cache in Redis)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(self._keys.cache_bytes())
            pipe.zcard(self._keys.cache_lru())
            held, entries = await pipe.execute()
        util = Family("nv_cache_util", "gauge", "Cache utilization [0.0 - 1.0]")
        util.add({}, min(1.0, int(held or 0) / self._cache_size))
        count = Family(
            "nv_cache_num_entries", "gauge", "Number of responses stored in response cache"
        )
        count.add({}, int(entries or 0))
        return [util, count]
