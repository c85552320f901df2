"""The one error-code set of Sluice and the exception that carries it.

Codes are Triton's ``TRITONSERVER_Error_Code`` (Triton ``tritonserver.h``); the
HTTP status and gRPC code of each live in ``api/errors.py``. Domain code never
names an HTTP status. The metric failure reason of each code is here, since model
instances count failures too.
"""

from __future__ import annotations

from enum import StrEnum

import redis.exceptions


class ErrorCode(StrEnum):
    """Triton's error kinds (``TRITONSERVER_Error_Code``), by name, and Sluice's
    ``TOO_LARGE`` (a request past a size limit: HTTP 413, gRPC RESOURCE_EXHAUSTED, the
    statuses HTTP and gRPC servers use for it)."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"
    TOO_LARGE = "TOO_LARGE"


#: the answer to a request whose queue timeout or deadline passed (Triton's text).
TIMEOUT_TEXT = "Request timeout expired"


class FailureReason(StrEnum):
    """The ``reason`` label of ``nv_inference_request_failure`` (Triton
    ``src/metric_model_reporter.cc``): why a request failed, as counted in statistics."""

    REJECTED = "REJECTED"
    CANCELED = "CANCELED"
    BACKEND = "BACKEND"
    OTHER = "OTHER"


#: Error code of a failed request -> its failure reason label. Triton counts a queue
#: refusal or timeout (UNAVAILABLE) as REJECTED, a cancelled request as CANCELED and an
#: error the backend returned as BACKEND; everything else is OTHER.
FAILURE_REASON: dict[ErrorCode, FailureReason] = {
    ErrorCode.UNAVAILABLE: FailureReason.REJECTED,
    ErrorCode.CANCELLED: FailureReason.CANCELED,
    ErrorCode.INTERNAL: FailureReason.BACKEND,
}


def failure_reason(code: ErrorCode | str) -> FailureReason:
    """The failure reason label of a request that failed with ``code``."""
    try:
        return FAILURE_REASON.get(ErrorCode(code), FailureReason.OTHER)
    except ValueError:
        return FailureReason.OTHER


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


def too_large(size: int | None, limit: int, what: str = "request body") -> SluiceError:
    """A TOO_LARGE error (HTTP 413) for a ``what`` of ``size`` bytes (None: not known
    yet, the bytes read so far passed it) past ``limit`` bytes; the text names the limit
    and the flag that sets it."""
    of = "" if size is None else f" of {size} bytes"
    return SluiceError(
        ErrorCode.TOO_LARGE,
        f"{what}{of} exceeds the limit of {limit} bytes (--http-max-input-size)",
    )


def not_found(message: str, *, model: str | None = None) -> SluiceError:
    """Shorthand for a NOT_FOUND error (HTTP 404, gRPC NOT_FOUND)."""
    return SluiceError(ErrorCode.NOT_FOUND, message, model=model)


#: What a Redis that cannot take a command raises: unreachable or silent (the connection
#: errors), or full (``OOM``: ``maxmemory`` reached under the ``noeviction`` policy, so it
#: refuses every command that needs memory until some is freed). Callers treat all three
#: as an outage: they keep what they could not write and try again, and refuse requests
#: with UNAVAILABLE meanwhile.
BROKER_OUTAGE: tuple[type[redis.exceptions.RedisError], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.OutOfMemoryError,
)


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
