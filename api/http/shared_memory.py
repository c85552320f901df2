"""Shared-memory endpoints over HTTP (PROTOCOL.md 1.10), answered as the gRPC servicer
does (:mod:`api.shared_memory`): ``/v2/systemsharedmemory`` and
``/v2/cudasharedmemory``, each with ``[/region/{name}]/status``,
``/region/{name}/register`` and ``[/region/{name}]/unregister``."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from sluice.api.http.responses import json_response
from sluice.api.shared_memory import SHM_DISABLED
from sluice.broker.errors import ErrorCode, SluiceError

router = APIRouter(tags=["shared memory"])


async def status() -> Response:
    """No region is ever registered: an empty list."""
    return json_response([])


async def register() -> Response:
    """Refused: client shared memory is off (501)."""
    raise SluiceError(ErrorCode.UNSUPPORTED, SHM_DISABLED)


async def unregister() -> Response:
    """Nothing to unregister: succeeds with an empty body."""
    return Response(status_code=200)


for _kind in ("systemsharedmemory", "cudasharedmemory"):
    for _prefix in (f"/v2/{_kind}", f"/v2/{_kind}/region/{{name}}"):
        router.add_api_route(f"{_prefix}/status", status, methods=["GET"])
        router.add_api_route(f"{_prefix}/unregister", unregister, methods=["POST"])
    router.add_api_route(f"/v2/{_kind}/region/{{name}}/register", register, methods=["POST"])
