"""Tensors in client shared memory: the ``shared_memory_*`` tensor parameters of an
inference request, the input bytes read from the regions they name, and the outputs
written into them.

Parameters (Triton's shared-memory extension, ``docs/protocol/extension_shared_memory.md``;
texts from ``src/grpc/grpc_utils.h`` ``ParseSharedMemoryParams`` and ``src/http_server.cc``
``CheckSharedMemoryData`` / ``ValidateOutputParameter``), on an input or a requested output:

| key | HTTP JSON | gRPC ``InferParameter`` | |
| --- | --- | --- | --- |
| ``shared_memory_region`` | string | ``string_param`` | a registered region's name |
| ``shared_memory_byte_size`` | unsigned integer | ``int64_param`` | required with a region |
| ``shared_memory_offset`` | unsigned integer | ``int64_param`` | optional, default 0 |

An offset or byte size without a region, or a region without a byte size, is refused
(INVALID_ARG) over both transports. An output in shared memory cannot also ask for
``classification`` (nor, over HTTP, ``binary_data: true``). Parsing is pure; reading
and writing go through the gateway's :class:`api.shared_memory.SharedMemoryRegistry`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.api.parameters import is_uint
from sluice.api.shared_memory import RegionSlice, SharedMemoryRegistry
from sluice.broker.errors import ErrorCode, SluiceError, invalid_arg
from sluice.broker.messages import WireTensor

__all__ = [
    "SHM_KEYS",
    "ShmRef",
    "ShmTensors",
    "grpc_shm_ref",
    "http_shm_output",
    "http_shm_ref",
    "read_inputs",
    "refuse_shared_memory",
    "resolve_outputs",
    "write_output",
]

REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
#: the three tensor parameters of the extension.
SHM_KEYS = (REGION, OFFSET, BYTE_SIZE)


@dataclass(frozen=True, slots=True)
class ShmRef:
    """Where one tensor's bytes are: ``byte_size`` bytes at ``offset`` of a region."""

    region: str
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class ShmTensors:
    """A request's tensors in shared memory, by tensor name (request order)."""

    inputs: dict[str, ShmRef] = field(default_factory=dict)
    outputs: dict[str, ShmRef] = field(default_factory=dict)


def _without_region(key: str, name: str) -> SluiceError:
    return invalid_arg(
        f"'{key}' can not be specified without '{REGION}' parameter for tensor '{name}'",
        tensor=name,
    )


def _ref(region: str | None, offset: int | None, byte_size: int | None, name: str) -> ShmRef | None:
    if region is None:
        for key, value in ((OFFSET, offset), (BYTE_SIZE, byte_size)):
            if value is not None:
                raise _without_region(key, name)
        return None
    if byte_size is None:
        raise invalid_arg(
            f"'{BYTE_SIZE}' must be specified along with '{REGION}' parameter for tensor '{name}'",
            tensor=name,
        )
    return ShmRef(region, offset or 0, byte_size)


def http_shm_ref(params: Mapping[str, Any], name: str, model: str, kind: str) -> ShmRef | None:
    """The shared-memory parameters of an HTTP input or output (``kind``), None without.

    Raises:
        SluiceError: INVALID_ARG for a value of the wrong JSON type (Triton's
            ``Unable to parse`` texts) or a missing companion parameter.
    """
    if not any(key in params for key in SHM_KEYS):
        return None
    region = params.get(REGION)
    if region is not None and not isinstance(region, str):
        raise _unable(REGION, name, model, kind, "attempt to access JSON non-string as string")
    numbers: list[int | None] = []
    for key in (OFFSET, BYTE_SIZE):
        value = params.get(key)
        if value is not None and not is_uint(value):
            raise _unable(
                key, name, model, kind,
                "attempt to access JSON non-unsigned-integer as unsigned-integer",
            )  # fmt: skip
        numbers.append(value)
    return _ref(region, numbers[0], numbers[1], name)


