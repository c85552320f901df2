"""The HTTP/1.1 protocol the gateway hands uvicorn: coalesced writes, and an answer
for clients that half-close.

A client may send its request and then shut down its sending side
(``shutdown(SHUT_WR)``, as ``nc -N`` and some HTTP/1.0 clients do) while it waits
for the answer. uvicorn's protocol lets asyncio close the transport on that EOF, which
drops the request in flight unanswered. :class:`HttpProtocol` keeps the
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

Four limits uvicorn's protocol lacks: a request whose head (request line and headers)
passes :data:`MAX_HEAD_BYTES` is answered 431 and the connection closed, instead of
being buffered without end; a request whose body passes the body limit
(``--http-max-input-size``: its ``Content-Length``, or the bytes of a chunked body read
so far) is answered 413 and the connection closed, on every route and before the body
is read; a request whose head or body stops arriving for the read
timeout (``--http-read-timeout-secs``, :data:`READ_TIMEOUT_S`) is answered 408 and the
connection closed, as is a connection that sends nothing at all for that long, instead
of being held open without end (a slow client holding many connections); and an
``Upgrade`` header (``curl --http2`` sends ``Upgrade:
h2c`` on plain HTTP) is ignored, as Triton ignores it: the request is answered over
HTTP/1.1 and the connection goes on (llhttp stops parsing at an upgrade, so the body
of such a request is collected here and the parser restarted after it).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import httptools
import orjson

from sluice.api.http.coalescing import CoalescingHttpToolsProtocol, CoalescingTransport
from sluice.api.http.cycle_io import cancel_unanswered
from sluice.api.http.infer import InferEndpoint
from sluice.broker.errors import too_large

#: most bytes a request line and its headers may take, in bytes.
MAX_HEAD_BYTES = 1 << 20
#: longest a refused connection is kept open to drain what the client still sends, in s.
LINGER_S = 5.0
#: default longest wait for the next bytes of a begun request (or a connection's first), in s.
READ_TIMEOUT_S = 60.0

_TOO_LARGE = b'{"error":"request line and headers exceed 1048576 bytes"}'

__all__ = ["HttpProtocol"]


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a request refused and answered."""


