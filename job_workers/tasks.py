"""The Celery task of async jobs: thin, idempotent, its one argument the job id.

The task hands the id to :class:`~sluice.job_workers.runner.JobRunner` and turns the
outcome into Celery's terms: a job another worker holds, or whose model is unavailable,
is tried again after a delay (``Task.retry``), as is one that found Redis out of reach
(``autoretry_for``, backoff up to 8 s); a worker that stops puts the task back on the
queue (``Reject(requeue=True)``). Everything that must happen once is decided
in Redis by the job store, so a task delivered twice does no harm (Celery's user guide,
"Tasks": idempotence, ``acks_late``).
"""

from __future__ import annotations

import logging

import redis.exceptions
from celery import Celery, Task
from celery.exceptions import Reject

from sluice.broker.celery_app import RUN_JOB
from sluice.job_workers.context import Outcome
from sluice.job_workers.runner import JobRunner

__all__ = ["register_tasks"]

logger = logging.getLogger(__name__)


def register_tasks(app: Celery, runner: JobRunner) -> Task:
    """Register the job task (:data:`~sluice.broker.celery_app.RUN_JOB`) on ``app``,
    running jobs with ``runner``; returns the task."""

    @app.task(
        name=RUN_JOB,
        bind=True,
        acks_late=True,
        reject_on_worker_lost=True,
        max_retries=None,
        autoretry_for=(redis.exceptions.RedisError, OSError),
        retry_backoff=True,
        retry_backoff_max=8,
        retry_jitter=True,
    )
    def run_job(self: Task, job_id: str) -> str:
        """Run job ``job_id``; returns its state once finished (or "" when gone)."""
        result = runner.run(job_id)
        if result.outcome in (Outcome.BUSY, Outcome.RETRY):
            raise self.retry(countdown=result.delay_s)
        if result.outcome is Outcome.REQUEUE:
            raise Reject(f"job {job_id}: the job worker stops", requeue=True)
        return result.state

    return run_job
