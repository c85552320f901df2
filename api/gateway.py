"""Gateway process entry (``sluice gateway`` / ``python -m sluice.api.gateway``).

Stateless: serves the HTTP front end from what Redis holds. Any number of
gateways may run against one Redis; each has its own reply key.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING

import redis.exceptions
import uvicorn
import uvloop

from sluice.api.app import build_dataplane, connect, create_app, wrap_asgi
from sluice.api.dashboard.history import DashboardHistory
from sluice.api.dashboard.routes import mount_dashboard
from sluice.api.dataplane import DataPlane
from sluice.api.gateway_args import add_gateway_arguments, check_access_specs, settings_from_args
from sluice.api.http.protocol import HttpProtocol
from sluice.api.metrics import MetricsService, create_metrics_app
from sluice.api.settings import GatewaySettings
from sluice.broker.clock import check_clock_async
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.keys import KeySchema
from sluice.broker.logs import configure_logging
from sluice.broker.tracing import shutdown_tracers

if TYPE_CHECKING:
    from sluice.api.grpc.server import GrpcFrontEnd

logger = logging.getLogger(__name__)


def _route_uvicorn_logs(verbose: int) -> None:
    """Send uvicorn's lines through the one handler of ``broker.logs`` (Triton's format,
    ``--log-file``) rather than uvicorn's own stdout/stderr handlers; one access line per
    HTTP request from ``--log-verbose 1`` (Triton logs each HTTP request at verbose 1).

    Call after the ``uvicorn.Config`` objects are built (each one sets the levels of the
    shared ``uvicorn.*`` loggers, and one with ``access_log=False`` cuts the access
    logger off).
    """
    access = logging.getLogger("uvicorn.access")
    access.handlers = []
    access.propagate = verbose > 0
    access.setLevel(logging.INFO)
    error = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _ExitTimeoutNotice) for f in error.filters):
        error.addFilter(_ExitTimeoutNotice())


class _ExitTimeoutNotice(logging.Filter):
    """uvicorn logs ERROR when ``--exit-timeout-secs`` runs out with requests still in
    flight; that is the flag doing its job (they are answered 503), so a WARNING that
    says so."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Cancel %s running task(s), timeout graceful shutdown"):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = "exit timeout reached: HTTP requests still in flight are answered 503"
            record.args = None
        return True


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket with ``SO_REUSEPORT``: the kernel spreads connections over every
    gateway process listening on the same port (``sluice serve --gateway-processes N``).

    Raises:
        OSError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _shared_listeners(
    settings: GatewaySettings,
) -> tuple[list[socket.socket] | None, list[socket.socket] | None]:
    """The HTTP and metrics sockets gateways share with ``SO_REUSEPORT``
    (``--gateway-processes`` > 1); None each where uvicorn binds its own.

    Raises:
        SystemExit: 1, after one error line, when a port cannot be bound.
    """
    if not settings.reuse_port:
        return None, None
    listeners = [("HTTP", settings.http.address, settings.http.port)]
    if settings.metrics.enabled:
        address = settings.metrics.address or settings.http.address
        listeners.append(("metrics", address, settings.metrics.port))
    bound: list[socket.socket] = []
    for what, address, port in listeners:
        try:
            bound.append(reuse_port_socket(address, port))
        except OSError as exc:
            for sock in bound:
                sock.close()
            logger.error("cannot listen on the %s port %s:%d: %s", what, address, port, exc)
            raise SystemExit(1) from None
    return [bound[0]], bound[1:] or None


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the gateway stops every front end at once."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


