"""Transport-neutral request handling: the HTTP routes and the gRPC servicer both call this.

Validate against the model config, queue on the model version's stream,
wait for the reply until the request's deadline (MLServer ``handlers/DataPlane``).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio
import redis.exceptions

from sluice.api.log_settings import LogSettings
from sluice.api.models import ModelRegistry, ModelView
from sluice.api.response_cache import ResponseCache
from sluice.api.settings import GatewaySettings
from sluice.broker.codec import CodecError, decode_request
from sluice.broker.control import ControlCommand, encode_command
from sluice.broker.errors import ErrorCode, FailureReason, SluiceError
from sluice.broker.keys import KeySchema
from sluice.broker.messages import (
    InferRequestMessage,
    InferResponseMessage,
    ParameterValue,
    RequestedOutput,
    WireTensor,
)
from sluice.broker.multiplex import MultiplexedConnection
from sluice.broker.producer import PAYLOAD_FIELD, QUEUE_FULL, Producer, enqueue_error
from sluice.broker.replies import ReplyRouter
from sluice.broker.request_checks import validate_request
from sluice.broker.scheduling import StreamLayout
from sluice.broker.states import ModelState
from sluice.broker.stats_store import StatsDelta, read_stats, triton_model_stats

logger = logging.getLogger(__name__)

#: longest wait of a health check (live, ready) on Redis, in s: Kubernetes probes time
#: out after 1 s by default, the Redis socket timeout is 15 s.
HEALTH_DEADLINE_S = 2.0

#: extensions this server implements, in Triton's order (PROTOCOL.md 0).
EXTENSIONS = (
    "classification",
    "model_repository",
    "model_repository(unload_dependents)",  # accepted; no ensembles, so no dependents
    "schedule_policy",  # the request parameters priority and timeout
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "logging",
)


@dataclass(frozen=True, slots=True)
class InferResult:
    """A model's answer, ready for a transport to encode."""

    model: str
    version: int
    client_id: str
    outputs: tuple[WireTensor, ...]
    parameters: dict[str, Any] = field(default_factory=dict)


