"""Tests for batching.policy: validation, levels and timeouts.

Rules: docs/reference/model-configuration.md.
"""

from __future__ import annotations

from typing import Any

import pytest

from sluice.batching import BatchingPolicyError, DynamicBatchingPolicy, QueuePolicy

DELAY_10 = QueuePolicy(timeout_action="DELAY", default_timeout_us=10)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": -1}, "max_batch_size must be >= 0"),
        ({"max_batch_size": 8, "preferred_batch_sizes": (0,)}, "preferred size 0"),
        ({"max_batch_size": 8, "preferred_batch_sizes": (4, 9)}, "preferred size 9"),
        ({"max_batch_size": 0, "preferred_batch_sizes": (1,)}, "max_batch_size=0"),
        ({"max_batch_size": 8, "max_queue_delay_us": -1}, "max_queue_delay_microseconds"),
        ({"max_batch_size": 8, "priority_levels": -1}, "priority_levels must be >= 0"),
        ({"max_batch_size": 8, "priority_levels": 2}, "default priority level 0"),
        (
            {"max_batch_size": 8, "priority_levels": 2, "default_priority_level": 3},
            "range [1, 2]",
        ),
        (
            {
                "max_batch_size": 8,
                "priority_levels": 2,
                "default_priority_level": 1,
                "priority_queue_policy": {3: QueuePolicy()},
            },
            "priority queue policy must have priority level in range [1, 2], got 3",
        ),
        (
            {"max_batch_size": 8, "priority_queue_policy": {1: QueuePolicy()}},
            "range [1, 0]",
        ),
        (
            {
                "max_batch_size": 8,
                "preserve_ordering": True,
                "priority_levels": 2,
                "default_priority_level": 1,
            },
            "priority_levels > 1",
        ),
        (
            {"max_batch_size": 8, "preserve_ordering": True, "default_queue_policy": DELAY_10},
            "DELAY",
        ),
    ],
)
def test_invalid_policy_is_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(BatchingPolicyError, match=message.replace("[", r"\[").replace("]", r"\]")):
        DynamicBatchingPolicy(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"timeout_action": "DROP"},
        {"default_timeout_us": -1},
        {"max_queue_size": -1},
    ],
)
def test_invalid_queue_policy_is_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(BatchingPolicyError):
        QueuePolicy(**kwargs)


def test_policy_error_is_a_value_error_with_invalid_arg_code() -> None:
    with pytest.raises(ValueError) as info:
        DynamicBatchingPolicy(max_batch_size=-1)
    assert isinstance(info.value, BatchingPolicyError)
    assert info.value.code == "INVALID_ARG"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_batch_size": 0},
        {"max_batch_size": 8, "preferred_batch_sizes": (1, 8), "max_queue_delay_us": 100},
        {
            "max_batch_size": 8,
            "preserve_ordering": True,
            "priority_levels": 1,
            "default_priority_level": 1,
        },
        {
            "max_batch_size": 8,
            "preserve_ordering": True,
            "default_queue_policy": QueuePolicy(timeout_action="DELAY"),
        },
        {
            "max_batch_size": 8,
            "preserve_ordering": True,
            "default_queue_policy": QueuePolicy(default_timeout_us=10),
        },
        {
            "max_batch_size": 0,
            "priority_levels": 3,
            "default_priority_level": 3,
            "priority_queue_policy": {1: DELAY_10, 3: QueuePolicy(max_queue_size=2)},
        },
    ],
)
def test_valid_policy_is_accepted(kwargs: dict[str, Any]) -> None:
    policy = DynamicBatchingPolicy(**kwargs)
    hash(policy)
    assert policy == DynamicBatchingPolicy(**kwargs)


def test_priority_queue_policy_is_read_only() -> None:
    source = {1: DELAY_10}
    policy = DynamicBatchingPolicy(
        max_batch_size=4,
        priority_levels=1,
        default_priority_level=1,
        priority_queue_policy=source,
    )
    source[1] = QueuePolicy()
    assert policy.priority_queue_policy[1] == DELAY_10
    with pytest.raises(TypeError):
        policy.priority_queue_policy[1] = QueuePolicy()  # type: ignore[index]


@pytest.mark.parametrize(
    ("preferred", "max_batch_size", "expected"),
    [((), 8, 8), ((2, 6, 4), 8, 6), ((), 0, 0)],
)
def test_max_preferred_batch_size(
    preferred: tuple[int, ...], max_batch_size: int, expected: int
) -> None:
    policy = DynamicBatchingPolicy(max_batch_size, preferred_batch_sizes=preferred)
    assert policy.max_preferred_batch_size == expected


@pytest.mark.parametrize(
    ("levels", "default", "priority", "expected"),
    [
        (0, 0, 0, 0),
        (0, 0, 5, 0),
        (3, 2, 0, 2),
        (3, 2, 1, 1),
        (3, 2, 3, 3),
        (3, 2, 4, 2),
        (3, 2, -1, 2),
    ],
)
def test_level_of(levels: int, default: int, priority: int, expected: int) -> None:
    policy = DynamicBatchingPolicy(8, priority_levels=levels, default_priority_level=default)
    assert policy.level_of(priority) == expected


def test_queue_policy_falls_back_to_default() -> None:
    own = QueuePolicy(max_queue_size=3)
    policy = DynamicBatchingPolicy(
        8, priority_levels=2, default_priority_level=2, priority_queue_policy={1: own}
    )
    assert policy.queue_policy(1) is own
    assert policy.queue_policy(2) == QueuePolicy()


@pytest.mark.parametrize(
    ("default_us", "override", "requested_us", "expected_ns"),
    [
        (0, False, None, None),
        (0, True, 5, None),  # default 0 = no timeout; the request value is ignored
        (100, False, None, 100_000),
        (100, False, 5, 100_000),  # override not allowed
        (100, True, 5, 5_000),  # may shorten
        (100, True, 500, 100_000),  # never lengthen
        (100, True, 0, 100_000),  # 0 = not given
    ],
)
def test_timeout_ns(
    default_us: int, override: bool, requested_us: int | None, expected_ns: int | None
) -> None:
    policy = DynamicBatchingPolicy(
        8,
        default_queue_policy=QueuePolicy(
            default_timeout_us=default_us, allow_timeout_override=override
        ),
    )
    assert policy.timeout_ns(0, requested_us) == expected_ns
