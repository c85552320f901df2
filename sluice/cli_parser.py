"""The ``sluice`` command's parser: its commands and the flags of ``serve``.

``gateway`` takes the gateway's own flags (:func:`api.gateway_args.add_gateway_arguments`);
``worker`` and ``jobs`` parse theirs in their own entry points, so they are left over here.
Flag names are Triton's where Triton has the flag (docs/reference/cli.md).
"""

from __future__ import annotations

import argparse
import os
from typing import NoReturn

from sluice.api import frontend_flags
from sluice.api.gateway_args import add_gateway_arguments, parse_bool
from sluice.inert_flags import add_inert_arguments

__all__ = ["DEFAULT_REDIS_URL", "build_parser"]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="Redis (if needed) + a gateway + every model instance")
    p.add_argument(
        "--model-repository",
        "--model-store",
        dest="model_repository",
        action="append",
        required=True,
        help="model repository: a folder, or s3://, gs://, as:// cloud storage (repeatable)",
    )
    p.add_argument("--http-address", default="0.0.0.0")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument(
        "--redis-url",
        default=None,
        help="Redis URL (SLUICE_REDIS_URL / SLUICE_REDIS__URL; default "
        f"{DEFAULT_REDIS_URL}, or a private redis-server when none answers)",
    )
    p.add_argument("--key-prefix", default=os.environ.get("SLUICE_REDIS__KEY_PREFIX", "sluice:"))
    p.add_argument("--model-control-mode", default="none", choices=["none", "poll", "explicit"])
    p.add_argument(
        "--load-model",
        action="append",
        default=[],
        help="explicit mode: a model to load at start (repeatable; '*' = all)",
    )
    p.add_argument(
        "--gateway-processes",
        type=_positive,
        default=1,
        help="gateway processes sharing the HTTP/gRPC ports (SO_REUSEPORT)",
    )
    p.add_argument(
        "--repository-poll-secs",
        type=float,
        default=15.0,
        help="poll mode: seconds between repository scans",
    )
    p.add_argument("--exit-on-error", type=parse_bool, default=True)
    p.add_argument("--strict-readiness", type=parse_bool, default=True)
    p.add_argument("--disable-auto-complete-config", action="store_true")
    p.add_argument(
        "--strict-model-config",
        type=parse_bool,
        default=None,
        help="older spelling of --disable-auto-complete-config",
    )
    p.add_argument("--model-config-name", default=None)
    p.add_argument("--exit-timeout-secs", type=float, default=30.0)
    p.add_argument(
        "--request-timeout-secs",
        type=float,
        default=60.0,
        help="longest wait for a response when the client sets none",
    )
    p.add_argument(
        "--job-workers",
        type=_count,
        default=1,
        help="job worker processes for the async job API (0: none; see 'sluice jobs')",
    )
    p.add_argument("--log-verbose", type=int, default=0)
    p.add_argument(
        "--start-gateway",
        type=parse_bool,
        default=True,
        help="start the gateway process(es); false: 'sluice gateway' processes started "
        "apart (containers) serve the front ends",
    )
    p.add_argument(
        "--start-instances",
        type=parse_bool,
        default=True,
        help="start one process per model instance; false: the models are published and "
        "'sluice worker' processes started apart (containers) serve them "
        "(--model-control-mode=none only)",
    )
    frontend_flags.add_frontend_arguments(p)
    add_inert_arguments(p)


def _count(text: str) -> int:
    """argparse type: a whole number ≥ 0."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got '{text}'")
    return int(text)


def _positive(text: str) -> int:
    """argparse type: a whole number ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got '{text}'")
    return value


class _OneLineErrors(argparse.ArgumentParser):
    """A parser whose flag errors are one line (and exit code 2), not the usage text:
    the error names the flag and its rule; ``--help`` shows the rest."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``sluice`` parser with its ``serve``, ``gateway``, ``worker`` and ``jobs``
    commands (``worker`` and ``jobs`` parse their own flags: they are left over here)."""
    parser = _OneLineErrors(
        prog="sluice",
        description="Triton-compatible inference server whose requests travel through Redis",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    gateway = sub.add_parser("gateway", help="one stateless HTTP + gRPC gateway")
    add_gateway_arguments(gateway)
    sub.add_parser("worker", help="one model instance (see 'sluice worker --help')", add_help=False)
    sub.add_parser(
        "jobs", help="a job worker for async jobs (see 'sluice jobs --help')", add_help=False
    )
    return parser
