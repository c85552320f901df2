"""gRPC inference with the unmodified tritonclient.grpc: sync, async, typed contents, errors."""

from __future__ import annotations

import json
import queue

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

TYPES = {
    "FP32": np.float32,
    "FP64": np.float64,
    "FP16": np.float16,
    "INT8": np.int8,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "BOOL": np.bool_,
}


def _add_sub_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = [
        grpcclient.InferInput("INPUT0", list(a.shape), "FP32"),
        grpcclient.InferInput("INPUT1", list(b.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_add_sub_exact(grpc_client) -> None:
    a = np.arange(48, dtype=np.float32).reshape(3, 16) / 7
    b = np.full((3, 16), 0.25, dtype=np.float32)
    outputs = [
        grpcclient.InferRequestedOutput("OUTPUT0"),
        grpcclient.InferRequestedOutput("OUTPUT1"),
    ]
    result = grpc_client.infer("add_sub", _add_sub_inputs(a, b), outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response.model_name == "add_sub"
    assert response.model_version == "1"
    assert len(response.raw_output_contents) == 2


def test_no_outputs_listed_returns_all_in_config_order(grpc_client) -> None:
    a = np.ones((1, 16), np.float32)
    result = grpc_client.infer("add_sub", _add_sub_inputs(a, a))
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT0", "OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 16), np.float32))


def test_requested_output_subset_in_request_order(grpc_client) -> None:
    a = np.ones((2, 16), np.float32)
    outputs = [
        grpcclient.InferRequestedOutput("OUTPUT1"),
        grpcclient.InferRequestedOutput("OUTPUT0"),
    ]
    result = grpc_client.infer("add_sub", _add_sub_inputs(a, a * 3), outputs=outputs)
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1", "OUTPUT0"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.full((2, 16), -2, np.float32))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((2, 16), 4, np.float32))


def test_every_datatype_round_trips(grpc_client) -> None:
    rng = np.random.default_rng(7)
    data: dict[str, np.ndarray] = {}
    for name, dtype in TYPES.items():
        if dtype is np.bool_:
            data[name] = rng.integers(0, 2, (2, 4)).astype(bool)
        elif np.issubdtype(dtype, np.floating):
            data[name] = rng.standard_normal((2, 4)).astype(dtype)
        else:
            info = np.iinfo(dtype)
            data[name] = rng.integers(
                max(info.min, -1000), min(info.max, 1000), (2, 4), dtype=dtype
            )
    data["BYTES"] = np.array(
        [[b"h\xc3\xa9llo", b"", b"x" * 300], [b"a", b"b", "\u00fcn\u00efcode".encode()]], object
    )
    inputs = []
    for name, array in data.items():
        tensor = grpcclient.InferInput(f"IN_{name}", list(array.shape), name)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    outputs = [grpcclient.InferRequestedOutput(f"OUT_{n}") for n in data]
    result = grpc_client.infer("identity_types", inputs, outputs=outputs)
    for name, array in data.items():
        got = result.as_numpy(f"OUT_{name}")
        if name == "BYTES":
            assert got.tolist() == array.tolist()
        else:
            assert got.dtype == array.dtype, name
            np.testing.assert_array_equal(got, array, err_msg=name)


def test_versions(grpc_client) -> None:
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    assert grpc_client.infer("versioned", [tensor]).as_numpy("OUTPUT0").tolist() == [[2.0] * 4]
    one = grpc_client.infer("versioned", [tensor], model_version="1")
    assert one.as_numpy("OUTPUT0").tolist() == [[1.0] * 4]
    assert one.get_response().model_version == "1"
    err = _error(grpc_client, "versioned", [tensor], model_version="3")
    assert err.status() == "StatusCode.NOT_FOUND"
    assert err.message() == "Request for unknown model: 'versioned' version 3 is not found"


def test_nobatch_model(grpc_client) -> None:
    tensor = grpcclient.InferInput("INPUT0", [5], "FP32")
    tensor.set_data_from_numpy(np.arange(5, dtype=np.float32))
    assert grpc_client.infer("nobatch", [tensor]).as_numpy("OUTPUT0").tolist() == [0, 2, 4, 6, 8]


def test_request_id_and_custom_parameters_reach_the_model(grpc_client) -> None:
    tensor = grpcclient.InferInput("IN", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[1.5]], np.float32))
    result = grpc_client.infer(
        "slow",
        [tensor],
        request_id="r-42",
        priority=1,
        timeout=5_000_000,
        sequence_id="corr-7",
        sequence_start=True,
        parameters={"s": "text", "i": -3, "b": True, "f": 0.5},
    )
    assert result.get_response().id == "r-42"
    assert result.as_numpy("OUT").tolist() == [[1.5]]
    assert result.as_numpy("REQUEST_ID").tolist() == [[b"r-42"]]
    params = json.loads(result.as_numpy("PARAMS")[0, 0])
    assert {k: params[k] for k in ("s", "i", "b", "f")} == {
        "s": "text",
        "i": -3,
        "b": True,
        "f": 0.5,
    }


