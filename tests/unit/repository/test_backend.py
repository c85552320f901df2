"""sluice.repository.backend: platform/backend/default file derivation.

Rules: docs/reference/model-configuration.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.repository import ConfigError, resolve_backend


def _model(tmp_path: Path, name: str, entries: dict[str, str]) -> Path:
    """Create a model dir; entries map 'version/name' to 'file' or 'dir'."""
    model_dir = tmp_path / name
    model_dir.mkdir()
    for relative, kind in entries.items():
        path = model_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "dir":
            path.mkdir()
        else:
            path.write_bytes(b"")
    return model_dir


@pytest.mark.parametrize(
    ("entries", "backend", "platform", "filename"),
    [
        ({"1/model.onnx": "file"}, "onnxruntime", "onnxruntime_onnx", "model.onnx"),
        ({"1/model.onnx": "dir"}, "onnxruntime", "onnxruntime_onnx", "model.onnx"),
        ({"1/model.plan": "file"}, "tensorrt", "tensorrt_plan", "model.plan"),
        ({"1/model.pt": "file"}, "pytorch", "pytorch_libtorch", "model.pt"),
        ({"1/model.pt2": "file"}, "pytorch", "torch_aoti", "model.pt2"),
        ({"1/model.py": "file"}, "python", "", "model.py"),
        ({"1/model.xml": "file"}, "openvino", "", "model.xml"),
        (
            {"1/model.savedmodel": "dir"},
            "tensorflow",
            "tensorflow_savedmodel",
            "model.savedmodel",
        ),
        ({"1/model.graphdef": "file"}, "tensorflow", "tensorflow_graphdef", "model.graphdef"),
        # priority: model.plan before model.onnx before model.py
        (
            {"1/model.py": "file", "1/model.onnx": "file", "1/model.plan": "file"},
            "tensorrt",
            "tensorrt_plan",
            "model.plan",
        ),
        # model.savedmodel must be a directory, model.plan a file
        ({"1/model.savedmodel": "file", "1/model.py": "file"}, "python", "", "model.py"),
        (
            {"1/model.plan": "dir", "1/model.onnx": "file"},
            "onnxruntime",
            "onnxruntime_onnx",
            "model.onnx",
        ),
        # only the lowest version directory is inspected
        ({"1/model.py": "file", "2/model.onnx": "file"}, "python", "", "model.py"),
    ],
)
def test_backend_from_files(
    tmp_path: Path, entries: dict[str, str], backend: str, platform: str, filename: str
) -> None:
    model_dir = _model(tmp_path, "m", entries)
    versions = sorted({int(key.split("/")[0]) for key in entries})
    config = ModelConfig(name="m")
    resolve_backend(config, model_dir, versions)
    assert (config.backend, config.platform, config.default_model_filename) == (
        backend,
        platform,
        filename,
    )


@pytest.mark.parametrize(
    ("given", "backend", "platform", "filename"),
    [
        ({"platform": "onnxruntime_onnx"}, "onnxruntime", "onnxruntime_onnx", "model.onnx"),
        ({"backend": "onnxruntime"}, "onnxruntime", "onnxruntime_onnx", "model.onnx"),
        ({"platform": "pytorch_libtorch"}, "pytorch", "pytorch_libtorch", "model.pt"),
        ({"platform": "libtorch"}, "pytorch", "libtorch", "model.pt"),
        ({"backend": "pytorch"}, "pytorch", "pytorch_libtorch", "model.pt"),
        ({"platform": "torch_aoti"}, "pytorch", "torch_aoti", "model.pt2"),
        ({"platform": "tensorrt_plan"}, "tensorrt", "tensorrt_plan", "model.plan"),
        ({"backend": "tensorrt"}, "tensorrt", "tensorrt_plan", "model.plan"),
        ({"backend": "python"}, "python", "", "model.py"),
        ({"backend": "openvino"}, "openvino", "", "model.xml"),
        ({"backend": "identity"}, "identity", "", "model.identity"),
        ({"platform": "ensemble"}, "", "ensemble", ""),
        (
            {"backend": "onnxruntime", "default_model_filename": "net.onnx"},
            "onnxruntime",
            "onnxruntime_onnx",
            "net.onnx",
        ),
        ({"default_model_filename": "model.py"}, "python", "", "model.py"),
        ({"default_model_filename": "model.plan"}, "tensorrt", "tensorrt_plan", "model.plan"),
    ],
)
def test_backend_from_config(
    tmp_path: Path, given: dict[str, str], backend: str, platform: str, filename: str
) -> None:
    # The version directory holds a model.onnx: explicit fields must win over it.
    model_dir = _model(tmp_path, "m", {"1/model.onnx": "file"})
    config = ModelConfig(name="m", **given)
    resolve_backend(config, model_dir, [1])
    assert (config.backend, config.platform, config.default_model_filename) == (
        backend,
        platform,
        filename,
    )


def test_backend_from_directory_name(tmp_path: Path) -> None:
    model_dir = _model(tmp_path, "m.identity", {"1/readme.txt": "file"})
    config = ModelConfig(name="m.identity")
    resolve_backend(config, model_dir, [1])
    assert (config.backend, config.default_model_filename) == ("identity", "model.identity")


@pytest.mark.parametrize(
    ("entries", "versions"),
    [({"1/readme.txt": "file"}, [1]), ({}, [])],
)
def test_backend_undetermined(tmp_path: Path, entries: dict[str, str], versions: list[int]) -> None:
    model_dir = _model(tmp_path, "m", entries)
    with pytest.raises(ConfigError, match="Could not determine backend for model 'm'"):
        resolve_backend(ModelConfig(name="m"), model_dir, versions)


@pytest.mark.parametrize(
    "given",
    [
        {"backend": "onnxruntime", "platform": "tensorrt_plan"},
        {"backend": "python", "platform": "onnxruntime_onnx"},
        {"backend": "pytorch", "platform": "custom_thing"},
        {"backend": "python", "platform": "ensemble"},
    ],
)
def test_backend_mismatch(tmp_path: Path, given: dict[str, str]) -> None:
    model_dir = _model(tmp_path, "m", {"1/model.onnx": "file"})
    with pytest.raises(ConfigError, match="unexpected 'platform' and 'backend' pair"):
        resolve_backend(ModelConfig(name="m", **given), model_dir, [1])
