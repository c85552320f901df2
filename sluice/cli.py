"""``sluice`` command line: ``serve`` (all in one), ``gateway``, ``worker``, ``jobs``.

Flag names are Triton's where Triton has the flag (``--model-repository``,
``--http-port``, ``--model-control-mode``, ``--log-verbose``, ``--exit-on-error``,
``--strict-readiness``, ``--disable-auto-complete-config``, ``--model-config-name``,
``--exit-timeout-secs``); the parser and its flags: :mod:`sluice.cli_parser`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Any

import redis.exceptions

from sluice.api import frontend_flags
from sluice.broker.deadline import exit_deadline
from sluice.cli_parser import DEFAULT_REDIS_URL, build_parser
from sluice.gateway_preflight import check_gateway_start
from sluice.gpu_workers.processes import EXIT_GRACE_S
from sluice.inert_flags import warn_inert_flags
from sluice.repository.errors import RepositoryError
from sluice.repository.mirror import open_repositories
from sluice.supervisor.deployment_lease import DeploymentTaken
from sluice.supervisor.gateways import GatewayStartError

logger = logging.getLogger("sluice")


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
