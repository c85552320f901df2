"""gpu_workers.main.log_load_failure: one line per failed load, tracebacks where they help."""

from __future__ import annotations

import logging

import pytest

from sluice.gpu_workers.backends.base import ModelCodeError
from sluice.gpu_workers.main import log_load_failure


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "gpu_workers"]


def test_a_config_error_is_one_line_without_a_traceback(caplog) -> None:
    caplog.set_level(logging.INFO, logger="gpu_workers")
    exc = _raised(ValueError("model 'm': parameter 'intra_op_thread_count' must be >= 0, got -7"))
    log_load_failure("m_0_0", "m", exc)
    (record,) = _records(caplog)
    assert record.levelno == logging.ERROR and record.exc_info is None
    assert record.getMessage() == (
        "instance m_0_0 of model 'm' failed to load: model 'm': parameter "
        "'intra_op_thread_count' must be >= 0, got -7"
    )


def test_the_traceback_comes_at_verbose_level(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="gpu_workers")
    log_load_failure("m_0_0", "m", _raised(ValueError("bad")))
    (record,) = _records(caplog)
    assert record.exc_info is not None and record.exc_info[0] is ValueError


def test_the_model_codes_own_exception_keeps_its_traceback(caplog) -> None:
    """A Python model's ``initialize`` raising: the fault is in the user's code."""
    caplog.set_level(logging.INFO, logger="gpu_workers")
    try:
        try:
            {}["weights"]
        except KeyError as inner:
            raise ModelCodeError("KeyError: 'weights'") from inner
    except ModelCodeError as exc:
        log_load_failure("p_0_0", "p", exc)
    (record,) = _records(caplog)
    assert record.getMessage() == "instance p_0_0 of model 'p' failed to load: KeyError: 'weights'"
    # the model's own exception, not the wrapper chained to it
    assert record.exc_info is not None and record.exc_info[0] is KeyError


def test_another_exception_type_is_named(caplog) -> None:
    """A library's own exception type (ORT's InvalidProtobuf derives from Exception) or a
    bare KeyError says what it is."""
    caplog.set_level(logging.INFO, logger="gpu_workers")
    log_load_failure("m_0_0", "m", _raised(KeyError("x")))
    (record,) = _records(caplog)
    assert record.getMessage() == "instance m_0_0 of model 'm' failed to load: KeyError: 'x'"
    assert record.exc_info is None
