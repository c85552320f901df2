"""The HTTP application factory: routers, lifespan, Triton-shaped errors."""

from __future__ import annotations

import logging

import redis.asyncio
import redis.exceptions
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from sluice.api.access import AccessPolicy
from sluice.api.dataplane import DataPlane
from sluice.api.errors import client_error
from sluice.api.http import health, infer, metadata, repository, shared_memory, stats, trace
from sluice.api.http import logging as logging_routes
from sluice.api.http.access import RestrictedApiMiddleware
from sluice.api.http.responses import error_response
from sluice.api.models import ModelRegistry
from sluice.api.settings import GatewaySettings
from sluice.broker.errors import SluiceError
from sluice.broker.keys import KeySchema
from sluice.broker.model_store import AsyncModelStore
from sluice.broker.multiplex import MultiplexedConnection
from sluice.broker.outage import OutageLog
from sluice.broker.replies import ReplyRouter

logger = logging.getLogger(__name__)
#: one line per Redis outage, not one per failed request
_OUTAGE = OutageLog(logger, "HTTP requests")


def connect(settings: GatewaySettings) -> redis.asyncio.Redis:
    """The gateway's one Redis client (RESP2, bytes replies, bounded calls)."""
    return redis.asyncio.Redis.from_url(
        settings.redis.url,
        protocol=2,
        socket_timeout=settings.redis.socket_timeout_s + 5,
        socket_connect_timeout=settings.redis.socket_timeout_s,
        max_connections=512,
        health_check_interval=30,
    )


def build_dataplane(
    settings: GatewaySettings,
    client: redis.asyncio.Redis,
    registry: ModelRegistry | None = None,
) -> DataPlane:
    """Wire a :class:`DataPlane` for this gateway process (router and connection not
    started); ``registry``: the model views to use instead of those read through
    ``client``."""
    keys = KeySchema(settings.redis.key_prefix)
    if registry is None:
        registry = ModelRegistry(AsyncModelStore(client, keys), settings.model_cache_s)
    router = ReplyRouter(settings.redis.url, keys.reply(settings.gateway_id))
    connection = MultiplexedConnection(settings.redis.url, settings.redis.socket_timeout_s)
    return DataPlane(settings, client, registry, router, connection)


async def _http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    return error_response(str(exc.detail), exc.status_code)


async def _validation_error(_request: Request, exc: Exception) -> Response:
    return error_response(f"invalid request: {exc}", 400)


async def _client_error(_request: Request, exc: Exception) -> Response:
    """A ``SluiceError``, a Redis outage or an unexpected error (:func:`client_error`)."""
    error = client_error(exc, _OUTAGE, "an HTTP request")
    return error_response(error.message, error.http_status)


def create_app(settings: GatewaySettings, dataplane: DataPlane) -> FastAPI:
    """The KServe v2 + Triton HTTP application of one gateway process.

    Args:
        settings: the gateway settings.
        dataplane: the transport-neutral request handling it shares with the gRPC server;
            its reply router must be started by the caller.
    """
    app = FastAPI(title="Sluice", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.settings = settings
    app.state.dataplane = dataplane
    for router in (
        stats.router,  # /v2/models/stats before /v2/models/{name}
        health.router,
        metadata.router,
        repository.router,
        logging_routes.router,
        shared_memory.router,
        trace.router,
    ):
        app.include_router(router)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    # Exception's handler runs in Starlette's ServerErrorMiddleware, which answers and then
    # re-raises (uvicorn logs it); the expected errors are answered without that
    for error in (
        SluiceError,
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
        Exception,
    ):
        app.add_exception_handler(error, _client_error)
    return app


def wrap_asgi(settings: GatewaySettings, dataplane: DataPlane, router_app: FastAPI) -> ASGIApp:
    """What uvicorn serves: access control, then the infer fast path, then ``router_app``."""
    app: ASGIApp = infer.InferEndpoint(router_app, dataplane)
    policy = AccessPolicy(settings.http.restricted_apis)
    if policy:
        app = RestrictedApiMiddleware(app, policy=policy)
    return app
