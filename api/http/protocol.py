"""The HTTP/1.1 protocol the gateway hands uvicorn: coalesced writes, and an answer
for clients that half-close.

A client may send its request and then shut down its sending side
(``shutdown(SHUT_WR)``, as ``nc -N`` and some HTTP/1.0 clients do) while it waits
for the answer. uvicorn's protocol lets asyncio close the transport on that EOF, so
the request in flight was dropped unanswered. :class:`HttpProtocol` keeps the
sending side open while a complete request is still being answered, answers it
(and any pipelined before it), then closes the connection. An EOF in the middle
of a request body, or on an idle connection, still closes at once.

Inference requests take a task-free path: uvicorn would start an asyncio task per
request and pass its body and answer through ASGI messages; for a ``POST`` to an
infer route with a ``Content-Length`` (:meth:`InferEndpoint.accepts`) the protocol
instead hands the body, once read whole, to :meth:`InferEndpoint.answer`, which
queues the request and writes the answer from the response future's callback. At
32 clients this is the gateway's serial work per request, and that work decides
how soon a batch's answers go out and the next batch's requests come in.
Everything else, and requests for a model whose view is not cached yet, stay
ASGI calls.
"""

from __future__ import annotations

import functools
from typing import Any

from api.http.coalescing import CoalescingHttpToolsProtocol
from api.http.infer import InferEndpoint

__all__ = ["HttpProtocol"]


class HttpProtocol(CoalescingHttpToolsProtocol):
    """uvicorn's httptools protocol with coalesced writes and half-close support.

    Passed to ``uvicorn.Config(http=...)``.
    """

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:  # type: ignore[override]
        """Start a request: the task-free path where it applies, else uvicorn's ASGI task."""
        if (
            isinstance(app, InferEndpoint)
            and not cycle.access_log
            and app.accepts(cycle.scope)
        ):
            cycle.fast_app = app
            if not cycle.more_body:
                self._answer(cycle)
            return
        super()._start_asgi_task(cycle, app)

    def on_body(self, body: bytes) -> None:
        """Collect a body; a task-free request's (bounded by its ``Content-Length``)
        keeps the connection reading, as nobody calls ASGI ``receive`` for it."""
        super().on_body(body)
        if getattr(self.cycle, "fast_app", None) is not None:
            self.flow.resume_reading()

    def on_message_complete(self) -> None:
        """The body was read whole: a started task-free request is answered now."""
        super().on_message_complete()
        cycle = self.cycle
        if (
            cycle is not None
            and getattr(cycle, "fast_app", None) is not None
            and not cycle.more_body
        ):
            self._answer(cycle)

    def _answer(self, cycle: Any) -> None:
        app: InferEndpoint = cycle.fast_app
        cycle.fast_app = None
        # on fallback the ASGI call reads the body from the cycle as usual
        if app.answer(
            cycle, bytes(cycle.body), functools.partial(super()._start_asgi_task, cycle, app)
        ):
            cycle.body = bytearray()

    def eof_received(self) -> bool | None:  # type: ignore[override]
        """The peer sent EOF. True (keep the transport open for writing) while the
        newest request was read whole and is not answered yet; that request then ends
        the connection (``keep_alive`` off). None lets asyncio close the transport."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete or cycle.more_body:
            return None
        cycle.keep_alive = False
        return True
