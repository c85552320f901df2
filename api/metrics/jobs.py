"""The async job families of ``/metrics``, read from Redis at each scrape.

Counters come from the deployment's job counters (``JobStore.counters``: every gateway
reports the same), gauges from the jobs not finished yet. Names and labels:
docs/reference/metrics.md (Async jobs).
"""

from __future__ import annotations

import time
from collections import Counter

from sluice.api.metrics.exposition import Family
from sluice.broker.job_store import JobStore
from sluice.broker.states import JobState

__all__ = ["JOB_COUNTERS", "JobMetrics"]

#: counter name, help, job counter event.
JOB_COUNTERS = (
    ("sluice_jobs_submitted", "Async jobs accepted", "submitted"),
    ("sluice_jobs_succeeded", "Async jobs that ended SUCCESS", "success"),
    ("sluice_jobs_failed", "Async jobs that ended FAILURE", "failure"),
    ("sluice_jobs_revoked", "Async jobs cancelled before they finished", "revoked"),
)


class JobMetrics:
    """The job families of one gateway's scrapes (it keeps the last scrape's row count
    for ``sluice_job_rows_per_second``).

    Args:
        store: the deployment's jobs.
    """

    def __init__(self, store: JobStore) -> None:
        self._store = store
        self._last: tuple[float, Counter[str]] | None = None

    async def families(self, now_s: float | None = None) -> list[Family]:
        """Every job family, as Redis holds the jobs now.

        Raises:
            redis.exceptions.RedisError: Redis unreachable.
        """
        counters = await self._store.counters()
        active = await self._store.active()
        now = time.monotonic() if now_s is None else now_s
        return self.build(counters, [(r.model, r.state) for r in active], now)

    def build(
        self,
        counters: dict[tuple[str, str, str], int],
        active: list[tuple[str, JobState]],
        now_s: float,
    ) -> list[Family]:
        """The families of these readings (pure: the scrape and tests call it).

        Args:
            counters: (event, kind, model) -> count (``JobStore.counters``).
            active: (model, state) of each job not finished.
            now_s: the reading's time, monotonic s.
        """
        families: list[Family] = []
        models = sorted({model for _, _, model in counters} | {m for m, _ in active})
        for name, help_text, event in JOB_COUNTERS:
            family = Family(name, "counter", help_text)
            for (seen, kind, model), count in sorted(counters.items()):
                if seen == event:
                    family.add({"model": model, "kind": kind}, count)
            families.append(family)
        rows = Family("sluice_job_rows", "counter", "Rows of bulk jobs written, by outcome")
        done: Counter[str] = Counter()
        for (event, _, model), count in sorted(counters.items()):
            if event in ("rows_completed", "rows_failed"):
                rows.add({"model": model, "outcome": event.removeprefix("rows_")}, count)
                done[model] += count
        families.append(rows)
        for name, help_text, state in (
            ("sluice_jobs_pending", "Async jobs accepted and not started", JobState.PENDING),
            ("sluice_jobs_running", "Async jobs a job worker runs", JobState.STARTED),
        ):
            family = Family(name, "gauge", help_text)
            held = Counter(m for m, s in active if s is state)
            for model in models:
                family.add({"model": model}, held[model])
            families.append(family)
        rate = Family(
            "sluice_job_rows_per_second",
            "gauge",
            "Bulk rows written per second between this gateway's last two scrapes",
        )
        last = self._last
        for model in sorted(done):
            per_s = 0.0
            if last is not None and now_s > last[0]:
                per_s = max(0, done[model] - last[1][model]) / (now_s - last[0])
            rate.add({"model": model}, round(per_s, 3))
        families.append(rate)
        self._last = (now_s, done)
        return families
