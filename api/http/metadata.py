"""Server and model metadata, model configuration (PROTOCOL.md 1.4–1.6)."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from sluice.api.http.responses import dataplane, json_response

router = APIRouter(tags=["metadata"])


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
    """The completed config as protobuf JSON with Triton's options (PROTOCOL.md 1.6)."""
    view = await dataplane(request).metadata.model_config(model_name, None)
    return json_response(view.config_json)


@router.get("/v2/models/{model_name}/versions/{model_version:int}/config")
async def model_version_config(request: Request, model_name: str, model_version: int) -> Response:
    """The completed config of one version."""
    view = await dataplane(request).metadata.model_config(model_name, model_version)
    return json_response(view.config_json)
