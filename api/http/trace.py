"""Trace settings over HTTP (PROTOCOL.md 1.12): refused with :data:`api.trace.TRACE_UNSUPPORTED`
(501), as the gRPC servicer refuses ``TraceSetting``."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from sluice.api.trace import TRACE_UNSUPPORTED
from sluice.broker.errors import ErrorCode, SluiceError

router = APIRouter(tags=["trace"])


async def trace_setting() -> Response:
    """Refused: the trace extension is not implemented (501)."""
    raise SluiceError(ErrorCode.UNSUPPORTED, TRACE_UNSUPPORTED)


for _path in ("/v2/trace/setting", "/v2/models/{model_name}/trace/setting"):
    router.add_api_route(_path, trace_setting, methods=["GET", "POST"])
