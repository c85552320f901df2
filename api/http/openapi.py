"""The gateway's OpenAPI 3.1 description of its HTTP port, served at ``/openapi.json``.

The paths and path parameters come from the application's own routes (FastAPI's
``get_openapi``), so a route added there is described here; the infer routes, which the
fast path (:mod:`api.http.infer`) answers before routing, are added to them. Bodies and
statuses are Sluice's: every error is Triton's ``{"error": "<message>"}`` with the HTTP
status of its error code (:func:`api.errors.http_status`, after Triton
``src/http_server.cc``); request bodies are read by the handlers, not by FastAPI, so
FastAPI's 422 never happens and is dropped. Endpoints: docs/reference/http-protocol.md.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.requests import Request
from starlette.responses import Response

from sluice.api.http.infer import INFER_PATH
from sluice.api.http.routes import json_response

__all__ = ["OPENAPI_URL", "install_openapi", "openapi_document"]

#: where the gateway serves its description
OPENAPI_URL = "/openapi.json"

Schema = dict[str, Any]

_ERROR: Schema = {
    "type": "object",
    "properties": {"error": {"type": "string"}},
    "required": ["error"],
}
_OBJECT: Schema = {"type": "object"}
_ARRAY: Schema = {"type": "array", "items": {"type": "object"}}
_PARAMETERS: Schema = {"type": "object", "additionalProperties": True}

#: KServe v2 tensor in a JSON request: ``data`` is optional (binary data or shared memory)
_INPUT_TENSOR: Schema = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}},
        "datatype": {"type": "string"},
        "parameters": _PARAMETERS,
        "data": {},
    },
}
_INFER_REQUEST: Schema = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": _PARAMETERS,
        "inputs": {"type": "array", "items": _INPUT_TENSOR},
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}, "parameters": _PARAMETERS},
            },
        },
    },
}
_INFER_RESPONSE: Schema = {
    "type": "object",
    "required": ["model_name", "outputs"],
    "properties": {
        "model_name": {"type": "string"},
        "model_version": {"type": "string"},
        "id": {"type": "string"},
        "parameters": _PARAMETERS,
        "outputs": {"type": "array", "items": {"type": "object"}},
    },
}
_SERVER_METADATA: Schema = {
    "type": "object",
    "required": ["name", "version", "extensions"],
    "properties": {
        "name": {"type": "string"},
        "version": {"type": "string"},
        "extensions": {"type": "array", "items": {"type": "string"}},
    },
}
_MODEL_METADATA: Schema = {
    "type": "object",
    "required": ["name", "versions", "platform", "inputs", "outputs"],
    "properties": {
        "name": {"type": "string"},
        "versions": {"type": "array", "items": {"type": "string"}},
        "platform": {"type": "string"},
        "inputs": {"type": "array", "items": {"type": "object"}},
        "outputs": {"type": "array", "items": {"type": "object"}},
    },
}
_STATISTICS: Schema = {
    "type": "object",
    "required": ["model_stats"],
    "properties": {"model_stats": _ARRAY},
}

#: the error statuses any route may answer (Triton's status of each error code; 403: a
#: restricted API called without its header; 405: a method the path does not take)
_ERRORS = {
    "400": "invalid request (INVALID_ARG, ALREADY_EXISTS, CANCELLED, UNKNOWN)",
    "403": "restricted API called without the header it asks for",
    "404": "unknown model, version, region, job or path (NOT_FOUND)",
    "405": "method not allowed on this path",
    "413": "request body larger than the limit (RESOURCE_EXHAUSTED)",
    "500": "internal error (INTERNAL)",
    "501": "not supported (UNSUPPORTED)",
    "503": "Redis or the model not available (UNAVAILABLE)",
}


def _json(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


def _ok(description: str, content: Schema | None = None, status: str = "200") -> Schema:
    response: Schema = {"description": description}
    if content is not None:
        response["content"] = content
    return {status: response}


_EMPTY = _ok("success, empty body")
_JSON_BODY: Schema = {"required": False, "content": _json(_OBJECT)}
_INFER_BODY: Schema = {
    "required": True,
    "content": {
        "application/json": {"schema": _INFER_REQUEST},
        # the binary tensor data extension: a JSON header of
        # Inference-Header-Content-Length bytes, then the tensors' raw bytes
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
    },
}
_INFER_OK = _ok(
    "the outputs (binary outputs: JSON header, then the raw bytes)",
    {
        "application/json": {"schema": _INFER_RESPONSE},
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
    },
)

#: (method, path) -> what differs from a JSON object answered 200 without a request body
_OPERATIONS: dict[tuple[str, str], Schema] = {
    ("get", "/v2"): {"responses": _ok("server metadata", _json(_SERVER_METADATA))},
    ("get", "/v2/health/live"): {
        "responses": {**_EMPTY, "400": {"description": "not live (stopping); empty body"}}
    },
    ("get", "/v2/health/ready"): {
        "responses": {**_EMPTY, "400": {"description": "not ready; empty body"}}
    },
    ("get", "/v2/models/{model_name}/ready"): {"responses": _EMPTY},
    ("get", "/v2/models/{model_name}/versions/{model_version}/ready"): {"responses": _EMPTY},
    ("get", "/v2/models/{model_name}"): {"responses": _ok("metadata", _json(_MODEL_METADATA))},
    ("get", "/v2/models/{model_name}/versions/{model_version}"): {
        "responses": _ok("metadata", _json(_MODEL_METADATA))
    },
    ("get", "/v2/models/stats"): {"responses": _ok("statistics", _json(_STATISTICS))},
    ("get", "/v2/models/{model_name}/stats"): {"responses": _ok("statistics", _json(_STATISTICS))},
    ("get", "/v2/models/{model_name}/versions/{model_version}/stats"): {
        "responses": _ok("statistics", _json(_STATISTICS))
    },
    ("post", "/v2/repository/index"): {
        "requestBody": _JSON_BODY,
        "responses": _ok("one entry per model (and version)", _json(_ARRAY)),
    },
    ("post", "/v2/repository/{repository_name}/index"): {
        "requestBody": _JSON_BODY,
        "responses": {},  # always 501, as Triton
    },
    ("post", "/v2/repository/models/{model_name}/load"): {
        "requestBody": _JSON_BODY,
        "responses": _EMPTY,
    },
    ("post", "/v2/repository/models/{model_name}/unload"): {
        "requestBody": _JSON_BODY,
        "responses": _EMPTY,
    },
    ("post", "/v2/logging"): {"requestBody": _JSON_BODY},
    ("post", "/v2/trace/setting"): {"requestBody": _JSON_BODY},
    ("post", "/v2/models/{model_name}/trace/setting"): {"requestBody": _JSON_BODY},
    ("post", "/v2/models/{model_name}/jobs"): {
        "requestBody": _INFER_BODY,
        "responses": _ok("accepted; Location names the job", _json(_OBJECT), "202"),
    },
    ("post", "/v2/models/{model_name}/versions/{model_version}/jobs"): {
        "requestBody": _INFER_BODY,
        "responses": _ok("accepted; Location names the job", _json(_OBJECT), "202"),
    },
    ("get", "/v2/jobs/{job_id}"): {"responses": _INFER_OK},
    ("delete", "/v2/jobs/{job_id}"): {"responses": _INFER_OK},
    ("get", "/v2/jobs/{job_id}/output"): {
        "responses": _ok("one JSON line per row", {"application/jsonl": {"schema": {}}})
    },
    ("get", "/v2/jobs/{job_id}/errors"): {
        "responses": _ok("one JSON line per row", {"application/jsonl": {"schema": {}}})
    },
    **{
        ("post", f"/v2/models/{{model_name}}{version}/{suffix}"): {
            "requestBody": {"required": True, "content": _json(_OBJECT)},
            "responses": _ok("the response(s)", content),
        }
        for version in ("", "/versions/{model_version}")
        for suffix, content in (
            ("generate", _json(_OBJECT)),
            ("generate_stream", {"text/event-stream": {"schema": {}}}),
        )
    },
    **{
        (method, f"/v2/{kind}{region}/{action}"): {"responses": responses}
        for kind in ("systemsharedmemory", "cudasharedmemory")
        for region in ("", "/region/{name}")
        for method, action, responses in (
            ("get", "status", _ok("the registered regions", _json(_ARRAY))),
            ("post", "unregister", _EMPTY),
        )
    },
    **{
        ("post", f"/v2/{kind}/region/{{name}}/register"): {
            "requestBody": {"required": True, "content": _json(_OBJECT)},
            "responses": _EMPTY,  # CUDA without a CUDA device: always 400
        }
        for kind in ("systemsharedmemory", "cudasharedmemory")
    },
    ("get", "/dashboard"): {"responses": _ok("status page", {"text/html": {"schema": {}}})},
}

#: the query parameters of GET /v2/jobs (read by the handler, so FastAPI cannot see them)
_JOBS_QUERY = [
    {"name": "model", "in": "query", "required": False, "schema": {"type": "string"}},
    {"name": "state", "in": "query", "required": False, "schema": {"type": "string"}},
    {
        "name": "limit",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
    },
]


def _path_parameter(name: str) -> Schema:
    schema: Schema = (
        {"type": "integer", "minimum": 0} if name == "model_version" else {"type": "string"}
    )
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _infer_paths() -> dict[str, Schema]:
    """The fast path's routes (:data:`api.http.infer.INFER_PATH`)."""
    paths: dict[str, Schema] = {}
    for path, names in (
        ("/v2/models/{model_name}/infer", ["model_name"]),
        ("/v2/models/{model_name}/versions/{model_version}/infer", ["model_name", "model_version"]),
    ):
        example = path.replace("{model_name}", "m").replace("{model_version}", "1")
        assert INFER_PATH.match(example), path
        paths[path] = {
            "post": {
                "summary": "Inference (KServe v2, binary tensor data extension)",
                "operationId": "infer" + ("_version" if "model_version" in names else ""),
                "parameters": [_path_parameter(n) for n in names],
                "requestBody": copy.deepcopy(_INFER_BODY),
                "responses": copy.deepcopy(_INFER_OK),
            }
        }
    return paths