def http_shm_output(params: Mapping[str, Any], name: str, model: str) -> ShmRef:
    """An HTTP requested output's place in shared memory (``params`` has at least one
    of :data:`SHM_KEYS`); Triton ``ValidateOutputParameter``: no ``classification`` and
    no ``binary_data: true`` with it.

    Raises:
        SluiceError: INVALID_ARG as :func:`http_shm_ref`, or for either of those.
    """
    ref = http_shm_ref(params, name, model, "output")
    assert ref is not None  # a parameter without the region is refused
    for key in ("classification", "binary_data"):
        if key in params and (key == "classification" or params[key] is True):
            raise invalid_arg(
                f"Output can't set both '{REGION}' and '{key}'", model=model, tensor=name
            )
    return ref


def _unable(key: str, name: str, model: str, kind: str, reason: str) -> SluiceError:
    return invalid_arg(
        f"Unable to parse '{key}' for {kind} '{name}' of model '{model}': {reason}",
        model=model,
        tensor=name,
    )


def grpc_shm_ref(params: Mapping[str, Any], name: str) -> ShmRef | None:
    """The shared-memory parameters of a gRPC input or requested output (its
    ``parameters`` map of ``InferParameter``), None without.

    Raises:
        SluiceError: INVALID_ARG for a value in another oneof field than Triton
            expects, or a missing companion parameter (Triton's texts).
    """
    if not any(key in params for key in SHM_KEYS):
        return None
    values: dict[str, Any] = {}
    for key, expected in (
        (REGION, "string_param"),
        (OFFSET, "int64_param"),
        (BYTE_SIZE, "int64_param"),
    ):
        if key not in params:
            continue
        param = params[key]
        if param.WhichOneof("parameter_choice") != expected:
            raise invalid_arg(
                f"invalid value type for '{key}' parameter for tensor '{name}', "
                f"expected {expected}.",
                tensor=name,
            )
        values[key] = getattr(param, expected)
    return _ref(values.get(REGION), values.get(OFFSET), values.get(BYTE_SIZE), name)


def read_inputs(
    registry: SharedMemoryRegistry, inputs: Sequence[WireTensor], refs: Mapping[str, ShmRef]
) -> tuple[WireTensor, ...]:
    """``inputs`` with the data of those in ``refs`` copied out of their regions (the
    other inputs as they are).

    Raises:
        SluiceError: as :meth:`SharedMemoryRegistry.slice` (unknown region, bytes past
            its end).
    """
    tensors = []
    for tensor in inputs:
        ref = refs.get(tensor.name)
        if ref is not None:
            data = registry.slice(ref.region, ref.offset, ref.byte_size).read()
            tensor = WireTensor(tensor.name, tensor.datatype, tensor.shape, data)
        tensors.append(tensor)
    return tuple(tensors)


def resolve_outputs(
    registry: SharedMemoryRegistry, refs: Mapping[str, ShmRef]
) -> dict[str, RegionSlice]:
    """Where each output of ``refs`` goes, checked against its region before the request
    is queued (as Triton checks it before running the request).

    Raises:
        SluiceError: as :meth:`SharedMemoryRegistry.slice`.
    """
    return {name: registry.slice(r.region, r.offset, r.byte_size) for name, r in refs.items()}


def write_output(target: RegionSlice, tensor: WireTensor) -> None:
    """Copy an output's bytes to the start of its slice of a region.

    Raises:
        SluiceError: INTERNAL when the slice is smaller than the output (Triton's text;
            nothing is written then) or a CUDA copy fails.
    """
    size = len(tensor.data)
    if size > len(target):
        raise SluiceError(
            ErrorCode.INTERNAL,
            f"shared memory size specified with the request for output '{tensor.name}' "
            f"({len(target)} bytes) should be at least {size} bytes to hold the results",
            tensor=tensor.name,
        )
    target.write(tensor.data)


def refuse_shared_memory(shm: ShmTensors | None, model: str, what: str) -> None:
    """UNSUPPORTED when a request that cannot use shared memory (``what``: an async job,
    a decoupled model's responses) names a region.

    Raises:
        SluiceError: UNSUPPORTED naming the model and the first such tensor.
    """
    if shm is None:
        return
    for kind, refs in (("input", shm.inputs), ("output", shm.outputs)):
        for name in refs:
            raise SluiceError(
                ErrorCode.UNSUPPORTED,
                f"{kind} '{name}' of model '{model}': shared memory cannot be used by {what}",
                model=model,
                tensor=name,
            )
