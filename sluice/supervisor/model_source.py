"""Model source staging: where a model's files come from, and whether they changed.

A load takes a model's directory from the repository scan, or writes the files a load
request carries (``<version>/<path>`` -> content, with a config override) into a
temporary directory that lives as long as that load. A fingerprint of the files and
the override tells a reload (or a poll) whether anything changed, as Triton's poll
mode reloads a model whose files changed (docs/reference/model-configuration.md;
Triton core ``src/model_repository_manager/model_repository_manager.cc``).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.broker.errors import ErrorCode, SluiceError
from sluice.repository import ModelSource, ScanResult


class LoadError(SluiceError):
    """A load or unload that failed; ``code`` and message are what the client sees."""


def directory_fingerprint(model_dir: Path) -> str:
    """Hash of every file's relative path, size and mtime under ``model_dir``.

    A change to ``config.pbtxt``, a label file or a version folder changes it
    (Triton poll mode reloads on such changes).
    """
    digest = hashlib.sha1()
    for path in sorted(model_dir.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            stat = path.stat()
            digest.update(
                f"{path.relative_to(model_dir)}|{stat.st_size}|{stat.st_mtime_ns}\n".encode()
            )
    return digest.hexdigest()


def source_fingerprint(model_dir: Path, config_json: str = "") -> str:
    """The fingerprint of a load: the files under ``model_dir`` and the config override
    (``""``: none)."""
    return directory_fingerprint(model_dir) + hashlib.sha1(config_json.encode()).hexdigest()


def unsupported_feature(config: ModelConfig) -> str:
    """The first config feature Sluice cannot serve yet ("" when none); refused at load
    rather than accepted and silently ignored."""
    if config.model_transaction_policy.decoupled and config.backend != "python":
        return f"a decoupled model_transaction_policy for backend '{config.backend}'"
    return ""


def repository_index(
    scan: ScanResult, overridden: Mapping[str, ModelSource]
) -> dict[str, dict[str, str]]:
    """The repository index to publish: model name -> ``{"repository": ...}`` for every
    model directory found (a name found in several repositories lists them all, comma
    separated), and the models loaded from a load request's files (``overridden``)."""
    found = {name: {"repository": str(src.repository)} for name, src in scan.models.items()}
    for name, paths in scan.duplicates.items():
        found[name] = {"repository": ",".join(str(p) for p in paths)}
    for name, source in overridden.items():
        if name not in found:
            found[name] = {"repository": str(source.repository)}
    return found


def duplicate_reason(name: str, paths: Sequence[Path]) -> str:
    """Why a model found in more than one repository is not served."""
    return f"model '{name}' appears in more than one model repository: " + ", ".join(
        str(p) for p in paths
    )


def stage_source(
    name: str, scan: ScanResult, files: Mapping[str, bytes], config_json: str
) -> tuple[ModelSource, Path | None]:
    """Where a load of ``name`` reads its files, and the temporary directory to remove
    once that load is gone (None for a repository directory).

    Args:
        name: model name.
        scan: the repository scan.
        files: ``<version>/<path>`` -> content from a load request (empty: the
            repository's directory is used).
        config_json: the request's config override ("" when none).

    Raises:
        LoadError: INVALID_ARG for files without a config override, a file path that is
            not ``<version>/<path>`` or a model in several repositories; INTERNAL
            "failed to load 'm', failed to poll from model repository" for an unknown
            model.
    """
    if files:
        if not config_json:
            raise LoadError(
                ErrorCode.INVALID_ARG,
                f"load failed for model '{name}': file parameters need the 'config' parameter",
                model=name,
            )
        return _write_files(name, files)
    if name in scan.duplicates:
        raise LoadError(
            ErrorCode.INVALID_ARG,
            f"load failed for model '{name}': it appears in more than one model repository",
            model=name,
        )
    source = scan.models.get(name)
    if source is None:
        raise LoadError(
            ErrorCode.INTERNAL,
            f"failed to load '{name}', failed to poll from model repository",
            model=name,
        )
    return source, None


def _write_files(name: str, files: Mapping[str, bytes]) -> tuple[ModelSource, Path]:
    """A load request's files as model directory ``name`` of a new temporary directory.

    Raises:
        LoadError: INVALID_ARG for a path that is absolute, climbs out (``..``) or is
            not ``<version>/<path>`` (nothing is left behind).
    """
    temp = Path(tempfile.mkdtemp(prefix=f"sluice-{name}-"))
    model_dir = temp / name
    for relative, content in files.items():
        path = PurePosixPath(relative)
        if path.is_absolute() or ".." in path.parts or len(path.parts) < 2:
            shutil.rmtree(temp, ignore_errors=True)
            raise LoadError(
                ErrorCode.INVALID_ARG,
                f"load failed for model '{name}': invalid file path "
                f"'{relative}' (expected <version>/<path>)",
                model=name,
            )
        target = model_dir.joinpath(*path.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return ModelSource(name, model_dir, temp), temp


def discard(temp_dir: Path | None) -> None:
    """Remove a load's temporary directory (nothing for a repository directory)."""
    if temp_dir is not None:
        shutil.rmtree(temp_dir, ignore_errors=True)
