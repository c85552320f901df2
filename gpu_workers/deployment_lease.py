"""One ``sluice serve`` per key prefix: a lease held in Redis while the supervisor runs.

``sluice serve`` owns its deployment's state: at start it forgets what an earlier
server with the same key prefix left, at exit it marks every version unloaded. Two
supervisors on one prefix would undo each other, so the second one refuses to start
while the first holds the lease (``SET key owner NX PX``), renewed by a thread every
:data:`RENEW_S` and released at a clean exit; after a crash it lapses within
:data:`LEASE_MS`. Gateways and instances started on their own (scale-out) take no lease.
"""

from __future__ import annotations

import logging
import threading

import redis

logger = logging.getLogger(__name__)

#: the lease lapses this long after its last renewal, in ms.
LEASE_MS = 5000
#: renewal period, in s.
RENEW_S = 1.0

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


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

    def acquire(self) -> None:
        """Take the lease and start renewing it.

        Raises:
            DeploymentTaken: another server holds it; the message names that server.
            redis.exceptions.RedisError: Redis unreachable.
        """
        if not self._client.set(self._key, self.owner, nx=True, px=LEASE_MS):
            holder = self._client.get(self._key)
            who = holder.decode() if isinstance(holder, bytes) else "a server that just stopped"
            raise DeploymentTaken(who)
        self._thread = threading.Thread(target=self._renew_forever, name="lease", daemon=True)
        self._thread.start()

    def _renew_forever(self) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                if not self._renew(keys=[self._key], args=[self.owner, LEASE_MS]):
                    logger.error(
                        "the deployment lease %s was lost (held by %s now)",
                        self._key,
                        self._client.get(self._key),
                    )
            except redis.exceptions.RedisError as exc:
                logger.warning("cannot renew the deployment lease: %s", exc)

    def release(self) -> None:
        """Stop renewing and delete the lease if this server still holds it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            try:
                self._release(keys=[self._key], args=[self.owner])
            except redis.exceptions.RedisError as exc:
                logger.warning("cannot release the deployment lease: %s", exc)
