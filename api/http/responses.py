"""Response helpers shared by the HTTP routers (Triton's JSON shapes)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from sluice.api.dataplane import DataPlane


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
