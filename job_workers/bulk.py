"""Running a bulk job: its rows through the model's streams, a window of them at a time.

Rows already written (answered or failed, by an earlier run of the job) are skipped, so
a job taken over after a crash or a restart does only what is left. A window of rows
is in flight at once (``bulk_window``): enough for the model's batcher to form full
batches. Rows go at the model's lowest priority level when it has ``priority_levels``;
on a model without, which queues rows and synchronous requests in one order, the job
keeps only its fair share of the queue in flight while other traffic comes
(``job_workers.share``). Answers are written as they come, each row once
(``JobStore.write_rows``), and only while the job is not final: once it is cancelled, a
write is refused and the run ends at once, whatever is in flight is withdrawn, and the
rows and counts stay as the cancellation left them. A row refused or failed by the model
gets an error line; a row the model could not take (unavailable, queue full) waits and
is sent again; a row that timed out is sent again, three times in all. The job is
SUCCESS once every row is written, whatever the rows' outcomes; it fails only when it
cannot go on (its input is gone, its model is gone, its deadline passed).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections import deque
from pathlib import Path

from sluice.api.http.infer_request import HttpInferRequest
from sluice.api.models import ModelView
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.messages import InferResponseMessage
from sluice.broker.scheduling import stream_layout
from sluice.broker.states import JobState
from sluice.job_workers.context import RETRY_FIRST_S, JobContext, Outcome, RunResult, timed_out
from sluice.job_workers.rows import (
    Row,
    error_line,
    output_line,
    parse_request,
    retryable,
    split_rows,
)
from sluice.job_workers.share import LOOK_EVERY_S, FairShare

__all__ = ["run_bulk"]

logger = logging.getLogger(__name__)

#: tries of a row whose request timed out before it gets an error line.
ROW_TRIES = 3
#: rows answered but not written yet that make a write now, however soon.
_WRITE_AT = 256
#: the longest a written row waits for the next write, in s.
_WRITE_EVERY_S = 0.2

#: a row in flight: the row, its parsed request, when it was sent (monotonic s)
_Sent = tuple[Row, HttpInferRequest, float]


async def _read_rows(ctx: JobContext) -> list[Row] | None:
    """The job's rows (None when its input is gone)."""
    record = ctx.record
    if record.source.startswith("file:"):
        path = Path(record.source[len("file:") :])
        try:
            body = await asyncio.to_thread(path.read_bytes)
        except OSError:
            return None
    else:
        body = await ctx.store.input(record.id)
        if body is None:
            return None
    return await asyncio.to_thread(split_rows, body, record.model)


