"""Read ``config.pbtxt`` (protobuf text format) into tritonclient's ``ModelConfig``."""

from __future__ import annotations

import re
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.repository.errors import ConfigError

__all__ = ["CONFIG_FILENAME", "find_config_file", "parse_config_text", "read_model_config"]

CONFIG_FILENAME = "config.pbtxt"
_LOCATION_PREFIX = re.compile(r"^\d+:\d+ : ")


def parse_config_text(
    text: str, *, path: Path | None = None, model: str | None = None
) -> ModelConfig:
    """Parse protobuf text format into a ``ModelConfig``.

    Triton model repository: ``config.pbtxt`` is text format of
    ``inference.ModelConfig`` (list syntax, repeated lines, ``#`` comments);
    unknown fields are an error.

    Args:
        text: The file contents.
        path: The file, for error messages.
        model: The model name, for error messages.

    Returns:
        The parsed config, with no defaults filled in.

    Raises:
        ConfigError: The text does not parse; the message gives line and column.
    """
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        detail = _LOCATION_PREFIX.sub("", str(exc))
        where = f"line {exc.GetLine()} column {exc.GetColumn()}" if exc.GetLine() else "parse"
        raise ConfigError(f"{where}: {detail}", model=model, path=path) from exc
    return config


def find_config_file(model_dir: Path, *, config_name: str | None = None) -> Path | None:
    """Return the config file Triton would use for a model, or None.

    Triton ``--model-config-name=<name>``: ``configs/<name>.pbtxt`` when it
    exists, else ``config.pbtxt``, else none (auto-generation).

    Args:
        model_dir: The model directory.
        config_name: The ``--model-config-name`` value, if any.
    """
    if config_name:
        custom = model_dir / "configs" / f"{config_name}.pbtxt"
        if custom.is_file():
            return custom
    default = model_dir / CONFIG_FILENAME
    return default if default.is_file() else None


def read_model_config(model_dir: Path, *, config_name: str | None = None) -> ModelConfig | None:
    """Read a model's config file, chosen as in `find_config_file`.

    Args:
        model_dir: The model directory.
        config_name: The ``--model-config-name`` value, if any.

    Returns:
        The parsed config, or None when the model has no config file.

    Raises:
        ConfigError: The file cannot be read, is not UTF-8, or does not parse.
    """
    path = find_config_file(model_dir, config_name=config_name)
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config: {exc}", model=model_dir.name, path=path) from exc
    return parse_config_text(text, path=path, model=model_dir.name)
