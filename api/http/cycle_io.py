"""Answers written straight to uvicorn's ``RequestResponseCycle`` (the task-free path of
:mod:`api.http.infer`), and the cancellation of a queued request whose connection was
lost before its answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

__all__ = ["REPLY_SCOPE_KEY", "cancel_unanswered", "write_response"]

#: ASGI scope key of a queued request's response future (:func:`cancel_unanswered`).
REPLY_SCOPE_KEY = "sluice.reply"


def cancel_unanswered(cycle: Any) -> None:
    """The connection of uvicorn's ``RequestResponseCycle`` was lost: if the cycle's
    infer request is queued and not answered yet, cancel its response future, which takes
    the request off its stream unless an instance has taken it (:meth:`Submission.submit`;
    Triton cancels only gRPC requests, its HTTP server does not notice a client that
    went away). Nothing for a cycle that was answered or queued no request.

    A connection the client half-closed (EOF, still reading) is not lost:
    :class:`api.http.protocol.HttpProtocol` keeps answering it.
    """
    if cycle is None or cycle.response_complete:
        return
    future = cycle.scope.get(REPLY_SCOPE_KEY)
    if future is not None and not future.done():
        cycle.disconnected = True  # the answer written from the future's callback is dropped
        future.cancel()


def write_response(cycle: Any, status: int, body: bytes, headers: Mapping[str, str]) -> None:
    """Answer uvicorn's ``RequestResponseCycle`` with one complete response in one write,
    as its ``send`` would (default headers, ``connection: close`` when not keeping the
    connection alive, then the next pipelined request); nothing once the client left."""
    if cycle.disconnected or cycle.response_started:
        return
    parts = [STATUS_LINE[status]]
    for name, value in cycle.default_headers:
        parts += [name, b": ", value, b"\r\n"]
    for name, value in headers.items():
        parts.append(f"{name.lower()}: {value}\r\n".encode("latin-1"))
    parts.append(b"content-length: %d\r\n" % len(body))
    if not cycle.keep_alive:
        parts.append(b"connection: close\r\n")
    parts += [b"\r\n", body]
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    # A CoalescingTransport sends it at the end of this loop iteration: the answers of one
    # executed batch arrive together and then leave back to back, after all are encoded,
    # so the client wakes once for the burst instead of once per answer (more requests
    # per second and less gateway CPU per request with many connections)
    cycle.transport.write(b"".join(parts))
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()
