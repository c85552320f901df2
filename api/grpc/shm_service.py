"""The shared-memory RPCs of ``inference.GRPCInferenceService``: ``SystemSharedMemory*``
and ``CudaSharedMemory*`` (Triton ``src/grpc/grpc_server.cc``), over the gateway's
:class:`api.shared_memory.SharedMemoryRegistry`, with the same rules and texts as the
HTTP routes (:mod:`api.http.shm_routes`). Errors and access control (group
``shared-memory``) are handled by :func:`api.grpc.guard.guard_servicer`.
"""

from __future__ import annotations

from typing import Any, TypeVar

import grpc
from tritonclient.grpc import service_pb2

from sluice.api.dataplane import DataPlane

__all__ = ["SharedMemoryRpcs"]

_StatusResponse = TypeVar(
    "_StatusResponse",
    service_pb2.SystemSharedMemoryStatusResponse,
    service_pb2.CudaSharedMemoryStatusResponse,
)


def _keyed_by_name(response: _StatusResponse, regions: list[dict[str, Any]]) -> _StatusResponse:
    """``response`` with each region's status (as the registry lists it) filed under its
    name in the ``regions`` map, as its ``RegionStatus`` message."""
    for region in regions:
        response.regions[region["name"]].CopyFrom(type(response).RegionStatus(**region))
    return response


class SharedMemoryRpcs:
    """Mixed into :class:`api.grpc.servicer.InferenceServicer` (which sets ``_dp``)."""

    _dp: DataPlane

    async def SystemSharedMemoryStatus(
        self,
        request: service_pb2.SystemSharedMemoryStatusRequest,
        context: grpc.aio.ServicerContext,
    ) -> service_pb2.SystemSharedMemoryStatusResponse:
        """Every registered region (``name`` empty) or the one named (NOT_FOUND when it
        is not registered), keyed by name."""
        return _keyed_by_name(
            service_pb2.SystemSharedMemoryStatusResponse(),
            self._dp.shared_memory.system_status(request.name),
        )

    async def SystemSharedMemoryRegister(
        self,
        request: service_pb2.SystemSharedMemoryRegisterRequest,
        context: grpc.aio.ServicerContext,
    ) -> service_pb2.SystemSharedMemoryRegisterResponse:
        """Map ``byte_size`` bytes at ``offset`` of the shared-memory object ``key``."""
        self._dp.shared_memory.register_system(
            request.name, request.key, request.offset, request.byte_size
        )
        return service_pb2.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self,
        request: service_pb2.SystemSharedMemoryUnregisterRequest,
        context: grpc.aio.ServicerContext,
    ) -> service_pb2.SystemSharedMemoryUnregisterResponse:
        """Unregister the named region (not registered: nothing to do), or every one."""
        self._dp.shared_memory.unregister_system(request.name)
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(
        self,
        request: service_pb2.CudaSharedMemoryStatusRequest,
        context: grpc.aio.ServicerContext,
    ) -> service_pb2.CudaSharedMemoryStatusResponse:
        """Every registered CUDA region (``name`` empty) or the one named (NOT_FOUND when
        it is not registered), keyed by name."""
        return _keyed_by_name(
            service_pb2.CudaSharedMemoryStatusResponse(),
            self._dp.shared_memory.cuda_status(request.name),
        )

    async def CudaSharedMemoryRegister(
        self,
        request: service_pb2.CudaSharedMemoryRegisterRequest,
        context: grpc.aio.ServicerContext,
    ) -> service_pb2.CudaSharedMemoryRegisterResponse:
        """Open the client's CUDA IPC handle (``raw_handle``'s bytes) of ``byte_size``
        bytes on ``device_id``; INVALID_ARGUMENT without CUDA (Triton's no-GPU text)."""
        self._dp.shared_memory.register_cuda(
            request.name, request.raw_handle, request.device_id, request.byte_size
        )
        return service_pb2.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(
        self,
        request: service_pb2.CudaSharedMemoryUnregisterRequest,
        context: grpc.aio.ServicerContext,
    ) -> service_pb2.CudaSharedMemoryUnregisterResponse:
        """Unregister the named CUDA region (not registered: nothing to do), or every one."""
        self._dp.shared_memory.unregister_cuda(request.name)
        return service_pb2.CudaSharedMemoryUnregisterResponse()
