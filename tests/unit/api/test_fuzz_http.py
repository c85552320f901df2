"""Property tests of the HTTP request parsers: the binary tensor data extension parser and
the JSON tensor decoder (``sluice.api.http``) raise nothing but :class:`SluiceError` on
any input, and what ``tritonclient.http`` sends comes out exact.

``SLUICE_FUZZ_EXAMPLES`` sets the examples per test (300 by default, see
``tests/conftest.py``).
"""

from __future__ import annotations

import contextlib
import json
import math

import numpy as np
from e2e_support import tritonclient_body
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sluice.api.http.infer_request import parse_infer_request
from sluice.api.http.json_tensors import json_to_wire, wire_to_json
from sluice.broker.datatypes import deserialize_bytes, serialize_bytes
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.messages import WireTensor
from sluice.broker.request_checks import TensorSpec

FUZZ = settings(settings.get_profile("fuzz"))
MODEL = "m"
NUMPY = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}  # fmt: skip
#: datatypes JSON ``data`` may carry (FP16 and BF16 only travel in binary, as in Triton)
JSON_TYPES = [t for t in NUMPY if t != "FP16"] + ["BYTES"]
SHAPES = st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple)

# any JSON document, a few levels deep
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def arrays(draw: st.DrawFn, datatypes: list[str], binary: bool) -> tuple[np.ndarray, str]:
    """An array of a datatype of ``datatypes`` and any small shape; in JSON only finite
    floats and UTF-8 text for BYTES (what a JSON body can hold)."""
    datatype = draw(st.sampled_from(datatypes))
    shape = draw(SHAPES)
    count = math.prod(shape)
    if datatype == "BYTES":
        item = st.binary(max_size=6) if binary else st.text(max_size=6).map(str.encode)
        items = draw(st.lists(item, min_size=count, max_size=count))
        array = np.empty(count, dtype=object)
        array[:] = items
        return array.reshape(shape), datatype
    dtype = np.dtype(NUMPY[datatype])
    elements = None
    if dtype.kind == "f":
        elements = st.floats(width=dtype.itemsize * 8, allow_nan=binary, allow_infinity=binary)
    return draw(hnp.arrays(dtype, shape, elements=elements)), datatype


def _wire(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return serialize_bytes(array.ravel().tolist())
    return array.astype(array.dtype.newbyteorder("<")).tobytes()


@FUZZ
@given(st.lists(st.tuples(arrays(JSON_TYPES, False), st.booleans()), min_size=1, max_size=4))
def test_what_tritonclient_sends_parses_exact(
    tensors: list[tuple[tuple[np.ndarray, str], bool]],
) -> None:
    """Inputs in binary and in JSON, mixed in one request as tritonclient builds it:
    each input's name, datatype, shape and wire bytes come out as sent."""
    sent = {
        f"IN{i}": (array, datatype, binary) for i, ((array, datatype), binary) in enumerate(tensors)
    }
    body, header_length = tritonclient_body(sent, request_id="fuzz")
    parsed = parse_infer_request(body, header_length, model=MODEL)
    assert parsed.client_id == "fuzz"
    assert [t.name for t in parsed.inputs] == list(sent)
    for tensor in parsed.inputs:
        array, datatype, _ = sent[tensor.name]
        assert tensor.datatype == datatype
        assert tensor.shape == array.shape
        assert bytes(tensor.data) == _wire(array, datatype)


@FUZZ
@given(arrays([*list(NUMPY), "BYTES"], True))
def test_binary_tensors_parse_exact(tensor: tuple[np.ndarray, str]) -> None:
    """Any value in binary (NaN, infinities, any bytes) comes out bit for bit."""
    array, datatype = tensor
    body, header_length = tritonclient_body({"X": (array, datatype, True)})
    (parsed,) = parse_infer_request(body, header_length, model=MODEL).inputs
    assert bytes(parsed.data) == _wire(array, datatype)


@FUZZ
@given(st.binary(max_size=300), st.none() | st.integers(-2, 320))
def test_any_body_is_parsed_or_refused_with_a_sluice_error(
    body: bytes, header_length: int | None
) -> None:
    inputs = [TensorSpec("X", "FP32", (-1,))]
    with contextlib.suppress(SluiceError):
        parse_infer_request(body, header_length, model=MODEL, config_inputs=inputs)


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(["id", "inputs", "outputs", "parameters"]) | st.text(max_size=4),
        JSON_VALUES,
        max_size=4,
    ),
    st.binary(max_size=40),
)
def test_any_json_header_with_binary_data_is_parsed_or_refused(header: dict, tail: bytes) -> None:
    """A JSON header of any members and values (inputs and outputs lists of any
    objects), followed by any bytes."""
    text = json.dumps(header).encode()
    with contextlib.suppress(SluiceError):
        parse_infer_request(text + tail, len(text) if tail else None, model=MODEL)


