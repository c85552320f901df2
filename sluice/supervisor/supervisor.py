"""The all-in-one supervisor behind ``sluice serve``.

Starts one gateway process and, through the :class:`ModelManager`, one worker
process per model instance; loads models by the model control mode (Triton's
``none``, ``poll``, ``explicit``); takes load/unload commands from gateways
(explicit mode) off the control stream; rescans the repositories (poll mode);
restarts a gateway or an instance that dies; on SIGINT/SIGTERM stops every
child within ``exit_timeout_s`` (then kills it), so no process is left behind.
Children also get SIGTERM if the supervisor itself dies (``PR_SET_PDEATHSIG``).

The gateway processes: :mod:`sluice.supervisor.gateways`; the control commands:
:mod:`sluice.supervisor.control_commands`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from sluice.broker.cluster import sync_client
from sluice.broker.control import ensure_control_group
from sluice.broker.deadline import exit_deadline
from sluice.broker.keys import KeySchema
from sluice.broker.model_store import ModelStore
from sluice.broker.outage import OutageLog
from sluice.broker.redis_server import restart_private_redis
from sluice.gpu_workers.processes import EXIT_GRACE_S, Spawner, terminate
from sluice.supervisor.control_commands import ControlCommands
from sluice.supervisor.deployment_lease import DeploymentLease
from sluice.supervisor.gateways import Gateways
from sluice.supervisor.job_workers import JobWorkers
from sluice.supervisor.model_manager import ManagerOptions, ModelManager

logger = logging.getLogger(__name__)

#: how often the watch loop looks at its children and the control stream, in ms.
WATCH_MS = 200
#: an instance that ran this long before it died is restarted without backoff, in s.
INSTANCE_SETTLED_S = 10.0
#: how often the supervisor checks that Redis still holds the deployment's state, in s.
STATE_CHECK_S = 1.0


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """What ``sluice serve`` was asked to do (Triton's flag names in comments)."""

    repositories: tuple[Path, ...]  # --model-repository
    redis_url: str
    key_prefix: str = "sluice:"
    http_address: str = "0.0.0.0"  # --http-address
    http_port: int = 8000  # --http-port
    model_control_mode: str = "none"  # --model-control-mode
    load_models: tuple[str, ...] = ()  # --load-model (explicit mode)
    repository_poll_s: float = 15.0  # --repository-poll-secs
    exit_on_error: bool = True  # --exit-on-error
    strict_readiness: bool = True  # --strict-readiness
    strict_model_config: bool = False  # --disable-auto-complete-config
    model_config_name: str | None = None  # --model-config-name
    log_verbose: int = 0  # --log-verbose
    exit_timeout_s: float = 30.0  # --exit-timeout-secs
    gateway_processes: int = 1  # Sluice: gateway processes sharing the ports (SO_REUSEPORT)
    start_instances: bool = True  # Sluice: False when `sluice worker`s started apart serve
    load_timeout_s: float = 300.0
    request_timeout_s: float = 60.0
    job_workers: int = 1  # Sluice: ``sluice jobs`` processes (async jobs)
    gateway_args: tuple[str, ...] = ()  # --grpc-*, --*-restricted-* flags, passed through
    extra_env: dict[str, str] = field(default_factory=dict)


class Supervisor:
    """Owns every child process of one ``sluice serve``."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.keys = KeySchema(options.key_prefix)
        self.client = sync_client(options.redis_url, protocol=2, socket_timeout=30)
        self.store = ModelStore(self.client, self.keys)
        holder = f"host {socket.gethostname()} pid {os.getpid()} HTTP port {options.http_port}"
        self.lease = DeploymentLease(self.client, self.keys.deployment(), holder)
        env = dict(options.extra_env)
        if options.gateway_processes > 1:
            env["SLUICE_REUSE_PORT"] = "1"
        self.spawner = Spawner(
            options.redis_url,
            options.key_prefix,
            options.log_verbose,
            env,
            # instances drain queued requests within the exit timeout (counted from the
            # signal), with a quarter of it, at most 1 s, to spare for their last batch
            drain_timeout_s=options.exit_timeout_s - min(1.0, options.exit_timeout_s / 4),
        )
        self.manager = ModelManager(
            ManagerOptions(
                repositories=options.repositories,
                strict_model_config=options.strict_model_config,
                model_config_name=options.model_config_name,
                load_timeout_s=options.load_timeout_s,
                drain_timeout_s=options.exit_timeout_s,
                start_instances=options.start_instances,
            ),
            self.client,
            self.keys,
            self.spawner,
        )
        #: none with --start-gateway=false (gateway_processes 0)
        self.gateways = Gateways(self.spawner, options.gateway_processes, self.gateway_argv())
        self.commands = ControlCommands(
            self.client, self.keys.control(), self.manager, options.model_control_mode
        )
        self.job_workers = JobWorkers(
            self.spawner, options.job_workers, options.log_verbose, options.redis_url
        )
        self._stopping = False
        self._gateways_signalled = False
        #: ends the process if the shutdown outlives the exit timeout (Redis stalled)
        self._exit_deadline: threading.Thread | None = None
        self._shutdown_done = threading.Event()
        #: the redis-server ``sluice serve`` started because none answered (None: a Redis
        #: of the user's): started again at the same socket when it dies
        self.private_redis: subprocess.Popen[bytes] | None = None
        self._redis_retry_s = self._redis_retry_at = 0.0  # backoff of failed restarts
        self._state_outage = OutageLog(logger, "deployment state check")

    # -- start-up --------------------------------------------------------------------------

    def reset_state(self) -> None:
        """Take this key prefix's deployment lease, then forget what an earlier server
        with this prefix left, except its queues, its live sequences and its jobs (so that
        queued requests run, sequences continue within their idle time and accepted jobs go
        on after a restart).

        Raises:
            sluice.supervisor.deployment_lease.DeploymentTaken: another ``sluice serve`` runs
                on this prefix (nothing was changed).
            redis.exceptions.RedisError: Redis unreachable.
        """
        self.lease.acquire()
        lease = self.keys.deployment().encode()
        for key in self.client.scan_iter(match=f"{self.options.key_prefix}*", count=1000):
            name = key.decode(errors="replace")
            if key == lease or self.keys.is_sequence(name) or self.keys.is_job(name):
                continue
            if self.client.type(key) != b"stream" or key == self.keys.control().encode():
                self.client.delete(key)
        self.store.set_server(startup="loading", model_control_mode=self.options.model_control_mode)
        ensure_control_group(self.client, self.keys.control())

    def start_gateways(self) -> None:
        """Start every gateway process (HTTP and gRPC front ends) and job worker."""
        self.gateways.start()
        self.job_workers.start()

    def gateway_argv(self) -> list[str]:
        """The command-line flags every gateway process is started with."""
        o = self.options
        return [
            "--http-address",
            o.http_address,
            "--http-port",
            str(o.http_port),
            "--log-verbose",
            str(o.log_verbose),
            "--strict-readiness",
            "true" if o.strict_readiness else "false",
            "--request-timeout-secs",
            str(o.request_timeout_s),
            "--exit-timeout-secs",
            str(o.exit_timeout_s),
            *o.gateway_args,
        ]

    def load_startup_models(self) -> list[str]:
        """Load what the model control mode loads at start (Triton 5.13).

        ``none``/``poll``: every model; ``explicit``: the ``--load-model`` names
        (``*`` = all). Returns one line per model that failed.
        """
        scan = self.manager.scan()
        names = [n for n in scan.models if n not in scan.duplicates]
        failures = [
            f"load failed for model '{n}': it appears in more than one model repository"
            for n in scan.duplicates
        ]
        if self.options.model_control_mode == "explicit":
            wanted = self.options.load_models
            if "*" not in wanted:
                failures += [
                    f"failed to load '{n}', failed to poll from model repository"
                    for n in wanted
                    if n not in scan.models
                ]
                names = [n for n in names if n in wanted]
        failures += self.manager.load_many(names)
        self.store.set_server(startup="done")
        return failures

    # -- steady state ----------------------------------------------------------------------

    def watch(self) -> None:
        """Serve control commands, poll, restart dead children; return when asked to stop."""
        self.gateways.begin_watch()
        next_poll = time.monotonic() + self.options.repository_poll_s
        next_check = time.monotonic() + STATE_CHECK_S
        while not self._stopping:
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + STATE_CHECK_S
                self._restart_private_redis_if_dead()
                self._republish_if_lost()
            self.gateways.restart_dead()
            self._restart_dead_instances()
            self.job_workers.restart_dead()
            if self.options.model_control_mode == "poll" and time.monotonic() >= next_poll:
                self.manager.poll()
                next_poll = time.monotonic() + self.options.repository_poll_s
            self.commands.serve(WATCH_MS)

    def _restart_private_redis_if_dead(self) -> None:
        """Start the private redis-server again, on the same socket, when it exited (killed,
        out of memory). It persists nothing, so the queued requests, the replies not yet
        read and the statistics are gone; every process of the deployment reconnects on
        its own, :meth:`_republish_if_lost` publishes the models again, and the requests
        in flight are answered with an error or at their deadline."""
        process = self.private_redis
        if process is None or process.poll() is None or time.monotonic() < self._redis_retry_at:
            return
        if not self._redis_retry_s:
            logger.error(
                "the private redis-server exited with code %s; starting it again (queued "
                "requests and statistics are lost)",
                process.returncode,
            )
        try:
            self.private_redis = restart_private_redis(process)
        except RuntimeError as exc:
            self._redis_retry_s = min(60.0, 2 * self._redis_retry_s or 1.0)
            self._redis_retry_at = time.monotonic() + self._redis_retry_s
            logger.error(
                "cannot start the private redis-server again: %s; next try in %.0f s",
                exc,
                self._redis_retry_s,
            )
            return
        self._redis_retry_s = self._redis_retry_at = 0.0

    def _republish_if_lost(self) -> None:
        """Publish the deployment's state again when Redis lost it (restarted without its
        data: the server record is gone), so the gateways know the models again."""
        try:
            if self.client.exists(self.keys.server()):
                self._state_outage.ok()
                return
            logger.warning(
                "Redis lost this deployment's state (restarted without its data?); "
                "publishing it again"
            )
            ensure_control_group(self.client, self.keys.control())
            self.manager.republish()
            self.store.set_server(
                startup="done", model_control_mode=self.options.model_control_mode
            )
        except redis.exceptions.RedisError as exc:
            self._state_outage.failed(exc)

    def _restart_dead_instances(self) -> None:
        for instance in list(self.manager.instances()):
            process = instance.process
            if process is None or process.poll() is None:
                continue
            if not instance.exited_at:
                instance.exited_at = time.monotonic()
                if (
                    instance.exited_at - instance.started_at >= INSTANCE_SETTLED_S
                    or self.manager.died_serving(instance)
                ):
                    # it served a while, or died running requests: restart it at once (a
                    # model that crashes on some requests would otherwise leave the
                    # requests queued behind them waiting out a backoff of up to 30 s)
                    instance.restarts = 0
            delay = min(30.0, 0.5 * 2 ** min(instance.restarts, 6))
            if time.monotonic() - instance.started_at < delay:
                continue
            logger.warning(
                "instance '%s' of model '%s' exited with code %s; restarting",
                instance.name,
                instance.model,
                process.returncode,
            )
            instance.restarts += 1
            self.spawner.start_instance(instance)

    @property
    def stop_requested(self) -> bool:
        """Whether a signal (:meth:`request_stop`) or :meth:`shutdown` asked this
        supervisor to stop."""
        return self._stopping

    def request_stop(self, *_: object) -> None:
        """Signal handler: leave :meth:`watch` and shut down. The gateways are told at once
        and the exit deadline starts (:meth:`_arm_exit_deadline`), so that a main thread
        held in a Redis call (Redis stalled: up to the client's 30 s socket timeout) does
        not hold up the exit."""
        self._stopping = True
        self.manager.stopping = True
        self._signal_gateways()
        self._arm_exit_deadline()

    def _signal_gateways(self) -> None:
        """SIGTERM every running gateway, once: from then on they answer new requests with
        503 / UNAVAILABLE and the ones they hold within the exit timeout."""
        if self._gateways_signalled:
            return
        self._gateways_signalled = True
        self.job_workers.signal()  # their running jobs go back on the queue
        self.gateways.signal()

    def _arm_exit_deadline(self) -> None:
        """Start, once, the thread that ends ``sluice serve`` when the shutdown has not
        finished :data:`EXIT_GRACE_S` after the exit timeout: it kills what is left of the
        deployment (gateways, instances, the private redis-server) and exits with code 1.
        A shutdown blocks that long only on a Redis that accepts connections and does not
        answer (stopped, swapped out): every other wait of it is bounded by the exit
        timeout."""
        if self._exit_deadline is not None:
            return
        self._exit_deadline = exit_deadline(
            self.options.exit_timeout_s + EXIT_GRACE_S,
            f"the shutdown did not finish within the exit timeout "
            f"({self.options.exit_timeout_s:.0f} s) and {EXIT_GRACE_S:.0f} s more (Redis not "
            "answering?): killing what is left and exiting",
            self._kill_what_is_left,
            self._shutdown_done,
        )

    def _kill_what_is_left(self) -> None:
        """SIGKILL the gateways, the instances and the private redis-server still running."""
        processes = self.gateways.started() + self.job_workers.running()
        processes += [i.process for i in list(self.manager.instances()) if i.process]
        if self.private_redis is not None:
            processes.append(self.private_redis)
        for process in processes:
            with contextlib.suppress(OSError):
                if process.poll() is None:
                    process.kill()

    def shutdown(self) -> None:
        """Stop the gateways taking requests, drain every instance, then wait for the gateways.

        The gateways are signalled first: from then on they answer new requests with
        503 / UNAVAILABLE "Server is shutting down" (not the 404 of a model whose
        versions are already unloaded) while the requests they hold are still run by
        the draining instances. What outlives the exit timeout is killed.
        """
        self._stopping = True
        self._arm_exit_deadline()
        self._signal_gateways()
        with contextlib.suppress(redis.exceptions.RedisError):
            self.store.set_server(startup="exiting")  # before any version is unloaded
        try:
            self.manager.shutdown(self.options.exit_timeout_s)
        except redis.exceptions.RedisError as exc:
            logger.warning("Redis unreachable at shutdown: %s", exc)
            terminate(
                [i.process for i in self.manager.instances() if i.process],
                self.options.exit_timeout_s,
            )
        terminate(self.gateways.started() + self.job_workers.running(), self.options.exit_timeout_s)
        self.lease.release()
        self.client.close()
        self._shutdown_done.set()
