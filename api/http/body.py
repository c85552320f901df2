"""HTTP compression of request and response bodies (docs/reference/http-protocol.md,
Compression; Triton ``src/http_server.cc``)."""

from __future__ import annotations

import gzip
import zlib

from sluice.broker.errors import ErrorCode, SluiceError, invalid_arg, too_large


def decompress(body: bytes, encoding: str | None, limit_bytes: int) -> bytes:
    """Undo ``Content-Encoding: gzip|deflate`` (any case, RFC 9110 8.4.1);
    ``identity``/absent pass through.

    Raises:
        SluiceError: UNSUPPORTED for other encodings, INVALID_ARG for a corrupt stream
            or one that inflates past ``limit_bytes``.
    """
    coding = (encoding or "").strip().lower()  # content codings are case-insensitive
    if not coding or coding == "identity":
        return body
    if coding == "gzip":
        wbits = 16 + zlib.MAX_WBITS
    elif coding == "deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise SluiceError(ErrorCode.UNSUPPORTED, f"Unsupported compression type '{encoding}'")
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit_bytes + 1)
    except zlib.error as exc:
        raise invalid_arg(f"failed to decompress the {encoding} request body: {exc}") from None
    if len(out) > limit_bytes or inflater.unconsumed_tail:
        raise too_large(None, limit_bytes, "decompressed request body")
    return out


def negotiate_encoding(accept_encoding: str | None) -> str | None:
    """``gzip`` or ``deflate`` when the client accepts one (``;q=`` weights honoured)."""
    if not accept_encoding:
        return None
    best: tuple[float, str] | None = None
    for part in accept_encoding.split(","):
        name, _, params = part.strip().partition(";")
        name = name.strip().lower()
        if name not in ("gzip", "deflate"):
            continue
        q = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                q = float(params[2:])
            except ValueError:
                q = 0.0
        if q > 0 and (best is None or q > best[0]):
            best = (q, name)
    return None if best is None else best[1]


def compress(body: bytes, encoding: str) -> bytes:
    """Compress a response body with ``gzip`` or ``deflate`` (zlib stream)."""
    if encoding == "gzip":
        return gzip.compress(body, compresslevel=1)
    return zlib.compress(body, 1)
