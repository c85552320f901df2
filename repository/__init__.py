"""Triton model repositories: scan, read ``config.pbtxt``, complete, validate.

Imports only the stdlib, protobuf and tritonclient's ``model_config_pb2``.
"""

from __future__ import annotations

from repository.autocomplete import (
    ONNX_TO_CONFIG,
    ORT_TYPE_TO_CONFIG,
    TensorSignature,
    autocomplete_from_signature,
)
from repository.backend import resolve_backend
from repository.config import find_config_file, parse_config_text, read_model_config
from repository.errors import ConfigError, ModelNotFoundError, RepositoryError
from repository.loader import AutocompleteHook, LoadedConfig, load_model_config
from repository.normalize import normalize
from repository.render import config_from_json, config_to_json
from repository.scan import ModelSource, ScanResult, scan_repositories, version_directories
from repository.validate import validate
from repository.version_policy import select_versions

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
