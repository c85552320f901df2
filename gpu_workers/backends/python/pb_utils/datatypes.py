"""Triton's datatypes as python_backend's utils name them, and BYTES serialization.

python_backend ``src/resources/triton_python_backend_utils.py``: the config's type
names (``"TYPE_FP32"``), tritonserver.h ``TRITONSERVER_DataType`` values (as
``Tensor.triton_dtype()`` returns them) and numpy types, converted into each other.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

#: model_config.proto ``DataType`` name -> numpy type (python_backend utils).
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# tritonserver.h TRITONSERVER_DataType values, as ``Tensor.triton_dtype()`` returns them.
_TRITON_TO_NUMPY: dict[int, Any] = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}
#: TRITONSERVER_TYPE_BYTES.
BYTES_TYPE = 13
#: TRITONSERVER_TYPE_BF16; such data is held as an ``ml_dtypes.bfloat16`` array (the
#: worker's wire type) or as its raw 16-bit patterns.
BF16_TYPE = 14
_NUMPY_TO_TRITON: dict[np.dtype, int] = {
    np.dtype(t): code for code, t in _TRITON_TO_NUMPY.items() if code != BYTES_TYPE
}


def triton_to_numpy_type(data_type: int | str) -> Any:
    """TRITONSERVER_DataType value (or config name such as ``"TYPE_FP32"``) -> numpy type.

    python_backend utils ``triton_to_numpy_type``; returns None for unknown types.
    """
    if isinstance(data_type, str):
        return TRITON_STRING_TO_NUMPY.get(data_type)
    return _TRITON_TO_NUMPY.get(int(data_type))


def numpy_to_triton_type(data_type: Any) -> int | None:
    """numpy dtype or type -> TRITONSERVER_DataType value (python_backend utils).

    ``object``, ``bytes_`` and ``str_`` map to BYTES (13); unknown types to None.
    """
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in "OSU":
        return BYTES_TYPE
    if dtype.name == "bfloat16":  # ml_dtypes' type (what tritonclient uses for BF16)
        return BF16_TYPE
    return _NUMPY_TO_TRITON.get(dtype.newbyteorder("=") if dtype.byteorder != "|" else dtype)


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``"TYPE_FP32"`` -> ``np.float32`` (python_backend utils; KeyError when unknown)."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | None:
    """BYTES array -> 4-byte little-endian length + bytes per element, C order.

    python_backend utils ``serialize_byte_tensor``; None for an empty or
    non-bytes array. ``str`` elements are UTF-8 encoded.
    """
    if input_tensor.size == 0 or input_tensor.dtype.kind not in "OS":
        return None
    parts: list[bytes] = []
    for item in input_tensor.ravel(order="C"):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """Inverse of :func:`serialize_byte_tensor`: a 1-D ``object`` array of ``bytes``."""
    items: list[bytes] = []
    offset = 0
    while offset < len(encoded_tensor):
        (length,) = struct.unpack_from("<I", encoded_tensor, offset)
        offset += 4
        items.append(bytes(encoded_tensor[offset : offset + length]))
        offset += length
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out
