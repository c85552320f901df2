"""One socket write per HTTP response: uvicorn's httptools protocol with coalesced writes.

uvicorn writes a response's status line and headers when the app sends
``http.response.start`` and the body on ``http.response.body``: two ``send``
system calls per response. On loopback TCP each one runs the receiver's
network stack and wakes it, so the client wakes twice per response, which costs
throughput with many concurrent clients (docs/performance.md) and nothing measurable
with one. :class:`CoalescingHttpToolsProtocol`
hands uvicorn a transport whose ``write`` collects what one event-loop iteration
writes to a connection and sends it with one ``writelines`` (one ``writev``) at
the start of the next.

Infer answers are written the same way (:func:`api.http.cycle_io.write_response`): the
answers of one executed batch reach the gateway in one read from Redis, are encoded
one after another, then leave back to back, so the client is woken once for the burst
rather than once per answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport:
    """A transport whose writes of one loop iteration leave in one system call.

    Everything but ``write``/``writelines``/``close`` is the wrapped transport's
    (flow control, ``get_extra_info``, ``is_closing``, ``abort``). ``close``
    sends what is pending first; ``abort`` drops it, as the transport would.

    Args:
        transport: the connection's transport.
        loop: the event loop the connection runs on.
    """

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] | None = None

    def write(self, data: bytes) -> None:
        """Queue ``data``; it is sent with the rest of this iteration's writes."""
        if not data:
            return
        if self._pending is None:
            self._pending = [data]
            self._loop.call_soon(self.flush)
        else:
            self._pending.append(data)

    def write_now(self, data: bytes) -> None:
        """Send ``data`` at once, after anything pending (an answer followed by a
        ``write_eof``)."""
        if self._pending is not None:
            self._pending.append(data)
            self.flush()
        elif not self._transport.is_closing():
            self._transport.write(data)

    def writelines(self, chunks: Any) -> None:
        """Queue each chunk of ``chunks`` (as :meth:`write`)."""
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        """Send what is pending now (one ``writelines``); nothing on a closing connection."""
        pending, self._pending = self._pending, None
        if not pending or self._transport.is_closing():
            return
        if len(pending) == 1:
            self._transport.write(pending[0])
        else:
            self._transport.writelines(pending)

    def close(self) -> None:
        """Send what is pending, then close the connection."""
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools HTTP/1.1 protocol writing through a :class:`CoalescingTransport`.

    Passed to ``uvicorn.Config(http=...)``; parsing, keep-alive, pipelining and flow
    control are uvicorn's.
    """

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        wrapped = CoalescingTransport(transport, asyncio.get_running_loop())
        super().connection_made(wrapped)  # type: ignore[arg-type]
