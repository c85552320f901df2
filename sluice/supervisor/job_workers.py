"""The job worker processes ``sluice serve`` runs for async jobs (``sluice jobs``).

Started with the gateways, restarted when they die (with the same backoff as a gateway),
stopped first at shutdown: SIGTERM makes a job worker put its running jobs back on the
queue, so the next start goes on with them (docs/user-guide/jobs.md, Faults).
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time

from sluice.broker.cluster import is_cluster
from sluice.gpu_workers.processes import Spawner

__all__ = ["JobWorkers"]

logger = logging.getLogger(__name__)


class JobWorkers:
    """``count`` job worker processes.

    Args:
        spawner: starts processes with the deployment's Redis settings.
        count: how many (0: none). None are started on a Redis Cluster, whose protocol
            Celery's Redis transport does not speak (a warning says so).
        log_verbose: Triton ``--log-verbose`` passed to them.
        redis_url: the deployment's Redis URL.
    """

    def __init__(
        self, spawner: Spawner, count: int, log_verbose: int = 0, redis_url: str = ""
    ) -> None:
        if count and is_cluster(redis_url):
            logger.warning(
                "async jobs need a single Redis (Celery does not speak Redis Cluster): "
                "no job worker started"
            )
            count = 0
        self._spawner = spawner
        self._log_verbose = log_verbose
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * count
        self._started = [0.0] * count
        self._restarts = [0] * count

    def start(self) -> None:
        """Start every job worker."""
        for index in range(len(self.processes)):
            self._start(index)

    def _start(self, index: int) -> None:
        self.processes[index] = self._spawner.spawn(
            ["-m", "sluice.job_workers.main", "--log-verbose", str(self._log_verbose)]
        )
        self._started[index] = time.monotonic()

    def restart_dead(self) -> None:
        """Start again each job worker that exited (0.5 s after its start, doubling up to
        30 s for one that keeps exiting within 10 s of its start)."""
        for index, process in enumerate(self.processes):
            if process is None or process.poll() is None:
                continue
            ran_s = time.monotonic() - self._started[index]
            if ran_s >= 10.0:
                self._restarts[index] = 0  # it ran a while: a crash, not a failed start
            if ran_s < min(30.0, 0.5 * 2 ** min(self._restarts[index], 6)):
                continue
            logger.warning(
                "job worker %d exited with code %s; restarting", index, process.returncode
            )
            self._restarts[index] += 1
            self._start(index)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` to every running job worker."""
        for process in self.running():
            process.send_signal(sig)

    def running(self) -> list[subprocess.Popen[bytes]]:
        """The job worker processes still running."""
        return [p for p in self.processes if p is not None and p.poll() is None]
