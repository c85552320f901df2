"""The start-up clock check against a real Redis: the offset of this host's clock from
Redis's ``TIME``, and the warning a gateway or instance logs when they disagree."""

from __future__ import annotations

import logging
import time

import pytest
import redis
import redis.asyncio

from sluice.broker.clock import (
    SKEW_WARN_S,
    check_clock,
    check_clock_async,
    clock_offset_s,
    clock_offset_s_async,
)

LOGGER = logging.getLogger("sluice.test.clock")


def test_offset_of_one_machine_is_near_zero(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        assert abs(clock_offset_s(client)) < 0.5
    finally:
        client.close()


@pytest.mark.parametrize(("shift_s", "word"), [(3.0, "ahead of"), (-3.0, "behind")])
def test_a_skewed_clock_is_logged(
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    shift_s: float,
    word: str,
) -> None:
    """This host's clock moved ``shift_s`` (Redis's is not): one warning naming the
    offset and the way it goes."""
    client = redis.Redis.from_url(redis_url)
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + shift_s)
    try:
        assert clock_offset_s(client) == pytest.approx(-shift_s, abs=0.5)
        with caplog.at_level(logging.WARNING, logger=LOGGER.name):
            check_clock(client, LOGGER)
    finally:
        client.close()
    [record] = caplog.records
    assert f"this host's clock is 3.0 s {word} the Redis host's" in record.getMessage()


def test_agreeing_clocks_and_an_unreachable_redis_log_nothing(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis.Redis.from_url(redis_url)
    gone = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    with caplog.at_level(logging.WARNING, logger=LOGGER.name):
        check_clock(client, LOGGER)
        check_clock(gone, LOGGER)  # the caller's own first command reports it
    client.close()
    assert not caplog.records
    assert SKEW_WARN_S == 1.0


async def test_async_client_sees_the_same_offset(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        assert abs(await clock_offset_s_async(client)) < 0.5
        real_time = time.time
        monkeypatch.setattr(time, "time", lambda: real_time() - 2.0)
        with caplog.at_level(logging.WARNING, logger=LOGGER.name):
            await check_clock_async(client, LOGGER)
    finally:
        await client.aclose()
    assert "2.0 s behind the Redis host's" in caplog.records[0].getMessage()