async def serve_gateway(settings: GatewaySettings) -> None:
    """Serve every front end of one gateway process until SIGINT/SIGTERM.

    HTTP (with ``/dashboard``), gRPC and the metrics endpoint run on this one event
    loop; HTTP and gRPC share one :class:`DataPlane`.
    Shutdown is bounded: uvicorn's ``timeout_graceful_shutdown`` and the gRPC server's
    grace (both ``exit_timeout_s``, Triton ``--exit-timeout-secs``) run together, then
    the reply router fails whatever still waits with UNAVAILABLE and this gateway's
    requests still queued are taken off their streams (their clients were answered).
    """
    from sluice.api.grpc.server import GrpcFrontEnd  # grpc.aio only in the gateway process

    check_access_specs(settings)  # a bad spec fails start-up, naming it
    http_sockets, metrics_sockets = _shared_listeners(settings)  # before anything starts
    client = connect(settings)
    dataplane = build_dataplane(settings, client)
    grpc_front: GrpcFrontEnd | None = None
    if settings.grpc.enabled:
        grpc_settings = settings.grpc.model_copy(update={"reuse_port": settings.reuse_port})
        grpc_front = GrpcFrontEnd(grpc_settings, dataplane)
    keys = KeySchema(settings.redis.key_prefix)
    history = DashboardHistory(client, keys, keep_s=settings.dashboard_history_s)
    app = create_app(settings, dataplane)
    mount_dashboard(app, history)
    metrics_server: _Server | None = None
    metrics: MetricsService | None = None
    if settings.metrics.enabled:
        metrics = MetricsService(
            settings.metrics, client, keys, cache_size_bytes=settings.cache_size_bytes
        )
        metrics_server = _Server(
            uvicorn.Config(
                create_metrics_app(metrics),
                host=settings.metrics.address or settings.http.address,
                port=settings.metrics.port,
                loop="none",
                http="httptools",
                lifespan="off",
                access_log=False,
                log_config=None,  # through Sluice's handler (_route_uvicorn_logs)
                log_level="warning",
                timeout_graceful_shutdown=2,
                server_header=False,
                date_header=False,
            )
        )
    await dataplane.connection.start()
    await check_clock_async(client, logger)
    await dataplane.router.start()
    if grpc_front is not None:
        await grpc_front.start()
    await history.start()
    if metrics is not None:
        await metrics.start()
    config = uvicorn.Config(
        wrap_asgi(settings, dataplane, app),
        host=settings.http.address,
        port=settings.http.port,
        loop="none",
        http=functools.partial(HttpProtocol, read_timeout_s=settings.http.read_timeout_s),
        lifespan="off",
        access_log=settings.log_verbose > 0,
        proxy_headers=False,
        log_config=None,
        # uvicorn warns of each malformed request: client-caused, so only from level 1 on
        log_level={0: "error", 1: "warning"}.get(settings.log_verbose, "debug"),
        timeout_graceful_shutdown=max(1, round(settings.exit_timeout_s)),
        server_header=False,
        date_header=False,
    )
    _route_uvicorn_logs(settings.log_verbose)
    http_server = _Server(config)
    stopped = asyncio.Event()
    stop_began: list[float] = []  # monotonic time of the first stop signal
    releasing: list[asyncio.Future[None]] = []

    def stop() -> None:
        if not stopped.is_set():
            releasing.append(asyncio.ensure_future(_release_unanswerable(dataplane)))
            if dataplane.router.waiting:
                logger.info(
                    "exiting: waiting up to %.0f s for %d request(s) in flight",
                    settings.exit_timeout_s,
                    dataplane.router.waiting,
                )
        dataplane.begin_shutdown()
        http_server.should_exit = True
        if metrics_server is not None:
            metrics_server.should_exit = True
        stopped.set()
        if not stop_began:
            stop_began.append(time.monotonic())

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)
    try:
        if metrics_server is not None:
            # every gateway reports the same values (read from Redis), so gateways that
            # share the HTTP port share the metrics port too
            await asyncio.gather(
                http_server.serve(sockets=http_sockets),
                metrics_server.serve(sockets=metrics_sockets),
            )
        else:
            await http_server.serve(sockets=http_sockets)
    finally:
        for task in releasing:
            task.cancel()
        if metrics is not None:
            await metrics.stop()
        await history.stop()
        if grpc_front is not None:
            await _stop_grpc(grpc_front, dataplane, stop_began, settings.exit_timeout_s)
        await dataplane.router.stop()
        try:
            dropped = await dataplane.queue.drop_unanswered()
            if dropped:
                logger.info("took %d unanswered request(s) off the queues at exit", dropped)
        except redis.exceptions.RedisError as exc:
            logger.warning("could not take unanswered requests off the queues: %s", exc)
        await dataplane.connection.stop()
        await client.aclose()
        dataplane.tracing.close()  # the trace file's pending traces; spans still batched:
        shutdown_tracers()


