"""Job worker process entry (``sluice jobs`` / ``python -m sluice.job_workers.main``).

A Celery worker (thread pool) that runs async jobs: any number of them may run against
one deployment, on any machine that reaches its Redis. SIGTERM or SIGINT stops it
warmly: the jobs it runs stop taking rows, write what was answered and put their task
back on the queue, for another worker (or this one, started again) to go on with. A job
worker that is killed loses nothing either: its tasks are delivered again once the
visibility timeout has passed (docs/user-guide/jobs.md, Faults).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import warnings

from sluice.broker.deadline import exit_deadline
from sluice.broker.logs import LogOptions, configure_logging
from sluice.broker.redis_access import exit_if_refused
from sluice.job_workers.settings import JobWorkerSettings

__all__ = ["add_job_arguments", "main", "settings_from_args"]

logger = logging.getLogger("sluice.job_workers")  # not "__main__" under python -m


class _RejectWithoutTraceback(logging.Filter):
    """Celery logs a task that puts itself back on the queue (a stopping worker) as a
    warning with a traceback; the warning line says it all."""

    def filter(self, record: logging.LogRecord) -> bool:
        from celery.exceptions import Reject

        if record.exc_info and isinstance(record.exc_info[1], Reject):
            record.exc_info = None
            record.exc_text = None
        return True


def _keep_logging(**_: object) -> None:
    """Celery's ``setup_logging`` signal: nothing to do (see :func:`run_job_worker`)."""


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The job worker's flags (defaults come from ``JobWorkerSettings`` / ``SLUICE_*``)."""
    parser.add_argument("--redis-url", default=None, help="Redis URL (SLUICE_REDIS__URL)")
    parser.add_argument("--key-prefix", default=None, help="Redis key prefix (sluice:)")
    parser.add_argument(
        "--concurrency", type=int, default=None, help="jobs this process runs at once (8)"
    )
    parser.add_argument("--log-verbose", type=int, default=None)


def settings_from_args(args: argparse.Namespace) -> JobWorkerSettings:
    """Environment/.env settings, overridden by the flags that were given."""
    settings = JobWorkerSettings()
    redis_update = {
        k: v for k, v in (("url", args.redis_url), ("key_prefix", args.key_prefix)) if v
    }
    update: dict[str, object] = {"redis": settings.redis.model_copy(update=redis_update)}
    if args.concurrency is not None:
        update["job_worker"] = settings.job_worker.model_copy(
            update={"concurrency": args.concurrency}
        )
    if args.log_verbose is not None:
        update["log_verbose"] = args.log_verbose
    return settings.model_copy(update=update)


#: longest a stopping job worker waits for its running tasks and Redis, in s.
STOP_LIMIT_S = 5.0


def run_job_worker(settings: JobWorkerSettings) -> int:
    """Serve jobs until SIGTERM/SIGINT; returns the exit code."""
    from celery import signals

    from sluice.broker.celery_app import job_app
    from sluice.broker.keys import KeySchema
    from sluice.job_workers.runner import JobRunner
    from sluice.job_workers.tasks import register_tasks

    options = settings.job_worker
    if options.nice:
        os.nice(options.nice)
    app = job_app(
        settings.redis.url,
        KeySchema(settings.redis.key_prefix),
        visibility_timeout_s=options.visibility_timeout_s,
        result_expires_s=options.result_expires_s,
    )
    runner = JobRunner(settings)
    runner.start()
    register_tasks(app, runner)

    def stopping(**_: object) -> None:
        runner.stopping.set()
        # a stop must not wait on a Redis that answers nothing (its parent killed while
        # Redis is stalled): the process ends itself; the jobs it held are delivered
        # again (acks_late, task_reject_on_worker_lost)
        exit_deadline(
            STOP_LIMIT_S, f"job worker still stopping {STOP_LIMIT_S:.0f} s after the signal "
            "(Redis not answering?): exiting",
        )  # fmt: skip

    signals.worker_shutting_down.connect(stopping, weak=False)
    # Sluice's logging stays as configured (broker.logs: Celery's and kombu's own info and
    # debug lines only from --log-verbose 2, as other libraries'; a retried task logs an
    # info line, and a long job's task is retried every few seconds); with a receiver of
    # this signal Celery sets up no logging of its own
    signals.setup_logging.connect(_keep_logging, weak=False)
    # started by ``sluice serve`` (SIGINT ignored): a terminal's Ctrl-C reaches the whole
    # process group, and the supervisor stops its children itself (SIGTERM)
    sigint_ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN

    class Worker(app.Worker):  # type: ignore[name-defined,misc]
        def install_platform_tweaks(self, worker: object) -> None:
            super().install_platform_tweaks(worker)
            if sigint_ignored:
                signal.signal(signal.SIGINT, signal.SIG_IGN)

    # Celery warns when it runs as root; containers commonly do, and json is the only
    # content accepted (no pickle), which is what the warning is about
    warnings.filterwarnings("ignore", message=".*superuser privileges.*")
    worker = Worker(
        hostname=f"{settings.worker_id}@{socket.gethostname()}",
        pool_cls="threads",
        concurrency=options.concurrency,
        without_mingle=True,
        without_gossip=True,
        quiet=True,
    )
    logging.getLogger("celery.app.trace").addFilter(_RejectWithoutTraceback())
    logger.info(
        "job worker %s: %d jobs at once, queue '%sjobs'",
        settings.worker_id,
        options.concurrency,
        KeySchema(settings.redis.key_prefix).celery_prefix(),
    )
    try:
        worker.start()
    finally:
        runner.close()
    return int(worker.exitcode or 0)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``sluice jobs``."""
    parser = argparse.ArgumentParser(
        prog="sluice jobs",
        description="A Celery worker that runs Sluice's async and bulk jobs "
        "(docs/user-guide/jobs.md).",
    )
    add_job_arguments(parser)
    settings = settings_from_args(parser.parse_args(argv))
    configure_logging("jobs", LogOptions.from_env(verbose=settings.log_verbose))
    exit_if_refused(settings.redis.url, logger)
    return run_job_worker(settings)


if __name__ == "__main__":
    sys.exit(main())
