"""Every non-inference RPC with tritonclient.grpc, and the shared HTTP logging route."""

from __future__ import annotations

import pytest
import requests
from e2e_support import grpc_health_status
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from sluice.api.cuda_shared_memory import cuda_runtime

pytestmark = pytest.mark.e2e

#: the no-GPU answers; with a CUDA device, tests/e2e/test_cuda_shared_memory.py instead.
WITHOUT_CUDA = pytest.mark.skipif(cuda_runtime() is not None, reason="a CUDA device is seen")


def _raises(call, *args, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)
    return info.value


def test_health(grpc_client, server) -> None:
    assert grpc_client.is_server_live() is True
    assert grpc_client.is_server_ready() is True
    # Triton also serves the standard grpc.health.v1 service (Kubernetes gRPC probes)
    assert grpc_health_status(server.grpc_url) == "SERVING"
    assert grpc_client.is_model_ready("add_sub") is True
    assert grpc_client.is_model_ready("versioned", "1") is True
    # Triton 2.51 answers an unknown model or version "not ready", not an error
    assert grpc_client.is_model_ready("versioned", "3") is False  # not in the version policy
    assert grpc_client.is_model_ready("nope") is False
    assert grpc_client.is_model_ready("add_sub", "9") is False
    err = _raises(grpc_client.is_model_ready, "add_sub", "x")
    assert err.status() == "StatusCode.INVALID_ARGUMENT"


def test_server_metadata_matches_http(grpc_client, server) -> None:
    meta = grpc_client.get_server_metadata(as_json=True)
    http = requests.get(f"{server.base}/v2", timeout=10).json()
    assert meta == http
    assert meta["name"] == "triton"
    assert "logging" in meta["extensions"]


def test_model_metadata(grpc_client, server) -> None:
    meta = grpc_client.get_model_metadata("add_sub", as_json=True)
    assert meta == {
        "name": "add_sub",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "16"]},
            {"name": "INPUT1", "datatype": "FP32", "shape": ["-1", "16"]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": ["-1", "16"]},
            {"name": "OUTPUT1", "datatype": "FP32", "shape": ["-1", "16"]},
        ],
    }
    assert grpc_client.get_model_metadata("versioned", "1").versions == ["1"]
    assert list(grpc_client.get_model_metadata("versioned").versions) == ["1", "2"]
    err = _raises(grpc_client.get_model_metadata, "nope")
    assert err.status() == "StatusCode.NOT_FOUND"
    err = _raises(grpc_client.get_model_metadata, "add_sub", "x")
    assert err.status() == "StatusCode.INVALID_ARGUMENT"


def test_model_config_is_the_completed_config(grpc_client, server) -> None:
    config = grpc_client.get_model_config("auto_onnx").config
    assert config.name == "auto_onnx"
    assert [i.name for i in config.input] == ["A", "B"]
    assert list(config.input[0].dims) == [16]
    http = requests.get(f"{server.base}/v2/models/add_sub/config", timeout=10).json()
    grpc_json = json_format.MessageToDict(
        grpc_client.get_model_config("add_sub").config, preserving_proto_field_name=True
    )
    assert grpc_json["name"] == http["name"] == "add_sub"
    assert grpc_json["max_batch_size"] == http["max_batch_size"] == 8
    err = _raises(grpc_client.get_model_config, "nope")
    assert err.status() == "StatusCode.NOT_FOUND"


def test_repository_index_and_control(grpc_client, server) -> None:
    index = grpc_client.get_model_repository_index(as_json=True)["models"]
    http = requests.post(f"{server.base}/v2/repository/index", timeout=10).json()
    assert index == http
    by_name = {(m["name"], m.get("version")): m for m in index}
    assert by_name[("add_sub", "1")]["state"] == "READY"
    err = _raises(grpc_client.load_model, "add_sub")
    assert err.status() == "StatusCode.UNAVAILABLE"
    assert err.message() == "explicit model load / unload is not allowed if polling is enabled"
    err = _raises(grpc_client.unload_model, "add_sub")
    assert err.status() == "StatusCode.UNAVAILABLE"
    assert grpc_client.is_model_ready("add_sub")  # did nothing


