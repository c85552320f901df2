"""Health endpoints (PROTOCOL.md 1.3): 200 or 400 with an empty body."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from sluice.api.http.responses import dataplane, empty, error_response
from sluice.broker.errors import SluiceError

router = APIRouter(tags=["health"])


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
