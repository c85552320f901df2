"""Request and response compression of the HTTP front end (``api/http/body.py``)."""

from __future__ import annotations

import gzip
import zlib

import pytest

from sluice.api.http.body import compress, decompress, negotiate_encoding
from sluice.broker.errors import ErrorCode, SluiceError

BODY = b'{"inputs": []}' * 100


@pytest.mark.parametrize("coding", ["gzip", "GZIP", " Gzip "])
def test_gzip_in_any_case(coding: str) -> None:
    assert decompress(gzip.compress(BODY), coding, 1 << 20) == BODY


@pytest.mark.parametrize("coding", ["deflate", "Deflate"])
def test_deflate_in_any_case(coding: str) -> None:
    assert decompress(zlib.compress(BODY), coding, 1 << 20) == BODY


@pytest.mark.parametrize("coding", [None, "", "identity", "IDENTITY"])
def test_identity_passes_through(coding: str | None) -> None:
    assert decompress(BODY, coding, 1 << 20) is BODY


def test_unknown_coding_is_unsupported() -> None:
    with pytest.raises(SluiceError) as info:
        decompress(BODY, "br", 1 << 20)
    assert info.value.code is ErrorCode.UNSUPPORTED
    assert info.value.message == "Unsupported compression type 'br'"


def test_corrupt_stream_and_bomb_are_invalid() -> None:
    with pytest.raises(SluiceError, match="failed to decompress the gzip request body"):
        decompress(b"not gzip at all", "gzip", 1 << 20)
    bomb = gzip.compress(b"\0" * (4 << 20))
    with pytest.raises(SluiceError, match="exceeds the limit of 1048576 bytes"):
        decompress(bomb, "gzip", 1 << 20)


def test_response_compression_round_trips_and_negotiates() -> None:
    assert gzip.decompress(compress(BODY, "gzip")) == BODY
    assert zlib.decompress(compress(BODY, "deflate")) == BODY
    assert negotiate_encoding("br, deflate;q=0.5, gzip;q=0.9") == "gzip"
    assert negotiate_encoding("identity") is None
