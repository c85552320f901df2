"""From a model directory to a completed, validated config.

Rules: docs/reference/model-configuration.md ("Auto-complete",
"Normalization", "Validation", "Version policy").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.repository.backend import resolve_backend
from sluice.repository.config import find_config_file, read_model_config
from sluice.repository.errors import ConfigError, RepositoryError
from sluice.repository.normalize import normalize
from sluice.repository.scan import ModelSource, version_directories
from sluice.repository.validate import validate
from sluice.repository.version_policy import select_versions

__all__ = ["AutocompleteHook", "LoadedConfig", "load_model_config"]

AutocompleteHook = Callable[[ModelConfig, Path], None]
"""Backend auto-complete: called with the config (to change in place) and the
version directory that holds the model file."""

# Triton python_backend: auto_complete_config runs whenever auto-complete is
# enabled, not only when inputs or outputs are missing.
_ALWAYS_AUTOCOMPLETE_BACKENDS = frozenset({"python"})


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """A model's completed config and its versions.

    Attributes:
        config: The config after backend resolution, auto-complete and normalization.
        versions: Versions selected by the version policy, ascending.
        available: Every version directory found, ascending.
    """

    config: ModelConfig
    versions: tuple[int, ...]
    available: tuple[int, ...]


def _wants_autocomplete(config: ModelConfig) -> bool:
    missing_io = not config.input or not config.output
    return missing_io or config.backend in _ALWAYS_AUTOCOMPLETE_BACKENDS


def _run_autocomplete(
    hook: AutocompleteHook, config: ModelConfig, source: ModelSource, available: Sequence[int]
) -> None:
    version_dir = source.path / str(max(select_versions(config, available)))
    try:
        hook(config, version_dir)
    except RepositoryError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"autofill failed for model '{source.name}': {exc}", model=source.name, path=version_dir
        ) from exc


def load_model_config(
    source: ModelSource,
    *,
    autocomplete: AutocompleteHook | None = None,
    config_name: str | None = None,
    gpu_ids: Sequence[int] = (),
    gpu_backend: Callable[[str], bool] | None = None,
    strict: bool = False,
    config_override: ModelConfig | None = None,
) -> LoadedConfig:
    """Read, complete, normalize and validate one model's config.

    Triton model loading (docs/reference/model-configuration.md): read
    ``config.pbtxt`` (or ``configs/<config_name>.pbtxt``); fill or check
    ``name``; derive backend/platform/default file; run the backend's
    auto-complete unless ``strict`` (``--disable-auto-complete-config``);
    apply the serving defaults; validate; apply the version policy.

    Args:
        source: The model directory.
        autocomplete: Backend auto-complete hook; called (unless ``strict``)
            when the config lacks inputs or outputs, and always for the
            python backend, with the highest selected version directory.
        config_name: Triton ``--model-config-name``.
        gpu_ids: CUDA device ids of this host; empty on a CPU-only host.
        gpu_backend: whether a backend (by name) can run on a GPU here; asked only when
            ``gpu_ids`` is not empty, to resolve ``KIND_AUTO``. None: every backend can.
        strict: Triton ``--disable-auto-complete-config``: a missing config
            file is an error and no auto-complete runs.
        config_override: a config to use instead of ``config.pbtxt`` (Triton's load
            API ``config`` parameter); a copy is completed, the argument is not changed.

    Returns:
        The completed config and its versions.

    Raises:
        ConfigError: Any rule broken; the message names model, file and field.
    """
    model_dir = source.path
    available = version_directories(model_dir)
    if config_override is not None:
        config_path = None
        config = ModelConfig()
        config.CopyFrom(config_override)
    else:
        config_path = find_config_file(model_dir, config_name=config_name)
        config = read_model_config(model_dir, config_name=config_name)
    if config is None:
        if strict:
            raise ConfigError(
                f"model '{source.name}' has no config.pbtxt (auto-complete is disabled)",
                model=source.name,
                path=model_dir,
            )
        config = ModelConfig()
    if not config.name:
        config.name = source.name
    elif config.name != source.name:
        raise ConfigError(
            f"unexpected directory name '{source.name}' for model '{config.name}', "
            "directory name must equal model name",
            model=config.name,
            path=config_path or model_dir,
            field="name",
        )
    resolve_backend(config, model_dir, available)
    if not strict and autocomplete is not None and _wants_autocomplete(config):
        _run_autocomplete(autocomplete, config, source, available)
    auto_gpu = not gpu_ids or gpu_backend is None or gpu_backend(config.backend)
    normalize(config, gpu_ids=gpu_ids, auto_gpu=auto_gpu)
    validate(config, model_dir=model_dir, gpu_ids=gpu_ids, config_path=config_path)
    versions = select_versions(config, available)
    return LoadedConfig(config=config, versions=tuple(versions), available=tuple(available))
