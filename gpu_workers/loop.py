"""The instance loop: consume → batch → execute → reply → acknowledge. Owns the real clock.

The loop feeds the pure :class:`batching.DynamicBatcher` with what it reads
off the model version's streams and runs the batches it hands back (Triton's
dynamic batcher; without ``dynamic_batching`` every request is its own batch,
Triton's default scheduler). Time is wall-clock ns (``time.time_ns``) because
arrival times are stamped by the gateway, another process.

A request whose queue timeout passed (REJECT) or whose deadline passed is
answered with UNAVAILABLE "Request timeout expired" and not executed; one whose
deadline passed while it executed gets the same answer and counts as a failure
(reason REJECTED), as its client was already told so by the gateway.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import redis.exceptions

from sluice.batching import Batch, DynamicBatcher, Pending, Rejected
from sluice.broker.consumer import Delivery, StreamConsumer
from sluice.broker.datatypes import config_to_protocol, serialize_bytes, to_numpy
from sluice.broker.errors import FailureReason, SluiceError, failure_reason, stream_gone
from sluice.broker.latency_window import LatencyRecorder
from sluice.broker.messages import (
    ErrorInfo,
    InferRequestMessage,
    InferResponseMessage,
    RequestedOutput,
    WireTensor,
)
from sluice.broker.outage import OutageLog
from sluice.broker.request_checks import RequestRules, validate_request
from sluice.broker.scheduling import ShapeKeys, StreamLayout
from sluice.broker.stats_store import ExecutionTimes, StatsDelta, StatsShard
from sluice.gpu_workers.backends.base import Backend, InferError, InferRequest, InferResponse
from sluice.gpu_workers.classification import classify

logger = logging.getLogger(__name__)

#: longest single blocking read, in ms, so a stop request is seen quickly.
HEARTBEAT_MS = 200
#: an entry handed out more often than this (its instance died each time) is failed.
MAX_DELIVERIES = 2
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


def _wire(name: str, datatype: str, array: np.ndarray) -> WireTensor:
    # tobytes() writes C order whatever the array's layout
    data = serialize_bytes(array.reshape(-1)) if datatype == "BYTES" else array.tobytes()
    return WireTensor(name, datatype, array.shape, data)


def output_datatypes(config: object) -> dict[str, str]:
    """Output name -> protocol datatype of a ``ModelConfig``."""
    from sluice.gpu_workers.backends.tensor_adapter import model_config_type_name

    return {
        o.name: config_to_protocol(model_config_type_name(o.data_type))
        for o in config.output  # type: ignore[attr-defined]
    }


@dataclass(slots=True)
class _Held:
    delivery: Delivery
    batch_size: int


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
    ) -> None:
        self._consumer = consumer
        self._backend = backend
        self._layout = layout
        self._model = layout.model
        self._version = layout.version
        self._shape_keys = shape_keys
        self._output_datatypes = output_datatypes
        self._stats = stats
        self._batching = batching
        self._clock = clock
        self._batcher = DynamicBatcher(layout.policy)
        self._load_id = load_id
        self._rules = rules
        #: latency histograms of the summary metrics (None: nothing is counted)
        self._latencies = (
            LatencyRecorder(layout.keys.latency_window(layout.model, layout.version))
            if stats is not None
            else None
        )
        self._held: dict[str, _Held] = {}
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

        A Redis that cannot be reached (connection lost, restarted, stalled past the
        client's socket timeout) is tried again with backoff up to
        :data:`REDIS_RETRY_MAX_S` while the instance keeps its model loaded and the
        requests it holds; once Redis answers, :meth:`_resume` sends the deferred
        answers and takes back the entries a lost read had delivered. A consumer group
        that vanished (a Redis restarted without its data) is created again.
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
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                    if self._stats is not None:
                        self._stats.registered = False  # Redis may come back without it
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
                    if self._stats is not None:
                        self._stats.registered = False
            self.drain()
        finally:
            if self._latencies is not None:
                self._consumer.defer(self._latencies.flush(self._clock(), force=True))
            self._flush_kept()  # what cannot be sent stays pending in Redis for recovery

    def _resume(self) -> None:
        """After Redis was unreachable: send the deferred answers and acknowledgements,
        then admit this instance's pending entries (a read whose reply was lost delivered
        them; those already held are skipped).

        Raises:
            redis.exceptions.RedisError: Redis still unreachable.
        """
        self._consumer.flush()
        self.admit(self._consumer.read(count=1000, block_ms=None, own_pending=True))

    def step(self) -> None:
        """One iteration: expire, run a ready batch, or read more (bounded wait)."""
        now = self._clock()
        self._expire(now)
        if self._levels and self._held and not self._read_since_execution:
            # Triton keeps one priority queue per model. A read takes at most a batch from
            # each level's stream, so what this instance holds may be a lower level's
            # request while a higher level's wait unread: read once more before choosing
            # (it also sends the previous batch's answers)
            self.admit(self._poll(max(1, self._read_count - len(self._held))))
            now = self._clock()
        batch = self._batcher.take(now)
        if batch is not None:
            self._consumer.flush()  # the previous batch's replies go out before this one runs
            self._execute(batch)
            self._read_since_execution = False
            return
        if self.housekeeping is not None:
            self.admit(self.housekeeping())
        wake = self._batcher.wake_at(now)
        room = max(1, self._read_count - len(self._held))
        if wake is None:
            if self._latencies is not None:  # observations wait at most ~1 s when idle
                self._consumer.defer(self._latencies.flush(now))
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
        # later (~100 µs each on a VM).
        if remaining_ns > lead_ns:
            self._sleep(remaining_ns - lead_ns)
        self.admit(self._poll(room))
        now = self._clock()
        due = self._batcher.wake_at(now)
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
            while (batch := self._batcher.take(far)) is not None:
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
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
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
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            logger.warning(
                "model '%s': answers held back, Redis unreachable (%s)", self._model, exc
            )

    def admit(self, deliveries: Sequence[Delivery]) -> None:
        """Offer each delivery to the batcher; answer refusals at once."""
        refused: list[tuple[Delivery, str, str]] = []
        #: refused by the config checks: not counted, as a gateway's refusals are not
        checks_refused: list[tuple[Delivery, str, str]] = []
        held = self._held
        offer = self._batcher.offer
        key = self._shape_keys.key
        now = self._clock()
        for delivery in deliveries:
            message = delivery.message
            if message.request_id in held:  # claimed twice; keep the first
                continue
            if delivery.deliveries > MAX_DELIVERIES:
                refused.append(
                    (
                        delivery,
                        "INTERNAL",
                        f"model '{self._model}': an instance exited while running this "
                        f"request ({delivery.deliveries - 1} attempts); not running it "
                        "again",
                    )
                )
                continue
            if (
                self._rules is not None
                and message.load_id
                and self._load_id
                and message.load_id != self._load_id
            ):
                refusal = self._recheck(message)
                if refusal is not None:
                    checks_refused.append((delivery, refusal.code.value, refusal.message))
                    continue
            inputs = message.inputs
            batch_size = 0
            if self._batching and inputs:
                batch_size = int(inputs[0].shape[0]) if inputs[0].shape else 0
            parameters = message.parameters
            timeout = parameters.get("timeout") if parameters else None
            pending = Pending(
                message.request_id,
                batch_size,
                key(inputs),
                message.enqueued_ns,
                int(parameters.get("priority", 0) or 0) if parameters else 0,
                int(timeout) if isinstance(timeout, int) and timeout > 0 else None,
            )
            admission = offer(pending, now)
            if isinstance(admission, Rejected):
                refused.append((delivery, admission.code, admission.reason))
            else:
                held[message.request_id] = _Held(delivery, batch_size)
        if refused:
            self._fail(refused)
        if checks_refused:
            self._fail(checks_refused, counted=False)

    def _recheck(self, message: InferRequestMessage) -> SluiceError | None:
        """The error of a request checked by a gateway against another load of the model,
        under this instance's config (Triton's texts, ``broker.request_checks``), or None.
        """
        assert self._rules is not None
        requested = [
            RequestedOutput(name, class_count=message.classification.get(name, 0))
            for name in message.outputs
        ]
        try:
            validate_request(self._rules, message.inputs, requested)
        except SluiceError as exc:
            logger.debug(
                "request %s of model '%s' was checked against load %s, not %s: %s",
                message.request_id,
                self._model,
                message.load_id,
                self._load_id,
                exc.message,
            )
            return exc
        return None

    # -- answers -----------------------------------------------------------------------------

    def _expire(self, now: int) -> None:
        expired = self._batcher.expired(now)
        late = [h for h in self._held.values() if h.delivery.message.deadline_ns <= now]
        failures: list[tuple[Delivery, str, str]] = []
        for item in expired:
            held = self._held.pop(item.item.id, None)
            if held is not None:
                failures.append((held.delivery, "UNAVAILABLE", item.reason))
        for held in late:
            if self._batcher.cancel(held.delivery.message.request_id) is not None:
                self._held.pop(held.delivery.message.request_id, None)
                failures.append((held.delivery, "UNAVAILABLE", "Request timeout expired"))
        if failures:
            self._fail(failures)

    def _error(self, request_id: str, code: str, message: str) -> InferResponseMessage:
        return InferResponseMessage(
            request_id, self._model, self._version, error=ErrorInfo(code, message)
        )

    def _fail(self, failures: Sequence[tuple[Delivery, str, str]], counted: bool = True) -> None:
        """Answer each ``(delivery, code, text)`` with its error and acknowledge it;
        ``counted``: as a failure in the statistics (Triton counts no request its checks
        refused before it was queued)."""
        now = self._clock()
        replies = [
            (d.message.reply_to, self._error(d.message.request_id, code, text))
            for d, code, text in failures
        ]

        delta = StatsDelta()
        for delivery, code, text in failures:
            logger.debug(
                "request %s (client id '%s') of model '%s' failed: %s: %s",
                delivery.message.request_id,
                delivery.message.client_id,
                self._model,
                code,
                text,
            )
            if counted:
                delta.failure(
                    request_ns=now - delivery.message.enqueued_ns,
                    reason=failure_reason(code),
                )
        self._consumer.finish(replies, [d for d, _, _ in failures], self._stats, delta)

    # -- execution ---------------------------------------------------------------------------

    def _execute(self, batch: Batch) -> None:
        held = [self._held.pop(item.id) for item in batch.items]
        start = self._clock()
        late = [h for h in held if h.delivery.message.deadline_ns <= start]
        if late:
            self._fail([(h.delivery, "UNAVAILABLE", "Request timeout expired") for h in late])
            held = [h for h in held if h.delivery.message.deadline_ns > start]
            if not held:
                return
        requests: list[InferRequest] = []
        decode_errors: dict[int, str] = {}
        for index, item in enumerate(held):
            message = item.delivery.message
            try:
                inputs = {t.name: to_numpy(t.datatype, t.shape, t.data) for t in message.inputs}
            except ValueError as exc:
                decode_errors[index] = f"model '{self._model}': {exc}"
                inputs = {}
            requests.append(
                InferRequest(
                    message.request_id,
                    message.client_id,
                    inputs,
                    message.outputs,
                    message.parameters,
                )
            )
        runnable = [r for i, r in enumerate(requests) if i not in decode_errors]
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "model '%s': executing %d request(s): %s",
                self._model,
                len(runnable),
                ", ".join(f"{r.request_id} (client id '{r.client_id}')" for r in runnable),
            )
        input_done = self._clock()
        results = self._run_backend(runnable)
        infer_done = self._clock()
        answers: list[InferResponseMessage] = []
        successes: list[tuple[int, _Held]] = []
        failures: list[tuple[_Held, FailureReason]] = []
        result_iter = iter(results)
        for index, item in enumerate(held):
            request_id = item.delivery.message.request_id
            if index in decode_errors:
                answers.append(self._error(request_id, "INVALID_ARG", decode_errors[index]))
                failures.append((item, "OTHER"))
                continue
            answer = self._answer(item.delivery.message, next(result_iter))
            answers.append(answer)
            if answer.error is None:
                successes.append((index, item))
            else:
                # Triton: an error the model (backend) returned counts as reason BACKEND.
                failures.append((item, FailureReason.BACKEND))
                logger.debug(
                    "request %s (client id '%s') of model '%s' failed: %s: %s",
                    request_id,
                    item.delivery.message.client_id,
                    self._model,
                    answer.error.code,
                    answer.error.message,
                )
        done = self._clock()
        # The gateway answered "Request timeout expired" at the deadline: a request that
        # finished after it is answered and counted the same way, not as a success.
        late = [(i, h) for i, h in successes if h.delivery.message.deadline_ns <= done]
        for index, item in late:
            answers[index] = self._error(
                item.delivery.message.request_id, "UNAVAILABLE", "Request timeout expired"
            )
            failures.append((item, FailureReason.REJECTED))
        if late:
            successes = [(i, h) for i, h in successes if h.delivery.message.deadline_ns > done]
        times = ExecutionTimes(input_done - start, infer_done - input_done, done - infer_done)
        executed_size = sum(h.batch_size if h.batch_size > 1 else 1 for h in held)
        for index in decode_errors:
            executed_size -= max(1, held[index].batch_size)

        delta = StatsDelta()
        request_us: list[int] = []
        queue_us: list[int] = []
        if successes:
            # Triton's backends report an execution's batch statistics (execution_count,
            # batch_stats) unless every response of it failed (onnxruntime_backend)
            delta.execution(executed_size, times)
            # each request's durations, in ns and µs (a gateway's clock may run ahead)
            request_ns = queue_ns = inferences = 0
            for _, item in successes:
                enqueued = item.delivery.message.enqueued_ns
                in_server = done - enqueued if done > enqueued else 0
                queued = start - enqueued if start > enqueued else 0
                request_ns += in_server
                queue_ns += queued
                request_us.append(in_server // 1000)
                queue_us.append(queued // 1000)
                inferences += item.batch_size if item.batch_size > 1 else 1
            delta.successes(
                count=len(successes),
                inferences=inferences,
                request_ns=request_ns,
                queue_ns=queue_ns,
                times=times,
                now_ms=done // 1_000_000,
            )
        for item, reason in failures:
            delta.failure(request_ns=done - item.delivery.message.enqueued_ns, reason=reason)
        # The answers leave now, followed in the same write by the statistics that count
        # them (a client that reads the statistics as soon as it has its answer finds it
        # counted; sent with the next read, a preempted instance had left that window open
        # for milliseconds); the acknowledgements go with the next read.
        self._consumer.send_replies(
            [(h.delivery.message.reply_to, a) for h, a in zip(held, answers, strict=True)],
            self._stats.apply(delta) if self._stats is not None else (),
        )
        if successes and self._latencies is not None:
            self._latencies.observe_batch(
                request_us,
                queue_us,
                (
                    times.compute_input_ns // 1000,
                    times.compute_infer_ns // 1000,
                    times.compute_output_ns // 1000,
                ),
                done,
            )
            self._consumer.defer(self._latencies.flush(done))

        self._consumer.finish(
            [],
            [h.delivery for h in held],
            defer=True,  # sent with the read that follows at once (one round trip)
        )

    def _run_backend(self, requests: list[InferRequest]) -> list[InferResponse | InferError]:
        if not requests:
            return []
        try:
            results = self._backend.execute(requests)
        except Exception as exc:
            logger.exception("model '%s' execute raised", self._model)
            return [InferError("INTERNAL", str(exc) or type(exc).__name__)] * len(requests)
        if not isinstance(results, list) or len(results) != len(requests):
            got = len(results) if isinstance(results, list) else type(results).__name__
            message = f"model '{self._model}' returned {got} responses for {len(requests)} requests"
            return [InferError("INTERNAL", message)] * len(requests)
        return results

    def _answer(
        self, message: InferRequestMessage, result: InferResponse | InferError
    ) -> InferResponseMessage:
        request_id = message.request_id
        if isinstance(result, InferError):
            return self._error(request_id, result.code, result.message)
        # an answer without outputs is sent as such (Triton's python_backend sends a
        # response with the outputs the model gave, none included)
        try:
            wires = []
            for name, array in result.outputs.items():
                k = message.classification.get(name, 0)
                if k > 0:
                    labels = self.labels.get(name, [])
                    wires.append(_wire(name, "BYTES", classify(array, k, self._batching, labels)))
                else:
                    wires.append(_wire(name, self._output_datatypes.get(name, "BYTES"), array))
            outputs = tuple(wires)
        except Exception as exc:
            logger.exception("model '%s' produced an output that cannot be sent", self._model)
            return self._error(request_id, "INTERNAL", str(exc))
        return InferResponseMessage(
            request_id,
            self._model,
            self._version,
            outputs,
            None,
            dict(result.parameters),
            load_id=self._load_id,
        )
