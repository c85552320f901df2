"""Running a batch and answering its requests: the backend call, the answers, the counts.

The instance loop (:mod:`gpu_workers.loop`) decides when a batch runs; this module runs
it: the backend's ``execute`` (one result per request, else every request fails with
INTERNAL, as Triton answers a malformed response list), the answers and statistics
written together, the acknowledgements deferred to the next read. Refused and expired
requests are answered here too (:meth:`Execution.fail`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from sluice.batching import Batch
from sluice.broker.consumer import Delivery, StreamConsumer
from sluice.broker.errors import TIMEOUT_TEXT, FailureReason
from sluice.broker.messages import InferResponseMessage
from sluice.broker.stats_store import ExecutionTimes
from sluice.gpu_workers.accounting import Accounting
from sluice.gpu_workers.answers import Answers
from sluice.gpu_workers.backends.base import Backend, InferError, InferRequest, InferResponse
from sluice.gpu_workers.batch_assembly import (
    BatchAssembly,
    Failure,
    backend_requests,
    split_late,
)
from sluice.gpu_workers.sequence_assembly import SequenceAssembly
from sluice.gpu_workers.tracing import record_traced

__all__ = ["Execution"]

logger = logging.getLogger(__name__)


class Execution:
    """Runs the batches of one instance and answers their requests.

    Args:
        consumer: the instance's stream consumer (answers, acknowledgements).
        backend: the initialized backend.
        model: model name, for messages.
        clock: wall-clock ns.
        answers: builds the answer messages.
        accounts: the instance's statistics.
        assembly: the requests the instance holds (a taken batch's are released here).
        sequences: a model with sequence batching: its steps (None: none).
    """

    def __init__(
        self,
        consumer: StreamConsumer,
        backend: Backend,
        model: str,
        clock: Callable[[], int],
        answers: Answers,
        accounts: Accounting,
        assembly: BatchAssembly | SequenceAssembly,
        sequences: SequenceAssembly | None,
    ) -> None:
        self._consumer = consumer
        self._backend = backend
        self._model = model
        self._clock = clock
        self._answers = answers
        self._accounts = accounts
        self._assembly = assembly
        self._sequences = sequences

    def fail(self, failures: Sequence[Failure], counted: bool = True) -> None:
        """Answer each ``(delivery, code, text)`` with its error and acknowledge it;
        ``counted``: as a failure in the statistics (Triton counts no request its checks
        refused before it was queued)."""
        now = self._clock()
        replies = [
            (d.message.reply_to, self._answers.error(d.message.request_id, code, text))
            for d, code, text in failures
        ]
        delta = self._accounts.failures(failures, self._model, now, counted)
        before = self._settle([d for d, _, _ in failures], [a for _, a in replies], now)
        self._consumer.finish(
            replies, [d for d, _, _ in failures], self._accounts.stats, delta, before=before
        )

    def execute(self, batch: Batch, labels: dict[str, list[str]]) -> None:
        """Run a taken batch and answer each of its requests.

        A request whose deadline passed before the batch started is answered
        "Request timeout expired" and not run; one that finished after its deadline gets
        the same answer and counts as a failure (reason REJECTED). ``labels``: output
        name -> class labels (Triton ``label_filename``), for classification.
        """
        start = self._clock()
        late, held = split_late(self._assembly.release(batch), start)
        if late:
            self.fail([(h.delivery, "UNAVAILABLE", TIMEOUT_TEXT) for h in late])
            if not held:
                return
        requests, decode_errors = backend_requests(held, self._model)
        if self._sequences is not None:
            requests = self._sequences.prepare(held, requests)
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
        if self._sequences is not None:
            results = self._sequences.keep_states([r.request_id for r in runnable], results)
        infer_done = self._clock()
        answers, successes, failures = self._answers.of_batch(held, results, decode_errors, labels)
        done = self._clock()
        # The gateway answered "Request timeout expired" at the deadline: a request that
        # finished after it is answered and counted the same way, not as a success.
        late_done = [
            (i, h)
            for i, h in successes
            if h.delivery.message.deadline_ns <= done and answers[i] is not None
        ]
        for index, item in late_done:
            answers[index] = self._answers.error(
                item.delivery.message.request_id, "UNAVAILABLE", TIMEOUT_TEXT
            )
            failures.append((item, FailureReason.REJECTED))
        if late_done:
            late = {i for i, _ in late_done}
            successes = [(i, h) for i, h in successes if i not in late]
        if any(h.delivery.message.trace for h in held):  # traced (gpu_workers.tracing)
            stamps = (start, input_done, infer_done, done)
            record_traced(held, answers, stamps, self._consumer.consumer)  # type: ignore[arg-type]
        times = ExecutionTimes(input_done - start, infer_done - input_done, done - infer_done)
        delta, durations = self._accounts.execution(
            held, [h for _, h in successes], failures, list(decode_errors), times, start, done
        )
        # The answers leave now, followed in the same write by the statistics that count
        # them, so a client that reads the statistics as soon as it has its answer finds
        # it counted even when the instance is preempted right after this write; the
        # acknowledgements go with the next read.
        before = self._settle([h.delivery for h in held], answers, done)  # type: ignore[arg-type]
        self._consumer.send_replies(
            [
                (h.delivery.message.reply_to, a)
                for h, a in zip(held, answers, strict=True)
                if a is not None  # a decoupled model sent its responses itself
            ],
            self._accounts.commands(delta),
            before=before,
        )
        if successes:
            self._consumer.defer(self._accounts.observe(durations, times, done))

        self._consumer.finish(
            [],
            [h.delivery for h in held],
            defer=True,  # sent with the read that follows at once (one round trip)
        )

    def _settle(
        self, deliveries: Sequence[Delivery], answers: Sequence[InferResponseMessage], now: int
    ) -> list[tuple[object, ...]]:
        """The commits of sequence steps answered now, to go ahead of their answers."""
        if self._sequences is None:
            return []
        return self._sequences.settle(list(zip(deliveries, answers, strict=True)), now)

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
