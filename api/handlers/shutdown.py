"""Whether this gateway is stopping, shared by the handlers that answer differently then."""

from __future__ import annotations

import functools
from collections.abc import Callable

from sluice.broker.errors import ErrorCode, SluiceError

__all__ = ["Shutdown", "shutting_down"]


class Shutdown:
    """The gateway's shutdown state.

    :attr:`exiting` is set by :meth:`begin` (the gateway stops: liveness fails and new
    inference requests are refused) and by :meth:`seen_exiting` (the deployment was seen
    exiting while this gateway runs on: new inference requests are refused).
    """

    def __init__(self) -> None:
        #: new inference requests are refused (a 503 / UNAVAILABLE)
        self.exiting = False
        #: :meth:`begin` was called
        self._begun = False
        #: called once when shutdown begins (:meth:`on_begin`)
        self._callbacks: set[Callable[[], None]] = set()

    def begin(self) -> None:
        """The gateway stops: refuse new inference requests from now on; call what
        :meth:`on_begin` registered (once)."""
        self.exiting = True
        if self._begun:
            return
        self._begun = True
        for callback in list(self._callbacks):
            callback()
        self._callbacks.clear()

    def seen_exiting(self) -> None:
        """The deployment is exiting (the supervisor's ``startup`` fact says so): refuse
        new inference requests; nothing registered is called (the gateway runs on)."""
        self.exiting = True

    def on_begin(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Have ``callback`` called when :meth:`begin` is (at once if it was); returns the
        function that withdraws it."""
        if self._begun:
            callback()
            return lambda: None
        self._callbacks.add(callback)
        return functools.partial(self._callbacks.discard, callback)


def shutting_down(model: str) -> SluiceError:
    """The refusal of an inference request while the server exits."""
    return SluiceError(
        ErrorCode.UNAVAILABLE, "Server is shutting down: request refused", model=model
    )
