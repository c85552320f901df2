"""TensorRT backend end to end.

Without TensorRT (or CUDA) a ``tensorrt_plan`` model is UNAVAILABLE with the
reason, while the server runs on (``--exit-on-error false``). With both, a
tiny engine is built here from an ONNX model and served (marker ``gpu``;
skipped cleanly on machines without ``tensorrt``).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from e2e_support import OPSET, Server, start_server, stop_server
from onnx import TensorProto, helper

pytestmark = pytest.mark.e2e

TRT_CONFIG = """
name: "{name}"
platform: "tensorrt_plan"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
{instances}
"""


def _settled_index(server: Server, timeout_s: float = 90.0) -> dict[str, dict[str, str]]:
    client = httpclient.InferenceServerClient(server.http_url)
    deadline = time.monotonic() + timeout_s
    index: list[dict[str, str]] = []
    try:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(f"sluice serve exited:\n{server.log()}")
            try:
                index = client.get_model_repository_index()
            except Exception:
                index = []
            if index and all(e.get("state") in ("READY", "UNAVAILABLE") for e in index):
                break
            time.sleep(0.2)
    finally:
        client.close()
    return {entry["name"]: entry for entry in index}


def _tensorrt_usable() -> bool:
    if importlib.util.find_spec("tensorrt") is None:
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.fixture
def unavailable_server(redis_url: str, tmp_path: Path) -> Iterator[Server]:
    repo = tmp_path / "models"
    (repo / "trt_model/1").mkdir(parents=True)
    (repo / "trt_model/1/model.plan").write_bytes(b"not a plan")
    (repo / "trt_model/config.pbtxt").write_text(TRT_CONFIG.format(name="trt_model", instances=""))
    server = start_server(
        repo, redis_url, tmp_path / "serve.log", "--exit-on-error", "false", wait_ready=False
    )
    yield server
    assert stop_server(server) == 0, server.log()


@pytest.mark.skipif(_tensorrt_usable(), reason="TensorRT and CUDA are available here")
def test_without_tensorrt_the_model_is_unavailable_with_the_reason(
    unavailable_server: Server,
) -> None:
    entry = _settled_index(unavailable_server)["trt_model"]
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"].startswith("TensorRT is not available on this machine: "), entry
    client = httpclient.InferenceServerClient(unavailable_server.http_url)
    assert client.is_server_live()
    assert not client.is_model_ready("trt_model")
    client.close()


def _onnx_affine(path: Path) -> None:
    """OUTPUT0 = INPUT0 * 2 + 1, INPUT0 FP32 [-1, 4]."""
    x = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["b", 4])
    y = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["b", 4])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["INPUT0", "two"], ["scaled"]),
            helper.make_node("Add", ["scaled", "one"], ["OUTPUT0"]),
        ],
        "affine",
        [x],
        [y],
        initializer=[two, one],
    )
    model = helper.make_model(graph, opset_imports=OPSET)
    model.ir_version = 8
    onnx.save(model, str(path))


def _build_engine(onnx_path: Path, plan_path: Path) -> None:
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(onnx_path.read_bytes()), [
        parser.get_error(i).desc() for i in range(parser.num_errors)
    ]
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("INPUT0", (1, 4), (4, 4), (8, 4))
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    assert serialized is not None
    plan_path.write_bytes(bytes(serialized))


@pytest.mark.gpu
def test_tiny_engine_serves(redis_url: str, tmp_path: Path) -> None:
    pytest.importorskip("tensorrt")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from sluice.gpu_workers.device import gpu_ids

    if not gpu_ids():
        pytest.skip("NVML sees no GPU (install nvidia-ml-py) so KIND_GPU cannot be served")
    repo = tmp_path / "models"
    (repo / "trt_affine/1").mkdir(parents=True)
    _onnx_affine(tmp_path / "affine.onnx")
    _build_engine(tmp_path / "affine.onnx", repo / "trt_affine/1/model.plan")
    (repo / "trt_affine/config.pbtxt").write_text(
        TRT_CONFIG.format(
            name="trt_affine",
            instances="instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]",
        )
    )
    server = start_server(repo, redis_url, tmp_path / "serve.log")
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        for batch in (1, 3, 8):
            x = np.arange(batch * 4, dtype=np.float32).reshape(batch, 4) / 4
            tensor = httpclient.InferInput("INPUT0", [batch, 4], "FP32")
            tensor.set_data_from_numpy(x)
            result = client.infer("trt_affine", [tensor])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * 2 + 1)
        client.close()
    finally:
        assert stop_server(server) == 0, server.log()
