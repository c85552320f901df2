"""Tensor datatypes: KServe v2 protocol names, config ``TYPE_*`` names, numpy dtypes.

Source: Triton protocol docs (KServe v2 "Tensor Data Types") and
``model_config.proto`` ``DataType``. BYTES elements travel as a 4-byte
little-endian length followed by the bytes (Triton binary tensor extension).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import numpy as np

try:  # tritonclient depends on ml_dtypes; BF16 needs it.
    from ml_dtypes import bfloat16 as _bfloat16
except ImportError:  # pragma: no cover - ml_dtypes ships with tritonclient
    _bfloat16 = None

#: protocol datatype name -> numpy dtype (little-endian); BYTES -> object.
NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
if _bfloat16 is not None:
    NUMPY_DTYPES["BF16"] = np.dtype(_bfloat16)

#: protocol datatype name -> bytes per element (BYTES is variable: 0 here).
ELEMENT_SIZES: dict[str, int] = {
    "BOOL": 1,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FP16": 2,
    "BF16": 2,
    "FP32": 4,
    "FP64": 8,
    "BYTES": 0,
}

PROTOCOL_DATATYPES = frozenset(ELEMENT_SIZES)


def config_to_protocol(data_type: str) -> str:
    """``TYPE_FP32`` -> ``FP32``; ``TYPE_STRING`` -> ``BYTES`` (Triton model_config.proto)."""
    name = data_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def protocol_to_config(datatype: str) -> str:
    """``FP32`` -> ``TYPE_FP32``; ``BYTES`` -> ``TYPE_STRING``."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def numpy_to_protocol(dtype: np.dtype) -> str:
    """The protocol datatype name of a numpy dtype; object/str/bytes arrays are BYTES.

    Raises:
        ValueError: the dtype has no protocol datatype.
    """
    if dtype.kind in "OSU":
        return "BYTES"
    for name, candidate in NUMPY_DTYPES.items():
        if name != "BYTES" and candidate == dtype.newbyteorder("<"):
            return name
    raise ValueError(f"numpy dtype {dtype} has no Triton datatype")


def element_count(shape: Sequence[int]) -> int:
    """Number of elements of a tensor of ``shape`` (1 for a scalar ``[]``)."""
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


_LEN = struct.Struct("<I")


def serialize_bytes(items: Iterable[bytes | str]) -> bytes:
    """Encode BYTES elements, row-major, as 4-byte LE length + bytes each.

    ``str`` elements are encoded as UTF-8.
    """
    parts: list[bytes] = []
    for item in items:
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(_LEN.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes(buffer: bytes | memoryview, count: int | None = None) -> list[bytes]:
    """Decode a length-prefixed BYTES buffer into its elements.

    Args:
        buffer: the serialized tensor (4-byte LE length + bytes per element).
        count: the element count the shape demands; ``None`` to take them all.

    Raises:
        ValueError: a truncated length or element, or a count other than ``count``.
    """
    view = memoryview(buffer)
    items: list[bytes] = []
    offset = 0
    end = len(view)
    while offset < end:
        if offset + 4 > end:
            raise ValueError("incomplete string length indicator")
        (length,) = _LEN.unpack_from(view, offset)
        offset += 4
        if offset + length > end:
            raise ValueError("incomplete string data")
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if count is not None and len(items) != count:
        raise ValueError(f"unexpected number of string elements {len(items)}, expecting {count}")
    return items


def to_numpy(datatype: str, shape: Sequence[int], data: bytes | memoryview) -> np.ndarray:
    """Wrap raw tensor bytes as a numpy array of ``shape`` (no copy for fixed-size types).

    BYTES become an ``object`` array of ``bytes``.

    Raises:
        ValueError: the byte count does not fit ``shape`` × element size.
    """
    if datatype == "BYTES":
        items = deserialize_bytes(data, element_count(shape))
        array = np.empty(len(items), dtype=object)
        array[:] = items
        return array.reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def from_numpy(array: np.ndarray) -> tuple[str, list[int], bytes]:
    """Serialize a numpy array to ``(datatype, shape, raw bytes)`` in the wire layout."""
    datatype = numpy_to_protocol(array.dtype)
    shape = [int(d) for d in array.shape]
    if datatype == "BYTES":
        return datatype, shape, serialize_bytes(array.ravel(order="C"))
    if datatype == "BOOL":
        return datatype, shape, np.ascontiguousarray(array, dtype=np.bool_).tobytes()
    return (
        datatype,
        shape,
        np.ascontiguousarray(array).astype(NUMPY_DTYPES[datatype], copy=False).tobytes(),
    )