class HttpProtocol(CoalescingHttpToolsProtocol):
    """uvicorn's httptools protocol with coalesced writes and half-close support.

    Passed to ``uvicorn.Config(http=...)``, as ``functools.partial(HttpProtocol,
    read_timeout_s=...)`` for a read timeout other than :data:`READ_TIMEOUT_S`.

    Args:
        read_timeout_s: longest wait, in s, for the next bytes of a request whose head
            or body has begun (then 408 and close), or for a new connection's first
            bytes (then close). Idle keep-alive connections between requests follow
            uvicorn's ``timeout_keep_alive`` instead.
        max_body_bytes: largest request body, in bytes (then 413 and close); None: no
            limit here.
    """

    _head_bytes = -1  # bytes of the head read so far; -1 between heads
    _upgrade_body_left = 0  # body bytes of an ignored-upgrade request still to collect
    _upgrade_pending = False  # an ignored-upgrade request waits for its body
    _discarding = False  # refused (431, 408): what the client still sends is dropped
    _read_timer: asyncio.TimerHandle | None = None  # armed while a request is incomplete
    _last_read = 0.0  # loop time of the last bytes of an incomplete request
    _silent = True  # no bytes received on this connection yet
    _body_bytes = 0  # body bytes of the current request read so far

    def __init__(
        self,
        *args: Any,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_body_bytes: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._read_timeout_s = read_timeout_s
        self._max_body_bytes = max_body_bytes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._last_read = self.loop.time()
        self._read_timer = self.loop.call_later(self._read_timeout_s, self._read_deadline)

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the read timer; an infer request queued and not answered yet is cancelled
        (:func:`api.http.cycle_io.cancel_unanswered`). A loss is seen while the connection is
        read: not once the client half-closed it (it is answered), nor while uvicorn stops
        reading it because a request is pipelined behind the one being answered."""
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        super().connection_lost(exc)
        cancel_unanswered(self.cycle)

    def data_received(self, data: bytes) -> None:
        """Feed the parser; enforce :data:`MAX_HEAD_BYTES` and the read timeout; carry on
        past an ``Upgrade``."""
        if self._discarding or self.transport.is_closing():
            return
        self._silent = False
        self._feed(data)
        if self._read_timer is None and self._incomplete():
            self._last_read = self.loop.time()
            self._read_timer = self.loop.call_later(self._read_timeout_s, self._read_deadline)
        elif self._read_timer is not None:
            self._last_read = self.loop.time()

    def _feed(self, data: bytes) -> None:
        if self._upgrade_body_left:
            data = self._collect_upgrade_body(data)
            if not data:
                return
        if self._head_bytes >= 0:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._log_refusal(431, None)
                self._refuse(b"431 Request Header Fields Too Large", _TOO_LARGE)
                return
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, _Refused):
            if self._discarding:
                return  # a callback refused the request (413) and answered it
            self.logger.warning("Invalid HTTP request received.")
            self._log_refusal(400, None)
            self.send_400_response("Invalid HTTP request received.")
        except httptools.HttpParserUpgrade as exc:
            # ignored: answer over HTTP/1.1 and parse what follows with a fresh parser
            self.parser = httptools.HttpRequestParser(self)
            rest = data[exc.args[0] :] if exc.args else b""
            if self._upgrade_pending:
                rest = self._collect_upgrade_body(rest)
            if rest:
                self._feed(rest)

    def _incomplete(self) -> bool:
        """A request has begun and is not read whole (head, body or ignored-upgrade body)."""
        cycle = self.cycle
        return (
            self._head_bytes >= 0
            or self._upgrade_body_left > 0
            or (cycle is not None and cycle.more_body and not cycle.response_complete)
        )

    def _read_deadline(self) -> None:
        """Timer: answer 408 and close when the client sent nothing for the read timeout
        in the middle of a request; close a connection that never sent a byte."""
        self._read_timer = None
        if self._discarding or self.transport.is_closing():
            return
        if not self._silent and not self._incomplete():
            return  # the request was read whole; the next one arms the timer again
        now = self.loop.time()
        cycle = self.cycle  # the newest request whose head was read whole
        if (
            self.flow.read_paused
            or self.pipeline
            or (
                cycle is not None
                and not cycle.response_complete
                and (cycle.response_started or not cycle.more_body)
            )
        ):
            # the server is the one to act: it stopped reading (flow control), or owes an
            # answer to an earlier request (``pipeline``: requests waiting their turn behind
            # it; a 408 may only follow that answer), or is writing one
            self._last_read = now
        left = self._last_read + self._read_timeout_s - now
        if left > 0:
            self._read_timer = self.loop.call_later(left, self._read_deadline)
            return
        if self._silent:
            self.transport.close()
            return
        if cycle is not None and cycle.more_body:
            if cycle.response_complete:
                # answered before its body was read: a 408 would read as the answer to
                # a next request
                self.transport.close()
                return
            cycle.disconnected = True  # an ASGI call waiting for the body gets a disconnect
            cycle.message_event.set()
        self._log_refusal(408, cycle.scope if cycle is not None and cycle.more_body else None)
        seconds = f"{self._read_timeout_s:g}"
        self._refuse(
            b"408 Request Timeout",
            b'{"error":"request not received whole: no bytes for %s s"}' % seconds.encode(),
        )

    def on_response_complete(self) -> None:
        """An answer went out: a request still incomplete behind it gets the whole read
        timeout from now (the clock does not run while the gateway owes an answer)."""
        self._last_read = self.loop.time()
        super().on_response_complete()

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

    def _log_refusal(self, status: int, scope: Any) -> None:
        """An access line (``--log-verbose`` ≥ 1) for an answer the protocol itself gives,
        as uvicorn writes for the others; ``-`` for a method or path not read yet."""
        if not self.access_log:
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "-"
        method, path, version = "-", "-", "1.1"
        if scope is not None:
            method, path, version = scope["method"], scope["path"], scope["http_version"]
        self.access_logger.info('%s - "%s %s HTTP/%s" %d', client, method, path, version, status)

    def _refuse(self, status: bytes, body: bytes) -> None:
        """Answer ``status`` with the JSON ``body``, then a lingering close: send the
        answer and FIN, discard what the client still sends (closing with unread data
        would reset the connection and lose the answer), close after :data:`LINGER_S`."""
        self._head_bytes = -1
        self._upgrade_body_left = 0
        self._discarding = True
        answer = (
            b"HTTP/1.1 %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % (status, len(body)) + body
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
        self._body_bytes = 0

    def _refuse_too_large(self, size: int | None, scope: Any) -> None:
        """Answer 413 naming the limit, close (:meth:`_refuse`), and stop the parser."""
        assert self._max_body_bytes is not None
        cycle = self.cycle
        if cycle is not None and scope is not None:
            cycle.disconnected = True  # an ASGI call waiting for the body gets a disconnect
            cycle.message_event.set()
        self._log_refusal(413, scope)
        error = too_large(size, self._max_body_bytes)
        self._refuse(b"413 Payload Too Large", orjson.dumps({"error": error.message}))
        raise _Refused

    def on_headers_complete(self) -> None:
        self._head_bytes = -1
        length = next((v for k, v in self.headers if k == b"content-length"), None)
        limit = self._max_body_bytes
        if limit is not None and length is not None and length.isdigit() and int(length) > limit:
            self._refuse_too_large(int(length), None)
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
        keeps the connection reading, as nobody calls ASGI ``receive`` for it. A chunked
        body past the body limit is refused (413)."""
        self._body_bytes += len(body)
        if self._max_body_bytes is not None and self._body_bytes > self._max_body_bytes:
            self._refuse_too_large(None, self.cycle.scope if self.cycle is not None else None)
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
        the connection (``keep_alive`` off). None lets asyncio close the transport,
        after what the :class:`CoalescingTransport` still holds was handed to it (an
        answer written in this loop iteration; the transport's close sends it first)."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete or cycle.more_body:
            transport: Any = self.transport
            if isinstance(transport, CoalescingTransport):
                transport.flush()
            return None
        cycle.keep_alive = False
        return True
