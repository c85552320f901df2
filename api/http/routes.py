"""Every HTTP route but inference (:mod:`api.http.infer`): health, metadata and config,
statistics, the model repository, logging, shared memory and trace.

Each route converts the request, calls the gateway's handlers (:mod:`api.handlers`,
shared with gRPC) and answers Triton's JSON shapes; errors raised here are answered by
the application's exception handlers (:func:`api.errors.client_error`). Endpoints and
bodies: docs/reference/http-protocol.md; Triton ``src/http_server.cc``.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from sluice.api.dataplane import DataPlane
from sluice.api.handlers.metadata import SHM_DISABLED
from sluice.api.repository_params import load_parameters, unload_dependents
from sluice.broker.errors import ErrorCode, SluiceError, invalid_arg

__all__ = ["dataplane", "empty", "error_response", "json_response", "router"]

router = APIRouter()


def json_response(content: Any, status_code: int = 200) -> Response:
    """A JSON body encoded with orjson (numpy-free, fast)."""
    return Response(orjson.dumps(content), status_code=status_code, media_type="application/json")


def error_response(message: str, status_code: int) -> Response:
    """Triton's error body ``{"error": "<message>"}`` (``EVBufferAddErrorJson``)."""
    return json_response({"error": message}, status_code)


def empty(status_code: int = 200) -> Response:
    """An empty body (health answers, load/unload success)."""
    return Response(b"", status_code=status_code)


def dataplane(request: Request) -> DataPlane:
    """The gateway's :class:`DataPlane`, set on ``app.state`` by ``create_app``."""
    return request.app.state.dataplane


async def _json_object(request: Request, what: str) -> dict[str, Any]:
    """The request's JSON object body (``{}`` when empty).

    Raises:
        SluiceError: INVALID_ARG for a body that is not JSON, or not ``what`` (a JSON
            object).
    """
    body = await request.body()
    if not body.strip():
        return {}
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(data, dict):
        raise invalid_arg(f"{what} must be a JSON object")
    return data


# -- statistics (before /v2/models/{model_name}, which would take /v2/models/stats) ---------


@router.get("/v2/models/stats")
async def all_stats(request: Request) -> Response:
    """Statistics of every READY version of every model."""
    return json_response(await dataplane(request).statistics.model_statistics(None, None))


@router.get("/v2/models/{model_name}/stats")
async def model_stats(request: Request, model_name: str) -> Response:
    """Statistics of every READY version of one model."""
    return json_response(await dataplane(request).statistics.model_statistics(model_name, None))


@router.get("/v2/models/{model_name}/versions/{model_version:int}/stats")
async def version_stats(request: Request, model_name: str, model_version: int) -> Response:
    """Statistics of one version."""
    statistics = dataplane(request).statistics
    return json_response(await statistics.model_statistics(model_name, model_version))


# -- health: 200, or 400 with an empty body ------------------------------------------------


@router.get("/v2/health/live")
async def live(request: Request) -> Response:
    """200 while the gateway serves, also while Redis is down (then only readiness
    fails); 400 once it is stopping."""
    return empty(200 if await dataplane(request).health.server_live() else 400)


@router.get("/v2/health/ready")
async def ready(request: Request) -> Response:
    """200 when start-up is done and every model is READY, else 400."""
    return empty(200 if await dataplane(request).health.server_ready() else 400)


async def _model_ready(request: Request, model_name: str, version: int | None) -> Response:
    try:
        ready = await dataplane(request).health.model_ready(model_name, version)
    except SluiceError:
        # Triton InferenceServer::ModelIsReady answers an unknown, unloaded or loading
        # model with success and ready=false, which http_server.cc HandleModelReady turns
        # into 400 "Model version not ready"
        ready = False
    if ready:
        return empty(200)
    return error_response("Model version not ready", 400)


@router.get("/v2/models/{model_name}/ready")
async def model_ready(request: Request, model_name: str) -> Response:
    """200 when some version of the model is READY with a live instance, else (an
    unknown, unloaded or loading model, or no live instance) 400 "Model version not
    ready", as Triton's HTTP endpoint."""
    return await _model_ready(request, model_name, None)


@router.get("/v2/models/{model_name}/versions/{model_version:int}/ready")
async def model_version_ready(request: Request, model_name: str, model_version: int) -> Response:
    """200 when that version is READY with a live instance, else 400 "Model version not
    ready" (an unknown model or version included), as Triton's HTTP endpoint."""
    return await _model_ready(request, model_name, model_version)


# -- metadata and model configuration ------------------------------------------------------


@router.get("/v2")
async def server_metadata(request: Request) -> Response:
    """``{"name", "version", "extensions"}``."""
    return json_response(dataplane(request).metadata.server_metadata())


@router.get("/v2/models/{model_name}")
async def model_metadata(request: Request, model_name: str) -> Response:
    """Name, READY versions, platform, inputs and outputs with ``[-1] + dims`` when batching."""
    return json_response(await dataplane(request).metadata.model_metadata(model_name, None))