class _Bulk:
    """One run of one bulk job (what :func:`run_bulk` keeps between rows)."""

    def __init__(self, ctx: JobContext, rows: list[Row]) -> None:
        self.ctx = ctx
        self.todo: deque[Row] = deque(rows)
        self.waiting: list[tuple[float, int, Row]] = []  # (when, tiebreak, row), a heap
        self._order = itertools.count()
        self.in_flight: dict[asyncio.Future[InferResponseMessage], _Sent] = {}
        self.outputs: list[tuple[int, bytes]] = []
        self.errors: list[tuple[int, bytes]] = []
        self.written_at = time.monotonic()
        #: answered futures not looked at yet, and the event their callbacks set
        self.finished: list[asyncio.Future[InferResponseMessage]] = []
        self.ready = asyncio.Event()
        self.version = 0
        self.window = ctx.settings.job_worker.bulk_window
        self.share: FairShare | None = None  # set once the model's view is known
        self.sent = 0
        self.looked_at = 0.0

    def later(self, row: Row, error: SluiceError) -> None:
        """Send ``row`` again after a backoff, or give it its error line (out of tries)."""
        timed_out = not retryable(error)
        if timed_out and row.attempts >= ROW_TRIES:
            self.errors.append((row.line, error_line(row, error)))
            return
        backoff = self.ctx.settings.job_worker.retry_backoff_max_s
        delay = min(backoff, RETRY_FIRST_S * 2 ** min(16, max(0, row.attempts - 1)))
        heapq.heappush(self.waiting, (time.monotonic() + delay, next(self._order), row))

    def next_row(self) -> Row | None:
        if self.waiting and self.waiting[0][0] <= time.monotonic():
            return heapq.heappop(self.waiting)[2]
        return self.todo.popleft() if self.todo else None

    def send(self, view: ModelView, resolved: int) -> None:
        """Fill the window with rows (refused ones get their error line at once)."""
        record, sub = self.ctx.record, self.ctx.submission
        window = self.window or max(16, 2 * view.max_batch_size)
        if view.policy.priority_levels == 0:
            if self.share is None or self.share.full != window:
                self.share = FairShare(window, max(4, view.max_batch_size // 8))
            window = self.share.limit
        deadline_ns = min(
            record.deadline_ns,
            time.time_ns() + int(self.ctx.settings.job_worker.row_timeout_s * 1e9),
        )
        while len(self.in_flight) < window and (row := self.next_row()) is not None:
            row.attempts += 1
            try:
                request = parse_request(row, view)
                parameters = request.parameters
                if record.priority and "priority" not in parameters:
                    parameters = {**parameters, "priority": record.priority}
                future = sub.submit(
                    f"{record.id}.{row.line}.{row.attempts}",
                    view,
                    resolved,
                    request.client_id,
                    request.inputs,
                    request.outputs,
                    parameters,
                    deadline_ns=deadline_ns,
                )
            except SluiceError as exc:
                if retryable(exc):
                    self.later(row, exc)
                else:
                    self.errors.append((row.line, error_line(row, exc)))
                continue
            self.in_flight[future] = (row, request, time.monotonic())
            self.sent += 1
            future.add_done_callback(self._finished)

    async def look(self, view: ModelView, version: int) -> None:
        """Every :data:`LOOK_EVERY_S`, on a model without priority levels: how much
        traffic shares the version's streams (one per queue shard; :class:`FairShare`)."""
        now = time.monotonic()
        if self.share is None or now - self.looked_at < LOOK_EVERY_S:
            return
        self.looked_at = now
        keys = self.ctx.store.keys
        streams = stream_layout(keys, view.name, version, view.config).streams()
        added = [await self.ctx.store.entries_added(stream) for stream in streams]
        total = None if any(n is None for n in added) else sum(n or 0 for n in added)
        self.share.look(total, self.sent, now)

    def _finished(self, future: asyncio.Future[InferResponseMessage]) -> None:
        self.finished.append(future)
        self.ready.set()

    def answered(self, future: asyncio.Future[InferResponseMessage]) -> None:
        row, request, sent_at = self.in_flight.pop(future)
        if self.share is not None:
            self.share.answered(time.monotonic() - sent_at)
        try:
            response = future.result()
            if response.error is not None:
                raise SluiceError(response.error.code, response.error.message)
            line = output_line(
                row.custom_id,
                self.ctx.record.model,
                response.version,
                request,
                response.outputs,
                dict(response.parameters),
            )
        except SluiceError as exc:
            if exc.code is ErrorCode.UNAVAILABLE:
                self.later(row, exc)
            else:
                self.errors.append((row.line, error_line(row, exc)))
            return
        self.version = response.version
        self.outputs.append((row.line, line))

    async def write(self, force: bool = False) -> None:
        pending = len(self.outputs) + len(self.errors)
        due = time.monotonic() - self.written_at >= _WRITE_EVERY_S
        if pending and (force or due or pending >= _WRITE_AT):
            outputs, errors = self.outputs, self.errors
            self.outputs, self.errors = [], []
            written = await self.ctx.store.write_rows(self.ctx.record, outputs, errors)
            self.written_at = time.monotonic()
            if written is None:  # the job is final (cancelled) or gone: stop sending rows
                await self.stop()

    async def stop(self) -> None:
        """The job ended under this run (a refused write): end the run at once, as
        the watcher would (``runner._watch``), with the record's state as it is now."""
        ctx = self.ctx
        ctx.revoked = True
        state = await ctx.store.state(ctx.record.id)
        if state is not None:
            ctx.record.state = state
        ctx.changed.set()

    def drop_in_flight(self) -> None:
        """Cancel every row in flight (each leaves its stream unless an instance has it)."""
        in_flight = list(self.in_flight)
        self.in_flight.clear()
        for future in in_flight:
            future.cancel()

    async def wait(self) -> None:
        """Until an answer comes, the job changes, a waiting row is due, or a write is."""
        timeout = _WRITE_EVERY_S
        if self.waiting:
            timeout = min(timeout, max(0.0, self.waiting[0][0] - time.monotonic()))
        if not self.finished:
            ready = asyncio.ensure_future(self.ready.wait())
            changed = asyncio.ensure_future(self.ctx.changed.wait())
            try:
                await asyncio.wait(
                    [ready, changed], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                ready.cancel()
                changed.cancel()
        self.ready.clear()
        finished, self.finished = self.finished, []
        for future in finished:
            if future in self.in_flight and not future.cancelled():
                self.answered(future)


async def run_bulk(ctx: JobContext) -> RunResult:
    """Run ``ctx``'s bulk job to its end (or until it is interrupted or must wait)."""
    record = ctx.record
    rows = await _read_rows(ctx)
    if rows is None:
        return await ctx.fail(
            SluiceError(
                ErrorCode.NOT_FOUND, f"the rows of job '{record.id}' are gone", model=record.model
            )
        )
    if record.total != len(rows):
        record.total = len(rows)
        await ctx.store.set_fields(record.id, total=len(rows))
    done = await ctx.store.done_rows(record.id)
    bulk = _Bulk(ctx, [row for row in rows if row.line not in done])
    logger.info(
        "job %s of model '%s': %d rows, %d to run",
        record.id,
        record.model,
        len(rows),
        len(bulk.todo),
    )
    try:
        while bulk.todo or bulk.waiting or bulk.in_flight:
            if ctx.interrupted:
                bulk.drop_in_flight()
                await bulk.write(force=True)
                return ctx.end()
            if ctx.past_deadline():
                bulk.drop_in_flight()
                await bulk.write(force=True)
                return await ctx.fail(timed_out(record))
            try:
                view, resolved = await ctx.submission.resolve_for_infer(
                    record.model, record.version
                )
            except SluiceError as exc:
                if retryable(exc) and bulk.in_flight:
                    await bulk.wait()  # what is in flight may still be answered
                    await bulk.write()
                    continue
                await bulk.write(force=True)
                return await ctx.fail_or_retry(exc)
            bulk.send(view, resolved)
            await bulk.wait()
            await bulk.write()
            await bulk.look(view, resolved)
        await bulk.write(force=True)
    except BaseException:
        bulk.drop_in_flight()
        raise
    await ctx.store.transition(record, JobState.SUCCESS, model_version=bulk.version)
    return RunResult(Outcome.DONE, state=record.state.value)
