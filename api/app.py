"""The HTTP application of a gateway process, and the wiring it shares with gRPC.

:func:`connect` and :func:`build_dataplane` make the Redis client and the
:class:`DataPlane`; :func:`create_app` the FastAPI application of every route but
inference (:mod:`api.http.routes`) with Triton-shaped errors (:func:`client_error`);
:func:`wrap_asgi` what uvicorn serves: access control, then the inference fast path
(:mod:`api.http.infer`), then the application.
"""

from __future__ import annotations

import logging

import redis.asyncio
import redis.exceptions
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from sluice.api.access import AccessPolicy, http_group
from sluice.api.dataplane import DataPlane
from sluice.api.errors import client_error
from sluice.api.http.generate import router as generate_router
from sluice.api.http.infer import InferEndpoint
from sluice.api.http.jobs import router as jobs_router
from sluice.api.http.openapi import install_openapi
from sluice.api.http.routes import error_response, router
from sluice.api.http.shm_routes import router as shm_router
from sluice.api.models import ModelRegistry
from sluice.api.settings import GatewaySettings
from sluice.broker.cluster import async_client
from sluice.broker.cluster_multiplex import connect_multiplexed
from sluice.broker.errors import SluiceError
from sluice.broker.keys import KeySchema
from sluice.broker.model_store import AsyncModelStore
from sluice.broker.outage import OutageLog
from sluice.broker.replies import ReplyRouter

logger = logging.getLogger(__name__)
#: one line per Redis outage, not one per failed request
_OUTAGE = OutageLog(logger, "HTTP requests")


def connect(settings: GatewaySettings) -> redis.asyncio.Redis:
    """The gateway's one Redis client (RESP2, bytes replies, bounded calls)."""
    return async_client(
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
    connection = connect_multiplexed(settings.redis.url, settings.redis.socket_timeout_s)
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
    app.include_router(router)
    app.include_router(jobs_router)
    app.include_router(shm_router)
    app.include_router(generate_router)
    install_openapi(app)
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
    """What uvicorn serves: access control, then the infer fast path, then ``router_app``;
    while the ``inference`` group is open, the infer fast path comes first (its routes
    need no header, and the task-free path of :mod:`api.http.protocol` applies only to an
    :class:`InferEndpoint` served directly), then access control, then ``router_app``."""
    policy = AccessPolicy(settings.http.restricted_apis)
    if not policy:
        return InferEndpoint(router_app, dataplane)
    if policy.restricts("inference"):
        return RestrictedApiMiddleware(InferEndpoint(router_app, dataplane), policy=policy)
    return InferEndpoint(RestrictedApiMiddleware(router_app, policy=policy), dataplane)


class RestrictedApiMiddleware:
    """HTTP endpoint access control (Triton ``--http-restricted-api``): a call to a
    restricted API group without the right header is refused (403) before routing, so it
    does nothing; the groups and headers are :mod:`api.access`'s.

    Args:
        app: the wrapped application.
        policy: the groups and the header each asks for (header prefix ``""``).
    """

    def __init__(self, app: ASGIApp, policy: AccessPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            group = http_group(scope["method"], scope["path"])
            if group is not None:
                headers = {
                    k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
                }
                header = self.policy.missing_header(group, headers)
                if header is not None:
                    response = error_response(
                        f"This API is restricted, expecting header '{header}'", 403
                    )
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)
