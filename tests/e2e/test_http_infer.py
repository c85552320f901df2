"""Inference over HTTP with the unmodified tritonclient.http: binary and JSON tensors, errors."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
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


def _add_sub_inputs(a: np.ndarray, b: np.ndarray, binary: bool = True) -> list:
    inputs = [
        httpclient.InferInput("INPUT0", list(a.shape), "FP32"),
        httpclient.InferInput("INPUT1", list(b.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_add_sub_exact(http_client, binary: bool) -> None:
    a = np.arange(48, dtype=np.float32).reshape(3, 16) / 7
    b = np.full((3, 16), 0.25, dtype=np.float32)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    result = http_client.infer("add_sub", _add_sub_inputs(a, b, binary), outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response()["model_version"] == "1"


def test_no_outputs_listed_returns_all(http_client) -> None:
    a = np.ones((1, 16), np.float32)
    result = http_client.infer("add_sub", _add_sub_inputs(a, a))
    names = [o["name"] for o in result.get_response()["outputs"]]
    assert names == ["OUTPUT0", "OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 16), np.float32))


def test_requested_output_subset_and_mixed_encoding(http_client) -> None:
    a = np.ones((2, 16), np.float32)
    outputs = [httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    result = http_client.infer("add_sub", _add_sub_inputs(a, a * 3), outputs=outputs)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.full((2, 16), -2, np.float32))
    mixed = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    result = http_client.infer("add_sub", _add_sub_inputs(a, a * 3), outputs=mixed)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((2, 16), 4, np.float32))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.full((2, 16), -2, np.float32))


def _types_inputs(binary: bool) -> tuple[list, dict[str, np.ndarray]]:
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
    data["BYTES"] = np.array([["héllo", "", "x" * 300], ["a", "b", "ünïcode"]], dtype=object)
    data["BYTES"] = np.vectorize(lambda s: s.encode("utf-8"), otypes=[object])(data["BYTES"])
    inputs = []
    for name, array in data.items():
        tensor = httpclient.InferInput(f"IN_{name}", list(array.shape), name)
        tensor.set_data_from_numpy(array, binary_data=binary or name == "FP16")
        inputs.append(tensor)
    return inputs, data


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_datatype_round_trips(http_client, binary: bool) -> None:
    inputs, data = _types_inputs(binary)
    outputs = [
        httpclient.InferRequestedOutput(f"OUT_{n}", binary_data=binary or n == "FP16") for n in data
    ]
    result = http_client.infer("identity_types", inputs, outputs=outputs)
    for name, array in data.items():
        got = result.as_numpy(f"OUT_{name}")
        if name == "BYTES":
            expected = (
                array if binary else np.vectorize(lambda b: b.decode(), otypes=[object])(array)
            )
            assert got.tolist() == expected.tolist()
        else:
            assert got.dtype == array.dtype, name
            np.testing.assert_array_equal(got, array, err_msg=name)


def test_non_finite_floats_round_trip_as_json(http_client) -> None:
    # tritonclient writes NaN / Infinity / -Infinity in JSON and reads them back; Triton's
    # parser and writer take and give them (rapidjson's NaN-and-Inf flags)
    special = np.array([[np.nan, np.inf, -np.inf, 1.5], [-0.0, 3.0e38, -1e-45, 2.0]])
    inputs, data = _types_inputs(binary=False)
    for tensor in inputs:
        name = tensor.name().removeprefix("IN_")
        if name in ("FP32", "FP64"):
            data[name] = special.astype(TYPES[name])
            tensor.set_data_from_numpy(data[name], binary_data=False)
    outputs = [
        httpclient.InferRequestedOutput(f"OUT_{n}", binary_data=False) for n in ("FP32", "FP64")
    ]
    result = http_client.infer("identity_types", inputs, outputs=outputs)
    for name in ("FP32", "FP64"):
        got = result.as_numpy(f"OUT_{name}")
        assert got.dtype == data[name].dtype
        assert got.tobytes() == data[name].tobytes(), name


def test_fp16_json_rejected(http_client) -> None:
    inputs, _ = _types_inputs(True)
    outputs = [httpclient.InferRequestedOutput("OUT_FP16", binary_data=False)]
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("identity_types", inputs, outputs=outputs)
    assert info.value.status() == "400"
    assert "FP16" in info.value.message()


def test_versions(http_client) -> None:
    x = np.ones((1, 4), np.float32)
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(x)
    assert http_client.infer("versioned", [tensor]).as_numpy("OUTPUT0").tolist() == [[2.0] * 4]
    one = http_client.infer("versioned", [tensor], model_version="1")
    assert one.as_numpy("OUTPUT0").tolist() == [[1.0] * 4]
    assert one.get_response()["model_version"] == "1"
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("versioned", [tensor], model_version="3")
    assert info.value.status() == "404"
    assert "'versioned' version 3 is not found" in info.value.message()


def test_nobatch_model(http_client) -> None:
    tensor = httpclient.InferInput("INPUT0", [5], "FP32")
    tensor.set_data_from_numpy(np.arange(5, dtype=np.float32))
    result = http_client.infer("nobatch", [tensor])
    assert result.as_numpy("OUTPUT0").tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_request_id_echoed(http_client) -> None:
    a = np.ones((1, 16), np.float32)
    result = http_client.infer("add_sub", _add_sub_inputs(a, a), request_id="r-42")
    assert result.get_response()["id"] == "r-42"


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compression(http_client, algorithm: str) -> None:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    result = http_client.infer(
        "add_sub",
        _add_sub_inputs(a, a),
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


def test_digits_predictions_match_in_process(http_client, model_repository, examples) -> None:
    import onnxruntime as ort

    images, labels = examples.digits_test_split()
    session = ort.InferenceSession(
        str(model_repository / "digits/1/model.onnx"), providers=["CPUExecutionProvider"]
    )
    expected = session.run(["label"], {"input": images})[0]
    got = []
    for start in range(0, len(images), 64):
        batch = images[start : start + 64]
        tensor = httpclient.InferInput("input", list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch)
        result = http_client.infer(
            "digits", [tensor], outputs=[httpclient.InferRequestedOutput("label")]
        )
        assert result.as_numpy("label").shape == (len(batch), 1)
        got.extend(result.as_numpy("label").ravel().tolist())
    assert got == expected.tolist()
    assert np.mean(np.array(got) == labels) > 0.9


def test_raw_binary_request(server, http_client, examples) -> None:
    # Inference-Header-Content-Length: 0: the body is the only input's data, a batch of
    # 1 (docs/reference/http-protocol.md, raw binary requests); every output comes back in
    # binary
    image = examples.digits_test_split()[0][:1]
    response = requests.post(
        f"{server.base}/v2/models/digits/infer",
        data=image.tobytes(),
        headers={"Inference-Header-Content-Length": "0"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/octet-stream"
    raw = httpclient.InferResult.from_response_body(
        response.content,
        header_length=int(response.headers["Inference-Header-Content-Length"]),
    )
    tensor = httpclient.InferInput("input", [1, 64], "FP32")
    tensor.set_data_from_numpy(image)
    usual = http_client.infer("digits", [tensor])
    assert [o["name"] for o in raw.get_response()["outputs"]] == ["label", "probabilities"]
    for name in ("label", "probabilities"):
        assert raw.as_numpy(name).tobytes() == usual.as_numpy(name).tobytes()
        assert raw.as_numpy(name).shape == usual.as_numpy(name).shape


def test_raw_binary_request_needs_one_input(server) -> None:
    response = requests.post(
        f"{server.base}/v2/models/add_sub/infer",
        data=np.zeros(32, np.float32).tobytes(),
        headers={"Inference-Header-Content-Length": "0"},
        timeout=10,
    )
    assert response.status_code == 400
    assert response.json()["error"] == (
        "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in "
        "'add_sub' model configuration"
    )


def _error(http_client, model: str, inputs: list, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        http_client.infer(model, inputs, **kwargs)
    return info.value


def test_error_unknown_model(http_client) -> None:
    a = np.ones((1, 16), np.float32)
    err = _error(http_client, "nope", _add_sub_inputs(a, a))
    assert err.status() == "404"
    assert err.message() == "Request for unknown model: 'nope' is not found"


def test_error_wrong_input_name(http_client) -> None:
    a = np.ones((1, 16), np.float32)
    inputs = _add_sub_inputs(a, a)
    wrong = httpclient.InferInput("INPUTX", [1, 16], "FP32")
    wrong.set_data_from_numpy(a)
    err = _error(http_client, "add_sub", [inputs[0], wrong])
    assert err.status() == "400"
    assert "unexpected inference input 'INPUTX' for model 'add_sub'" in err.message()


def test_error_missing_input(http_client) -> None:
    a = np.ones((1, 16), np.float32)
    err = _error(http_client, "add_sub", _add_sub_inputs(a, a)[:1])
    assert err.status() == "400"
    assert err.message() == (  # Triton L0_input_validation's text
        "expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], "
        "but missing required input(s) ['INPUT1']. Please provide all required input(s)."
    )


def test_error_wrong_datatype(http_client) -> None:
    a = np.ones((1, 16), np.float64)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "FP64"),
        httpclient.InferInput("INPUT1", [1, 16], "FP64"),
    ]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    err = _error(http_client, "add_sub", inputs)
    assert err.status() == "400"
    assert err.message() == (
        "inference input 'INPUT0' data-type is 'FP64', but model 'add_sub' expects 'FP32'"
    )


def test_error_wrong_shape(http_client) -> None:
    a = np.ones((1, 15), np.float32)
    err = _error(http_client, "add_sub", _add_sub_inputs(a, a))
    assert err.status() == "400"
    assert err.message() == (
        "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,16], got [1,15]"
    )


def test_error_empty_batch(http_client) -> None:
    """A batch of zero samples is refused, as Triton core's InferenceRequest::Normalize."""
    a = np.ones((0, 16), np.float32)
    err = _error(http_client, "add_sub", _add_sub_inputs(a, a))
    assert err.status() == "400"
    assert err.message() == "inference request batch-size must be >= 1 for 'add_sub'"


