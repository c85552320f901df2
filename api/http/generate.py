"""Triton's generate extension: ``POST /v2/models/{m}[/versions/{v}]/generate`` and
``/generate_stream`` (Server-Sent Events), for decoupled and other models.

The request is one JSON object: its keys other than ``id`` and ``parameters`` name
model inputs (a string is a BYTES element, a number or a list takes the input's config
datatype; the batch dimension is added for a batching model), ``parameters`` are the
request parameters. Each response is ``{"model_name", "model_version", "id"?, <one key
per output>}``, an output of one element given as that element. ``generate`` answers
one such object (a model that sends more than one response fails it: use
``generate_stream``); ``generate_stream`` answers ``text/event-stream`` with one
``data: {...}`` event per response. An error before the first response is a JSON error
with its status; one after it is an event ``data: {"error": "..."}`` (the status is
200 by then). Triton ``docs/protocol/extension_generate.md``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from sluice.api.http.json_tensors import json_to_wire, wire_to_json
from sluice.api.http.routes import _json_object, dataplane, json_response
from sluice.api.models import ModelView
from sluice.api.parameters import check_request_parameters
from sluice.broker.errors import ErrorCode, SluiceError, invalid_arg
from sluice.broker.messages import InferResponseMessage, WireTensor

__all__ = ["router"]

router = APIRouter()

#: one event per response, as Triton's SSE framing
_SSE = "text/event-stream; charset=utf-8"


def generate_inputs(view: ModelView, body: dict[str, Any]) -> list[WireTensor]:
    """The inputs named by ``body``'s keys, as wire tensors.

    Raises:
        SluiceError: INVALID_ARG for a key that names no input, a missing required input,
            or a value that does not fit the input's datatype.
    """
    model = view.name
    unknown = sorted(set(body) - set(view.inputs) - {"id", "parameters"})
    if unknown:
        raise invalid_arg(
            f"generate request for model '{model}': unexpected key '{unknown[0]}' (not an "
            f"input of the model; inputs: {', '.join(view.inputs)})"
        )
    tensors = []
    for name, spec in view.inputs.items():
        if name not in body:
            if spec.optional:
                continue
            raise invalid_arg(f"generate request for model '{model}' is missing input '{name}'")
        value = body[name]
        shape = tuple(np.shape(value)) if not isinstance(value, str | bytes) else ()
        shape = shape or (1,)
        if view.max_batch_size > 0:
            shape = (1, *shape)
        flat = value if isinstance(value, list) else [value]
        tensors.append(
            WireTensor(
                name, spec.datatype, shape, json_to_wire(flat, spec.datatype, shape, name, model)
            )
        )
    return tensors


def response_json(model: str, client_id: str, message: InferResponseMessage) -> dict[str, Any]:
    """One response as the generate extension's JSON object."""
    body: dict[str, Any] = {"model_name": model, "model_version": str(message.version)}
    if client_id:
        body["id"] = client_id
    for tensor in message.outputs:
        data = wire_to_json(tensor, model)
        values = data.tolist() if isinstance(data, np.ndarray) else list(data)
        body[tensor.name] = values[0] if len(values) == 1 else values
    return body


async def _responses(
    request: Request, model_name: str, version: int | None
) -> tuple[str, str, AsyncIterator[InferResponseMessage]]:
    """Queue the request; (model, client id, its responses)."""
    body = await _json_object(request, "generate request")
    submission = dataplane(request).submission
    view, resolved = await submission.resolve_for_infer(model_name, version)
    client_id = str(body.get("id", ""))
    raw_parameters = body.get("parameters", {})
    if not isinstance(raw_parameters, dict):
        raise invalid_arg(
            f"generate request for model '{view.name}': 'parameters' must be an object"
        )
    parameters, _ = check_request_parameters(raw_parameters.items(), view.name)
    inputs = generate_inputs(view, body)
    request_id = submission.next_request_id()
    if view.decoupled:
        stream = submission.submit_stream(
            request_id, view, resolved, client_id, inputs, [], parameters
        )
        return view.name, client_id, _skip_empty(stream)
    future = submission.submit(request_id, view, resolved, client_id, inputs, [], parameters)

    async def one() -> AsyncIterator[InferResponseMessage]:
        yield await future

    return view.name, client_id, one()


async def _skip_empty(stream: Any) -> AsyncIterator[InferResponseMessage]:
    try:
        async for message in stream:
            if not message.empty:
                yield message
    finally:
        if not stream.done:
            stream.cancel()  # the client went away


def _raise_error(model: str, message: InferResponseMessage) -> None:
    if message.error is not None:
        raise SluiceError(message.error.code, message.error.message, model=model)


async def generate(request: Request, model_name: str, model_version: int | None = None) -> Response:
    """``/generate``: the model's one response as a JSON object."""
    model, client_id, responses = await _responses(request, model_name, model_version)
    found: list[InferResponseMessage] = []
    async for message in responses:
        _raise_error(model, message)
        found.append(message)
    if len(found) != 1:
        raise SluiceError(
            ErrorCode.INTERNAL if found else ErrorCode.UNAVAILABLE,
            f"model '{model}' sent {len(found)} responses; the generate endpoint returns "
            "exactly one (use generate_stream)",
            model=model,
        )
    return json_response(response_json(model, client_id, found[0]))


async def generate_stream(
    request: Request, model_name: str, model_version: int | None = None
) -> Response:
    """``/generate_stream``: one Server-Sent Event per response."""
    model, client_id, responses = await _responses(request, model_name, model_version)
    iterator = responses.__aiter__()
    try:  # an error before the first response is a plain JSON error
        first = await iterator.__anext__()
        _raise_error(model, first)
    except StopAsyncIteration:
        first = None

    async def events() -> AsyncIterator[bytes]:
        if first is None:
            return
        yield b"data: " + orjson.dumps(response_json(model, client_id, first)) + b"\n\n"
        try:
            async for message in iterator:
                _raise_error(model, message)
                yield b"data: " + orjson.dumps(response_json(model, client_id, message)) + b"\n\n"
        except SluiceError as exc:
            yield b"data: " + orjson.dumps({"error": exc.message}) + b"\n\n"

    return StreamingResponse(events(), media_type=_SSE)


for _suffix, _endpoint in (("generate", generate), ("generate_stream", generate_stream)):
    router.add_api_route(f"/v2/models/{{model_name}}/{_suffix}", _endpoint, methods=["POST"])
    router.add_api_route(
        f"/v2/models/{{model_name}}/versions/{{model_version:int}}/{_suffix}",
        _endpoint,
        methods=["POST"],
    )
