"""Triton's gRPC, metrics, logging, trace and endpoint-access flags (and Sluice's HTTP read
timeout), declared once for ``sluice serve`` and ``gateway``.

``sluice serve`` forwards the flags it was given to the gateway process verbatim
(:func:`forward_frontend_arguments`); ``sluice gateway`` folds them into its
settings (:func:`apply_frontend_arguments`). Flag names and meanings are Triton's
(server ``src/command_line_parser.cc``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from sluice.api.settings import GatewaySettings
from sluice.api.trace_flags import (
    add_trace_arguments,
    apply_trace_arguments,
    forward_trace_arguments,
)
from sluice.broker.latency_window import parse_quantiles
from sluice.broker.response_cache import parse_cache_config

__all__ = [
    "METRICS_CONFIG_KEYS",
    "add_frontend_arguments",
    "apply_frontend_arguments",
    "forward_frontend_arguments",
    "restricted_arguments",
    "restricted_environment",
]


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


@dataclass(frozen=True, slots=True)
class _Flag:
    flag: str
    field: str | None  # settings field of ``section``; None = accepted and ignored
    type: Any
    help: str
    section: str = "grpc"  # "grpc", "http", "metrics" or "" (a GatewaySettings field)


def _log_format(text: str) -> str:
    if text not in ("default", "ISO8601"):
        raise argparse.ArgumentTypeError(f"expected default or ISO8601, got '{text}'")
    return text


_METRICS_FLAGS = (
    _Flag("--allow-metrics", "enabled", _bool, "serve Prometheus metrics (true)", "metrics"),
    _Flag(
        "--allow-gpu-metrics", "gpu", _bool, "GPU metrics where a GPU is found (true)", "metrics"
    ),
    _Flag(
        "--allow-cpu-metrics", "cpu", _bool, "CPU utilization and memory metrics (true)", "metrics"
    ),
    _Flag(
        "--metrics-address", "address", str, "metrics bind address (the HTTP address)", "metrics"
    ),
    _Flag("--metrics-port", "port", int, "metrics port (8002)", "metrics"),
    _Flag(
        "--metrics-interval-ms",
        "interval_ms",
        float,
        "GPU/CPU metrics refresh period, ms (2000)",
        "metrics",
    ),
)


def _log_file(text: str) -> str:
    """A log file this process can append to (created if missing)."""
    try:
        with open(text, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"cannot append to '{text}': {exc.strerror or exc}"
        ) from None
    return text


_LOG_FLAGS = (
    _Flag("--log-info", "log_info", _bool, "write INFO lines (true)", ""),
    _Flag("--log-warning", "log_warning", _bool, "write WARNING lines (true)", ""),
    _Flag("--log-error", "log_error", _bool, "write ERROR lines (true)", ""),
    _Flag("--log-format", "log_format", _log_format, "default or ISO8601", ""),
    _Flag(
        "--log-file", "log_file", _log_file, "append log lines to this file (standard error)", ""
    ),
)
#: ``--metrics-config <key>=<value>`` keys (Triton) and the MetricsSettings field of each.
METRICS_CONFIG_KEYS = {
    "counter_latencies": "counter_latencies",
    "summary_latencies": "summary_latencies",
    "histogram_latencies": "histogram_latencies",
    "summary_quantiles": "summary_quantiles",
}


_GRPC_FLAGS = (
    _Flag("--allow-grpc", "enabled", _bool, "serve gRPC (true)"),
    _Flag("--grpc-address", "address", str, "gRPC bind address (0.0.0.0)"),
    _Flag("--grpc-port", "port", int, "gRPC port (8001)"),
    _Flag("--grpc-keepalive-time", "keepalive_time_ms", int, "keepalive ping period, ms"),
    _Flag("--grpc-keepalive-timeout", "keepalive_timeout_ms", int, "keepalive ack wait, ms"),
    _Flag(
        "--grpc-keepalive-permit-without-calls",
        "keepalive_permit_without_calls",
        _bool,
        "allow keepalive pings with no call in flight",
    ),
    _Flag(
        "--grpc-http2-max-pings-without-data",
        "http2_max_pings_without_data",
        int,
        "pings allowed with no data sent",
    ),
    _Flag(
        "--grpc-http2-min-recv-ping-interval-without-data",
        "http2_min_recv_ping_interval_without_data_ms",
        int,
        "shortest accepted ping interval with no data, ms",
    ),
    _Flag("--grpc-http2-max-ping-strikes", "http2_max_ping_strikes", int, "bad pings tolerated"),
    _Flag("--grpc-use-ssl", "use_ssl", _bool, "serve gRPC over TLS"),
    _Flag("--grpc-use-ssl-mutual", "use_ssl_mutual", _bool, "mutual TLS (client certs)"),
    _Flag("--grpc-server-cert", "server_cert", str, "PEM server certificate"),
    _Flag("--grpc-server-key", "server_key", str, "PEM server key"),
    _Flag("--grpc-root-cert", "root_cert", str, "PEM root certificate"),
    _Flag(
        "--grpc-infer-response-compression-level",
        "infer_response_compression_level",
        str,
        "none, low, medium or high (gzip)",
    ),
    _Flag("--grpc-infer-allocation-pool-size", None, int, "accepted and ignored"),
    _Flag(
        "--grpc-max-input-size",
        "max_input_bytes",
        int,
        "largest gRPC request message, bytes (2147483647); larger: RESOURCE_EXHAUSTED",
    ),
)
_HTTP_FLAGS = (
    _Flag(
        "--http-read-timeout-secs",
        "read_timeout_s",
        float,
        "longest wait for the rest of a begun request, or a connection's first bytes, s (60)",
        "http",
    ),
    _Flag(
        "--http-max-input-size",
        "max_body_bytes",
        int,
        "largest HTTP request body, bytes, also after decompression (268435456); larger: 413",
        "http",
    ),
)
_RESTRICT_FLAGS = (
    ("--http-restricted-api", "http", "<api-group>[,...]:<header>=<value> (repeatable)"),
    ("--grpc-restricted-protocol", "grpc", "<api-group>[,...]:<header>=<value> (repeatable)"),
)


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _metrics_config(text: str) -> tuple[str, bool | str]:
    key, sep, value = text.partition("=")
    if not sep or key not in METRICS_CONFIG_KEYS:
        raise argparse.ArgumentTypeError(
            f"expected <key>=<value> with key one of {', '.join(METRICS_CONFIG_KEYS)}, got '{text}'"
        )
    if key == "summary_quantiles":
        try:
            parse_quantiles(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return key, value
    return key, _bool(value)


def _cache_config(text: str) -> str:
    try:
        parse_cache_config([text])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _config_text(value: bool | str) -> str:
    return value if isinstance(value, str) else ("true" if value else "false")


def add_frontend_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every gRPC, HTTP, metrics, logging and restricted-API flag (default None = "not
    given")."""
    for spec in (*_GRPC_FLAGS, *_HTTP_FLAGS, *_METRICS_FLAGS, *_LOG_FLAGS):
        parser.add_argument(spec.flag, type=spec.type, default=None, help=spec.help)
    parser.add_argument(
        "--metrics-config",
        action="append",
        type=_metrics_config,
        default=None,
        help="<key>=<value>: counter_latencies (true), summary_latencies (false), "
        "summary_quantiles (<q>:<error>,...), histogram_latencies (accepted, not "
        "implemented) (repeatable)",
    )
    parser.add_argument(
        "--cache-config",
        action="append",
        type=_cache_config,
        default=None,
        help="local,size=<bytes>: the response cache for models with response_cache "
        "{ enable: true }, kept in Redis and shared by every gateway",
    )
    for flag, _, help_text in _RESTRICT_FLAGS:
        parser.add_argument(flag, action="append", default=None, help=help_text)
    add_trace_arguments(parser)


