"""api.errors.client_error: the one exception -> client-facing error rule of every front end."""

from __future__ import annotations

import logging

import grpc
import pytest
import redis.exceptions

from sluice.api.errors import client_error
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.outage import OutageLog


def test_a_sluice_error_keeps_its_code_and_message() -> None:
    error = client_error(SluiceError(ErrorCode.NOT_FOUND, "no model 'm'"))
    assert (error.code, error.message) == (ErrorCode.NOT_FOUND, "no model 'm'")
    assert (error.http_status, error.grpc_status) == (404, grpc.StatusCode.NOT_FOUND)


@pytest.mark.parametrize(
    "exc", [redis.exceptions.ConnectionError("refused"), redis.exceptions.TimeoutError("refused")]
)
def test_redis_unreachable_is_broker_unavailable_and_counted(exc: Exception) -> None:
    outage = OutageLog(logging.getLogger("test"), "requests")
    error = client_error(exc, outage)
    assert (error.code, error.message) == (ErrorCode.UNAVAILABLE, "broker unavailable: refused")
    assert (error.http_status, error.grpc_status) == (503, grpc.StatusCode.UNAVAILABLE)
    assert outage.down


def test_anything_else_is_internal_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    error = client_error(ValueError("boom"), where="a test")
    assert (error.code, error.message) == (ErrorCode.INTERNAL, "internal error: ValueError: boom")
    assert (error.http_status, error.grpc_status) == (500, grpc.StatusCode.INTERNAL)
    assert "unexpected error in a test" in caplog.text
