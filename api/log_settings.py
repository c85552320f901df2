"""Triton's logging extension: one process-wide settings object for HTTP and gRPC.

``GET /v2/logging`` / gRPC ``LogSettings`` with an empty map read it; ``POST`` / a
non-empty map update the given keys and answer the whole object
(docs/reference/http-protocol.md, Logging extension; Triton server
``docs/protocol/extension_logging.md``). The six keys and their types are
Triton's: ``log_file`` (string; cannot be changed over the network),
``log_info`` / ``log_warning`` / ``log_error`` (bool), ``log_verbose_level``
(unsigned int), ``log_format`` (``"default"`` or ``"ISO8601"``). The settings drive
this process's log handler (:mod:`broker.logs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sluice.api.parameters import is_uint, value_type_name
from sluice.broker.errors import ErrorCode, SluiceError, invalid_arg
from sluice.broker.logs import LOG_FORMATS, LogOptions, reconfigure

__all__ = ["LOG_FORMATS", "LogSettings"]

_BOOL_KEYS = ("log_info", "log_warning", "log_error")


@dataclass(slots=True)
class LogSettings:
    """The logging settings of this gateway process (Triton's six keys)."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    @classmethod
    def from_options(cls, options: LogOptions) -> LogSettings:
        """The settings object of a process started with ``options``."""
        return cls(
            log_file=options.file,
            log_info=options.info,
            log_warning=options.warning,
            log_error=options.error,
            log_verbose_level=options.verbose,
            log_format=options.format,
        )

    def as_dict(self) -> dict[str, Any]:
        """The settings object a GET answers (key order as Triton's)."""
        return asdict(self)

    def update(self, changes: Mapping[str, object]) -> dict[str, Any]:
        """Check every change first, then apply them all and the logger levels.

        Args:
            changes: keys to change; ``None`` values are skipped (JSON ``null``).

        Returns:
            The whole settings object after the update.

        Raises:
            SluiceError: UNSUPPORTED for a ``log_file`` value; INVALID_ARG for an
                unknown key or a value of the wrong type, naming both. Nothing changes.
        """
        checked: dict[str, object] = {}
        for key, value in changes.items():
            if value is None:
                continue
            if key == "log_file":
                raise SluiceError(
                    ErrorCode.UNSUPPORTED,
                    "log file location can not be updated through network protocol",
                )
            if key in _BOOL_KEYS:
                if not isinstance(value, bool):
                    raise _bad(key, "a boolean", value)
            elif key == "log_verbose_level":
                if not is_uint(value):
                    raise _bad(key, "an unsigned integer", value)
                value = int(value)  # type: ignore[call-overload]
            elif key == "log_format":
                if value not in LOG_FORMATS:
                    raise invalid_arg(
                        f"invalid value for logging setting 'log_format': expected one of "
                        f"{', '.join(repr(f) for f in LOG_FORMATS)}, got {value!r}"
                    )
            else:
                raise invalid_arg(f"unknown logging setting '{key}'")
            checked[key] = value
        for key, value in checked.items():
            setattr(self, key, value)
        self.apply()
        return self.as_dict()

    def options(self) -> LogOptions:
        """These settings as the process-wide :class:`broker.logs.LogOptions`."""
        return LogOptions(
            verbose=self.log_verbose_level,
            info=self.log_info,
            warning=self.log_warning,
            error=self.log_error,
            format=self.log_format,
            file=self.log_file,
        )

    def apply(self) -> None:
        """Make this process's log handler follow the settings (severities, format)."""
        reconfigure(self.options())


def _bad(key: str, expected: str, value: object) -> SluiceError:
    return invalid_arg(
        f"invalid value for logging setting '{key}': expected {expected}, "
        f"got {value_type_name(value)}"
    )
