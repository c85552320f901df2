"""Child processes of the supervisor: spawning with the right environment, stopping in bounds."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """``PR_SET_PDEATHSIG``: the child gets SIGTERM when the supervisor dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)
    except OSError:
        pass


def start_child() -> None:  # pragma: no cover - runs in the child before exec
    """What every child of the supervisor does before exec: :func:`die_with_parent`, and
    start with SIGINT ignored.

    A terminal's Ctrl-C reaches the whole process group, and the supervisor stops its
    children itself (SIGTERM, in order: gateways, then instances). A child still
    importing or loading its model would otherwise die of a ``KeyboardInterrupt`` with a
    traceback of its own. The gateway and the worker install their own SIGINT handlers
    once they serve (``sluice gateway`` / ``sluice worker`` run by hand are unaffected).
    """
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def generation_suffix(generation: int) -> str:
    """What a reload's instance names end with (``_g2``, ``_g3``, ...; nothing for the
    first load): old and new instances of a model run side by side during a reload and
    need distinct consumer names in Redis."""
    return f"_g{generation}" if generation > 1 else ""


_GENERATION = re.compile(r"_g[0-9]+$")


def triton_instance_name(name: str) -> str:
    """The name a model sees (``model_instance_name``): the instance name without its
    :func:`generation_suffix`, Triton's ``<group name>_<index>`` whatever the reload
    (``digits_0_1_g4`` -> ``digits_0_1``; ``_gpu0`` stays)."""
    return _GENERATION.sub("", name)


@dataclass(slots=True)
class Instance:
    """One worker process serving one model version (one model instance).

    Attributes:
        model: model name.
        version: model version.
        name: instance (consumer) name, unique per version.
        kind: ``CPU``, ``GPU`` or ``MODEL``.
        device_id: GPU ordinal for ``GPU`` instances.
        model_dir: the model's directory.
        config_key: Redis key of the config this instance starts with.
        generation: load generation of the model that started it.
        load_id: the id of that load (``VersionState.load_id``), stamped on its answers.
        ordinal: its place among the version's instances (0, 1, ...): the queue shard it
            waits on when idle (``--queue-shard``).
    """

    model: str
    version: int
    name: str
    kind: str
    device_id: int
    model_dir: Path
    config_key: str
    generation: int = 1
    load_id: str = ""
    ordinal: int = 0
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    exited_at: float = 0.0
    """When the supervisor saw the process gone (monotonic s; 0 while it runs)."""


class Spawner:
    """Starts Sluice processes with the deployment's Redis settings in their environment.

    Args:
        redis_url: Redis URL every child uses.
        key_prefix: key prefix every child uses.
        log_verbose: Triton ``--log-verbose`` passed to children.
        extra_env: more environment variables for every child.
        drain_timeout_s: how long a stopping instance keeps running queued requests, in s.
    """

    def __init__(
        self,
        redis_url: str,
        key_prefix: str,
        log_verbose: int = 0,
        extra_env: dict[str, str] | None = None,
        drain_timeout_s: float = 5.0,
    ) -> None:
        self.drain_timeout_s = drain_timeout_s
        self._env = dict(os.environ)
        self._env.update(extra_env or {})
        self._env["SLUICE_REDIS__URL"] = redis_url
        self._env["SLUICE_REDIS__KEY_PREFIX"] = key_prefix
        self.log_verbose = log_verbose

    def spawn(self, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        """``python <argv>`` as a child that dies with the supervisor (:func:`start_child`)."""
        return subprocess.Popen([sys.executable, *argv], env=self._env, preexec_fn=start_child)

    def start_instance(self, instance: Instance) -> None:
        """Start (or restart) the worker process of ``instance``."""
        instance.process = self.spawn(
            [
                "-m",
                "sluice.gpu_workers.main",
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
                "--config-key",
                instance.config_key,
                "--queue-shard",
                str(instance.ordinal),
                "--log-verbose",
                str(self.log_verbose),
                "--drain-timeout-secs",
                str(self.drain_timeout_s),
                "--load-id",
                instance.load_id,
            ]
        )
        instance.started_at = time.monotonic()
        instance.exited_at = 0.0


#: tells an instance that a newer one serving its streams replaces it (a reload): it
#: finishes the requests it holds and exits, leaving the queue to the new one. SIGTERM
#: (unload, shutdown) also runs what is still queued.
HAND_OVER_SIGNAL = signal.SIGUSR2


def terminate(
    procs: Sequence[subprocess.Popen[bytes]], timeout_s: float, sig: int = signal.SIGTERM
) -> None:
    """Send ``sig`` to every process, wait up to ``timeout_s`` s in all, SIGKILL what is left."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(sig)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


#: a stopping ``sluice serve`` or instance ends itself this long after its exit (drain)
#: timeout, in s (:func:`exit_deadline`).
EXIT_GRACE_S = 3.0
