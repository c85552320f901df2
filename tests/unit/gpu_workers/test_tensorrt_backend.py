"""gpu_workers.backends.tensorrt: plan choice, profile checks, and the no-TensorRT load error."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.gpu_workers.backends import registry
from sluice.gpu_workers.backends.base import BackendInputError, InstanceContext
from sluice.gpu_workers.backends.tensorrt import check_profile, plan_file

CONFIG = """
name: "trt"
platform: "tensorrt_plan"
backend: "tensorrt"
default_model_filename: "model.plan"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
cc_model_filenames { key: "9.0" value: "hopper.plan" }
cc_model_filenames { key: "8.0" value: "ampere.plan" }
"""


def _config() -> ModelConfig:
    return text_format.Parse(CONFIG, ModelConfig())


@pytest.mark.parametrize(
    ("capability", "name"),
    [((9, 0), "hopper.plan"), ((8, 0), "ampere.plan"), ((8, 6), "model.plan")],
)
def test_plan_file_by_compute_capability(capability: tuple[int, int], name: str) -> None:
    assert plan_file(_config(), Path("/m/1"), capability) == Path("/m/1") / name


def test_check_profile() -> None:
    profile = ([1, 4], [4, 4], [8, 4])
    check_profile("INPUT0", (1, 4), profile)
    check_profile("INPUT0", (8, 4), profile)
    with pytest.raises(BackendInputError) as info:
        check_profile("INPUT0", (9, 4), profile)
    assert str(info.value) == (
        "input 'INPUT0' dimension 0 is 9, outside the engine's optimization profile [1, 8] "
        "(shape [9, 4], min [1, 4], max [8, 4])"
    )
    with pytest.raises(BackendInputError, match="has rank 1 but the engine expects rank 2"):
        check_profile("INPUT0", (4,), profile)


def test_registered_as_tensorrt() -> None:
    assert registry.BACKENDS["tensorrt"] == "sluice.gpu_workers.backends.tensorrt:TensorRTBackend"


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is not None, reason="tensorrt is installed here"
)
def test_without_tensorrt_the_load_fails_with_a_clear_reason(tmp_path: Path) -> None:
    ctx = InstanceContext("trt", 1, _config(), "trt_0", "GPU", 0, tmp_path, tmp_path / "1")
    backend = registry.backend_class("tensorrt", "trt")()
    with pytest.raises(RuntimeError) as info:
        backend.initialize(ctx)
    assert str(info.value).startswith(
        "TensorRT is not available on this machine: No module named 'tensorrt'"
    )