def test_async_infer(grpc_client) -> None:
    results: queue.Queue = queue.Queue()
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    for k in range(4):
        grpc_client.async_infer(
            "add_sub",
            _add_sub_inputs(a + k, a),
            callback=lambda result, error, k=k: results.put((k, result, error)),
            request_id=f"async-{k}",
        )
    seen = {}
    for _ in range(4):
        k, result, error = results.get(timeout=30)
        assert error is None
        seen[k] = result
    for k, result in seen.items():
        assert result.get_response().id == f"async-{k}"
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2 + k)
    bad = queue.Queue()
    grpc_client.async_infer(
        "nope", _add_sub_inputs(a, a), callback=lambda result, error: bad.put((result, error))
    )
    result, error = bad.get(timeout=30)
    assert result is None
    assert error.status() == "StatusCode.NOT_FOUND"


def test_digits_predictions_match_in_process(grpc_client, model_repository, examples) -> None:
    import onnxruntime as ort

    images, _ = examples.digits_test_split()
    images = images[:256]
    session = ort.InferenceSession(
        str(model_repository / "digits/1/model.onnx"), providers=["CPUExecutionProvider"]
    )
    expected = session.run(["label"], {"input": images})[0]
    got = []
    for start in range(0, len(images), 64):
        batch = images[start : start + 64]
        tensor = grpcclient.InferInput("input", list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch)
        result = grpc_client.infer(
            "digits", [tensor], outputs=[grpcclient.InferRequestedOutput("label")]
        )
        got.extend(result.as_numpy("label").ravel().tolist())
    assert got == expected.tolist()


# ---------------------------------------------------------------- typed contents (raw stub)


@pytest.fixture
def stub(server):
    channel = grpc.insecure_channel(server.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def _typed_request(
    model: str, **inputs: tuple[str, list[int], dict]
) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, (datatype, shape, contents) in inputs.items():
        tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
        for field, values in contents.items():
            getattr(tensor.contents, field).extend(values)
    return request


def test_typed_contents_fp32(stub) -> None:
    a = [float(i) / 4 for i in range(32)]
    request = _typed_request(
        "add_sub",
        INPUT0=("FP32", [2, 16], {"fp32_contents": a}),
        INPUT1=("FP32", [2, 16], {"fp32_contents": [1.0] * 32}),
    )
    request.id = "typed-1"
    response = stub.ModelInfer(request, timeout=30)
    assert response.id == "typed-1"
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert [list(o.shape) for o in response.outputs] == [[2, 16], [2, 16]]
    assert len(response.raw_output_contents) == 2
    assert not response.outputs[0].HasField("contents")
    assert np.frombuffer(response.raw_output_contents[0], "<f4").tolist() == [x + 1 for x in a]
    assert np.frombuffer(response.raw_output_contents[1], "<f4").tolist() == [x - 1 for x in a]


def test_typed_contents_bytes_length_prefixed(stub) -> None:
    request = _typed_request(
        "uppercase", INPUT0=("BYTES", [2, 1], {"bytes_contents": [b"abc", b"xyZ"]})
    )
    response = stub.ModelInfer(request, timeout=30)
    assert response.outputs[0].datatype == "BYTES"
    assert response.raw_output_contents[0] == b"\x03\0\0\0ABC\x03\0\0\0XYZ"


def test_typed_contents_int32_narrow_model(stub) -> None:
    request = _typed_request("raiser", X=("INT32", [3, 1], {"int_contents": [7, 0, 2**31 - 1]}))
    response = stub.ModelInfer(request, timeout=30)
    assert np.frombuffer(response.raw_output_contents[0], "<i4").tolist() == [7, 0, 2**31 - 1]


def test_typed_contents_fp16_refused(stub) -> None:
    request = _typed_request("identity_types", IN_FP16=("FP16", [1, 4], {"fp32_contents": [1] * 4}))
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "input 'IN_FP16' of model 'identity_types': FP16 data cannot be sent in typed "
        "'contents'; use raw_input_contents"
    )


