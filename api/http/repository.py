"""Model repository extension: index, load, unload (PROTOCOL.md 1.8)."""

from __future__ import annotations

import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from sluice.api.http.responses import dataplane, empty, json_response
from sluice.api.repository_params import load_parameters, unload_dependents
from sluice.broker.errors import ErrorCode, SluiceError, invalid_arg

router = APIRouter(tags=["model repository"])


async def _json_body(request: Request) -> dict[str, object]:
    body = await request.body()
    if not body.strip():
        return {}
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(data, dict):
        raise invalid_arg("the request body must be a JSON object")
    return data


def _refuse_named_repository(repository_name: str) -> None:
    raise SluiceError(
        ErrorCode.UNSUPPORTED,
        f"'repository_name' specification is not supported: '{repository_name}'",
    )


@router.post("/v2/repository/index")
async def index(request: Request) -> Response:
    """Every model directory; one entry per version for models that ever loaded."""
    body = await _json_body(request)
    ready = body.get("ready", False)
    if not isinstance(ready, bool):
        raise invalid_arg("the 'ready' member of a repository index request must be a boolean")
    return json_response(await dataplane(request).repository.repository_index(ready))


@router.post("/v2/repository/{repository_name}/index")
async def named_index(request: Request, repository_name: str) -> Response:
    """Triton answers 501 for a named repository."""
    _refuse_named_repository(repository_name)
    return empty()


@router.post("/v2/repository/models/{model_name}/load")
async def load(request: Request, model_name: str) -> Response:
    """Load or reload a model (explicit model control mode only)."""
    params = _parameters(await _json_body(request))
    config_json, files = load_parameters(model_name, params.items(), files_base64=True)
    await dataplane(request).repository.load_model(model_name, config_json, files)
    return empty()


@router.post("/v2/repository/models/{model_name}/unload")
async def unload(request: Request, model_name: str) -> Response:
    """Unload a model (explicit model control mode only)."""
    params = _parameters(await _json_body(request))
    dependents = unload_dependents(model_name, params)
    await dataplane(request).repository.unload_model(model_name, dependents)
    return empty()


def _parameters(body: dict[str, object]) -> dict[str, object]:
    params = body.get("parameters", {})
    if not isinstance(params, dict):
        raise invalid_arg("the 'parameters' member must be a JSON object")
    return params
