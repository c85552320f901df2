"""GPU paths end to end: KIND_GPU and KIND_AUTO instances on CUDA, ORT's CUDA execution
provider, and NVML's GPU metrics, through a real ``sluice serve`` and ``tritonclient``.

Every test here is marked ``gpu`` and skips cleanly where torch sees no CUDA device or
NVML sees no GPU (CI's machines). On a GPU machine run ``pytest -m gpu tests/e2e``.
The probe model reports the device its input lives on, so a test can tell an instance
that really runs on ``cuda:0`` from one that fell back to the CPU.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e_support import Server, start_server, stop_server, write_scale_model
from tritonclient.utils import InferenceServerException

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.e2e, pytest.mark.gpu]


def _gpu_usable() -> bool:
    from sluice.gpu_workers.device import gpu_ids

    return bool(torch.cuda.is_available() and gpu_ids())


if not _gpu_usable():
    pytest.skip("no CUDA device seen by torch and NVML", allow_module_level=True)


class Probe(torch.nn.Module):
    """OUTPUT__0 = INPUT__0 @ W + b (FP32 [n, 3]); OUTPUT__1 = the CUDA ordinal the input
    lives on, -1 on the CPU (FP32 [n, 1])."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(5)
        self.weight = torch.nn.Parameter(torch.randn(4, 3, generator=generator))
        self.bias = torch.nn.Parameter(torch.randn(3, generator=generator))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        where = torch.full([x.size(0), 1], float(x.get_device()), dtype=x.dtype, device=x.device)
        return x @ self.weight + self.bias, where


PROBE_CONFIG = """
name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 32
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] }},
         {{ name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
instance_group [ {group} ]
"""

ONNX_CONFIG = """
name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
{group}
"""


@pytest.fixture(scope="module")
def probe() -> Probe:
    return Probe().eval()