def test_raw_and_typed_contents_together_refused(stub) -> None:
    request = _typed_request(
        "add_sub",
        INPUT0=("FP32", [1, 16], {"fp32_contents": [0.0] * 16}),
        INPUT1=("FP32", [1, 16], {}),
    )
    request.raw_input_contents.append(b"\0" * 64)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' "
        "for model 'add_sub'"
    )


def test_typed_no_data_at_all(stub) -> None:
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "unable to find data for input tensor 'INPUT0' for model 'add_sub' in request."
    )


def test_raw_contents_count_mismatch(stub) -> None:
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    request.inputs.add(name="INPUT1", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.extend([b"\0" * 64, b"\0" * 64, b"\0" * 64])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "unexpected additional input data for model 'add_sub'"


def test_reserved_and_mistyped_parameters(stub) -> None:
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        request.raw_input_contents.append(b"\0" * 64)
    cases = [
        (
            "triton_x",
            "bool_param",
            True,
            "invalid parameter 'triton_x' for model 'add_sub': "
            "parameter keys starting with 'triton_' are reserved for Triton usage and should not "
            "be specified",
        ),
        (
            "sequence_start",
            "int64_param",
            1,
            "invalid value for parameter 'sequence_start' in "
            "request for model 'add_sub': expected a boolean, got integer",
        ),
        (
            "priority",
            "int64_param",
            -1,
            "invalid value for parameter 'priority' in request for "
            "model 'add_sub': expected an unsigned integer, got negative integer",
        ),
        (
            "timeout",
            "uint64_param",
            5,
            "invalid value for parameter 'timeout' in request for "
            "model 'add_sub': expected an unsigned integer, got uint64",
        ),
        (
            "custom",
            "uint64_param",
            5,
            "invalid value for parameter 'custom' in request for "
            "model 'add_sub': expected a string, integer, boolean or number, got uint64",
        ),
    ]
    for key, field, value, message in cases:
        bad = service_pb2.ModelInferRequest()
        bad.CopyFrom(request)
        setattr(bad.parameters[key], field, value)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(bad, timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, key
        assert info.value.details() == message
    ok = service_pb2.ModelInferRequest()
    ok.CopyFrom(request)
    ok.parameters["triton_enable_empty_final_response"].bool_param = True
    ok.parameters["priority"].uint64_param = 1
    assert len(stub.ModelInfer(ok, timeout=30).raw_output_contents) == 2


def test_classification(grpc_client, stub) -> None:
    a = np.array([[0.0, 3.0, 1.0, 2.0] * 4], np.float32)
    result = grpc_client.infer(
        "add_sub",
        _add_sub_inputs(a, np.zeros_like(a)),
        outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)],
    )
    http_style = result.as_numpy("OUTPUT0")
    assert http_style.shape == (1, 2)
    assert http_style[0, 0].decode().startswith("3.0")
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        request.raw_input_contents.append(b"\0" * 64)
    request.outputs.add(name="OUTPUT0").parameters["classification"].int64_param = -2
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("Unable to parse 'classification' for output 'OUTPUT0'")


# ------------------------------------------------------------------------- errors


