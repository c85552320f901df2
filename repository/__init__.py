"""Triton model repositories: scan, read ``config.pbtxt``, complete, validate.

Imports only the stdlib, protobuf and tritonclient's ``model_config_pb2``; fsspec and its
cloud filesystems only when a cloud repository is named (``cloud.py``, ``mirror.py``).
"""

from __future__ import annotations

from sluice.repository.autocomplete import (
    ONNX_TO_CONFIG,
    ORT_TYPE_TO_CONFIG,
    TensorSignature,
    autocomplete_from_signature,
)
from sluice.repository.backend import resolve_backend
from sluice.repository.config import find_config_file, parse_config_text, read_model_config
from sluice.repository.errors import ConfigError, ModelNotFoundError, RepositoryError
from sluice.repository.loader import AutocompleteHook, LoadedConfig, load_model_config
from sluice.repository.normalize import normalize
from sluice.repository.render import config_from_json, config_to_json
from sluice.repository.scan import ModelSource, ScanResult, scan_repositories, version_directories
from sluice.repository.validate import validate
from sluice.repository.version_policy import select_versions

__all__ = [
    "ONNX_TO_CONFIG",
    "ORT_TYPE_TO_CONFIG",
    "AutocompleteHook",
    "ConfigError",
    "LoadedConfig",
    "ModelNotFoundError",
    "ModelSource",
    "RepositoryError",
    "ScanResult",
    "TensorSignature",
    "autocomplete_from_signature",
    "config_from_json",
    "config_to_json",
    "find_config_file",
    "load_model_config",
    "normalize",
    "parse_config_text",
    "read_model_config",
    "resolve_backend",
    "scan_repositories",
    "select_versions",
    "validate",
    "version_directories",
]
