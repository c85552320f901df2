"""The gateway's command line: its flags and the settings they give.

Kept apart from :mod:`api.gateway` so that ``sluice serve``, which checks a gateway's
flags before it starts one, does not import the web stack (FastAPI, uvicorn, grpcio:
~1.4 s of a slow VM's start-up).
"""

from __future__ import annotations

import argparse

from sluice.api.access import AccessPolicy
from sluice.api.frontend_flags import add_frontend_arguments, apply_frontend_arguments
from sluice.api.settings import GatewaySettings, HttpSettings


def parse_bool(text: str) -> bool:
    """A flag's true/false text (``1 true yes on`` / ``0 false no off``, any case).

    Raises:
        argparse.ArgumentTypeError: any other text.
    """
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def add_gateway_arguments(parser: argparse.ArgumentParser) -> None:
    """Triton's HTTP flags (defaults come from ``GatewaySettings`` / ``SLUICE_*``)."""
    parser.add_argument("--http-address", default=None, help="HTTP bind address (0.0.0.0)")
    parser.add_argument("--http-port", type=int, default=None, help="HTTP port (8000)")
    parser.add_argument("--redis-url", default=None, help="Redis URL (SLUICE_REDIS__URL)")
    parser.add_argument("--key-prefix", default=None, help="Redis key prefix (sluice:)")
    parser.add_argument("--strict-readiness", type=parse_bool, default=None)
    parser.add_argument(
        "--request-timeout-secs",
        type=float,
        default=None,
        help="longest wait for a response when the client sets none (60)",
    )
    parser.add_argument(
        "--exit-timeout-secs",
        type=float,
        default=None,
        help="at shutdown, longest wait for in-flight requests (30)",
    )
    parser.add_argument("--log-verbose", type=int, default=None)
    add_frontend_arguments(parser)


def settings_from_args(args: argparse.Namespace) -> GatewaySettings:
    """Environment/.env settings, overridden by the flags that were given."""
    settings = GatewaySettings()
    http = settings.http.model_dump()
    if args.http_address is not None:
        http["address"] = args.http_address
    if args.http_port is not None:
        http["port"] = args.http_port
    redis_settings = settings.redis.model_copy(
        update={
            k: v
            for k, v in (("url", args.redis_url), ("key_prefix", args.key_prefix))
            if v is not None
        }
    )
    update: dict[str, object] = {"http": HttpSettings(**http), "redis": redis_settings}
    if args.strict_readiness is not None:
        update["strict_readiness"] = args.strict_readiness
    if args.request_timeout_secs is not None:
        update["request_timeout_s"] = args.request_timeout_secs
    if args.exit_timeout_secs is not None:
        update["exit_timeout_s"] = args.exit_timeout_secs
    if args.log_verbose is not None:
        update["log_verbose"] = args.log_verbose
    return apply_frontend_arguments(settings.model_copy(update=update), args)


def check_access_specs(settings: GatewaySettings) -> None:
    """Parse both restricted-API specs (``--http-restricted-api``,
    ``--grpc-restricted-protocol``).

    Raises:
        ValueError: a malformed spec, naming it.
    """
    AccessPolicy(settings.http.restricted_apis)
    AccessPolicy(settings.grpc.restricted_protocols)
