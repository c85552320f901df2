"""Triton's dynamic batcher as a sans-I/O state machine.

Rules: docs/reference/model-configuration.md (dynamic batcher, priorities, queue
policy); Triton core ``src/dynamic_batch_scheduler.cc``.

The worker loop feeds it facts (`DynamicBatcher.offer`) and asks for decisions
(`take`, `expired`, `wake_at`); time is always passed in as ``now_ns`` from the
caller's ``time.monotonic_ns()``, so nothing here sleeps or reads a clock.
`Pending` is metadata only; tensors stay with the worker (`batching.tensors`).
The per-request records are plain slotted dataclasses, not frozen ones (see
``broker.messages``: a frozen one costs several times more to build).

A request is *expired* when ``now_ns > arrival_ns + timeout_ns`` (Triton's
``now > timeout_timestamp`` in ``PolicyQueue::ApplyPolicy``); the delay window is
*exceeded* when ``now_ns - oldest_arrival_ns >= max_queue_delay_us * 1000``
(Triton's ``delay_ns >= pending_batch_delay_ns_`` in ``GetDynamicBatch``).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from sluice.batching.policy import DynamicBatchingPolicy, QueuePolicy

__all__ = [
    "Accepted",
    "Admission",
    "Batch",
    "DynamicBatcher",
    "Expired",
    "Pending",
    "Rejected",
]

QUEUE_FULL = "Exceeds maximum queue size"
TIMEOUT_EXPIRED = "Request timeout expired"


@dataclass(slots=True)
class Pending:
    """Scheduling metadata of one queued request.

    Attributes:
        id: Request id, unique among queued requests.
        batch_size: The request's batch size ``b`` (first dim of its inputs); it
            counts as ``max(1, b)`` towards a batch (Triton ``std::max(1U, ...)``).
        shape_key: Built by the caller from the shapes of the non-ragged inputs
            whose dims contain ``-1``, the contents of shape tensors and the set of
            supplied inputs; requests with equal keys may share a batch.
        arrival_ns: Arrival at the scheduler, on the same clock as ``now_ns``.
        priority: The request's ``priority`` parameter (0 = not given).
        timeout_us: The request's ``timeout`` parameter in microseconds, or None.
    """

    id: str
    batch_size: int
    shape_key: Hashable
    arrival_ns: int
    priority: int = 0
    timeout_us: int | None = None

    @property
    def size(self) -> int:
        """What the request counts towards a batch: ``max(1, batch_size)``."""
        return max(1, self.batch_size)


@dataclass(slots=True)
class Accepted:
    """`DynamicBatcher.offer` queued the request."""


@dataclass(slots=True)
class Rejected:
    """`DynamicBatcher.offer` refused the request; answer it with ``code``.

    Attributes:
        reason: Triton's message, e.g. ``Exceeds maximum queue size``.
        code: Triton error code name: UNAVAILABLE for a full queue, INVALID_ARG
            for a batch larger than ``max_batch_size``.
    """

    reason: str
    code: str = "UNAVAILABLE"


Admission = Accepted | Rejected


@dataclass(slots=True)
class Batch:
    """Requests to execute together, in queue order; never empty.

    Attributes:
        items: The requests; inputs are concatenated along dim 0 in this order.
    """

    items: tuple[Pending, ...]

    @property
    def size(self) -> int:
        """The batch size counted as Triton does: ``sum(max(1, b))``."""
        return sum(item.size for item in self.items)

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Each request's ``b``, for `batching.tensors.split_outputs`."""
        return tuple(item.batch_size for item in self.items)


@dataclass(slots=True)
class Expired:
    """A request removed from the queue by a REJECT timeout (Triton ``timeout_action``).

    Attributes:
        item: The request.
        reason: Triton's message, ``Request timeout expired``.
    """

    item: Pending
    reason: str = TIMEOUT_EXPIRED
    code: ClassVar[str] = "UNAVAILABLE"


@dataclass(slots=True)
class _Entry:
    item: Pending
    seq: int
    level: int
    deadline_ns: int | None


@dataclass(slots=True)
class _Level:
    """Triton ``PolicyQueue``: the live queue, then the requests DELAY moved behind it."""

    policy: QueuePolicy
    main: deque[_Entry] = field(default_factory=deque)
    delayed: deque[_Entry] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self.main) + len(self.delayed)


@dataclass(frozen=True, slots=True)
class _Plan:
    send: int  # number of requests to send now; 0 = wait
    wait_until_ns: int | None = None