def test_error_batch_too_large(http_client) -> None:
    a = np.ones((9, 16), np.float32)
    err = _error(http_client, "add_sub", _add_sub_inputs(a, a))
    assert err.status() == "400"
    assert err.message() == "inference request batch-size must be <= 8 for 'add_sub'"


def test_error_unknown_output(http_client) -> None:
    a = np.ones((1, 16), np.float32)
    err = _error(
        http_client,
        "add_sub",
        _add_sub_inputs(a, a),
        outputs=[httpclient.InferRequestedOutput("NOPE")],
    )
    assert err.status() == "400"
    assert "unexpected inference output 'NOPE' for model 'add_sub'" in err.message()


def _raw_infer(server, header: dict, binary: bytes = b"", **kwargs) -> requests.Response:
    body = json.dumps(header).encode()
    headers = {"Inference-Header-Content-Length": str(len(body))} if binary else {}
    return requests.post(
        f"{server.base}/v2/models/add_sub/infer",
        data=body + binary,
        headers=headers,
        timeout=10,
        **kwargs,
    )


def test_error_byte_size_mismatch(server) -> None:
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 16],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 60},
            },
            {
                "name": "INPUT1",
                "shape": [1, 16],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 64},
            },
        ]
    }
    response = _raw_infer(server, header, b"\0" * 124)
    assert response.status_code == 400
    assert response.json() == {
        "error": "input byte size mismatch for input 'INPUT0' for model "
        "'add_sub'. Expected 64, got 60"
    }


