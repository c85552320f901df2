"""Statistics extension (PROTOCOL.md 1.9); registered before the model metadata routes."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from sluice.api.http.responses import dataplane, json_response

router = APIRouter(tags=["statistics"])


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
