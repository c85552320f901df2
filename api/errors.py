"""Errors as clients see them: any exception -> Triton's error code and message, and each
code's HTTP status and gRPC status code.

:func:`client_error` is the one rule every front end applies (the FastAPI exception
handlers of :mod:`api.app`, the HTTP inference fast path :mod:`api.http.infer`, the gRPC
guard :mod:`api.grpc.guard`, the metrics endpoint :mod:`api.metrics.server`):

* a ``SluiceError`` keeps its code and message;
* Redis unreachable, silent or full (redis-py's ``ConnectionError`` / ``TimeoutError`` /
  ``OutOfMemoryError``, :data:`~sluice.broker.errors.BROKER_OUTAGE`) is
  UNAVAILABLE ``broker unavailable: <reason>``, counted in the caller's
  :class:`~sluice.broker.outage.OutageLog` (one log line per outage, not per request);
* anything else is INTERNAL ``internal error: <type>: <text>``, logged with its traceback.

The two tables are Triton's: server ``src/http_server.cc`` (``HttpCodeFromError``) and
``src/grpc/grpc_utils.cc`` (``CodeToStatus``); the texts and statuses clients get are
listed in docs/reference/errors.md. The third table keyed by error code, the failure
reason of ``nv_inference_request_failure``, is :data:`sluice.broker.errors.FAILURE_REASON`
(in ``broker``, since model instances count failures too).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from sluice.broker.errors import BROKER_OUTAGE, ErrorCode, SluiceError
from sluice.broker.outage import OutageLog

__all__ = [
    "GRPC_STATUS",
    "HTTP_STATUS",
    "ClientError",
    "client_error",
    "grpc_status",
    "http_status",
]

logger = logging.getLogger(__name__)

HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.ALREADY_EXISTS: 400,
    ErrorCode.CANCELLED: 400,
    ErrorCode.UNKNOWN: 400,
    ErrorCode.TOO_LARGE: 413,
}

GRPC_STATUS: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.UNKNOWN: grpc.StatusCode.UNKNOWN,
    ErrorCode.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def http_status(code: ErrorCode | str) -> int:
    """HTTP status of a Triton error code (unknown names map like UNKNOWN: 400)."""
    try:
        return HTTP_STATUS[ErrorCode(code)]
    except ValueError:
        return 400


def grpc_status(code: ErrorCode | str) -> grpc.StatusCode:
    """gRPC status code of a Triton error code."""
    try:
        return GRPC_STATUS[ErrorCode(code)]
    except ValueError:
        return grpc.StatusCode.UNKNOWN


@dataclass(frozen=True, slots=True)
class ClientError:
    """What a client is told of a failed call: the error code and the message.

    Over HTTP the message is the body's ``{"error": ...}``; over gRPC it is the status
    details (or a stream response's ``error_message``).
    """

    code: ErrorCode
    message: str

    @property
    def http_status(self) -> int:
        """The HTTP status of :attr:`code`."""
        return HTTP_STATUS[self.code]

    @property
    def grpc_status(self) -> grpc.StatusCode:
        """The gRPC status code of :attr:`code`."""
        return GRPC_STATUS[self.code]


def client_error(
    exc: BaseException, outage: OutageLog | None = None, where: str = "a request"
) -> ClientError:
    """The client-facing error of an exception a handler raised.

    Args:
        exc: what the handler raised.
        outage: the caller's Redis outage log; a Redis failure is counted there.
        where: what failed, for the log line of an unexpected error ("a gRPC handler").
    """
    if isinstance(exc, SluiceError):
        return ClientError(exc.code, exc.message)
    if isinstance(exc, BROKER_OUTAGE):
        if outage is not None:
            outage.failed(exc)
        return ClientError(ErrorCode.UNAVAILABLE, f"broker unavailable: {exc}")
    logger.error("unexpected error in %s", where, exc_info=exc)
    return ClientError(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
