"""Unit tests for api.grpc.codec and the shared rules it uses (api.parameters, api.access)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request

from sluice.api.access import AccessPolicy, http_group, parse_spec
from sluice.api.grpc.codec import encode_infer_response, parse_infer_request, parse_version
from sluice.api.shm_tensors import ShmRef
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.messages import RequestedOutput, WireTensor


def _request(**kwargs: object) -> service_pb2.ModelInferRequest:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    tensor = grpcclient.InferInput("A", [1, 4], "FP32")
    tensor.set_data_from_numpy(a)
    defaults: dict[str, object] = {
        "model_name": "m",
        "inputs": [tensor],
        "model_version": "",
        "request_id": "",
        "outputs": None,
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
        "priority": 0,
        "timeout": None,
        "parameters": None,
    }
    defaults.update(kwargs)
    return _get_inference_request(**defaults)


def test_tritonclient_request_parses() -> None:
    request = _request(
        request_id="r1",
        model_version="2",
        sequence_id=7,
        sequence_start=True,
        priority=3,
        timeout=100,
        parameters={"s": "x", "i": -1, "b": False, "f": 0.25},
        outputs=[grpcclient.InferRequestedOutput("Y")],
    )
    parsed = parse_infer_request(request)
    assert parsed.version == 2
    assert parsed.client_id == "r1"
    assert parsed.inputs == (WireTensor("A", "FP32", (1, 4), np.arange(4, dtype="<f4").tobytes()),)
    assert parsed.outputs == (RequestedOutput("Y"),)
    assert parsed.parameters == {
        "sequence_id": 7,
        "sequence_start": True,
        "sequence_end": False,
        "priority": 3,
        "timeout": 100,
        "s": "x",
        "i": -1,
        "b": False,
        "f": 0.25,
    }
    assert type(parsed.parameters["priority"]) is int  # uint64_param unwrapped


@pytest.mark.parametrize(
    ("datatype", "field", "values", "expected"),
    [
        ("INT8", "int_contents", [-128, 127, 300], np.array([-128, 127, 44], "<i1")),
        ("INT16", "int_contents", [-32768, 70000], np.array([-32768, 4464], "<i2")),
        ("INT32", "int_contents", [-(2**31), 2**31 - 1], np.array([-(2**31), 2**31 - 1], "<i4")),
        ("INT64", "int64_contents", [-(2**63)], np.array([-(2**63)], "<i8")),
        ("UINT8", "uint_contents", [0, 255, 256], np.array([0, 255, 0], "<u1")),
        ("UINT16", "uint_contents", [65535], np.array([65535], "<u2")),
        ("UINT32", "uint_contents", [2**32 - 1], np.array([2**32 - 1], "<u4")),
        ("UINT64", "uint64_contents", [2**64 - 1], np.array([2**64 - 1], "<u8")),
        ("FP32", "fp32_contents", [0.5, -1.0], np.array([0.5, -1.0], "<f4")),
        ("FP64", "fp64_contents", [1e300], np.array([1e300], "<f8")),
        ("BOOL", "bool_contents", [True, False], np.array([True, False])),
    ],
)
def test_typed_contents_narrowed(
    datatype: str, field: str, values: list, expected: np.ndarray
) -> None:
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="X", datatype=datatype, shape=[len(values)])
    getattr(tensor.contents, field).extend(values)
    (wire,) = parse_infer_request(request).inputs
    assert wire.data == expected.tobytes()


def test_typed_bytes_length_prefixed() -> None:
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="S", datatype="BYTES", shape=[2])
    tensor.contents.bytes_contents.extend([b"ab", b""])
    (wire,) = parse_infer_request(request).inputs
    assert wire.data == b"\x02\0\0\0ab\0\0\0\0"


def test_raw_contents_skip_shm_inputs() -> None:
    """The i-th raw_input_contents entry belongs to the i-th input not in shared memory."""
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="X", datatype="FP32", shape=[1])
    tensor.parameters["shared_memory_region"].string_param = "r"
    tensor.parameters["shared_memory_byte_size"].int64_param = 4
    tensor.parameters["shared_memory_offset"].int64_param = 8
    request.inputs.add(name="Y", datatype="FP32", shape=[1])
    request.raw_input_contents.append(b"\0\0\x80\x3f")
    parsed = parse_infer_request(request)
    assert [(t.name, t.data) for t in parsed.inputs] == [("X", b""), ("Y", b"\0\0\x80\x3f")]
    assert parsed.shm is not None
    assert parsed.shm.inputs == {"X": ShmRef("r", 8, 4)}
    assert parsed.shm.outputs == {}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda r: r.inputs.add(name="A", datatype="FP32", shape=[1, 4]),
            "input 'A' already exists in request",
        ),
        (
            lambda r: r.inputs.__getitem__(0).__setattr__("datatype", "FP8"),
            "invalid datatype 'FP8' for input 'A' of model 'm'",
        ),
        (
            lambda r: r.parameters["sequence_id"].MergeFrom(
                service_pb2.InferParameter(double_param=1)
            ),
            "invalid value for parameter 'sequence_id' in request for model 'm': expected an "
            "unsigned integer or a string, got number",
        ),
        (
            lambda r: r.outputs.add(name="Y") and r.outputs.add(name="Y"),
            "output 'Y' already exists in request",
        ),
    ],
)
def test_request_errors(mutate: object, message: str) -> None:
    request = _request()
    mutate(request)  # type: ignore[operator]
    with pytest.raises(SluiceError) as info:
        parse_infer_request(request)
    assert info.value.code == ErrorCode.INVALID_ARG
    assert info.value.message == message


def test_version_parsing() -> None:
    assert parse_version("", "m") is None
    assert parse_version("12", "m") == 12
    with pytest.raises(SluiceError) as info:
        parse_version("-1", "m")
    assert info.value.code == ErrorCode.INVALID_ARG


def test_response_outputs_in_requested_order_raw_only() -> None:
    outputs = (
        WireTensor("A", "FP32", (1,), b"\0\0\x80?"),
        WireTensor("B", "BYTES", (1,), b"\x01\0\0\0z"),
    )
    response = encode_infer_response(
        model="m",
        version="3",
        client_id="id",
        outputs=outputs,
        requested=(RequestedOutput("B"), RequestedOutput("A")),
        parameters={"p": 1, "q": "s", "r": True, "d": 0.5},
    )
    assert [o.name for o in response.outputs] == ["B", "A"]
    assert list(response.raw_output_contents) == [b"\x01\0\0\0z", b"\0\0\x80?"]
    assert (response.model_version, response.id) == ("3", "id")
    assert response.parameters["p"].int64_param == 1
    assert response.parameters["q"].string_param == "s"
    assert response.parameters["r"].bool_param is True
    assert response.parameters["d"].double_param == 0.5
    result = grpcclient.InferResult(response)
    assert result.as_numpy("A").tolist() == [1.0]
    assert result.as_numpy("B").tolist() == [b"z"]


# ------------------------------------------------------------------ access control


def test_access_policy() -> None:
    policy = AccessPolicy(["model-repository,statistics:Admin-Key=v"], "triton-grpc-protocol-")
    assert policy.missing_header("health", {}) is None
    assert policy.missing_header("statistics", {}) == "triton-grpc-protocol-admin-key"
    assert policy.missing_header("statistics", {"triton-grpc-protocol-admin-key": "x"}) == (
        "triton-grpc-protocol-admin-key"
    )
    assert policy.missing_header("statistics", {"triton-grpc-protocol-admin-key": "v"}) is None
    assert not AccessPolicy([])


@pytest.mark.parametrize(
    "spec",
    ["model-repository", "nope:k=v", "health:k", "health:=v", "health,bogus:k=v"],
)
def test_access_policy_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError):
        AccessPolicy([spec])


def test_access_policy_rejects_a_group_given_twice() -> None:
    with pytest.raises(ValueError, match="'health' is given more than once"):
        AccessPolicy(["health:a=1", "metadata,health:b=2"])


def test_parse_spec_allows_several_groups() -> None:
    assert parse_spec("inference,health:k=a=b") == (["inference", "health"], "k", "a=b")


@pytest.mark.parametrize(
    ("path", "group"),
    [
        ("/v2", "metadata"),
        ("/v2/health/live", "health"),
        ("/v2/models/m/ready", "health"),
        ("/v2/models/m/versions/1/ready", "health"),
        ("/v2/models/m", "metadata"),
        ("/v2/models/m/versions/2", "metadata"),
        ("/v2/models/m/config", "model-config"),
        ("/v2/models/m/infer", "inference"),
        ("/v2/models/m/versions/1/infer", "inference"),
        ("/v2/models/stats", "statistics"),
        ("/v2/models/m/stats", "statistics"),
        ("/v2/repository/index", "model-repository"),
        ("/v2/repository/models/m/load", "model-repository"),
        ("/v2/systemsharedmemory/status", "shared-memory"),
        ("/v2/cudasharedmemory/region/r/register", "shared-memory"),
        ("/v2/trace/setting", "trace"),
        ("/v2/models/m/trace/setting", "trace"),
        ("/v2/logging", "logging"),
        ("/metrics", None),
    ],
)
def test_http_groups(path: str, group: str | None) -> None:
    assert http_group("GET", path) == group


def test_uint64_typed_contents_above_the_int64_range_convert_exact() -> None:
    """numpy reads [0, 2**63 + 1] as float64 unless told the field's type: the values
    must come out exact, not rounded."""
    values = [0, 2**63 + 1, 2**64 - 1]
    request = service_pb2.ModelInferRequest(model_name="m")
    item = request.inputs.add(name="X", datatype="UINT64", shape=[3])
    item.contents.uint64_contents.extend(values)
    (wire,) = parse_infer_request(request).inputs
    assert np.frombuffer(wire.data, dtype="<u8").tolist() == values
