"""HTTP inference bodies in and out: api.http.infer_request, infer_response and json_tensors."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from e2e_support import tritonclient_body

from sluice.api.http.infer_request import HttpInferRequest, parse_infer_request
from sluice.api.http.infer_response import encode_infer_response
from sluice.broker.datatypes import serialize_bytes, to_numpy
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.messages import RequestedOutput, WireTensor
from sluice.broker.request_checks import TensorSpec

MODEL = "m"
NUMPY = {"FP32": np.float32, "FP64": np.float64}

# datatype -> a 2x2 (or 2x3) array with extreme / awkward values
ARRAYS: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False], [False, True]]),
    "UINT8": np.array([[0, 1], [254, 255]], dtype=np.uint8),
    "UINT16": np.array([[0, 1], [2, 65535]], dtype=np.uint16),
    "UINT32": np.array([[0, 1], [2, 2**32 - 1]], dtype=np.uint32),
    "UINT64": np.array([[0, 1], [2**63, 2**64 - 1]], dtype=np.uint64),
    "INT8": np.array([[-128, -1], [0, 127]], dtype=np.int8),
    "INT16": np.array([[-(2**15), -1], [0, 2**15 - 1]], dtype=np.int16),
    "INT32": np.array([[-(2**31), -1], [0, 2**31 - 1]], dtype=np.int32),
    "INT64": np.array([[-(2**63), -1], [0, 2**63 - 1]], dtype=np.int64),
    "FP16": np.array([[0.5, -1.25], [65504.0, 0.0]], dtype=np.float16),
    "BF16": np.array([[0.5, -1.25], [3.0, 0.0]], dtype=ml_dtypes.bfloat16),
    "FP32": np.array([[0.1, -2.25], [3.4e38, 1e-45]], dtype=np.float32),
    "FP64": np.array([[0.1, -2.25], [1.7e308, 5e-324]], dtype=np.float64),
    "BYTES": np.array([[b"ab", b""], [b"xyz", "é".encode()]], dtype=object),
}
JSON_OK = [dt for dt in ARRAYS if dt not in ("FP16", "BF16")]


def _wire(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return serialize_bytes(array.ravel())
    return array.astype(array.dtype.newbyteorder("<")).tobytes()


def _client_body(
    arrays: dict[str, tuple[np.ndarray, str, bool]],
    outputs: list[httpclient.InferRequestedOutput] | None = None,
    **kwargs: Any,
) -> tuple[bytes, int | None]:
    """A request body exactly as tritonclient.http 2.73.0 builds it."""
    return tritonclient_body(arrays, outputs, **kwargs)


def _handmade(document: dict[str, Any], binary: bytes = b"") -> tuple[bytes, int | None]:
    header = orjson.dumps(document)
    return header + binary, (len(header) if binary else None)


def _decode(body: bytes, headers: dict[str, str]) -> httpclient.InferResult:
    length = int(headers.get("Inference-Header-Content-Length", 0)) or None
    return httpclient.InferResult.from_response_body(body, verbose=False, header_length=length)


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if want.dtype == object:
        assert [bytes(x) if isinstance(x, bytes) else x.encode() for x in got.ravel()] == list(
            want.ravel()
        )
    else:
        assert got.dtype == want.dtype
        assert got.tobytes() == want.tobytes()


# ------------------------------------------------------------------ request round trips


@pytest.mark.parametrize(
    ("datatype", "binary"),
    [(dt, True) for dt in ARRAYS] + [(dt, False) for dt in JSON_OK],
    ids=[f"{dt}-binary" for dt in ARRAYS] + [f"{dt}-json" for dt in JSON_OK],
)
def test_round_trip_every_datatype(datatype: str, binary: bool) -> None:
    array = ARRAYS[datatype]
    body, header_length = _client_body({"IN": (array, datatype, binary)})
    assert header_length == (len(body) - len(_wire(array, datatype)) if binary else None)

    request = parse_infer_request(body, header_length, model=MODEL)

    (tensor,) = request.inputs
    assert tensor == WireTensor("IN", datatype, (2, 2), _wire(array, datatype))
    _assert_same(to_numpy(datatype, tensor.shape, tensor.data), array)
    # tritonclient asks for binary outputs by default when none are listed
    assert request.outputs == ()
    assert request.binary_data_output is True
    assert request.parameters == {}
    assert request.client_id == ""

    for out_binary in (True, False) if datatype in JSON_OK else (True,):
        response, headers = encode_infer_response(
            model=MODEL,
            version="1",
            client_id="",
            outputs=[WireTensor("OUT", datatype, tensor.shape, tensor.data)],
            requested=[],
            binary_data_output=out_binary,
        )
        _assert_same(_decode(response, headers).as_numpy("OUT"), array)


@pytest.mark.parametrize(
    ("datatype", "data", "shape", "expected"),
    [
        ("INT32", [[1, 2], [3, 4]], [4], np.array([1, 2, 3, 4], dtype="<i4")),
        ("INT32", [1, 2, 3, 4], [2, 2], np.array([1, 2, 3, 4], dtype="<i4")),
        ("INT32", [1, [2, [3, [4]]]], [2, 2], np.array([1, 2, 3, 4], dtype="<i4")),
        ("INT32", [[], [1], [[2], []]], [2], np.array([1, 2], dtype="<i4")),
        ("FP32", [[1, 2.5], [3, 4]], [2, 2], np.array([1, 2.5, 3, 4], dtype="<f4")),
        ("FP64", 7, [1], np.array([7.0], dtype="<f8")),
        ("BOOL", [[True], [False, True]], [3], np.array([1, 0, 1], dtype=np.uint8)),
        ("UINT64", [[2**64 - 1], [0]], [2], np.array([2**64 - 1, 0], dtype="<u8")),
        # out-of-range integers are truncated as Triton's C casts do
        ("INT8", [300, -129], [2], np.array([44, 127], dtype="<i1")),
        ("UINT8", [256, 257], [2], np.array([0, 1], dtype="<u1")),
    ],
)
def test_json_data_flat_or_nested(
    datatype: str, data: Any, shape: list[int], expected: np.ndarray
) -> None:
    body, length = _handmade(
        {"inputs": [{"name": "X", "shape": shape, "datatype": datatype, "data": data}]}
    )
    (tensor,) = parse_infer_request(body, length, model=MODEL).inputs
    assert tensor.data == expected.tobytes()
    assert tensor.shape == tuple(shape)


def test_json_nesting_depth_limit() -> None:
    ok: Any = [1]
    for _ in range(99):
        ok = [ok]
    body, _ = _handmade({"inputs": [{"name": "X", "shape": [1], "datatype": "INT8", "data": ok}]})
    assert parse_infer_request(body, None, model=MODEL).inputs[0].data == b"\x01"

    body, _ = _handmade({"inputs": [{"name": "X", "shape": [1], "datatype": "INT8", "data": [ok]}]})
    with pytest.raises(SluiceError) as info:
        parse_infer_request(body, None, model=MODEL)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert info.value.message == (
        "JSON nesting depth exceeds maximum allowed limit (100) in 'data' of input 'X' of model 'm'"
    )


@pytest.mark.parametrize(
    ("datatype", "shape", "data", "binary"),
    [
        ("FP32", [0, 3], [], None),
        ("FP32", [2, 0], None, b""),
        ("BYTES", [0], [], None),
        ("FP16", [0], [], None),  # data is ignored for zero-element tensors
        ("INT64", [0], [1, 2], None),
    ],
)
def test_zero_element_tensors(
    datatype: str, shape: list[int], data: list[Any] | None, binary: bytes | None
) -> None:
    entry: dict[str, Any] = {"name": "X", "shape": shape, "datatype": datatype}
    if binary is None:
        entry["data"] = data
    else:
        entry["parameters"] = {"binary_data_size": 0}
    body, length = _handmade({"inputs": [entry]}, binary or b"")
    if binary is not None:
        length = len(body)
    (tensor,) = parse_infer_request(body, length, model=MODEL).inputs
    assert tensor == WireTensor("X", datatype, tuple(shape), b"")


def test_bytes_json_empty_strings_and_utf8() -> None:
    body, length = _handmade(
        {"inputs": [{"name": "S", "shape": [4], "datatype": "BYTES", "data": ["", "ab", "", "é"]}]}
    )
    (tensor,) = parse_infer_request(body, length, model=MODEL).inputs
    assert tensor.data == (
        b"\x00\x00\x00\x00\x02\x00\x00\x00ab\x00\x00\x00\x00\x02\x00\x00\x00\xc3\xa9"
    )


def test_binary_chunks_in_input_order_mixed_with_json() -> None:
    """A captured tritonclient body (docs/reference/http-protocol.md, Binary tensor data
    extension): FP32 [1,4] + BYTES [2] binary, plus one JSON input."""
    fp32 = np.array([[1, 2, 3, 4]], dtype=np.float32)
    strings = np.array([b"ab", b"xyz"], dtype=object)
    body, length = _client_body(
        {
            "IN": (fp32, "FP32", True),
            "J": (np.array([5, 6], dtype=np.int32), "INT32", False),
            "S": (strings, "BYTES", True),
        },
        request_id="r1",
        sequence_id=5,
        sequence_start=True,
    )
    request = parse_infer_request(body, length, model=MODEL)
    assert request == HttpInferRequest(
        client_id="r1",
        inputs=(
            WireTensor("IN", "FP32", (1, 4), fp32.tobytes()),
            WireTensor("J", "INT32", (2,), b"\x05\x00\x00\x00\x06\x00\x00\x00"),
            WireTensor("S", "BYTES", (2,), bytes.fromhex("0200000061620300000078797a")),
        ),
        outputs=(),
        parameters={"sequence_id": 5, "sequence_start": True, "sequence_end": False},
        binary_data_output=True,
    )


def test_binary_data_kept_as_is_without_size_check() -> None:
    """Byte size versus shape is checked later against the config, not here."""
    body, length = _handmade(
        {
            "inputs": [
                {
                    "name": "X",
                    "shape": [4],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 3},
                }
            ]
        },
        b"abc",
    )
    assert parse_infer_request(body, length, model=MODEL).inputs[0].data == b"abc"


def test_memoryview_body_is_accepted() -> None:
    body, length = _handmade(
        {
            "inputs": [
                {
                    "name": "X",
                    "shape": [1],
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": 1},
                }
            ]
        },
        b"\x07",
    )
    request = parse_infer_request(memoryview(bytearray(body)), length, model=MODEL)
    assert request.inputs[0].data == b"\x07"


@pytest.mark.parametrize(
    ("outputs", "parameters", "expected_outputs", "expected_default"),
    [
        (None, None, (), False),
        (None, {"binary_data_output": True}, (), True),
        (
            [{"name": "A"}, {"name": "B", "parameters": {"binary_data": True}}],
            None,
            (RequestedOutput("A", False, 0), RequestedOutput("B", True, 0)),
            False,
        ),
        (
            [
                {"name": "A", "parameters": {"binary_data": False, "classification": 3}},
                {"name": "B"},
            ],
            {"binary_data_output": True},
            (RequestedOutput("A", False, 3), RequestedOutput("B", True, 0)),
            True,
        ),
        ([], None, (), False),
    ],
)
def test_requested_outputs_and_binary_flags(
    outputs: list[dict[str, Any]] | None,
    parameters: dict[str, Any] | None,
    expected_outputs: tuple[RequestedOutput, ...],
    expected_default: bool,
) -> None:
    document: dict[str, Any] = {"inputs": []}
    if outputs is not None:
        document["outputs"] = outputs
    if parameters is not None:
        document["parameters"] = parameters
    body, length = _handmade(document)
    request = parse_infer_request(body, length, model=MODEL)
    assert request.outputs == expected_outputs
    assert request.binary_data_output is expected_default
    assert "binary_data_output" not in request.parameters


def test_tritonclient_requested_outputs_and_custom_parameters() -> None:
    body, length = _client_body(
        {"X": (np.array([1], dtype=np.int32), "INT32", False)},
        outputs=[
            httpclient.InferRequestedOutput("A", binary_data=False),
            httpclient.InferRequestedOutput("B", class_count=2),
        ],
        sequence_id="corr",
        sequence_end=True,
        priority=2,
        timeout=1000,
        custom_parameters={"s": "v", "i": -3, "f": 0.5, "b": False},
    )
    request = parse_infer_request(body, length, model=MODEL)
    assert request.outputs == (RequestedOutput("A", False, 0), RequestedOutput("B", True, 2))
    assert request.binary_data_output is False
    assert request.parameters == {
        "sequence_id": "corr",
        "sequence_start": False,
        "sequence_end": True,
        "priority": 2,
        "timeout": 1000,
        "s": "v",
        "i": -3,
        "f": 0.5,
        "b": False,
    }


# --------------------------------------------------------------------- request errors


def _input(**fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": "X", "shape": [2], "datatype": "INT32", "data": [1, 2]}
    entry.update(fields)
    return {k: v for k, v in entry.items() if v is not ...}


ONE_OF = (
    "Input must set only one of the following fields: 'data', 'binary_data_size' in "
    "'parameters', 'shared_memory_region' in 'parameters' (input 'X' of model 'm')"
)
_BIN2 = {"binary_data_size": 2}

ERRORS: list[tuple[str, Any, int | None, ErrorCode, str]] = [
    # (id, document or raw JSON bytes, header length (None = whole body), code, message)
    (
        "header-too-big",
        b"{}",
        3,
        ErrorCode.INVALID_ARG,
        "inference header size should be in range (0, 2), got: 3",
    ),
    (
        "header-negative",
        b"{}",
        -1,
        ErrorCode.INVALID_ARG,
        "inference header size should be in range (0, 2), got: -1",
    ),
    (
        "raw-binary-without-config-inputs",
        b"{}",
        0,
        ErrorCode.INVALID_ARG,
        "Raw request must only have 1 input (found 1) to be deduced but got 0 inputs in 'm' "
        "model configuration",
    ),
    (
        "bad-json",
        b'{"inputs": [',
        None,
        ErrorCode.INVALID_ARG,
        # Triton's words: rapidjson's reason and byte offset
        "failed to parse the request JSON buffer: Invalid value. at 12",
    ),
    (
        "header-length-into-the-binary-data",  # 14 bytes of JSON, then two NUL bytes
        b'{"inputs": []}\0\0',
        16,
        ErrorCode.INVALID_ARG,
        "failed to parse the request JSON buffer: The document root must not be followed by "
        "other values. at 14",
    ),
    (
        "empty-body",
        b"",
        None,
        ErrorCode.INVALID_ARG,
        "failed to parse the request JSON buffer: The document is empty. at 0",
    ),
    (
        "not-object",
        b"[]",
        None,
        ErrorCode.INVALID_ARG,
        "failed to parse the request JSON buffer: the request must be a JSON object",
    ),
    (
        "id-not-string",
        {"id": 5, "inputs": []},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'id' for model 'm': attempt to access JSON non-string as string",
    ),
    (
        "no-inputs",
        {},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'inputs' for model 'm': expected a JSON array",
    ),
    (
        "input-not-object",
        {"inputs": [1]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'inputs' for model 'm': expected an array of objects",
    ),
    (
        "name-missing",
        {"inputs": [_input(name=...)]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'name' for an input of model 'm': attempt to access JSON non-string "
        "as string",
    ),
    (
        "shape-missing",
        {"inputs": [_input(shape=...)]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'shape' for input 'X' of model 'm': expected an array of non-negative "
        "integers",
    ),
    (
        "shape-negative",
        {"inputs": [_input(shape=[-1, 2])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'shape' for input 'X' of model 'm': expected an array of non-negative "
        "integers",
    ),
    (
        "shape-float",
        {"inputs": [_input(shape=[2.0])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'shape' for input 'X' of model 'm': expected an array of non-negative "
        "integers",
    ),
    (
        "shape-bool",
        {"inputs": [_input(shape=[True])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'shape' for input 'X' of model 'm': expected an array of non-negative "
        "integers",
    ),
    (
        "datatype-missing",
        {"inputs": [_input(datatype=...)]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'datatype' for input 'X' of model 'm': attempt to access JSON "
        "non-string as string",
    ),
    (
        "datatype-unknown",
        {"inputs": [_input(datatype="FP8")]},
        None,
        ErrorCode.INVALID_ARG,
        "invalid datatype 'FP8' for input 'X' of model 'm'",
    ),
    (
        "datatype-case",
        {"inputs": [_input(datatype="fp32")]},
        None,
        ErrorCode.INVALID_ARG,
        "invalid datatype 'fp32' for input 'X' of model 'm'",
    ),
    (
        "input-parameters-not-object",
        {"inputs": [_input(parameters=[])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'parameters' for input 'X' of model 'm': expected a JSON object",
    ),
    ("neither", {"inputs": [_input(data=...)]}, None, ErrorCode.INVALID_ARG, ONE_OF),
    (
        "data-and-binary",
        {"inputs": [_input(parameters=_BIN2)]},
        None,
        ErrorCode.INVALID_ARG,
        ONE_OF,
    ),
    (
        "binary-and-shm",
        {"inputs": [_input(data=..., parameters={**_BIN2, "shared_memory_region": "r"})]},
        None,
        ErrorCode.INVALID_ARG,
        ONE_OF,
    ),
    (
        "shm-without-byte-size",
        {"inputs": [_input(data=..., parameters={"shared_memory_region": "r"})]},
        None,
        ErrorCode.INVALID_ARG,
        "'shared_memory_byte_size' must be specified along with 'shared_memory_region' "
        "parameter for tensor 'X'",
    ),
    (
        "binary-size-negative",
        {"inputs": [_input(data=..., parameters={"binary_data_size": -1})]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'binary_data_size' for input 'X' of model 'm': attempt to access JSON "
        "non-unsigned-integer as unsigned-integer",
    ),
    (
        "binary-short",
        {"inputs": [_input(data=..., parameters={"binary_data_size": 8})]},
        None,
        ErrorCode.INVALID_ARG,
        "unexpected size for input 'X', expecting 8 additional bytes for model 'm'",
    ),
    (
        "duplicate-input",
        {"inputs": [_input(), _input()]},
        None,
        ErrorCode.INVALID_ARG,
        "input 'X' already exists in request",
    ),
    (
        "count-short",
        {"inputs": [_input(data=[1])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'data' for input 'X' of model 'm': shape does not match true shape of "
        "'data' field",
    ),
    (
        "count-long",
        {"inputs": [_input(data=[[1, 2], [3]])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'data' for input 'X' of model 'm': shape does not match true shape of "
        "'data' field",
    ),
    (
        "int-gets-float",
        {"inputs": [_input(data=[1, 2.0])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'data' for input 'X' of model 'm': attempt to access JSON "
        "non-signed-integer as signed-integer",
    ),
    (
        "int-gets-bool",
        {"inputs": [_input(data=[1, True])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'data' for input 'X' of model 'm': attempt to access JSON "
        "non-signed-integer as signed-integer",
    ),
    (
        "int-gets-string",
        {"inputs": [_input(data=["1", 2])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'data' for input 'X' of model 'm': attempt to access JSON "
        "non-signed-integer as signed-integer",
    ),
    (
        "int-gets-null",
        {"inputs": [_input(data=[None, 2])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'data' for input 'X' of model 'm': attempt to access JSON "
        "non-signed-integer as signed-integer",
    ),
    (
        "int64-too-big",
        {"inputs": [_input(datatype="INT64", data=[2**63, 1])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'data' for input 'X' of model 'm': attempt to access JSON "
        "non-signed-integer as signed-integer",
    ),
    (
        "uint-gets-negative",
        {"inputs": [_input(datatype="UINT8", data=[1, -1])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'data' for input 'X' of model 'm': attempt to access JSON "
        "non-unsigned-integer as unsigned-integer",
    ),
    (
        "uint-gets-negative-big",
        {"inputs": [_input(datatype="UINT64", data=[2**63, -1])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'data' for input 'X' of model 'm': attempt to access JSON "
        "non-unsigned-integer as unsigned-integer",
    ),
    (
        "uint-gets-bool",
        {"inputs": [_input(datatype="UINT32", data=[False, 1])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'data' for input 'X' of model 'm': attempt to access JSON "
        "non-unsigned-integer as unsigned-integer",
    ),
    (
        "fp-gets-bool",
        {"inputs": [_input(datatype="FP32", data=[1.5, True])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'data' for input 'X' of model 'm': attempt to access JSON non-number "
        "as number",
    ),
    (
        "fp-gets-string",
        {"inputs": [_input(datatype="FP64", data=["1.5", 1])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'data' for input 'X' of model 'm': attempt to access JSON non-number "
        "as number",
    ),
    (
        "bool-gets-int",
        {"inputs": [_input(datatype="BOOL", data=[True, 1])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'data' for input 'X' of model 'm': attempt to access JSON non-boolean "
        "as boolean",
    ),
    (
        "bytes-gets-int",
        {"inputs": [_input(datatype="BYTES", data=["a", 1])]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'data' for input 'X' of model 'm': attempt to access JSON non-string "
        "as string",
    ),
    (
        "fp16-json",
        {"inputs": [_input(datatype="FP16", data=[1.0, 2.0])]},
        None,
        ErrorCode.INVALID_ARG,
        "receiving FP16 data via JSON is not supported. Please use the binary data format for "
        "input 'X' of model 'm'",
    ),
    (
        "bf16-json",
        {"inputs": [_input(datatype="BF16", data=[1.0, 2.0])]},
        None,
        ErrorCode.INVALID_ARG,
        "receiving BF16 data via JSON is not supported. Please use the binary data format for "
        "input 'X' of model 'm'",
    ),
    (
        "outputs-not-list",
        {"inputs": [], "outputs": {}},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'outputs' for model 'm': expected a JSON array",
    ),
    (
        "output-not-object",
        {"inputs": [], "outputs": ["Y"]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'outputs' for model 'm': expected an array of objects",
    ),
    (
        "output-name-missing",
        {"inputs": [], "outputs": [{}]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'name' for an output of model 'm': attempt to access JSON non-string "
        "as string",
    ),
    (
        "duplicate-output",
        {"inputs": [], "outputs": [{"name": "Y"}, {"name": "Y"}]},
        None,
        ErrorCode.INVALID_ARG,
        "output 'Y' already exists in request",
    ),
    (
        "output-binary-not-bool",
        {"inputs": [], "outputs": [{"name": "Y", "parameters": {"binary_data": 1}}]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'binary_data' for output 'Y' of model 'm': attempt to access JSON "
        "non-boolean as boolean",
    ),
    (
        "output-classification-negative",
        {"inputs": [], "outputs": [{"name": "Y", "parameters": {"classification": -2}}]},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'classification' for output 'Y' of model 'm': attempt to access JSON "
        "non-unsigned-integer as unsigned-integer",
    ),
    (
        "output-shm-offset-without-region",
        {"inputs": [], "outputs": [{"name": "Y", "parameters": {"shared_memory_offset": 8}}]},
        None,
        ErrorCode.INVALID_ARG,
        "'shared_memory_offset' can not be specified without 'shared_memory_region' "
        "parameter for tensor 'Y'",
    ),
    (
        "parameters-not-object",
        {"inputs": [], "parameters": []},
        None,
        ErrorCode.INVALID_ARG,
        "Unable to parse 'parameters' for model 'm': expected a JSON object",
    ),
    (
        "triton-prefix",
        {"inputs": [], "parameters": {"triton_x": 1}},
        None,
        ErrorCode.INVALID_ARG,
        "invalid parameter 'triton_x' for model 'm': parameter keys starting with 'triton_' are "
        "reserved for Triton usage and should not be specified",
    ),
    (
        "binary-data-output-not-bool",
        {"inputs": [], "parameters": {"binary_data_output": 1}},
        None,
        ErrorCode.INVALID_ARG,
        "invalid value for parameter 'binary_data_output' in request for model 'm': expected a "
        "boolean, got integer",
    ),
    (
        "sequence-id-negative",
        {"inputs": [], "parameters": {"sequence_id": -1}},
        None,
        ErrorCode.INVALID_ARG,
        "invalid value for parameter 'sequence_id' in request for model 'm': expected an "
        "unsigned integer or a string, got negative integer",
    ),
    (
        "sequence-id-float",
        {"inputs": [], "parameters": {"sequence_id": 1.0}},
        None,
        ErrorCode.INVALID_ARG,
        "invalid value for parameter 'sequence_id' in request for model 'm': expected an "
        "unsigned integer or a string, got number",
    ),
    (
        "sequence-start-int",
        {"inputs": [], "parameters": {"sequence_start": 1}},
        None,
        ErrorCode.INVALID_ARG,
        "invalid value for parameter 'sequence_start' in request for model 'm': expected a "
        "boolean, got integer",
    ),
    (
        "sequence-end-string",
        {"inputs": [], "parameters": {"sequence_end": "true"}},
        None,
        ErrorCode.INVALID_ARG,
        "invalid value for parameter 'sequence_end' in request for model 'm': expected a "
        "boolean, got string",
    ),
    (
        "priority-negative",
        {"inputs": [], "parameters": {"priority": -1}},
        None,
        ErrorCode.INVALID_ARG,
        "invalid value for parameter 'priority' in request for model 'm': expected an unsigned "
        "integer, got negative integer",
    ),
    (
        "priority-bool",
        {"inputs": [], "parameters": {"priority": True}},
        None,
        ErrorCode.INVALID_ARG,
        "invalid value for parameter 'priority' in request for model 'm': expected an unsigned "
        "integer, got boolean",
    ),
    (
        "timeout-float",
        {"inputs": [], "parameters": {"timeout": 1.5}},
        None,
        ErrorCode.INVALID_ARG,
        "invalid value for parameter 'timeout' in request for model 'm': expected an unsigned "
        "integer, got number",
    ),
    (
        "custom-null",
        {"inputs": [], "parameters": {"p": None}},
        None,
        ErrorCode.INVALID_ARG,
        "invalid value for parameter 'p' in request for model 'm': expected a string, integer, "
        "boolean or number, got null",
    ),
    (
        "custom-object",
        {"inputs": [], "parameters": {"p": {}}},
        None,
        ErrorCode.INVALID_ARG,
        "invalid value for parameter 'p' in request for model 'm': expected a string, integer, "
        "boolean or number, got object",
    ),
]


@pytest.mark.parametrize(
    ("document", "header_length", "code", "message"),
    [case[1:] for case in ERRORS],
    ids=[case[0] for case in ERRORS],
)
def test_request_errors(
    document: Any, header_length: int | None, code: ErrorCode, message: str
) -> None:
    body = document if isinstance(document, bytes) else orjson.dumps(document)
    with pytest.raises(SluiceError) as info:
        parse_infer_request(body, header_length, model=MODEL)
    assert info.value.code is code
    assert info.value.message == message
    assert str(info.value) == message


# ------------------------------------------------------------ raw binary requests (3.4)


@pytest.mark.parametrize(
    ("spec", "max_batch_size", "body", "shape"),
    [
        (TensorSpec("X", "FP32", (4,)), 8, np.arange(4, dtype="<f4").tobytes(), (1, 4)),
        (TensorSpec("X", "FP32", (-1, 4)), 8, np.arange(12, dtype="<f4").tobytes(), (1, 3, 4)),
        (TensorSpec("X", "INT64", (2, -1)), 0, np.arange(6, dtype="<i8").tobytes(), (2, 3)),
        (TensorSpec("X", "UINT8", (-1,)), 0, b"", (0,)),
        (TensorSpec("X", "FP16", (0, -1)), 0, b"", (0, 0)),
    ],
    ids=["fixed-batch-of-1", "variable-batching", "variable-not-batching", "empty", "zero-dim"],
)
def test_raw_binary_request_shape_deduced(
    spec: TensorSpec, max_batch_size: int, body: bytes, shape: tuple[int, ...]
) -> None:
    request = parse_infer_request(
        body, 0, model=MODEL, config_inputs=[spec], max_batch_size=max_batch_size
    )
    assert request.inputs == (WireTensor("X", spec.datatype, shape, body),)
    # every output, in binary; no id, no parameters
    assert (request.outputs, request.binary_data_output) == ((), True)
    assert (request.client_id, request.parameters) == ("", {})


def test_raw_binary_bytes_input_is_one_element() -> None:
    spec = TensorSpec("S", "BYTES", (1,))
    request = parse_infer_request(b"h\x00llo", 0, model=MODEL, config_inputs=[spec])
    assert request.inputs == (WireTensor("S", "BYTES", (1,), serialize_bytes([b"h\x00llo"])),)


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (
            [TensorSpec("A", "FP32", (4,)), TensorSpec("B", "FP32", (4,))],
            "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in "
            "'m' model configuration",
        ),
        (
            [TensorSpec("X", "FP32", (-1, -1))],
            "The shape of the raw input 'X' can not be deduced because there are more than "
            "one variable-sized dimension",
        ),
        (
            [TensorSpec("S", "BYTES", (-1,))],
            "For BYTE datatype raw input 'S', the model must have input shape [1]",
        ),
        (
            [TensorSpec("S", "BYTES", (2,))],
            "For BYTE datatype raw input 'S', the model must have input shape [1]",
        ),
    ],
    ids=["two-inputs", "two-variable-dims", "bytes-variable", "bytes-two"],
)
def test_raw_binary_request_refused(specs: list[TensorSpec], message: str) -> None:
    with pytest.raises(SluiceError) as info:
        parse_infer_request(b"\x00" * 16, 0, model=MODEL, config_inputs=specs, max_batch_size=4)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert info.value.message == message


def test_leftover_binary_data() -> None:
    body, length = _handmade(
        {
            "inputs": [
                {
                    "name": "X",
                    "shape": [1],
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": 1},
                }
            ]
        },
        b"\x01\x02",
    )
    with pytest.raises(SluiceError) as info:
        parse_infer_request(body, length, model=MODEL)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert info.value.message == "unexpected additional input data for model 'm'"


def test_binary_short_counts_missing_bytes() -> None:
    body, length = _handmade(
        {
            "inputs": [
                {
                    "name": "A",
                    "shape": [1],
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": 1},
                },
                {
                    "name": "B",
                    "shape": [4],
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": 4},
                },
            ]
        },
        b"\x01\x02\x03",
    )
    with pytest.raises(SluiceError) as info:
        parse_infer_request(body, length, model=MODEL)
    assert info.value.message == (
        "unexpected size for input 'B', expecting 2 additional bytes for model 'm'"
    )
    assert info.value.tensor == "B"


def test_trailing_bytes_without_header_length_are_bad_json() -> None:
    body, _ = _handmade({"inputs": []})
    with pytest.raises(SluiceError) as info:
        parse_infer_request(body + b"\x00", None, model=MODEL)
    assert info.value.message.startswith("failed to parse the request JSON buffer: ")


# ------------------------------------------------------------------------- responses

FP32 = WireTensor("F", "FP32", (2,), np.array([1.5, -2], dtype="<f4").tobytes())
BOOLS = WireTensor("B", "BOOL", (1, 3), bytes([1, 0, 1]))
TEXT = WireTensor("T", "BYTES", (2,), serialize_bytes([b"hi", b""]))
EMPTY = WireTensor("E", "INT32", (0, 2), b"")


def test_response_all_json_exact_body() -> None:
    body, headers = encode_infer_response(
        model=MODEL,
        version="3",
        client_id="r1",
        outputs=[FP32, BOOLS, TEXT, EMPTY],
        requested=[],
        binary_data_output=False,
        parameters={"p": 1},
    )
    assert headers == {"Content-Type": "application/json"}
    assert orjson.loads(body) == {
        "model_name": "m",
        "model_version": "3",
        "id": "r1",
        "parameters": {"p": 1},
        "outputs": [
            {"name": "F", "datatype": "FP32", "shape": [2], "data": [1.5, -2.0]},
            {"name": "B", "datatype": "BOOL", "shape": [1, 3], "data": [True, False, True]},
            {"name": "T", "datatype": "BYTES", "shape": [2], "data": ["hi", ""]},
            {"name": "E", "datatype": "INT32", "shape": [0, 2], "data": []},
        ],
    }
    assert body.startswith(b'{"model_name":"m","model_version":"3","id":"r1","parameters"')
    result = _decode(body, headers)
    assert result.as_numpy("F").tolist() == [1.5, -2.0]
    assert result.as_numpy("B").tolist() == [[True, False, True]]
    assert result.as_numpy("T").tolist() == ["hi", ""]
    assert result.as_numpy("E").shape == (0, 2)


NON_FINITE = np.array([np.nan, np.inf, -np.inf, 1.5, -0.0], dtype=np.float32)


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_non_finite_json_input_from_tritonclient(datatype: str) -> None:
    # tritonclient writes NaN / Infinity / -Infinity (python-rapidjson); Triton's parser
    # (kParseNanAndInfFlag) takes them as numbers
    array = NON_FINITE.astype(NUMPY[datatype]).reshape(1, 5)
    body, header_length = _client_body({"IN": (array, datatype, False)})
    assert b"NaN" in body and b"-Infinity" in body
    (tensor,) = parse_infer_request(body, header_length, model=MODEL).inputs
    _assert_same(to_numpy(datatype, tensor.shape, tensor.data), array)


def test_non_finite_literals_triton_accepts() -> None:
    body, _ = _handmade({"inputs": [{"name": "X", "datatype": "FP32", "shape": [5], "data": []}]})
    body = body.replace(b'"data":[]', b'"data":[NaN,Infinity,-Infinity,Inf,-Inf]')
    (tensor,) = parse_infer_request(body, None, model=MODEL).inputs
    got = to_numpy("FP32", tensor.shape, tensor.data)
    assert np.isnan(got[0]) and got[1:].tolist() == [np.inf, -np.inf, np.inf, -np.inf]


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        # not a literal; the reason and offset are rapidjson's, not the NaN before it
        ("FP32", b"[NaN,nan]", "failed to parse the request JSON buffer: Invalid value. at 66"),
        ("FP32", b"[NaN,1]]", "Missing a comma or '}' after an object member. at 67"),
        ("FP64", b"[NaN,1e400]", "Number too big to be stored in double. at 65"),
        ("INT32", b"[NaN,1]", "Unable to parse 'data'"),  # a number, but not an integer
    ],
)
def test_non_finite_literals_still_checked(datatype: str, data: bytes, message: str) -> None:
    body = b'{"inputs":[{"name":"X","datatype":"%s","shape":[2],"data":%s}]}' % (
        datatype.encode(),
        data,
    )
    with pytest.raises(SluiceError) as info:
        parse_infer_request(body, None, model=MODEL)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert message in info.value.message


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[" * 2000, "Maximum parse recursion depth exceeded! at 1001"),
        (b'{"parameters":' + b'{"a":' * 3000, "Maximum parse recursion depth exceeded at 5010"),
        (b'{"id":"x\xff\xfe"}', "Invalid encoding in string (not UTF-8). at 8"),
        (b'{"id":"\\ud800"}', "The surrogate pair in string is invalid. at "),
    ],
    ids=["deep-array", "deep-object", "not-utf8", "lone-surrogate"],
)
def test_bodies_no_parser_takes_are_invalid_arg(body: bytes, message: str) -> None:
    # too deep for orjson (and rapidjson) or not text: a 400 naming the model, not a crash
    with pytest.raises(SluiceError) as info:
        parse_infer_request(body, None, model=MODEL)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert info.value.message.startswith("failed to parse the request JSON buffer: ")
    assert message in info.value.message
    assert info.value.model == MODEL


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_response_non_finite_written_as_triton_does(datatype: str) -> None:
    array = NON_FINITE.astype(NUMPY[datatype])
    tensor = WireTensor("F", datatype, (5,), array.astype(array.dtype.newbyteorder("<")).tobytes())
    body, headers = encode_infer_response(
        model=MODEL,
        version="1",
        client_id="",
        outputs=[tensor, FP32],
        requested=[],
        binary_data_output=False,
    )
    # rapidjson's kWriteNanAndInfFlag literals, as Triton's TritonJson::Write
    assert b'"data":[NaN,Infinity,-Infinity,1.5,-0.0]' in body
    assert b'"data":[1.5,-2.0]' in body  # a finite output is written as before
    got = _decode(body, headers).as_numpy("F")
    _assert_same(got, array)


def test_response_all_binary() -> None:
    body, headers = encode_infer_response(
        model=MODEL,
        version="1",
        client_id="",
        outputs=[FP32, TEXT, EMPTY],
        requested=[],
        binary_data_output=True,
    )
    header = (
        b'{"model_name":"m","model_version":"1","outputs":['
        b'{"name":"F","datatype":"FP32","shape":[2],"parameters":{"binary_data_size":8}},'
        b'{"name":"T","datatype":"BYTES","shape":[2],"parameters":{"binary_data_size":10}},'
        b'{"name":"E","datatype":"INT32","shape":[0,2],"parameters":{"binary_data_size":0}}]}'
    )
    assert body == header + FP32.data + TEXT.data
    assert headers == {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }
    result = _decode(body, headers)
    assert result.as_numpy("F").tolist() == [1.5, -2.0]
    assert result.as_numpy("T").tolist() == [b"hi", b""]
    assert result.as_numpy("E").shape == (0, 2)


def test_response_mixed_follows_requested_order_and_flags() -> None:
    body, headers = encode_infer_response(
        model=MODEL,
        version="1",
        client_id="",
        outputs=[FP32, BOOLS, TEXT],
        requested=[RequestedOutput("T", binary=True), RequestedOutput("F", binary=False)],
        binary_data_output=False,
    )
    length = int(headers["Inference-Header-Content-Length"])
    assert headers["Content-Type"] == "application/octet-stream"
    assert orjson.loads(body[:length])["outputs"] == [
        {"name": "T", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 10}},
        {"name": "F", "datatype": "FP32", "shape": [2], "data": [1.5, -2.0]},
    ]
    assert body[length:] == TEXT.data
    result = _decode(body, headers)
    assert result.as_numpy("B") is None
    assert result.as_numpy("T").tolist() == [b"hi", b""]
    assert result.as_numpy("F").tolist() == [1.5, -2.0]


@pytest.mark.parametrize(
    ("tensor", "code", "message"),
    [
        (
            WireTensor("H", "FP16", (1,), b"\x00\x3c"),
            ErrorCode.INVALID_ARG,
            "sending FP16 data via JSON is not supported. Please use the binary data format for "
            "output 'H' of model 'm'",
        ),
        (
            WireTensor("H", "BF16", (1,), b"\x80\x3f"),
            ErrorCode.INVALID_ARG,
            "sending BF16 data via JSON is not supported. Please use the binary data format for "
            "output 'H' of model 'm'",
        ),
        (
            WireTensor("T", "BYTES", (1,), serialize_bytes([b"\xff\xfe"])),
            ErrorCode.INVALID_ARG,
            "output 'T' of model 'm' holds bytes that are not valid UTF-8; ask for it in binary",
        ),
        (
            WireTensor("F", "FP32", (2,), b"\x00" * 4),
            ErrorCode.INTERNAL,
            "output tensor shape does not match size of output for 'F' of model 'm': 4 bytes, "
            "expected 8",
        ),
        (
            WireTensor("T", "BYTES", (2,), serialize_bytes([b"a"])),
            ErrorCode.INTERNAL,
            "output tensor shape does not match size of output for 'T' of model 'm': unexpected "
            "number of string elements 1, expecting 2",
        ),
    ],
)
def test_response_json_errors(tensor: WireTensor, code: ErrorCode, message: str) -> None:
    with pytest.raises(SluiceError) as info:
        encode_infer_response(
            model=MODEL,
            version="1",
            client_id="",
            outputs=[tensor],
            requested=[RequestedOutput(tensor.name, binary=False)],
            binary_data_output=True,
        )
    assert info.value.code is code
    assert info.value.message == message


def test_response_fp16_binary_is_fine() -> None:
    tensor = WireTensor("H", "FP16", (1,), b"\x00\x3c")
    body, headers = encode_infer_response(
        model=MODEL,
        version="1",
        client_id="",
        outputs=[tensor],
        requested=[],
        binary_data_output=True,
    )
    assert _decode(body, headers).as_numpy("H").tolist() == [1.0]


def test_response_missing_requested_output_is_left_out() -> None:
    """As Triton's front ends: the outputs the response holds, a requested one the model
    did not produce absent (tritonclient's as_numpy gives None)."""
    body, headers = encode_infer_response(
        model=MODEL,
        version="1",
        client_id="",
        outputs=[FP32],
        requested=[RequestedOutput("nope"), RequestedOutput(FP32.name)],
        binary_data_output=False,
    )
    result = _decode(body, headers)
    assert result.as_numpy("nope") is None
    assert result.as_numpy(FP32.name) is not None
    assert [o["name"] for o in result.get_response()["outputs"]] == [FP32.name]


def test_large_flat_request_round_trip() -> None:
    array = np.arange(200_000, dtype=np.float32).reshape(1000, 200) / 7
    body, length = _client_body({"X": (array, "FP32", False)})
    (tensor,) = parse_infer_request(body, length, model=MODEL).inputs
    assert tensor.data == array.tobytes()
    response, headers = encode_infer_response(
        model=MODEL,
        version="1",
        client_id="",
        outputs=[tensor],
        requested=[],
        binary_data_output=False,
    )
    _assert_same(_decode(response, headers).as_numpy("X"), array)
