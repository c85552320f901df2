"""Error code -> HTTP status and gRPC code: Triton's two tables, in one place.

Sources: Triton server ``src/http_server.cc`` (``HttpCodeFromError``) and
``src/grpc/grpc_utils.cc`` (``CodeToStatus``); PROTOCOL.md 1.14.
"""

from __future__ import annotations

import grpc

from sluice.broker.errors import ErrorCode

HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.ALREADY_EXISTS: 400,
    ErrorCode.CANCELLED: 400,
    ErrorCode.UNKNOWN: 400,
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