class DynamicBatcher:
    """One model's dynamic-batching queue(s) (Triton ``DynamicBatchScheduler``).

    Call `take` only when a model instance is free: while every instance is busy
    requests simply accumulate, which is where large batches come from.
    A typical loop step: ``expired(now)`` (answer those), ``take(now)`` while an
    instance is free, then block at most ``wake_at(now) - now``.

    Args:
        policy: The model's batching policy.
    """

    def __init__(self, policy: DynamicBatchingPolicy) -> None:
        self.policy = policy
        self._levels: dict[int, _Level] = {}
        self._count = 0
        self._seq = 0
        self._deadlines: list[tuple[int, int]] = []  # (deadline_ns, seq), lazily pruned
        self._timed: dict[int, _Entry] = {}  # seq -> entry still able to time out
        self._expired: list[Expired] = []  # REJECT-expired, not yet reported
        self._preferred = frozenset(policy.preferred_batch_sizes)
        self._pmax = policy.max_preferred_batch_size
        self._delay_ns = policy.max_queue_delay_us * 1000

    def __len__(self) -> int:
        """Number of queued requests (REJECT-expired ones no longer count)."""
        return self._count

    def offer(self, item: Pending, now_ns: int) -> Admission:
        """Queue a request at its priority level (Triton ``priority_levels``).

        Triton ``PolicyQueue::Enqueue``: when ``max_queue_size > 0`` and the level
        already holds that many requests (DELAYed ones included) the request is
        refused with ``Exceeds maximum queue size``. Its queue timeout is fixed now
        from ``item.arrival_ns`` (`DynamicBatchingPolicy.timeout_ns`).

        Args:
            item: The request; ``item.arrival_ns`` starts its queue time.
            now_ns: Current time (kept for symmetry; queue time counts from
                ``item.arrival_ns``).

        Returns:
            `Accepted`, or `Rejected` with the reason to answer the request with.
            A batch larger than ``max_batch_size`` (which the gateway already
            refuses, docs/reference/model-configuration.md) is `Rejected` with code INVALID_ARG.
        """
        mbs = self.policy.max_batch_size
        if mbs > 0 and item.batch_size > mbs:
            return Rejected(
                f"batch size {item.batch_size} exceeds max_batch_size {mbs}", "INVALID_ARG"
            )
        level = self.policy.level_of(item.priority)
        queue = self._levels.get(level)
        if queue is None:
            queue = _Level(self.policy.queue_policy(level))
        if queue.policy.max_queue_size and len(queue) >= queue.policy.max_queue_size:
            return Rejected(QUEUE_FULL)
        self._levels[level] = queue
        timeout_ns = self.policy.timeout_ns(level, item.timeout_us)
        deadline = None if timeout_ns is None else item.arrival_ns + timeout_ns
        entry = _Entry(item, self._seq, level, deadline)
        self._seq += 1
        queue.main.append(entry)
        self._count += 1
        if deadline is not None:
            self._timed[entry.seq] = entry
            heapq.heappush(self._deadlines, (deadline, entry.seq))
        return Accepted()

    def expired(self, now_ns: int) -> list[Expired]:
        """Apply the queue policies' timeouts (Triton ``PolicyQueue::ApplyPolicy``).

        A request older than its timeout is removed and reported here with
        ``timeout_action: REJECT``, or moved behind all non-expired requests of
        its level with ``DELAY`` (not reported; it runs later and no longer times
        out). Expiries found by `take` are reported by the next call.

        Args:
            now_ns: Current time.

        Returns:
            The REJECT-expired requests, in queue order; answer each with
            UNAVAILABLE ``Request timeout expired``.
        """
        self._sweep(now_ns)
        out, self._expired = self._expired, []
        return out

    def take(self, now_ns: int) -> Batch | None:
        """A batch to run now on a free instance (Triton ``GetDynamicBatch``).

        Walks the queue from the oldest request of the highest level, never
        splitting or reordering requests, and stops at a size above
        ``max_batch_size`` or a ``shape_key`` different from the first request's.
        Sends now when a preferred size was reached (exactly that batch, unless
        the delay is exceeded), when the walk stopped early, when the pending size
        is ≥ the largest preferred size, when ``max_queue_delay_us`` is 0, or when
        the oldest pending request has waited ≥ the delay (then everything pending,
        up to ``max_batch_size``). Otherwise it waits (see `wake_at`). With
        ``max_batch_size`` 0 every request is its own batch. Timed-out requests
        are handled first, as by `expired`.

        Args:
            now_ns: Current time.

        Returns:
            A non-empty `Batch`, or None when nothing should run yet.
        """
        self._sweep(now_ns)
        if self._count == 0:
            return None
        plan = self._plan(now_ns)
        if plan.send == 0:
            return None
        return Batch(self._pop(plan.send))

    def wake_at(self, now_ns: int) -> int | None:
        """When `take` or `expired` may next give something new.

        Triton's batcher thread sleeps for the rest of the delay window, or until
        the nearest request timeout when that is sooner (``GetDynamicBatch``).
        New arrivals may also make a batch ready; the caller asks again then.

        Args:
            now_ns: Current time.

        Returns:
            ``now_ns`` when a batch or an expiry is available now; else the end of
            the oldest pending request's delay window or the first instant a
            queued request counts as timed out, whichever is sooner; None when the
            queue is empty and nothing is left to report.
        """
        if self._expired:
            return now_ns
        if self._count == 0:
            return None
        next_timeout = self._next_deadline()
        if next_timeout is not None and next_timeout < now_ns:
            return now_ns
        plan = self._plan(now_ns)
        if plan.send:
            return now_ns
        assert plan.wait_until_ns is not None
        if next_timeout is None:
            return plan.wait_until_ns
        return min(plan.wait_until_ns, next_timeout + 1)

    def cancel(self, request_id: str) -> Pending | None:
        """Remove a queued request whose client went away.

        Rules: docs/reference/model-configuration.md (cancellation).

        Args:
            request_id: The `Pending.id` to remove.

        Returns:
            The removed request (answer it with CANCELLED), or None if not queued.
        """
        for level, queue in self._levels.items():
            for lane in (queue.main, queue.delayed):
                for entry in lane:
                    if entry.item.id == request_id:
                        lane.remove(entry)
                        self._forget(level, entry)
                        return entry.item
        return None

    # -- internals ---------------------------------------------------------

    def _ordered(self) -> Iterator[_Entry]:
        for level in sorted(self._levels):
            queue = self._levels[level]
            yield from queue.main
            yield from queue.delayed

    def _plan(self, now_ns: int) -> _Plan:
        """Triton ``DynamicBatchScheduler::GetDynamicBatch`` on a fresh cursor."""
        mbs = self.policy.max_batch_size
        if mbs == 0:
            return _Plan(1)
        pending = 0  # running batch size
        count = 0  # requests in the pending batch
        best: int | None = None  # request count of the preferred candidate
        send_now = False
        first_key: Hashable = None
        oldest_ns = 0
        for entry in self._ordered():
            item = entry.item
            size = item.size
            if count == 0:
                first_key = item.shape_key
                oldest_ns = item.arrival_ns
            else:
                if pending + size > self._pmax and best is None:
                    best = count
                if pending + size > mbs or item.shape_key != first_key:
                    send_now = True
                    break
                oldest_ns = min(oldest_ns, item.arrival_ns)
            pending += size
            count += 1
            if pending in self._preferred:
                best = count
        exceeded = self._delay_ns != 0 and now_ns - oldest_ns >= self._delay_ns
        if best is not None and not exceeded:
            return _Plan(best)
        if send_now or pending >= self._pmax or exceeded or self._delay_ns == 0:
            return _Plan(count)
        return _Plan(0, oldest_ns + self._delay_ns)

    def _pop(self, count: int) -> tuple[Pending, ...]:
        taken: list[Pending] = []
        for level in sorted(self._levels):
            queue = self._levels[level]
            for lane in (queue.main, queue.delayed):
                while lane and len(taken) < count:
                    entry = lane.popleft()
                    self._timed.pop(entry.seq, None)
                    taken.append(entry.item)
            if not queue:
                del self._levels[level]
            if len(taken) == count:
                break
        self._count -= len(taken)
        return tuple(taken)

    def _forget(self, level: int, entry: _Entry) -> None:
        self._timed.pop(entry.seq, None)
        self._count -= 1
        if not self._levels[level]:
            del self._levels[level]

    def _next_deadline(self) -> int | None:
        while self._deadlines and self._deadlines[0][1] not in self._timed:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def _sweep(self, now_ns: int) -> None:
        """Triton ``PolicyQueue::ApplyPolicy`` over every level at once."""
        due: set[int] = set()
        while self._deadlines and self._deadlines[0][0] < now_ns:
            _, seq = heapq.heappop(self._deadlines)
            if self._timed.pop(seq, None) is not None:
                due.add(seq)
        if not due:
            return
        for level in sorted(self._levels):
            queue = self._levels[level]
            kept: deque[_Entry] = deque()
            for entry in queue.main:
                if entry.seq not in due:
                    kept.append(entry)
                elif queue.policy.timeout_action == "DELAY":
                    queue.delayed.append(entry)
                else:
                    self._expired.append(Expired(entry.item))
                    self._count -= 1
            queue.main = kept
            if not queue:
                del self._levels[level]
