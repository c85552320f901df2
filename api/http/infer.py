"""Inference endpoint with the binary tensor data extension (PROTOCOL.md 1.7, 2, 3).

Served as a plain ASGI layer in front of the FastAPI router: the hot path of
the gateway skips routing, dependency solving and the Request/Response objects
(about a fifth of a request's CPU in profiles), while every other endpoint
stays an ``APIRouter`` route. Errors answer Triton's ``{"error": ...}`` with the
status of ``api/errors.py``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

import orjson
import redis.exceptions
from starlette.types import ASGIApp, Receive, Scope, Send

from api.dataplane import DataPlane
from api.errors import http_status
from api.http.body import compress, decompress, negotiate_encoding
from api.http.infer_codec import encode_infer_response, parse_infer_request
from broker.errors import SluiceError, invalid_arg

logger = logging.getLogger(__name__)

#: Triton's infer routes: ``/v2/models/{name}[/versions/{digits}]/infer``.
INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer$")

_HEADER_LENGTH = b"inference-header-content-length"


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


async def handle_infer(
    dp: DataPlane,
    model: str,
    version: int | None,
    headers: Mapping[bytes, bytes],
    receive: Receive,
) -> tuple[bytes, dict[str, str]]:
    """Run one HTTP inference request; returns the response body and headers.

    Raises:
        SluiceError: anything Triton answers with an error status.
    """
    await dp.resolve_for_infer(model, version)  # unknown model: 404 before the body is read
    limit = dp.settings.http.max_body_bytes
    encoding = headers.get(b"content-encoding")
    body = decompress(
        await _read_body(receive, headers, limit),
        encoding.decode("latin-1") if encoding else None,
        limit,
    )
    raw_length = headers.get(_HEADER_LENGTH)
    header_length: int | None = None
    if raw_length is not None:
        try:
            header_length = int(raw_length)
        except ValueError:
            raise invalid_arg(
                f"inference header size should be in range (0, {len(body)}), got: "
                f"{raw_length.decode('latin-1')}"
            ) from None
    parsed = parse_infer_request(body, header_length, model=model)
    result = await dp.infer(
        model, version, parsed.client_id, parsed.inputs, parsed.outputs, parsed.parameters
    )
    content, out_headers = encode_infer_response(
        model=model,
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


async def _respond(send: Send, status: int, body: bytes, headers: Mapping[str, str]) -> None:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class InferEndpoint:
    """ASGI layer answering ``POST .../infer``; every other request goes to ``app``.

    Args:
        app: the FastAPI application with the other routes.
        dataplane: the gateway's shared request handling.
    """

    def __init__(self, app: ASGIApp, dataplane: DataPlane) -> None:
        self.app = app
        self.dataplane = dataplane

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (match := INFER_PATH.match(scope["path"])) is None:
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            await _respond(
                send, 405, b'{"error":"Method Not Allowed"}', {"content-type": "application/json"}
            )
            return
        model, version = match.group(1), match.group(2)
        headers = dict(scope["headers"])
        try:
            body, out = await handle_infer(
                self.dataplane, model, None if version is None else int(version), headers, receive
            )
            await _respond(send, 200, body, out)
        except SluiceError as exc:
            await self._error(send, exc.message, http_status(exc.code))
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            logger.warning("Redis unreachable: %s", exc)
            await self._error(send, f"broker unavailable: {exc}", 503)
        except Exception as exc:
            logger.exception("unexpected error on infer for model '%s'", model)
            await self._error(send, f"internal error: {type(exc).__name__}: {exc}", 500)

    @staticmethod
    async def _error(send: Send, message: str, status: int) -> None:
        await _respond(
            send, status, orjson.dumps({"error": message}), {"content-type": "application/json"}
        )
