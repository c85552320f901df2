"""A coroutine run on a timer inside the gateway's event loop (dashboard sampling, host metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import redis.exceptions

from sluice.broker.outage import OutageLog

logger = logging.getLogger(__name__)


#: longest wait of :meth:`Periodic.stop` for the running call to end, in s.
STOP_TIMEOUT_S = 2.0


class Periodic:
    """Calls ``action`` every ``interval_s`` seconds until stopped.

    A failing call is logged and the timer goes on; while Redis cannot be reached, one
    line per outage (:class:`broker.outage.OutageLog`), not a traceback per call.
    :meth:`stop` cancels the task and waits for it, at most :data:`STOP_TIMEOUT_S`.

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
        self._stopping = False

    def start(self) -> None:
        """Start the timer (idempotent); the first call happens at once."""
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        """Cancel the timer and wait for it to end, at most :data:`STOP_TIMEOUT_S`.

        A call that swallows its cancellation (returns or fails instead of raising it)
        ends the timer all the same: no call starts once stopping began. A gateway's
        exit had waited here for ever, its sampler going on (a clean-clone CI run left
        such a gateway behind).
        """
        self._stopping = True
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=STOP_TIMEOUT_S)
        if not done:
            logger.warning("%s did not stop within %.0f s; left running", self.name, STOP_TIMEOUT_S)
            return
        with contextlib.suppress(asyncio.CancelledError):
            task.exception()  # retrieved: nobody else awaits the task

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self._action()
                self._outage.ok()
            except asyncio.CancelledError:
                raise
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                self._outage.failed(exc)
            except Exception:
                logger.exception("%s failed", self.name)
            if self._stopping:
                return
            await asyncio.sleep(self.interval_s)
