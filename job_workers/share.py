"""How many rows a bulk job keeps in flight on a queue it shares with other traffic.

A model without priority levels has one queue per version, first come first served:
every bulk row in flight is one more request ahead of a synchronous one. So a bulk job
watches how many entries others add to the stream (``XINFO STREAM`` ``entries-added``,
less its own) and keeps about as many rows in flight as the others have in the queue
(Little's law: their arrival rate times the wait its own rows see in the same queue). A
synchronous request then has at most about as many rows ahead of it as it has peers, so
its wait at most about doubles; with no other traffic the job keeps its full window.
Background transfers yield to foreground traffic the same way (LEDBAT, RFC 6817). A
model with priority levels needs none of this: its rows go at the lowest level.
"""

from __future__ import annotations

__all__ = ["LOOK_EVERY_S", "FairShare", "share_window"]

#: how often a bulk job looks at the stream's traffic, in s.
LOOK_EVERY_S = 0.25


def share_window(others: int, seconds: float, wait_s: float, full: int, least: int) -> int:
    """Rows to keep in flight.

    Args:
        others: entries others added to the stream in the last ``seconds``.
        seconds: the length of that interval, in s.
        wait_s: how long the job's rows took from sending to answer, lately, in s.
        full: the window with no other traffic.
        least: the fewest rows in flight (the job goes on, slowly, under any load).
    """
    if others <= 0 or seconds <= 0:
        return full
    return max(least, min(full, round(others / seconds * wait_s)))


class FairShare:
    """The window of one bulk job run, from its looks at the stream.

    Args:
        full: the window with no other traffic.
        least: the fewest rows in flight.
    """

    def __init__(self, full: int, least: int) -> None:
        self.full = full
        self.least = least
        #: rows to keep in flight now: the least until the first look says more
        self.limit = least
        self.wait_s = 0.0
        self._last: tuple[int, int, float] | None = None  # (entries added, own sent, when)

    def answered(self, wait_s: float) -> None:
        """One of the job's rows was answered ``wait_s`` after it was sent."""
        self.wait_s = wait_s if self.wait_s == 0.0 else self.wait_s + 0.1 * (wait_s - self.wait_s)

    def look(self, added: int | None, sent: int, now_s: float) -> None:
        """The stream's ``entries-added`` (None: this Redis does not say, and the job
        keeps its full window), the rows the job sent so far, and the time (monotonic
        s)."""
        if added is None:
            self.limit = self.full
            return
        if self._last is not None:
            last_added, last_sent, last_s = self._last
            others = (added - last_added) - (sent - last_sent)
            self.limit = share_window(others, now_s - last_s, self.wait_s, self.full, self.least)
        self._last = (added, sent, now_s)
