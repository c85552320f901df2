"""Derive ``backend``, ``platform`` and ``default_model_filename``.

Rules: docs/reference/model-configuration.md ("Backend, platform and
model file").

Triton ``model_config_utils.cc`` ``AutoCompleteBackendFields``: either of
``platform``/``backend`` may be given and the other is derived; with neither,
the model file in the lowest version directory decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.repository.errors import ConfigError

__all__ = ["ENSEMBLE_PLATFORM", "resolve_backend"]

ENSEMBLE_PLATFORM = "ensemble"

# Triton model_config.proto: platform -> backend.
_PLATFORM_TO_BACKEND: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "libtorch": "pytorch",
    "torch_aoti": "pytorch",
    "tensorrt_plan": "tensorrt",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
}
# Backends that own platforms: a platform outside their own is a mismatch.
_PLATFORM_BACKENDS = frozenset(_PLATFORM_TO_BACKEND.values())

# Model file -> (backend, platform, kind) in Triton's inspection priority;
# kind is "dir", "file" or "any".
_MODEL_FILES: tuple[tuple[str, str, str, str], ...] = (
    ("model.savedmodel", "tensorflow", "tensorflow_savedmodel", "dir"),
    ("model.graphdef", "tensorflow", "tensorflow_graphdef", "file"),
    ("model.plan", "tensorrt", "tensorrt_plan", "file"),
    ("model.onnx", "onnxruntime", "onnxruntime_onnx", "any"),
    ("model.xml", "openvino", "", "any"),
    ("model.pt", "pytorch", "pytorch_libtorch", "file"),
    ("model.pt2", "pytorch", "torch_aoti", "any"),
    ("model.py", "python", "", "any"),
)
_FILE_TO_BACKEND = {name: (backend, platform) for name, backend, platform, _ in _MODEL_FILES}

# Platform a backend implies when only the backend is given.
_BACKEND_TO_PLATFORM: dict[str, str] = {
    "onnxruntime": "onnxruntime_onnx",
    "tensorrt": "tensorrt_plan",
    "pytorch": "pytorch_libtorch",
    "tensorflow": "tensorflow_savedmodel",
}

# Default model file by platform (checked first), then by backend.
_PLATFORM_FILENAME: dict[str, str] = {
    "torch_aoti": "model.pt2",
    "tensorflow_savedmodel": "model.savedmodel",
    "tensorflow_graphdef": "model.graphdef",
}
_BACKEND_FILENAME: dict[str, str] = {
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "tensorrt": "model.plan",
    "python": "model.py",
    "openvino": "model.xml",
    "tensorflow": "model.savedmodel",
}


def _model_name(config: ModelConfig, model_dir: Path) -> str:
    return config.name or model_dir.name


def _present(path: Path, kind: str) -> bool:
    if kind == "dir":
        return path.is_dir()
    if kind == "file":
        return path.is_file()
    return path.exists()


def _from_files(model_dir: Path, versions: Sequence[int]) -> tuple[str, str] | None:
    """Backend and platform from the model file in the lowest version directory."""
    if not versions:
        return None
    version_dir = model_dir / str(min(versions))
    for filename, backend, platform, kind in _MODEL_FILES:
        if _present(version_dir / filename, kind):
            return backend, platform
    return None


def _from_directory_name(name: str) -> str | None:
    """Backend ``b`` from a model directory named ``x.b`` (Triton custom backends)."""
    _, dot, backend = name.partition(".")
    return backend if dot and backend else None


def _check_pair(config: ModelConfig, model: str, model_dir: Path) -> None:
    platform, backend = config.platform, config.backend
    expected = _PLATFORM_TO_BACKEND.get(platform)
    mismatch = (
        (platform == ENSEMBLE_PLATFORM and backend != "")
        or (expected is not None and backend != expected)
        or (
            expected is None
            and platform not in ("", ENSEMBLE_PLATFORM)
            and backend in _PLATFORM_BACKENDS
        )
    )
    if mismatch:
        raise ConfigError(
            f"unexpected 'platform' and 'backend' pair, got: {platform}, {backend} "
            "(Triton model_config.proto: platform, backend)",
            model=model,
            path=model_dir,
            field="backend",
        )


def _derive(config: ModelConfig, model: str, model_dir: Path, versions: Sequence[int]) -> None:
    """Fill whichever of platform/backend is empty."""
    if config.platform and not config.backend:
        backend = _PLATFORM_TO_BACKEND.get(config.platform)
        if backend is None:
            raise ConfigError(
                f"Could not determine backend for model '{model}': unknown platform "
                f"'{config.platform}' and no backend in model configuration",
                model=model,
                path=model_dir,
                field="platform",
            )
        config.backend = backend
        return
    if config.backend:
        if not config.platform:
            if config.default_model_filename in _FILE_TO_BACKEND:
                file_backend, file_platform = _FILE_TO_BACKEND[config.default_model_filename]
                if file_backend == config.backend:
                    config.platform = file_platform
                    return
            found = _from_files(model_dir, versions)
            if found is not None and found[0] == config.backend:
                config.platform = found[1]
            else:
                config.platform = _BACKEND_TO_PLATFORM.get(config.backend, "")
        return
    found = None
    if config.default_model_filename:
        found = _FILE_TO_BACKEND.get(config.default_model_filename)
    else:
        found = _from_files(model_dir, versions)
    if found is None:
        custom = _from_directory_name(model)
        if custom is None:
            raise ConfigError(
                f"Invalid model name: Could not determine backend for model '{model}' with no "
                "backend in model configuration. Expected model name of the form "
                "'model.<backend_name>'.",
                model=model,
                path=model_dir,
                field="backend",
            )
        found = (custom, "")
    config.backend, config.platform = found


def resolve_backend(config: ModelConfig, model_dir: Path, versions: Sequence[int]) -> None:
    """Fill ``backend``, ``platform`` and ``default_model_filename`` in place.

    Triton model_config.proto: platform, backend, default_model_filename
    (docs/reference/model-configuration.md). A known platform fills the backend; a
    known backend fills the platform; with neither, ``default_model_filename`` (if it is a
    known file name) or else the model file in the lowest version directory
    decides (``model.savedmodel/``, ``model.graphdef``, ``model.plan``,
    ``model.onnx``, ``model.xml``, ``model.pt``, ``model.pt2``, ``model.py``
    in that priority), and finally a directory named ``x.<backend>``.
    Ensembles (platform ``ensemble``) must have an empty backend and get no
    default file name.

    Args:
        config: The model config; changed in place.
        model_dir: The model directory.
        versions: The version directories found (`version_directories`).

    Raises:
        ConfigError: The backend cannot be determined, or platform and
            backend do not belong together.
    """
    model = _model_name(config, model_dir)
    if config.platform != ENSEMBLE_PLATFORM:
        _derive(config, model, model_dir, versions)
    _check_pair(config, model, model_dir)
    if config.platform == ENSEMBLE_PLATFORM or config.default_model_filename:
        return
    config.default_model_filename = _PLATFORM_FILENAME.get(
        config.platform, _BACKEND_FILENAME.get(config.backend, f"model.{config.backend}")
    )
