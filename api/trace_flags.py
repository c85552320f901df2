"""tritonserver's trace flags: ``--trace-config`` and the deprecated ``--trace-*`` forms.

Forms (Triton ``docs/user_guide/trace.md``, server ``src/command_line_parser.cc``):

* ``--trace-config <setting>=<value>``: the global settings ``rate``, ``level``
  (repeatable: ``OFF``, ``TIMESTAMPS``, ``TENSORS``), ``count``, ``mode``
  (``triton`` or ``opentelemetry``);
* ``--trace-config triton,<setting>=<value>``: ``file``, ``log-frequency``;
* ``--trace-config opentelemetry,<setting>=<value>``: ``url``, ``resource``
  (``<key>=<value>``, repeatable), ``bsp_max_queue_size``, ``bsp_schedule_delay`` (ms),
  ``bsp_max_export_batch_size``;
* deprecated, still accepted: ``--trace-file``, ``--trace-level`` (repeatable),
  ``--trace-rate``, ``--trace-count``, ``--trace-log-frequency``.

``sluice serve`` forwards them to its gateways verbatim; a gateway folds them into
:class:`api.settings.TraceConfig`. A bad value stops the command line with argparse's
exit 2 and a message naming the flag and the value.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from sluice.api.settings import TRACE_LEVELS, TraceConfig
from sluice.api.trace_settings import strict_int
from sluice.broker.tracing import parse_resource

__all__ = ["add_trace_arguments", "apply_trace_arguments", "forward_trace_arguments"]


def _level(text: str) -> str:
    if text not in TRACE_LEVELS:
        raise ValueError(f"expected one of {', '.join(TRACE_LEVELS)}")
    return text


def _mode(text: str) -> str:
    if text not in ("triton", "opentelemetry"):
        raise ValueError("expected triton or opentelemetry")
    return text


def _non_negative(text: str) -> int:
    value = strict_int(text)
    if value < 0:
        raise ValueError("expected an integer >= 0")
    return value


def _positive(text: str) -> int:
    value = strict_int(text)
    if value <= 0:
        raise ValueError("expected an integer > 0")
    return value


def _count(text: str) -> int:
    value = strict_int(text)
    if value < -1:
        raise ValueError("expected -1 (no limit) or an integer >= 0")
    return value


def _trace_file(text: str) -> str:
    """A trace file path whose folder exists and can be written (checked at start, not
    at the first trace)."""
    folder = Path(text).expanduser().parent
    if not text or not folder.is_dir():
        raise ValueError(f"the folder '{folder}' does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"the folder '{folder}' cannot be written")
    return text


def _resource(text: str) -> str:
    parse_resource(text)
    return text


#: ``--trace-config`` section -> setting -> (TraceConfig field, value parser).
_SETTINGS: dict[str, dict[str, tuple[str, Any]]] = {
    "": {
        "rate": ("rate", _non_negative),
        "level": ("level", _level),
        "count": ("count", _count),
        "mode": ("mode", _mode),
    },
    "triton": {"file": ("file", _trace_file), "log-frequency": ("log_frequency", _non_negative)},
    "opentelemetry": {
        "url": ("url", str),
        "resource": ("resource", _resource),
        "bsp_max_queue_size": ("bsp_max_queue_size", _positive),
        "bsp_schedule_delay": ("bsp_schedule_delay_ms", _positive),
        "bsp_max_export_batch_size": ("bsp_max_export_batch_size", _positive),
    },
}
#: repeatable settings: each value is added to a list
_LISTS = ("level", "resource")
#: deprecated flag -> ``--trace-config`` form
_DEPRECATED = {
    "--trace-file": ("triton", "file"),
    "--trace-level": ("", "level"),
    "--trace-rate": ("", "rate"),
    "--trace-count": ("", "count"),
    "--trace-log-frequency": ("triton", "log-frequency"),
}


def _trace_config(text: str) -> tuple[str, str, Any]:
    """One ``--trace-config`` value as (field, text, parsed value).

    Raises:
        argparse.ArgumentTypeError: an unknown section or setting, or a bad value.
    """
    section, comma, rest = text.partition(",")
    if not comma:
        section, rest = "", text
    key, sep, value = rest.partition("=")
    if section not in _SETTINGS:
        raise argparse.ArgumentTypeError(
            f"unknown trace mode '{section}' in '{text}', expected triton or opentelemetry"
        )
    if not sep or key not in _SETTINGS[section]:
        known = ", ".join(_SETTINGS[section])
        where = f"{section}," if section else ""
        others = "" if section else " (or triton,<setting>=... / opentelemetry,<setting>=...)"
        raise argparse.ArgumentTypeError(
            f"expected {where}<setting>=<value> with setting one of {known}{others}, got '{text}'"
        )
    field, parse = _SETTINGS[section][key]
    try:
        return field, text, parse(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad value in '{text}': {exc}") from None


def _deprecated(flag: str) -> Any:
    section, key = _DEPRECATED[flag]

    def parse(value: str) -> tuple[str, str, Any]:
        return _trace_config(f"{section},{key}={value}" if section else f"{key}={value}")

    parse.__name__ = flag  # argparse names the flag's type in its error
    return parse


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``--trace-config`` and the deprecated ``--trace-*`` flags (all repeatable;
    default None = not given)."""
    parser.add_argument(
        "--trace-config",
        action="append",
        type=_trace_config,
        default=None,
        metavar="[MODE,]SETTING=VALUE",
        help="tracing, as tritonserver: rate=N, level=OFF|TIMESTAMPS|TENSORS, count=N, "
        "mode=triton|opentelemetry, triton,file=PATH, triton,log-frequency=N, "
        "opentelemetry,url=URL, opentelemetry,resource=KEY=VALUE (repeatable)",
    )
    for flag in _DEPRECATED:
        parser.add_argument(
            flag,
            dest=_dest(flag),
            action="append",
            type=_deprecated(flag),
            default=None,
            help=f"deprecated form of --trace-config {_DEPRECATED[flag][1]}=...",
        )


def _given(args: argparse.Namespace) -> list[tuple[str, str, Any]]:
    """Every trace setting given, in flag order within each flag."""
    given = list(getattr(args, "trace_config", None) or ())
    for flag in _DEPRECATED:
        given += getattr(args, _dest(flag), None) or ()
    return given


def forward_trace_arguments(args: argparse.Namespace) -> list[str]:
    """The given trace flags as ``--trace-config`` argv, for the gateway process."""
    argv: list[str] = []
    for _, text, _ in _given(args):
        argv += ["--trace-config", text]
    return argv


def apply_trace_arguments(config: TraceConfig, args: argparse.Namespace) -> TraceConfig:
    """``config`` with the given trace flags applied; a repeated ``level`` or
    ``resource`` lists every value given (the first replaces the default).

    Raises:
        pydantic.ValidationError: a value the settings refuse.
    """
    values: dict[str, Any] = config.model_dump()
    seen: set[str] = set()
    for field, _, value in _given(args):
        if field in _LISTS:
            values[field] = ([*values[field]] if field in seen else []) + [value]
        else:
            values[field] = value
        seen.add(field)
    return TraceConfig.model_validate(values)