def _error(grpc_client, model: str, inputs: list, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer(model, inputs, **kwargs)
    return info.value


def test_error_unknown_model(grpc_client) -> None:
    a = np.ones((1, 16), np.float32)
    err = _error(grpc_client, "nope", _add_sub_inputs(a, a))
    assert err.status() == "StatusCode.NOT_FOUND"
    assert err.message() == "Request for unknown model: 'nope' is not found"


def test_error_wrong_input_name(grpc_client) -> None:
    a = np.ones((1, 16), np.float32)
    wrong = grpcclient.InferInput("INPUTX", [1, 16], "FP32")
    wrong.set_data_from_numpy(a)
    err = _error(grpc_client, "add_sub", [_add_sub_inputs(a, a)[0], wrong])
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message() == "unexpected inference input 'INPUTX' for model 'add_sub'"


def test_error_missing_input(grpc_client) -> None:
    a = np.ones((1, 16), np.float32)
    err = _error(grpc_client, "add_sub", _add_sub_inputs(a, a)[:1])
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message() == (  # Triton L0_input_validation's text
        "expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], "
        "but missing required input(s) ['INPUT1']. Please provide all required input(s)."
    )


def test_error_wrong_datatype(grpc_client) -> None:
    a = np.ones((1, 16), np.float64)
    inputs = [grpcclient.InferInput(n, [1, 16], "FP64") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    err = _error(grpc_client, "add_sub", inputs)
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message() == (
        "inference input 'INPUT0' data-type is 'FP64', but model 'add_sub' expects 'FP32'"
    )


def test_error_wrong_shape(grpc_client) -> None:
    a = np.ones((1, 15), np.float32)
    err = _error(grpc_client, "add_sub", _add_sub_inputs(a, a))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message() == (
        "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,16], got [1,15]"
    )


def test_error_empty_batch(grpc_client) -> None:
    """A batch of zero samples is refused, as Triton core's InferenceRequest::Normalize."""
    a = np.ones((0, 16), np.float32)
    err = _error(grpc_client, "add_sub", _add_sub_inputs(a, a))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message() == "inference request batch-size must be >= 1 for 'add_sub'"


def test_error_batch_too_large(grpc_client) -> None:
    a = np.ones((9, 16), np.float32)
    err = _error(grpc_client, "add_sub", _add_sub_inputs(a, a))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message() == "inference request batch-size must be <= 8 for 'add_sub'"


def test_error_unknown_output(grpc_client) -> None:
    a = np.ones((1, 16), np.float32)
    err = _error(
        grpc_client,
        "add_sub",
        _add_sub_inputs(a, a),
        outputs=[grpcclient.InferRequestedOutput("NOPE")],
    )
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message() == "unexpected inference output 'NOPE' for model 'add_sub'"


def _raw_add_sub_error(stub, input0_shape: list[int], input0_bytes: int) -> grpc.RpcError:
    """The error of an add_sub request with raw contents (INPUT1 is a valid [1, 16])."""
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=input0_shape)
    request.inputs.add(name="INPUT1", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.extend([b"\0" * input0_bytes, b"\0" * 64])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    return info.value


def test_error_byte_size_mismatch(stub) -> None:
    error = _raw_add_sub_error(stub, [1, 16], 60)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected 64, got 60"
    )


def test_error_negative_dimension_names_its_input(stub) -> None:
    """A shape below zero is refused for the tensor that has it, with the HTTP text."""
    error = _raw_add_sub_error(stub, [-1, 16], 64)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "Unable to parse 'shape' for input 'INPUT0' of model 'add_sub': "
        "expected an array of non-negative integers"
    )


def test_error_model_returns_error(grpc_client) -> None:
    tensor = grpcclient.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[-1]], np.int32))
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("raiser", [tensor])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "negative input" in info.value.message()


def test_unparseable_request_is_internal(server, grpc_client) -> None:
    """Bytes that are not a ModelInferRequest: INTERNAL naming the message, as gRPC C++;
    a stream ends the same way; the server keeps serving."""
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        unary = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        with pytest.raises(grpc.RpcError) as info:
            unary(b"\xff\xff\xff\xff", timeout=30)
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert info.value.details().startswith("failed to parse the ModelInferRequest message: "), (
            info.value.details()
        )
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        with pytest.raises(grpc.RpcError) as info:
            list(stream(iter([b"\xff\xff\xff\xff"]), timeout=30))
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert "failed to parse the ModelInferRequest message" in info.value.details()
    finally:
        channel.close()
    test_add_sub_exact(grpc_client)


def test_server_still_serving_after_errors(grpc_client) -> None:
    a = np.ones((1, 15), np.float32)
    for _ in range(3):
        _error(grpc_client, "add_sub", _add_sub_inputs(a, a))
    assert grpc_client.is_server_ready()
    test_add_sub_exact(grpc_client)


def _gateway_rss_mb(server) -> float:
    from pathlib import Path

    from e2e_support import children_of

    for pid in children_of(server.process.pid):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"sluice.api.gateway" in cmdline:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    raise AssertionError("no gateway process")


def test_refused_large_requests_leave_no_memory_behind(server, grpc_client) -> None:
    """A refused request's tensors are freed with it. The AbortError grpc keeps on the
    call's state sits in a reference cycle with the aborting frame, and through it the
    request and the handler's frames: unless that cycle is broken, each refused request
    keeps about 1.5 times its size until the next garbage collection."""
    before = _gateway_rss_mb(server)
    data = np.ones((1, 12 * 1024 * 1024), np.float32)  # 48 MiB, a shape add_sub refuses
    for _ in range(5):
        err = _error(grpc_client, "add_sub", _add_sub_inputs(data, data))
        assert err.status() == "StatusCode.INVALID_ARGUMENT"
        assert "unexpected shape for input 'INPUT0' for model 'add_sub'" in err.message()
    grown = _gateway_rss_mb(server) - before
    assert grown < 300, f"the gateway kept {grown:.0f} MB after five refused 96 MiB requests"
