"""Poll mode: the record of a version whose directory left the repository.

A version that failed to load keeps its UNAVAILABLE record (with the load's error)
while its directory is there. Once the directory is removed, the version is no
longer part of the model: Triton's poll reloads the model with the versions still
present, and its server readiness only weighs versions that serve (Triton core,
``ModelLifeCycle::LiveModelStates``). Sluice marks such a version UNAVAILABLE with
reason ``unloaded``, as a version retired by a reload: the repository index shows it
unloaded, not with a stale load error, and ``/v2/health/ready`` does not count it
(``api.handlers.health``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path

from sluice.broker.model_store import ModelStore, VersionState
from sluice.broker.states import ModelState
from sluice.repository import version_directories

__all__ = ["mark_removed_versions"]

logger = logging.getLogger(__name__)

#: the reason of a version that no longer serves and does not count against readiness.
UNLOADED = "unloaded"


def mark_removed_versions(
    store: ModelStore, name: str, model_dir: Path, serving: Collection[int] | None
) -> list[int]:
    """Mark UNAVAILABLE ``unloaded`` every recorded version of ``name`` that neither
    serves (``serving``: the versions of the loaded model; None when none is) nor has
    a directory in ``model_dir`` any more; returns those versions, ascending.

    Raises:
        redis.exceptions.RedisError: Redis unreachable.
    """
    present = set(version_directories(model_dir))
    marked: list[int] = []
    for version, state in sorted(store.get(name).versions.items()):
        if version in (serving or ()) or version in present:
            continue
        if state.state is ModelState.UNAVAILABLE and state.reason == UNLOADED:
            continue
        logger.info("model '%s' version %d left the repository; unloaded", name, version)
        store.set_state(name, version, VersionState(ModelState.UNAVAILABLE, UNLOADED))
        marked.append(version)
    return marked
