"""Triton Python-backend models (tests/assets/python_models) through the unmodified tritonclient.

Each model is written only against Triton's ``triton_python_backend_utils`` API.
Every test runs over HTTP and gRPC (the ``client`` fixture). Batched ``execute``
calls under the dynamic batcher (``add``'s ``EXEC_SIZE`` output) are covered by
``test_batching.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

#: (tritonclient module, status of INVALID_ARG, status of INTERNAL) per protocol.
PROTOCOLS = {
    "http": (httpclient, "400", "500"),
    "grpc": (grpcclient, "StatusCode.INVALID_ARGUMENT", "StatusCode.INTERNAL"),
}


@pytest.fixture(params=sorted(PROTOCOLS))
def client(request: pytest.FixtureRequest, server: Any) -> Iterator[tuple[Any, ModuleType, str]]:
    """(client, its tritonclient module, protocol name) for HTTP and for gRPC."""
    protocol = request.param
    module = PROTOCOLS[protocol][0]
    url = server.http_url if protocol == "http" else server.grpc_url
    instance = module.InferenceServerClient(url)
    yield instance, module, protocol
    instance.close()


def _input(module: ModuleType, name: str, array: np.ndarray, datatype: str) -> Any:
    tensor = module.InferInput(name, list(array.shape), datatype)
    if module is httpclient:
        tensor.set_data_from_numpy(array, binary_data=True)
    else:
        tensor.set_data_from_numpy(array)
    return tensor


def _bytes(items: list[list[bytes]]) -> np.ndarray:
    array = np.empty((len(items), len(items[0])), dtype=object)
    for i, row in enumerate(items):
        for j, item in enumerate(row):
            array[i, j] = item
    return array


def test_uppercase_bytes_with_empty_and_non_utf8(client: tuple[Any, ModuleType, str]) -> None:
    instance, module, _ = client
    data = _bytes([[b"hello", b"", b"\xff\xfeq\x00z"], [b"MiXeD 1", b"\x80", b"ok"]])
    result = instance.infer("uppercase", [_input(module, "INPUT0", data, "BYTES")])
    got = result.as_numpy("OUTPUT0")
    assert got.shape == (2, 3)
    assert got.tolist() == [[b"HELLO", b"", b"\xff\xfeQ\x00Z"], [b"MIXED 1", b"\x80", b"OK"]]


def test_uppercase_json_http(http_client: httpclient.InferenceServerClient) -> None:
    data = _bytes([["grüße".encode(), b""]])
    tensor = httpclient.InferInput("INPUT0", [1, 2], "BYTES")
    tensor.set_data_from_numpy(data, binary_data=False)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    result = http_client.infer("uppercase", [tensor], outputs=[output])
    assert result.get_response()["outputs"][0]["data"] == ["GRüßE", ""]


def test_add_exact(client: tuple[Any, ModuleType, str]) -> None:
    instance, module, _ = client
    a = np.array([[1.25, -2.5, 3.0, 1e-7], [0.0, 7.5, -0.125, 1e30]], np.float32)
    b = np.array([[0.75, 2.5, -3.0, 2e-7], [-1.0, 0.5, 0.125, 1e30]], np.float32)
    result = instance.infer("add", [_input(module, "A", a, "FP32"), _input(module, "B", b, "FP32")])
    assert result.as_numpy("SUM").dtype == np.float32
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
    assert result.as_numpy("EXEC_SIZE").shape == (2, 1)


def test_raiser_values_pass(client: tuple[Any, ModuleType, str]) -> None:
    instance, module, _ = client
    x = np.array([[5], [0], [2**31 - 1]], np.int32)
    assert instance.infer("raiser", [_input(module, "X", x, "INT32")]).as_numpy("Y").tolist() == [
        [5],
        [0],
        [2**31 - 1],
    ]


def test_raiser_error_response_is_invalid_arg(client: tuple[Any, ModuleType, str]) -> None:
    instance, module, protocol = client
    x = np.array([[-1]], np.int32)
    with pytest.raises(InferenceServerException) as info:
        instance.infer("raiser", [_input(module, "X", x, "INT32")])
    assert info.value.status() == PROTOCOLS[protocol][1]
    assert info.value.message() == "negative input"


def test_outputs_not_asked_for_are_dropped_as_triton_does(
    client: tuple[Any, ModuleType, str],
) -> None:
    """python_backend prunes a response to the requested outputs before Triton core sees
    it: an output the config does not declare is dropped, not an error, and a response
    with no output is a success without outputs."""
    instance, module, _ = client
    for value in (4077, 4088):  # WRONG only / no output at all
        x = np.array([[value]], np.int32)
        result = instance.infer("raiser", [_input(module, "X", x, "INT32")])
        assert result.as_numpy("Y") is None
        assert result.as_numpy("WRONG") is None
    good = instance.infer("raiser", [_input(module, "X", np.array([[5]], np.int32), "INT32")])
    assert good.as_numpy("Y").tolist() == [[5]]


def test_raiser_exception_is_internal(client: tuple[Any, ModuleType, str]) -> None:
    instance, module, protocol = client
    x = np.array([[13]], np.int32)
    with pytest.raises(InferenceServerException) as info:
        instance.infer("raiser", [_input(module, "X", x, "INT32")])
    assert info.value.status() == PROTOCOLS[protocol][2]
    assert info.value.message() == (
        "Failed to process the request(s) for model instance 'raiser_0_0', "
        "message: unlucky number 13"
    )
    # The worker survived: the next request is served.
    ok = np.array([[3]], np.int32)
    assert instance.infer("raiser", [_input(module, "X", ok, "INT32")]).as_numpy("Y").tolist() == [
        [3]
    ]


def test_autocomplete_config_and_infer(client: tuple[Any, ModuleType, str]) -> None:
    instance, module, protocol = client
    if protocol == "http":
        config = instance.get_model_config("autocomplete")
    else:
        config = instance.get_model_config("autocomplete", as_json=True)["config"]
    assert config["max_batch_size"] == 4
    assert config["backend"] == "python"
    assert [(i["name"], i["data_type"], [int(d) for d in i["dims"]]) for i in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [2])
    ]
    assert [(o["name"], o["data_type"], [int(d) for d in o["dims"]]) for o in config["output"]] == [
        ("OUTPUT0", "TYPE_FP32", [2])
    ]
    assert "dynamic_batching" in config
    x = np.array([[1.5, -4.0], [0.25, 8.0]], np.float32)
    result = instance.infer("autocomplete", [_input(module, "INPUT0", x, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * 2)


def test_slow_gets_custom_parameters_and_request_id(client: tuple[Any, ModuleType, str]) -> None:
    instance, module, _ = client
    x = np.array([[1.5], [-2.0]], np.float32)
    result = instance.infer(
        "slow",
        [_input(module, "IN", x, "FP32")],
        request_id="py-req-9",
        priority=1,
        parameters={"sleep_ms": 1, "label": "abc", "flag": True, "n": -4},
    )
    assert result.as_numpy("OUT").tolist() == [[1.5], [-2.0]]
    assert result.as_numpy("REQUEST_ID").tolist() == [[b"py-req-9"], [b"py-req-9"]]
    # Only the custom parameters reach parameters(); priority is Triton's own.
    params = json.loads(result.as_numpy("PARAMS")[0, 0])
    assert params == {"sleep_ms": 1, "label": "abc", "flag": True, "n": -4}


def test_identity_optional_inputs(client: tuple[Any, ModuleType, str]) -> None:
    instance, module, _ = client
    ints = np.array([-3, 0, 32767], np.int16)
    texts = np.array([b"a", b"", b"\xfe"], dtype=object)
    halves = np.array([0.5, -1.0], np.float16)
    inputs = [
        _input(module, "IN_INT16", ints, "INT16"),
        _input(module, "IN_BYTES", texts, "BYTES"),
        _input(module, "IN_FP16", halves, "FP16"),
    ]
    result = instance.infer("identity_bytes_all", inputs)
    response = result.get_response()
    outputs = (
        response["outputs"]
        if isinstance(response, dict)
        else [{"name": o.name} for o in response.outputs]
    )
    assert sorted(o["name"] for o in outputs) == ["OUT_BYTES", "OUT_FP16", "OUT_INT16"]
    assert result.as_numpy("OUT_INT16").dtype == np.int16
    assert result.as_numpy("OUT_INT16").tolist() == [-3, 0, 32767]
    assert result.as_numpy("OUT_BYTES").tolist() == [b"a", b"", b"\xfe"]
    assert result.as_numpy("OUT_FP16").tolist() == [0.5, -1.0]
    only_bool = instance.infer(
        "identity_bytes_all", [_input(module, "IN_BOOL", np.array([True, False]), "BOOL")]
    )
    assert only_bool.as_numpy("OUT_BOOL").tolist() == [True, False]
    assert only_bool.as_numpy("OUT_INT16") is None
    # a requested output the model did not produce is absent, not an error (Triton)
    asked = [module.InferRequestedOutput("OUT_INT16"), module.InferRequestedOutput("OUT_BOOL")]
    partial = instance.infer(
        "identity_bytes_all",
        [_input(module, "IN_BOOL", np.array([True, False]), "BOOL")],
        outputs=asked,
    )
    assert partial.as_numpy("OUT_BOOL").tolist() == [True, False]
    assert partial.as_numpy("OUT_INT16") is None


def test_bf16_through_dlpack_as_triton(client: tuple[Any, ModuleType, str]) -> None:
    """A BF16 input reaches the model; ``as_numpy`` refuses it with Triton's text, and
    ``to_dlpack``/``from_dlpack`` carry it to torch and back as BF16 (Triton's
    python_backend BF16 example)."""
    pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    instance, module, _ = client
    data = np.array([[1.5, -2.0, 3.0], [0.25, 100.0, -0.5]], dtype=ml_dtypes.bfloat16)
    result = instance.infer("bf16_double", [_input(module, "INPUT0", data, "BF16")])
    doubled = result.as_numpy("OUTPUT0")
    assert doubled.dtype == ml_dtypes.bfloat16
    assert doubled.astype(np.float32).tolist() == [[3.0, -4.0, 6.0], [0.5, 200.0, -1.0]]
    errors = result.as_numpy("AS_NUMPY_ERROR")
    assert errors.shape == (2, 1)
    assert b"tensor dtype is bf16 and cannot be converted to numpy" in errors[0, 0].lower()
