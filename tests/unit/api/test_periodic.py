"""The gateway's timers (:class:`api.periodic.Periodic`) stop within a deadline."""

from __future__ import annotations

import asyncio
import time

from sluice.api.periodic import STOP_TIMEOUT_S, Periodic


def test_stop_ends_a_timer_whose_call_swallows_its_cancellation() -> None:
    """A call that turns its cancellation into a return (as a client library may) had
    kept the timer running and :meth:`Periodic.stop` waiting for ever, which held a
    gateway's exit up; now no call starts once stopping began."""
    calls: list[str] = []

    async def swallowing() -> None:
        calls.append("call")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            calls.append("cancelled, swallowed")

    async def scenario() -> float:
        timer = Periodic("test-timer", 0.01, swallowing)
        timer.start()
        await asyncio.sleep(0.05)  # in its first call
        started = time.monotonic()
        await asyncio.wait_for(timer.stop(), STOP_TIMEOUT_S + 5)
        took = time.monotonic() - started
        await asyncio.sleep(0.1)  # no call after the stop
        return took

    took = asyncio.run(scenario())
    assert calls == ["call", "cancelled, swallowed"]
    assert took < 1.0, took


def test_stop_gives_up_on_a_call_that_never_ends() -> None:
    """A call that ignores its cancellation and goes on is waited for
    :data:`STOP_TIMEOUT_S` at most."""

    async def scenario() -> float:
        done = asyncio.Event()

        async def stubborn() -> None:
            while not done.is_set():
                try:
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    continue

        timer = Periodic("test-stubborn", 0.01, stubborn)
        timer.start()
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await asyncio.wait_for(timer.stop(), STOP_TIMEOUT_S + 5)
        took = time.monotonic() - started
        done.set()
        await asyncio.sleep(0.1)
        return took

    took = asyncio.run(scenario())
    assert STOP_TIMEOUT_S - 0.1 <= took < STOP_TIMEOUT_S + 1, took
