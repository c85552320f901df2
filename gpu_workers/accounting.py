"""What an instance counts: its statistics deltas and latency observations.

Statistics (Triton's model statistics: request counts, cumulative durations, batch
statistics, failures by reason) are added up in a :class:`StatsDelta` per execution
or per group of failed requests and written to the instance's own shard
(``broker.stats_store``); the successful requests' durations also feed the latency
histograms of the summary metrics (``broker.latency_window``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from sluice.broker.errors import FailureReason, failure_reason
from sluice.broker.latency_window import LatencyRecorder
from sluice.broker.scheduling import StreamLayout
from sluice.broker.stats_store import ExecutionTimes, StatsDelta, StatsShard
from sluice.gpu_workers.batch_assembly import Failure, Held

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Durations:
    """The successful requests of one execution: each one's time in the server and in
    the queue, in µs (the latency histograms' unit)."""

    request_us: list[int] = field(default_factory=list)
    queue_us: list[int] = field(default_factory=list)


class Accounting:
    """The statistics shard and latency histograms of one instance.

    Args:
        layout: the version's streams (names the latency window's keys).
        stats: this instance's statistics (None: nothing is counted).
    """

    def __init__(self, layout: StreamLayout, stats: StatsShard | None) -> None:
        self.stats = stats
        #: latency histograms of the summary metrics (None: nothing is counted)
        self._latencies = (
            LatencyRecorder(layout.keys.latency_window(layout.model, layout.version, stats.tag))
            if stats is not None
            else None
        )

    def registration_lost(self) -> None:
        """Redis may come back without the shard's registration: write it again with
        the next statistics."""
        if self.stats is not None:
            self.stats.registered = False

    def commands(self, delta: StatsDelta) -> Sequence[tuple[object, ...]]:
        """The commands that write ``delta`` to the shard (none when nothing is counted)."""
        return self.stats.apply(delta) if self.stats is not None else ()

    def failures(
        self, failures: Sequence[Failure], model: str, now: int, counted: bool = True
    ) -> StatsDelta:
        """The delta of requests answered with an error, each ``(delivery, code, text)``
        (logged at debug level); ``counted``: as failures (Triton counts no request its
        checks refused before it was queued), with the reason of their code."""
        delta = StatsDelta()
        for delivery, code, text in failures:
            logger.debug(
                "request %s (client id '%s') of model '%s' failed: %s: %s",
                delivery.message.request_id,
                delivery.message.client_id,
                model,
                code,
                text,
            )
            if counted:
                delta.failure(
                    request_ns=now - delivery.message.enqueued_ns,
                    reason=failure_reason(code),
                )
        return delta

    def execution(
        self,
        held: Sequence[Held],
        successes: Sequence[Held],
        failures: Sequence[tuple[Held, FailureReason]],
        undecoded: Sequence[int],
        times: ExecutionTimes,
        start: int,
        done: int,
    ) -> tuple[StatsDelta, Durations]:
        """The delta of one execution of ``held`` (clock ns ``start`` to ``done``), and
        its successful requests' durations.

        The batch's statistics count the requests that ran (all but the ``undecoded``
        indexes), and only when one of them succeeded: Triton's backends report an
        execution's batch statistics (execution_count, batch_stats) unless every
        response of it failed (onnxruntime_backend). A request of batch size 0 or 1
        counts as one inference.
        """
        executed_size = sum(h.batch_size if h.batch_size > 1 else 1 for h in held)
        for index in undecoded:
            executed_size -= max(1, held[index].batch_size)
        delta = StatsDelta()
        durations = Durations()
        if successes:
            delta.execution(executed_size, times)
            # each request's durations, in ns and µs (a gateway's clock may run ahead)
            request_ns = queue_ns = inferences = 0
            for item in successes:
                enqueued = item.delivery.message.enqueued_ns
                in_server = done - enqueued if done > enqueued else 0
                queued = start - enqueued if start > enqueued else 0
                request_ns += in_server
                queue_ns += queued
                durations.request_us.append(in_server // 1000)
                durations.queue_us.append(queued // 1000)
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
        return delta, durations

    def observe(
        self, durations: Durations, times: ExecutionTimes, done: int
    ) -> list[tuple[object, ...]]:
        """Add an execution's successful requests to the latency histograms; the
        commands that write what waited long enough (:meth:`LatencyRecorder.flush`)."""
        if self._latencies is None:
            return []
        self._latencies.observe_batch(
            durations.request_us,
            durations.queue_us,
            (
                times.compute_input_ns // 1000,
                times.compute_infer_ns // 1000,
                times.compute_output_ns // 1000,
            ),
            done,
        )
        return self._latencies.flush(done)

    def flush_latencies(self, now: int, force: bool = False) -> list[tuple[object, ...]]:
        """The commands that write the latency observations that waited long enough
        (all of them with ``force``); none when nothing is counted."""
        if self._latencies is None:
            return []
        return self._latencies.flush(now, force=force)
