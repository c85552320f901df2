"""Statistics extension: per-version request statistics, read from Redis.

Body shape: docs/reference/http-protocol.md (Statistics extension); Triton
``src/http_server.cc`` (``HandleModelStats``). Every process counts into the
version's statistics hash in Redis (``broker.stats_store``); this reads them.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio

from sluice.api.models import ModelRegistry
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.keys import KeySchema
from sluice.broker.states import ModelState
from sluice.broker.stats_store import read_stats, triton_model_stats

__all__ = ["Statistics"]


class Statistics:
    """Statistics of READY model versions.

    Args:
        client: the gateway's Redis client.
        keys: the deployment's key schema.
        registry: cached model views.
    """

    def __init__(
        self, client: redis.asyncio.Redis, keys: KeySchema, registry: ModelRegistry
    ) -> None:
        self._redis = client
        self._keys = keys
        self._registry = registry

    async def model_statistics(self, model: str | None, version: int | None) -> dict[str, Any]:
        """``{"model_stats": [...]}`` of every READY version of every model (``model``
        None), of one model, or of one version.

        Raises:
            SluiceError: INVALID_ARG "requested model 'm' is not available" /
                "requested model version is not available for model 'm'" (Triton's texts).
        """
        targets: list[tuple[str, int]] = []
        if model is None:
            for record in await self._registry.records():
                targets.extend(
                    (record.name, v)
                    for v, s in sorted(record.versions.items())
                    if s.state is ModelState.READY
                )
        else:
            try:
                view = await self._registry.get(model)
            except SluiceError:
                view = None
            ready = view.ready_versions() if view is not None else []
            if not ready:
                raise SluiceError(
                    ErrorCode.INVALID_ARG,
                    f"requested model '{model}' is not available",
                    model=model,
                )
            if version is not None and version not in ready:
                raise SluiceError(
                    ErrorCode.INVALID_ARG,
                    f"requested model version is not available for model '{model}'",
                    model=model,
                )
            targets = [(model, v) for v in ([version] if version is not None else ready)]
        stats = await read_stats(self._redis, self._keys, targets)
        return {
            "model_stats": [
                triton_model_stats(name, v, s) for (name, v), s in zip(targets, stats, strict=True)
            ]
        }
