"""OutageLog: one line per Redis outage, reminders with counts, one line at recovery."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.exceptions

from sluice.api.periodic import Periodic
from sluice.broker.outage import OutageLog

LOGGER = "test.outage"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_one_line_per_outage_with_reminders_and_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    clock = Clock()
    log = OutageLog(logging.getLogger(LOGGER), "control stream", remind_s=30, clock=clock)
    log.ok()  # no outage: nothing to say
    assert _lines(caplog) == [] and not log.down

    error = ConnectionError("Connection refused")
    for _ in range(50):  # 5 s of failures at 10 a second
        log.failed(error)
        clock.now += 0.1
    assert _lines(caplog) == ["control stream: Redis unreachable: Connection refused"]
    assert log.down

    clock.now = 131.0  # 31 s after the first line
    log.failed(error)
    assert _lines(caplog)[1:] == [
        "control stream: Redis unreachable: Connection refused "
        "(49 more failures since the last line)"
    ]
    clock.now = 133.5
    log.ok()
    assert _lines(caplog)[2:] == [
        "control stream: Redis answers again after 33.5 s (51 failed calls)"
    ]
    assert not log.down

    log.failed(error)  # a new outage is logged at once
    assert len(_lines(caplog)) == 4
    assert _lines(caplog)[3] == "control stream: Redis unreachable: Connection refused"


def test_without_successes_a_line_at_most_every_interval(caplog: pytest.LogCaptureFixture) -> None:
    """Per-request callers report only failures: still one line per interval, not per call."""
    caplog.set_level(logging.WARNING, LOGGER)
    clock = Clock()
    log = OutageLog(logging.getLogger(LOGGER), "requests", remind_s=30, clock=clock)
    for _ in range(400):  # 50 s at 8 a second
        log.failed(TimeoutError("Timeout reading from socket"))
        clock.now += 0.125
    lines = _lines(caplog)
    assert len(lines) == 2
    assert lines[1].endswith("(239 more failures since the last line)")


def test_periodic_logs_a_redis_outage_once_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "sluice.api.periodic")
    calls = 0

    async def sample() -> None:
        nonlocal calls
        calls += 1
        if calls <= 20:
            raise redis.exceptions.ConnectionError("Error 111 connecting")
        if calls == 21:
            raise ValueError("a bug")

    async def main() -> None:
        timer = Periodic("sluice-dashboard", 0.001, sample)
        timer.start()
        while calls < 25:
            await asyncio.sleep(0.005)
        await timer.stop()

    asyncio.run(main())
    records = [r for r in caplog.records if r.name == "sluice.api.periodic"]
    texts = [r.getMessage() for r in records]
    assert texts[0] == "sluice-dashboard: Redis unreachable: Error 111 connecting"
    assert texts[1] == "sluice-dashboard failed"  # any other error: with its traceback
    assert records[1].exc_info is not None and records[0].exc_info is None
    assert texts[2].startswith("sluice-dashboard: Redis answers again after ")
    assert texts[2].endswith("(20 failed calls)")
    assert len(records) == 3
