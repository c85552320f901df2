"""The jobs' Celery application for Celery's own command-line tools (Flower, ``inspect``).

``celery -A sluice.job_workers.celery_cli flower`` (with ``flower`` installed) shows the
deployment's jobs; ``celery -A sluice.job_workers.celery_cli inspect active`` lists the
tasks the job workers run. The application is built at import from the environment
(``SLUICE_REDIS__URL``, ``SLUICE_REDIS__KEY_PREFIX``), the same settings a job worker
reads; it has no tasks of its own (the tools only read events and ask workers).
"""

from __future__ import annotations

from sluice.broker.celery_app import job_app
from sluice.broker.keys import KeySchema
from sluice.job_workers.settings import JobWorkerSettings

__all__ = ["app"]

_settings = JobWorkerSettings()
app = job_app(
    _settings.redis.url,
    KeySchema(_settings.redis.key_prefix),
    visibility_timeout_s=_settings.job_worker.visibility_timeout_s,
)
