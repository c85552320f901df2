"""The JSON ``data`` of an HTTP inference tensor <-> its wire bytes.

A JSON input's ``data`` (flat or nested, row-major) becomes the raw little-endian bytes
of :class:`broker.messages.WireTensor` (``BYTES`` as 4-byte length-prefixed elements), and
an output asked for as JSON becomes a flat ``data`` list. Rules and texts: Triton
``src/http_server.cc`` (``ReadDataFromJson``, ``WriteDataToJson``) and the type-mismatch
texts of triton common ``TritonJson``; docs/reference/http-protocol.md (JSON tensors).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import rapidjson

from sluice.broker.datatypes import (
    ELEMENT_SIZES,
    NUMPY_DTYPES,
    deserialize_bytes,
    element_count,
    serialize_bytes,
)
from sluice.broker.errors import ErrorCode, SluiceError, invalid_arg
from sluice.broker.messages import WireTensor

__all__ = [
    "MAX_DATA_DEPTH",
    "NOT_BOOL",
    "NOT_INT",
    "NOT_NUMBER",
    "NOT_STRING",
    "NOT_UINT",
    "json_to_wire",
    "unable",
    "wire_to_json",
]

#: Triton's limit on the nesting of a JSON ``data`` array (a flat list is depth 1).
MAX_DATA_DEPTH = 100

# TritonJson's type-mismatch texts, per target kind.
NOT_BOOL = "attempt to access JSON non-boolean as boolean"
NOT_INT = "attempt to access JSON non-signed-integer as signed-integer"
NOT_UINT = "attempt to access JSON non-unsigned-integer as unsigned-integer"
NOT_NUMBER = "attempt to access JSON non-number as number"
NOT_STRING = "attempt to access JSON non-string as string"
_SHAPE_MISMATCH = "shape does not match true shape of 'data' field"

_INT_TYPES = frozenset({int})
_NUMBER_TYPES = frozenset({int, float})


def json_to_wire(
    raw: object, datatype: str, shape: tuple[int, ...], name: str, model: str
) -> bytes:
    """Convert a JSON ``data`` member (flat or nested) to wire bytes.

    Only the total element count must equal the product of ``shape``; the
    nesting need not mirror it. Integers out of range of a narrower type are
    truncated as Triton's C casts do.
    """
    count = element_count(shape)
    if count == 0:  # zero-element tensor: Triton ignores 'data'
        return b""
    if datatype in ("FP16", "BF16"):
        raise invalid_arg(
            f"receiving {datatype} data via JSON is not supported. Please use the binary "
            f"data format for input '{name}' of model '{model}'",
            model=model,
            tensor=name,
        )
    if isinstance(raw, list):
        flat, types = _flatten(raw, 1, name, model)
    else:  # a lone scalar is one element, as in Triton's recursive reader
        flat, types = [raw], {type(raw)}
    if len(flat) != count:
        raise unable("data", name, model, _SHAPE_MISMATCH)

    if datatype == "BYTES":
        if not types <= {str}:
            raise unable("data", name, model, NOT_STRING)
        return serialize_bytes(flat)
    if datatype == "BOOL":
        if not types <= {bool}:
            raise unable("data", name, model, NOT_BOOL)
        return np.array(flat, dtype=np.bool_).tobytes()
    target = NUMPY_DTYPES[datatype]
    if target.kind == "f":
        if not types <= _NUMBER_TYPES:
            raise unable("data", name, model, NOT_NUMBER)
        with np.errstate(over="ignore"):  # out of range is ±inf, as a C cast gives Triton
            return np.array(flat, dtype=np.float64).astype(target).tobytes()
    if target.kind == "i":
        if not types <= _INT_TYPES:
            raise unable("data", name, model, NOT_INT)
        try:
            values = np.array(flat, dtype=np.int64)
        except OverflowError:
            raise unable("data", name, model, NOT_INT) from None
        return values.astype(target).tobytes()
    # unsigned
    if not types <= _INT_TYPES:
        raise unable("data", name, model, NOT_UINT)
    try:
        values = np.array(flat, dtype=np.int64)
        if values.min() < 0:
            raise unable("data", name, model, NOT_UINT)
    except OverflowError:  # some value >= 2**63: only uint64 holds it
        try:
            values = np.array(flat, dtype=np.uint64)
        except OverflowError:
            raise unable("data", name, model, NOT_UINT) from None
    return values.astype(target).tobytes()


def _flatten(data: list[Any], depth: int, name: str, model: str) -> tuple[list[Any], set[type]]:
    """Flatten nested lists row-major; also return the set of leaf types.

    A flat list costs one C-level pass (``set(map(type, ...))``).
    """
    if depth > MAX_DATA_DEPTH:
        raise invalid_arg(
            f"JSON nesting depth exceeds maximum allowed limit ({MAX_DATA_DEPTH}) "
            f"in 'data' of input '{name}' of model '{model}'",
            model=model,
            tensor=name,
        )
    types = set(map(type, data))
    if list not in types:
        return data, types
    flat: list[Any] = []
    leaf_types: set[type] = set()
    for item in data:
        if type(item) is list:
            sub, sub_types = _flatten(item, depth + 1, name, model)
            flat.extend(sub)
            leaf_types |= sub_types
        else:
            flat.append(item)
            leaf_types.add(type(item))
    return flat, leaf_types


def unable(member: str, name: str, model: str, reason: str, *, kind: str = "input") -> SluiceError:
    return invalid_arg(
        f"Unable to parse '{member}' for {kind} '{name}' of model '{model}': {reason}",
        model=model,
        tensor=name,
    )


def wire_to_json(tensor: WireTensor, model: str) -> Any:
    """One output's flat JSON ``data``: a numpy array (orjson writes it) or a list of str."""
    name, datatype = tensor.name, tensor.datatype
    count = element_count(tensor.shape)
    if datatype in ("FP16", "BF16"):
        raise invalid_arg(
            f"sending {datatype} data via JSON is not supported. Please use the binary data "
            f"format for output '{name}' of model '{model}'",
            model=model,
            tensor=name,
        )
    if datatype == "BYTES":
        try:
            items = deserialize_bytes(tensor.data, count)
        except ValueError as exc:
            raise _size_mismatch(name, model, str(exc)) from None
        try:
            return [item.decode("utf-8") for item in items]
        except UnicodeDecodeError:
            raise invalid_arg(
                f"output '{name}' of model '{model}' holds bytes that are not valid UTF-8; "
                "ask for it in binary",
                model=model,
                tensor=name,
            ) from None
    expected = count * ELEMENT_SIZES[datatype]
    if len(tensor.data) != expected:
        raise _size_mismatch(name, model, f"{len(tensor.data)} bytes, expected {expected}")
    if datatype == "BOOL":
        return np.frombuffer(tensor.data, dtype=np.uint8) != 0
    dtype = NUMPY_DTYPES[datatype]
    # orjson serializes native-endian numpy arrays only.
    array = np.frombuffer(tensor.data, dtype=dtype).astype(dtype.newbyteorder("="), copy=False)
    if dtype.kind == "f" and not np.isfinite(array).all():
        # orjson would write null; Triton writes NaN / Infinity / -Infinity
        return orjson.Fragment(rapidjson.dumps(array.tolist(), number_mode=rapidjson.NM_NAN))
    return array


def _size_mismatch(name: str, model: str, detail: str) -> SluiceError:
    return SluiceError(
        ErrorCode.INTERNAL,
        f"output tensor shape does not match size of output for '{name}' of model "
        f"'{model}': {detail}",
        model=model,
        tensor=name,
    )
