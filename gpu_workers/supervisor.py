"""The all-in-one supervisor behind ``sluice serve``.

Starts (or finds) Redis, one gateway process, and one worker process per model
instance that the repository's ``instance_group``s ask for; publishes configs
and version states in Redis; restarts an instance that dies; on SIGINT/SIGTERM
stops every child within ``exit_timeout_s`` (then kills it), so no process is
left behind. Children also get SIGTERM if the supervisor itself dies
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis
from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelInstanceGroup

from broker.consumer import ensure_group
from broker.keys import KeySchema
from broker.model_store import ModelState, ModelStore, VersionState
from broker.scheduling import StreamLayout, scheduling_policy
from gpu_workers.backends.registry import auto_complete
from gpu_workers.device import gpu_ids
from repository import ModelSource, load_model_config, scan_repositories, version_directories

logger = logging.getLogger(__name__)

_KIND_NAMES = {
    ModelInstanceGroup.KIND_CPU: "CPU",
    ModelInstanceGroup.KIND_GPU: "GPU",
    ModelInstanceGroup.KIND_MODEL: "MODEL",
}


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass(slots=True)
class Instance:
    """One worker process serving one model version."""

    model: str
    version: int
    name: str
    kind: str
    device_id: int
    model_dir: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """What ``sluice serve`` was asked to do (Triton's flag names in comments)."""

    repositories: tuple[Path, ...]  # --model-repository
    redis_url: str
    key_prefix: str = "sluice:"
    http_address: str = "0.0.0.0"  # --http-address
    http_port: int = 8000  # --http-port
    model_control_mode: str = "none"  # --model-control-mode
    exit_on_error: bool = True  # --exit-on-error
    strict_readiness: bool = True  # --strict-readiness
    strict_model_config: bool = False  # --disable-auto-complete-config
    model_config_name: str | None = None  # --model-config-name
    log_verbose: int = 0  # --log-verbose
    exit_timeout_s: float = 30.0  # --exit-timeout-secs
    load_timeout_s: float = 300.0
    request_timeout_s: float = 60.0
    gateway_args: tuple[str, ...] = ()  # --grpc-*, --*-restricted-* flags, passed through
    extra_env: dict[str, str] = field(default_factory=dict)


class Supervisor:
    """Owns every child process of one ``sluice serve``."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.keys = KeySchema(options.key_prefix)
        self.client = redis.Redis.from_url(options.redis_url, protocol=2, socket_timeout=30)
        self.store = ModelStore(self.client, self.keys)
        self.gateway: subprocess.Popen[bytes] | None = None
        self.instances: list[Instance] = []
        self._stopping = False

    # -- processes -------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.options.extra_env)
        env["SLUICE_REDIS__URL"] = self.options.redis_url
        env["SLUICE_REDIS__KEY_PREFIX"] = self.options.key_prefix
        return env

    def _spawn(self, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, *argv], env=self._env(), preexec_fn=_die_with_parent
        )

    def start_gateway(self) -> None:
        """Start the gateway process (HTTP front end)."""
        o = self.options
        self.gateway = self._spawn(
            [
                "-m",
                "api.gateway",
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
                *o.gateway_args,
            ]
        )

    def _start_instance(self, instance: Instance) -> None:
        instance.process = self._spawn(
            [
                "-m",
                "gpu_workers.main",
                "--model",
                instance.model,
                "--version",
                str(instance.version),
                "--instance",
                instance.name,
                "--kind",
                instance.kind,
                "--device-id",
                str(instance.device_id),
                "--model-dir",
                str(instance.model_dir),
                "--log-verbose",
                str(self.options.log_verbose),
            ]
        )
        instance.started_at = time.monotonic()

    # -- start-up --------------------------------------------------------------------------

    def reset_state(self) -> None:
        """Forget what an earlier server with this key prefix left (not its queues)."""
        for key in self.client.scan_iter(match=f"{self.options.key_prefix}*", count=1000):
            if self.client.type(key) != b"stream":
                self.client.delete(key)

    def load_all(self) -> list[str]:
        """Load every model of the repositories (model control mode ``none``).

        Returns:
            One line per model that failed to load (empty when all loaded).
        """
        scan = scan_repositories(self.options.repositories)
        found = {name: {"repository": str(src.repository)} for name, src in scan.models.items()}
        for name, paths in scan.duplicates.items():
            found[name] = {"repository": ",".join(str(p) for p in paths)}
        self.store.register_models(found)
        self.store.set_server(model_control_mode=self.options.model_control_mode)
        failures: list[str] = []
        for name, paths in scan.duplicates.items():
            reason = f"model '{name}' appears in more than one model repository: " + ", ".join(
                str(p) for p in paths
            )
            self.store.set_state(name, 1, VersionState(ModelState.UNAVAILABLE, reason))
            failures.append(reason)
        pending: list[tuple[str, int, list[Instance]]] = []
        for name, source in scan.models.items():
            if name in scan.duplicates:
                continue
            try:
                pending.extend(self._start_model(source))
            except Exception as exc:
                reason = str(exc) or type(exc).__name__
                logger.error("failed to load model '%s': %s", name, reason)
                for version in version_directories(source.path) or [1]:
                    self.store.set_state(
                        name, version, VersionState(ModelState.UNAVAILABLE, reason)
                    )
                failures.append(f"load failed for model '{name}': {reason}")
        for name, version, instances in pending:
            reason = self._await_ready(instances)
            if reason is None:
                self.store.set_state(name, version, VersionState(ModelState.READY))
                logger.info(
                    "model '%s' version %d is READY (%d instances)", name, version, len(instances)
                )
            else:
                self._stop_instances(instances)
                self.store.set_state(name, version, VersionState(ModelState.UNAVAILABLE, reason))
                failures.append(f"load failed for model '{name}': {reason}")
        self.store.set_server(startup="done")
        return failures

    def _start_model(self, source: ModelSource) -> list[tuple[str, int, list[Instance]]]:
        loaded = load_model_config(
            source,
            autocomplete=None if self.options.strict_model_config else auto_complete,
            config_name=self.options.model_config_name,
            gpu_ids=gpu_ids(),
            strict=self.options.strict_model_config,
        )
        config = loaded.config
        self.store.publish_config(source.name, json_format.MessageToJson(config))
        started = []
        for version in loaded.versions:
            self.store.set_state(source.name, version, VersionState(ModelState.LOADING))
            self.store.clear_instances(source.name, version)
            layout = StreamLayout(self.keys, source.name, version, scheduling_policy(config))
            for stream in layout.streams():
                ensure_group(self.client, stream)
            instances = []
            for group in config.instance_group:
                kind = _KIND_NAMES.get(group.kind, "CPU")
                devices = list(group.gpus) if kind == "GPU" else [0]
                for device in devices:
                    for index in range(group.count):
                        suffix = f"_gpu{device}" if kind == "GPU" else ""
                        instance = Instance(
                            source.name,
                            version,
                            f"{group.name}_{index}{suffix}",
                            kind,
                            device,
                            source.path,
                        )
                        self._start_instance(instance)
                        instances.append(instance)
            self.instances.extend(instances)
            started.append((source.name, version, instances))
        return started

    def _await_ready(self, instances: list[Instance]) -> str | None:
        """Wait until every instance reports READY; return the failure reason, if any."""
        if not instances:
            return None
        model, version = instances[0].model, instances[0].version
        deadline = time.monotonic() + self.options.load_timeout_s
        while time.monotonic() < deadline and not self._stopping:
            states = self.store.instances(model, version)
            for instance in instances:
                info = states.get(instance.name, {})
                if info.get("state") == "UNAVAILABLE":
                    return info.get("reason") or "instance failed to load"
                assert instance.process is not None
                if instance.process.poll() is not None and info.get("state") != "READY":
                    return (
                        f"instance '{instance.name}' exited with code "
                        f"{instance.process.returncode} while loading"
                    )
            if all(states.get(i.name, {}).get("state") == "READY" for i in instances):
                return None
            time.sleep(0.05)
        return (
            f"model '{model}' version {version} did not load within "
            f"{self.options.load_timeout_s:.0f}s"
        )

    # -- steady state and shutdown ---------------------------------------------------------

    def watch(self) -> None:
        """Restart the gateway and instances that die; return when asked to stop."""
        gateway_restarts = 0
        gateway_started = time.monotonic()
        while not self._stopping:
            if self.gateway is not None and self.gateway.poll() is not None:
                delay = min(30.0, 0.5 * 2 ** min(gateway_restarts, 6))
                if time.monotonic() - gateway_started >= delay:
                    logger.error("gateway exited with code %s; restarting", self.gateway.returncode)
                    gateway_restarts += 1
                    gateway_started = time.monotonic()
                    self.start_gateway()
            for instance in self.instances:
                process = instance.process
                if process is None or process.poll() is None:
                    continue
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
                self._start_instance(instance)
            time.sleep(0.2)

    def request_stop(self, *_: object) -> None:
        """Signal handler: leave :meth:`watch` and shut down."""
        self._stopping = True

    def _stop_instances(self, instances: Sequence[Instance]) -> None:
        procs = [i.process for i in instances if i.process is not None]
        _terminate(procs, self.options.exit_timeout_s)
        for instance in instances:
            if instance in self.instances:
                self.instances.remove(instance)

    def shutdown(self) -> None:
        """Stop the gateway and every instance; kill what outlives the exit timeout."""
        self._stopping = True
        procs = [i.process for i in self.instances if i.process is not None]
        if self.gateway is not None:
            procs.append(self.gateway)
        with contextlib.suppress(redis.exceptions.RedisError):
            self.store.set_server(startup="exiting")
            for model, version in sorted({(i.model, i.version) for i in self.instances}):
                self.store.set_state(
                    model, version, VersionState(ModelState.UNLOADING, "server exiting")
                )
        _terminate(procs, self.options.exit_timeout_s)
        with contextlib.suppress(redis.exceptions.RedisError):
            for model, version in sorted({(i.model, i.version) for i in self.instances}):
                self.store.set_state(
                    model, version, VersionState(ModelState.UNAVAILABLE, "unloaded")
                )
        self.client.close()


def _terminate(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