def test_error_binary_body_too_short(server) -> None:
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 16],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 64},
            },
            {
                "name": "INPUT1",
                "shape": [1, 16],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 64},
            },
        ]
    }
    response = _raw_infer(server, header, b"\0" * 100)
    assert response.status_code == 400
    assert "unexpected size for input 'INPUT1'" in response.json()["error"]


def test_error_negative_dimension_names_its_input(server) -> None:
    """The same text as gRPC's for a shape below zero."""
    header = {
        "inputs": [
            {"name": "INPUT0", "shape": [-1, 16], "datatype": "FP32", "data": [0.0] * 16},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16},
        ]
    }
    response = _raw_infer(server, header)
    assert response.status_code == 400
    assert response.json() == {
        "error": "Unable to parse 'shape' for input 'INPUT0' of model 'add_sub': "
        "expected an array of non-negative integers"
    }


def test_error_malformed_json(server) -> None:
    response = requests.post(
        f"{server.base}/v2/models/add_sub/infer", data=b"{not json", timeout=10
    )
    assert response.status_code == 400
    assert response.json()["error"].startswith("failed to parse the request JSON buffer")


@pytest.mark.parametrize("encoding", [None, "gzip"])
def test_error_json_nested_too_deep(server, encoding: str | None) -> None:
    # deeper than both JSON parsers go: Triton's parse error (400), not an internal error
    body = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":' + b"[" * 5000
    headers = {}
    if encoding:
        body, headers = gzip.compress(body), {"Content-Encoding": encoding}
    response = requests.post(
        f"{server.base}/v2/models/add_sub/infer", data=body, headers=headers, timeout=10
    )
    assert response.status_code == 400
    assert response.json()["error"] == (
        "failed to parse the request JSON buffer: Maximum parse recursion depth exceeded! at 1063"
    )


def test_error_oversized_body(server, http_client) -> None:
    response = requests.post(
        f"{server.base}/v2/models/add_sub/infer", data=b" " * (9 * 1024 * 1024), timeout=30
    )
    assert response.status_code == 413
    assert "exceeds the limit of 8388608 bytes (--http-max-input-size)" in response.json()["error"]
    test_add_sub_exact(http_client, True)  # still serving


def test_server_still_serving_after_errors(http_client) -> None:
    a = np.ones((1, 15), np.float32)
    for _ in range(3):
        _error(http_client, "add_sub", _add_sub_inputs(a, a))
    assert http_client.is_server_ready()
    test_add_sub_exact(http_client, False)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_classification(http_client, binary: bool) -> None:
    x = np.array([[0.5, 3.25, -1.0, 2.0], [4.0, 1.0, 1.5, 0.0]], np.float32)
    tensor = httpclient.InferInput("INPUT0", [2, 4], "FP32")
    tensor.set_data_from_numpy(x)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=2)
    result = http_client.infer("batch_scale", [tensor], outputs=[out])
    classes = result.as_numpy("OUTPUT0")
    assert classes.shape == (2, 2)
    expected = [["9.750000:1", "6.000000:3"], ["12.000000:0", "4.500000:2"]]
    got = [[c.decode() if isinstance(c, bytes) else c for c in row] for row in classes.tolist()]
    assert got == expected