@pytest.fixture(scope="module")
def gpu_server(
    probe: Probe, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("gpu-models")
    scripted = torch.jit.script(probe)
    groups = {
        "probe_gpu": "{ kind: KIND_GPU count: 2 gpus: [ 0 ] }",
        "probe_auto": "{ kind: KIND_AUTO count: 1 }",
    }
    for name, group in groups.items():
        (repo / name / "1").mkdir(parents=True)
        scripted.save(str(repo / name / "1" / "model.pt"))
        (repo / name / "config.pbtxt").write_text(PROBE_CONFIG.format(name=name, group=group))
    onnx_groups = {
        "onnx_gpu": "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]",
        "onnx_auto": "",
    }
    for name, group in onnx_groups.items():
        (repo / name / "1").mkdir(parents=True)
        write_scale_model(repo / name / "1" / "model.onnx", 2.0)
        (repo / name / "config.pbtxt").write_text(ONNX_CONFIG.format(name=name, group=group))
    server = start_server(
        repo,
        redis_url,
        tmp_path_factory.mktemp("gpu-logs") / "serve.log",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "probe_gpu",
        "--load-model",
        "probe_auto",
        "--load-model",
        "onnx_auto",
        timeout_s=180.0,
    )
    yield server
    assert stop_server(server) == 0, server.log()


def _expected(probe: Probe, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return probe(torch.from_numpy(x))[0].numpy()


def _infer_http(client: httpclient.InferenceServerClient, model: str, x: np.ndarray) -> tuple:
    tensor = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(model, [tensor])
    return result.as_numpy("OUTPUT__0"), result.as_numpy("OUTPUT__1")


def test_kind_gpu_instances_batch_distinct_inputs_on_cuda(gpu_server: Server, probe: Probe) -> None:
    clients = 32
    rounds = 20
    failures: list[str] = []

    def one_client(index: int) -> None:
        client = httpclient.InferenceServerClient(gpu_server.http_url, network_timeout=60)
        try:
            for step in range(rounds):
                x = np.full((1, 4), index * 100 + step, dtype=np.float32)
                x[0, 1:] += np.arange(1, 4, dtype=np.float32) / 8
                y, where = _infer_http(client, "probe_gpu", x)
                if not np.allclose(y, _expected(probe, x), rtol=1e-5, atol=1e-3):
                    failures.append(f"client {index} step {step}: {y} != expected")
                if where.tolist() != [[0.0]]:
                    failures.append(f"client {index} step {step}: ran on device {where}")
        except Exception as exc:  # reported below, with the others
            failures.append(f"client {index}: {exc!r}")
        finally:
            client.close()

    threads = [threading.Thread(target=one_client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []
    client = httpclient.InferenceServerClient(gpu_server.http_url)
    stats = client.get_inference_statistics("probe_gpu")["model_stats"][0]
    client.close()
    assert stats["inference_count"] == clients * rounds
    assert stats["execution_count"] < stats["inference_count"]  # batched on the GPU


def test_kind_gpu_over_grpc_at_full_batch(gpu_server: Server, probe: Probe) -> None:
    client = grpcclient.InferenceServerClient(gpu_server.grpc_url)
    x = np.random.default_rng(3).standard_normal((32, 4)).astype(np.float32)
    tensor = grpcclient.InferInput("INPUT__0", [32, 4], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("probe_gpu", [tensor])
    client.close()
    np.testing.assert_allclose(
        result.as_numpy("OUTPUT__0"), _expected(probe, x), rtol=1e-5, atol=1e-5
    )
    assert result.as_numpy("OUTPUT__1").ravel().tolist() == [0.0] * 32


def test_kind_auto_resolves_to_gpu(gpu_server: Server, probe: Probe) -> None:
    client = httpclient.InferenceServerClient(gpu_server.http_url)
    config = client.get_model_config("probe_auto")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    y, where = _infer_http(client, "probe_auto", x)
    client.close()
    groups = config["instance_group"]
    assert [(g["kind"], g["gpus"]) for g in groups] == [("KIND_GPU", [0])]
    assert where.ravel().tolist() == [0.0, 0.0]
    np.testing.assert_allclose(y, _expected(probe, x), rtol=1e-5, atol=1e-5)


def test_onnx_kind_gpu_serves_on_cuda_or_names_the_missing_provider(gpu_server: Server) -> None:
    import onnxruntime

    client = httpclient.InferenceServerClient(gpu_server.http_url, network_timeout=180)
    try:
        if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            client.load_model("onnx_gpu")
            x = np.arange(12, dtype=np.float32).reshape(3, 4)
            tensor = httpclient.InferInput("INPUT0", [3, 4], "FP32")
            tensor.set_data_from_numpy(x)
            np.testing.assert_array_equal(
                client.infer("onnx_gpu", [tensor]).as_numpy("OUTPUT0"), x * 2
            )
        else:
            with pytest.raises(InferenceServerException) as info:
                client.load_model("onnx_gpu")
            assert info.value.status() == "400"
            assert "onnx_gpu" in info.value.message()
            assert "CUDAExecutionProvider" in info.value.message()
            assert not client.is_model_ready("onnx_gpu")
    finally:
        client.close()


def test_onnx_kind_auto_follows_the_installed_onnxruntime(gpu_server: Server) -> None:
    """With GPUs present, KIND_AUTO is KIND_GPU only where onnxruntime has the CUDA
    provider; a CPU-only onnxruntime serves on the CPU instead of failing the load."""
    import onnxruntime

    cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    client = httpclient.InferenceServerClient(gpu_server.http_url)
    try:
        groups = client.get_model_config("onnx_auto")["instance_group"]
        assert [(g["kind"], g["count"]) for g in groups] == (
            [("KIND_GPU", 1)] if cuda else [("KIND_CPU", 2)]
        )
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        tensor = httpclient.InferInput("INPUT0", [2, 4], "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer("onnx_auto", [tensor])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * 2)
    finally:
        client.close()


def test_gpu_metrics_read_nvml(gpu_server: Server) -> None:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
    finally:
        pynvml.nvmlShutdown()
    text = requests.get(gpu_server.metrics_url, timeout=10).text
    samples = {}
    for line in text.splitlines():
        if line.startswith("nv_gpu_") and f'gpu_uuid="{uuid}"' in line:
            name = line.split("{", 1)[0]
            samples[name] = float(line.rsplit(" ", 1)[1])
    assert samples["nv_gpu_memory_total_bytes"] == total
    assert 0 < samples["nv_gpu_memory_used_bytes"] <= total
    assert 0.0 <= samples["nv_gpu_utilization"] <= 1.0
    assert samples["nv_gpu_power_limit"] > 0
    print("GPU metrics:", json.dumps(samples))
