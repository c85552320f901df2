"""Which version directories a model serves (docs/reference/model-configuration.md)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.repository.errors import ConfigError

__all__ = ["select_versions"]

logger = logging.getLogger(__name__)


def select_versions(config: ModelConfig, available: Sequence[int]) -> list[int]:
    """Apply ``version_policy`` to the version directories found.

    Triton model_config.proto: version_policy. ``latest { num_versions: n }``
    serves the n numerically largest, ``all {}`` every one, ``specific {
    versions }`` those listed that exist (a listed missing one is logged). An
    unset policy means ``latest { num_versions: 1 }``.

    Args:
        config: The model config.
        available: Version directories found (`version_directories`).

    Returns:
        The versions to serve, ascending.

    Raises:
        ConfigError: No version survives the policy.
    """
    found = sorted(set(available))
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        selected = found
    elif choice == "specific":
        wanted = set(policy.specific.versions)
        for missing in sorted(wanted.difference(found)):
            logger.error(
                "version %d of model '%s' is in version_policy.specific but has no directory",
                missing,
                config.name,
            )
        selected = [version for version in found if version in wanted]
    else:
        count = policy.latest.num_versions if choice == "latest" else 1
        selected = found[-count:] if count > 0 else []
    if not selected:
        raise ConfigError(
            "at least one version must be available under the version policy of model "
            f"'{config.name}'",
            model=config.name,
            field="version_policy",
        )
    return selected
