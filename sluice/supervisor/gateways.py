"""The gateway processes ``sluice serve`` runs: the HTTP and gRPC front ends.

``--gateway-processes`` of them share the ports (``SO_REUSEPORT``). One that dies is
started again, 0.5 s after its last start and doubling up to 30 s while it keeps dying
within :data:`GATEWAY_SETTLED_S` of a start; after :data:`GATEWAY_START_ATTEMPTS` such
starts in a row ``sluice serve`` gives up (:class:`GatewayStartError`). At shutdown they
are sent SIGTERM first, so they answer new requests with 503 / UNAVAILABLE while the
instances drain.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time

from sluice.gpu_workers.processes import Spawner

__all__ = ["GATEWAY_SETTLED_S", "GATEWAY_START_ATTEMPTS", "GatewayStartError", "Gateways"]

logger = logging.getLogger(__name__)

#: a gateway that exits within this many seconds of its start failed to start, in s.
GATEWAY_SETTLED_S = 10.0
#: consecutive failed starts of one gateway after which ``sluice serve`` gives up.
GATEWAY_START_ATTEMPTS = 3


class GatewayStartError(RuntimeError):
    """A gateway process keeps exiting right after it starts (a port taken, a bad flag)."""


class Gateways:
    """``count`` gateway processes.

    Args:
        spawner: starts processes with the deployment's Redis settings.
        count: how many (0: none, with ``--start-gateway=false``).
        argv: the command-line flags each is started with.
    """

    def __init__(self, spawner: Spawner, count: int, argv: list[str]) -> None:
        self._spawner = spawner
        self._argv = argv
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * count
        self._restarts = [0] * count
        self._started = [0.0] * count

    def start(self) -> None:
        """Start every gateway."""
        for index in range(len(self.processes)):
            self._start(index)

    def _start(self, index: int) -> None:
        self.processes[index] = self._spawner.spawn(["-m", "sluice.api.gateway", *self._argv])

    def begin_watch(self) -> None:
        """Count restarts from now on: no restart yet, every gateway started now."""
        self._restarts = [0] * len(self.processes)
        self._started = [time.monotonic()] * len(self.processes)

    def restart_dead(self) -> None:
        """Start again each gateway that exited, once its backoff has passed.

        Raises:
            GatewayStartError: one exited within :data:`GATEWAY_SETTLED_S` of each of its
                last :data:`GATEWAY_START_ATTEMPTS` starts.
        """
        restarts, started = self._restarts, self._started
        for index, gateway in enumerate(self.processes):
            if gateway is None or gateway.poll() is None:
                continue
            if time.monotonic() - started[index] >= GATEWAY_SETTLED_S:
                restarts[index] = 0  # it ran a while: a crash, not a start-up failure
            elif restarts[index] >= GATEWAY_START_ATTEMPTS - 1:
                raise GatewayStartError(
                    f"gateway {index} exited with code {gateway.returncode} within "
                    f"{GATEWAY_SETTLED_S:.0f} s of each of {GATEWAY_START_ATTEMPTS} starts; "
                    "see its log lines above"
                )
            delay = min(30.0, 0.5 * 2 ** min(restarts[index], 6))
            if time.monotonic() - started[index] >= delay:
                logger.error(
                    "gateway %d exited with code %s; restarting", index, gateway.returncode
                )
                restarts[index] += 1
                started[index] = time.monotonic()
                self._start(index)

    def signal(self) -> None:
        """SIGTERM every running gateway."""
        for gateway in self.processes:
            if gateway is not None and gateway.poll() is None:
                gateway.send_signal(signal.SIGTERM)

    def started(self) -> list[subprocess.Popen[bytes]]:
        """Every gateway process started (running or not)."""
        return [g for g in self.processes if g is not None]
