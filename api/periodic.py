"""A coroutine run on a timer inside the gateway's event loop (dashboard sampling, host metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import redis.exceptions

from broker.outage import OutageLog

logger = logging.getLogger(__name__)


class Periodic:
    """Calls ``action`` every ``interval_s`` seconds until stopped.

    A failing call is logged and the timer goes on; while Redis cannot be reached, one
    line per outage (:class:`broker.outage.OutageLog`), not a traceback per call.
    :meth:`stop` cancels the task and waits for it (bounded by the running call).

    Args:
        name: task name, also used in log lines.
        interval_s: seconds between two calls.
        action: the coroutine function to call.
    """

    def __init__(self, name: str, interval_s: float, action: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self.interval_s = interval_s
        self._action = action
        self._task: asyncio.Task[None] | None = None
        self._outage = OutageLog(logger, name)

    def start(self) -> None:
        """Start the timer (idempotent); the first call happens at once."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        """Cancel the timer and wait for it to end."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self._action()
                self._outage.ok()
            except asyncio.CancelledError:
                raise
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                self._outage.failed(exc)
            except Exception:
                logger.exception("%s failed", self.name)
            await asyncio.sleep(self.interval_s)
