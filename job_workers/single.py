"""Running a single job: one request on its model's stream, its answer kept in Redis.

The request is the one the gateway checked and stored; it is queued through the same
submission path as a synchronous request, with the job's deadline. The answer is kept
once (``JobStore.store_result``) and the job moves to SUCCESS once; an error answer
fails it with the synchronous call's code and text, and an unavailable model (not
ready, its queue full) has the task tried again with backoff until the deadline.
"""

from __future__ import annotations

import asyncio

from sluice.broker.codec import encode_response
from sluice.broker.errors import SluiceError
from sluice.broker.job_records import decode_job_request
from sluice.broker.states import JobState
from sluice.job_workers.context import JobContext, Outcome, RunResult

__all__ = ["run_single"]


async def run_single(ctx: JobContext) -> RunResult:
    """Run ``ctx``'s single job to its end (or until it is interrupted or must wait)."""
    record = ctx.record
    payload = await ctx.store.input(record.id)
    if payload is None:  # expired under it
        return RunResult(Outcome.DONE)
    request = decode_job_request(payload)
    sub = ctx.submission
    try:
        view, resolved = await sub.resolve_for_infer(record.model, record.version)
        future = sub.submit(
            f"{record.id}.{record.attempts}",
            view,
            resolved,
            request.client_id,
            request.inputs,
            request.outputs,
            request.parameters,
            deadline_ns=record.deadline_ns,
        )
    except SluiceError as exc:
        return await ctx.fail_or_retry(exc)
    changed = asyncio.ensure_future(ctx.changed.wait())
    try:
        await asyncio.wait({future, changed}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        changed.cancel()
    if not future.done():
        future.cancel()  # cancelled or stopping: taken off its stream unless an instance has it
        return ctx.end()
    try:
        response = future.result()
        sub.result(record.model, request.client_id, response)  # raises the model's error
    except SluiceError as exc:
        return await ctx.fail_or_retry(exc)
    if ctx.lost:
        return ctx.end()
    await ctx.store.store_result(record, encode_response(response))
    await ctx.store.transition(record, JobState.SUCCESS, model_version=response.version)
    return RunResult(Outcome.DONE, state=record.state.value)
