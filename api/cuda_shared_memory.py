"""CUDA shared-memory regions (Triton's CUDA shared-memory extension): device memory a
client on the gateway's host allocated, exported with ``cudaIpcGetMemHandle`` and
registered by its raw handle, device and byte size.

The gateway opens the handle at register (``cudaIpcOpenMemHandle`` with lazy peer
access, on the region's device, as Triton ``src/shared_memory_manager.cc``
``OpenCudaIPCRegion`` does), copies an input's bytes device -> host when the request is
queued and an output's bytes host -> device when the answer comes back, and closes the
handle (``cudaIpcCloseMemHandle``) once the region is unregistered and no request in
flight holds it.

CUDA is reached through NVIDIA's Python bindings (``cuda.bindings.runtime`` from the
``cuda-bindings`` / ``cuda-python`` package, the module ``tritonclient.utils.
cuda_shared_memory`` uses on the client side), imported only when a region is
registered. Where the bindings are missing or see no device, :func:`cuda_runtime` answers
None and a register is refused as a Triton built without GPU support refuses it.
"""

from __future__ import annotations

import contextlib
import ctypes
import weakref
from functools import cache
from types import ModuleType
from typing import Any

import numpy as np

from sluice.broker.errors import invalid_arg

__all__ = ["CudaCallError", "CudaRegion", "cuda_runtime"]


class CudaCallError(RuntimeError):
    """A CUDA runtime call failed; the message is ``cudaGetErrorString``'s text."""


@cache
def cuda_runtime() -> ModuleType | None:
    """The CUDA runtime bindings when they import and see at least one device, else None
    (looked up once per process)."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime  # cuda-python before 12.6
        except ImportError:
            return None
    try:
        count = _call(runtime, runtime.cudaGetDeviceCount)
    except (CudaCallError, RuntimeError, OSError):
        return None
    return runtime if count > 0 else None


def _call(rt: ModuleType, function: Any, *args: Any) -> Any:
    """``function(*args)``'s value (the bindings answer ``(error, value...)``).

    Raises:
        CudaCallError: when the error is not ``cudaSuccess``, with CUDA's text for it.
    """
    error, *values = function(*args)
    if error != rt.cudaError_t.cudaSuccess:
        raise CudaCallError(_error_text(rt, error))
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _error_text(rt: ModuleType, error: Any) -> str:
    text = rt.cudaGetErrorString(error)[1]
    return text.decode() if isinstance(text, bytes) else str(text)


def _close(rt: ModuleType, pointer: int) -> None:
    with contextlib.suppress(CudaCallError):  # the client may have freed the memory first
        _call(rt, rt.cudaIpcCloseMemHandle, pointer)


class CudaRegion:
    """One registered CUDA region, opened in this process.

    Attributes:
        name: the region's name (the ``shared_memory_region`` tensors give).
        device_id: the CUDA ordinal the memory lives on.
        byte_size: the region's length, in bytes.
    """

    __slots__ = ("__weakref__", "_pointer", "_rt", "byte_size", "device_id", "name")

    def __init__(
        self, rt: ModuleType, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        """Open ``raw_handle`` (the ``cudaIpcMemHandle_t`` bytes, ``CUDA_IPC_HANDLE_SIZE``
        long) on device ``device_id``.

        Raises:
            SluiceError: INVALID_ARG when the handle cannot be opened (a handle of the
                wrong length, an unknown device, memory freed by its owner), with
                Triton's text and CUDA's reason.
        """
        self.name = name
        self.device_id = device_id
        self.byte_size = byte_size
        self._rt = rt
        try:
            if len(raw_handle) != rt.CUDA_IPC_HANDLE_SIZE:
                raise CudaCallError(_error_text(rt, rt.cudaError_t.cudaErrorInvalidValue))
            handle = rt.cudaIpcMemHandle_t()
            ctypes.memmove(handle.getPtr(), raw_handle, len(raw_handle))
            _call(rt, rt.cudaSetDevice, device_id)
            flags = getattr(rt, "cudaIpcMemLazyEnablePeerAccess", 1)
            self._pointer = int(_call(rt, rt.cudaIpcOpenMemHandle, handle, flags))
        except CudaCallError as exc:
            raise invalid_arg(
                f"failed to register CUDA shared memory region '{name}': "
                f"failed to open CUDA IPC handle: {exc}"
            ) from None
        # closed once unregistered and no request holds it; at exit the driver cleans up
        weakref.finalize(self, _close, rt, self._pointer).atexit = False

    def status(self) -> dict[str, Any]:
        """The region as ``GET /v2/cudasharedmemory/status`` lists it."""
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def read(self, offset: int, byte_size: int) -> bytes:
        """``byte_size`` bytes at ``offset`` of the region, copied device -> host (the
        caller checked the bounds).

        Raises:
            CudaCallError: when the copy fails.
        """
        host = np.empty(byte_size, dtype=np.uint8)
        if byte_size:
            _call(self._rt, self._rt.cudaSetDevice, self.device_id)
            _call(
                self._rt,
                self._rt.cudaMemcpy,
                host.ctypes.data,
                self._pointer + offset,
                byte_size,
                self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost,
            )
        return host.tobytes()

    def write(self, offset: int, data: bytes) -> None:
        """Copy ``data`` host -> device to ``offset`` of the region (the caller checked
        the bounds).

        Raises:
            CudaCallError: when the copy fails.
        """
        if not data:
            return
        host = np.frombuffer(data, dtype=np.uint8)
        _call(self._rt, self._rt.cudaSetDevice, self.device_id)
        _call(
            self._rt,
            self._rt.cudaMemcpy,
            self._pointer + offset,
            host.ctypes.data,
            len(host),
            self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
        )
