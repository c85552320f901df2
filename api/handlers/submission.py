"""Submitting an inference request: resolve the model version, validate, queue, await.

Shared by the HTTP inference endpoints (:mod:`api.http.infer`) and the gRPC
``ModelInfer`` / ``ModelStreamInfer`` calls. Validation rules:
docs/reference/model-configuration.md (Request validation); the path of a request
through Redis: docs/architecture.md. Queueing and cancellation are
:class:`~sluice.api.handlers.queueing.RequestQueue`'s, the response cache
:class:`~sluice.api.response_cache.ResponseCache`'s.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.api.handlers.ensembles import EnsembleRunner
from sluice.api.handlers.queueing import RequestQueue
from sluice.api.handlers.shutdown import Shutdown, shutting_down
from sluice.api.models import ModelRegistry, ModelView
from sluice.api.request_trace import RequestTrace
from sluice.api.response_cache import ResponseCache
from sluice.api.settings import GatewaySettings
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.messages import (
    InferRequestMessage,
    InferResponseMessage,
    ParameterValue,
    RequestedOutput,
    WireTensor,
)
from sluice.broker.replies import ReplyRouter
from sluice.broker.request_checks import validate_request
from sluice.broker.response_stream import ResponseStream
from sluice.broker.sequences import SequenceStepInfo

__all__ = ["InferResult", "Submission"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InferResult:
    """A model's answer, ready for a transport to encode."""

    model: str
    version: int
    client_id: str
    outputs: tuple[WireTensor, ...]
    parameters: dict[str, Any] = field(default_factory=dict)


