"""``inference.GRPCInferenceService``: a thin adapter over the gateway's handlers.

Every method converts ``service_pb2`` messages to and from what the handlers of the
shared :class:`DataPlane` (:mod:`api.handlers`) speak and delegates (MLServer
``grpc/servicers.py``); errors and access control are handled once, by
:func:`api.grpc.guard.guard_servicer`. Method semantics: docs/reference/grpc-protocol.md
(Triton ``src/grpc/grpc_server.cc``, ``infer_handler.cc``, ``stream_infer_handler.cc``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2, service_pb2_grpc

from sluice.api.access import GRPC_HEADER_PREFIX, AccessPolicy
from sluice.api.dataplane import DataPlane
from sluice.api.grpc.codec import (
    encode_infer_response,
    parameter_value,
    parse_infer_request,
    parse_version,
)
from sluice.api.grpc.guard import REDIS_OUTAGE, RPC_GROUPS, guard_servicer
from sluice.api.grpc.streaming import stream_infer
from sluice.api.handlers.metadata import SHM_DISABLED
from sluice.api.repository_params import load_parameters, unload_dependents
from sluice.api.request_trace import RequestTrace, header_traceparent
from sluice.broker.errors import ErrorCode, SluiceError

__all__ = ["InferenceServicer", "build_servicer"]

logger = logging.getLogger(__name__)


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Every RPC of Triton's ``GRPCInferenceService``.

    Args:
        dataplane: the gateway's transport-neutral request handling.
        compress_infer: compress inference responses (gzip), as Triton's
            ``--grpc-infer-response-compression-level`` other than ``none``.
    """

    def __init__(self, dataplane: DataPlane, compress_infer: bool = False) -> None:
        self._dp = dataplane
        self._compress_infer = compress_infer

    # -- health -------------------------------------------------------------------------

    async def ServerLive(
        self, request: service_pb2.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ServerLiveResponse:
        """``live`` True while the gateway serves (Redis is not asked), False (status OK)
        once it is stopping."""
        return service_pb2.ServerLiveResponse(live=await self._dp.health.server_live())

    async def ServerReady(
        self, request: service_pb2.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ServerReadyResponse:
        """``ready`` as ``GET /v2/health/ready``; not ready is OK with False."""
        return service_pb2.ServerReadyResponse(ready=await self._dp.health.server_ready())

    async def ModelReady(
        self, request: service_pb2.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelReadyResponse:
        """``ready`` True/False; an unknown model or version is not ready (False), as
        Triton answers it (tritonclient.grpc's ``is_model_ready`` returns False, as over
        HTTP). A version that is not a number is still INVALID_ARGUMENT."""
        version = parse_version(request.version, request.name)
        try:
            ready = await self._dp.health.model_readiness(request.name, version)
        except SluiceError as exc:
            if exc.code is not ErrorCode.NOT_FOUND:
                raise
            ready = False
        return service_pb2.ModelReadyResponse(ready=ready)

    # -- metadata and config ------------------------------------------------------------

    async def ServerMetadata(
        self, request: service_pb2.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ServerMetadataResponse:
        """Name, version and extensions, as ``GET /v2``."""
        meta = self._dp.metadata.server_metadata()
        return service_pb2.ServerMetadataResponse(
            name=meta["name"], version=meta["version"], extensions=meta["extensions"]
        )

    async def ModelMetadata(
        self, request: service_pb2.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelMetadataResponse:
        """Same content as ``GET /v2/models/{m}[/versions/{v}]``."""
        version = parse_version(request.version, request.name)
        meta = await self._dp.metadata.model_metadata(request.name, version)
        response = service_pb2.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"]
        )
        for kind in ("inputs", "outputs"):
            target = getattr(response, kind)
            for tensor in meta[kind]:
                target.add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
        return response

    async def ModelConfig(
        self, request: service_pb2.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelConfigResponse:
        """The completed model config as a ``ModelConfig`` message."""
        version = parse_version(request.version, request.name)
        view = await self._dp.metadata.model_config(request.name, version)
        return service_pb2.ModelConfigResponse(config=view.config)

    async def ModelStatistics(
        self, request: service_pb2.ModelStatisticsRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelStatisticsResponse:
        """Statistics extension, as ``GET /v2/models[/{m}[/versions/{v}]]/stats``."""
        version = parse_version(request.version, request.name)
        body = await self._dp.statistics.model_statistics(request.name or None, version)
        return json_format.ParseDict(
            body, service_pb2.ModelStatisticsResponse(), ignore_unknown_fields=True
        )

    # -- inference ----------------------------------------------------------------------

    async def _infer(
        self,
        request: service_pb2.ModelInferRequest,
        on_queued: Callable[[], None] | None = None,
        trace: RequestTrace | None = None,
    ) -> service_pb2.ModelInferResponse:
        model = request.model_name
        version = parse_version(request.model_version, model)
        # unknown model first; a stopping server's 503 / UNAVAILABLE rather than the 404 of
        # the versions it unloads while it exits (as HTTP)
        started_ns = time.monotonic_ns()
        view, _ = await self._dp.submission.resolve_for_infer(model, version)
        waited_ns = time.monotonic_ns() - started_ns
        if view.decoupled:
            raise SluiceError(
                ErrorCode.UNSUPPORTED,
                f"ModelInfer RPC doesn't support models with decoupled transaction policy "
                f"(model '{model}')",
                model=model,
            )
        parsed = parse_infer_request(request)
        result = await self._dp.submission.infer(
            model, version, parsed.client_id, parsed.inputs, parsed.outputs, parsed.parameters,
            waited_ns, on_queued, trace,
        )  # fmt: skip
        REDIS_OUTAGE.ok()  # an answer came through Redis: an outage logged is over
        return encode_infer_response(
            model=model,
            version=str(result.version),
            client_id=result.client_id,
            outputs=result.outputs,
            requested=parsed.outputs,
            parameters=result.parameters,
        )

    async def ModelInfer(
        self, request: service_pb2.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelInferResponse:
        """One inference; outputs in ``raw_output_contents`` (:mod:`api.grpc.codec`),
        traced when sampled (a W3C ``traceparent`` in the metadata is the parent)."""
        if self._compress_infer:
            context.set_compression(grpc.Compression.Gzip)
        tracing = self._dp.tracing
        if not tracing.active:
            return await self._infer(request)
        metadata = context.invocation_metadata() or ()
        trace = tracing.start(request.model_name, "GRPC", header_traceparent(metadata))
        if trace is None:
            return await self._infer(request)
        trace.stamp("GRPC_WAITREAD_END")
        error: str | None = None
        try:
            response = await self._infer(request, trace=trace)
        except Exception as exc:
            error = str(exc)
            raise
        finally:
            trace.stamp("GRPC_SEND_START")
            trace.stamp("GRPC_SEND_END")
            trace.finish(error)
        return response

    async def ModelStreamInfer(
        self,
        request_iterator: AsyncIterator[service_pb2.ModelInferRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        """Bidirectional stream (:mod:`api.grpc.streaming`): one response per request in
        request order for non-decoupled models, each decoupled model's responses as they
        are produced; errors in-band; closing the stream cancels what is in flight."""
        if self._compress_infer:
            context.set_compression(grpc.Compression.Gzip)
        async for answer in stream_infer(
            self._dp.submission, self._infer, request_iterator, context, self._dp.on_shutdown
        ):
            yield answer

    # -- model repository ---------------------------------------------------------------

    async def RepositoryIndex(
        self, request: service_pb2.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.RepositoryIndexResponse:
        """Index entries as ``POST /v2/repository/index`` (four strings, "" when absent)."""
        _refuse_named_repository(request.repository_name)
        entries = await self._dp.repository.repository_index(request.ready)
        response = service_pb2.RepositoryIndexResponse()
        for entry in entries:
            response.models.add(**entry)
        return response

    async def RepositoryModelLoad(
        self, request: service_pb2.RepositoryModelLoadRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.RepositoryModelLoadResponse:
        """Load / reload (explicit model control mode only)."""
        _refuse_named_repository(request.repository_name)
        items = [
            (key, getattr(value, value.WhichOneof("parameter_choice") or "string_param"))
            for key, value in request.parameters.items()
        ]
        config_json, files = load_parameters(request.model_name, items, files_base64=False)
        await self._dp.repository.load_model(request.model_name, config_json, files)
        return service_pb2.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self,
        request: service_pb2.RepositoryModelUnloadRequest,
        context: grpc.aio.ServicerContext,
    ) -> service_pb2.RepositoryModelUnloadResponse:
        """Unload (explicit model control mode only)."""
        _refuse_named_repository(request.repository_name)
        params = {
            key: getattr(value, value.WhichOneof("parameter_choice") or "bool_param")
            for key, value in request.parameters.items()
        }
        await self._dp.repository.unload_model(
            request.model_name, unload_dependents(request.model_name, params)
        )
        return service_pb2.RepositoryModelUnloadResponse()

    # -- shared memory, trace, logging --------------------------------------------------

    async def SystemSharedMemoryStatus(
        self,
        request: service_pb2.SystemSharedMemoryStatusRequest,
        context: grpc.aio.ServicerContext,
    ) -> service_pb2.SystemSharedMemoryStatusResponse:
        """No region is ever registered: an empty map."""
        return service_pb2.SystemSharedMemoryStatusResponse()

    async def SystemSharedMemoryRegister(
        self,
        request: service_pb2.SystemSharedMemoryRegisterRequest,
        context: grpc.aio.ServicerContext,
    ) -> service_pb2.SystemSharedMemoryRegisterResponse:
        """Refused: client shared memory is off (:mod:`api.handlers.metadata`)."""
        raise SluiceError(ErrorCode.UNSUPPORTED, SHM_DISABLED)

    async def SystemSharedMemoryUnregister(
        self,
        request: service_pb2.SystemSharedMemoryUnregisterRequest,
        context: grpc.aio.ServicerContext,
    ) -> service_pb2.SystemSharedMemoryUnregisterResponse:
        """Nothing to unregister: succeeds."""
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(
        self,
        request: service_pb2.CudaSharedMemoryStatusRequest,
        context: grpc.aio.ServicerContext,
    ) -> service_pb2.CudaSharedMemoryStatusResponse:
        """No region is ever registered: an empty map."""
        return service_pb2.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(
        self,
        request: service_pb2.CudaSharedMemoryRegisterRequest,
        context: grpc.aio.ServicerContext,
    ) -> service_pb2.CudaSharedMemoryRegisterResponse:
        """Refused: client shared memory is off (:mod:`api.handlers.metadata`)."""
        raise SluiceError(ErrorCode.UNSUPPORTED, SHM_DISABLED)

    async def CudaSharedMemoryUnregister(
        self,
        request: service_pb2.CudaSharedMemoryUnregisterRequest,
        context: grpc.aio.ServicerContext,
    ) -> service_pb2.CudaSharedMemoryUnregisterResponse:
        """Nothing to unregister: succeeds."""
        return service_pb2.CudaSharedMemoryUnregisterResponse()

    async def TraceSetting(
        self, request: service_pb2.TraceSettingRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.TraceSettingResponse:
        """Empty map = get; otherwise update those keys (rules shared with HTTP; a key
        with no value clears the model's own value)."""
        changes = {
            key: (list(value.value) if len(value.value) != 1 else value.value[0])
            if value.value
            else None
            for key, value in request.settings.items()
        }
        current = await self._dp.tracing.setting(
            self._dp.registry, request.model_name or None, changes or None
        )
        response = service_pb2.TraceSettingResponse()
        for key, value in current.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    async def LogSettings(
        self, request: service_pb2.LogSettingsRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.LogSettingsResponse:
        """Empty map = get; otherwise update those keys (rules shared with HTTP)."""
        log_settings = self._dp.log_settings
        if request.settings:
            current = log_settings.update(
                {key: parameter_value(value) for key, value in request.settings.items()}
            )
        else:
            current = log_settings.as_dict()
        response = service_pb2.LogSettingsResponse()
        for key, value in current.items():
            target = response.settings[key]
            if isinstance(value, bool):
                target.bool_param = value
            elif isinstance(value, int):
                target.uint32_param = value
            else:
                target.string_param = value
        return response


def _refuse_named_repository(repository_name: str) -> None:
    if repository_name:
        raise SluiceError(
            ErrorCode.UNSUPPORTED,
            f"'repository_name' specification is not supported: '{repository_name}'",
        )


def build_servicer(
    dataplane: DataPlane, restricted: list[str], compress_infer: bool = False
) -> InferenceServicer:
    """The servicer with every method guarded (access control + error translation).

    Args:
        dataplane: the gateway's DataPlane (shared with HTTP).
        restricted: ``--grpc-restricted-protocol`` values.
        compress_infer: gzip inference responses.

    Raises:
        ValueError: a malformed restricted-protocol spec.
    """
    policy = AccessPolicy(restricted, header_prefix=GRPC_HEADER_PREFIX)
    return guard_servicer(InferenceServicer(dataplane, compress_infer), policy, RPC_GROUPS)
