"""Running an ensemble request: each step an ordinary request on its model's stream.

The gateway that received an ensemble request runs its steps (Triton
``docs/user_guide/ensemble_models.md``; core ``src/ensemble_scheduler``): a step
starts as soon as every ensemble tensor it reads exists, as a request on its
composing model's stream (so it batches and queues with that model's direct traffic,
by the request's priority level), with the ensemble request's deadline and
parameters; independent steps run side by side. Only the steps that lead to the
requested outputs run, and the answer leaves as soon as those outputs exist.

A step's outputs come back on this gateway's reply key like any answer, and the
tensors a later step reads leave again in that step's request: they are not decoded,
copied into new arrays or encoded again, and no Redis command is added for them
(docs/user-guide/ensembles-and-bls.md says why they do not go through Redis keys of
their own). A failing step fails the request with the step's model named; cancelling
the request (the client went away) cancels the steps in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sluice.api.handlers.queueing import RequestQueue
from sluice.api.models import ModelRegistry, ModelView
from sluice.broker.errors import ErrorCode, FailureReason, SluiceError
from sluice.broker.messages import (
    InferRequestMessage,
    InferResponseMessage,
    RequestedOutput,
    WireTensor,
)
from sluice.broker.request_checks import validate_request
from sluice.broker.stats_store import StatsDelta
from sluice.repository.ensemble import LATEST, EnsemblePlan, EnsembleStep

__all__ = ["EnsembleRunner"]

logger = logging.getLogger(__name__)


class EnsembleRunner:
    """Runs the ensemble requests of one gateway process.

    Args:
        registry: cached model views (composing models are resolved per step).
        queue: where step requests are queued.
        next_request_id: a new request id, unique across gateways, per step.
    """

    def __init__(
        self, registry: ModelRegistry, queue: RequestQueue, next_request_id: Callable[[], str]
    ) -> None:
        self._registry = registry
        self._queue = queue
        self._next_id = next_request_id

    def submit(
        self, message: InferRequestMessage, view: ModelView
    ) -> asyncio.Future[InferResponseMessage]:
        """Run ``message`` (already checked against the ensemble's config) through the
        ensemble's steps; the future ends with the ensemble's answer (its outputs named
        as the ensemble's, in the order asked for) or fails with ``SluiceError``.
        Cancelling it cancels the steps in flight."""
        return asyncio.ensure_future(self._counted(message, view))

    async def _counted(self, message: InferRequestMessage, view: ModelView) -> InferResponseMessage:
        """:meth:`run`, counted in the ensemble's statistics (Triton keeps statistics for
        the ensemble and for each composing model; the composing models' instances count
        the steps)."""
        delta = StatsDelta()
        try:
            response = await self.run(message, view)
        except asyncio.CancelledError:
            delta.failure(request_ns=_since(message), reason=FailureReason.CANCELED)
            self._queue.count(message.model, message.version, delta)
            raise
        except SluiceError as exc:
            reason = (
                FailureReason.BACKEND if exc.code is ErrorCode.INTERNAL else FailureReason.OTHER
            )
            delta.failure(request_ns=_since(message), reason=reason)
            self._queue.count(message.model, message.version, delta)
            raise
        delta.add("success_count", 1)
        delta.add("success_ns", _since(message))
        delta.add("inference_count", _batch_size(view, message))
        delta.add("execution_count", 1)
        delta.last_inference_ms = time.time_ns() // 1_000_000
        self._queue.count(message.model, message.version, delta)
        return response

    async def run(self, message: InferRequestMessage, view: ModelView) -> InferResponseMessage:
        """The steps of one ensemble request, each started once its inputs exist.

        Raises:
            SluiceError: a step's error (its model named), or the request's deadline.
            asyncio.CancelledError: the request was cancelled (its steps are too).
        """
        plan = view.ensemble
        assert plan is not None, f"model '{view.name}' is not an ensemble"
        wanted = message.outputs or plan.outputs
        pending = set(plan.needed_steps(wanted))
        tensors: dict[str, WireTensor] = {t.name: t for t in message.inputs}
        running: dict[asyncio.Future[InferResponseMessage], EnsembleStep] = {}
        try:
            while True:
                for index in plan.ready_steps(tensors.keys(), pending):
                    pending.discard(index)
                    step = plan.steps[index]
                    running[await self._start(plan, step, message, tensors)] = step
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    step = running.pop(future)
                    _take_outputs(plan, step, _answer(plan, step, future), tensors)
        finally:
            for future in running:
                future.cancel()
        missing = [name for name in wanted if name not in tensors]
        if missing:
            raise SluiceError(
                ErrorCode.INTERNAL,
                f"in ensemble '{plan.name}', output '{missing[0]}' was not produced",
                model=plan.name,
            )
        return InferResponseMessage(
            message.request_id,
            message.model,
            message.version,
            outputs=tuple(tensors[name] for name in wanted),
        )

    async def _start(
        self,
        plan: EnsemblePlan,
        step: EnsembleStep,
        message: InferRequestMessage,
        tensors: dict[str, WireTensor],
    ) -> asyncio.Future[InferResponseMessage]:
        """Queue one step on its composing model (or run it, for an ensemble in an
        ensemble); the future of its answer.

        Raises:
            SluiceError: the composing model is unknown or not ready, or the step's tensors
                do not fit its config (INVALID_ARG), the step named.
        """
        try:
            view, version = await self._registry.resolve(
                step.model, None if step.version == LATEST else step.version
            )
            inputs = tuple(
                WireTensor(name, tensors[t].datatype, tensors[t].shape, tensors[t].data)
                for name, t in step.inputs
            )
            outputs = [
                RequestedOutput(name, class_count=message.classification.get(t, 0))
                for name, t in step.outputs
            ]
            validate_request(view, inputs, outputs)
            sequence = None if view.sequence is None else view.sequence.check(
                message.parameters, inputs
            )  # fmt: skip
        except SluiceError as exc:
            raise _step_error(plan, step, exc) from None
        state = view.versions.get(version)
        now_ns = time.time_ns()
        request = InferRequestMessage(
            request_id=self._next_id(),
            client_id=message.client_id,
            model=view.name,
            version=version,
            inputs=inputs,
            outputs=tuple(o.name for o in outputs),
            parameters=message.parameters,
            reply_to=message.reply_to,
            deadline_ns=message.deadline_ns,
            enqueued_ns=now_ns,
            classification={o.name: o.class_count for o in outputs if o.class_count > 0},
            load_id=state.load_id if state is not None else "",
        )
        if view.ensemble is not None:
            return asyncio.ensure_future(self.run(request, view))
        return self._queue.enqueue(request, view, sequence)


def _answer(
    plan: EnsemblePlan, step: EnsembleStep, future: asyncio.Future[InferResponseMessage]
) -> InferResponseMessage:
    """A finished step's answer.

    Raises:
        SluiceError: the step failed (its error, the step named).
    """
    try:
        response = future.result()
    except SluiceError as exc:
        raise _step_error(plan, step, exc) from None
    if response.error is not None:
        exc = SluiceError(response.error.code, response.error.message, model=step.model)
        raise _step_error(plan, step, exc)
    return response


def _take_outputs(
    plan: EnsemblePlan,
    step: EnsembleStep,
    response: InferResponseMessage,
    tensors: dict[str, WireTensor],
) -> None:
    """Name a step's outputs as the ensemble's tensors (the bytes are not copied)."""
    names = dict(step.outputs)
    for out in response.outputs:
        tensor = names.get(out.name)
        if tensor is not None:
            tensors[tensor] = WireTensor(tensor, out.datatype, out.shape, out.data)


def _step_error(plan: EnsemblePlan, step: EnsembleStep, exc: SluiceError) -> SluiceError:
    """The error of a failed step as the ensemble request's: same code, the step named."""
    return SluiceError(
        exc.code,
        f"in ensemble '{plan.name}', {step.label()}: {exc.message}",
        model=plan.name,
    )


def _since(message: InferRequestMessage) -> int:
    """ns since the request was queued."""
    return max(0, time.time_ns() - message.enqueued_ns)


def _batch_size(view: ModelView, message: InferRequestMessage) -> int:
    """Triton ``inference_count``: the batch size of a batching model's request, else 1."""
    if view.max_batch_size > 0 and message.inputs and message.inputs[0].shape:
        return int(message.inputs[0].shape[0])
    return 1
