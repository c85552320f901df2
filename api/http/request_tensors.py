"""The ``inputs`` and ``outputs`` lists of an HTTP inference request's JSON header.

Pure functions, no I/O, used by :mod:`api.http.infer_request`. Rules and Triton's texts:
docs/reference/http-protocol.md (Inference, Binary tensor data extension, Shared-memory
extension); Triton ``src/http_server.cc`` (``HTTPAPIServer::InferRequestClass``). An
input's data comes out in the wire layout of :class:`broker.messages.WireTensor`.
"""

from __future__ import annotations

from sluice.api.http.json_tensors import NOT_BOOL, NOT_STRING, NOT_UINT, json_to_wire, unable
from sluice.api.parameters import check_datatype, duplicate_tensor, extra_input_data, is_uint
from sluice.api.shm_tensors import SHM_KEYS, ShmRef, http_shm_output, http_shm_ref
from sluice.broker.errors import invalid_arg
from sluice.broker.messages import RequestedOutput, WireTensor
from sluice.broker.request_checks import negative_shape

__all__ = ["parse_inputs", "parse_outputs"]

_ONE_OF_MESSAGE = (
    "Input must set only one of the following fields: 'data', 'binary_data_size' in "
    "'parameters', 'shared_memory_region' in 'parameters'"
)


def parse_inputs(
    raw: object, view: memoryview, header_length: int, model: str, shm: dict[str, ShmRef]
) -> tuple[tuple[WireTensor, ...], tuple[int, ...] | None]:
    """Read every input; binary ones take consecutive chunks after the JSON, those in
    shared memory get empty data and their place in ``shm``. Also returns each input's
    ``binary_data_size`` (0 in shared memory) when no input is JSON, else None."""
    if not isinstance(raw, list):
        raise invalid_arg(
            f"Unable to parse 'inputs' for model '{model}': expected a JSON array", model=model
        )
    offset = header_length
    seen: set[str] = set()
    tensors: list[WireTensor] = []
    sizes: list[int] | None = []
    for item in raw:
        name = _entry_name(item, "input", model, seen)
        shape = _parse_shape(item.get("shape"), name, model)
        datatype = item.get("datatype")
        if not isinstance(datatype, str):
            raise unable("datatype", name, model, NOT_STRING)
        check_datatype(datatype, name, model)

        params = item.get("parameters", {})
        if not isinstance(params, dict):
            raise unable("parameters", name, model, "expected a JSON object")
        has_data = "data" in item
        has_binary = "binary_data_size" in params
        has_shm = "shared_memory_region" in params
        if has_data + has_binary + has_shm != 1:
            raise invalid_arg(
                f"{_ONE_OF_MESSAGE} (input '{name}' of model '{model}')", model=model, tensor=name
            )
        if has_shm:
            shm[name] = http_shm_ref(params, name, model, "input")  # type: ignore[assignment]
            data = b""  # read from its region later; no bytes in the body (a layout's 0)
            if sizes is not None:
                sizes.append(0)
        elif has_binary:
            size = params["binary_data_size"]
            if not is_uint(size):
                raise unable("binary_data_size", name, model, NOT_UINT)
            available = len(view) - offset
            if size > available:
                raise invalid_arg(
                    f"unexpected size for input '{name}', expecting {size - available} "
                    f"additional bytes for model '{model}'",
                    model=model,
                    tensor=name,
                )
            data = bytes(view[offset : offset + size])
            offset += size
            if sizes is not None:
                sizes.append(size)
        else:
            data = json_to_wire(item["data"], datatype, shape, name, model)
            sizes = None
        tensors.append(WireTensor(name=name, datatype=datatype, shape=shape, data=data))
    if offset != len(view):
        raise extra_input_data(model)
    return tuple(tensors), None if sizes is None else tuple(sizes)


def _parse_shape(raw: object, name: str, model: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(is_uint(dim) for dim in raw):
        raise negative_shape(name, model)
    return tuple(raw)


def parse_outputs(
    raw: object, binary_data_output: bool, model: str, shm: dict[str, ShmRef]
) -> tuple[RequestedOutput, ...]:
    """Read the ``outputs`` list; each output's ``binary_data`` beats the request default;
    those in shared memory get their place in ``shm``."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise invalid_arg(
            f"Unable to parse 'outputs' for model '{model}': expected a JSON array", model=model
        )
    seen: set[str] = set()
    outputs: list[RequestedOutput] = []
    for item in raw:
        name = _entry_name(item, "output", model, seen)
        params = item.get("parameters", {})
        if not isinstance(params, dict):
            raise unable("parameters", name, model, "expected a JSON object", kind="output")
        if any(key in params for key in SHM_KEYS):
            shm[name] = http_shm_output(params, name, model)
        binary = params.get("binary_data", binary_data_output)
        if not isinstance(binary, bool):
            raise unable("binary_data", name, model, NOT_BOOL, kind="output")
        class_count = params.get("classification", 0)
        if not is_uint(class_count):
            raise unable("classification", name, model, NOT_UINT, kind="output")
        outputs.append(RequestedOutput(name=name, binary=binary, class_count=class_count))
    return tuple(outputs)


def _entry_name(item: object, kind: str, model: str, seen: set[str]) -> str:
    """The ``name`` of one entry of the ``inputs`` / ``outputs`` list (``kind``: "input"
    or "output"), added to ``seen``.

    Raises:
        SluiceError: INVALID_ARG, with Triton's texts: the entry is not an object, its
            name not a string, or the name is listed twice.
    """
    if not isinstance(item, dict):
        raise invalid_arg(
            f"Unable to parse '{kind}s' for model '{model}': expected an array of objects",
            model=model,
        )
    name = item.get("name")
    if not isinstance(name, str):
        raise invalid_arg(
            f"Unable to parse 'name' for an {kind} of model '{model}': {NOT_STRING}",
            model=model,
        )
    if name in seen:
        raise duplicate_tensor(kind, name, model)
    seen.add(name)
    return name
