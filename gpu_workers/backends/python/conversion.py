"""Sluice's requests as ``pb_utils`` requests, and a model's ``pb_utils`` responses as
Sluice's answers, as Triton's python_backend builds and checks them
(docs/reference/python-backend.md; python_backend ``src/infer_request.cc``,
``src/infer_response.cc``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from tritonclient.grpc.model_config_pb2 import DataType

from sluice.broker.datatypes import NUMPY_DTYPES, numpy_to_protocol
from sluice.gpu_workers.backends.base import InferError, InferRequest, InferResponse
from sluice.gpu_workers.backends.python import pb_utils

__all__ = ["RESERVED_PARAMETERS", "OutputSpec", "from_pb_response", "to_pb_request"]

#: Request parameters with a meaning for Triton itself (docs/reference/http-protocol.md,
#: "Request parameters"); the model's ``parameters()`` holds only the other (custom) ones.
RESERVED_PARAMETERS = frozenset(
    {
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "binary_data_output",
        "headers",
    }
)


def _int_or_str(value: Any) -> int | str:
    """``sequence_id`` is an unsigned integer or a string (docs/reference/http-protocol.md)."""
    if isinstance(value, int):
        return int(value)
    return str(value)


def _writable(array: np.ndarray) -> np.ndarray:
    """Python-backend inputs are writable under Triton; wire buffers here are not."""
    return array if array.flags.writeable else array.copy()


def to_pb_request(
    request: InferRequest,
    *,
    output_names: Sequence[str] = (),
    input_reshape: dict[str, tuple[int, ...]] | None = None,
    batching: bool = False,
) -> pb_utils.InferenceRequest:
    """Our request -> ``pb_utils.InferenceRequest`` as Triton builds it.

    ``correlation_id`` comes from ``sequence_id`` (0 when absent), ``flags``
    from ``sequence_start``/``sequence_end``, ``parameters()`` holds the
    custom parameters only, and ``requested_output_names()`` lists every
    configured output when the client named none (Triton core
    ``InferenceRequest::Normalize``). Config ``reshape`` is applied to inputs.

    Args:
        request: The request.
        output_names: The config's output names.
        input_reshape: Input name -> ``reshape.shape`` for inputs with a reshape.
        batching: Whether the model batches (first dim is the batch).
    """
    params = request.parameters
    flags = 0
    if params.get("sequence_start"):
        flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    if params.get("sequence_end"):
        flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
    custom = {
        k: v
        for k, v in params.items()
        if k not in RESERVED_PARAMETERS and not k.startswith("triton_")
    }
    reshape = input_reshape or {}
    tensors = []
    for name, array in request.inputs.items():
        target = reshape.get(name)
        if target is not None:
            array = array.reshape((array.shape[0], *target) if batching else target)
        tensors.append(pb_utils.Tensor(name, _writable(array)))
    return pb_utils.InferenceRequest(
        inputs=tensors,
        requested_output_names=list(request.requested_outputs or output_names),
        flags=flags,
        request_id=request.client_id,
        correlation_id=_int_or_str(params.get("sequence_id", 0)),
        timeout=int(params.get("timeout", 0) or 0),
        parameters=custom,
    )


def _to_config_dtype(array: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """``array`` as the config's ``dtype``, or None when that would change its values.

    A float array converts to a float type as numpy converts it (FP64 to FP32 or FP16:
    rounding to the narrower float is what the config's type means), unless a finite
    value would overflow to inf (``70000`` as FP16, ``1e300`` as FP32); BOOL converts to
    anything. Any other conversion (integer to float, float to integer or BOOL, integer to a
    narrower or unsigned integer) is made only when every value is equal after it:
    ``-1`` or ``300`` as UINT8, ``2.7`` as INT32, ``2`` as BOOL or ``2**40 + 1`` as FP32
    would be silently different numbers. Triton's python_backend sends the model's own
    datatype instead of the config's (python_backend ``InferResponse::Send``); Sluice
    answers with the type the model metadata declares.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        converted = array.astype(dtype)
        if array.dtype.kind == "b":
            return converted
        if array.dtype.kind == "f" and dtype.kind == "f":
            overflowed = np.isinf(converted) & np.isfinite(array)
            return None if overflowed.any() else converted
        return converted if np.array_equal(converted, array) else None


def _as_bytes_array(array: np.ndarray) -> np.ndarray:
    """Any BYTES-like array -> ``object`` array of ``bytes`` (``str`` encoded as UTF-8)."""
    if array.dtype == object and all(isinstance(v, bytes) for v in array.flat):
        return array
    flat = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.ravel()]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(array.shape)


