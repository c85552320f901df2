"""The metrics front end: ``GET /metrics`` on its own port (Triton ``--metrics-port``).

Served by a second uvicorn server on the gateway's event loop; other methods on
``/metrics`` answer 405, other paths 404 (docs/reference/metrics.md). A failed exposition
is answered as :func:`api.errors.client_error` maps it (Redis unreachable: 503), as
plain text.
"""

from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from sluice.api.errors import client_error
from sluice.api.metrics.exposition import CONTENT_TYPE
from sluice.api.metrics.service import MetricsService
from sluice.broker.outage import OutageLog

__all__ = ["create_metrics_app"]

logger = logging.getLogger(__name__)
#: one line per Redis outage, not one per failed request
_OUTAGE = OutageLog(logger, "metrics")


def create_metrics_app(service: MetricsService) -> Starlette:
    """The ASGI app that serves ``service``'s exposition at ``/metrics``."""

    async def metrics(_request: Request) -> Response:
        try:
            body = await service.exposition()
        except Exception as exc:
            error = client_error(exc, _OUTAGE, "the metrics endpoint")
            return PlainTextResponse(f"{error.message}\n", status_code=error.http_status)
        return Response(body, media_type=None, headers={"Content-Type": CONTENT_TYPE})

    # Triton answers ``/metrics`` and ``/metrics/`` alike, without a
    # redirect that a scraper may not follow
    return Starlette(
        routes=[
            Route("/metrics", metrics, methods=["GET"]),
            Route("/metrics/", metrics, methods=["GET"]),
        ]
    )
