"""Logging set-up shared by every Sluice process (gateway, worker, supervisor).

Triton's flags decide what is written: ``--log-verbose`` (level ≥ 1 adds DEBUG lines),
``--log-info``, ``--log-warning``, ``--log-error`` (each severity on or off on its own),
``--log-format`` (``default``: ``I0715 12:34:56.789012 <pid> <process> <logger>] msg``;
``ISO8601``: ``2024-07-15T12:34:56Z I <pid> <process> <logger>] msg``, Triton's two
layouts with the process and logger name in place of ``file.cc:line``) and ``--log-file``
(append to a file instead of standard error).

``sluice serve`` hands its flags to every child through the environment
(:meth:`LogOptions.to_env`, read back by :meth:`LogOptions.from_env`), so a
gateway and its workers log alike. Standard library only.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

__all__ = ["LOG_FORMATS", "LogOptions", "configure_logging", "reconfigure"]

LOG_FORMATS = ("default", "ISO8601")
#: third-party loggers whose info and debug lines are not Sluice's news.
_LIBRARY_LOGGERS = ("grpc", "redis", "asyncio", "celery", "kombu")
_ENV = {
    "verbose": "SLUICE_LOG_VERBOSE",
    "info": "SLUICE_LOG_INFO",
    "warning": "SLUICE_LOG_WARNING",
    "error": "SLUICE_LOG_ERROR",
    "format": "SLUICE_LOG_FORMAT",
    "file": "SLUICE_LOG_FILE",
}
_LETTER = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E"}


def _flag(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class LogOptions:
    """What a process logs and how (Triton's six logging settings).

    Attributes:
        verbose: Triton ``--log-verbose`` level; > 0 writes DEBUG lines.
        info: write INFO lines.
        warning: write WARNING lines.
        error: write ERROR and CRITICAL lines.
        format: ``default`` or ``ISO8601``.
        file: append to this file; empty = standard error.
    """

    verbose: int = 0
    info: bool = True
    warning: bool = True
    error: bool = True
    format: str = "default"
    file: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> LogOptions:
        """Options from ``SLUICE_LOG_*`` variables, then ``overrides`` (None = not given)."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for name, var in _ENV.items():
            if var not in env:
                continue
            raw = env[var]
            if name == "verbose":
                values[name] = int(raw or 0)
            elif name in ("info", "warning", "error"):
                values[name] = _flag(raw)
            else:
                values[name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        options = cls(**values)  # type: ignore[arg-type]
        if options.format not in LOG_FORMATS:
            raise ValueError(f"--log-format must be one of {', '.join(LOG_FORMATS)}")
        return options

    def to_env(self) -> dict[str, str]:
        """The ``SLUICE_LOG_*`` variables that make a child process log like this one."""
        return {
            _ENV["verbose"]: str(self.verbose),
            _ENV["info"]: "true" if self.info else "false",
            _ENV["warning"]: "true" if self.warning else "false",
            _ENV["error"]: "true" if self.error else "false",
            _ENV["format"]: self.format,
            _ENV["file"]: self.file,
        }

    def allows(self, levelno: int) -> bool:
        """Whether a record of ``levelno`` is written."""
        if levelno >= logging.ERROR:
            return self.error
        if levelno >= logging.WARNING:
            return self.warning
        if levelno >= logging.INFO:
            return self.info
        return self.verbose > 0


class TritonFormatter(logging.Formatter):
    """Triton's line layouts (``default`` = glog style, ``ISO8601``)."""

    def __init__(self, process: str, iso8601: bool) -> None:
        super().__init__()
        self.process = process
        self.iso8601 = iso8601

    def format(self, record: logging.LogRecord) -> str:
        letter = _LETTER.get(record.levelno, "E" if record.levelno > logging.ERROR else "I")
        where = f"{record.process} {self.process} {record.name}]"
        if self.iso8601:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            line = f"{stamp} {letter} {where} {record.getMessage()}"
        else:
            local = time.localtime(record.created)
            micros = int((record.created % 1) * 1_000_000)
            line = (
                f"{letter}{time.strftime('%m%d %H:%M:%S', local)}.{micros:06d} "
                f"{where} {record.getMessage()}"
            )
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _SeverityFilter(logging.Filter):
    """Lets through the severities the current :class:`LogOptions` switch on."""

    def __init__(self, options: LogOptions) -> None:
        super().__init__()
        self.options = options

    def filter(self, record: logging.LogRecord) -> bool:
        return self.options.allows(record.levelno)


class _State:
    handler: logging.Handler | None = None
    filter: _SeverityFilter | None = None
    process: str = "sluice"


def configure_logging(process: str, options: LogOptions) -> None:
    """Install this process's one log handler on the root logger (replacing any).

    Args:
        process: the process's name in each line (``gateway``, ``worker <instance>``, …).
        options: what to write and where.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler: logging.Handler
    if options.file:
        handler = logging.FileHandler(options.file, mode="a", encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    _State.handler = handler
    _State.filter = _SeverityFilter(options)
    _State.process = process
    handler.addFilter(_State.filter)
    root.addHandler(handler)
    reconfigure(options)


def reconfigure(options: LogOptions) -> None:
    """Apply changed severities / format at run time (Triton's logging extension).

    The log file stays what it was at start-up (Triton: not changeable over the network).
    """
    if _State.handler is None:
        configure_logging(_State.process, replace(options, file=""))
        return
    assert _State.filter is not None
    _State.filter.options = options
    _State.handler.setFormatter(TritonFormatter(_State.process, options.format == "ISO8601"))
    logging.getLogger().setLevel(logging.DEBUG if options.verbose > 0 else logging.INFO)
    # libraries' own chatter (grpcio: a line per call at debug; redis-py: an info line when
    # the server lacks a client feature) only from verbose level 2 on; warnings always
    library_level = logging.NOTSET if options.verbose >= 2 else logging.WARNING
    for name in _LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(library_level)