@router.get("/v2/models/{model_name}/versions/{model_version:int}")
async def model_version_metadata(request: Request, model_name: str, model_version: int) -> Response:
    """Metadata of one version."""
    metadata = dataplane(request).metadata
    return json_response(await metadata.model_metadata(model_name, model_version))


@router.get("/v2/models/{model_name}/config")
async def model_config(request: Request, model_name: str) -> Response:
    """The completed config as protobuf JSON with Triton's options."""
    view = await dataplane(request).metadata.model_config(model_name, None)
    return json_response(view.config_json)


@router.get("/v2/models/{model_name}/versions/{model_version:int}/config")
async def model_version_config(request: Request, model_name: str, model_version: int) -> Response:
    """The completed config of one version."""
    view = await dataplane(request).metadata.model_config(model_name, model_version)
    return json_response(view.config_json)


# -- model repository: index, load, unload -------------------------------------------------


def _parameters(body: dict[str, object]) -> dict[str, object]:
    params = body.get("parameters", {})
    if not isinstance(params, dict):
        raise invalid_arg("the 'parameters' member must be a JSON object")
    return params


@router.post("/v2/repository/index")
async def index(request: Request) -> Response:
    """Every model directory; one entry per version for models that ever loaded."""
    body = await _json_object(request, "the request body")
    ready = body.get("ready", False)
    if not isinstance(ready, bool):
        raise invalid_arg("the 'ready' member of a repository index request must be a boolean")
    return json_response(await dataplane(request).repository.repository_index(ready))


@router.post("/v2/repository/{repository_name}/index")
async def named_index(request: Request, repository_name: str) -> Response:
    """Triton answers 501 for a named repository."""
    raise SluiceError(
        ErrorCode.UNSUPPORTED,
        f"'repository_name' specification is not supported: '{repository_name}'",
    )


@router.post("/v2/repository/models/{model_name}/load")
async def load(request: Request, model_name: str) -> Response:
    """Load or reload a model (explicit model control mode only)."""
    params = _parameters(await _json_object(request, "the request body"))
    config_json, files = load_parameters(model_name, params.items(), files_base64=True)
    await dataplane(request).repository.load_model(model_name, config_json, files)
    return empty()


@router.post("/v2/repository/models/{model_name}/unload")
async def unload(request: Request, model_name: str) -> Response:
    """Unload a model (explicit model control mode only)."""
    params = _parameters(await _json_object(request, "the request body"))
    dependents = unload_dependents(model_name, params)
    await dataplane(request).repository.unload_model(model_name, dependents)
    return empty()


# -- logging: GET | POST /v2/logging ------------------------------------------------------


@router.get("/v2/logging")
async def get_logging(request: Request) -> Response:
    """The six log settings of this gateway process."""
    return json_response(dataplane(request).log_settings.as_dict())


@router.post("/v2/logging")
async def update_logging(request: Request) -> Response:
    """Update the given keys; answer the whole settings object."""
    changes = await _json_object(request, "the logging settings")
    return json_response(dataplane(request).log_settings.update(changes))


# -- shared memory: answered, not implemented (api.handlers.metadata) ---------------------


async def shm_status() -> Response:
    """No region is ever registered: an empty list."""
    return json_response([])


async def shm_register() -> Response:
    """Refused: client shared memory is off (501)."""
    raise SluiceError(ErrorCode.UNSUPPORTED, SHM_DISABLED)


async def shm_unregister() -> Response:
    """Nothing to unregister: succeeds with an empty body."""
    return Response(status_code=200)


for _kind in ("systemsharedmemory", "cudasharedmemory"):
    for _prefix in (f"/v2/{_kind}", f"/v2/{_kind}/region/{{name}}"):
        router.add_api_route(f"{_prefix}/status", shm_status, methods=["GET"])
        router.add_api_route(f"{_prefix}/unregister", shm_unregister, methods=["POST"])
    router.add_api_route(f"/v2/{_kind}/region/{{name}}/register", shm_register, methods=["POST"])


@router.get("/v2/trace/setting")
@router.get("/v2/models/{model_name}/trace/setting")
async def get_trace_setting(request: Request, model_name: str | None = None) -> Response:
    """The global or the model's trace settings (api.trace_settings)."""
    dp = dataplane(request)
    return json_response(await dp.tracing.setting(dp.registry, model_name, None))


@router.post("/v2/trace/setting")
@router.post("/v2/models/{model_name}/trace/setting")
async def update_trace_setting(request: Request, model_name: str | None = None) -> Response:
    """Update the given keys (null: clear the model's own value); answer the settings."""
    changes = await _json_object(request, "the trace settings")
    dp = dataplane(request)
    return json_response(await dp.tracing.setting(dp.registry, model_name, changes))
