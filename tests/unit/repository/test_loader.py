"""sluice.repository.loader: the whole path from directory to completed config."""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.repository import (
    ConfigError,
    ModelSource,
    TensorSignature,
    autocomplete_from_signature,
    config_to_json,
    load_model_config,
    scan_repositories,
)
from sluice.repository.loader import LoadedConfig

SIMPLE = """
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
"""


def _model(root: Path, name: str, config: str | None, versions: dict[str, str]) -> ModelSource:
    model_dir = root / name
    model_dir.mkdir(parents=True)
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    for version, filename in versions.items():
        (model_dir / version).mkdir()
        if filename:
            (model_dir / version / filename).write_bytes(b"")
    return scan_repositories([root]).models[name]


class RecordingHook:
    """An auto-complete hook like the ONNX Runtime backend's, recording its calls."""

    def __init__(self) -> None:
        self.calls: list[Path] = []

    def __call__(self, config: ModelConfig, version_dir: Path) -> None:
        self.calls.append(version_dir)
        autocomplete_from_signature(
            config,
            (TensorSignature("INPUT0", "TYPE_INT32", (-1, 16)),),
            (TensorSignature("OUTPUT0", "TYPE_INT8", (-1, 16)),),
        )


def test_load_simple(tmp_path: Path) -> None:
    source = _model(tmp_path, "simple", SIMPLE, {"1": "model.onnx", "2": "model.onnx"})
    loaded = load_model_config(source)
    assert isinstance(loaded, LoadedConfig)
    assert loaded.versions == (2,)
    assert loaded.available == (1, 2)
    assert config_to_json(loaded.config)["instance_group"][0]["count"] == 2


def test_gpu_backend_decides_kind_auto(tmp_path: Path) -> None:
    source = _model(tmp_path, "simple", SIMPLE, {"1": "model.onnx"})
    asked: list[str] = []

    def cpu_only(backend: str) -> bool:
        asked.append(backend)
        return False

    loaded = load_model_config(source, gpu_ids=(0,), gpu_backend=cpu_only)
    assert asked == ["onnxruntime"]
    group = config_to_json(loaded.config)["instance_group"][0]
    assert (group["kind"], group["count"], group.get("gpus", [])) == ("KIND_CPU", 2, [])
    loaded = load_model_config(source, gpu_ids=(0,), gpu_backend=lambda backend: True)
    group = config_to_json(loaded.config)["instance_group"][0]
    assert (group["kind"], group["count"], group["gpus"]) == ("KIND_GPU", 1, [0])
    asked.clear()
    load_model_config(source, gpu_ids=(), gpu_backend=cpu_only)
    assert asked == []  # no GPUs: nothing to ask


def test_autocomplete_missing_config(tmp_path: Path) -> None:
    source = _model(tmp_path, "auto", None, {"1": "model.onnx", "3": "model.onnx", "03": ""})
    hook = RecordingHook()
    loaded = load_model_config(source, autocomplete=hook, gpu_ids=(0,))
    assert hook.calls == [source.path / "3"]
    config = loaded.config
    assert (config.name, config.backend, config.platform) == (
        "auto",
        "onnxruntime",
        "onnxruntime_onnx",
    )
    assert config.max_batch_size == 4
    assert list(config.dynamic_batching.preferred_batch_size) == [4]
    assert [(g.name, g.count, list(g.gpus)) for g in config.instance_group] == [("auto", 1, [0])]
    assert loaded.versions == (3,)


@pytest.mark.parametrize(
    ("config", "strict", "called"),
    [
        (SIMPLE, False, False),  # inputs and outputs listed
        ('name: "simple" backend: "onnxruntime"', False, True),
        ('name: "simple" backend: "onnxruntime"', True, False),
        ('backend: "python" ' + SIMPLE.replace('platform: "onnxruntime_onnx"', ""), False, True),
    ],
)
def test_when_autocomplete_runs(tmp_path: Path, config: str, strict: bool, called: bool) -> None:
    filename = "model.py" if "python" in config else "model.onnx"
    source = _model(tmp_path, "simple", config, {"1": filename})
    hook = RecordingHook()
    load_model_config(source, autocomplete=hook, strict=strict)
    assert bool(hook.calls) == called


def test_strict_missing_config(tmp_path: Path) -> None:
    source = _model(tmp_path, "bare", None, {"1": "model.onnx"})
    with pytest.raises(ConfigError, match=r"model 'bare' has no config\.pbtxt"):
        load_model_config(source, strict=True)


def test_hook_exception_becomes_config_error(tmp_path: Path) -> None:
    source = _model(tmp_path, "bad", None, {"1": "model.onnx"})

    def hook(config: ModelConfig, version_dir: Path) -> None:
        raise ValueError("cannot open model.onnx")

    with pytest.raises(ConfigError, match="autofill failed for model 'bad': cannot open"):
        load_model_config(source, autocomplete=hook)


@pytest.mark.parametrize(
    ("config", "versions", "message"),
    [
        (
            'name: "other" backend: "python"',
            {"1": "model.py"},
            "unexpected directory name 'm' for model 'other'",
        ),
        ('backend: "python"', {}, "at least one version must be available"),
        (
            'backend: "python" version_policy { specific { versions: 9 } }',
            {"1": "model.py"},
            "at least one version must be available",
        ),
        (
            'backend: "python" instance_group { kind: KIND_GPU }',
            {"1": "model.py"},
            "has kind KIND_GPU but server does not support GPUs",
        ),
        ("", {"1": "weights.bin"}, "Could not determine backend for model 'm'"),
        ("max_batch_size: [", {"1": "model.py"}, "line 1"),
    ],
)
def test_load_errors(tmp_path: Path, config: str, versions: dict[str, str], message: str) -> None:
    source = _model(tmp_path, "m", config, versions)
    with pytest.raises(ConfigError, match=message):
        load_model_config(source)


def test_config_name_selects_alternative(tmp_path: Path) -> None:
    source = _model(tmp_path, "m", 'backend: "python" max_batch_size: 1', {"1": "model.py"})
    (source.path / "configs").mkdir()
    (source.path / "configs" / "big.pbtxt").write_text('backend: "python" max_batch_size: 64')
    assert load_model_config(source, config_name="big").config.max_batch_size == 64
    assert load_model_config(source, config_name="small").config.max_batch_size == 1
    assert load_model_config(source).available == (1,)