class OutputSpec:
    """What the config says about one output."""

    __slots__ = ("bytes", "dims", "dtype", "name", "reshaped")

    def __init__(self, name: str, data_type: int, dims: tuple[int, ...], reshaped: bool) -> None:
        self.name = name
        type_name = DataType.Name(data_type)
        self.bytes = type_name == "TYPE_STRING"
        numpy_type = None if self.bytes else pb_utils.triton_to_numpy_type(type_name)
        if type_name == "TYPE_BF16":  # ml_dtypes' bfloat16, the wire type (None without it)
            numpy_type = NUMPY_DTYPES.get("BF16")
        self.dtype: np.dtype | None = None if numpy_type is None else np.dtype(numpy_type)
        self.dims = dims
        self.reshaped = reshaped


def from_pb_response(
    response: Any,
    request: pb_utils.InferenceRequest,
    outputs: dict[str, OutputSpec],
    *,
    model: str,
    batching: bool,
    keep: frozenset[str] = frozenset(),
) -> InferResponse | InferError:
    """``pb_utils.InferenceResponse`` -> our answer for one request.

    An attached ``TritonError`` becomes :class:`InferError` with its code name.
    Outputs the request did not ask for (every configured output when it named none)
    are dropped before anything else, an output the config does not declare
    included, and a response may carry no output at all: python_backend prunes a
    response to the requested outputs (``InferResponse::PruneOutputTensors``) before
    Triton core sees it. BYTES outputs become ``object`` arrays
    of ``bytes``; a numeric output of another dtype than the config's is cast
    to the config's dtype (the wire format follows the config). Outputs named in
    ``keep`` (implicit state outputs) are kept whatever the request asked for.
    """
    if not isinstance(response, pb_utils.InferenceResponse):
        return InferError(
            "INTERNAL",
            f"model '{model}': execute() must return pb_utils.InferenceResponse objects, "
            f"got {type(response).__name__}",
        )
    if response.has_error():
        error = response.error()
        if isinstance(error, pb_utils.TritonError):
            return InferError(error.code_name(), error.message())
        return InferError("INTERNAL", str(error))
    wanted = set(request.requested_output_names())
    result: dict[str, np.ndarray] = {}
    for tensor in response.output_tensors():
        name = tensor.name()
        if wanted and name not in wanted and name not in keep:
            continue
        spec = outputs.get(name)
        if spec is None:  # asked for but not configured: the gateway refuses such requests
            return InferError(
                "INTERNAL", f"unexpected inference output '{name}' for model '{model}'"
            )
        array = np.asarray(tensor._data())  # as_numpy() refuses BF16, as Triton's
        if spec.reshaped:
            array = array.reshape((array.shape[0], *spec.dims) if batching else spec.dims)
        if spec.bytes:
            if array.dtype.kind not in "OSU":
                return InferError(
                    "INTERNAL",
                    f"model '{model}': output '{name}' is BYTES in the model configuration "
                    f"but the model returned dtype {array.dtype}",
                )
            array = _as_bytes_array(array)
        elif spec.dtype is not None and array.dtype != spec.dtype:
            if array.dtype.kind in "OSU":
                return InferError(
                    "INTERNAL",
                    f"model '{model}': output '{name}' is "
                    f"{numpy_to_protocol(spec.dtype)} in the model configuration but the "
                    "model returned BYTES",
                )
            converted = _to_config_dtype(array, spec.dtype)
            if converted is None:
                return InferError(
                    "INTERNAL",
                    f"model '{model}': output '{name}' is "
                    f"{numpy_to_protocol(spec.dtype)} in the model "
                    f"configuration but the model returned {array.dtype} values that "
                    "change when converted to it",
                )
            array = converted
        result[name] = array
    params = response.parameters()
    parameters = json.loads(params) if params else {}
    return InferResponse(result, parameters if isinstance(parameters, dict) else {})
