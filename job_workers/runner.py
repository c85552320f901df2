"""Running jobs: one asyncio loop per job worker process, shared by every job it runs.

Celery's threads call :meth:`JobRunner.run` with a job id; the job runs on the loop,
where requests are queued and answered as a gateway's are (``Submission``,
``ReplyRouter``: this process has a reply key of its own). A job runs under a lease in
Redis (``JobStore.take_lease``), renewed while it runs: a second delivery of its task
(the visibility timeout passed while it still runs) finds the lease taken and is tried
again later, so the job never runs twice at once, and the job of a worker that died is
taken over once its lease expired. Outcomes tell the Celery task what to do
(``context.Outcome``). docs/user-guide/jobs.md says what survives which fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Coroutine
from typing import Any

import redis.asyncio
import redis.exceptions

from sluice.api.handlers.queueing import RequestQueue
from sluice.api.handlers.shutdown import Shutdown
from sluice.api.handlers.submission import Submission
from sluice.api.models import ModelRegistry
from sluice.api.settings import GatewaySettings
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.job_records import JobKind
from sluice.broker.job_store import JobStore
from sluice.broker.keys import KeySchema
from sluice.broker.model_store import AsyncModelStore
from sluice.broker.multiplex import MultiplexedConnection
from sluice.broker.replies import ReplyRouter
from sluice.broker.states import JobState
from sluice.job_workers.bulk import run_bulk
from sluice.job_workers.context import JobContext, Outcome, RunResult, timed_out
from sluice.job_workers.settings import JobWorkerSettings
from sluice.job_workers.single import run_single

__all__ = ["JobRunner"]

logger = logging.getLogger(__name__)

#: how often a running job looks at its state (cancelled?) and renews its lease, in s.
WATCH_S = 0.5


class JobRunner:
    """Runs jobs on an asyncio loop of its own thread.

    Args:
        settings: the job worker's settings.
    """

    def __init__(self, settings: JobWorkerSettings) -> None:
        self.settings = settings
        self.stopping = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="sluice-jobs-loop", daemon=True
        )
        self._started = False

    def start(self) -> None:
        """Start the loop and connect (the reply reader, the queueing connection)."""
        self._thread.start()
        self._call(self._open())
        self._started = True

    def _call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _open(self) -> None:
        s = self.settings
        keys = KeySchema(s.redis.key_prefix)
        gateway = GatewaySettings(
            redis=s.redis,
            gateway_id=s.worker_id,
            request_timeout_s=s.job_worker.row_timeout_s,
            model_cache_s=s.model_cache_s,
        )
        self._client = redis.asyncio.Redis.from_url(
            s.redis.url,
            protocol=2,
            socket_timeout=s.redis.socket_timeout_s + 5,
            socket_connect_timeout=s.redis.socket_timeout_s,
            health_check_interval=30,
        )
        self.store = JobStore(self._client, keys)
        registry = ModelRegistry(AsyncModelStore(self._client, keys), s.model_cache_s)
        self._router = ReplyRouter(s.redis.url, keys.reply(s.worker_id), f"sluice-{s.worker_id}")
        self._connection = MultiplexedConnection(s.redis.url, s.redis.socket_timeout_s)
        shutdown = Shutdown()
        queue = RequestQueue(
            self._client, self._connection, keys, self._router, shutdown, s.redis.socket_timeout_s
        )
        self.submission = Submission(gateway, registry, self._router, queue, shutdown, None)
        await self._connection.start()
        await self._router.start()

    def close(self) -> None:
        """Stop the reply reader, close the connections and the loop."""
        if self._started:
            with contextlib.suppress(Exception):
                self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _close(self) -> None:
        await self._router.stop()
        await self._connection.stop()
        await self._client.aclose()

    def run(self, job_id: str) -> RunResult:
        """Run one job to its end, or until it must wait or give way (Celery's thread).

        Raises:
            redis.exceptions.RedisError, OSError: Redis out of reach (the task is tried
                again: ``autoretry_for`` of :func:`~sluice.job_workers.tasks.register_tasks`).
        """
        return self._call(self._run(job_id))

    async def _run(self, job_id: str) -> RunResult:
        record = await self.store.get(job_id)
        if record is None or record.state.final:
            return RunResult(Outcome.DONE, state="" if record is None else record.state.value)
        if self.stopping.is_set():
            return RunResult(Outcome.REQUEUE)
        token = f"{self.settings.worker_id}:{uuid.uuid4().hex[:8]}"
        lease_ms = int(self.settings.job_worker.lease_s * 1000)
        if not await self.store.take_lease(job_id, token, lease_ms):
            return RunResult(Outcome.BUSY, self.settings.job_worker.lease_s)
        try:
            record = await self.store.get(job_id)  # as it is now that this worker holds it
            if record is None or record.state.final:
                return RunResult(Outcome.DONE)
            ctx = JobContext(record, self.store, self.submission, self.settings, self.stopping)
            if ctx.past_deadline():
                return await ctx.fail(timed_out(record))
            if not await self.store.transition(
                record, JobState.STARTED, attempts=record.attempts + 1
            ):
                return RunResult(Outcome.DONE, state=record.state.value)
            watcher = asyncio.create_task(self._watch(ctx, token, lease_ms))
            try:
                if record.kind is JobKind.SINGLE:
                    return await run_single(ctx)
                return await run_bulk(ctx)
            except (redis.exceptions.RedisError, OSError):
                raise  # Redis out of reach: the task is tried again (autoretry)
            except Exception as exc:  # a broken invariant: fail the job, not the worker
                logger.exception("job %s of model '%s' failed", job_id, record.model)
                text = f"internal error: {type(exc).__name__}: {exc}"
                return await ctx.fail(SluiceError(ErrorCode.INTERNAL, text, model=record.model))
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        finally:
            with contextlib.suppress(redis.exceptions.RedisError, OSError):
                await self.store.release_lease(job_id, token)  # else it expires

    async def _watch(self, ctx: JobContext, token: str, lease_ms: int) -> None:
        """Every :data:`WATCH_S`: see whether the job was cancelled (or expired) and
        whether this worker stops; renew the lease every third of it."""
        renew_every = max(WATCH_S, lease_ms / 3000)
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(WATCH_S)
            try:
                state = await ctx.store.state(ctx.record.id)
                if state is None or state is JobState.REVOKED:
                    ctx.revoked = True
                    if state is not None:
                        ctx.record.state = state
                if time.monotonic() - renewed >= renew_every:
                    if not await ctx.store.renew_lease(ctx.record.id, token, lease_ms):
                        logger.warning("job %s: lease lost to another worker", ctx.record.id)
                        ctx.lost = True
                    renewed = time.monotonic()
            except Exception as exc:  # Redis away for a moment: the lease outlives it
                logger.debug("job %s: watch failed: %s", ctx.record.id, exc)
            if ctx.interrupted:
                ctx.changed.set()
                return
