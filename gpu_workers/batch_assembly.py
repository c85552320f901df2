"""Batch assembly: what an instance holds between reading a request and running it.

Each delivery read off the version's streams is admitted to the pure
:class:`batching.DynamicBatcher` or refused at once (handed out too often, or
failing this load's config checks); the batcher hands back batches, whose held
deliveries become the backend's :class:`InferRequest` list. Expiry takes out the
requests whose queue timeout (REJECT) or deadline passed while they waited, to be
answered UNAVAILABLE "Request timeout expired" without running.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from sluice.batching import Batch, DynamicBatcher, Pending, Rejected
from sluice.broker.consumer import Delivery
from sluice.broker.datatypes import to_numpy
from sluice.broker.errors import TIMEOUT_TEXT, SluiceError
from sluice.broker.messages import InferRequestMessage, RequestedOutput
from sluice.broker.request_checks import RequestRules, validate_request
from sluice.broker.scheduling import ShapeKeys, StreamLayout
from sluice.gpu_workers.backends.base import InferRequest

logger = logging.getLogger(__name__)

#: an entry handed out more often than this (its instance died each time) is failed.
MAX_DELIVERIES = 2

#: a request to answer with an error: its delivery, error code and text.
Failure = tuple[Delivery, str, str]


@dataclass(slots=True)
class Held:
    """A delivery the batcher holds, with its batch size (0: the model does not batch)."""

    delivery: Delivery
    batch_size: int


@dataclass(slots=True)
class Admission:
    """The deliveries :meth:`BatchAssembly.admit` refused."""

    #: refused by the batcher or handed out too often: counted as failures.
    refused: list[Failure] = field(default_factory=list)
    #: refused by the config checks: not counted, as a gateway's refusals are not.
    checks_refused: list[Failure] = field(default_factory=list)


class BatchAssembly:
    """The requests an instance holds and the batcher that groups them.

    Args:
        layout: the version's streams and scheduling policy.
        shape_keys: builds batch-compatibility keys from a request's inputs.
        batching: whether the model has a batch dimension (``max_batch_size`` > 0).
        load_id: the model load the instance belongs to.
        rules: the instance's config checks: a request that a gateway checked against
            another load (``InferRequestMessage.load_id``, during a reload) is checked
            again against them and refused with their error (None: not checked).
    """

    def __init__(
        self,
        layout: StreamLayout,
        shape_keys: ShapeKeys,
        batching: bool,
        load_id: str = "",
        rules: RequestRules | None = None,
    ) -> None:
        self._model = layout.model
        self._batcher = DynamicBatcher(layout.policy)
        self._shape_keys = shape_keys
        self._batching = batching
        self._load_id = load_id
        self._rules = rules
        #: request id -> what is held, from admission until its batch runs or it expires
        self.held: dict[str, Held] = {}

    def __len__(self) -> int:
        return len(self.held)

    def admit(self, deliveries: Sequence[Delivery], now: int) -> Admission:
        """Offer each delivery to the batcher; the refused ones are returned, to be
        answered at once. A request already held (claimed twice) keeps its first copy."""
        result = Admission()
        held = self.held
        offer = self._batcher.offer
        key = self._shape_keys.key
        for delivery in deliveries:
            message = delivery.message
            if message.request_id in held:  # claimed twice; keep the first
                continue
            if delivery.deliveries > MAX_DELIVERIES:
                result.refused.append(
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
                    result.checks_refused.append((delivery, refusal.code.value, refusal.message))
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
                result.refused.append((delivery, admission.code, admission.reason))
            else:
                held[message.request_id] = Held(delivery, batch_size)
        return result

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

    def expire(self, now: int) -> list[Failure]:
        """Take out what the batcher timed out and what passed its deadline while
        queued; each is to be answered UNAVAILABLE."""
        expired = self._batcher.expired(now)
        late = [h for h in self.held.values() if h.delivery.message.deadline_ns <= now]
        failures: list[Failure] = []
        for item in expired:
            held = self.held.pop(item.item.id, None)
            if held is not None:
                failures.append((held.delivery, "UNAVAILABLE", item.reason))
        for held in late:
            if self._batcher.cancel(held.delivery.message.request_id) is not None:
                self.held.pop(held.delivery.message.request_id, None)
                failures.append((held.delivery, "UNAVAILABLE", TIMEOUT_TEXT))
        return failures

    def take(self, now: int) -> Batch | None:
        """The batch ready at ``now`` (its requests stay held until :meth:`release`)."""
        return self._batcher.take(now)

    def wake_at(self, now: int) -> int | None:
        """When the batcher next has a batch (clock ns); None when it holds nothing."""
        return self._batcher.wake_at(now)

    def release(self, batch: Batch) -> list[Held]:
        """What a taken batch holds, no longer held (it runs now)."""
        return [self.held.pop(item.id) for item in batch.items]


def split_late(held: list[Held], now: int) -> tuple[list[Held], list[Held]]:
    """``(late, on_time)``: the requests whose deadline passed by ``now``, and the rest."""
    late = [h for h in held if h.delivery.message.deadline_ns <= now]
    if not late:
        return late, held
    return late, [h for h in held if h.delivery.message.deadline_ns > now]


def backend_requests(held: Sequence[Held], model: str) -> tuple[list[InferRequest], dict[int, str]]:
    """The backend's requests of a batch, and index -> error text for the requests
    whose inputs cannot be decoded (their requests carry no inputs and are not run)."""
    requests: list[InferRequest] = []
    decode_errors: dict[int, str] = {}
    for index, item in enumerate(held):
        message = item.delivery.message
        try:
            inputs = {t.name: to_numpy(t.datatype, t.shape, t.data) for t in message.inputs}
        except ValueError as exc:
            decode_errors[index] = f"model '{model}': {exc}"
            inputs = {}
        requests.append(
            InferRequest(
                message.request_id,
                message.client_id,
                inputs,
                message.outputs,
                message.parameters,
                message.reply_to,
                message.deadline_ns,
            )
        )
    return requests, decode_errors
