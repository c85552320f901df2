"""HTTP inference requests: the JSON header, binary tensor data after it, raw bodies.

Pure functions, no I/O. Rules and Triton's texts: docs/reference/http-protocol.md
(Inference, Binary tensor data extension); Triton ``src/http_server.cc``
(``HTTPAPIServer::InferRequestClass``, ``ReadDataFromJson``); the ``inputs`` and
``outputs`` lists: :mod:`api.http.request_tensors`. Inputs come out in the wire
layout of :class:`broker.messages.WireTensor` (raw little-endian bytes; ``BYTES`` as
4-byte length-prefixed elements), so nothing is re-encoded later.

Triton reports JSON member/type problems as INTERNAL (500); Sluice answers them
INVALID_ARG (400), keeping Triton's message text (docs/reference/errors.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass

import orjson
import rapidjson

from sluice.api.http.json_tensors import NOT_STRING
from sluice.api.http.request_tensors import parse_inputs, parse_outputs
from sluice.api.parameters import check_request_parameters
from sluice.api.shm_tensors import ShmRef, ShmTensors
from sluice.broker.datatypes import ELEMENT_SIZES, serialize_bytes
from sluice.broker.errors import invalid_arg
from sluice.broker.messages import ParameterValue, RequestedOutput, WireTensor
from sluice.broker.request_checks import TensorSpec

__all__ = ["BinaryLayout", "HttpInferRequest", "parse_infer_request", "parse_with_layout"]

#: python-rapidjson's parse error text: offset, then rapidjson's reason
_RAPIDJSON_ERROR = re.compile(r"Parse error at offset (\d+): (.*)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class HttpInferRequest:
    """One parsed ``POST /v2/models/{m}[/versions/{v}]/infer`` body.

    Attributes:
        client_id: the JSON ``id`` (echoed back), ``""`` when absent.
        inputs: input tensors in request order, data in the wire layout.
        outputs: the ``outputs`` the request lists, in its order; empty = all.
        parameters: request parameters (``sequence_id``, ``priority``, custom
            ones, …) without ``binary_data_output``.
        binary_data_output: request-level default encoding for outputs that the
            request does not list (binary tensor data extension).
        shm: the inputs and outputs in client shared memory (None: none); such an
            input's ``data`` is empty until read from its region
            (:mod:`api.shm_tensors`).
    """

    client_id: str
    inputs: tuple[WireTensor, ...]
    outputs: tuple[RequestedOutput, ...]
    parameters: dict[str, ParameterValue]
    binary_data_output: bool
    shm: ShmTensors | None = None


def parse_infer_request(
    body: bytes | bytearray | memoryview,
    header_length: int | None,
    *,
    model: str,
    config_inputs: Collection[TensorSpec] = (),
    max_batch_size: int = 0,
) -> HttpInferRequest:
    """Parse an HTTP inference request body (JSON, optionally followed by binary data).

    Args:
        body: the whole (already decompressed) request body.
        header_length: the ``Inference-Header-Content-Length`` value; ``None`` when
            the header is absent (the whole body is JSON).
        model: model name, for error messages.
        config_inputs: the model config's inputs, for a raw binary request
            (``header_length == 0``: the whole body is the data of the only input).
        max_batch_size: Triton model_config.proto ``max_batch_size``, for a raw
            binary request (> 0: it is a batch of 1).

    Returns:
        The request with every input's data in the wire layout. Sizes against
        the model config are not checked here.

    Raises:
        SluiceError: INVALID_ARG for any malformed body (Triton's texts,
            docs/reference/errors.md) or a raw binary request whose input cannot be
            deduced.
    """
    return parse_with_layout(
        body,
        header_length,
        model=model,
        config_inputs=config_inputs,
        max_batch_size=max_batch_size,
    )[0]


@dataclass(frozen=True, slots=True)
class BinaryLayout:
    """What a JSON header says of a request whose inputs are all binary (binary tensor
    data extension): everything but the tensors' bytes, which follow the header in order.

    Attributes:
        request: the parsed request with empty input data.
        sizes: each input's ``binary_data_size``, in bytes, in request order (0 for an
            input in shared memory).
        body_length: the whole body's length, in bytes (header and every input's data).
    """

    request: HttpInferRequest
    sizes: tuple[int, ...]
    body_length: int

    def apply(self, body: bytes | bytearray | memoryview) -> HttpInferRequest:
        """The request of ``body`` (``body_length`` bytes whose header is this layout's):
        its inputs take their bytes from ``body``."""
        view = memoryview(body).cast("B")
        offset = self.body_length - sum(self.sizes)
        tensors = []
        for tensor, size in zip(self.request.inputs, self.sizes, strict=True):
            tensors.append(
                WireTensor(
                    tensor.name, tensor.datatype, tensor.shape, bytes(view[offset : offset + size])
                )
            )
            offset += size
        request = self.request
        return HttpInferRequest(
            client_id=request.client_id,
            inputs=tuple(tensors),
            outputs=request.outputs,
            parameters=dict(request.parameters) if request.parameters else {},
            binary_data_output=request.binary_data_output,
            shm=request.shm,
        )


def parse_with_layout(
    body: bytes | bytearray | memoryview,
    header_length: int | None,
    *,
    model: str,
    config_inputs: Collection[TensorSpec] = (),
    max_batch_size: int = 0,
) -> tuple[HttpInferRequest, BinaryLayout | None]:
    """:func:`parse_infer_request`, with the request's :class:`BinaryLayout` when its
    JSON header (``header_length`` > 0) lists only binary inputs, else None.

    Raises:
        SluiceError: as :func:`parse_infer_request`.
    """
    view = memoryview(body).cast("B")
    total = len(view)
    if header_length is None:
        header_length = total
    elif header_length < 0 or header_length > total:
        raise invalid_arg(
            f"inference header size should be in range (0, {total}), got: {header_length}",
            model=model,
        )
    elif header_length == 0:
        return _parse_raw_request(view, model, config_inputs, max_batch_size), None

    document = _loads_json(view[:header_length], model)
    if not isinstance(document, dict):
        raise invalid_arg(
            "failed to parse the request JSON buffer: the request must be a JSON object",
            model=model,
        )

    client_id = document.get("id", "")
    if not isinstance(client_id, str):
        raise invalid_arg(f"Unable to parse 'id' for model '{model}': {NOT_STRING}", model=model)

    parameters, binary_data_output = _parse_request_parameters(document.get("parameters"), model)
    shm_in: dict[str, ShmRef] = {}
    shm_out: dict[str, ShmRef] = {}
    inputs, sizes = parse_inputs(document.get("inputs"), view, header_length, model, shm_in)
    outputs = parse_outputs(document.get("outputs"), binary_data_output, model, shm_out)
    request = HttpInferRequest(
        client_id=client_id,
        inputs=inputs,
        outputs=outputs,
        parameters=parameters,
        binary_data_output=binary_data_output,
        shm=ShmTensors(shm_in, shm_out) if shm_in or shm_out else None,
    )
    if sizes is None:
        return request, None
    template = HttpInferRequest(
        client_id=client_id,
        inputs=tuple(WireTensor(t.name, t.datatype, t.shape, b"") for t in inputs),
        outputs=outputs,
        parameters=dict(parameters),
        binary_data_output=binary_data_output,
        shm=request.shm,
    )
    return request, BinaryLayout(template, sizes, total)


def _parse_raw_request(
    view: memoryview, model: str, config_inputs: Collection[TensorSpec], max_batch_size: int
) -> HttpInferRequest:
    """A raw binary request (``Inference-Header-Content-Length: 0``): the
    body is the data of the model's only input, whose shape comes from its config
    ``dims`` with at most one ``-1``, sized by the body's bytes; a batching model gets a
    batch of 1. A BYTES input must have dims ``[1]``: the body is its one element. Every
    output is answered, in binary. Rules and texts: Triton core
    ``InferenceRequest::Normalize``.

    Raises:
        SluiceError: INVALID_ARG when the model has more or fewer than one input, the
            input has two or more ``-1`` dims, or it is BYTES with other dims than [1].
    """
    if len(config_inputs) != 1:
        raise invalid_arg(
            "Raw request must only have 1 input (found 1) to be deduced but got "
            f"{len(config_inputs)} inputs in '{model}' model configuration",
            model=model,
        )
    (spec,) = config_inputs
    shape = [1] if max_batch_size > 0 else []
    variable = -1
    elements = 1
    for dim in spec.dims:
        if dim == -1:
            if variable != -1:
                raise invalid_arg(
                    f"The shape of the raw input '{spec.name}' can not be deduced because "
                    "there are more than one variable-sized dimension",
                    model=model,
                    tensor=spec.name,
                )
            variable = len(shape)
        else:
            elements *= dim
        shape.append(dim)
    data = bytes(view)
    if spec.datatype == "BYTES":
        if variable != -1 or elements != 1:
            raise invalid_arg(
                f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]",
                model=model,
                tensor=spec.name,
            )
        data = serialize_bytes([data])
    elif variable != -1:
        unit = elements * ELEMENT_SIZES[spec.datatype]
        shape[variable] = len(data) // unit if unit else 0
    return HttpInferRequest(
        client_id="",
        inputs=(WireTensor(spec.name, spec.datatype, tuple(shape), data),),
        outputs=(),
        parameters={},
        binary_data_output=True,
    )


def _loads_json(text: memoryview, model: str) -> object:
    """The request's JSON document, parsed as Triton parses it (triton common
    ``TritonJson::Parse``: rapidjson with ``kParseNanAndInfFlag``, so ``NaN``,
    ``Infinity``, ``-Infinity``, ``Inf`` and ``-Inf`` are numbers; tritonclient writes
    them for non-finite floats). orjson parses what it can (fast); a document it refuses
    is parsed by python-rapidjson, the same parser as Triton's, whose error is the one
    reported, in Triton's words: ``failed to parse the request JSON buffer: <reason> at
    <byte offset>``.

    Raises:
        SluiceError: INVALID_ARG naming the model for a document neither parses, one
            nested deeper than rapidjson's recursion limit, one with a NUL byte (rapidjson
            would stop there) or with bytes that are not UTF-8 (Triton takes those as they
            are; Sluice's strings are text).
    """
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        reason = str(exc)
    raw = bytes(text)
    if b"\0" not in raw:  # no JSON text holds a NUL byte; rapidjson would stop at it
        try:
            return rapidjson.loads(raw, number_mode=rapidjson.NM_NAN)
        except UnicodeDecodeError as exc:
            reason = f"Invalid encoding in string (not UTF-8). at {exc.start}"
        except (ValueError, RecursionError) as exc:
            found = _RAPIDJSON_ERROR.fullmatch(str(exc))
            reason = f"{found[2]} at {found[1]}" if found else str(exc)
    else:
        reason = _trailing_bytes(raw) or reason
    raise invalid_arg(f"failed to parse the request JSON buffer: {reason}", model=model)


def _trailing_bytes(raw: bytes) -> str | None:
    """rapidjson's reason for a whole JSON document followed by other bytes (an
    ``Inference-Header-Content-Length`` past the JSON, into the binary data), at the byte
    offset of the first of them; None when ``raw`` does not start with one."""
    text = raw.decode("utf-8", "surrogateescape")
    try:
        _, end = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return None
    rest = text[end:]
    end += len(rest) - len(rest.lstrip(" \t\n\r"))
    offset = len(text[:end].encode("utf-8", "surrogateescape"))
    return f"The document root must not be followed by other values. at {offset}"


def _parse_request_parameters(raw: object, model: str) -> tuple[dict[str, ParameterValue], bool]:
    """Check the request ``parameters`` (rules shared with gRPC: :mod:`api.parameters`) and
    split off ``binary_data_output``."""
    if raw is None:
        return {}, False
    if not isinstance(raw, dict):
        raise invalid_arg(
            f"Unable to parse 'parameters' for model '{model}': expected a JSON object",
            model=model,
        )
    return check_request_parameters(raw.items(), model)
