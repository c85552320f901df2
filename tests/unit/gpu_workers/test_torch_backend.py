"""sluice.gpu_workers.backends.torch: Triton's PyTorch naming rules and a TorchScript model run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.gpu_workers.backends import registry
from sluice.gpu_workers.backends.base import (
    InferError,
    InferRequest,
    InferResponse,
    InstanceContext,
)
from sluice.gpu_workers.backends.torch import InputBinding, bind_inputs, bind_outputs, pick_outputs


@pytest.mark.parametrize(
    ("config", "forward", "expected"),
    [
        (["a", "b"], ["a", "b"], InputBinding("FORWARD_ARGUMENT", ("a", "b"))),
        (["b", "a"], ["a", "b"], InputBinding("FORWARD_ARGUMENT", ("a", "b"))),
        (
            ["INPUT__1", "INPUT__0"],
            ["x", "y"],
            InputBinding("NAMED_INDEX", ("INPUT__0", "INPUT__1")),
        ),
        (["x__0", "other__1"], ["p", "q"], InputBinding("NAMED_INDEX", ("x__0", "other__1"))),
        (
            ["INPUT__0", "INPUT__2"],
            ["x", "y"],  # indices not 0..n-1: config order
            InputBinding("STRICT_CONFIG_ORDERING", ("INPUT__0", "INPUT__2")),
        ),
        (
            ["first", "second"],
            ["x", "y"],
            InputBinding("STRICT_CONFIG_ORDERING", ("first", "second")),
        ),
        (["a", "INPUT__1"], ["a", "b"], InputBinding("STRICT_CONFIG_ORDERING", ("a", "INPUT__1"))),
    ],
)
def test_bind_inputs(config: list[str], forward: list[str], expected: InputBinding) -> None:
    assert bind_inputs(config, forward) == expected


def test_bind_inputs_dict() -> None:
    assert bind_inputs(["x", "y"], ["d"], dict_input=True) == InputBinding("DICT", ("x", "y"))


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["OUTPUT__1", "OUTPUT__0"], {"OUTPUT__1": 1, "OUTPUT__0": 0}),
        (["sum", "product"], {"sum": 0, "product": 1}),
        (["OUTPUT__0", "OUTPUT__5"], {"OUTPUT__0": 0, "OUTPUT__5": 1}),
    ],
)
def test_bind_outputs(names: list[str], expected: dict[str, int]) -> None:
    assert bind_outputs(names) == expected


def test_pick_outputs() -> None:
    positions = {"A": 0, "B": 1}
    assert pick_outputs(("a", "b"), positions, ["B"]) == {"B": "b"}
    assert pick_outputs(["a", "b"], positions, ["A", "B"]) == {"A": "a", "B": "b"}
    assert pick_outputs("t", {"A": 0}, ["A"]) == {"A": "t"}
    assert pick_outputs({"B": 2, "A": 1}, positions, ["A"]) == {"A": 1}
    with pytest.raises(ValueError, match="output 'B' is item 1 but the model returned 1 item"):
        pick_outputs(("a",), positions, ["B"])
    with pytest.raises(ValueError, match="output 'B' is item 1 but the model returned a single"):
        pick_outputs("t", positions, ["B"])
    with pytest.raises(ValueError, match="output 'A' is not a key of the model's dict result"):
        pick_outputs({"B": 1}, positions, ["A"])


def test_registered_as_pytorch() -> None:
    assert registry.BACKENDS["pytorch"] == "sluice.gpu_workers.backends.torch:TorchBackend"


# --- with torch ---------------------------------------------------------------------------


@pytest.fixture
def torch() -> Any:
    return pytest.importorskip("torch")


CONFIG = """
name: "t"
platform: "pytorch_libtorch"
backend: "pytorch"
default_model_filename: "model.pt"
max_batch_size: 8
input [ {{ name: "{a}" data_type: TYPE_FP32 dims: [ 3 ] }},
        {{ name: "{b}" data_type: TYPE_FP32 dims: [ 3 ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] }},
         {{ name: "OUTPUT__1" data_type: TYPE_INT64 dims: [ 3 ] }} ]
