"""The gateway's ``grpc.aio`` server: options, TLS, start and bounded stop.

Options follow Triton's ``--grpc-*`` flags (server ``src/command_line_parser.cc``,
``src/grpc/grpc_server.cc``): message size INT32_MAX both ways (docs/reference/grpc-protocol.md;
received messages bounded lower by Sluice's ``--grpc-max-input-size``),
keepalive / HTTP2 ping settings, optional TLS (mutual when asked), gzip for
inference responses when a compression level other than ``none`` is set (grpcio
exposes algorithms, not levels, so low/medium/high all mean gzip).
``--grpc-infer-allocation-pool-size`` is accepted and ignored.
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc

from sluice.api.dataplane import DataPlane
from sluice.api.grpc.health import add_health_servicer
from sluice.api.grpc.registration import add_servicer
from sluice.api.grpc.servicer import build_servicer
from sluice.api.settings import GrpcSettings

__all__ = ["GrpcFrontEnd", "server_options"]

logger = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1


class ClientGoneFilter(logging.Filter):
    """Turns grpc.aio's ERROR with a traceback for an answer that cannot be sent (the
    client cancelled the call or its deadline passed, so the call is gone) into one
    verbose line: nothing failed on the server's side, and clients must not be able to
    flood the log with tracebacks. Installed on the ``grpc._cython.cygrpc`` logger."""

    MARK = "ExecuteBatchError raised in core by servicer method"

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and str(record.msg).startswith(self.MARK):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.exc_info, record.exc_text = None, None
            record.msg = f"{record.getMessage()}: the client has gone (cancelled or deadline)"
            record.args = None
        return True


def server_options(settings: GrpcSettings) -> list[tuple[str, int]]:
    """Channel arguments of the server (grpc core names)."""
    return [
        ("grpc.max_send_message_length", INT32_MAX),
        ("grpc.max_receive_message_length", settings.max_input_bytes),
        ("grpc.keepalive_time_ms", settings.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", settings.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(settings.keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", settings.http2_max_pings_without_data),
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            settings.http2_min_recv_ping_interval_without_data_ms,
        ),
        ("grpc.http2.max_ping_strikes", settings.http2_max_ping_strikes),
        ("grpc.so_reuseport", int(settings.reuse_port)),
    ]


def _credentials(settings: GrpcSettings) -> grpc.ServerCredentials:
    """TLS credentials from the PEM files (Triton ``SslOptions``).

    Raises:
        ValueError: a needed file is not named or cannot be read.
    """

    def read(path: str, what: str) -> bytes:
        if not path:
            raise ValueError(f"--grpc-use-ssl needs {what}")
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read {what} '{path}': {exc}") from None

    key = read(settings.server_key, "--grpc-server-key")
    cert = read(settings.server_cert, "--grpc-server-cert")
    root = read(settings.root_cert, "--grpc-root-cert") if settings.root_cert else None
    if settings.use_ssl_mutual and root is None:
        raise ValueError("--grpc-use-ssl-mutual needs --grpc-root-cert")
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=root, require_client_auth=settings.use_ssl_mutual
    )


class GrpcFrontEnd:
    """The gRPC server of one gateway process, sharing its DataPlane with HTTP.

    Args:
        settings: the ``grpc`` section of the gateway settings.
        dataplane: the gateway's DataPlane.
    """

    def __init__(self, settings: GrpcSettings, dataplane: DataPlane) -> None:
        self.settings = settings
        cygrpc_logger = logging.getLogger("grpc._cython.cygrpc")
        if not any(isinstance(f, ClientGoneFilter) for f in cygrpc_logger.filters):
            cygrpc_logger.addFilter(ClientGoneFilter())
        self.server = grpc.aio.server(options=server_options(settings))
        servicer = build_servicer(
            dataplane,
            settings.restricted_protocols,
            compress_infer=settings.infer_response_compression_level != "none",
        )
        add_servicer(servicer, self.server)
        add_health_servicer(dataplane, self.server)
        address = f"{settings.address}:{settings.port}"
        if settings.use_ssl or settings.use_ssl_mutual:
            self.port = self.server.add_secure_port(address, _credentials(settings))
        else:
            self.port = self.server.add_insecure_port(address)
        self.address = address

    async def start(self) -> None:
        """Start serving (returns once the port listens)."""
        await self.server.start()
        logger.info("Started GRPCInferenceService at %s", self.address)

    async def stop(self, grace_s: float = 10.0) -> None:
        """Refuse new calls, let running ones finish for up to ``grace_s``, then cancel."""
        await self.server.stop(grace_s)
