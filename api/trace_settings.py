"""Triton's trace extension: the trace settings of one gateway process, and sampling.

``GET /v2[/models/{m}]/trace/setting`` and gRPC ``TraceSetting`` with an empty map read
them; ``POST`` / a non-empty map update the given keys and answer the whole object
(docs/user-guide/tracing.md; Triton ``docs/protocol/extension_trace.md``). The keys and
their JSON forms are Triton's: ``trace_level`` (array of ``OFF`` / ``TIMESTAMPS`` /
``TENSORS``), ``trace_rate``, ``trace_count``, ``log_frequency`` (strings holding
integers), ``trace_file`` and ``trace_mode`` (strings, read only at run time).

A model's settings hold only what was set for that model; every other key follows the
global settings, also when those change later (as Triton). A ``null`` value clears the
model's own value of that key; a ``POST`` to a model with an empty object clears all of
them. Each settings object (the global one, each model with settings of its own) counts
its own requests for ``trace_rate`` and its own remaining ``trace_count``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.api.settings import TRACE_LEVELS, TraceConfig
from sluice.broker.errors import ErrorCode, SluiceError, invalid_arg

__all__ = ["TraceSettings"]

#: settable key -> _Sampler attribute
_ATTRIBUTES = {
    "trace_level": "level",
    "trace_rate": "rate",
    "trace_count": "count",
    "log_frequency": "log_frequency",
}
_KEYS = ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency", "trace_mode")


@dataclass(slots=True)
class _Sampler:
    """One settings object's own values (None: follow the global settings) and counters."""

    level: list[str] | None = None
    rate: int | None = None
    count: int | None = None
    log_frequency: int | None = None
    seen: int = 0
    #: traces still to collect (-1: no limit); set from the effective count on update
    remaining: int = -1
    lock: threading.Lock = field(default_factory=threading.Lock)


