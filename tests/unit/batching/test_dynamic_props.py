"""Property tests for batching.dynamic: the batcher's invariants on random traffic.

A discrete-event simulation drives the batcher with integer times: at each event
time it reports expiries, offers the arrivals due, and takes batches while an
instance is free; the next event is the next arrival, instance release, or
``wake_at``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.batching import (
    Accepted,
    Batch,
    DynamicBatcher,
    DynamicBatchingPolicy,
    Pending,
    QueuePolicy,
    Rejected,
)

US = 1_000
PROPS = settings(max_examples=200, deadline=None)


@st.composite
def queue_policies(draw: st.DrawFn, timeouts: bool) -> QueuePolicy:
    return QueuePolicy(
        timeout_action=draw(st.sampled_from(["REJECT", "DELAY"])),
        default_timeout_us=draw(st.sampled_from([0, 5, 40, 150])) if timeouts else 0,
        allow_timeout_override=draw(st.booleans()),
        max_queue_size=draw(st.sampled_from([0, 0, 1, 3])),
    )


@st.composite
def policies(draw: st.DrawFn, timeouts: bool = True) -> DynamicBatchingPolicy:
    max_batch_size = draw(st.integers(0, 8))
    preferred = (
        draw(st.lists(st.integers(1, max_batch_size), max_size=3, unique=True))
        if max_batch_size
        else []
    )
    levels = draw(st.integers(0, 3))
    return DynamicBatchingPolicy(
        max_batch_size=max_batch_size,
        preferred_batch_sizes=tuple(preferred),
        max_queue_delay_us=draw(st.sampled_from([0, 1, 20, 100])),
        priority_levels=levels,
        default_priority_level=draw(st.integers(1, levels)) if levels else 0,
        default_queue_policy=draw(queue_policies(timeouts)),
        priority_queue_policy=(
            draw(st.dictionaries(st.integers(1, levels), queue_policies(timeouts), max_size=2))
            if levels
            else {}
        ),
    )


@st.composite
def traffic(draw: st.DrawFn, policy: DynamicBatchingPolicy) -> list[Pending]:
    """Requests with non-decreasing arrival times."""
    top = max(policy.max_batch_size, 1)
    now = 0
    items = []
    for index in range(draw(st.integers(1, 25))):
        now += draw(st.sampled_from([0, 0, 0, 1, 3 * US, 30 * US, 120 * US]))
        items.append(
            Pending(
                id=f"r{index}",
                batch_size=draw(st.integers(0, top)),
                shape_key=draw(st.sampled_from(["a", "a", "b"])),
                arrival_ns=now,
                priority=draw(st.integers(0, 4)),
                timeout_us=draw(st.sampled_from([None, 0, 2, 60])),
            )
        )
    return items


@dataclass
class Trace:
    """What the simulation saw."""

    accepted: list[Pending] = field(default_factory=list)
    rejected: list[Pending] = field(default_factory=list)
    batches: list[tuple[int, Batch]] = field(default_factory=list)
    expired: list[tuple[int, Pending]] = field(default_factory=list)


def simulate(
    policy: DynamicBatchingPolicy,
    items: list[Pending],
    instances: int | None = None,
    exec_ns: int = 0,
    check_take: bool = True,
) -> Trace:
    """Run the event loop; ``instances=None`` means an instance is always free."""
    batcher = DynamicBatcher(policy)
    trace = Trace()
    busy_until: list[int] = []
    level_count: dict[int, int] = {}
    levels = {item.id: policy.level_of(item.priority) for item in items}
    queued: dict[str, tuple[int, int]] = {}  # id -> (level, seq), in arrival order
    arrivals = list(items)
    now = 0
    for _ in range(10_000):
        busy_until = [t for t in busy_until if t > now]
        for expiry in batcher.expired(now):
            assert expiry.reason == "Request timeout expired"
            trace.expired.append((now, expiry.item))
            level_count[levels[expiry.item.id]] -= 1
            del queued[expiry.item.id]
        while arrivals and arrivals[0].arrival_ns <= now:
            item = arrivals.pop(0)
            level = levels[item.id]
            limit = policy.queue_policy(level).max_queue_size
            result = batcher.offer(item, now)
            full = bool(limit) and level_count.get(level, 0) >= limit
            assert result == (Rejected("Exceeds maximum queue size") if full else Accepted())
            if full:
                trace.rejected.append(item)
            else:
                trace.accepted.append(item)
                level_count[level] = level_count.get(level, 0) + 1
                queued[item.id] = (level, len(trace.accepted))
        while instances is None or len(busy_until) < instances:
            if check_take:
                snapshot = sorted(queued.items(), key=lambda kv: kv[1])
            batch = batcher.take(now)
            if batch is None:
                break
            if check_take:
                # Priority order across levels and FIFO within one: the batch is
                # exactly the head of the queue (valid when no DELAY timeouts).
                assert [i.id for i in batch.items] == [k for k, _ in snapshot[: len(batch.items)]]
            trace.batches.append((now, batch))
            busy_until.append(now + exec_ns)
            for item in batch.items:
                level_count[levels[item.id]] -= 1
                del queued[item.id]
        assert len(batcher) == len(queued)
        wake = batcher.wake_at(now)
        if not queued:
            assert wake is None
        candidates = [t for t in (wake, *busy_until) if t is not None and t > now]
        if arrivals:
            candidates.append(arrivals[0].arrival_ns)
        if wake is not None and wake <= now:
            # Something is ready but every instance is busy.
            assert instances is not None and len(busy_until) >= instances
        if not candidates:
            break
        now = min(candidates)
    else:  # pragma: no cover
        raise AssertionError("simulation did not finish")
    assert not queued and not arrivals
    return trace


def check_common(policy: DynamicBatchingPolicy, trace: Trace) -> None:
    mbs = policy.max_batch_size
    answered = [i.id for _, b in trace.batches for i in b.items]
    answered += [i.id for _, i in trace.expired]
    assert sorted(answered) == sorted(i.id for i in trace.accepted), "each answered once"
    for _, batch in trace.batches:
        assert batch.items, "never an empty batch"
        if mbs == 0:
            assert len(batch.items) == 1
        else:
            assert batch.size <= mbs
        assert len({i.shape_key for i in batch.items}) == 1, "never mixes shape keys"
    for when, item in trace.expired:
        level = policy.level_of(item.priority)
        timeout = policy.timeout_ns(level, item.timeout_us)
        assert policy.queue_policy(level).timeout_action == "REJECT"
        assert timeout is not None and when > item.arrival_ns + timeout


@PROPS
@given(data=st.data())
def test_free_instance_never_waits_past_the_delay(data: st.DataObject) -> None:
    policy = data.draw(policies())
    items = data.draw(traffic(policy))
    trace = simulate(policy, items, check_take=False)
    check_common(policy, trace)
    delay_ns = policy.max_queue_delay_us * US
    for when, batch in trace.batches:
        for item in batch.items:
            if policy.max_batch_size == 0 or delay_ns == 0:
                assert when == item.arrival_ns
            else:
                assert when <= item.arrival_ns + delay_ns
    for when, item in trace.expired:
        timeout = policy.timeout_ns(policy.level_of(item.priority), item.timeout_us)
        assert timeout is not None and when == item.arrival_ns + timeout + 1


@PROPS
@given(data=st.data(), instances=st.integers(1, 2), exec_us=st.sampled_from([1, 50, 200]))
def test_busy_instances_order_and_preferred_sizes(
    data: st.DataObject, instances: int, exec_us: int
) -> None:
    policy = data.draw(policies(timeouts=False))
    items = data.draw(traffic(policy))
    trace = simulate(policy, items, instances=instances, exec_ns=exec_us * US)
    check_common(policy, trace)
    assert not trace.expired


@PROPS
@given(data=st.data(), instances=st.integers(1, 2), exec_us=st.sampled_from([1, 50, 200]))
def test_timeouts_with_busy_instances(data: st.DataObject, instances: int, exec_us: int) -> None:
    policy = data.draw(policies())
    items = data.draw(traffic(policy))
    # DELAY timeouts reorder a level on purpose; otherwise batches are the queue's head.
    delaying = any(
        p.timeout_action == "DELAY" and p.default_timeout_us
        for p in (policy.default_queue_policy, *policy.priority_queue_policy.values())
    )
    trace = simulate(
        policy, items, instances=instances, exec_ns=exec_us * US, check_take=not delaying
    )
    check_common(policy, trace)
    served = {i.id for _, b in trace.batches for i in b.items}
    for item in trace.accepted:
        level = policy.level_of(item.priority)
        timeout = policy.timeout_ns(level, item.timeout_us)
        if timeout is None or policy.queue_policy(level).timeout_action == "DELAY":
            assert item.id in served, "requests without a REJECT timeout always run"


def compatible_prefix(policy: DynamicBatchingPolicy, queue: list[Pending]) -> list[Pending]:
    """The longest in-order head of ``queue`` with one shape key and size <= max."""
    prefix: list[Pending] = []
    total = 0
    for item in queue:
        if item.shape_key != queue[0].shape_key or total + item.size > policy.max_batch_size:
            break
        total += item.size
        prefix.append(item)
    return prefix


def reachable_preferred(policy: DynamicBatchingPolicy, queue: list[Pending]) -> int | None:
    """Largest preferred size that a compatible head of ``queue`` sums to."""
    sizes = accumulate(item.size for item in compatible_prefix(policy, queue))
    return max((s for s in sizes if s in policy.preferred_batch_sizes), default=None)


@PROPS
@given(data=st.data())
def test_take_reaches_a_preferred_size_when_the_queue_allows(data: st.DataObject) -> None:
    policy = data.draw(policies(timeouts=False).filter(lambda p: p.max_batch_size > 0))
    items = data.draw(traffic(policy))
    now = max(i.arrival_ns for i in items) + data.draw(st.sampled_from([0, 10 * US, 200 * US]))
    batcher = DynamicBatcher(policy)
    queue = []
    for item in items:
        if isinstance(batcher.offer(item, item.arrival_ns), Accepted):
            queue.append(item)
    order = {item.id: n for n, item in enumerate(queue)}
    queue.sort(key=lambda i: (policy.level_of(i.priority), order[i.id]))
    while queue:
        batch = batcher.take(now)
        preferred = reachable_preferred(policy, queue)
        if batch is None:
            assert preferred is None
            assert policy.max_queue_delay_us > 0
            assert now - min(i.arrival_ns for i in queue) < policy.max_queue_delay_us * US
            wake = batcher.wake_at(now)
            assert wake is not None and wake > now
            now = wake
            batch = batcher.take(now)
            assert batch is not None, "take at wake_at returns a batch"
        assert list(batch.items) == queue[: len(batch.items)]
        prefix = compatible_prefix(policy, queue)
        delay_ns = policy.max_queue_delay_us * US
        exceeded = delay_ns > 0 and now - min(i.arrival_ns for i in prefix) >= delay_ns
        if preferred is not None:
            assert batch.size >= preferred
            if not exceeded:
                assert batch.size == preferred, "exactly the preferred batch within the delay"
        fits = sum(i.size for i in prefix) <= policy.max_preferred_batch_size
        if exceeded or (delay_ns == 0 and preferred is None and fits):
            assert list(batch.items) == prefix, "everything pending, up to max_batch_size"
        del queue[: len(batch.items)]
    assert batcher.take(now) is None
    assert batcher.wake_at(now) is None
