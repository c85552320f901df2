"""The HTTP/1.1 protocol the gateway hands uvicorn: coalesced writes, and an answer
for clients that half-close.

A client may send its request and then shut down its sending side
(``shutdown(SHUT_WR)``, as ``nc -N`` and some HTTP/1.0 clients do) while it waits
for the answer. uvicorn's protocol lets asyncio close the transport on that EOF, so
the request in flight was dropped unanswered. :class:`HttpProtocol` keeps the
sending side open while a complete request is still being answered, answers it
(and any pipelined before it), then closes the connection. An EOF in the middle
of a request body, or on an idle connection, still closes at once.
"""

from __future__ import annotations

from api.http.coalescing import CoalescingHttpToolsProtocol

__all__ = ["HttpProtocol"]


class HttpProtocol(CoalescingHttpToolsProtocol):
    """uvicorn's httptools protocol with coalesced writes and half-close support.

    Passed to ``uvicorn.Config(http=...)``.
    """

    def eof_received(self) -> bool | None:  # type: ignore[override]
        """The peer sent EOF. True (keep the transport open for writing) while the
        newest request was read whole and is not answered yet; that request then ends
        the connection (``keep_alive`` off). None lets asyncio close the transport."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete or cycle.more_body:
            return None
        cycle.keep_alive = False
        return True
