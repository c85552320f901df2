"""The msgpack codec and the BYTES wire layout: exact round trips."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from sluice.broker.codec import (
    CodecError,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from sluice.broker.datatypes import (
    NUMPY_DTYPES,
    deserialize_bytes,
    from_numpy,
    serialize_bytes,
    to_numpy,
)
from sluice.broker.messages import ErrorInfo, InferRequestMessage, InferResponseMessage, WireTensor

NUMERIC = [name for name in NUMPY_DTYPES if name != "BYTES"]


def _array(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(3)
    dtype = NUMPY_DTYPES[datatype]
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(0, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _request(inputs: tuple[WireTensor, ...]) -> InferRequestMessage:
    return InferRequestMessage(
        request_id="abc",
        client_id="client-1",
        model="m",
        version=3,
        inputs=inputs,
        outputs=("OUT",),
        parameters={"sequence_id": 7, "flag": True, "name": "x", "k": 1.5},
        reply_to="sluice:reply:g1",
        deadline_ns=2**62,
        enqueued_ns=123,
    )


@pytest.mark.parametrize("datatype", NUMERIC)
@pytest.mark.parametrize("shape", [(2, 3), (0, 4), (1,), ()])
def test_numeric_tensor_round_trip(datatype: str, shape: tuple[int, ...]) -> None:
    array = _array(datatype, shape)
    wire_type, wire_shape, data = from_numpy(array)
    assert (wire_type, wire_shape) == (datatype, list(shape))
    assert len(data) == array.size * array.dtype.itemsize
    message = _request((WireTensor("IN", wire_type, tuple(wire_shape), data),))
    decoded = decode_request(encode_request(message))
    assert decoded == message
    back = to_numpy(datatype, decoded.inputs[0].shape, decoded.inputs[0].data)
    assert back.dtype == array.dtype
    np.testing.assert_array_equal(back, array)


@pytest.mark.parametrize(
    "items",
    [
        [b"ab", b"xyz"],
        [b"", b"", b""],
        [b"\xff\x00\x01", "ünïcode".encode()],
        [],
    ],
)
def test_bytes_round_trip(items: list[bytes]) -> None:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    datatype, shape, data = from_numpy(array)
    assert datatype == "BYTES"
    assert deserialize_bytes(data) == items
    message = _request((WireTensor("S", datatype, tuple(shape), data),))
    decoded = decode_request(encode_request(message))
    assert to_numpy("BYTES", decoded.inputs[0].shape, decoded.inputs[0].data).tolist() == items


def test_bytes_layout_is_tritons() -> None:
    assert serialize_bytes([b"ab", b"xyz"]) == bytes.fromhex("0200000061620300000078797a")


@pytest.mark.parametrize(
    ("buffer", "count", "message"),
    [
        (b"\x02\x00\x00", None, "incomplete string length indicator"),
        (b"\x05\x00\x00\x00ab", None, "incomplete string data"),
        (serialize_bytes([b"a"]), 2, "unexpected number of string elements 1, expecting 2"),
    ],
)
def test_bytes_errors(buffer: bytes, count: int | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        deserialize_bytes(buffer, count)


def test_response_round_trip() -> None:
    ok = InferResponseMessage(
        "abc",
        "m",
        1,
        (WireTensor("OUT", "FP32", (1, 2), b"\0" * 8),),
        parameters={"p": 1},
        timings={"queue": 5},
    )
    assert decode_response(encode_response(ok)) == ok
    failed = InferResponseMessage("abc", "m", 1, error=ErrorInfo("INVALID_ARG", "bad"))
    assert decode_response(encode_response(failed)) == failed
    stamped = InferResponseMessage("abc", "m", 1, load_id="5f1e")
    assert decode_response(encode_response(stamped)).load_id == "5f1e"
    # a worker of an earlier release writes 8 fields: its answers decode with no load id
    older = msgpack.packb(msgpack.unpackb(encode_response(ok))[:8], use_bin_type=True)
    assert decode_response(older) == ok


def test_tensor_bytes_travel_as_msgpack_bin() -> None:
    message = _request((WireTensor("IN", "UINT8", (3,), b"\x01\x02\x03"),))
    raw = msgpack.unpackb(encode_request(message), raw=True)
    assert raw[5][0][3] == b"\x01\x02\x03"


@pytest.mark.parametrize("payload", [b"\xc1", msgpack.packb([99, "x"]), msgpack.packb("str")])
def test_undecodable_messages(payload: bytes) -> None:
    with pytest.raises(CodecError):
        decode_request(payload)
    with pytest.raises(CodecError):
        decode_response(payload)


def test_a_request_carries_the_load_it_was_checked_against() -> None:
    message = _request(())
    message.load_id = "8fe93415e7934017"
    assert decode_request(encode_request(message)).load_id == "8fe93415e7934017"
    # a gateway of the layout before load_id: twelve fields, the load unknown
    fields = msgpack.unpackb(encode_request(message), raw=False)
    older = decode_request(msgpack.packb(fields[:12], use_bin_type=True))
    assert older.load_id == "" and older.request_id == "abc" and older.enqueued_ns == 123