class TraceSettings:
    """The trace settings of this gateway process, global and per model.

    Args:
        config: the start-up settings (``--trace-config``).
    """

    def __init__(self, config: TraceConfig) -> None:
        self.config = config
        self._global = _Sampler(
            level=_normalize_levels(config.level),
            rate=config.rate,
            count=config.count,
            log_frequency=config.log_frequency,
            remaining=config.count,
        )
        self._models: dict[str, _Sampler] = {}
        #: whether any settings object traces (level not OFF): False keeps every request
        #: off the tracing code (the HTTP task-free path stays as it is)
        self.active = self._any_active()

    @property
    def mode(self) -> str:
        """``triton`` or ``opentelemetry`` (fixed at start-up)."""
        return self.config.mode

    @property
    def log_frequency(self) -> int:
        """The global ``log_frequency`` (the trace file's)."""
        return self._global.log_frequency or 0

    def _effective(self, sampler: _Sampler) -> _Sampler:
        g = self._global
        return _Sampler(
            level=sampler.level if sampler.level is not None else g.level,
            rate=sampler.rate if sampler.rate is not None else g.rate,
            count=sampler.count if sampler.count is not None else g.count,
            log_frequency=(
                sampler.log_frequency if sampler.log_frequency is not None else g.log_frequency
            ),
        )

    def _any_active(self) -> bool:
        samplers = [self._global, *self._models.values()]
        return any(self._effective(s).level != ["OFF"] for s in samplers)

    def as_dict(self, model: str | None = None) -> dict[str, Any]:
        """The settings object a GET answers (global, or the model's), Triton's keys."""
        sampler = self._models.get(model, self._global) if model else self._global
        values = self._effective(sampler)
        return {
            "trace_file": self.config.file,
            "trace_level": list(values.level or ["OFF"]),
            "trace_rate": str(values.rate),
            "trace_count": str(sampler.remaining),
            "log_frequency": str(values.log_frequency),
            "trace_mode": self.config.mode,
        }

    def update(self, changes: Mapping[str, Any], model: str | None = None) -> dict[str, Any]:
        """Check every change first, then apply them all; returns :meth:`as_dict`.

        Raises:
            SluiceError: UNSUPPORTED for a ``trace_file`` or ``trace_mode`` value (fixed
                at start-up, as Triton's ``trace_file``); INVALID_ARG for an unknown key
                or a value of the wrong form, naming both. Nothing changes then.
        """
        checked: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in _KEYS:
                raise invalid_arg(
                    f"unknown trace setting '{key}', expected one of {', '.join(_KEYS)}"
                )
            if value is None:
                if key in _ATTRIBUTES:  # a null file or mode changes nothing
                    checked[key] = None
            elif key == "trace_file":
                raise SluiceError(
                    ErrorCode.UNSUPPORTED,
                    "trace file location can not be updated through network protocol",
                )
            elif key == "trace_mode":
                raise SluiceError(
                    ErrorCode.UNSUPPORTED,
                    "trace mode can not be updated through network protocol",
                )
            elif key == "trace_level":
                checked[key] = _parse_levels(value)
            else:
                checked[key] = _parse_int(key, value, -1 if key == "trace_count" else 0)
        if not model:
            for key, value in checked.items():
                if value is not None:  # the global settings have no "unset"
                    setattr(self._global, _ATTRIBUTES[key], value)
            if checked.get("trace_count") is not None:
                self._global.remaining = checked["trace_count"]
        elif not changes:
            self._models.pop(model, None)
        else:
            sampler = self._models.setdefault(model, _Sampler())
            for key, value in checked.items():
                setattr(sampler, _ATTRIBUTES[key], value)
            if all(getattr(sampler, a) is None for a in _ATTRIBUTES.values()):
                del self._models[model]
            else:
                sampler.remaining = self._effective(sampler).count or 0
        self.active = self._any_active()
        return self.as_dict(model)

    def sample(self, model: str, forced: bool) -> bool:
        """Whether this request to ``model`` is traced: its settings' level is not
        ``OFF`` and either ``forced`` (it carries a W3C ``traceparent``, OpenTelemetry
        mode: traced whatever the rate and count, as Triton) or it is the ``rate``-th
        request since the last one traced and ``trace_count`` is not used up."""
        sampler = self._models.get(model, self._global)
        values = self._effective(sampler)
        if values.level == ["OFF"]:
            return False
        if forced:
            return True
        rate = values.rate or 0
        with sampler.lock:
            if rate == 0 or sampler.remaining == 0:
                return False
            sampler.seen += 1
            if sampler.seen % rate:
                return False
            if sampler.remaining > 0:
                sampler.remaining -= 1
            return True


def _normalize_levels(levels: list[str]) -> list[str]:
    kept = [level for level in dict.fromkeys(levels) if level != "OFF"]
    return kept or ["OFF"]


def _parse_levels(value: Any) -> list[str]:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise invalid_arg(f"expect an array of strings for 'trace_level', got {value!r}")
    for level in values:
        if level not in TRACE_LEVELS:
            raise invalid_arg(
                f"unsupported trace level '{level}' in 'trace_level', expected "
                f"{', '.join(TRACE_LEVELS)}"
            )
    return _normalize_levels(values)


#: most a trace rate or count can be (Triton keeps them as 32-bit integers)
INT32_MAX = 2**31 - 1


def strict_int(text: str | int) -> int:
    """``text`` as an integer: ASCII digits with an optional sign only (no ``1_0``, no
    other scripts' digits, no spaces, as Python's ``int`` would take), within 32 bits.

    Raises:
        ValueError: anything else.
    """
    if isinstance(text, str):
        body = text[1:] if text[:1] in "+-" else text
        if not body or not body.isascii() or not body.isdigit():
            raise ValueError(f"not an integer: {text!r}")
    number = int(text)
    if abs(number) > INT32_MAX:
        raise ValueError(f"out of range: {text!r}")
    return number


def _parse_int(key: str, value: Any, least: int) -> int:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]  # gRPC sends every value as a list of strings
    if isinstance(value, bool):
        value = None
    try:
        number = strict_int(value) if isinstance(value, str | int) else None
    except ValueError:
        number = None
    if number is None or number < least:
        raise invalid_arg(f"Unable to parse '{key}', got: {value!r} (an integer >= {least})")
    return number
