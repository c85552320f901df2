"""Table-driven tests for batching.dynamic (docs/reference/model-configuration.md:
dynamic batcher, priorities, queue policy).

Times are integers in nanoseconds; delays and timeouts in microseconds as in
``config.pbtxt``. No clock, no sleep.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from sluice.batching import (
    Accepted,
    Batch,
    DynamicBatcher,
    DynamicBatchingPolicy,
    Expired,
    Pending,
    QueuePolicy,
    Rejected,
)

US = 1_000  # ns

# An arrival is (arrival_ns, batch_size[, shape_key[, priority[, timeout_us]]]);
# request i gets id f"r{i}".
Arrival = tuple[Any, ...]


def pending(index: int, arrival: Arrival) -> Pending:
    t, b, key, priority, timeout = (*arrival, "k", 0, None)[:5]
    return Pending(f"r{index}", b, key, t, priority, timeout)


def replay(
    policy: DynamicBatchingPolicy, arrivals: Sequence[Arrival], steps: Sequence[int]
) -> list[tuple[int, ...] | None]:
    """Offer every arrival due by each step, then call take once; return batch indices."""
    batcher = DynamicBatcher(policy)
    offered = 0
    results: list[tuple[int, ...] | None] = []
    for now in steps:
        while offered < len(arrivals) and arrivals[offered][0] <= now:
            assert batcher.offer(pending(offered, arrivals[offered]), now) == Accepted()
            offered += 1
        batch = batcher.take(now)
        results.append(None if batch is None else tuple(int(i.id[1:]) for i in batch.items))
    return results


CASES = [
    # id, policy kwargs, arrivals, take times, expected batches (request indices)
    ("delay0-first-runs-alone", {"max_batch_size": 8}, [(0, 1), (5, 1)], [0, 5], [(0,), (1,)]),
    (
        "delay0-sends-all-pending",
        {"max_batch_size": 8},
        [(0, 1), (0, 1), (0, 1)],
        [0, 0],
        [(0, 1, 2), None],
    ),
    (
        "eight-together-one-batch",
        {"max_batch_size": 8, "max_queue_delay_us": 100_000},
        [(0, 1)] * 8,
        [0, 0],
        [(0, 1, 2, 3, 4, 5, 6, 7), None],
    ),
    (
        "preferred-sent-exactly",
        {"max_batch_size": 8, "preferred_batch_sizes": (4,), "max_queue_delay_us": 100},
        [(0, 1)] * 6,
        [0, 0, 100 * US],
        [(0, 1, 2, 3), None, (4, 5)],
    ),
    (
        "largest-preferred-reached",
        {"max_batch_size": 8, "preferred_batch_sizes": (2, 4), "max_queue_delay_us": 100},
        [(0, 1)] * 5,
        [0, 0],
        [(0, 1, 2, 3), None],
    ),
    (
        "smaller-preferred-when-larger-unreachable",
        {"max_batch_size": 8, "preferred_batch_sizes": (2, 4), "max_queue_delay_us": 100},
        [(0, 1)] * 3,
        [0, 0, 99_999, 100 * US],
        [(0, 1), None, None, (2,)],
    ),
    (
        "preferred-beats-delay-zero",
        {"max_batch_size": 8, "preferred_batch_sizes": (2,)},
        [(0, 1)] * 3,
        [0, 0],
        [(0, 1), (2,)],
    ),
    (
        "delay-exceeded-sends-up-to-max",
        {"max_batch_size": 8, "preferred_batch_sizes": (2,), "max_queue_delay_us": 100},
        [(0, 1)] * 10,
        [100 * US, 100 * US, 100 * US],
        [tuple(range(8)), (8, 9), None],
    ),
    (
        "delay-counts-from-oldest",
        {"max_batch_size": 8, "max_queue_delay_us": 100},
        [(0, 1), (50 * US, 1)],
        [0, 50 * US, 99_999, 100 * US],
        [None, None, None, (0, 1)],
    ),
    (
        "arrival-completes-preferred",
        {"max_batch_size": 8, "preferred_batch_sizes": (2,), "max_queue_delay_us": 100},
        [(0, 1), (10, 1)],
        [0, 10],
        [None, (0, 1)],
    ),
    (
        "size-cap-stops-walk",
        {"max_batch_size": 4, "max_queue_delay_us": 100},
        [(0, 3), (0, 3)],
        [0, 0, 100 * US],
        [(0,), None, (1,)],
    ),
    (
        "reaching-max-sends",
        {"max_batch_size": 4, "max_queue_delay_us": 100},
        [(0, 2), (0, 2)],
        [0],
        [(0, 1)],
    ),
    (
        "over-largest-preferred-keeps-candidate",
        {"max_batch_size": 8, "preferred_batch_sizes": (4,), "max_queue_delay_us": 100},
        [(0, 3), (0, 3)],
        [0, 0, 100 * US],
        [(0,), None, (1,)],
    ),
    (
        "over-largest-preferred-delay0",
        {"max_batch_size": 8, "preferred_batch_sizes": (4,)},
        [(0, 3), (0, 3)],
        [0, 0],
        [(0,), (1,)],
    ),
    (
        "single-request-above-preferred-sends",
        {"max_batch_size": 8, "preferred_batch_sizes": (2,), "max_queue_delay_us": 100},
        [(0, 5)],
        [0],
        [(0,)],
    ),
    (
        "batch-size-zero-counts-one",
        {"max_batch_size": 8, "preferred_batch_sizes": (2,), "max_queue_delay_us": 100},
        [(0, 0), (0, 0)],
        [0],
        [(0, 1)],
    ),
    (
        "shape-mismatch-starts-next-batch",
        {"max_batch_size": 8, "max_queue_delay_us": 100},
        [(0, 1, "a"), (0, 1, "a"), (0, 1, "b"), (0, 1, "b")],
        [0, 0, 100 * US],
        [(0, 1), None, (2, 3)],
    ),
    (
        "shape-mismatch-never-skipped",
        {"max_batch_size": 8},
        [(0, 1, "a"), (0, 1, "b"), (0, 1, "a")],
        [0, 0, 0],
        [(0,), (1,), (2,)],
    ),
    (
        "max-batch-size-0-each-alone",
        {"max_batch_size": 0, "max_queue_delay_us": 100},
        [(0, 1)] * 3,
        [0, 0, 0, 0],
        [(0,), (1,), (2,), None],
    ),
    (
        "priority-levels-first",
        {"max_batch_size": 2, "priority_levels": 2, "default_priority_level": 2},
        [(0, 1, "k", 2), (0, 1, "k", 0), (0, 1, "k", 1), (0, 1, "k", 1)],
        [0, 0, 0],
        [(2, 3), (0, 1), None],
    ),
    (
        "batch-spans-levels",
        {"max_batch_size": 4, "priority_levels": 3, "default_priority_level": 3},
        [(0, 1, "k", 3), (0, 1, "k", 1), (0, 1, "k", 9)],
        [0],
        [(1, 0, 2)],
    ),
    (
        "priority-ignored-without-levels",
        {"max_batch_size": 1},
        [(0, 1, "k", 2), (0, 1, "k", 1)],
        [0, 0],
        [(0,), (1,)],
    ),
]


@pytest.mark.parametrize(
    ("policy_kwargs", "arrivals", "steps", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_batches_formed(
    policy_kwargs: dict[str, Any],
    arrivals: list[Arrival],
    steps: list[int],
    expected: list[tuple[int, ...] | None],
) -> None:
    assert replay(DynamicBatchingPolicy(**policy_kwargs), arrivals, steps) == expected


@pytest.mark.parametrize(
    ("policy_kwargs", "arrivals", "now", "expected"),
    [
        ({"max_batch_size": 8}, [], 0, None),
        ({"max_batch_size": 8}, [(0, 1)], 7, 7),
        ({"max_batch_size": 8, "max_queue_delay_us": 100}, [(0, 1), (30, 1)], 40, 100 * US),
        ({"max_batch_size": 8, "max_queue_delay_us": 100}, [(0, 8)], 40, 40),
        (
            {
                "max_batch_size": 8,
                "max_queue_delay_us": 100,
                "default_queue_policy": QueuePolicy(default_timeout_us=50),
            },
            [(0, 1)],
            40,
            50 * US + 1,
        ),
        (
            {
                "max_batch_size": 8,
                "max_queue_delay_us": 100,
                "default_queue_policy": QueuePolicy(default_timeout_us=500),
            },
            [(0, 1)],
            40,
            100 * US,
        ),
        (
            {
                "max_batch_size": 8,
                "max_queue_delay_us": 100,
                "default_queue_policy": QueuePolicy(default_timeout_us=50),
            },
            [(0, 1)],
            50 * US + 1,
            50 * US + 1,
        ),
    ],
)
def test_wake_at(
    policy_kwargs: dict[str, Any], arrivals: list[Arrival], now: int, expected: int | None
) -> None:
    batcher = DynamicBatcher(DynamicBatchingPolicy(**policy_kwargs))
    for index, arrival in enumerate(arrivals):
        batcher.offer(pending(index, arrival), arrival[0])
    assert batcher.wake_at(now) == expected


def test_batch_properties() -> None:
    batch = Batch((Pending("a", 0, "k", 0), Pending("b", 3, "k", 0)))
    assert batch.size == 4
    assert batch.batch_sizes == (0, 3)


def test_oversized_request_is_rejected_as_invalid() -> None:
    batcher = DynamicBatcher(DynamicBatchingPolicy(4))
    assert batcher.offer(Pending("a", 5, "k", 0), 0) == Rejected(
        "batch size 5 exceeds max_batch_size 4", "INVALID_ARG"
    )
    assert len(batcher) == 0


def test_max_queue_size_per_level() -> None:
    policy = DynamicBatchingPolicy(
        4,
        priority_levels=2,
        default_priority_level=2,
        priority_queue_policy={1: QueuePolicy(max_queue_size=1)},
        default_queue_policy=QueuePolicy(max_queue_size=2),
    )
    batcher = DynamicBatcher(policy)
    full = Rejected("Exceeds maximum queue size", "UNAVAILABLE")
    assert batcher.offer(Pending("h1", 1, "k", 0, priority=1), 0) == Accepted()
    assert batcher.offer(Pending("h2", 1, "k", 0, priority=1), 0) == full
    assert batcher.offer(Pending("l1", 1, "k", 0, priority=2), 0) == Accepted()
    assert batcher.offer(Pending("l2", 1, "k", 0), 0) == Accepted()
    assert batcher.offer(Pending("l3", 1, "k", 0, priority=7), 0) == full
    assert len(batcher) == 3
    assert batcher.take(0) == Batch(
        (
            Pending("h1", 1, "k", 0, priority=1),
            Pending("l1", 1, "k", 0, priority=2),
            Pending("l2", 1, "k", 0),
        )
    )
    assert batcher.offer(Pending("h3", 1, "k", 0, priority=1), 0) == Accepted()


def test_reject_timeout_is_reported_once() -> None:
    policy = DynamicBatchingPolicy(
        8, max_queue_delay_us=100, default_queue_policy=QueuePolicy(default_timeout_us=50)
    )
    batcher = DynamicBatcher(policy)
    item = Pending("a", 1, "k", 0)
    batcher.offer(item, 0)
    assert batcher.expired(50 * US) == []  # expired only when strictly older
    assert batcher.expired(50 * US + 1) == [Expired(item, "Request timeout expired")]
    assert Expired.code == "UNAVAILABLE"
    assert batcher.expired(60 * US) == []
    assert len(batcher) == 0
    assert batcher.take(200 * US) is None
    assert batcher.wake_at(200 * US) is None


def test_timeout_found_by_take_is_reported_by_expired() -> None:
    policy = DynamicBatchingPolicy(
        8,
        default_queue_policy=QueuePolicy(default_timeout_us=50, allow_timeout_override=True),
    )
    batcher = DynamicBatcher(policy)
    batcher.offer(Pending("old", 1, "k", 0, timeout_us=10), 0)
    batcher.offer(Pending("new", 1, "k", 40 * US), 40 * US)
    assert batcher.wake_at(40 * US) == 40 * US
    assert batcher.take(40 * US) == Batch((Pending("new", 1, "k", 40 * US),))
    assert batcher.wake_at(40 * US) == 40 * US  # an expiry is waiting to be reported
    assert [e.item.id for e in batcher.expired(40 * US)] == ["old"]
    assert batcher.wake_at(40 * US) is None


def test_delay_timeout_moves_behind_its_level_and_still_runs() -> None:
    policy = DynamicBatchingPolicy(
        1,
        priority_levels=2,
        default_priority_level=1,
        priority_queue_policy={
            1: QueuePolicy("DELAY", default_timeout_us=100, allow_timeout_override=True)
        },
    )
    batcher = DynamicBatcher(policy)
    for item in (
        Pending("slow", 1, "k", 0, timeout_us=10),
        Pending("a", 1, "k", 0),
        Pending("b", 1, "k", 0),
        Pending("low", 1, "k", 0, priority=2),
    ):
        batcher.offer(item, 0)
    assert batcher.wake_at(0) == 0
    assert batcher.expired(10 * US + 1) == []
    order = []
    while (batch := batcher.take(10 * US + 1)) is not None:
        order.extend(item.id for item in batch.items)
    assert order == ["a", "b", "slow", "low"]


def test_delayed_request_no_longer_times_out() -> None:
    policy = DynamicBatchingPolicy(
        8,
        max_queue_delay_us=1_000,
        default_queue_policy=QueuePolicy("DELAY", default_timeout_us=10),
    )
    batcher = DynamicBatcher(policy)
    batcher.offer(Pending("a", 1, "k", 0), 0)
    assert batcher.wake_at(0) == 10 * US + 1
    assert batcher.expired(10 * US + 1) == []
    # Its age now exceeds nothing but the delay window, which is all it waits for.
    assert batcher.wake_at(10 * US + 1) == 1_000 * US
    assert batcher.take(1_000 * US) == Batch((Pending("a", 1, "k", 0),))


def test_cancel_removes_a_queued_request() -> None:
    policy = DynamicBatchingPolicy(
        8, max_queue_delay_us=100, default_queue_policy=QueuePolicy(default_timeout_us=50)
    )
    batcher = DynamicBatcher(policy)
    batcher.offer(Pending("a", 1, "k", 0), 0)
    batcher.offer(Pending("b", 1, "k", 0), 0)
    assert batcher.cancel("a") == Pending("a", 1, "k", 0)
    assert batcher.cancel("a") is None
    assert len(batcher) == 1
    assert [e.item.id for e in batcher.expired(100 * US)] == ["b"]
    assert batcher.wake_at(100 * US) is None
