"""What one run of one job shares, and what a run ends with (:class:`Outcome`).

:class:`~sluice.job_workers.runner.JobRunner` makes a :class:`JobContext` for each run;
the single and bulk runs (``single.py``, ``bulk.py``) read it and end through it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from enum import Enum

from sluice.api.handlers.submission import Submission
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.job_records import JobRecord
from sluice.broker.job_store import JobStore
from sluice.broker.states import JobState
from sluice.job_workers.rows import retryable
from sluice.job_workers.settings import JobWorkerSettings

__all__ = ["RETRY_FIRST_S", "JobContext", "Outcome", "RunResult", "timed_out"]

logger = logging.getLogger(__name__)

#: the first wait before a job whose model is unavailable is tried again, in s.
RETRY_FIRST_S = 0.5


class Outcome(Enum):
    """What the Celery task does once :meth:`JobRunner.run` returns."""

    DONE = "done"
    """Nothing more to do: finished, cancelled, expired, or another worker owns it."""
    BUSY = "busy"
    """Another worker holds the job's lease: try again after ``delay_s``."""
    RETRY = "retry"
    """The model is unavailable: try again after ``delay_s``."""
    REQUEUE = "requeue"
    """This worker stops: put the task back on the queue at once."""


@dataclass(frozen=True, slots=True)
class RunResult:
    """An outcome, and how long to wait before the next try (BUSY, RETRY), in s."""

    outcome: Outcome
    delay_s: float = 0.0
    state: str = ""


@dataclass(slots=True)
class JobContext:
    """One run of one job: what its steps share.

    Attributes:
        record: the job's record.
        store: the deployment's jobs.
        submission: queues requests as a gateway does.
        settings: the worker's settings.
        stopping: the worker stops (warm shutdown).
        changed: set when the job was cancelled, its lease lost or the worker stops.
    """

    record: JobRecord
    store: JobStore
    submission: Submission
    settings: JobWorkerSettings
    stopping: threading.Event
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    revoked: bool = False
    lost: bool = False

    @property
    def interrupted(self) -> bool:
        """The run must end now: cancelled, lease lost, or the worker stops."""
        return self.revoked or self.lost or self.stopping.is_set()

    def end(self) -> RunResult:
        """The outcome of a run that ended early (:attr:`interrupted`)."""
        if self.stopping.is_set() and not (self.revoked or self.lost):
            return RunResult(Outcome.REQUEUE)
        return RunResult(Outcome.DONE, state=self.record.state.value)

    def past_deadline(self) -> bool:
        """Whether the job's deadline passed."""
        return time.time_ns() >= self.record.deadline_ns

    async def fail(self, error: SluiceError) -> RunResult:
        """Fail the job with ``error`` (its code and text, as the synchronous call)."""
        await self.store.transition(
            self.record, JobState.FAILURE, error=error.message, code=error.code.value
        )
        return RunResult(Outcome.DONE, state=self.record.state.value)

    async def fail_or_retry(self, error: SluiceError) -> RunResult:
        """Try again later (backoff) when ``error`` says the model is unavailable and the
        deadline has not passed; fail the job otherwise."""
        if not retryable(error) or self.past_deadline():
            return await self.fail(error)
        retries = self.record.retries
        await self.store.set_fields(self.record.id, retries=retries + 1)
        delay = min(
            self.settings.job_worker.retry_backoff_max_s, RETRY_FIRST_S * 2 ** min(retries, 16)
        )
        logger.info(
            "job %s of model '%s': %s; trying again in %.1f s",
            self.record.id,
            self.record.model,
            error.message,
            delay,
        )
        return RunResult(Outcome.RETRY, delay)


def timed_out(record: JobRecord) -> SluiceError:
    """The error of a job whose deadline passed (Triton's request timeout text)."""
    return SluiceError(ErrorCode.UNAVAILABLE, "Request timeout expired", model=record.model)
