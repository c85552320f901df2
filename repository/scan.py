"""Find models and their numeric version directories in model repositories.

Triton model repository layout: ``<repo>/<model>/<version>/``
(docs/reference/model-configuration.md).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sluice.repository.errors import RepositoryError
from sluice.repository.mirror import Repositories

__all__ = ["ModelSource", "ScanResult", "scan_repositories", "version_directories"]

logger = logging.getLogger(__name__)

_VERSION_RE = re.compile(r"0|[1-9][0-9]*")
_NON_VERSION_DIRS = frozenset({"warmup", "initial_state", "configs"})
_MAX_VERSION = 2**63 - 1  # Triton model_config.proto: versions are int64


@dataclass(frozen=True, slots=True)
class ModelSource:
    """One model directory.

    Attributes:
        name: Model name (the directory name).
        path: The model directory, ``repository / name``.
        repository: The repository root the model was found in.
    """

    name: str
    path: Path
    repository: Path


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What `scan_repositories` found.

    Attributes:
        models: Loadable models by name, sorted by name. Names found in more
            than one root are left out (see ``duplicates``).
        duplicates: Model names present in more than one root, with every
            model directory of that name in root order. Triton cannot load
            those and lists them as UNAVAILABLE (docs/reference/model-configuration.md).
    """

    models: dict[str, ModelSource]
    duplicates: dict[str, tuple[Path, ...]]


def _model_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        raise RepositoryError(f"failed to open model repository '{root}': not a directory")
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def scan_repositories(roots: Sequence[Path]) -> ScanResult:
    """List the models of one or more repository roots.

    Triton ``--model-repository`` (repeatable): every non-hidden subdirectory of
    a root is a model; a name in two roots cannot be loaded.

    Args:
        roots: Repository roots in command-line order. The same root given
            twice is scanned once. :class:`~sluice.repository.mirror.Repositories`
            (``sluice serve``'s) first brings its cloud repositories' local copies up
            to date; one whose storage cannot be read is scanned as it was.

    Returns:
        The models, and the names that are duplicated across roots.

    Raises:
        RepositoryError: A root does not exist or is not a directory.
    """
    if isinstance(roots, Repositories):
        roots.refresh()
    found: dict[str, list[ModelSource]] = {}
    seen_roots: set[Path] = set()
    for raw_root in roots:
        root = Path(raw_root)
        key = root.resolve()
        if key in seen_roots:
            continue
        seen_roots.add(key)
        for model_dir in _model_dirs(root):
            source = ModelSource(name=model_dir.name, path=model_dir, repository=root)
            found.setdefault(model_dir.name, []).append(source)
    models = {name: found[name][0] for name in sorted(found) if len(found[name]) == 1}
    duplicates = {
        name: tuple(source.path for source in found[name])
        for name in sorted(found)
        if len(found[name]) > 1
    }
    for name, paths in duplicates.items():
        logger.warning(
            "model '%s' is in more than one repository: %s", name, ", ".join(map(str, paths))
        )
    return ScanResult(models=models, duplicates=duplicates)


def version_directories(model_dir: Path) -> list[int]:
    """Return the numeric version directories of a model, ascending.

    Triton model repository rules (docs/reference/model-configuration.md): ``warmup``,
    ``initial_state`` and ``configs`` are skipped silently; names that are not
    a canonical non-negative integer (``^(0|[1-9][0-9]*)$``, so ``0`` is a
    version but ``01`` is not) are ignored with a warning. Hidden
    directories are skipped silently.

    Args:
        model_dir: The model directory.

    Returns:
        Version numbers, ascending.
    """
    versions: list[int] = []
    for child in sorted(model_dir.iterdir()):
        if not child.is_dir() or child.name in _NON_VERSION_DIRS or child.name.startswith("."):
            continue
        if _VERSION_RE.fullmatch(child.name) is None or int(child.name) > _MAX_VERSION:
            logger.warning(
                "ignoring '%s' of model '%s': version directory names must be non-negative "
                "integers without leading zeros",
                child.name,
                model_dir.name,
            )
            continue
        versions.append(int(child.name))
    return sorted(versions)
