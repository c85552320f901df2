"""python_backend's logger (``pb_utils.Logger``, ``pb_utils.LogLevel``; python_backend
``src/pb_log.cc`` and the README): a model's messages go to Python's ``logging`` module,
under the logger named ``triton_python_backend_utils``."""

from __future__ import annotations

import logging


class LogLevel:
    """python_backend ``pb_utils.LogLevel`` values for :meth:`Logger.log`."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_model_logger = logging.getLogger("triton_python_backend_utils")


class Logger:
    """python_backend ``pb_utils.Logger``: messages go to the ``logging`` module.

    Used as ``pb_utils.Logger.log_info("...")`` (static methods), also through
    an instance.
    """

    _LEVELS: dict[int, int] = {  # noqa: RUF012 - read-only lookup table
        LogLevel.INFO: logging.INFO,
        LogLevel.WARNING: logging.WARNING,
        LogLevel.ERROR: logging.ERROR,
        LogLevel.VERBOSE: logging.DEBUG,
    }

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        """Log ``message`` at a :class:`LogLevel`."""
        _model_logger.log(Logger._LEVELS.get(level, logging.INFO), "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        """Log at INFO."""
        _model_logger.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        """Log at WARNING."""
        _model_logger.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        """Log at ERROR."""
        _model_logger.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        """Log at DEBUG (Triton's verbose level)."""
        _model_logger.debug("%s", message)
