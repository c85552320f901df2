"""``sluice`` command line: ``serve`` (all in one), ``gateway``, ``worker``, ``jobs``.

Flag names are Triton's where Triton has the flag (``--model-repository``,
``--http-port``, ``--model-control-mode``, ``--log-verbose``, ``--exit-on-error``,
``--strict-readiness``, ``--disable-auto-complete-config``, ``--model-config-name``,
``--exit-timeout-secs``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

import pydantic
import redis.exceptions

from sluice.api import frontend_flags
from sluice.api.gateway_args import (
    add_gateway_arguments,
    check_access_specs,
    parse_bool,
    settings_from_args,
)
from sluice.broker.deadline import exit_deadline
from sluice.gpu_workers.processes import EXIT_GRACE_S
from sluice.inert_flags import add_inert_arguments, warn_inert_flags
from sluice.repository.errors import RepositoryError
from sluice.repository.mirror import open_repositories
from sluice.supervisor.deployment_lease import DeploymentTaken
from sluice.supervisor.supervisor import GatewayStartError

logger = logging.getLogger("sluice")

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


def _resolve_redis(url: str | None) -> tuple[str, object | None]:
    """The Redis URL to use, starting a private redis-server when none was named or answers."""
    from sluice.broker.redis_access import check_redis_access
    from sluice.broker.redis_server import redis_answers, start_private_redis

    explicit = url or os.environ.get("SLUICE_REDIS_URL") or os.environ.get("SLUICE_REDIS__URL")
    if explicit:
        check_redis_access(explicit)  # a refused login: one line (RuntimeError), exit 1
        return explicit, None
    if redis_answers(DEFAULT_REDIS_URL):
        return DEFAULT_REDIS_URL, None
    process, private_url = start_private_redis()
    logger.info(
        "no Redis at %s; started a private redis-server at %s", DEFAULT_REDIS_URL, private_url
    )
    return private_url, process


def serve(args: argparse.Namespace) -> int:
    """``sluice serve``: run everything until Ctrl-C; returns the exit code."""
    from sluice.broker.logs import LogOptions, configure_logging
    from sluice.broker.redis_access import redacted, unusable_redis
    from sluice.supervisor.supervisor import ServeOptions, Supervisor

    log_options = LogOptions.from_env(
        verbose=args.log_verbose,
        info=args.log_info,
        warning=args.log_warning,
        error=args.log_error,
        format=args.log_format,
        file=args.log_file,
    )
    configure_logging("serve", log_options)
    warn_inert_flags(args)
    # a Ctrl-C while Redis and the deployment are being set up stops quietly once they are
    early_stop = _StopRequest(args.exit_timeout_secs)
    signal.signal(signal.SIGINT, early_stop)
    signal.signal(signal.SIGTERM, early_stop)
    if args.load_model and args.model_control_mode != "explicit":
        logger.error("--load-model needs --model-control-mode=explicit")
        return 2
    if not args.start_instances and args.model_control_mode != "none":
        # a load or reload would publish a config that workers started apart never read
        logger.error("--start-instances=false needs --model-control-mode=none")
        return 2
    try:
        repositories = open_repositories(args.model_repository)  # cloud ones: copied here
        redis_url, redis_process = _resolve_redis(args.redis_url)
    except (RepositoryError, RuntimeError) as exc:
        logger.error("%s", exc)
        return 1
    early_stop.private_redis = redis_process
    strict = args.disable_auto_complete_config or bool(args.strict_model_config)
    options = ServeOptions(
        repositories=repositories,
        redis_url=redis_url,
        key_prefix=args.key_prefix,
        http_address=args.http_address,
        http_port=args.http_port,
        model_control_mode=args.model_control_mode,
        load_models=tuple(args.load_model),
        repository_poll_s=args.repository_poll_secs,
        gateway_processes=args.gateway_processes if args.start_gateway else 0,
        start_instances=args.start_instances,
        exit_on_error=args.exit_on_error,
        strict_readiness=args.strict_readiness,
        strict_model_config=strict,
        model_config_name=args.model_config_name,
        log_verbose=args.log_verbose,
        exit_timeout_s=args.exit_timeout_secs,
        request_timeout_s=args.request_timeout_secs,
        job_workers=args.job_workers,
        gateway_args=tuple(frontend_flags.forward_frontend_arguments(args, restricted=False)),
        # children log as this process does; restricted-API headers (credentials) stay
        # off their command lines
        extra_env={**log_options.to_env(), **frontend_flags.restricted_environment(args)},
    )
    try:
        supervisor = Supervisor(options)
        supervisor.private_redis = redis_process  # type: ignore[assignment]
        argv = [*supervisor.gateway_argv(), *frontend_flags.restricted_arguments(args)]
        problem = check_gateway_start(argv) if args.start_gateway else None
        if problem is None:
            supervisor.reset_state()
    except DeploymentTaken as exc:
        problem = (
            f"another sluice serve ({exc}) runs with key prefix '{args.key_prefix}' at "
            f"{redacted(redis_url)}: stop it first, or give this deployment its own --key-prefix"
        )
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        problem = unusable_redis(redis_url, exc)
    except ValueError as exc:  # a malformed redis+cluster:// URL
        problem = f"bad --redis-url: {exc}"
    except RepositoryError as exc:
        problem = str(exc)
    if problem is not None:
        logger.error("%s", problem)
        _stop_private_redis(redis_process)
        return 1
    signal.signal(signal.SIGINT, supervisor.request_stop)
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    early_stop.handed_over.set()  # the supervisor's own exit deadline covers the rest
    if early_stop.signum:
        supervisor.request_stop()
    code = 0
    try:
        failures: list[str] = []
        if not supervisor.stop_requested:
            supervisor.start_gateways()
            failures = supervisor.load_startup_models()
        for line in [] if supervisor.stop_requested else failures:
            logger.error("%s", line)  # loads that the exit cut short are not failures
        if supervisor.stop_requested:
            logger.info("stopped while starting; exiting")
        elif failures and options.exit_on_error:
            logger.error(
                "exiting: %d model(s) failed to load (--exit-on-error=true)", len(failures)
            )
            code = 1
        elif not args.start_gateway:
            logger.info("serving the models to gateways started apart")
            supervisor.watch()
        else:
            logger.info("serving on http://%s:%d", options.http_address, options.http_port)
            if args.allow_grpc is not False:
                logger.info(
                    "serving gRPC on %s:%d",
                    args.grpc_address or "0.0.0.0",
                    8001 if args.grpc_port is None else args.grpc_port,
                )
            supervisor.watch()
    except (GatewayStartError, RepositoryError) as exc:
        logger.error("exiting: %s", exc)
        code = 1
    finally:
        supervisor.shutdown()
        _stop_private_redis(supervisor.private_redis)  # started again if it died
    return code


class _StopRequest:
    """SIGINT/SIGTERM handler of ``sluice serve`` until its supervisor takes over: the
    signal is kept (:attr:`signum`) and acted on once setting up is done, rather than
    raised as a ``KeyboardInterrupt`` in the middle of it.

    The first signal also arms the exit deadline (the exit timeout and
    ``EXIT_GRACE_S`` more, as a running server's shutdown has): setting up waits in
    Redis calls bounded only by the 30 s socket timeout when Redis accepts connections
    and answers nothing, so at the deadline the private redis-server, if one was
    started, is killed and the process exits 1. Nothing happens once
    :attr:`handed_over` is set (the supervisor's handlers and deadline took over).

    Args:
        exit_timeout_s: ``--exit-timeout-secs``, in s.
    """

    def __init__(self, exit_timeout_s: float) -> None:
        self.signum = 0
        self.private_redis: Any = None
        self.handed_over = threading.Event()
        self._exit_timeout_s = exit_timeout_s

    def __call__(self, signum: int, _frame: object) -> None:
        if not self.signum:
            exit_deadline(
                self._exit_timeout_s + EXIT_GRACE_S,
                f"stopped while starting, and setting up did not finish within the exit "
                f"timeout ({self._exit_timeout_s:.0f} s) and {EXIT_GRACE_S:.0f} s more "
                "(Redis not answering?): exiting",
                self._kill_private_redis,
                self.handed_over,
            )
        self.signum = signum

    def _kill_private_redis(self) -> None:
        process = self.private_redis
        if process is not None and process.poll() is None:
            with contextlib.suppress(OSError):
                process.kill()


def _stop_private_redis(process: object | None) -> None:
    from sluice.broker.redis_server import stop_private_redis

    if process is not None:
        stop_private_redis(process)  # type: ignore[arg-type]


def check_gateway_start(argv: list[str]) -> str | None:
    """Why a gateway started with ``argv`` would fail at once, or None.

    Checked before anything starts, so a bad flag or a taken port ends ``sluice serve``
    with one line instead of a gateway restarted in a loop: the flags are validated as
    the gateway validates them, and every port it will listen on must be free. A port
    another server holds with ``SO_REUSEPORT`` (``--gateway-processes`` > 1) counts as
    taken, so two servers never split one port's traffic.
    """
    parser = argparse.ArgumentParser(prog="sluice gateway")
    add_gateway_arguments(parser)
    try:
        settings = settings_from_args(parser.parse_args(argv))
        check_access_specs(settings)
    except pydantic.ValidationError as exc:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return f"invalid gateway settings: {errors}"
    except ValueError as exc:
        return f"invalid gateway settings: {exc}"
    listeners = [("HTTP", settings.http.address, settings.http.port)]
    if settings.grpc.enabled:
        listeners.append(("gRPC", settings.grpc.address, settings.grpc.port))
    if settings.metrics.enabled:
        address = settings.metrics.address or settings.http.address
        listeners.append(("metrics", address, settings.metrics.port))
    for index, (what, address, port) in enumerate(listeners):
        for other, other_address, other_port in listeners[:index]:
            if port and port == other_port and _overlap(address, other_address):
                return (
                    f"the {other} and {what} ports are both {port} on {address}: each "
                    "listener needs a port of its own"
                )
    for what, address, port in listeners:
        if port and not port_is_free(address, port):
            reason = f"the {what} port {port} on {address} is in use by another process"
            low, high = ephemeral_port_range()
            if low <= port <= high:
                reason += (
                    f" or connection (it lies in this machine's range for the local ports of "
                    f"outgoing connections, {low}-{high}: a port outside it is never taken "
                    "by one)"
                )
            return reason
    return None


def _overlap(first: str, second: str) -> bool:
    """Whether listeners on these two addresses would take the same port (the same
    address, or either a wildcard)."""
    wildcards = ("0.0.0.0", "::", "")
    return first == second or first in wildcards or second in wildcards


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing TCP connections (Linux
    ``net.ipv4.ip_local_port_range``; (0, -1) where unknown)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 0, -1


def port_is_free(address: str, port: int) -> bool:
    """Whether a TCP listener could bind ``address:port`` (no other socket holds it)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``sluice`` command."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "serve":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return serve(args)
    if args.command == "gateway":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        from sluice.api.gateway import run_gateway, settings_from_args

        run_gateway(settings_from_args(args))
        return 0
    if args.command == "jobs":
        from sluice.job_workers.main import main as jobs_main

        return jobs_main(rest)
    from sluice.gpu_workers.main import main as worker_main

    return worker_main(rest)


if __name__ == "__main__":
    sys.exit(main())
