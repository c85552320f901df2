"""grpc.aio's ERROR for an answer whose client has gone becomes one verbose line."""

from __future__ import annotations

import logging
import sys

from sluice.api.grpc.server import ClientGoneFilter


def _record(level: int, msg: str, args: tuple[object, ...] = ()) -> logging.LogRecord:
    try:
        raise RuntimeError("Failed execute_batch")
    except RuntimeError:
        exc_info = sys.exc_info()
    return logging.LogRecord("grpc._cython.cygrpc", level, __file__, 1, msg, args, exc_info)


def test_client_gone_error_is_demoted_without_traceback() -> None:
    record = _record(
        logging.ERROR, "ExecuteBatchError raised in core by servicer method [%s]",
        ("/inference.GRPCInferenceService/ModelInfer",),
    )  # fmt: skip
    assert ClientGoneFilter().filter(record) is True
    assert (record.levelno, record.levelname) == (logging.DEBUG, "DEBUG")
    assert record.exc_info is None
    assert record.getMessage() == (
        "ExecuteBatchError raised in core by servicer method "
        "[/inference.GRPCInferenceService/ModelInfer]: the client has gone (cancelled or deadline)"
    )


def test_other_grpc_errors_are_left_alone() -> None:
    record = _record(logging.ERROR, "Unexpected error in %s", ("a servicer",))
    assert ClientGoneFilter().filter(record) is True
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert record.getMessage() == "Unexpected error in a servicer"
