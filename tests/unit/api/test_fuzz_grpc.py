"""Property tests of the gRPC request conversion (``sluice.api.grpc.codec``): any
``ModelInferRequest`` is converted or refused with a :class:`SluiceError`, and what
``tritonclient.grpc`` sends (raw or typed contents) comes out exact.

``SLUICE_FUZZ_EXAMPLES`` sets the examples per test (300 by default, see
``tests/conftest.py``).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import tritonclient.grpc as grpcclient
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request

from sluice.api.grpc.codec import parse_infer_request
from sluice.broker.datatypes import serialize_bytes
from sluice.broker.errors import SluiceError

FUZZ = settings(settings.get_profile("fuzz"))
NUMPY = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}  # fmt: skip
#: datatype -> the typed ``InferTensorContents`` field that carries it
CONTENTS = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
    "UINT32": "uint_contents", "UINT64": "uint64_contents", "INT8": "int_contents",
    "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}  # fmt: skip
SHAPES = st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple)
PARAMETER_VALUES = (
    st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=4) | st.floats()
)
PARAMETER_KEYS = st.sampled_from(
    ["sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
     "binary_data_output", "shared_memory_region", "headers", "x"]
)  # fmt: skip


@st.composite
def arrays(draw: st.DrawFn) -> tuple[np.ndarray, str]:
    """An array of any datatype (BYTES included) and any small shape, any values."""
    datatype = draw(st.sampled_from([*NUMPY, "BYTES"]))
    shape = draw(SHAPES)
    if datatype == "BYTES":
        count = math.prod(shape)
        array = np.empty(count, dtype=object)
        array[:] = draw(st.lists(st.binary(max_size=6), min_size=count, max_size=count))
        return array.reshape(shape), datatype
    return draw(hnp.arrays(np.dtype(NUMPY[datatype]), shape)), datatype


def _wire(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return serialize_bytes(array.ravel().tolist())
    return array.astype(array.dtype.newbyteorder("<")).tobytes()


def _tritonclient_request(tensors: list[tuple[np.ndarray, str]]) -> service_pb2.ModelInferRequest:
    inputs = []
    for i, (array, datatype) in enumerate(tensors):
        tensor = grpcclient.InferInput(f"IN{i}", list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return _get_inference_request(
        model_name="m", inputs=inputs, model_version="", request_id="fuzz", outputs=None,
        sequence_id=0, sequence_start=False, sequence_end=False, priority=0, timeout=None,
        parameters=None,
    )  # fmt: skip


@FUZZ
@given(st.lists(arrays(), min_size=1, max_size=4))
def test_what_tritonclient_sends_converts_exact(tensors: list[tuple[np.ndarray, str]]) -> None:
    parsed = parse_infer_request(_tritonclient_request(tensors))
    assert parsed.client_id == "fuzz" and parsed.model == "m"
    assert len(parsed.inputs) == len(tensors)
    for wire, (array, datatype) in zip(parsed.inputs, tensors, strict=True):
        assert wire.datatype == datatype
        assert wire.shape == array.shape
        assert bytes(wire.data) == _wire(array, datatype)


@FUZZ
@given(arrays())
def test_typed_contents_convert_exact(tensor: tuple[np.ndarray, str]) -> None:
    """The same values in typed ``contents`` instead of raw bytes: the same wire bytes
    (FP16 has no typed field and is refused)."""
    array, datatype = tensor
    request = service_pb2.ModelInferRequest(model_name="m")
    item = request.inputs.add(name="X", datatype=datatype, shape=list(array.shape))
    field = CONTENTS.get(datatype)
    if field is None:
        item.contents.SetInParent()
        try:
            parse_infer_request(request)
        except SluiceError as exc:
            assert "cannot be sent in typed 'contents'" in exc.message
            return
        raise AssertionError(f"{datatype} in typed contents was accepted")
    getattr(item.contents, field).extend(array.ravel().tolist())
    item.contents.SetInParent()
    (wire,) = parse_infer_request(request).inputs
    assert bytes(wire.data) == _wire(array, datatype)


@st.composite
def any_requests(draw: st.DrawFn) -> service_pb2.ModelInferRequest:
    """A request of any inputs (names repeated, unknown datatypes, negative dims, typed
    and raw contents mixed, counts of raw contents that do not match), outputs and
    parameters."""
    request = service_pb2.ModelInferRequest(
        model_name=draw(st.text(max_size=3)),
        model_version=draw(st.sampled_from(["", "1", "-1", "x", "99999999999999999999"])),
        id=draw(st.text(max_size=3)),
    )
    for _ in range(draw(st.integers(0, 3))):
        item = request.inputs.add(
            name=draw(st.sampled_from(["A", "B", ""])),
            datatype=draw(st.sampled_from([*NUMPY, "BYTES", "BF16", "X", ""])),
            shape=draw(st.lists(st.integers(-2, 4), max_size=3)),
        )
        if draw(st.booleans()):
            field = draw(st.sampled_from(sorted(set(CONTENTS.values()))))
            values = {
                "bool_contents": st.booleans(), "bytes_contents": st.binary(max_size=4),
                "fp32_contents": st.floats(width=32), "fp64_contents": st.floats(),
                "int_contents": st.integers(-(2**31), 2**31 - 1),
                "int64_contents": st.integers(-(2**63), 2**63 - 1),
                "uint_contents": st.integers(0, 2**32 - 1),
                "uint64_contents": st.integers(0, 2**64 - 1),
            }[field]  # fmt: skip
            getattr(item.contents, field).extend(draw(st.lists(values, max_size=5)))
            item.contents.SetInParent()
        for key in draw(st.lists(PARAMETER_KEYS, max_size=2)):
            _set(item.parameters[key], draw(PARAMETER_VALUES))
    request.raw_input_contents.extend(draw(st.lists(st.binary(max_size=16), max_size=3)))
    for _ in range(draw(st.integers(0, 2))):
        output = request.outputs.add(name=draw(st.sampled_from(["Y", "Y", ""])))
        for key in draw(
            st.lists(st.sampled_from(["classification", "binary_data", "x"]), max_size=2)
        ):
            _set(output.parameters[key], draw(PARAMETER_VALUES))
    for key in draw(st.lists(PARAMETER_KEYS, max_size=3)):
        _set(request.parameters[key], draw(PARAMETER_VALUES))
    return request


def _set(parameter: object, value: object) -> None:
    if isinstance(value, bool):
        parameter.bool_param = value  # type: ignore[attr-defined]
    elif isinstance(value, int):
        parameter.int64_param = value  # type: ignore[attr-defined]
    elif isinstance(value, float):
        parameter.double_param = value  # type: ignore[attr-defined]
    else:
        parameter.string_param = value  # type: ignore[attr-defined]


@FUZZ
@given(any_requests())
def test_any_request_converts_or_is_refused_with_a_sluice_error(
    request: service_pb2.ModelInferRequest,
) -> None:
    with contextlib.suppress(SluiceError):
        parsed = parse_infer_request(request)
        assert len(parsed.inputs) == len(request.inputs)


@FUZZ
@given(st.binary(max_size=200))
def test_any_bytes_that_decode_as_a_request_convert_or_are_refused(raw: bytes) -> None:
    from google.protobuf.message import DecodeError

    try:
        request = service_pb2.ModelInferRequest.FromString(raw)
    except DecodeError:
        return  # grpcio refuses what does not decode before Sluice sees it
    with contextlib.suppress(SluiceError):
        parse_infer_request(request)