class Submission:
    """Inference requests of one gateway process, from the transport to the queue and back.

    Args:
        settings: the gateway settings (``request_timeout_s``, ``gateway_id``).
        registry: cached model views.
        router: this gateway's reply router (answers come there).
        queue: where requests are queued.
        shutdown: the gateway's shutdown state.
        cache: the response cache (Triton ``--cache-config``); None: off.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        registry: ModelRegistry,
        router: ReplyRouter,
        queue: RequestQueue,
        shutdown: Shutdown,
        cache: ResponseCache | None,
    ) -> None:
        self._registry = registry
        self._router = router
        self._queue = queue
        self._shutdown = shutdown
        self.cache = cache
        self._timeout_ns = int(settings.request_timeout_s * 1e9)
        #: request ids: this gateway's id + a counter, unique across gateways and cheap.
        self._id_prefix = f"{settings.gateway_id}-"
        self._ids = itertools.count()
        self._ensembles = EnsembleRunner(registry, queue, self.next_request_id)

    async def infer(
        self,
        model: str,
        version: int | None,
        client_id: str,
        inputs: Sequence[WireTensor],
        outputs: Sequence[RequestedOutput],
        parameters: dict[str, ParameterValue],
        waited_ns: int = 0,
        on_queued: Callable[[], None] | None = None,
        trace: RequestTrace | None = None,
    ) -> InferResult:
        """Validate, queue and await one inference request.

        A failed request is logged once, with Sluice's request id (the id worker log
        lines carry), the client's id and the reason. ``waited_ns``: how long the caller
        already waited for the model's view, in ns (taken off the request timeout, with
        this call's own wait for it). ``on_queued`` is called once the request has been
        handed to the queue (before its answer is awaited), so that a caller can keep
        the steps of one sequence in the order they arrived. ``trace``: the request's
        trace (:mod:`api.request_trace`), given the instance's timestamps.

        Raises:
            SluiceError: UNAVAILABLE once the gateway began shutting down,
                NOT_FOUND/UNAVAILABLE from model resolution, INVALID_ARG from
                validation, UNSUPPORTED for decoupled models, UNAVAILABLE "Request timeout
                expired" past the deadline, or the error the model returned.
        """
        request_id = self.next_request_id()
        try:
            started_ns = time.monotonic_ns()
            view, resolved = await self.resolve_for_infer(model, version)
            waited_ns += time.monotonic_ns() - started_ns
            pending = self.submit(
                request_id, view, resolved, client_id, inputs, outputs, parameters,
                waited_ns=waited_ns, trace=trace,
            )  # fmt: skip
            if on_queued is not None:
                on_queued()
            response = await pending
            if trace is not None:
                trace.answered(response)
            return self.result(view.name, client_id, response)
        except SluiceError as exc:
            self.log_failure(request_id, client_id, model, version, exc)
            raise

    def next_request_id(self) -> str:
        """A request id unique across gateways: this gateway's id and a counter."""
        return f"{self._id_prefix}{next(self._ids):x}"

    @staticmethod
    def log_failure(
        request_id: str, client_id: str, model: str, version: int | None, exc: SluiceError
    ) -> None:
        """Log a failed request at debug level (as Triton, a verbose line: a client sending
        bad requests must not flood the log)."""
        logger.debug(
            "request %s (client id '%s') to model '%s' version %s failed: %s: %s",
            request_id,
            client_id,
            model,
            "-" if version is None else version,
            exc.code.value,
            exc.message,
        )

    async def resolve_for_infer(self, model: str, version: int | None) -> tuple[ModelView, int]:
        """The view and version an inference request runs on.

        While the server exits, the supervisor marks every version unloaded; a request
        that sees that before its gateway has begun shutting down gets the stopping
        server's 503 / UNAVAILABLE, not the 404 of an unknown model (the server-wide
        ``startup`` fact is ``exiting`` before any version is unloaded).

        A view that is not cached is read from Redis within the request timeout: a
        request that arrives while Redis does not answer gets "Request timeout expired"
        at its deadline, as one queued then does (the read itself would wait for the
        client's socket timeout, 15 s). The caller takes the wait off the request's
        timeout (:meth:`submit` ``waited_ns``).

        A model Redis does not know is answered 503 / UNAVAILABLE while the server's own
        record is missing too (Redis lost its data; the models are being published
        again), and read once more when that record is there (the republish may have
        finished between the two reads) before the 404.

        Raises:
            SluiceError: UNAVAILABLE "Server is shutting down" or "Request timeout
                expired", or what :meth:`ModelRegistry.resolve` raises.
        """
        if self._shutdown.exiting:
            raise shutting_down(model)
        view = self._registry.cached(model)
        if view is not None:
            return view, view.resolve(version)
        deadline_ns = time.monotonic_ns() + self._timeout_ns
        try:
            return await self._read_view(model, version, False, deadline_ns)
        except SluiceError as exc:
            if exc.code is not ErrorCode.NOT_FOUND:
                raise
            facts = await self._server_facts()
            if facts is not None and facts.get("startup") == "exiting":
                self._shutdown.seen_exiting()
                raise shutting_down(model) from None
            if facts == {}:
                # the supervisor's record is gone too: Redis lost the deployment's state
                # (restarted without its data) and ``sluice serve`` publishes it again
                # within a second; a 404 would read as final to clients and balancers
                raise SluiceError(
                    ErrorCode.UNAVAILABLE,
                    f"model '{model}' is not available: the server's state is missing "
                    "from Redis (restarted without its data?) and is being published "
                    "again",
                    model=model,
                ) from None
            if facts:
                # the server record is there: the model may have been published again
                # (after Redis lost its data) between the read above and this one, the
                # server record being the republish's last write; read it once more
                return await self._read_view(model, version, True, deadline_ns)
            raise

    async def _read_view(
        self, model: str, version: int | None, fresh: bool, deadline_ns: int
    ) -> tuple[ModelView, int]:
        """:meth:`ModelRegistry.resolve` by ``deadline_ns`` (``time.monotonic_ns``).

        Raises:
            SluiceError: UNAVAILABLE "Request timeout expired", or what
                :meth:`ModelRegistry.resolve` raises.
        """
        try:
            return await asyncio.wait_for(
                self._registry.resolve(model, version, fresh),
                max(0.0, (deadline_ns - time.monotonic_ns()) / 1e9),
            )
        except TimeoutError:
            raise SluiceError(
                ErrorCode.UNAVAILABLE, "Request timeout expired", model=model
            ) from None

    async def _server_facts(self) -> dict[str, str] | None:
        """The supervisor's server-wide facts; None when Redis cannot say."""
        try:
            return await self._registry.server_facts()
        except Exception:
            return None

    def cached_view(self, model: str, version: int | None) -> tuple[ModelView, int] | None:
        """:meth:`resolve_for_infer` without waiting: None when the view of ``model`` is
        not cached (or stale) and Redis must be read.

        Raises:
            SluiceError: as :meth:`resolve_for_infer`, for a cached view.
        """
        if self._shutdown.exiting:
            raise shutting_down(model)
        view = self._registry.cached(model)
        return None if view is None else (view, view.resolve(version))

    def submit(
        self,
        request_id: str,
        view: ModelView,
        resolved: int,
        client_id: str,
        inputs: Sequence[WireTensor],
        outputs: Sequence[RequestedOutput],
        parameters: dict[str, ParameterValue],
        *,
        checked: bool = False,
        waited_ns: int = 0,
        deadline_ns: int | None = None,
        trace: RequestTrace | None = None,
    ) -> asyncio.Future[InferResponseMessage]:
        """Validate and queue one request without waiting; the future gets its response.

        ``waited_ns``: how long the request already waited for its model's view
        (:meth:`resolve_for_infer`), in ns; its deadline is that much nearer.
        ``deadline_ns``: the request's wall-clock deadline (ns since the epoch) instead of
        the gateway's request timeout (an async job's own deadline).

        ``trace``: the request's trace (:mod:`api.request_trace`): its message carries
        the trace context to the instance (not through the response cache or an
        ensemble, whose requests are traced at the gateway only).

        ``checked``: the caller knows that a request with the same inputs' names,
        datatypes, shapes and byte sizes and the same outputs passed
        :func:`validate_request` against this same ``view`` (none of its inputs is
        ``BYTES``), so it is not checked again (:mod:`api.http.header_cache`).

        The request leaves with this event-loop iteration's other ``XADD``s. The future
        ends with the worker's response (see :meth:`result`), or fails with
        ``SluiceError``: UNAVAILABLE "Exceeds maximum queue size" (Triton
        ``max_queue_size``), "broker unavailable", or "Request timeout expired" once the
        gateway's deadline (``request_timeout_s``) passes. Cancelling the future (the
        client went away) takes the request off its stream if no instance has taken it
        yet and counts it failed, reason CANCELED (Triton ``request_cancellation.md``);
        one an instance holds still runs, and its answer is dropped.

        Raises:
            SluiceError: at once, UNSUPPORTED for a decoupled model or INVALID_ARG when the
                request does not match the model config (:func:`validate_request`).
        """
        model = view.name
        step = self.check(view, inputs, outputs, parameters, checked=checked)
        now_ns = time.time_ns()
        if deadline_ns is None:
            deadline_ns = now_ns + self._timeout_ns - waited_ns
        state = view.versions.get(resolved)
        message = InferRequestMessage(
            request_id=request_id,
            client_id=client_id,
            model=model,
            version=resolved,
            inputs=tuple(inputs),
            outputs=tuple(o.name for o in outputs),
            parameters=parameters,
            reply_to=self._router.reply_key,
            deadline_ns=deadline_ns,
            enqueued_ns=now_ns,
            classification={o.name: o.class_count for o in outputs if o.class_count > 0},
            load_id=state.load_id if state is not None else "",
        )
        if trace is not None:
            context = trace.queued(resolved, client_id, now_ns)
            if view.ensemble is None and not (
                self.cache is not None and view.config.response_cache.enable
            ):
                message.trace = context
        if view.ensemble is not None:
            return self._ensembles.submit(message, view)
        if self.cache is not None and view.config.response_cache.enable:
            return self.cache.submit(message, functools.partial(self._queue.enqueue, message, view))
        return self._queue.enqueue(message, view, step)

    def submit_stream(
        self,
        request_id: str,
        view: ModelView,
        resolved: int,
        client_id: str,
        inputs: Sequence[WireTensor],
        outputs: Sequence[RequestedOutput],
        parameters: dict[str, ParameterValue],
        waited_ns: int = 0,
    ) -> ResponseStream:
        """Validate and queue one request to a decoupled model; its responses arrive on
        the stream returned (gRPC streaming and the generate extension use it).

        Raises:
            SluiceError: at once, INVALID_ARG when the request does not match the model
                config (:func:`validate_request`).
        """
        validate_request(view, inputs, outputs)
        now_ns = time.time_ns()
        state = view.versions.get(resolved)
        message = InferRequestMessage(
            request_id=request_id,
            client_id=client_id,
            model=view.name,
            version=resolved,
            inputs=tuple(inputs),
            outputs=tuple(o.name for o in outputs),
            parameters=parameters,
            reply_to=self._router.reply_key,
            deadline_ns=now_ns + self._timeout_ns - waited_ns,
            enqueued_ns=now_ns,
            classification={o.name: o.class_count for o in outputs if o.class_count > 0},
            load_id=state.load_id if state is not None else "",
        )
        return self._queue.enqueue_stream(message, view)

    @staticmethod
    def check(
        view: ModelView,
        inputs: Sequence[WireTensor],
        outputs: Sequence[RequestedOutput],
        parameters: dict[str, ParameterValue],
        *,
        checked: bool = False,
    ) -> SequenceStepInfo | None:
        """Refuse a request the model cannot take, as :meth:`submit` does before queueing
        it; returns its sequence step (None: not a sequence model).

        Raises:
            SluiceError: UNSUPPORTED for a decoupled model, INVALID_ARG when the request
                does not match the model config (:func:`validate_request`) or breaks the
                sequence batcher's rules.
        """
        if view.decoupled:
            raise SluiceError(
                ErrorCode.UNSUPPORTED,
                f"model '{view.name}': HTTP end point doesn't support models with decoupled "
                "transaction policy",
                model=view.name,
            )
        if not checked:
            validate_request(view, inputs, outputs)
        return None if view.sequence is None else view.sequence.check(parameters, tuple(inputs))

    @staticmethod
    def result(model: str, client_id: str, response: InferResponseMessage) -> InferResult:
        """The worker's response as an :class:`InferResult`.

        Raises:
            SluiceError: the error the model (or the worker) answered with.
        """
        if response.error is not None:
            raise SluiceError(response.error.code, response.error.message, model=model)
        return InferResult(
            model, response.version, client_id, response.outputs, dict(response.parameters)
        )
