"""The instance loop: consume → batch → execute → reply → acknowledge. Owns the real clock.

The loop feeds the pure :class:`batching.DynamicBatcher` (through
:class:`~sluice.gpu_workers.batch_assembly.BatchAssembly`) with what it reads off the
model version's streams and runs the batches it hands back (Triton's dynamic batcher;
without ``dynamic_batching`` every request is its own batch, Triton's default
scheduler), counting each in :class:`~sluice.gpu_workers.accounting.Accounting`. Time
is wall-clock ns (``time.time_ns``) because arrival times are stamped by the gateway,
another process.

A request whose queue timeout passed (REJECT) or whose deadline passed is
answered with UNAVAILABLE "Request timeout expired" and not executed; one whose
deadline passed while it executed gets the same answer and counts as a failure
(reason REJECTED), as its client was already told so by the gateway. Running a batch
and answering it: :mod:`gpu_workers.execution`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import redis.exceptions

from sluice.batching import Batch
from sluice.broker.consumer import Delivery, StreamConsumer
from sluice.broker.errors import BROKER_OUTAGE, stream_gone
from sluice.broker.outage import OutageLog
from sluice.broker.request_checks import RequestRules
from sluice.broker.scheduling import ShapeKeys, StreamLayout
from sluice.broker.stats_store import StatsShard
from sluice.gpu_workers.accounting import Accounting
from sluice.gpu_workers.answers import Answers
from sluice.gpu_workers.backends.base import Backend
from sluice.gpu_workers.batch_assembly import BatchAssembly, Failure
from sluice.gpu_workers.execution import Execution
from sluice.gpu_workers.sequence_assembly import SequenceAssembly

logger = logging.getLogger(__name__)

#: longest single blocking read, in ms, so a stop request is seen quickly.
HEARTBEAT_MS = 200
#: first and longest wait between attempts to reach a lost Redis again, in s.
REDIS_RETRY_MIN_S = 0.05
REDIS_RETRY_MAX_S = 2.0
#: longest local sleep between two non-blocking reads inside a delay window, in ns.
POLL_NS = 500_000
#: shortest and first estimate of one non-blocking read's time (the lead of a delay
#: window's last read), in ns.
READ_LEAD_MIN_NS = 50_000
READ_LEAD_START_NS = 200_000
#: longest busy wait for a delay window to close, in ns (only after its last read).
SPIN_MAX_NS = 150_000
#: a stopping instance leaves once its streams stayed empty this long, in ns.
DRAIN_QUIET_NS = 300_000_000
#: a stopping instance takes queued entries for at most this long by default, in ns.
DRAIN_LIMIT_NS = 5_000_000_000


class InstanceLoop:
    """Serves one model version with one backend instance until stopped.

    Args:
        consumer: this instance's stream consumer.
        backend: the initialized backend.
        layout: the version's streams and scheduling policy.
        shape_keys: builds batch-compatibility keys from a request's inputs.
        output_datatypes: output name -> protocol datatype (from the config).
        stats: this instance's statistics (None: nothing is counted).
        batching: whether the model has a batch dimension (``max_batch_size`` > 0).
        clock: wall-clock ns; injectable for tests.
        load_id: the model load this instance belongs to, stamped on its answers
            (``InferResponseMessage.load_id``).
        rules: the instance's config checks: a request that a gateway checked against
            another load (``InferRequestMessage.load_id``, during a reload) is checked
            again against them and refused with their error (None: not checked).
        sequences: a model with sequence batching: its steps, controls and state (None:
            dynamic batching or the default scheduler).
    """

    def __init__(
        self,
        consumer: StreamConsumer,
        backend: Backend,
        layout: StreamLayout,
        shape_keys: ShapeKeys,
        output_datatypes: dict[str, str],
        stats: StatsShard | None,
        batching: bool,
        clock: Callable[[], int] = time.time_ns,
        load_id: str = "",
        rules: RequestRules | None = None,
        sequences: SequenceAssembly | None = None,
    ) -> None:
        self._consumer = consumer
        self._model = layout.model
        self._clock = clock
        self._assembly: BatchAssembly | SequenceAssembly = (
            BatchAssembly(layout, shape_keys, batching, load_id, rules)
            if sequences is None
            else sequences
        )
        self._accounts = Accounting(layout, stats)
        self._execution = Execution(
            consumer,
            backend,
            layout.model,
            clock,
            Answers(layout.model, layout.version, load_id, output_datatypes, batching),
            self._accounts,
            self._assembly,
            sequences,
        )
        self._read_count = max(1, layout.policy.max_batch_size)
        #: several priority levels (one stream each): a batch is formed only after a read
        #: that followed the last execution (see :meth:`step`)
        self._levels = len(layout.levels()) > 1
        self._read_since_execution = False
        self._read_ns = READ_LEAD_START_NS  # see _poll
        self._oversleep_ns = 0  # see _sleep
        self.stopping = threading.Event()
        #: set with :attr:`stopping` when the instance is replaced by a newer one that
        #: serves the same streams (a reload): it runs what it holds and reads no more
        self.handing_over = False
        #: longest graceful drain after :attr:`stopping` is set, in ns.
        self.drain_limit_ns = DRAIN_LIMIT_NS
        #: when the stop was asked for (clock ns; 0: when the drain starts): the drain
        #: limit counts from here, as the supervisor's exit timeout does
        self.stop_requested_ns = 0
        #: output name -> class labels (Triton ``label_filename``), for classification.
        self.labels: dict[str, list[str]] = {}
        #: called between iterations (pending-entry recovery); returns deliveries to admit.
        self.housekeeping: Callable[[], list[Delivery]] | None = None

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        """Loop until :attr:`stopping` is set, then run what is held and return.

        A Redis that cannot be reached (lost, restarted, stalled past the socket timeout)
        is tried again with backoff up to :data:`REDIS_RETRY_MAX_S`, the model and the
        held requests kept; then :meth:`_resume` sends the deferred answers and takes back
        what a lost read delivered. A vanished consumer group is created again.
        """
        self.admit(self._consumer.read_own_pending())
        try:
            lost_since = 0.0
            backoff_s = REDIS_RETRY_MIN_S
            while not self.stopping.is_set():
                try:
                    if lost_since:
                        self._resume()
                        logger.warning(
                            "model '%s': Redis answers again after %.1f s",
                            self._model,
                            time.monotonic() - lost_since,
                        )
                        lost_since, backoff_s = 0.0, REDIS_RETRY_MIN_S
                    self.step()
                except BROKER_OUTAGE as exc:
                    self._accounts.registration_lost()
                    if not lost_since:
                        lost_since = time.monotonic()
                        logger.warning(
                            "model '%s': Redis unreachable (%s); trying again", self._model, exc
                        )
                    self.stopping.wait(backoff_s)
                    backoff_s = min(backoff_s * 2, REDIS_RETRY_MAX_S)
                except redis.exceptions.ResponseError as exc:
                    if not stream_gone(exc):
                        raise
                    logger.warning(
                        "model '%s': consumer group missing (Redis lost its data?); "
                        "creating it again",
                        self._model,
                    )
                    self._consumer.ensure_groups()
                    self._accounts.registration_lost()
            self.drain()
        finally:
            self._consumer.defer(self._accounts.flush_latencies(self._clock(), force=True))
            self._flush_kept()  # what cannot be sent stays pending in Redis for recovery

    def _resume(self) -> None:
        """After Redis was unreachable: send the deferred answers and acknowledgements, then
        admit this instance's pending entries (a lost read's; those held are skipped).

        Raises:
            redis.exceptions.RedisError: Redis still unreachable.
        """
        self._consumer.flush()
        self.admit(self._consumer.read(count=1000, block_ms=None, own_pending=True))

    def step(self) -> None:
        """One iteration: expire, run a ready batch, or read more (bounded wait)."""
        now = self._clock()
        self._expire(now)
        if self._levels and self._assembly.held and not self._read_since_execution:
            # Triton keeps one priority queue per model. A read takes at most a batch from
            # each level's stream, so what this instance holds may be a lower level's
            # request while a higher level's wait unread: read once more before choosing
            # (it also sends the previous batch's answers)
            self.admit(self._poll(max(1, self._read_count - len(self._assembly))))
            now = self._clock()
        batch = self._assembly.take(now)
        if batch is not None:
            try:
                self._consumer.flush()  # the previous batch's replies go out before it runs
            except redis.exceptions.RedisError:
                # no longer held, so that _resume admits them again from this
                # instance's pending entries once Redis answers
                self._assembly.release(batch)
                raise
            self._execute(batch)
            self._read_since_execution = False
            return
        if self.housekeeping is not None:
            self.admit(self.housekeeping())
        wake = self._assembly.wake_at(now)
        room = max(1, self._read_count - len(self._assembly))
        if wake is None:
            # latency observations wait at most ~1 s when idle
            self._consumer.defer(self._accounts.flush_latencies(now))
            # Nothing held: block until a request arrives (Redis wakes blocked readers at
            # once on XADD; only the timeout is coarse, so it is a heartbeat, not a delay).
            self.admit(self._consumer.read(count=room, block_ms=HEARTBEAT_MS))
            self._read_since_execution = True
            return
        # Inside a delay window: Redis resolves BLOCK timeouts only on its own event-loop
        # ticks (up to 100 ms at hz 10), so poll without blocking and sleep locally.
        deliveries = self._poll(room)
        if deliveries:
            self.admit(deliveries)
            return
        remaining_ns = wake - self._clock()
        if remaining_ns <= 0:
            return
        lead_ns = self._read_ns + self._oversleep_ns
        if remaining_ns > POLL_NS + lead_ns:
            self._sleep(POLL_NS)
            return
        # The window's last read, sent so that it is answered about when the window
        # closes; then the batch starts when the delay runs out (Triton's batch holds
        # every request enqueued before that), not a sleep's wake-up and a round trip
        # later.
        if remaining_ns > lead_ns:
            self._sleep(remaining_ns - lead_ns)
        self.admit(self._poll(room))
        now = self._clock()
        due = self._assembly.wake_at(now)
        if due is None or due <= now or due - now > POLL_NS:
            return
        if due - now > SPIN_MAX_NS:
            self._sleep(due - now - self._oversleep_ns)
        spin_until = time.perf_counter_ns() + SPIN_MAX_NS
        while self._clock() < due and time.perf_counter_ns() < spin_until:
            pass  # the last µs: a sleep would overshoot them

    def _sleep(self, ns: int) -> None:
        """Sleep ``ns`` ns; keeps :attr:`_oversleep_ns`, a moving estimate of how much
        longer a sleep takes than asked (timer slack, wake-up), in ns."""
        started = time.perf_counter_ns()
        time.sleep(max(0, ns) / 1e9)
        over = time.perf_counter_ns() - started - ns
        self._oversleep_ns = min(POLL_NS // 2, max(0, (7 * self._oversleep_ns + over) // 8))

    def _poll(self, room: int) -> list[Delivery]:
        """A read that does not wait; keeps :attr:`_read_ns`, a moving estimate of how
        long one that finds nothing takes (a round trip), in ns."""
        started = time.perf_counter_ns()
        deliveries = self._consumer.read(count=room, block_ms=None)
        self._read_since_execution = True
        if not deliveries:
            took = time.perf_counter_ns() - started
            self._read_ns = min(POLL_NS, max(READ_LEAD_MIN_NS, (7 * self._read_ns + took) // 8))
        return deliveries

    def drain(self) -> None:
        """Graceful stop: run what is held and what is still queued, ignoring delay windows.

        Like Triton, which finishes queued requests before an instance goes away, the
        instance keeps taking entries off its streams until they have been empty for
        :data:`DRAIN_QUIET_NS` (gateways refuse new requests once they are stopping;
        time spent executing does not count as quiet), for at most
        :attr:`drain_limit_ns` from :attr:`stop_requested_ns` (``sluice serve`` sets it
        from ``--exit-timeout-secs``).
        Entries left after that stay pending in Redis for another instance.
        When :attr:`handing_over`, the instance only runs what it holds: the queued
        entries are the newer instances' (after a reload they answer with the new model
        and config at once, instead of sharing the stream with the old ones until the
        queue stays empty, which under steady load it never does).
        """
        far = self._clock() + 10**15
        outage = OutageLog(logger, f"model '{self._model}' (draining)")
        start = self.stop_requested_ns or self._clock()
        quiet_since = self._clock()
        while True:
            ran = False
            while (batch := self._assembly.take(far)) is not None:
                self._flush_kept()
                self._execute(batch)
                ran = True
            if self.handing_over:
                return
            now = self._clock()
            if ran:
                quiet_since = now
            if now - quiet_since >= DRAIN_QUIET_NS or now - start >= self.drain_limit_ns:
                return
            try:
                deliveries = self._consumer.read(count=self._read_count, block_ms=None)
            except BROKER_OUTAGE as exc:
                # what a lost read delivered stays pending: another instance claims it
                outage.failed(exc)
                time.sleep(REDIS_RETRY_MIN_S)
                continue
            outage.ok()
            if deliveries:
                self.admit(deliveries)
                quiet_since = self._clock()
            else:
                time.sleep(POLL_NS / 1e9)

    def _flush_kept(self) -> None:
        """Send the deferred answers (before an execution while draining, and last); when
        Redis cannot be reached they are kept for a later flush. After the last one their
        entries stay pending in Redis, and another instance (or this one, restarted)
        runs them again."""
        try:
            self._consumer.flush()
        except BROKER_OUTAGE as exc:
            logger.warning(
                "model '%s': answers held back, Redis unreachable (%s)", self._model, exc
            )

    def admit(self, deliveries: Sequence[Delivery]) -> None:
        """Offer each delivery to the batcher; answer refusals at once."""
        admission = self._assembly.admit(deliveries, self._clock())
        if admission.refused:
            self._fail(admission.refused)
        if admission.checks_refused:
            self._fail(admission.checks_refused, counted=False)

    def _expire(self, now: int) -> None:
        failures = self._assembly.expire(now)
        if failures:
            self._fail(failures)

    def _fail(self, failures: Sequence[Failure], counted: bool = True) -> None:
        self._execution.fail(failures, counted)

    def _execute(self, batch: Batch) -> None:
        self._execution.execute(batch, self.labels)