@st.composite
def tensor_objects(draw: st.DrawFn) -> dict:
    """An ``inputs`` element close to a valid one: known member names, values of any
    JSON type or of the right one."""
    members = {
        "name": st.text(max_size=3) | JSON_VALUES,
        "datatype": st.sampled_from([*JSON_TYPES, "FP16", "BF16", "X"]) | JSON_VALUES,
        "shape": st.lists(st.integers(-2, 3), max_size=3) | JSON_VALUES,
        "data": JSON_VALUES,
        "parameters": st.fixed_dictionaries(
            {}, optional={"binary_data_size": st.integers(-1, 64) | JSON_VALUES}
        ) | JSON_VALUES,
    }  # fmt: skip
    chosen = draw(st.sets(st.sampled_from(list(members))))
    return {name: draw(members[name]) for name in chosen}


@FUZZ
@given(st.lists(tensor_objects(), min_size=1, max_size=3), st.binary(max_size=64))
def test_inputs_of_any_members_are_parsed_or_refused(inputs: list[dict], tail: bytes) -> None:
    text = json.dumps({"inputs": inputs}).encode()
    with contextlib.suppress(SluiceError):
        parse_infer_request(text + tail, len(text), model=MODEL)


@FUZZ
@given(JSON_VALUES, st.sampled_from([*JSON_TYPES, "FP16"]), SHAPES)
def test_json_data_of_any_shape_and_type_converts_or_is_refused(
    data: object, datatype: str, shape: tuple[int, ...]
) -> None:
    try:
        wire = json_to_wire(data, datatype, shape, "X", MODEL)
    except SluiceError:
        return
    if datatype != "BYTES" and math.prod(shape):
        assert len(wire) == math.prod(shape) * np.dtype(NUMPY[datatype]).itemsize


@FUZZ
@given(arrays(JSON_TYPES, False))
def test_json_data_round_trips_exact(tensor: tuple[np.ndarray, str]) -> None:
    """JSON ``data`` -> wire bytes -> JSON ``data`` gives the values sent."""
    array, datatype = tensor
    values = [v.decode() if isinstance(v, bytes) else v for v in array.ravel().tolist()]
    wire = json_to_wire(values, datatype, array.shape, "X", MODEL)
    back = wire_to_json(WireTensor("X", datatype, array.shape, wire), MODEL)
    assert list(np.asarray(back).ravel().tolist() if datatype != "BYTES" else back) == values


@FUZZ
@given(st.lists(st.binary(max_size=8), max_size=6))
def test_bytes_elements_round_trip_exact(items: list[bytes]) -> None:
    """The ``BYTES`` wire layout (4-byte length + bytes per element) decodes to the
    elements encoded."""
    assert deserialize_bytes(serialize_bytes(items), len(items)) == items


@FUZZ
@given(st.binary(max_size=64), st.none() | st.integers(0, 8))
def test_any_bytes_decode_as_bytes_elements_or_are_refused(
    buffer: bytes, count: int | None
) -> None:
    """A truncated length or element, or another element count: ValueError, which the
    parsers turn into Triton's errors."""
    try:
        items = deserialize_bytes(buffer, count)
    except ValueError:
        return
    assert serialize_bytes(items) == buffer


@FUZZ
@given(st.integers(1, 100_000), st.sampled_from(["data", "parameters", "outputs", "x"]))
def test_json_nested_to_any_depth_is_parsed_or_refused_as_invalid(depth: int, member: str) -> None:
    """Arrays nested ``depth`` deep in a member of the request: parsed (``data`` up to
    Triton's limit of 100 levels) or INVALID_ARG, never a recursion error."""
    nested = "[" * depth + "1" + "]" * depth
    data = nested if member == "data" else "[1]"
    tensor = f'{{"name":"X","shape":[1],"datatype":"INT32","data":{data}'
    tensor += f',"parameters":{nested}}}' if member == "parameters" else "}"
    extra = f',"{member}":{nested}' if member in ("outputs", "x") else ""
    text = f'{{"inputs":[{tensor}]{extra}}}'
    try:
        parsed = parse_infer_request(text.encode(), None, model=MODEL)
    except SluiceError as exc:
        assert exc.code == ErrorCode.INVALID_ARG, exc
        assert not (member == "data" and depth <= 100), exc  # within Triton's limit
        return
    assert parsed.inputs[0].data == (1).to_bytes(4, "little")