def forward_frontend_arguments(args: argparse.Namespace, restricted: bool = True) -> list[str]:
    """The given flags as argv, to pass from ``sluice serve`` to the gateway process;
    without the restricted-API flags when not ``restricted`` (they go in the gateway's
    environment instead: :func:`restricted_environment`)."""
    argv: list[str] = []
    for spec in (*_GRPC_FLAGS, *_HTTP_FLAGS, *_METRICS_FLAGS, *_LOG_FLAGS):
        value = getattr(args, _dest(spec.flag))
        if value is not None:
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            argv += [spec.flag, text]
    for key, value in getattr(args, "metrics_config", None) or ():
        argv += ["--metrics-config", f"{key}={_config_text(value)}"]
    for value in getattr(args, "cache_config", None) or ():
        argv += ["--cache-config", value]
    argv += forward_trace_arguments(args)
    return argv + restricted_arguments(args) if restricted else argv


def restricted_arguments(args: argparse.Namespace) -> list[str]:
    """The restricted-API flags given (``--http-restricted-api``,
    ``--grpc-restricted-protocol``), as argv."""
    argv: list[str] = []
    for flag, _, _ in _RESTRICT_FLAGS:
        for value in getattr(args, _dest(flag), None) or ():
            argv += [flag, value]
    return argv


