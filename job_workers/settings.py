"""Settings of a job worker process (pydantic-settings; ``SLUICE_`` prefix, ``__`` nests).

Example: ``SLUICE_REDIS__URL=redis://10.0.0.5:6379/0 SLUICE_JOB_WORKER__CONCURRENCY=16
sluice jobs``.
"""

from __future__ import annotations

import uuid

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sluice.broker.settings import RedisSettings

__all__ = ["JobWorkerOptions", "JobWorkerSettings"]


class JobWorkerOptions(BaseModel):
    """How a job worker runs jobs (docs/reference/settings.md, Job worker)."""

    concurrency: int = Field(default=8, gt=0)
    """Jobs one worker process runs at once (Celery threads)."""
    visibility_timeout_s: float = Field(default=10.0, gt=0)
    """How long a job's task message taken by a worker that does not acknowledge it
    (killed) waits before it is delivered again, in s (kombu's Redis transport
    ``visibility_timeout``)."""
    lease_s: float = Field(default=5.0, gt=0)
    """How long a job stays claimed by a worker that stops renewing the claim (killed),
    in s; renewed every third of it."""
    bulk_window: int = Field(default=0, ge=0)
    """A bulk job's rows in flight at once; 0: twice the model's ``max_batch_size``, at
    least 16."""
    nice: int = Field(default=10, ge=0, le=19)
    """How much the job worker lowers its CPU priority (``nice``), so that the processes
    of synchronous requests get the CPU first when it is short."""
    row_timeout_s: float = Field(default=60.0, gt=0)
    """Longest wait for one bulk row's answer, in s (a row that times out is tried again,
    three times in all)."""
    retry_backoff_max_s: float = Field(default=8.0, gt=0)
    """Longest wait between two tries of a job whose model is unavailable, in s (the
    waits double from 0.5 s)."""
    result_expires_s: int = Field(default=86_400, gt=0)
    """How long Celery's result backend keeps a task's result, in s."""

    @model_validator(mode="after")
    def _waits_within_visibility(self) -> JobWorkerOptions:
        # a retry's countdown is held by a worker without acknowledging it: a wait longer
        # than the visibility timeout would have the message delivered twice
        if max(self.retry_backoff_max_s, self.lease_s) >= self.visibility_timeout_s:
            raise ValueError(
                "retry_backoff_max_s and lease_s must be shorter than visibility_timeout_s"
            )
        return self


class JobWorkerSettings(BaseSettings):
    """Everything one job worker process needs."""

    model_config = SettingsConfigDict(
        env_prefix="SLUICE_", env_nested_delimiter="__", env_file=".env", extra="ignore"
    )

    redis: RedisSettings = RedisSettings()
    job_worker: JobWorkerOptions = JobWorkerOptions()
    worker_id: str = Field(default_factory=lambda: "jobs-" + uuid.uuid4().hex[:12])
    """Names this process's reply key and its Celery node; unique per process."""
    model_cache_s: float = Field(default=0.5, ge=0)
    """How long a model's config and states are reused before Redis is read again, in s."""
    log_verbose: int = Field(default=0, ge=0)
    """Triton ``--log-verbose``."""
