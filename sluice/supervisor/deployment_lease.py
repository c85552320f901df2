"""One ``sluice serve`` per key prefix: a lease held in Redis while the supervisor runs.

``sluice serve`` owns its deployment's state: at start it forgets what an earlier
server with the same key prefix left, at exit it marks every version unloaded. Two
supervisors on one prefix would undo each other, so the second one refuses to start
while the first holds the lease (``SET key owner NX PX``), renewed by a thread every
:data:`RENEW_S` and released at a clean exit; after a crash it lapses within
:data:`LEASE_MS` (a server started on the same host meanwhile waits for that when the
holder's process is gone, instead of refusing to start). A lease that lapsed while its
server lives (Redis stalled past :data:`LEASE_MS`, or restarted without its data) is
taken back at the next renewal, unless another server took it meanwhile. Gateways and
instances started on their own (scale-out) take no lease.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time

import redis

from sluice.broker.outage import OutageLog

logger = logging.getLogger(__name__)

#: the lease lapses this long after its last renewal, in ms.
LEASE_MS = 5000
#: renewal period, in s.
RENEW_S = 1.0

#: 1: renewed; 2: it had lapsed and was taken back; 0: another server holds it.
_RENEW = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _exited_here(owner: str) -> bool:
    """Whether lease holder ``owner`` (``host H pid P …``) names this host and a process
    that no longer exists: a ``sluice serve`` killed here, whose lease lapses within
    :data:`LEASE_MS`. Only waited for, never taken: another machine may share the name."""
    match = re.match(r"host (\S+) pid (\d+)\b", owner)
    if match is None or match.group(1) != socket.gethostname():
        return False
    try:
        os.kill(int(match.group(2)), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # it exists (another user's process)
    return False


class DeploymentTaken(RuntimeError):
    """Another ``sluice serve`` holds the lease of this key prefix."""


class DeploymentLease:
    """The lease of one key prefix.

    Args:
        client: a synchronous Redis client.
        key: the lease key (``KeySchema.deployment``).
        owner: who holds it, as other servers will report it (host, pid, ports).
    """

    def __init__(self, client: redis.Redis, key: str, owner: str) -> None:
        self._client = client
        self._key = key
        self.owner = owner
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._waiting_for = ""

    def acquire(self) -> None:
        """Take the lease and start renewing it.

        Raises:
            DeploymentTaken: another server holds it; the message names that server.
            redis.exceptions.RedisError: Redis unreachable.
        """
        deadline = time.monotonic() + LEASE_MS / 1000 + 1.0
        while not self._client.set(self._key, self.owner, nx=True, px=LEASE_MS):
            holder = self._client.get(self._key)
            who = holder.decode() if isinstance(holder, bytes) else "a server that just stopped"
            if not _exited_here(who) or time.monotonic() >= deadline:
                raise DeploymentTaken(who)
            if self._waiting_for != who:
                self._waiting_for = who
                logger.info(
                    "the deployment lease is held by %s, which exited without releasing "
                    "it; waiting up to %.0f s for it to lapse",
                    who,
                    LEASE_MS / 1000,
                )
            time.sleep(0.1)
        self._thread = threading.Thread(target=self._renew_forever, name="lease", daemon=True)
        self._thread.start()

    def _renew_forever(self) -> None:
        lost = False
        outage = OutageLog(logger, "deployment lease renewal")
        while not self._stop.wait(RENEW_S):
            try:
                outcome = self._renew(keys=[self._key], args=[self.owner, LEASE_MS])
            except redis.exceptions.RedisError as exc:
                outage.failed(exc)
                continue
            outage.ok()
            if outcome == 2:
                logger.warning(
                    "the deployment lease %s had lapsed (Redis stalled or lost its data); "
                    "taken back",
                    self._key,
                )
            elif outcome == 0 and not lost:
                logger.error(
                    "the deployment lease %s was lost: %s holds it now; two servers on one "
                    "key prefix undo each other's state",
                    self._key,
                    self._client.get(self._key),
                )
            lost = outcome == 0

    def release(self) -> None:
        """Stop renewing and delete the lease if this server still holds it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            try:
                self._release(keys=[self._key], args=[self.owner])
            except redis.exceptions.RedisError as exc:
                logger.warning("cannot release the deployment lease: %s", exc)