#: environment variable of the gateway setting of each restricted-API flag (JSON list).
RESTRICTED_ENV = {
    "--http-restricted-api": "SLUICE_HTTP__RESTRICTED_APIS",
    "--grpc-restricted-protocol": "SLUICE_GRPC__RESTRICTED_PROTOCOLS",
}


def restricted_environment(args: argparse.Namespace) -> dict[str, str]:
    """The restricted-API flags given, as the gateway's environment variables (JSON
    lists, :data:`RESTRICTED_ENV`): their header values are credentials, and a process's
    command line is shown to every user of the machine, its environment is not."""
    env = {}
    for flag, _, _ in _RESTRICT_FLAGS:
        values = getattr(args, _dest(flag), None)
        if values:
            env[RESTRICTED_ENV[flag]] = json.dumps(list(values))
    return env


def apply_frontend_arguments(
    settings: GatewaySettings, args: argparse.Namespace
) -> GatewaySettings:
    """``settings`` with the given flags applied (validated by pydantic).

    Raises:
        pydantic.ValidationError: a value out of range, naming the field.
    """
    grpc = settings.grpc.model_dump()
    http = settings.http.model_dump()
    metrics = settings.metrics.model_dump()
    top: dict[str, object] = {}
    sections = {"grpc": grpc, "http": http, "metrics": metrics, "": top}
    for spec in (*_GRPC_FLAGS, *_HTTP_FLAGS, *_METRICS_FLAGS, *_LOG_FLAGS):
        value = getattr(args, _dest(spec.flag), None)
        if value is not None and spec.field is not None:
            sections[spec.section][spec.field] = value
    for key, value in getattr(args, "metrics_config", None) or ():
        metrics[METRICS_CONFIG_KEYS[key]] = value
    if getattr(args, "cache_config", None):
        top["cache_size_bytes"] = parse_cache_config(args.cache_config)
    for flag, section, _ in _RESTRICT_FLAGS:
        values = getattr(args, _dest(flag), None)
        if values:
            (http if section == "http" else grpc)[
                "restricted_apis" if section == "http" else "restricted_protocols"
            ] = list(values)
    return type(settings).model_validate(
        {
            **settings.model_dump(),
            **top,
            "grpc": type(settings.grpc).model_validate(grpc),
            "http": type(settings.http).model_validate(http),
            "metrics": type(settings.metrics).model_validate(metrics),
            "trace": apply_trace_arguments(settings.trace, args),
        }
    )
