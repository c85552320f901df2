"""A model instance's heartbeat kept fresh by a small process of its own.

The instance's heartbeat thread (:class:`gpu_workers.liveness.Liveness`) needs the
GIL. A model whose ``execute`` holds it for longer than the stale bound (a C extension
that does not release it: a catastrophic regular expression, a ``ctypes.PyDLL`` call)
would stop the thread: its peers would take the instance for dead, claim its request
and run it a second time, and with one instance the gateways would report the model and
the server not ready. Triton's Python backend judges its stub by whether the process is
there, not by a beat that the model's code can hold up.

:class:`Pulse` starts ``python -m sluice.gpu_workers.pulse`` beside the instance (and again
if it exits). Once a second, while the instance process lives (it is this process's
parent; the pulse also gets SIGTERM when it dies, ``PR_SET_PDEATHSIG``), it sets the
``heartbeat_ns`` of the instance's record to the current wall-clock time, and only
while the record says READY with the instance's pid: state changes stay the
instance's own writes.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time

import redis

from sluice.broker.cluster import sync_client
from sluice.gpu_workers.processes import start_child, terminate

logger = logging.getLogger(__name__)

#: KEYS[1] instances hash; ARGV: instance name, pid, heartbeat (ns). Sets the record's
#: heartbeat_ns in place when it is READY and belongs to that pid; returns 1 when set.
#: The JSON text is edited, not re-encoded: cjson would write the ns as a float.
_BUMP = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
local ok, info = pcall(cjson.decode, raw)
if not ok or type(info) ~= 'table' or info['state'] ~= 'READY'
    or tostring(info['pid']) ~= ARGV[2] then
  return 0
end
local updated, n = string.gsub(raw, '"heartbeat_ns": %d+', '"heartbeat_ns": ' .. ARGV[3], 1)
if n ~= 1 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], updated)
return 1
"""

#: the environment variable that carries the Redis URL to the pulse process
_URL_ENV = "SLUICE_PULSE_REDIS_URL"
#: how long a stopping instance waits for its pulse to exit before killing it, in s.
STOP_TIMEOUT_S = 2.0


class Pulse:
    """The pulse process of this instance (this process is the instance).

    The Redis URL reaches the process in its environment, not its command line, where
    ``ps`` would show a password in it.

    Args:
        redis_url: the instance's Redis.
        instances_key: the version's instances hash (:meth:`broker.keys.KeySchema.instances`).
        instance: the instance's name (its field in the hash).
        interval_s: how often the heartbeat is set, in s.
    """

    def __init__(
        self, redis_url: str, instances_key: str, instance: str, interval_s: float = 1.0
    ) -> None:
        self._env = dict(os.environ, **{_URL_ENV: redis_url})
        self._command = [
            sys.executable, "-m", "sluice.gpu_workers.pulse", "--key", instances_key,
            "--instance", instance, "--pid", str(os.getpid()), "--interval", str(interval_s),
        ]  # fmt: skip
        self._instance = instance
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process; a failure is logged (the heartbeat thread still beats)."""
        try:
            # SIGINT ignored from the start: a Ctrl-C during its imports would print a
            # KeyboardInterrupt traceback (its own handler comes after them)
            self._process = subprocess.Popen(
                self._command, env=self._env, stdin=subprocess.DEVNULL, preexec_fn=start_child
            )
        except OSError as exc:
            logger.warning("instance %s: heartbeat process not started (%s)", self._instance, exc)

    def check(self) -> None:
        """Start the process again if it exited (killed by hand or by the OOM killer),
        with a log line; called by the heartbeat thread each beat."""
        process = self._process
        if process is not None and process.poll() is not None:
            logger.warning(
                "instance %s: heartbeat process exited (%s); starting it again",
                self._instance,
                process.returncode,
            )
            self.start()

    def stop(self) -> None:
        """SIGTERM the process and wait for it (bounded by :data:`STOP_TIMEOUT_S`, then
        SIGKILL)."""
        process, self._process = self._process, None
        if process is not None:
            terminate([process], STOP_TIMEOUT_S)


def main(argv: list[str] | None = None) -> int:
    """Set the instance's heartbeat every ``--interval`` s while the instance lives.

    :meth:`Pulse.start` starts it with SIGINT ignored and ``PR_SET_PDEATHSIG``
    (:func:`gpu_workers.processes.start_child`): the pulse stops with its instance
    (SIGTERM from it, or with its death), not at a terminal's Ctrl-C, which the
    instance's heartbeat thread would take for a pulse that died, and start it again
    with a warning."""
    parser = argparse.ArgumentParser(prog="python -m sluice.gpu_workers.pulse", description=__doc__)
    parser.add_argument("--key", required=True, help="the version's instances hash")
    parser.add_argument("--instance", required=True, help="the instance's field in it")
    parser.add_argument("--pid", required=True, type=int, help="the instance's process id")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between beats")
    args = parser.parse_args(argv)
    # at once, whatever runs: a SystemExit raised inside redis-py's clean-up would print
    # an "Exception ignored" traceback; the kernel closes the socket
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    client = sync_client(
        os.environ[_URL_ENV], protocol=2, socket_timeout=max(1.0, args.interval * 2)
    )
    bump = client.register_script(_BUMP)
    while os.getppid() == args.pid:  # reparented: the instance is gone
        # the instance's own heartbeat thread logs Redis outages
        with contextlib.suppress(redis.exceptions.RedisError):
            bump(keys=[args.key], args=[args.instance, args.pid, time.time_ns()])
        time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