def test_statistics(grpc_client, server) -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient

    a = np.ones((2, 16), np.float32)
    inputs = [grpcclient.InferInput(n, [2, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    before = grpc_client.get_inference_statistics("add_sub").model_stats[0]
    grpc_client.infer("add_sub", inputs)
    after = grpc_client.get_inference_statistics("add_sub").model_stats[0]
    assert (after.name, after.version) == ("add_sub", "1")
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1
    assert after.inference_count == before.inference_count + 2
    http = requests.get(f"{server.base}/v2/models/add_sub/stats", timeout=10).json()
    assert http["model_stats"][0]["inference_count"] >= after.inference_count
    everything = grpc_client.get_inference_statistics()
    assert {"add_sub", "digits"} <= {s.name for s in everything.model_stats}
    err = _raises(grpc_client.get_inference_statistics, "nope")
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message() == "requested model 'nope' is not available"


@WITHOUT_CUDA
def test_cuda_shared_memory_refused_as_without_gpus(grpc_client) -> None:
    """CUDA shared memory is answered as a Triton built without GPU support answers it
    (system shared memory: tests/e2e/test_shared_memory.py)."""
    assert grpc_client.get_cuda_shared_memory_status(as_json=True) == {}
    grpc_client.unregister_cuda_shared_memory()
    err = _raises(grpc_client.register_cuda_shared_memory, "r", b"\0" * 64, 0, 64)
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message() == "failed to register CUDA shared memory region: 'r', GPUs not supported"
    err = _raises(grpc_client.get_cuda_shared_memory_status, "r")
    assert err.status() == "StatusCode.NOT_FOUND"


@WITHOUT_CUDA
def test_cuda_shared_memory_answered_alike_over_http(server) -> None:
    """The HTTP endpoints answer as the gRPC ones: empty status, unregister succeeds,
    register refused (400, the same text)."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert client.get_cuda_shared_memory_status() == []
        client.unregister_cuda_shared_memory()
        client.unregister_cuda_shared_memory("r")
        err = _raises(client.register_cuda_shared_memory, "r", b"\0" * 64, 0, 64)
        assert err.status() == "400"
        assert err.message() == (
            "failed to register CUDA shared memory region: 'r', GPUs not supported"
        )
        err = _raises(client.get_cuda_shared_memory_status, "r")
        assert (err.status(), err.message()) == (
            "404",
            "Unable to find cuda shared memory region: 'r'",
        )
    finally:
        client.close()


def test_log_settings_shared_by_grpc_and_http(grpc_client, server) -> None:
    defaults = {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "default",
    }
    url = f"{server.base}/v2/logging"
    assert requests.get(url, timeout=10).json() == defaults
    got = grpc_client.get_log_settings(as_json=True)["settings"]
    assert {k: next(iter(v.values())) for k, v in got.items()} == defaults
    try:
        updated = grpc_client.update_log_settings(
            {"log_verbose_level": 1, "log_format": "ISO8601"}, as_json=True
        )["settings"]
        assert updated["log_verbose_level"] == {"uint32_param": 1}
        assert updated["log_format"] == {"string_param": "ISO8601"}
        assert requests.get(url, timeout=10).json()["log_verbose_level"] == 1
        response = requests.post(url, json={"log_info": False}, timeout=10)
        assert response.status_code == 200
        assert response.json()["log_info"] is False
        assert grpc_client.get_log_settings().settings["log_info"].bool_param is False
        bad = requests.post(url, json={"log_info": 1}, timeout=10)
        assert bad.status_code == 400
        assert bad.json() == {
            "error": "invalid value for logging setting 'log_info': expected a boolean, got integer"
        }
        err = _raises(grpc_client.update_log_settings, {"log_file": "/tmp/x"})
        assert err.status() == "StatusCode.UNIMPLEMENTED"
        response = requests.post(url, json={"log_file": "/tmp/x"}, timeout=10)
        assert response.status_code == 501
    finally:
        restore = {k: v for k, v in defaults.items() if k != "log_file"}
        assert requests.post(url, json=restore, timeout=10).json() == defaults
