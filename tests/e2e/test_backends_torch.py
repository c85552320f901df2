"""PyTorch backend end to end: TorchScript files exported here, served by ``sluice serve``.

Values must equal what the same module computes in this process. Skipped
cleanly where torch is not installed (``scripts/setup.sh`` installs the CPU
wheel only where ``/opt/wheels`` has it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e_support import Server, start_server, stop_server

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.e2e


class Affine(torch.nn.Module):
    """OUTPUT__0 = x @ W + b (FP32), OUTPUT__1 = argmax (INT64) — positional I/O."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(11)
        self.weight = torch.nn.Parameter(torch.randn(4, 3, generator=generator))
        self.bias = torch.nn.Parameter(torch.randn(3, generator=generator))

    def forward(self, x: torch.Tensor, shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x @ self.weight + self.bias + shift
        return y, y.argmax(dim=1)


class Named(torch.nn.Module):
    """Inputs matched by ``forward`` argument names; a single output."""

    def forward(self, base: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
        return base.to(torch.int64) ** exponent.to(torch.int64)


AFFINE_CONFIG = """
name: "torch_affine"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] },
         { name: "OUTPUT__1" data_type: TYPE_INT64 dims: [ 1 ] reshape: { shape: [ ] } } ]
dynamic_batching { max_queue_delay_microseconds: 20000 }
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }
"""

NAMED_CONFIG = """
name: "torch_named"
backend: "pytorch"
max_batch_size: 0
input [ { name: "exponent" data_type: TYPE_INT32 dims: [ -1 ] },
        { name: "base" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "POWER" data_type: TYPE_INT64 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def _write(repo: Path, name: str, module: torch.nn.Module, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    torch.jit.save(module, str(repo / name / "1" / "model.pt"))
    (repo / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def modules() -> dict[str, torch.nn.Module]:
    return {"affine": Affine().eval(), "named": Named().eval()}


@pytest.fixture(scope="module")
def torch_server(
    modules: dict[str, torch.nn.Module], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("torch-models")
    example = (torch.zeros(2, 4), torch.zeros(2, 1))
    _write(repo, "torch_affine", torch.jit.trace(modules["affine"], example), AFFINE_CONFIG)
    _write(repo, "torch_named", torch.jit.script(modules["named"]), NAMED_CONFIG)
    server = start_server(repo, redis_url, tmp_path_factory.mktemp("logs") / "torch.log")
    yield server
    assert stop_server(server) == 0, server.log()


def _affine_expected(module: Any, x: np.ndarray, shift: np.ndarray) -> tuple[np.ndarray, ...]:
    with torch.inference_mode():
        y, best = module(torch.from_numpy(x), torch.from_numpy(shift))
    return y.numpy(), best.numpy().reshape(-1, 1)  # OUTPUT__1: dims [1], reshape []


def test_affine_http_exact(torch_server: Server, modules: dict[str, Any]) -> None:
    client = httpclient.InferenceServerClient(torch_server.http_url)
    x = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    shift = np.array([[0.5], [-1.0], [0.0]], np.float32)
    inputs = [
        httpclient.InferInput("INPUT__0", [3, 4], "FP32"),
        httpclient.InferInput("INPUT__1", [3, 1], "FP32"),
    ]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(shift)
    result = client.infer("torch_affine", inputs)
    want_y, want_best = _affine_expected(modules["affine"], x, shift)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), want_y)
    assert result.as_numpy("OUTPUT__1").dtype == np.int64
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), want_best)
    assert client.get_model_metadata("torch_affine")["platform"] == "pytorch_libtorch"
    client.close()


def test_affine_concurrent_requests_batched_exact(
    torch_server: Server, modules: dict[str, Any]
) -> None:
    client = httpclient.InferenceServerClient(torch_server.http_url, concurrency=8)
    rng = np.random.default_rng(9)
    xs = [rng.standard_normal((1 + i % 3, 4)).astype(np.float32) for i in range(8)]
    pending = []
    for i, x in enumerate(xs):
        inputs = [
            httpclient.InferInput("INPUT__0", list(x.shape), "FP32"),
            httpclient.InferInput("INPUT__1", [x.shape[0], 1], "FP32"),
        ]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(np.full((x.shape[0], 1), float(i), np.float32))
        pending.append(client.async_infer("torch_affine", inputs))
    for i, (x, request) in enumerate(zip(xs, pending, strict=True)):
        result = request.get_result()
        shift = np.full((x.shape[0], 1), float(i), np.float32)
        want_y, want_best = _affine_expected(modules["affine"], x, shift)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), want_y)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), want_best)
    client.close()


def test_named_forward_arguments_grpc_exact(torch_server: Server, modules: dict[str, Any]) -> None:
    client = grpcclient.InferenceServerClient(torch_server.grpc_url)
    base = np.array([2, -3, 7, 0], np.int32)
    exponent = np.array([10, 3, 2, 5], np.int32)
    inputs = [
        grpcclient.InferInput("base", [4], "INT32"),
        grpcclient.InferInput("exponent", [4], "INT32"),
    ]
    inputs[0].set_data_from_numpy(base)
    inputs[1].set_data_from_numpy(exponent)
    result = client.infer("torch_named", inputs)
    with torch.inference_mode():
        want = modules["named"](torch.from_numpy(base), torch.from_numpy(exponent)).numpy()
    assert result.as_numpy("POWER").tolist() == want.tolist() == [1024, -27, 49, 0]
    client.close()
