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

Two limits uvicorn's protocol lacks: a request whose head (request line and headers)
passes :data:`MAX_HEAD_BYTES` is answered 431 and the connection closed, instead of
being buffered without end; and an ``Upgrade`` header (``curl --http2`` sends ``Upgrade:
h2c`` on plain HTTP) is ignored, as Triton ignores it: the request is answered over
HTTP/1.1 and the connection goes on (llhttp stops parsing at an upgrade, so the body
of such a request is collected here and the parser restarted after it).
"""

from __future__ import annotations

import functools
from typing import Any

import httptools

from api.http.coalescing import CoalescingHttpToolsProtocol, CoalescingTransport
from api.http.infer import InferEndpoint

#: most bytes a request line and its headers may take, in bytes.
MAX_HEAD_BYTES = 1 << 20
#: longest a refused connection is kept open to drain what the client still sends, in s.
LINGER_S = 5.0

_TOO_LARGE = b'{"error":"request line and headers exceed 1048576 bytes"}'

__all__ = ["HttpProtocol"]


class HttpProtocol(CoalescingHttpToolsProtocol):
    """uvicorn's httptools protocol with coalesced writes and half-close support.

    Passed to ``uvicorn.Config(http=...)``.
    """

    _head_bytes = -1  # bytes of the head read so far; -1 between heads
    _upgrade_body_left = 0  # body bytes of an ignored-upgrade request still to collect
    _upgrade_pending = False  # an ignored-upgrade request waits for its body
    _discarding = False  # refused (431): what the client still sends is dropped

    def data_received(self, data: bytes) -> None:
        """Feed the parser; enforce :data:`MAX_HEAD_BYTES`; carry on past an ``Upgrade``."""
        if self._discarding or self.transport.is_closing():
            return
        if self._upgrade_body_left:
            data = self._collect_upgrade_body(data)
            if not data:
                return
        if self._head_bytes >= 0:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse_head()
                return
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
        except httptools.HttpParserUpgrade as exc:
            # ignored: answer over HTTP/1.1 and parse what follows with a fresh parser
            self.parser = httptools.HttpRequestParser(self)
            rest = data[exc.args[0] :] if exc.args else b""
            if self._upgrade_pending:
                rest = self._collect_upgrade_body(rest)
            if rest:
                self.data_received(rest)

    def _collect_upgrade_body(self, data: bytes) -> bytes:
        """Give the waiting ignored-upgrade request its body; returns what follows it."""
        take = data[: self._upgrade_body_left]
        self._upgrade_body_left -= len(take)
        if take:
            self.on_body(take)
        if not self._upgrade_body_left:
            self._upgrade_pending = False
            self.on_message_complete()
        return data[len(take) :]

    def _refuse_head(self) -> None:
        """431, then a lingering close: send the answer and FIN, discard what the client
        still sends (closing with unread data would reset the connection and lose the
        answer), close after :data:`LINGER_S` at most."""
        self._head_bytes = -1
        self._discarding = True
        answer = (
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(_TOO_LARGE) + _TOO_LARGE
        )
        transport: Any = self.transport
        if isinstance(transport, CoalescingTransport):
            transport.write_now(answer)
        else:
            transport.write(answer)
        if transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(LINGER_S, transport.close)
        else:
            transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._head_bytes = -1
        if self.parser.should_upgrade():
            # llhttp reads no body after an upgrade request's head: collect it ourselves
            length = next((v for k, v in self.headers if k == b"content-length"), b"0")
            if length.isdigit() and int(length) > 0:
                self._upgrade_body_left = int(length)
                self._upgrade_pending = True
        super().on_headers_complete()

    def _should_upgrade(self) -> bool:
        return False  # no WebSocket routes: every Upgrade is ignored

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:  # type: ignore[override]
        """Start a request: the task-free path where it applies, else uvicorn's ASGI task."""
        if (
            isinstance(app, InferEndpoint)
            and not cycle.access_log
            and (route := app.accepts(cycle.scope)) is not None
        ):
            cycle.fast_app = app
            cycle.fast_route = route
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
        if self._upgrade_pending and self._upgrade_body_left:
            return  # llhttp's early end of an upgrade request: its body is still to come
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
            cycle,
            cycle.fast_route,
            bytes(cycle.body),
            functools.partial(super()._start_asgi_task, cycle, app),
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