#: the gRPC server's grace once nothing is in flight any more, in s.
GRPC_FINAL_GRACE_S = 0.5


async def _stop_grpc(
    front: GrpcFrontEnd, dataplane: DataPlane, stop_began: list[float], exit_timeout_s: float
) -> None:
    """Stop the gRPC server once the requests in flight are answered, within the exit
    timeout counted from the stop signal.

    Until then it keeps taking calls and new inference calls get UNAVAILABLE "Server is
    shutting down" (:meth:`DataPlane.begin_shutdown`), as HTTP answers 503 on open
    connections. grpcio's ``stop`` makes the core refuse new calls, and those reach
    the client as CANCELLED, not as a status that says the server is exiting: stopped
    at the signal, the server would end many calls of busy clients that way. Calls that
    arrive in the final grace still do.
    """
    deadline = (stop_began[0] if stop_began else time.monotonic()) + exit_timeout_s
    while dataplane.router.waiting and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await front.stop(max(GRPC_FINAL_GRACE_S, deadline - time.monotonic()))


#: how often a stopping gateway checks whether any model instance is still live, in s.
RELEASE_CHECK_S = 0.5
#: checks in a row that find Redis unreachable (or silent for a check's interval) after
#: which a stopping gateway answers the requests still waiting.
RELEASE_UNREACHABLE_CHECKS = 3


async def _release_unanswerable(dataplane: DataPlane) -> None:
    """While the gateway stops: once no model instance of the deployment is live (they
    drained and exited, as in ``sluice serve``'s shutdown), answer the requests still
    waiting with 503 / UNAVAILABLE at once instead of holding the exit up to
    ``--exit-timeout-secs`` for answers nothing can give (lost, e.g., by a Redis that
    restarted without its data). The same once Redis stayed unreachable for
    :data:`RELEASE_UNREACHABLE_CHECKS` checks (the private Redis died just before the
    stop: ``sluice serve`` does not start it again while stopping)."""
    unreachable = 0
    while True:
        await asyncio.sleep(RELEASE_CHECK_S)
        if not dataplane.router.waiting:
            continue
        try:
            if await asyncio.wait_for(dataplane.health.any_instance_live(), RELEASE_CHECK_S):
                unreachable = 0
                continue
        except (redis.exceptions.RedisError, TimeoutError):
            # answers travel through Redis: while it is unreachable none can come, and
            # the instances stop without it too
            unreachable += 1
            if unreachable < RELEASE_UNREACHABLE_CHECKS:
                continue
        failed = dataplane.router.fail_waiting(
            SluiceError(
                ErrorCode.UNAVAILABLE,
                "Server exiting: no model instance is left to answer this request"
                + (" (Redis unreachable)" if unreachable else ""),
            )
        )
        if failed:
            logger.warning(
                "exiting: %d request(s) still waited for an answer and no model instance "
                "is left to give one (stopped at the exit timeout, or the request was lost "
                "with Redis); answered 503 / UNAVAILABLE",
                failed,
            )


def run_gateway(settings: GatewaySettings) -> None:
    """Run :func:`serve_gateway` on uvloop."""
    configure_logging("gateway", settings.log_options())
    uvloop.run(serve_gateway(settings))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sluice gateway", description=__doc__)
    add_gateway_arguments(parser)
    run_gateway(settings_from_args(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
