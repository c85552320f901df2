"""The statistics hash's counters, read back as Triton's statistics extension answers."""

from __future__ import annotations

from sluice.broker.stats_store import (
    ExecutionTimes,
    StatsDelta,
    StatsShard,
    VersionStats,
    merge_stats,
    triton_model_stats,
)


def _counters(*deltas: StatsDelta) -> VersionStats:
    total: dict[str, int] = {}
    for delta in deltas:
        for name, value in delta.counts.items():
            total[name] = total.get(name, 0) + value
    return VersionStats(total)


def test_a_request_cancelled_in_the_queue_is_a_failure_without_a_response() -> None:
    """Triton counts a request cancelled while queued as failed (reason CANCELED) but, as
    the model never saw it, in no response statistic; failed responses are the rest."""
    ran = StatsDelta()
    times = ExecutionTimes(1_000, 5_000, 2_000)
    ran.execution(2, times)
    ran.successes(count=1, inferences=1, request_ns=9_000, queue_ns=1_000, times=times, now_ms=1)
    ran.failure(request_ns=8_000, reason="BACKEND")
    cancelled = StatsDelta()
    cancelled.failure(request_ns=50_000, reason="CANCELED")
    stats = triton_model_stats("m", 1, _counters(ran, cancelled))
    assert stats["inference_stats"]["fail"] == {"count": 2, "ns": 58_000}
    assert stats["inference_stats"]["success"] == {"count": 1, "ns": 9_000}
    response = stats["response_stats"]["0"]
    assert response["fail"] == {"count": 1, "ns": 8_000}
    assert response["success"] == {"count": 1, "ns": 9_000}
    assert response["cancel"] == {"count": 0, "ns": 0}


def test_only_cancelled_requests_leave_no_response_statistics() -> None:
    cancelled = StatsDelta()
    cancelled.failure(request_ns=50_000, reason="CANCELED")
    stats = triton_model_stats("m", 1, _counters(cancelled))
    assert stats["inference_stats"]["fail"] == {"count": 1, "ns": 50_000}
    assert stats["response_stats"] == {}
    assert stats["execution_count"] == 0


def test_a_shard_writes_whole_once_then_the_totals_of_changed_fields() -> None:
    shard = StatsShard("s", "set", {"execution_count": 7, "fail_count": 2})
    first = StatsDelta()
    first.execution(4, ExecutionTimes(1, 2, 3))
    first.last_inference_ms = 50
    assert shard.apply(first) == [
        ("HSET", "s", "execution_count", 8, "fail_count", 2, "batch:4:count", 1,
         "batch:4:compute_input_ns", 1, "batch:4:compute_infer_ns", 2,
         "batch:4:compute_output_ns", 3, "last_inference_ms", 50),
        ("SADD", "set", "s"),
    ]  # fmt: skip
    second = StatsDelta()
    second.failure(request_ns=9, reason="OTHER")
    second.last_inference_ms = 40  # older than the total: not written
    assert shard.apply(second) == [
        ("HSET", "s", "fail_count", 3, "fail_ns", 9, "fail_reason:OTHER", 1)
    ]
    assert shard.apply(StatsDelta()) == []
    assert shard.totals["last_inference_ms"] == 50


def test_merging_adds_counters_and_keeps_the_latest_inference() -> None:
    stats = merge_stats(
        [
            {b"fail_count": b"1", b"last_inference_ms": b"900"},
            {b"fail_count": b"2", b"success_count": b"5", b"last_inference_ms": b"1000"},
            {},
        ]
    )
    assert stats.counters == {"fail_count": 3, "success_count": 5, "last_inference_ms": 1000}