def _describe(method: str, path: str, operation: Schema) -> None:
    """Replace FastAPI's guesses in ``operation`` by what the handler answers."""
    override = _OPERATIONS.get((method, path), {})
    # path converters (``{model_version:int}``) take digits only
    for parameter in operation.get("parameters", []):
        if parameter["in"] == "path":
            parameter["schema"] = _path_parameter(parameter["name"])["schema"]
    if (method, path) == ("get", "/v2/jobs"):
        operation["parameters"] = copy.deepcopy(_JOBS_QUERY)
    if "requestBody" in override:
        operation["requestBody"] = copy.deepcopy(override["requestBody"])
    responses = copy.deepcopy(override.get("responses", _ok("success", _json(_OBJECT))))
    for status, description in _ERRORS.items():
        responses.setdefault(status, {"description": description, "content": _json(_ERROR)})
    operation["responses"] = responses


def openapi_document(app: FastAPI) -> Schema:
    """The OpenAPI 3.1 description of every route ``app`` serves, the fast path's included.

    Returns:
        the document as a JSON-ready dict (``openapi``, ``info``, ``paths``).
    """
    document = get_openapi(title="Sluice", version=app.version, routes=app.routes)
    paths: dict[str, Schema] = document.setdefault("paths", {})
    paths.update(_infer_paths())
    for path, item in paths.items():
        for method, operation in item.items():
            _describe(method, path, operation)
    document.pop("components", None)  # FastAPI's validation error schemas, never answered
    return document


def install_openapi(app: FastAPI) -> None:
    """Serve :func:`openapi_document` of ``app`` at :data:`OPENAPI_URL`, built on the
    first request (so routes mounted after this call, the dashboard's, are in it)."""

    def build() -> Schema:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_document(app)
        return app.openapi_schema

    async def serve(_request: Request) -> Response:
        return json_response(build())

    app.openapi = build  # type: ignore[method-assign]
    app.add_route(OPENAPI_URL, serve, methods=["GET"], include_in_schema=False)
