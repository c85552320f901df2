"""``pb_utils.Tensor``: a named tensor, always a CPU numpy array (python_backend
``src/pb_tensor.cc``; DLPack as the python_backend README describes it).

BF16 tensors behave as Triton's: ``as_numpy`` raises (numpy has no bfloat16), and
``to_dlpack`` / ``from_dlpack`` exchange them with torch (imported only then).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sluice.gpu_workers.backends.python.pb_utils.datatypes import (
    BF16_TYPE,
    BYTES_TYPE,
    numpy_to_triton_type,
)
from sluice.gpu_workers.backends.python.pb_utils.errors import TritonModelException

_BF16_AS_NUMPY = (
    "Tensor dtype is BF16 and cannot be converted to numpy. Use to_dlpack() and "
    "from_dlpack() instead."
)


def _torch(name: str) -> Any:
    """torch, imported for a BF16 DLPack exchange.

    Raises:
        TritonModelException: torch is not installed in the worker's environment.
    """
    try:
        import torch
    except ImportError as exc:
        raise TritonModelException(
            f"Tensor '{name}': BF16 tensors are exchanged through DLPack with torch, which "
            "is not installed"
        ) from exc
    return torch


def _bf16_view(bits: np.ndarray) -> np.ndarray:
    """16-bit patterns as an ``ml_dtypes.bfloat16`` array when ml_dtypes is there (the
    worker's wire type), else as they are."""
    try:
        from ml_dtypes import bfloat16
    except ImportError:
        return bits
    return bits.view(bfloat16)


class _DLPackCapsule:
    """Wraps a raw DLPack capsule so ``np.from_dlpack`` can consume it (CPU only)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU, device 0


class Tensor:
    """A named tensor (python_backend ``pb_utils.Tensor``); always a CPU numpy array.

    Args:
        name: Tensor name.
        numpy_array: The data. BYTES tensors hold ``object`` arrays of ``bytes``
            (``bytes_``/``str_`` arrays are accepted and converted on output).

    Raises:
        TritonModelException: the array's dtype has no Triton datatype.
    """

    def __init__(self, name: str, numpy_array: Any) -> None:
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        dtype = numpy_to_triton_type(array.dtype)
        if dtype is None:
            raise TritonModelException(
                f"Tensor '{name}': numpy dtype '{array.dtype}' is not supported by the "
                "Python backend; use np.object_ for BYTES"
            )
        self._name = name
        self._array = array
        self._triton_dtype = dtype

    def name(self) -> str:
        """The tensor's name."""
        return self._name

    def as_numpy(self) -> np.ndarray:
        """The data as a numpy array (no copy).

        Raises:
            TritonModelException: a BF16 tensor (python_backend: numpy has no bfloat16;
                use :meth:`to_dlpack`).
        """
        if self._triton_dtype == BF16_TYPE:
            raise TritonModelException(_BF16_AS_NUMPY)
        return self._array

    def _data(self) -> np.ndarray:
        """The data whatever its type (the worker's view; BF16 included)."""
        return self._array

    def shape(self) -> list[int]:
        """The tensor's shape."""
        return [int(d) for d in self._array.shape]

    def triton_dtype(self) -> int:
        """The TRITONSERVER_DataType value (e.g. 11 for FP32, 13 for BYTES)."""
        return self._triton_dtype

    def is_cpu(self) -> bool:
        """Always True: Sluice hands Python models CPU tensors."""
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule over the data (numpy ``__dlpack__``; not for BYTES).

        Raises:
            TritonModelException: a BYTES tensor (DLPack has no string type).
        """
        if self._triton_dtype == BYTES_TYPE:
            raise TritonModelException(
                f"Tensor '{self._name}': BYTES tensors cannot be converted to DLPack"
            )
        if self._triton_dtype == BF16_TYPE:
            torch = _torch(self._name)
            bits = np.ascontiguousarray(self._array).view(np.int16)
            return torch.utils.dlpack.to_dlpack(torch.from_numpy(bits).view(torch.bfloat16))
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, dlpack: Any) -> Tensor:
        """A tensor from a DLPack capsule or any object with ``__dlpack__`` (CPU only).

        Raises:
            TritonModelException: the data is not on the CPU or cannot be read.
        """
        source = dlpack if hasattr(dlpack, "__dlpack__") else _DLPackCapsule(dlpack)
        try:
            array = np.from_dlpack(source)
        except (TypeError, ValueError, RuntimeError, BufferError) as exc:
            if "dtype" in str(exc).lower():  # numpy has no bfloat16: torch reads it
                return Tensor._from_bf16_dlpack(name, dlpack)
            raise TritonModelException(
                f"Tensor '{name}': cannot read DLPack data ({exc}); "
                "Sluice supports CPU tensors only"
            ) from exc
        return Tensor(name, array)

    @staticmethod
    def _from_bf16_dlpack(name: str, dlpack: Any) -> Tensor:
        """A BF16 tensor from DLPack data numpy cannot read (read through torch, copied).

        Raises:
            TritonModelException: torch is missing, or the data is not BF16 on the CPU.
        """
        torch = _torch(name)
        try:
            data = torch.utils.dlpack.from_dlpack(dlpack)
        except (TypeError, ValueError, RuntimeError, BufferError) as exc:
            raise TritonModelException(f"Tensor '{name}': cannot read DLPack data ({exc})") from exc
        if data.dtype != torch.bfloat16 or data.device.type != "cpu":
            raise TritonModelException(
                f"Tensor '{name}': DLPack data of dtype {data.dtype} on {data.device} that "
                "numpy cannot read; Sluice supports CPU tensors only"
            )
        bits = data.contiguous().view(torch.int16).numpy().copy()
        tensor = Tensor(name, bits)
        tensor._array = _bf16_view(bits)
        tensor._triton_dtype = BF16_TYPE
        return tensor

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"
