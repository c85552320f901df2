"""Inference endpoint with the binary tensor data extension
(docs/reference/http-protocol.md; Triton ``src/http_server.cc`` ``HandleInfer``).

Served as a plain ASGI layer in front of the FastAPI router: the hot path of
the gateway skips routing, dependency solving and the Request/Response objects
(a large share of a small request's CPU), while every other endpoint stays an
``APIRouter`` route (:mod:`api.http.routes`). Errors answer Triton's
``{"error": ...}`` with the status of :func:`api.errors.client_error`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from sluice.api.dataplane import DataPlane
from sluice.api.errors import client_error
from sluice.api.handlers.submission import InferResult, Submission
from sluice.api.http.body import compress, decompress, negotiate_encoding
from sluice.api.http.header_cache import CachedHeader, HeaderCache
from sluice.api.http.infer_request import HttpInferRequest, parse_infer_request
from sluice.api.http.infer_response import encode_infer_response
from sluice.api.models import ModelView
from sluice.api.request_trace import RequestTrace, header_traceparent
from sluice.broker.errors import SluiceError, invalid_arg
from sluice.broker.messages import InferResponseMessage
from sluice.broker.outage import OutageLog

logger = logging.getLogger(__name__)
#: one line per Redis outage, not one per failed request
_OUTAGE = OutageLog(logger, "HTTP inference requests")

#: Triton's infer routes: ``/v2/models/{name}[/versions/{digits}]/infer``.
INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer$")

_HEADER_LENGTH = b"inference-header-content-length"

#: the model and version (None: the model's policy picks) of an infer route.
Route = tuple[str, int | None]

#: ASGI scope key of a queued request's response future (:func:`cancel_unanswered`).
REPLY_SCOPE_KEY = "sluice.reply"


def _route(path: str) -> Route | None:
    match = INFER_PATH.match(path)
    if match is None:
        return None
    return match.group(1), None if match.group(2) is None else int(match.group(2))


async def _read_body(receive: Receive, headers: Mapping[bytes, bytes], limit: int) -> bytes:
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise invalid_arg(
            f"request body of {declared.decode()} bytes exceeds the limit of {limit} bytes"
        )
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise invalid_arg(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _header_length(headers: Mapping[bytes, bytes], body: bytes) -> int | None:
    raw_length = headers.get(_HEADER_LENGTH)
    if raw_length is None:
        return None
    try:
        return int(raw_length)
    except ValueError:
        raise invalid_arg(
            f"inference header size should be in range (0, {len(body)}), got: "
            f"{raw_length.decode('latin-1')}"
        ) from None


def parse_body(
    max_body_bytes: int,
    view: ModelView,
    headers: Mapping[bytes, bytes],
    raw_body: bytes,
    cache: HeaderCache | None = None,
) -> tuple[HttpInferRequest, CachedHeader | None]:
    """Decompress and parse a request whose body was read whole (the model's config
    inputs deduce a raw binary request's input); with ``cache``, a binary-only request's
    header is looked up there first and its entry returned.

    Raises:
        SluiceError: INVALID_ARG / UNSUPPORTED for a malformed body (Triton's texts).
    """
    encoding = headers.get(b"content-encoding")
    body = decompress(
        raw_body,
        encoding.decode("latin-1") if encoding else None,
        max_body_bytes,
    )
    header_length = _header_length(headers, body)
    if cache is not None:
        return cache.parse(
            body,
            header_length,
            model=view.name,
            config_inputs=view.inputs.values(),
            max_batch_size=view.max_batch_size,
        )
    parsed = parse_infer_request(
        body,
        header_length,
        model=view.name,
        config_inputs=view.inputs.values(),  # read only by a raw binary request
        max_batch_size=view.max_batch_size,
    )
    return parsed, None


def _submit(
    sub: Submission,
    request_id: str,
    view: ModelView,
    resolved: int,
    version: int | None,
    parsed: HttpInferRequest,
    kept: CachedHeader | None = None,
    waited_ns: int = 0,
    trace: RequestTrace | None = None,
) -> asyncio.Future[InferResponseMessage]:
    """Validate and queue a parsed request (:meth:`Submission.submit`); a refusal is
    logged with the request's ids. A request of a kept header that passed the checks
    of this same model view is not checked again; one that passes marks it so.

    Raises:
        SluiceError: as :meth:`Submission.submit`.
    """
    checked = kept is not None and kept.checked_view is view
    try:
        future = sub.submit(
            request_id,
            view,
            resolved,
            parsed.client_id,
            parsed.inputs,
            parsed.outputs,
            parsed.parameters,
            checked=checked,
            waited_ns=waited_ns,
            trace=trace,
        )
    except SluiceError as exc:
        sub.log_failure(request_id, parsed.client_id, view.name, version, exc)
        raise
    if kept is not None and not checked and kept.checkable:
        kept.checked_view = view
    return future


def _encode(
    result: InferResult, parsed: HttpInferRequest, headers: Mapping[bytes, bytes]
) -> tuple[bytes, dict[str, str]]:
    """The response body and headers of a result (compressed when the client asks)."""
    content, out_headers = encode_infer_response(
        model=result.model,
        version=str(result.version),
        client_id=result.client_id,
        outputs=result.outputs,
        requested=parsed.outputs,
        binary_data_output=parsed.binary_data_output,
        parameters=result.parameters,
    )
    accept = headers.get(b"accept-encoding")
    chosen = negotiate_encoding(accept.decode("latin-1")) if accept else None
    if chosen is not None:
        content = compress(content, chosen)
        out_headers["Content-Encoding"] = chosen
    return content, out_headers


async def handle_infer(
    sub: Submission,
    max_body_bytes: int,
    request_id: str,
    model: str,
    version: int | None,
    scope: Scope,
    receive: Receive,
    trace: RequestTrace | None = None,
) -> tuple[bytes, dict[str, str]]:
    """Run one HTTP inference request; returns the response body and headers. ``trace``:
    the request's trace (:mod:`api.request_trace`), stamped on the way.

    The queued request's response future is kept in ``scope`` (:data:`REPLY_SCOPE_KEY`),
    so a connection lost before the answer cancels it (:func:`cancel_unanswered`).

    Raises:
        SluiceError: anything Triton answers with an error status.
        asyncio.CancelledError: the connection was lost before the answer.
    """
    headers = dict(scope["headers"])
    try:
        started_ns = time.monotonic_ns()
        view, resolved = await sub.resolve_for_infer(model, version)  # unknown model: 404 first
        waited_ns = time.monotonic_ns() - started_ns
        raw = await _read_body(receive, headers, max_body_bytes)
        if trace is not None:
            trace.stamp("HTTP_RECV_END")
        parsed, _ = parse_body(max_body_bytes, view, headers, raw)
    except SluiceError as exc:  # refused before it had ids: one verbose line
        sub.log_failure(request_id, "", model, version, exc)
        raise
    future = _submit(
        sub, request_id, view, resolved, version, parsed, waited_ns=waited_ns, trace=trace
    )
    scope[REPLY_SCOPE_KEY] = future
    try:
        response = await future
        if trace is not None:
            trace.answered(response)
        result = sub.result(model, parsed.client_id, response)
    except SluiceError as exc:
        sub.log_failure(request_id, parsed.client_id, model, version, exc)
        raise
    return _encode(result, parsed, headers)


def _error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


def _failure(exc: BaseException, model: str) -> tuple[int, bytes]:
    """Status and body of a failed request (Triton's ``{"error": ...}``): a request
    cancelled while the server exits (uvicorn's shutdown timeout ran out) is answered
    503; every other error as :func:`client_error` maps it."""
    if isinstance(exc, asyncio.CancelledError):
        return 503, _error_body(f"Server exiting: request to model '{model}' not answered")
    error = client_error(exc, _OUTAGE, f"the inference request of model '{model}'")
    return error.http_status, _error_body(error.message)


async def _respond(send: Send, status: int, body: bytes, headers: Mapping[str, str]) -> None:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class InferEndpoint:
    """ASGI layer answering ``POST .../infer``; every other request goes to ``app``.

    Also the task-free path of :class:`api.http.protocol.HttpProtocol`
    (:meth:`accepts` and :meth:`answer`), which takes most infer requests before they
    become ASGI calls.

    Args:
        app: the FastAPI application with the other routes.
        dataplane: the gateway's shared request handling.
    """

    def __init__(self, app: ASGIApp, dataplane: DataPlane) -> None:
        self.app = app
        self.submission = dataplane.submission
        #: the trace extension: while any request may be traced, infer requests take the
        #: ASGI route (:meth:`accepts`), where they are traced
        self.tracing = dataplane.tracing
        #: the largest accepted request body, in bytes
        self.max_body_bytes = dataplane.settings.http.max_body_bytes
        #: the task-free path's parsed binary-request headers
        self.headers = HeaderCache()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (route := _route(scope["path"])) is None:
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            await _respond(
                send, 405, b'{"error":"Method Not Allowed"}', {"content-type": "application/json"}
            )
            return
        model, version = route
        request_id = self.submission.next_request_id()
        trace = (
            self.tracing.start(model, "HTTP", header_traceparent(scope["headers"]))
            if self.tracing.active
            else None
        )
        error: str | None = None
        try:
            body, out = await handle_infer(
                self.submission, self.max_body_bytes, request_id, model, version, scope, receive,
                trace,
            )  # fmt: skip
            if trace is not None:
                trace.stamp("HTTP_SEND_START")
            await _respond(send, 200, body, out)
        except (Exception, asyncio.CancelledError) as exc:
            # cancelled: uvicorn's graceful shutdown ran out (the client still gets a 503),
            # or the connection was lost (uvicorn's send writes nothing then)
            status, body = _failure(exc, model)
            error = body.decode("utf-8", "replace")
            if trace is not None:
                trace.stamp("HTTP_SEND_START")
            await _respond(send, status, body, _JSON)
        if trace is not None:
            trace.stamp("HTTP_SEND_END")
            trace.finish(error)

    # -- the task-free path ------------------------------------------------------------------

    def accepts(self, scope: Scope) -> Route | None:
        """The model and version of a request that can take the task-free path (``POST`` to
        an infer route with a ``Content-Length`` within the body limit, no chunked body,
        no ``Expect``, no tracing on); None for any other."""
        if scope["method"] != "POST" or (route := _route(scope["path"])) is None:
            return None
        if self.tracing.active:
            return None
        length = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name in (b"transfer-encoding", b"expect"):
                return None
        if length is not None and length.isdigit() and int(length) <= self.max_body_bytes:
            return route
        return None

    def answer(self, cycle: Any, route: Route, body: bytes, fallback: Callable[[], None]) -> bool:
        """Queue a request whose body was read whole and answer it when its response comes,
        from callbacks: no task, no ASGI messages.

        Args:
            cycle: uvicorn's ``RequestResponseCycle`` of the request.
            route: model and version, as :meth:`accepts` returned them.
            body: the request body.
            fallback: starts the ASGI call instead (when the model's view is not cached).

        Returns:
            False when it called ``fallback``.
        """
        scope = cycle.scope
        model, version = route
        sub = self.submission
        request_id = sub.next_request_id()
        try:
            try:
                cached = sub.cached_view(model, version)
                if cached is None:
                    fallback()
                    return False
                headers = dict(scope["headers"])
                parsed, kept = parse_body(
                    self.max_body_bytes, cached[0], headers, body, self.headers
                )
            except SluiceError as exc:  # refused before it had ids: one verbose line
                sub.log_failure(request_id, "", model, version, exc)
                raise
            future = _submit(sub, request_id, cached[0], cached[1], version, parsed, kept)
        except Exception as exc:
            status, content = _failure(exc, model)
            write_response(cycle, status, content, _JSON)
            return True
        scope[REPLY_SCOPE_KEY] = future
        future.add_done_callback(
            functools.partial(self._answered, cycle, request_id, model, version, parsed, headers)
        )
        return True

    def _answered(
        self,
        cycle: Any,
        request_id: str,
        model: str,
        version: int | None,
        parsed: HttpInferRequest,
        headers: Mapping[bytes, bytes],
        future: asyncio.Future[InferResponseMessage],
    ) -> None:
        sub = self.submission
        try:
            result = sub.result(model, parsed.client_id, future.result())
            content, out = _encode(result, parsed, headers)
            status = 200
            _OUTAGE.ok()  # an answer came through Redis: an outage logged is over
        except (Exception, asyncio.CancelledError) as exc:  # cancelled: the server exits
            if isinstance(exc, SluiceError):
                sub.log_failure(request_id, parsed.client_id, model, version, exc)
            status, content = _failure(exc, model)
            out = _JSON
        write_response(cycle, status, content, out)


_JSON = {"content-type": "application/json"}


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
