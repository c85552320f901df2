"""gRPC ``ModelInferRequest`` / ``ModelInferResponse`` <-> Sluice's wire tensors.

Pure functions, no I/O, using the protobuf classes ``tritonclient`` ships.
Rules (docs/reference/grpc-protocol.md; Triton ``src/grpc/infer_handler.cc``):

* An input's data comes from ``raw_input_contents`` (the i-th entry belongs to
  the i-th input that is not in shared memory), from its typed ``contents``, or from
  client shared memory (:mod:`api.shm_tensors`; read later, its data empty here);
  a request that uses ``raw_input_contents`` may not also set ``contents``.
* Typed contents become the binary layout: INT8/INT16 and UINT8/UINT16 narrowed
  from the 32-bit repeated fields, BYTES elements length-prefixed. FP16/BF16
  have no typed field.
* Outputs are always returned in ``raw_output_contents``, one entry per output
  in ``outputs`` order (empty for an output written to shared memory); typed
  ``contents`` are never filled.
* Request parameters follow the rules shared with HTTP (:mod:`api.parameters`).
* A requested output's ``classification`` (``int64_param`` k) asks for the top-k
  classes (classification extension), checked and run as over HTTP.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from sluice.api.parameters import (
    UInt64,
    check_datatype,
    check_request_parameters,
    duplicate_tensor,
    extra_input_data,
    is_uint,
    select_outputs,
)
from sluice.api.shared_memory import RegionSlice
from sluice.api.shm_tensors import ShmRef, ShmTensors, grpc_shm_ref, write_output
from sluice.broker.datatypes import NUMPY_DTYPES, serialize_bytes
from sluice.broker.errors import SluiceError, invalid_arg
from sluice.broker.messages import ParameterValue, RequestedOutput, WireTensor

__all__ = [
    "GrpcInferRequest",
    "encode_infer_response",
    "parameter_value",
    "parse_infer_request",
    "parse_version",
]

#: reserved keys a gRPC request may carry (docs/reference/grpc-protocol.md, ``ModelInfer``).
GRPC_ALLOWED_RESERVED = frozenset({"triton_enable_empty_final_response"})

#: protocol datatype -> (typed ``contents`` field, numpy dtype it is narrowed to).
_CONTENTS_FIELDS: dict[str, tuple[str, np.dtype]] = {
    "BOOL": ("bool_contents", NUMPY_DTYPES["BOOL"]),
    "INT8": ("int_contents", NUMPY_DTYPES["INT8"]),
    "INT16": ("int_contents", NUMPY_DTYPES["INT16"]),
    "INT32": ("int_contents", NUMPY_DTYPES["INT32"]),
    "INT64": ("int64_contents", NUMPY_DTYPES["INT64"]),
    "UINT8": ("uint_contents", NUMPY_DTYPES["UINT8"]),
    "UINT16": ("uint_contents", NUMPY_DTYPES["UINT16"]),
    "UINT32": ("uint_contents", NUMPY_DTYPES["UINT32"]),
    "UINT64": ("uint64_contents", NUMPY_DTYPES["UINT64"]),
    "FP32": ("fp32_contents", NUMPY_DTYPES["FP32"]),
    "FP64": ("fp64_contents", NUMPY_DTYPES["FP64"]),
}

#: each typed field's element type (grpc_service.proto ``InferTensorContents``)
_FIELD_TYPES: dict[str, type[np.generic]] = {
    "bool_contents": np.bool_,
    "int_contents": np.int32,
    "int64_contents": np.int64,
    "uint_contents": np.uint32,
    "uint64_contents": np.uint64,
    "fp32_contents": np.float32,
    "fp64_contents": np.float64,
}


@dataclass(frozen=True, slots=True)
class GrpcInferRequest:
    """One parsed ``ModelInferRequest``.

    Attributes:
        model: ``model_name``.
        version: ``model_version`` as a number; None = the policy's default.
        client_id: ``id`` (echoed back).
        inputs: input tensors in request order, data in the wire layout.
        outputs: the requested outputs in request order; empty = all.
        parameters: request parameters that travel to the model.
        shm: the inputs and outputs in client shared memory (None: none).
    """

    model: str
    version: int | None
    client_id: str
    inputs: tuple[WireTensor, ...]
    outputs: tuple[RequestedOutput, ...]
    parameters: dict[str, ParameterValue]
    shm: ShmTensors | None = None


def parse_version(text: str, model: str) -> int | None:
    """``""`` -> None (policy default); a decimal string -> int.

    Raises:
        SluiceError: INVALID_ARG for anything else (Triton ``GetModelVersionFromString``).
    """
    if not text:
        return None
    if not text.isdigit():
        raise invalid_arg(
            f"failed to get model version from specified version string '{text}' "
            f"for model '{model}'",
            model=model,
        )
    return int(text)


def parameter_value(param: Any) -> object:
    """The Python value of an ``InferParameter`` / ``ModelRepositoryParameter`` /
    ``SettingValue``; ``uint64_param`` as :class:`UInt64`, unset as None."""
    which = param.WhichOneof("parameter_choice")
    if which is None:
        return None
    value = getattr(param, which)
    return UInt64(value) if which == "uint64_param" else value


def parse_infer_request(request: service_pb2.ModelInferRequest) -> GrpcInferRequest:
    """Turn a ``ModelInferRequest`` into wire tensors and checked parameters.

    Raises:
        SluiceError: INVALID_ARG for a malformed request (Triton's texts where it has
            them).
    """
    model = request.model_name
    version = parse_version(request.model_version, model)
    parameters, _ = check_request_parameters(
        ((key, parameter_value(p)) for key, p in request.parameters.items()),
        model,
        allowed_reserved=GRPC_ALLOWED_RESERVED,
    )
    shm_in: dict[str, ShmRef] = {}
    shm_out: dict[str, ShmRef] = {}
    return GrpcInferRequest(
        model=model,
        version=version,
        client_id=request.id,
        inputs=_parse_inputs(request, model, shm_in),
        outputs=_parse_outputs(request.outputs, model, shm_out),
        parameters=parameters,
        shm=ShmTensors(shm_in, shm_out) if shm_in or shm_out else None,
    )


def _parse_inputs(
    request: service_pb2.ModelInferRequest, model: str, shm: dict[str, ShmRef]
) -> tuple[WireTensor, ...]:
    raw = request.raw_input_contents
    use_raw = len(raw) > 0
    seen: set[str] = set()
    tensors: list[WireTensor] = []
    raw_index = 0
    for item in request.inputs:
        name = item.name
        if name in seen:
            raise duplicate_tensor("input", name, model)
        seen.add(name)
        check_datatype(item.datatype, name, model)
        has_contents = item.HasField("contents")
        ref = grpc_shm_ref(item.parameters, name) if item.parameters else None
        if ref is not None:
            if has_contents:
                raise invalid_arg(
                    f"unexpected 'content' provided when using shared memory for input "
                    f"tensor '{name}' for model '{model}'",
                    model=model,
                    tensor=name,
                )
            shm[name] = ref
            data = b""
        elif use_raw:
            if has_contents:
                raise invalid_arg(
                    f"contents field must not be specified when using raw_input_contents "
                    f"for '{name}' for model '{model}'",
                    model=model,
                    tensor=name,
                )
            if raw_index >= len(raw):
                raise _no_data(name, model)
            data = raw[raw_index]
            raw_index += 1
        elif has_contents:
            data = _contents_to_wire(item.contents, item.datatype, name, model)
        else:
            raise _no_data(name, model)
        tensors.append(
            WireTensor(name=name, datatype=item.datatype, shape=tuple(item.shape), data=data)
        )
    if raw_index != len(raw):
        raise extra_input_data(model)
    return tuple(tensors)


def _no_data(name: str, model: str) -> SluiceError:
    return invalid_arg(
        f"unable to find data for input tensor '{name}' for model '{model}' in request.",
        model=model,
        tensor=name,
    )


def _contents_to_wire(contents: Any, datatype: str, name: str, model: str) -> bytes:
    """Typed ``InferTensorContents`` -> wire bytes (narrowing as Triton's C casts do)."""
    if datatype == "BYTES":
        return serialize_bytes(list(contents.bytes_contents))
    spec = _CONTENTS_FIELDS.get(datatype)
    if spec is None:
        raise invalid_arg(
            f"input '{name}' of model '{model}': {datatype} data cannot be sent in typed "
            "'contents'; use raw_input_contents",
            model=model,
            tensor=name,
        )
    field_name, dtype = spec
    values = getattr(contents, field_name)
    # read as the field's own type first: numpy would take [0, 2**63] for float64
    return np.asarray(values, dtype=_FIELD_TYPES[field_name]).astype(dtype).tobytes()


def _parse_outputs(
    items: Iterable[Any], model: str, shm: dict[str, ShmRef]
) -> tuple[RequestedOutput, ...]:
    seen: set[str] = set()
    outputs: list[RequestedOutput] = []
    for item in items:
        name = item.name
        if name in seen:
            raise duplicate_tensor("output", name, model)
        seen.add(name)
        ref = grpc_shm_ref(item.parameters, name) if item.parameters else None
        if ref is not None:
            if "classification" in item.parameters:
                raise invalid_arg(
                    "output can't set both 'shared_memory_region' and 'classification'",
                    model=model,
                    tensor=name,
                )
            shm[name] = ref
        class_count = 0
        if "classification" in item.parameters:
            value = parameter_value(item.parameters["classification"])
            if not is_uint(value) or isinstance(value, UInt64):
                raise invalid_arg(
                    f"Unable to parse 'classification' for output '{name}' of model "
                    f"'{model}': expected a non-negative int64_param",
                    model=model,
                    tensor=name,
                )
            class_count = int(value)  # type: ignore[call-overload]
        outputs.append(RequestedOutput(name=name, class_count=class_count))
    return tuple(outputs)


# -------------------------------------------------------------------------- response


def set_parameter(target: Any, value: object) -> None:
    """Fill an ``InferParameter`` from a Python value (bool, int, float or str)."""
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        if value >= 2**63:
            target.uint64_param = value
        else:
            target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = str(value)


def encode_infer_response(
    *,
    model: str,
    version: str,
    client_id: str,
    outputs: Sequence[WireTensor],
    requested: Sequence[RequestedOutput],
    parameters: Mapping[str, Any] | None = None,
    shm_outputs: Mapping[str, RegionSlice] | None = None,
) -> service_pb2.ModelInferResponse:
    """Build a ``ModelInferResponse`` (docs/reference/grpc-protocol.md, ``ModelInfer``).

    Args:
        model: ``model_name``.
        version: the version that ran it (``model_version``, always set).
        client_id: the request ``id``.
        outputs: tensors the model produced, wire layout.
        requested: the request's ``outputs``; empty = every entry of ``outputs``.
        parameters: response parameters.
        shm_outputs: outputs to write into client shared memory, by name: their
            ``raw_output_contents`` entry is empty, as Triton's
            (``src/grpc/infer_handler.cc`` ``ResponseAllocatorHelper``).

    Raises:
        SluiceError: INTERNAL when a requested output is missing or larger than its
            shared-memory slice.
    """
    selected = [tensor for tensor, _ in select_outputs(outputs, requested)]
    response = service_pb2.ModelInferResponse(model_name=model, model_version=version, id=client_id)
    for tensor in selected:
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
    if shm_outputs:
        for tensor in selected:
            if tensor.name in shm_outputs:
                write_output(shm_outputs[tensor.name], tensor)
        selected_data = [b"" if t.name in shm_outputs else t.data for t in selected]
        response.raw_output_contents.extend(selected_data)
    else:
        response.raw_output_contents.extend([tensor.data for tensor in selected])
    if parameters:
        for key, value in parameters.items():
            set_parameter(response.parameters[key], value)
    return response
