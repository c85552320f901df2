"""Latency histograms of the summary metrics: bins, quantiles, flushes, a real Redis window."""

from __future__ import annotations

import math
import re

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from sluice.broker.keys import KeySchema
from sluice.broker.latency_window import (
    AGE_BUCKET_S,
    FLUSH_NS,
    LatencyRecorder,
    bin_floor,
    merge_windows,
    parse_quantiles,
    quantile,
    window_keys,
)

S = 1_000_000_000


@given(st.integers(min_value=0, max_value=10**12))
def test_a_bin_holds_its_value_and_is_narrow(us: int) -> None:
    floor = bin_floor(us)
    assert floor <= us
    if us < 128:
        assert floor == us
    else:
        width = 1 << (floor.bit_length() - 7)
        assert us < floor + width
        assert width / floor <= 1 / 64
    assert bin_floor(floor) == floor


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=0, max_value=10**9))
def test_bins_keep_the_order_of_values(a: int, b: int) -> None:
    if a <= b:
        assert bin_floor(a) <= bin_floor(b)


def test_quantiles_of_a_known_histogram() -> None:
    bins: dict[int, int] = {}
    for us in range(1, 1001):  # 1..1000 µs, one each
        floor = bin_floor(us)
        bins[floor] = bins.get(floor, 0) + 1
    assert quantile(bins, 0.5) == pytest.approx(500, rel=0.01)
    assert quantile(bins, 0.9) == pytest.approx(900, rel=0.01)
    assert quantile(bins, 0.999) == pytest.approx(999, rel=0.01)
    assert quantile(bins, 0.0) == 1
    assert quantile(bins, 1.0) == pytest.approx(1000, rel=0.01)
    assert quantile({40: 3}, 0.99) == 40
    assert math.isnan(quantile({}, 0.5))


def test_a_recorder_waits_a_second_then_writes_each_bin_once() -> None:
    recorder = LatencyRecorder("p:{m}:latency:1:")
    t0 = 1_700_000_000 * S
    recorder.observe_batch([100, 100, 5000], [10, 20, 20], (7, 900, 3), t0)
    assert recorder.flush(t0 + FLUSH_NS - 1) == []
    commands = recorder.flush(t0 + FLUSH_NS)
    key = f"p:{{m}}:latency:1:{(t0 + FLUSH_NS) // S // AGE_BUCKET_S}"
    increments = {c[2]: c[3] for c in commands if c[0] == "HINCRBY"}
    assert all(c[1] == key for c in commands)
    assert increments == {
        "request:100": 2,
        f"request:{bin_floor(5000)}": 1,
        "queue:10": 1,
        "queue:20": 2,
        "compute_input:7": 3,  # the batch's durations, charged to each of its 3 requests
        f"compute_infer:{bin_floor(900)}": 3,
        "compute_output:3": 3,
    }
    assert commands[-1] == ("EXPIRE", key, 84)
    assert recorder.flush(t0 + 10 * FLUSH_NS) == []  # sent: nothing left
    recorder.observe_batch([1], [0], (0, 0, 0), t0)
    forced = recorder.flush(t0, force=True)  # at once, with no second waited
    assert forced[0] == ("HINCRBY", f"p:{{m}}:latency:1:{t0 // S // AGE_BUCKET_S}", "request:1", 1)


def test_merge_adds_windows_and_skips_foreign_fields() -> None:
    merged = merge_windows(
        [{b"request:100": b"2", b"queue:7": b"1"}, {b"request:100": b"3", b"junk": b"9"}, {}]
    )
    assert merged["request"] == {100: 5}
    assert merged["queue"] == {7: 1}
    assert merged["compute_infer"] == {}


def test_window_keys_are_the_last_five_age_buckets() -> None:
    now = 1_700_000_005.0
    current = int(now) // AGE_BUCKET_S
    assert window_keys("k:", int(now) * S) == [f"k:{current - i}" for i in range(5)]


def test_summary_quantiles_parse_as_triton_writes_them() -> None:
    assert parse_quantiles("0.5:0.05,0.9:0.01") == ((0.5, 0.05), (0.9, 0.01))
    assert parse_quantiles(" 0.99:0.001 ,") == ((0.99, 0.001),)
    assert parse_quantiles("0.5:0.05,0.5:0.01,0:0") == ((0.5, 0.05), (0.0, 0.0))
    for bad, words in (
        ("0.5", "no ':'"),
        ("a:b", "not two numbers"),
        ("1.5:0.1", "[0, 1]"),
        ("", "no <quantile>:<error> pair"),
    ):
        with pytest.raises(ValueError, match=re.escape(words)):
            parse_quantiles(bad)


def test_observations_of_two_instances_merge_in_redis(redis_url: str, key_prefix: str) -> None:
    """Two instances write their bins into the same age bucket; a reader adds up the
    window and gets the quantiles of all observations."""
    keys = KeySchema(key_prefix)
    prefix = keys.latency_window("m", 1)
    client = redis.Redis.from_url(redis_url)
    try:
        now = 1_700_000_000 * S
        first, second = LatencyRecorder(prefix), LatencyRecorder(prefix)
        first.observe_batch([1000] * 90, [5] * 90, (1, 2000, 1), now)
        second.observe_batch([9000] * 10, [5] * 10, (1, 20000, 1), now)
        with client.pipeline(transaction=False) as pipe:
            for command in first.flush(now, force=True) + second.flush(now, force=True):
                pipe.execute_command(*command)
            pipe.execute()
        windows = [client.hgetall(k) for k in window_keys(prefix, now)]
        merged = merge_windows(windows)
        assert quantile(merged["request"], 0.5) == pytest.approx(1000, rel=0.01)
        assert quantile(merged["request"], 0.95) == pytest.approx(9000, rel=0.01)
        assert quantile(merged["compute_infer"], 0.9) == pytest.approx(2000, rel=0.01)
        assert quantile(merged["compute_infer"], 0.91) == pytest.approx(20000, rel=0.01)
        assert 0 < client.ttl(window_keys(prefix, now)[0]) <= 84
    finally:
        client.close()