def test_classification_of_bool_refused(http_client) -> None:
    inputs, _ = _types_inputs(True)
    outputs = [httpclient.InferRequestedOutput("OUT_BOOL", class_count=1)]
    err = _error(http_client, "identity_types", inputs, outputs=outputs)
    assert err.status() == "400"
    assert "class result not available for output 'OUT_BOOL'" in err.message()


def test_bytes_data_is_checked_in_every_request_of_a_kept_header(server) -> None:
    """A binary request's JSON header is parsed once and its checks are not repeated
    (api/http/header_cache.py), except where they read the data: a BYTES input whose
    element lengths do not fit its bytes is refused even after the same header passed."""
    from tritonclient.http._utils import _get_inference_request

    inputs, data = _types_inputs(binary=True)
    body, header_length = _get_inference_request(
        inputs=inputs, request_id="", outputs=None, sequence_id=0, sequence_start=False,
        sequence_end=False, priority=0, timeout=None, custom_parameters=None,
    )  # fmt: skip
    url = f"{server.base}/v2/models/identity_types/infer"
    headers = {"Inference-Header-Content-Length": str(header_length)}
    for _ in range(2):
        ok = requests.post(url, data=body, headers=headers, timeout=30)
        assert ok.status_code == 200, ok.text
    chunk = b"".join(len(item).to_bytes(4, "little") + item for item in data["BYTES"].ravel())
    assert body.endswith(chunk)
    bad = body[: -len(chunk)] + (10_000).to_bytes(4, "little") + chunk[4:]
    refused = requests.post(url, data=bad, headers=headers, timeout=30)
    assert refused.status_code == 400
    assert "input 'IN_BYTES' for model 'identity_types'" in refused.json()["error"]
    again = requests.post(url, data=body, headers=headers, timeout=30)
    assert again.status_code == 200