"""


def _export(torch: Any, path: Path) -> Any:
    class AddMul(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor([1.5, -2.0, 0.25]))

        def forward(self, lhs: Any, rhs: Any) -> Any:
            return lhs * self.scale + rhs, (lhs > rhs).to(torch.int64)

    module = AddMul().eval()
    example = (torch.zeros(1, 3), torch.zeros(1, 3))
    traced = torch.jit.trace(module, example)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(traced, str(path))
    return module


def _ctx(tmp_path: Path, text: str, kind: str = "CPU") -> InstanceContext:
    config = text_format.Parse(text, ModelConfig())
    return InstanceContext("t", 1, config, "t_0", kind, 0, tmp_path, tmp_path / "1")


@pytest.mark.parametrize(("a", "b"), [("lhs", "rhs"), ("rhs", "lhs"), ("INPUT__0", "INPUT__1")])
def test_torchscript_batch_matches_in_process_torch(
    torch: Any, tmp_path: Path, a: str, b: str
) -> None:
    module = _export(torch, tmp_path / "1/model.pt")
    backend = registry.backend_class("pytorch", "t")()
    backend.initialize(_ctx(tmp_path, CONFIG.format(a=a, b=b)))
    rng = np.random.default_rng(3)
    lhs = [rng.standard_normal((n, 3)).astype(np.float32) for n in (1, 2)]
    rhs = [rng.standard_normal((n, 3)).astype(np.float32) for n in (1, 2)]
    # Named inputs are matched by name: "rhs" listed first still reaches forward's rhs.
    names = {"lhs": a, "rhs": b} if a != "rhs" else {"lhs": "lhs", "rhs": "rhs"}
    requests = [
        InferRequest(str(i), "", {names["lhs"]: lhs[i], names["rhs"]: rhs[i]}) for i in range(2)
    ]
    results = backend.execute(requests)
    with torch.inference_mode():
        for i, result in enumerate(results):
            assert isinstance(result, InferResponse), result
            want_sum, want_gt = module(torch.from_numpy(lhs[i]), torch.from_numpy(rhs[i]))
            np.testing.assert_array_equal(result.outputs["OUTPUT__0"], want_sum.numpy())
            np.testing.assert_array_equal(result.outputs["OUTPUT__1"], want_gt.numpy())
            assert result.outputs["OUTPUT__1"].dtype == np.int64
    backend.finalize()


def test_read_only_inputs_are_accepted(torch: Any, tmp_path: Path) -> None:
    _export(torch, tmp_path / "1/model.pt")
    backend = registry.backend_class("pytorch", "t")()
    backend.initialize(_ctx(tmp_path, CONFIG.format(a="lhs", b="rhs")))
    data = np.frombuffer(np.ones(3, np.float32).tobytes(), np.float32).reshape(1, 3)
    assert not data.flags.writeable
    (result,) = backend.execute([InferRequest("r", "", {"lhs": data, "rhs": data})])
    assert isinstance(result, InferResponse)
    assert result.outputs["OUTPUT__0"].tolist() == [[2.5, -1.0, 1.25]]


def test_dict_input_and_dict_output(torch: Any, tmp_path: Path) -> None:
    class DictModel(torch.nn.Module):
        def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {"DOUBLE": inputs["x"] * 2, "TOTAL": inputs["x"] + inputs["y"]}

    (tmp_path / "1").mkdir()
    torch.jit.save(torch.jit.script(DictModel()), str(tmp_path / "1/model.pt"))
    text = """
name: "t"
backend: "pytorch"
default_model_filename: "model.pt"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_INT32 dims: [ 2 ] },
        { name: "y" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "TOTAL" data_type: TYPE_INT32 dims: [ 2 ] },
         { name: "DOUBLE" data_type: TYPE_INT32 dims: [ 2 ] } ]
"""
    backend = registry.backend_class("pytorch", "t")()
    backend.initialize(_ctx(tmp_path, text))
    x, y = np.array([1, 2], np.int32), np.array([10, 20], np.int32)
    (result,) = backend.execute([InferRequest("r", "", {"x": x, "y": y})])
    assert isinstance(result, InferResponse)
    assert result.outputs["TOTAL"].tolist() == [11, 22]
    assert result.outputs["DOUBLE"].tolist() == [2, 4]


def test_missing_output_is_an_internal_error(torch: Any, tmp_path: Path) -> None:
    _export(torch, tmp_path / "1/model.pt")
    text = CONFIG.format(a="lhs", b="rhs").replace(
        'output [ { name: "OUTPUT__0"',
        'output [ { name: "OUTPUT__2" data_type: TYPE_FP32 dims: [ 3 ] },\n { name: "OUTPUT__0"',
    )
    backend = registry.backend_class("pytorch", "t")()
    backend.initialize(_ctx(tmp_path, text))
    data = np.zeros((1, 3), np.float32)
    (result,) = backend.execute([InferRequest("r", "", {"lhs": data, "rhs": data})])
    assert isinstance(result, InferError)
    assert result.code == "INTERNAL"
    assert "output 'OUTPUT__2' is item 2 but the model returned 2 item(s)" in result.message


def test_gpu_instance_without_cuda_fails_to_load(torch: Any, tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    _export(torch, tmp_path / "1/model.pt")
    backend = registry.backend_class("pytorch", "t")()
    with pytest.raises(RuntimeError) as info:
        backend.initialize(_ctx(tmp_path, CONFIG.format(a="lhs", b="rhs"), kind="GPU"))
    assert str(info.value) == (
        f"model 't' instance 't_0' is KIND_GPU but torch {torch.__version__} has no CUDA "
        "device available"
    )


def test_bytes_tensors_are_refused_at_load(tmp_path: Path) -> None:
    text = CONFIG.format(a="lhs", b="rhs").replace("TYPE_INT64", "TYPE_STRING")
    backend = registry.backend_class("pytorch", "t")()
    with pytest.raises(RuntimeError, match="tensor 'OUTPUT__1' is TYPE_STRING"):
        backend.initialize(_ctx(tmp_path, text))
