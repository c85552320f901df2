"""Logging extension over HTTP: ``GET|POST /v2/logging`` (PROTOCOL.md 1.11)."""

from __future__ import annotations

import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from sluice.api.http.responses import dataplane, json_response
from sluice.broker.errors import invalid_arg

router = APIRouter(tags=["logging"])


@router.get("/v2/logging")
async def get_logging(request: Request) -> Response:
    """The six log settings of this gateway process."""
    return json_response(dataplane(request).log_settings.as_dict())


@router.post("/v2/logging")
async def update_logging(request: Request) -> Response:
    """Update the given keys; answer the whole settings object."""
    body = await request.body()
    try:
        changes = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(changes, dict):
        raise invalid_arg("the logging settings must be a JSON object")
    return json_response(dataplane(request).log_settings.update(changes))
