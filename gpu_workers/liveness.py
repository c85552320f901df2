"""Instance heartbeats and recovery of the work a dead instance left pending.

Each instance writes its state with a wall-clock heartbeat to the version's
instances hash every second, from a thread of its own (so a long execution
does not stop it); :mod:`gpu_workers.pulse` also sets the heartbeat from a process of
its own, for an execution that holds the GIL. Between batches, the instance loop asks
:meth:`Liveness.recover` for work: every ``recover_interval_s`` it looks for instances
whose heartbeat is older than ``stale_after_s`` (or that reported STOPPED / UNAVAILABLE)
and claims their pending entries (``XCLAIM``), so a SIGKILLed instance loses no request.

Heartbeats are wall-clock times, so a Redis that stalls or restarts makes every
instance's heartbeat look old at once. An instance whose own heartbeat write failed
or took longer than ``beat_interval_s`` therefore claims nothing for ``stale_after_s``
after it: long enough for every live instance to beat again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import redis.exceptions

from sluice.broker.consumer import Delivery, StreamConsumer
from sluice.broker.model_store import ModelStore
from sluice.broker.outage import OutageLog
from sluice.broker.states import RETIRED_HOLDING, InstanceState
from sluice.gpu_workers.pulse import Pulse

logger = logging.getLogger(__name__)


class Liveness:
    """Heartbeat writer and dead-instance recovery of one instance.

    Args:
        store: model/instance records in Redis.
        model: model name.
        version: model version.
        instance: this instance's name (its consumer name).
        consumer: this instance's stream consumer (claims go to it).
        stale_after_s: heartbeat age after which another instance is taken for dead, in s.
        beat_interval_s: how often this instance writes its heartbeat, in s.
        recover_interval_s: how often to look for dead instances, in s.
        pulse: the instance's pulse process (:mod:`gpu_workers.pulse`), started, watched
            each beat and stopped with the heartbeat thread; None: the thread alone.
        sequence_stream: instance name -> its sequence stream (sequence batching): a dead
            instance's stream is adopted, so the steps queued for it run here; None: the
            model has no sequence batching.
    """

    def __init__(
        self,
        store: ModelStore,
        model: str,
        version: int,
        instance: str,
        consumer: StreamConsumer,
        stale_after_s: float = 5.0,
        beat_interval_s: float = 1.0,
        recover_interval_s: float = 1.0,
        pulse: Pulse | None = None,
        sequence_stream: Callable[[str], str] | None = None,
    ) -> None:
        self._sequence_stream = sequence_stream
        self._store = store
        self._model = model
        self._version = version
        self._instance = instance
        self._consumer = consumer
        self._stale_ns = int(stale_after_s * 1e9)
        self._beat_s = beat_interval_s
        self._beat_outage = OutageLog(logger, "heartbeat")
        self._recover_outage = OutageLog(logger, "pending-entry recovery")
        self._recover_ns = int(recover_interval_s * 1e9)
        self._next_recover_ns = 0
        #: monotonic ns of the last Redis call here that failed or was slow (0: none)
        self._disrupted_ns = 0
        #: monotonic ns when the heartbeat write in progress started (0: none)
        self._beat_started_ns = 0
        self._pulse = pulse
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat_forever, name="sluice-heartbeat", daemon=True
        )

    def beat(self, state: InstanceState = InstanceState.READY) -> None:
        """Write this instance's state and heartbeat now."""
        self._store.set_instance(
            self._model,
            self._version,
            self._instance,
            {"state": state, "reason": "", "pid": os.getpid(), "heartbeat_ns": time.time_ns()},
        )

    def start(self) -> None:
        """Start the heartbeat thread."""
        self.beat()
        self._thread.start()
        if self._pulse is not None:
            self._pulse.start()

    def stop(self) -> None:
        """Stop the heartbeat thread (bounded by one beat interval)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._beat_s + 1)
        if self._pulse is not None:
            self._pulse.stop()

    def _beat_forever(self) -> None:
        wait_s = self._beat_s
        while not self._stop.wait(wait_s):
            wait_s = self._beat_s
            if self._pulse is not None:
                self._pulse.check()
            started = self._beat_started_ns = time.monotonic_ns()
            try:
                self.beat()
            except redis.exceptions.RedisError as exc:
                self._beat_outage.failed(exc)
                self._disrupted_ns = time.monotonic_ns()
                continue
            finally:
                self._beat_started_ns = 0
            self._beat_outage.ok()
            if time.monotonic_ns() - started > self._beat_s * 1e9:
                logger.warning(
                    "heartbeat took %.1f s: not taking other instances for dead for %.1f s",
                    (time.monotonic_ns() - started) / 1e9,
                    self._stale_ns / 1e9,
                )
                self._disrupted_ns = time.monotonic_ns()
                # the heartbeat just written is as old as the stall: write a fresh one
                # now, or the gateways take this instance for dead (model and server
                # not ready) for one more interval after Redis answers again
                wait_s = 0

    def in_grace(self) -> bool:
        """Whether Redis stalled or failed for this instance within ``stale_after_s`` (a
        heartbeat write failed, took longer than ``beat_interval_s``, or is taking that
        long now): then every other heartbeat may look old only because of Redis."""
        now = time.monotonic_ns()
        started = self._beat_started_ns
        if started and now - started > self._beat_s * 1e9:
            self._disrupted_ns = now
        return bool(self._disrupted_ns) and now - self._disrupted_ns < self._stale_ns

    def recover(self) -> list[Delivery]:
        """Claim the pending entries of dead instances (at most every ``recover_interval_s``)."""
        now = time.time_ns()
        if now < self._next_recover_ns:
            return []
        self._next_recover_ns = now + self._recover_ns
        claimed: list[Delivery] = []
        try:
            started = time.monotonic_ns()
            instances = self._store.instances(self._model, self._version)
            if time.monotonic_ns() - started > self._beat_s * 1e9:
                self._disrupted_ns = time.monotonic_ns()  # the read itself waited on Redis
            if self.in_grace():
                return claimed
            for name, info in instances.items():
                if name == self._instance:
                    continue
                beat = int(info.get("heartbeat_ns", 0))
                dead = info.get("state") in (InstanceState.STOPPED, InstanceState.UNAVAILABLE) or (
                    beat and now - beat > self._stale_ns
                )
                if dead:
                    if self._sequence_stream is not None and self._consumer.adopt(
                        self._sequence_stream(name)
                    ):
                        logger.warning("adopted the sequence stream of instance %s", name)
                    taken = self._consumer.claim_from(name, min_idle_ms=0)
                    claimed.extend(taken)
                    if not taken and info.get("reason") == RETIRED_HOLDING:
                        # its entries were taken (by a cycle before, or by a peer): the
                        # record has served its purpose
                        self._store.forget_instances(self._model, self._version, [name])
            self._recover_outage.ok()
        except redis.exceptions.RedisError as exc:
            self._recover_outage.failed(exc)
            self._disrupted_ns = time.monotonic_ns()
        return claimed
