"""The one error-code set of Sluice and the exception that carries it.

Codes are Triton's ``TRITONSERVER_Error_Code`` (Triton ``tritonserver.h``); the
HTTP status and gRPC code of each live in ``api/errors.py``. Domain code never
names an HTTP status.
"""

from __future__ import annotations

from enum import StrEnum

import redis.exceptions


class ErrorCode(StrEnum):
    """Triton's error kinds (``TRITONSERVER_Error_Code``), by name."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"


class SluiceError(Exception):
    """An error that travels to the client with a Triton error code.

    Args:
        code: the Triton error kind; decides the HTTP status / gRPC code.
        message: the text the client sees; names the model, tensor and rule.
        model: the model the error is about, if any.
        tensor: the tensor the error is about, if any.
    """

    def __init__(
        self,
        code: ErrorCode | str,
        message: str,
        *,
        model: str | None = None,
        tensor: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message
        self.model = model
        self.tensor = tensor

    def __repr__(self) -> str:
        return f"SluiceError({self.code.value}, {self.message!r})"


def invalid_arg(
    message: str, *, model: str | None = None, tensor: str | None = None
) -> SluiceError:
    """Shorthand for an INVALID_ARG error (HTTP 400, gRPC INVALID_ARGUMENT)."""
    return SluiceError(ErrorCode.INVALID_ARG, message, model=model, tensor=tensor)


def not_found(message: str, *, model: str | None = None) -> SluiceError:
    """Shorthand for a NOT_FOUND error (HTTP 404, gRPC NOT_FOUND)."""
    return SluiceError(ErrorCode.NOT_FOUND, message, model=model)


def unavailable(message: str, *, model: str | None = None) -> SluiceError:
    """Shorthand for an UNAVAILABLE error (HTTP 503, gRPC UNAVAILABLE)."""
    return SluiceError(ErrorCode.UNAVAILABLE, message, model=model)


def stream_gone(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis's answer to a stream read whose consumer group (``NOGROUP``)
    or stream (``UNBLOCKED``: deleted under a blocked read) no longer exists: Redis lost
    its data (FLUSHALL, a restart without it), and the group is to be created again."""
    return isinstance(exc, redis.exceptions.ResponseError) and str(exc).startswith(
        ("NOGROUP", "UNBLOCKED")
    )
