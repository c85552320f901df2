"""The shared-memory regions clients registered with this gateway process (Triton's
system and CUDA shared-memory extensions).

A client on the gateway's host creates a POSIX shared-memory object (``shm_open``; on
Linux a file under ``/dev/shm``), registers a window of it by name (``key``, ``offset``,
``byte_size``), and then names that region in an inference request's tensor parameters
instead of sending the tensor's bytes. The gateway opens the object once, at register,
reads inputs from the window when it queues a request, and writes outputs into it when
the answer comes back (``pread``/``pwrite``: an object shrunk after register is refused
with an error naming the region, never read past its end).

Regions live in one gateway process: several gateways behind one port each have their
own (docs/user-guide/shared-memory.md says what a client does about it). A region
unregistered while a request that uses it is in flight stays open until that request
is answered (the request holds it), as Triton does.

Rules and texts: Triton ``src/shared_memory_manager.cc`` (``RegisterSystemSharedMemory``,
``GetMemoryInfo``, ``GetStatus``, ``Unregister``) and ``src/common.cc``
(``ValidateSharedMemoryKey``). System and CUDA regions share one set of names, as in
Triton. CUDA regions are :class:`api.cuda_shared_memory.CudaRegion`; without CUDA a
register is refused as a Triton built without GPU support refuses it
(``src/http_server.cc`` ``HandleCudaSharedMemory``).
"""

from __future__ import annotations

import os
import stat
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from sluice.api.cuda_shared_memory import CudaCallError, CudaRegion, cuda_runtime
from sluice.broker.errors import ErrorCode, SluiceError, invalid_arg

__all__ = ["SHM_ROOT", "RegionSlice", "SharedMemoryRegistry", "SystemRegion"]

#: where Linux keeps POSIX shared-memory objects (glibc's ``shm_open`` opens files here).
SHM_ROOT = Path("/dev/shm")

#: key prefix Triton keeps for the regions its Python backend creates (``src/common.h``).
RESERVED_KEY_PREFIX = "triton_python_backend_shm_region_"


def _not_found(name: str) -> SluiceError:
    return SluiceError(ErrorCode.NOT_FOUND, f"Unable to find shared memory region: '{name}'")