class DataPlane:
    """What every front end of one gateway process shares.

    Args:
        settings: the gateway settings.
        client: the gateway's Redis client.
        registry: cached model views.
        router: this gateway's reply router (already started).
        connection: the multiplexed connection requests are queued through (started
            with the router).
    """

    def __init__(
        self,
        settings: GatewaySettings,
        client: redis.asyncio.Redis,
        registry: ModelRegistry,
        router: ReplyRouter,
        connection: MultiplexedConnection,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self._redis = client
        self.router = router
        self._keys = KeySchema(settings.redis.key_prefix)
        self._timeout_ns = int(settings.request_timeout_s * 1e9)
        self.log_settings = LogSettings.from_options(settings.log_options())
        """Triton's logging extension settings, shared by HTTP and gRPC."""
        self.connection = connection
        self._producer = Producer(connection)
        #: request ids: this gateway's id + a counter, unique across gateways and cheap.
        self._id_prefix = f"{settings.gateway_id}-"
        self._ids = itertools.count()
        self._exiting = False
        #: :meth:`begin_shutdown` was called (``_exiting`` is also set when the deployment
        #: is seen exiting while this gateway runs on)
        self._shutdown_begun = False
        #: called once when shutdown begins (:meth:`on_shutdown`)
        self._shutdown_callbacks: set[Callable[[], None]] = set()
        #: (model, version) -> its stream layout, rebuilt when the view's policy changes
        self._layouts: dict[tuple[str, int], StreamLayout] = {}
        #: rejection counts being written (kept referenced until done)
        self._background: set[asyncio.Future[None]] = set()
        #: the response cache (Triton ``--cache-config``); None: off
        self.cache = (
            ResponseCache(connection, self._keys, settings.cache_size_bytes)
            if settings.cache_size_bytes > 0
            else None
        )

    def begin_shutdown(self) -> None:
        """Refuse new inference requests from now on (the server is exiting).

        Requests already queued are still awaited; new ones get UNAVAILABLE at once
        instead of being queued for instances that are stopping. Calls what
        :meth:`on_shutdown` registered (once).
        """
        self._exiting = True
        if self._shutdown_begun:
            return
        self._shutdown_begun = True
        for callback in list(self._shutdown_callbacks):
            callback()
        self._shutdown_callbacks.clear()

    def on_shutdown(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Have ``callback`` called when this gateway begins to shut down
        (:meth:`begin_shutdown`; at once if it has); returns the function that withdraws
        it. A deployment seen exiting from here (the gateway runs on) calls nothing."""
        if self._shutdown_begun:
            callback()
            return lambda: None
        self._shutdown_callbacks.add(callback)
        return functools.partial(self._shutdown_callbacks.discard, callback)

    # -- health -----------------------------------------------------------------------------

    async def server_live(self) -> bool:
        """Liveness: this gateway serves (its event loop answers) and is not stopping
        (:meth:`begin_shutdown`). Redis is not asked, as
        Triton's live depends on nothing but the server itself (PROTOCOL.md 1.3: 200 once
        initialized): a Redis outage makes the server and its models not ready, and a
        liveness probe that restarted every gateway for it would not bring Redis back."""
        return not self._exiting

    async def any_instance_live(self) -> bool:
        """Whether some instance of some model version has a fresh heartbeat (one that
        may still answer a request in flight).

        Raises:
            redis.exceptions.RedisError: Redis unreachable.
        """
        for record in await self.registry.records():
            for version in record.versions:
                if await self.registry.live_instances(record.name, version):
                    return True
        return False

    async def server_ready(self) -> bool:
        """Readiness (Triton ``--strict-readiness``): start-up done and every model READY.

        A version UNAVAILABLE with reason ``unloaded`` does not count against readiness;
        a READY version with no live instance (every heartbeat stale, e.g. the
        supervisor was killed) does. Not ready when Redis does not answer within
        :data:`HEALTH_DEADLINE_S`.
        """
        return await _probe(self._ready())

    async def _ready(self) -> bool:
        facts = await self.registry.server_facts()
        if facts.get("startup") != "done":
            return False
        if not self.settings.strict_readiness:
            return True
        for record in await self.registry.records():
            for version, state in record.versions.items():
                if state.state is ModelState.READY:
                    if not await self.registry.live_instances(record.name, version):
                        return False  # READY on record, but no instance answers
                    continue
                if state.state is ModelState.UNAVAILABLE and state.reason == "unloaded":
                    continue
                return False
        return True

    async def model_ready(self, model: str, version: int | None) -> bool:
        """Whether the model (version) is READY in Redis (not only in the gateway's
        cache) and has a live instance now; False when Redis does not answer within
        :data:`HEALTH_DEADLINE_S` (a probe, like the server's).

        Raises:
            SluiceError: from model resolution (NOT_FOUND unknown, UNAVAILABLE loading or
                unloaded); the HTTP endpoint answers them all "not ready", as Triton's.
        """

        async def check() -> bool:
            _, resolved = await self.registry.resolve(model, version, fresh=True)
            return await self.registry.live_instances(model, resolved) > 0

        return await _probe(check())

    async def model_readiness(self, model: str, version: int | None) -> bool:
        """gRPC ``ModelReady``: an unknown model or version raises, a known one answers
        (READY in Redis with a live instance; False when Redis does not answer within
        :data:`HEALTH_DEADLINE_S`).

        Raises:
            SluiceError: NOT_FOUND for a model that never loaded or a version it
                does not have (the gRPC servicer answers it ``ready: false``, as Triton
                2.51 does).
        """

        async def check() -> bool:
            view = await self.registry.get(model, fresh=True)
            if version is not None and version not in view.versions:
                raise SluiceError(
                    ErrorCode.NOT_FOUND,
                    f"Request for unknown model: '{model}' version {version} is not found",
                    model=model,
                )
            try:
                resolved = view.resolve(version)
            except SluiceError:
                return False
            return await self.registry.live_instances(model, resolved) > 0

        return await _probe(check())

    # -- metadata ---------------------------------------------------------------------------

    def server_metadata(self) -> dict[str, Any]:
        """``GET /v2`` body (PROTOCOL.md 1.4)."""
        from sluice import __version__

        return {
            "name": self.settings.server_id,
            "version": __version__,
            "extensions": list(EXTENSIONS),
        }

    async def model_metadata(self, model: str, version: int | None) -> dict[str, Any]:
        """``GET /v2/models/{m}`` body (PROTOCOL.md 1.5)."""
        view, resolved = await self.registry.resolve(model, version)
        versions = (
            [str(resolved)] if version is not None else [str(v) for v in view.ready_versions()]
        )

        def shape(dims: Sequence[int]) -> list[int]:
            return [-1, *dims] if view.max_batch_size > 0 else list(dims)

        return {
            "name": view.name,
            "versions": versions,
            "platform": view.platform,
            "inputs": [
                {"name": s.name, "datatype": s.datatype, "shape": shape(s.dims)}
                for s in view.inputs.values()
            ],
            "outputs": [
                {"name": s.name, "datatype": s.datatype, "shape": shape(s.dims)}
                for s in view.outputs.values()
            ],
        }

    async def model_config(self, model: str, version: int | None) -> ModelView:
        """The view whose ``config`` / ``config_json`` a config endpoint returns."""
        view, _ = await self.registry.resolve(model, version)
        return view

    async def repository_index(self, ready_only: bool) -> list[dict[str, str]]:
        """Repository index entries (PROTOCOL.md 1.8), sorted by model name."""
        entries: list[dict[str, str]] = []
        for record in await self.registry.records():
            if not record.versions:
                if not ready_only:
                    entries.append({"name": record.name})
                continue
            for version, state in sorted(record.versions.items()):
                if ready_only and state.state is not ModelState.READY:
                    continue
                entry = {"name": record.name, "version": str(version), "state": state.state.value}
                if state.reason:
                    entry["reason"] = state.reason
                entries.append(entry)
        return entries

    async def control_mode(self) -> str:
        """The supervisor's model control mode (``none``, ``poll`` or ``explicit``)."""
        return (await self.registry.server_facts()).get("model_control_mode", "none")

    async def load_model(
        self, model: str, config_json: str = "", files: dict[str, bytes] | None = None
    ) -> None:
        """Triton model repository extension: load or reload, blocking until done.

        Args:
            model: model name.
            config_json: Triton's ``config`` parameter (ModelConfig JSON), "" for none.
            files: Triton's ``file:<version>/<path>`` parameters, decoded: path -> bytes.

        Raises:
            SluiceError: UNAVAILABLE in ``none``/``poll`` mode (Triton's text); INTERNAL
                for a model in no repository; INVALID_ARG "load failed for model 'm': ...".
        """
        await self._refuse_control()
        await self._control(
            ControlCommand(
                uuid.uuid4().hex, "load", model, self.router.reply_key, config_json, files or {}
            )
        )

    async def unload_model(self, model: str, unload_dependents: bool = False) -> None:
        """Triton model repository extension: unload, blocking until no version is READY.

        Raises:
            SluiceError: UNAVAILABLE in ``none``/``poll`` mode (Triton's text).
        """
        await self._refuse_control()
        await self._control(
            ControlCommand(
                uuid.uuid4().hex,
                "unload",
                model,
                self.router.reply_key,
                unload_dependents=unload_dependents,
            )
        )

    async def _control(self, command: ControlCommand) -> None:
        deadline = time.time_ns() + int(self.settings.control_timeout_s * 1e9)
        future = self.router.expect(command.command_id, deadline)
        try:
            await self._redis.xadd(self._keys.control(), {b"c": encode_command(command)})
        except BaseException:
            future.cancel()  # its registration and timer go with it
            raise
        reply = await future
        self.registry.invalidate(command.model)
        if reply.error is not None:
            raise SluiceError(reply.error.code, reply.error.message, model=command.model)

    async def _refuse_control(self) -> None:
        if await self.control_mode() != "explicit":
            raise SluiceError(
                ErrorCode.UNAVAILABLE,
                "explicit model load / unload is not allowed if polling is enabled",
            )

    async def _count_rejection(self, model: str, version: int, request_ns: int) -> None:
        delta = StatsDelta()
        delta.failure(request_ns=request_ns, reason=FailureReason.REJECTED)
        key = self._keys.stats(model, version)
        await self.connection.run_all(
            [("HINCRBY", key, name, n) for name, n in delta.counts.items()]
        )

    # -- statistics -------------------------------------------------------------------------

    async def statistics(self, model: str | None, version: int | None) -> dict[str, Any]:
        """Triton statistics extension body (PROTOCOL.md 1.9): READY versions only.

        Raises:
            SluiceError: INVALID_ARG "requested model 'm' is not available" /
                "requested model version is not available for model 'm'" (Triton's texts).
        """
        targets: list[tuple[str, int]] = []
        if model is None:
            for record in await self.registry.records():
                targets.extend(
                    (record.name, v)
                    for v, s in sorted(record.versions.items())
                    if s.state is ModelState.READY
                )
        else:
            try:
                view = await self.registry.get(model)
            except SluiceError:
                view = None
            ready = view.ready_versions() if view is not None else []
            if not ready:
                raise SluiceError(
                    ErrorCode.INVALID_ARG,
                    f"requested model '{model}' is not available",
                    model=model,
                )
            if version is not None and version not in ready:
                raise SluiceError(
                    ErrorCode.INVALID_ARG,
                    f"requested model version is not available for model '{model}'",
                    model=model,
                )
            targets = [(model, v) for v in ([version] if version is not None else ready)]
        stats = await read_stats(self._redis, self._keys, targets)
        return {
            "model_stats": [
                triton_model_stats(name, v, s) for (name, v), s in zip(targets, stats, strict=True)
            ]
        }

    # -- inference --------------------------------------------------------------------------

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
        if self._exiting:
            raise _shutting_down(model)
        view = self.registry.cached(model)
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
                self._exiting = True
                raise _shutting_down(model) from None
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
                self.registry.resolve(model, version, fresh),
                max(0.0, (deadline_ns - time.monotonic_ns()) / 1e9),
            )
        except TimeoutError:
            raise SluiceError(
                ErrorCode.UNAVAILABLE, "Request timeout expired", model=model
            ) from None

    async def _server_facts(self) -> dict[str, str] | None:
        """The supervisor's server-wide facts; None when Redis cannot say."""
        try:
            return await self.registry.server_facts()
        except Exception:
            return None

    async def infer(
        self,
        model: str,
        version: int | None,
        client_id: str,
        inputs: Sequence[WireTensor],
        outputs: Sequence[RequestedOutput],
        parameters: dict[str, ParameterValue],
        waited_ns: int = 0,
    ) -> InferResult:
        """Validate, queue and await one inference request.

        A failed request is logged once, with Sluice's request id (the id worker log
        lines carry), the client's id and the reason. ``waited_ns``: how long the caller
        already waited for the model's view, in ns (taken off the request timeout, with
        this call's own wait for it).

        Raises:
            SluiceError: UNAVAILABLE once :meth:`begin_shutdown` was called,
                NOT_FOUND/UNAVAILABLE from model resolution, INVALID_ARG from
                validation, UNSUPPORTED for decoupled models, UNAVAILABLE "Request timeout
                expired" past the deadline, or the error the model returned.
        """
        request_id = self.next_request_id()
        try:
            started_ns = time.monotonic_ns()
            view, resolved = await self.resolve_for_infer(model, version)
            waited_ns += time.monotonic_ns() - started_ns
            response = await self.submit(
                request_id, view, resolved, client_id, inputs, outputs, parameters,
                waited_ns=waited_ns,
            )  # fmt: skip
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

    def cached_view(self, model: str, version: int | None) -> tuple[ModelView, int] | None:
        """:meth:`resolve_for_infer` without waiting: None when the view of ``model`` is
        not cached (or stale) and Redis must be read.

        Raises:
            SluiceError: as :meth:`resolve_for_infer`, for a cached view.
        """
        if self._exiting:
            raise _shutting_down(model)
        view = self.registry.cached(model)
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
    ) -> asyncio.Future[InferResponseMessage]:
        """Validate and queue one request without waiting; the future gets its response.

        ``waited_ns``: how long the request already waited for its model's view
        (:meth:`resolve_for_infer`), in ns; its deadline is that much nearer.

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
        if view.decoupled:
            raise SluiceError(
                ErrorCode.UNSUPPORTED,
                f"model '{model}': HTTP end point doesn't support models with decoupled "
                "transaction policy",
                model=model,
            )
        if not checked:
            validate_request(view, inputs, outputs)
        now_ns = time.time_ns()
        state = view.versions.get(resolved)
        message = InferRequestMessage(
            request_id=request_id,
            client_id=client_id,
            model=model,
            version=resolved,
            inputs=tuple(inputs),
            outputs=tuple(o.name for o in outputs),
            parameters=parameters,
            reply_to=self.router.reply_key,
            deadline_ns=now_ns + self._timeout_ns - waited_ns,
            enqueued_ns=now_ns,
            classification={o.name: o.class_count for o in outputs if o.class_count > 0},
            load_id=state.load_id if state is not None else "",
        )
        if self.cache is not None and view.config.response_cache.enable:
            return self.cache.submit(
                message,
                functools.partial(self._enqueue, message, view, model, resolved, now_ns),
            )
        return self._enqueue(message, view, model, resolved, now_ns)

    def _enqueue(
        self,
        message: InferRequestMessage,
        view: ModelView,
        model: str,
        resolved: int,
        now_ns: int,
    ) -> asyncio.Future[InferResponseMessage]:
        """Queue ``message`` on its priority level's stream; the future of its answer."""
        request_id, parameters = message.request_id, message.parameters
        layout = self._layouts.get((model, resolved))
        if layout is None or layout.policy is not view.policy:
            layout = StreamLayout(self._keys, model, resolved, view.policy)
            self._layouts[(model, resolved)] = layout
        level = layout.level_of(int(parameters.get("priority", 0) or 0))
        max_queue_size = view.policy.queue_policy(level).max_queue_size
        stream = layout.stream(level)
        # the XADD leaves at the end of this loop iteration: registered below before any
        # reply can come; its future keeps the entry id for a cancellation
        queued = self._producer.submit(stream, message, max_queue_size)
        future = self.router.expect(
            request_id,
            message.deadline_ns,
            functools.partial(self._cancelled, stream, model, resolved, now_ns, queued),
        )
        queued.add_done_callback(functools.partial(self._queued, future, model, resolved, now_ns))
        return future

    def _queued(
        self,
        future: asyncio.Future[InferResponseMessage],
        model: str,
        version: int,
        enqueued_ns: int,
        queued: asyncio.Future[Any],
    ) -> None:
        """Redis answered the ``XADD``: a refusal or an unreachable Redis fails the request
        (a queue-full refusal counts as a failure, reason REJECTED, lasting from the
        request's arrival until now, as Triton's request statistics)."""
        if queued.cancelled():
            error: BaseException = SluiceError(
                ErrorCode.UNAVAILABLE, "Server exiting: request not queued", model=model
            )
        elif (exc := queued.exception()) is None:
            return
        else:
            error = enqueue_error(exc, model)
        if isinstance(error, SluiceError) and error.message == QUEUE_FULL:
            request_ns = max(0, time.time_ns() - enqueued_ns)
            task = asyncio.ensure_future(self._count_rejection(model, version, request_ns))
            self._background.add(task)
            task.add_done_callback(self._counted)
        if not future.done():
            future.set_exception(error)

    def _cancelled(
        self,
        stream: str,
        model: str,
        version: int,
        enqueued_ns: int,
        queued: asyncio.Future[Any],
    ) -> None:
        """The client cancelled the request (gRPC cancellation or deadline, HTTP connection
        lost): take it off its stream if no instance has taken it yet (in the background,
        once the ``XADD`` has answered). Not while the server exits: what is cancelled then
        is mostly the server's doing (gRPC's grace period, uvicorn's shutdown timeout; a
        client's own cancellation is not told apart), and :meth:`drop_unanswered` takes
        what is left, uncounted. Never raises (it runs in a done callback); a failed
        cancellation is logged (:meth:`_cancel_ended`)."""
        if self._exiting:
            return
        if not queued.done():
            queued.add_done_callback(
                functools.partial(self._cancelled, stream, model, version, enqueued_ns)
            )
            return
        if queued.cancelled() or queued.exception() is not None:
            return  # never queued
        task = asyncio.ensure_future(
            self._cancel_queued(stream, queued.result(), model, version, enqueued_ns)
        )
        self._background.add(task)
        task.add_done_callback(self._cancel_ended)

    async def _cancel_queued(
        self, stream: str, entry_id: bytes, model: str, version: int, enqueued_ns: int
    ) -> None:
        async with asyncio.timeout(self.settings.redis.socket_timeout_s):
            taken = await self._producer.cancel(
                stream,
                entry_id,
                self._keys.stats(model, version),
                time.time_ns() - enqueued_ns,
            )
        logger.debug(
            "cancelled request of model '%s' version %d (entry %s): %s",
            model,
            version,
            entry_id.decode(),
            "taken off the queue" if taken else "already taken by an instance, it runs",
        )

    def _cancel_ended(self, task: asyncio.Future[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.warning(
                "could not take a cancelled request off its queue: %s",
                "Redis did not answer in time" if isinstance(exc, TimeoutError) else exc,
            )

    async def drop_unanswered(self) -> int:
        """At exit, after :meth:`ReplyRouter.stop` answered every waiting client: take this
        gateway's requests that are still queued off their streams, so no instance runs
        them later (Triton drops what it has not run when it exits; a later server on the
        same Redis would otherwise run them and count them). Returns how many it took.

        An instance that already holds one of them still runs it; its answer is dropped.

        Raises:
            redis.exceptions.RedisError: Redis unreachable.
        """
        dropped = 0
        for layout in list(self._layouts.values()):
            for stream in layout.streams():
                ids: list[bytes] = []
                start: bytes | str = "-"
                while True:
                    entries = await self._redis.xrange(stream, min=start, max="+", count=500)
                    for entry_id, fields in entries:
                        try:
                            reply_to = decode_request(fields[PAYLOAD_FIELD]).reply_to
                        except (CodecError, KeyError):
                            continue
                        if reply_to == self.router.reply_key:
                            ids.append(entry_id)
                    if len(entries) < 500:
                        break
                    start = b"(" + entries[-1][0]
                if ids:
                    dropped += int(await self._redis.xdel(stream, *ids))
        return dropped

    def _counted(self, task: asyncio.Future[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.warning("could not count a rejected request: %s", exc)

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


def _shutting_down(model: str) -> SluiceError:
    return SluiceError(
        ErrorCode.UNAVAILABLE, "Server is shutting down: request refused", model=model
    )


async def _probe(check: Coroutine[Any, Any, bool]) -> bool:
    """Run a health or readiness ``check`` within :data:`HEALTH_DEADLINE_S`; Redis
    failing, unreachable or silent means not live / not ready (a probe gets its answer
    in time, not after the Redis socket timeout). Other errors (``SluiceError``:
    unknown model, ...) are raised."""
    try:
        async with asyncio.timeout(HEALTH_DEADLINE_S):
            return await check
    except (TimeoutError, redis.exceptions.RedisError):
        return False
