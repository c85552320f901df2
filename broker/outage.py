"""One log line per Redis outage instead of one per failed call.

While Redis cannot be reached, every request, poll and timer of a process fails the
same way, tens of times a second. :class:`OutageLog` logs the first failure, then at
most one line per interval with the number of failures it did not log, and (for a
caller that reports successes) one line when calls succeed again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["REMIND_S", "OutageLog"]

#: longest silence between two lines about the same outage, in seconds.
REMIND_S = 30.0


class OutageLog:
    """Rate-limited warnings about one dependency that fails (Redis, for a process part).

    Args:
        logger: where the lines go (level WARNING).
        what: who fails to reach Redis, as the lines name it ("control stream",
            "dashboard sampling", "requests").
        remind_s: longest silence between two lines while failures go on, in seconds.
        clock: monotonic seconds; injectable for tests.
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        remind_s: float = REMIND_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._what = what
        self._remind_s = remind_s
        self._clock = clock
        self._since = 0.0
        self._last_line = 0.0
        self._failures = 0
        self._quiet = 0

    @property
    def down(self) -> bool:
        """Whether the last call failed."""
        return self._failures > 0

    def failed(self, exc: BaseException) -> None:
        """Count one failure; log it when it is the first since the last success or since
        the last line, or when the last line is ``remind_s`` seconds old."""
        now = self._clock()
        self._failures += 1
        if self._failures == 1:
            self._since = now
        elif now - self._last_line < self._remind_s:
            self._quiet += 1
            return
        reason = str(exc) or type(exc).__name__  # a bare TimeoutError has no text
        if self._quiet:
            self._logger.warning(
                "%s: Redis unreachable: %s (%d more failures since the last line)",
                self._what,
                reason,
                self._quiet,
            )
        else:
            self._logger.warning("%s: Redis unreachable: %s", self._what, reason)
        self._last_line, self._quiet = now, 0

    def ok(self) -> None:
        """A call succeeded: end the outage (one line when there was one)."""
        if not self._failures:
            return
        self._logger.warning(
            "%s: Redis answers again after %.1f s (%d failed calls)",
            self._what,
            self._clock() - self._since,
            self._failures,
        )
        self._failures = self._quiet = 0