class SystemRegion:
    """One registered window of a POSIX shared-memory object, open read-write.

    The object's descriptor stays open while the region lives (so an object unlinked by
    its client stays readable, as a mapping would keep it); bytes are copied with
    ``pread``/``pwrite`` at the window's offset, never through a mapping, so an object
    the client shrank (``ftruncate``) after register gives an error naming the region
    instead of a ``SIGBUS`` in the gateway.

    Attributes:
        name: the region's name (the ``shared_memory_region`` tensors give).
        key: the shared-memory object's key, as registered (``/name`` or ``name``).
        offset: where the window starts in the object, in bytes.
        byte_size: the window's length, in bytes (at least 1).
    """

    __slots__ = ("__weakref__", "_fd", "byte_size", "key", "name", "offset")

    def __init__(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        fd = _open_key(name, key)
        try:
            if offset + byte_size > os.fstat(fd).st_size:
                raise invalid_arg(f"failed to register shared memory region '{name}': invalid args")
            if byte_size == 0:  # Triton's mmap of zero bytes fails
                raise invalid_arg(
                    f"failed to register shared memory region '{name}': byte_size must be "
                    "greater than 0 (a zero-length region cannot be mapped)"
                )
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        weakref.finalize(self, os.close, fd)

    def _shrunk(self, size: int) -> SluiceError:
        return invalid_arg(
            f"shared memory region '{self.name}' is smaller than registered: its object "
            f"'{self.key}' now holds {size} bytes, the region needs "
            f"{self.offset + self.byte_size}"
        )

    def read(self, offset: int, byte_size: int) -> bytes:
        """A copy of ``byte_size`` bytes at ``offset`` of the window.

        Raises:
            SluiceError: INVALID_ARG when the object is now shorter than those bytes.
        """
        at = self.offset + offset
        chunks: list[bytes] = []
        left = byte_size
        while left:
            chunk = os.pread(self._fd, left, at)
            if not chunk:  # end of the object: it shrank since register
                raise self._shrunk(os.fstat(self._fd).st_size)
            chunks.append(chunk)
            at += len(chunk)
            left -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def write(self, offset: int, data: bytes) -> None:
        """Copy ``data`` to ``offset`` of the window (the caller checked the bounds).

        Raises:
            SluiceError: INVALID_ARG when the object is now shorter than the window's
                bytes ``data`` goes to (nothing is written then).
        """
        at = self.offset + offset
        size = os.fstat(self._fd).st_size
        if at + len(data) > size:
            raise self._shrunk(size)
        view = memoryview(data)
        done = 0
        while done < len(view):
            done += os.pwrite(self._fd, view[done:], at + done)

    def status(self) -> dict[str, Any]:
        """The region as ``GET /v2/systemsharedmemory/status`` lists it."""
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


def _open_key(name: str, key: str) -> int:
    """A read-write descriptor of the shared-memory object ``key``, as ``shm_open`` opens
    it (leading slashes dropped; a key with another slash, ``.`` or ``..``, or that names
    no regular file, is refused, so a key never reaches a file outside ``/dev/shm``).

    Raises:
        SluiceError: INVALID_ARG for an empty or reserved key, INTERNAL for a key that
            cannot be opened (Triton's texts).
    """
    bare = key.lstrip("/")
    if not bare:
        raise invalid_arg(
            f"cannot register shared memory region '{name}' - invalid shm key '{key}'"
        )
    if bare.startswith(RESERVED_KEY_PREFIX):
        raise invalid_arg(
            f"cannot register shared memory region '{name}' with key '{key}' as the key "
            f"contains the reserved prefix '{RESERVED_KEY_PREFIX}'"
        )
    unable = SluiceError(ErrorCode.INTERNAL, f"Unable to open shared memory region: '{key}'")
    if "/" in bare or bare in (".", ".."):
        raise unable
    try:
        fd = os.open(SHM_ROOT / bare, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (OSError, ValueError):  # ValueError: a NUL byte, which no file name holds
        raise unable from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise unable
    return fd


@dataclass(frozen=True, slots=True)
class RegionSlice:
    """The bytes one tensor takes in a region.

    Attributes:
        region: the region (kept, so it stays open while the request is in flight).
        offset: where the tensor's bytes start, relative to the region's start.
        byte_size: how many bytes the tensor may take.
    """

    region: SystemRegion | CudaRegion
    offset: int
    byte_size: int

    def __len__(self) -> int:
        return self.byte_size

    def read(self) -> bytes:
        """A host copy of the slice's bytes.

        Raises:
            SluiceError: INTERNAL when a CUDA copy fails; INVALID_ARG when a system
                region's object shrank below the slice since register.
        """
        try:
            return self.region.read(self.offset, self.byte_size)
        except CudaCallError as exc:
            raise _copy_failed(self.region.name, exc) from None

    def write(self, data: bytes) -> None:
        """Copy ``data`` (at most :attr:`byte_size` bytes) to the slice's start.

        Raises:
            SluiceError: INTERNAL when a CUDA copy fails; INVALID_ARG when a system
                region's object shrank below the slice since register.
        """
        try:
            self.region.write(self.offset, data)
        except CudaCallError as exc:
            raise _copy_failed(self.region.name, exc) from None


def _copy_failed(name: str, exc: CudaCallError) -> SluiceError:
    return SluiceError(
        ErrorCode.INTERNAL, f"failed to copy CUDA shared memory region '{name}': {exc}"
    )


class SharedMemoryRegistry:
    """The regions of one gateway process (one event loop: no locking)."""

    def __init__(self) -> None:
        self._system: dict[str, SystemRegion] = {}
        self._cuda: dict[str, CudaRegion] = {}

    def _check_new(self, name: str) -> None:
        if name in self._system or name in self._cuda:
            raise SluiceError(
                ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager"
            )

    # -- system shared memory ---------------------------------------------------------------

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes at ``offset`` of the shared-memory object ``key``.

        Raises:
            SluiceError: INVALID_ARG without a name, for a bad key, a window past the
                object's end or of zero bytes; ALREADY_EXISTS for a name registered
                already; INTERNAL for a key that cannot be opened.
        """
        if not name:
            raise invalid_arg("'region name' is necessary to register system shared memory region")
        self._check_new(name)
        if offset < 0 or byte_size < 0:
            raise invalid_arg(f"failed to register shared memory region '{name}': invalid args")
        self._system[name] = SystemRegion(name, key, offset, byte_size)

    def unregister_system(self, name: str = "") -> None:
        """Forget one region (a name never registered: nothing to do) or, with ``""``,
        every region. A request in flight keeps its region open until it is answered."""
        if name:
            self._system.pop(name, None)
        else:
            self._system.clear()

    def system_status(self, name: str = "") -> list[dict[str, Any]]:
        """Every region (``""``, by name as Triton's ordered map lists them) or the one
        named, as the status endpoints list them.

        Raises:
            SluiceError: NOT_FOUND for a name not registered.
        """
        if not name:
            return [self._system[n].status() for n in sorted(self._system)]
        region = self._system.get(name)
        if region is None:
            if name in self._cuda:
                raise _other_kind(name, "CUDA", "system")
            raise SluiceError(
                ErrorCode.NOT_FOUND, f"Unable to find system shared memory region: '{name}'"
            )
        return [region.status()]

    def slice(self, name: str, offset: int, byte_size: int) -> RegionSlice:
        """``byte_size`` bytes at ``offset`` (relative to the region's start) of region
        ``name``.

        Raises:
            SluiceError: NOT_FOUND for a region not registered; INVALID_ARG for an
                offset at or past the region's end, or bytes past it (Triton's texts).
        """
        region: SystemRegion | CudaRegion | None = self._system.get(name) or self._cuda.get(name)
        if region is None:
            raise _not_found(name)
        if not 0 <= offset < region.byte_size:
            raise invalid_arg(f"Invalid offset for shared memory region: '{name}'")
        if byte_size < 0 or offset + byte_size > region.byte_size:
            raise invalid_arg(f"Invalid offset + byte size for shared memory region: '{name}'")
        return RegionSlice(region, offset, byte_size)

    # -- CUDA shared memory -----------------------------------------------------------------

    def check_cuda(self, name: str) -> ModuleType:
        """The CUDA runtime bindings a register of region ``name`` uses.

        Raises:
            SluiceError: INVALID_ARG without a name, or without CUDA in this process
                (the text of a Triton built without GPU support).
        """
        if not name:
            raise invalid_arg("'region name' is necessary to register cuda shared memory region")
        rt = cuda_runtime()
        if rt is None:
            raise invalid_arg(
                f"failed to register CUDA shared memory region: '{name}', GPUs not supported"
            )
        return rt

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Open the CUDA IPC handle ``raw_handle`` of ``byte_size`` bytes on device
        ``device_id`` (``cudaIpcMemHandle_t``'s bytes, base64-decoded).

        Raises:
            SluiceError: INVALID_ARG without a name, without CUDA in this process
                (Triton's no-GPU text), or for a handle that cannot be opened;
                ALREADY_EXISTS for a name registered already (of either kind).
        """
        rt = self.check_cuda(name)
        self._check_new(name)
        if device_id < 0 or byte_size < 0:
            raise invalid_arg(
                f"failed to register CUDA shared memory region '{name}': invalid args"
            )
        self._cuda[name] = CudaRegion(rt, name, raw_handle, device_id, byte_size)

    def unregister_cuda(self, name: str = "") -> None:
        """Forget one CUDA region (a name never registered, or a system region's: nothing
        to do) or, with ``""``, every CUDA region. The handle is closed once no request
        in flight holds the region."""
        if name:
            self._cuda.pop(name, None)
        else:
            self._cuda.clear()

    def cuda_status(self, name: str = "") -> list[dict[str, Any]]:
        """Every CUDA region (``""``, by name) or the one named.

        Raises:
            SluiceError: NOT_FOUND for a name not registered as a CUDA region.
        """
        if not name:
            return [self._cuda[n].status() for n in sorted(self._cuda)]
        region = self._cuda.get(name)
        if region is None:
            if name in self._system:
                raise _other_kind(name, "system", "CUDA")
            raise SluiceError(
                ErrorCode.NOT_FOUND, f"Unable to find cuda shared memory region: '{name}'"
            )
        return [region.status()]


def _other_kind(name: str, kind: str, asked: str) -> SluiceError:
    return SluiceError(
        ErrorCode.NOT_FOUND,
        f"The region named '{name}' is registered as {kind} shared memory, "
        f"not {asked} shared memory",
    )
