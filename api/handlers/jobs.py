"""Async jobs at the gateway: accept, look up, cancel, list (transport-neutral).

A job is checked as the synchronous call checks its request (the same model resolution,
parsing and request checks, so a refused job gets the synchronous call's status and
text), its request is stored in Redis with its record (``broker.job_store``), and a
Celery task carrying only the job id goes to the job workers (``broker.celery_app``).
The job worker runs it through the same model streams as synchronous requests
(``sluice.job_workers``). Endpoints: docs/reference/http-protocol.md (Async jobs); the
user's guide: docs/user-guide/jobs.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import redis.asyncio

from sluice.api.handlers.submission import Submission
from sluice.api.models import ModelView
from sluice.api.settings import GatewaySettings
from sluice.broker.cluster import is_cluster
from sluice.broker.errors import ErrorCode, SluiceError, invalid_arg, not_found
from sluice.broker.job_records import JobKind, JobRecord, JobRequest, encode_job_request
from sluice.broker.job_store import JobStore
from sluice.broker.keys import KeySchema
from sluice.broker.messages import InferResponseMessage
from sluice.broker.states import JobState

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["JobView", "Jobs", "count_rows"]

logger = logging.getLogger(__name__)

#: the most jobs one listing returns.
MAX_LIST = 1000
#: line numbers read per round trip while streaming a bulk job's output.
_ROWS_PER_READ = 1000


def count_rows(body: bytes) -> int:
    """The rows of a JSON-lines body: its lines that hold more than white space."""
    return sum(1 for line in body.split(b"\n") if line.strip())


@dataclass(slots=True)
class JobView:
    """A job as a client sees it.

    Attributes:
        record: the job's record.
        response: a single job's answer (SUCCESS only).
        request: a single job's request (SUCCESS only: how to encode the outputs).
        completed: a bulk job's answered rows.
        failed: a bulk job's failed rows.
    """

    record: JobRecord
    response: InferResponseMessage | None = None
    request: JobRequest | None = None
    completed: int = 0
    failed: int = 0


class Jobs:
    """The job API of one gateway process.

    Args:
        settings: the gateway settings (``jobs``, ``redis``).
        client: the gateway's Redis client.
        submission: resolves models and checks requests as the synchronous path does.
    """

    def __init__(
        self, settings: GatewaySettings, client: redis.asyncio.Redis, submission: Submission
    ) -> None:
        self._settings = settings
        self._redis = client
        self._keys = KeySchema(settings.redis.key_prefix)
        self.store = JobStore(client, self._keys)
        self._submission = submission
        self._app: Celery | None = None
        #: the longest a job lives (deadline and the longest TTL), in s
        self._keep_index_s = settings.jobs.timeout_s + settings.jobs.max_ttl_s

    # -- submission -----------------------------------------------------------------------

    async def resolve(self, model: str, version: int | None) -> ModelView:
        """The model's view as a synchronous request resolves it (404 for an unknown
        model, 503 for one not ready, Triton's texts; UNSUPPORTED for a decoupled one).

        Raises:
            SluiceError: as :meth:`Submission.resolve_for_infer`.
        """
        view, _ = await self._submission.resolve_for_infer(model, version)
        return view

    def ttl(self, ttl_s: int | None) -> int:
        """The TTL a job asks for (None: the default), checked.

        Raises:
            SluiceError: INVALID_ARG outside 1 .. ``max_ttl_s``.
        """
        if ttl_s is None:
            return self._settings.jobs.result_ttl_s
        if not 1 <= ttl_s <= self._settings.jobs.max_ttl_s:
            raise invalid_arg(
                f"'ttl_secs' must be between 1 and {self._settings.jobs.max_ttl_s}, got {ttl_s}"
            )
        return ttl_s

    async def submit_single(
        self, view: ModelView, version: int | None, request: JobRequest, ttl_s: int
    ) -> JobRecord:
        """Accept a single job whose request ``view`` was parsed with.

        Raises:
            SluiceError: what the synchronous call refuses the request with (INVALID_ARG,
                UNSUPPORTED: :meth:`Submission.check`); UNAVAILABLE when the job cannot
                be queued for a job worker.
        """
        Submission.check(view, request.inputs, request.outputs, request.parameters)
        record = self._new(JobKind.SINGLE, view.name, version, ttl_s)
        await self.store.create(record, encode_job_request(request), self._keep_index_s)
        await self._send(record)
        return record

    async def submit_bulk(
        self, view: ModelView, version: int | None, body: bytes, ttl_s: int
    ) -> JobRecord:
        """Accept a bulk job whose rows are ``body`` (JSON lines, one KServe v2 request
        with a ``custom_id`` each; each line is checked when it runs).

        Raises:
            SluiceError: INVALID_ARG for a body without rows; UNSUPPORTED for a decoupled
                model; UNAVAILABLE when the job cannot be queued for a job worker.
        """
        total = count_rows(body)
        if total == 0:
            raise invalid_arg(f"bulk job of model '{view.name}' has no rows", model=view.name)
        Submission.check(view, (), (), {}, checked=True)
        record = self._new(JobKind.BULK, view.name, version, ttl_s)
        record.total, record.source, record.priority = total, "body", _bulk_level(view)
        await self.store.create(record, body, self._keep_index_s)
        await self._send(record)
        return record

    async def submit_bulk_file(
        self, view: ModelView, version: int | None, input_file: str, ttl_s: int
    ) -> JobRecord:
        """Accept a bulk job whose rows are a JSON-lines file of the model's repository
        (``input_file``, relative to it).

        Raises:
            SluiceError: INVALID_ARG for a path that is absolute, leaves the repository
                or names no file there.
        """
        path = await self._repository_file(view.name, input_file)
        Submission.check(view, (), (), {}, checked=True)
        record = self._new(JobKind.BULK, view.name, version, ttl_s)
        record.source, record.priority = f"file:{path}", _bulk_level(view)
        await self.store.create(record, b"", self._keep_index_s)
        await self._send(record)
        return record

    def _new(self, kind: JobKind, model: str, version: int | None, ttl_s: int) -> JobRecord:
        """A new PENDING job record.

        Raises:
            SluiceError: UNSUPPORTED on a Redis Cluster (Celery's Redis transport, which
                carries the jobs' tasks, does not speak the cluster protocol).
        """
        if is_cluster(self._settings.redis.url):
            raise SluiceError(
                ErrorCode.UNSUPPORTED,
                f"async jobs of model '{model}' need a single Redis: this deployment's "
                "Redis is a Redis Cluster, which Celery does not support",
                model=model,
            )
        now_ns = time.time_ns()
        return JobRecord(
            id=uuid.uuid4().hex,
            kind=kind,
            model=model,
            version=version,
            state=JobState.PENDING,
            created_ns=now_ns,
            deadline_ns=now_ns + self._settings.jobs.timeout_s * 1_000_000_000,
            ttl_s=ttl_s,
        )

    async def _repository_file(self, model: str, input_file: str) -> Path:
        relative = Path(input_file)
        if not input_file or relative.is_absolute() or ".." in relative.parts:
            raise invalid_arg(
                f"'input_file' of a bulk job of model '{model}' must be a path relative to "
                f"the model repository, got '{input_file}'",
                model=model,
            )
        raw = await self._redis.hget(self._keys.models(), model)
        where = json.loads(raw).get("repository", "") if raw else ""
        for repository in where.split(",") if where else []:
            candidate = Path(repository) / relative
            if candidate.is_file():
                return candidate.resolve()
        raise invalid_arg(
            f"'input_file' '{input_file}' of a bulk job of model '{model}' is not a file of "
            "its model repository",
            model=model,
        )

    async def _send(self, record: JobRecord) -> None:
        """Send the job's task; a job whose task cannot be sent fails at once.

        Raises:
            SluiceError: UNAVAILABLE "broker unavailable" when Celery cannot reach Redis.
        """
        try:
            await asyncio.to_thread(self._send_task, record.id)
        except Exception as exc:
            logger.warning("job %s: could not send its task: %s", record.id, exc)
            message = f"broker unavailable for the job of model '{record.model}': {exc}"
            await self.store.transition(
                record, JobState.FAILURE, error=message, code=ErrorCode.UNAVAILABLE.value
            )
            raise SluiceError(ErrorCode.UNAVAILABLE, message, model=record.model) from None

    def _send_task(self, job_id: str) -> None:
        from sluice.broker.celery_app import RUN_JOB

        self.celery().send_task(RUN_JOB, args=[job_id], task_id=job_id)

    def celery(self) -> Celery:
        """The jobs' Celery application (built on first use: the import takes a while)."""
        if self._app is None:
            from sluice.broker.celery_app import job_app

            self._app = job_app(
                self._settings.redis.url,
                self._keys,
                result_expires_s=self._settings.jobs.result_ttl_s,
                results=False,
            )
        return self._app

    # -- reading --------------------------------------------------------------------------

    async def record(self, job_id: str) -> JobRecord:
        """The job's record.

        Raises:
            SluiceError: NOT_FOUND for an unknown or expired id.
        """
        record = await self.store.get(job_id)
        if record is None:
            raise not_found(f"unknown job '{job_id}' (never submitted, or expired)")
        return record

    async def view(self, job_id: str) -> JobView:
        """The job with its answer (single, SUCCESS) or its row counts (bulk).

        Raises:
            SluiceError: NOT_FOUND for an unknown or expired id.
        """
        from sluice.broker.codec import decode_response
        from sluice.broker.job_records import decode_job_request

        record = await self.record(job_id)
        view = JobView(record)
        if record.kind is JobKind.BULK:
            ((view.completed, view.failed),) = await self.store.row_counts([job_id])
        elif record.state is JobState.SUCCESS:
            result, payload = await asyncio.gather(
                self.store.result(job_id), self.store.input(job_id)
            )
            if result is None or payload is None:
                raise not_found(f"unknown job '{job_id}' (never submitted, or expired)")
            view.response = decode_response(result)
            view.request = decode_job_request(payload)
        return view

    async def cancel(self, job_id: str) -> JobView:
        """Cancel a job that has not finished (REVOKED); a finished one is left as it
        is. A running job's worker sees it within half a second and takes its queued
        request off the model's stream (docs/user-guide/jobs.md, Cancelling).

        Raises:
            SluiceError: NOT_FOUND for an unknown or expired id.
        """
        record = await self.record(job_id)
        if not record.state.final and await self.store.transition(record, JobState.REVOKED):
            try:
                await asyncio.to_thread(self.celery().control.revoke, job_id)
            except Exception as exc:  # the record decides; Celery's revoke only helps Flower
                logger.debug("job %s: Celery revoke not sent: %s", job_id, exc)
        return await self.view(job_id)

    async def recent(self, model: str | None, state: str | None, limit: int) -> list[JobView]:
        """The newest jobs, of ``model`` and in ``state`` when given.

        Raises:
            SluiceError: INVALID_ARG for an unknown state or a limit outside 1 .. 1000.
        """
        wanted = None
        if state:
            try:
                wanted = JobState(state.upper())
            except ValueError:
                names = ", ".join(s.value for s in JobState)
                raise invalid_arg(f"unknown job state '{state}'; states: {names}") from None
        if not 1 <= limit <= MAX_LIST:
            raise invalid_arg(f"'limit' must be between 1 and {MAX_LIST}, got {limit}")
        records = await self.store.recent(model or None, wanted, limit)
        bulk = [r.id for r in records if r.kind is JobKind.BULK]
        counts = dict(zip(bulk, await self.store.row_counts(bulk), strict=True))
        views = []
        for record in records:
            completed, failed = counts.get(record.id, (0, 0))
            views.append(JobView(record, completed=completed, failed=failed))
        return views

    async def rows(self, job_id: str, errors: bool) -> AsyncIterator[bytes]:
        """A bulk job's output (or errors) JSON lines, in line order, in chunks.

        Raises:
            SluiceError: NOT_FOUND for an unknown or expired id; INVALID_ARG for a single
                job (its outputs are in its record).
        """
        record = await self.record(job_id)
        if record.kind is not JobKind.BULK:
            raise invalid_arg(
                f"job '{job_id}' is a single job: its outputs are in GET /v2/jobs/{job_id}"
            )
        lines = await self.store.row_lines(job_id, errors)
        return self._stream(job_id, errors, lines)

    async def _stream(self, job_id: str, errors: bool, lines: list[int]) -> AsyncIterator[bytes]:
        for start in range(0, len(lines), _ROWS_PER_READ):
            rows = await self.store.rows(job_id, errors, lines[start : start + _ROWS_PER_READ])
            if rows:
                yield b"\n".join(rows) + b"\n"


def _bulk_level(view: ModelView) -> int:
    """The priority level a bulk job's rows go at: the model's lowest (its
    ``priority_levels``), so synchronous requests at the default level go first; 0 for a
    model without priority levels."""
    return view.policy.priority_levels
