"""Health and readiness: server live and ready, model ready (HTTP ``/v2/health/*`` and
``/v2/models/{m}[/versions/{v}]/ready``, gRPC ``ServerLive`` / ``ServerReady`` /
``ModelReady`` and ``grpc.health.v1.Health``).

Rules: docs/reference/http-protocol.md (Health and readiness); Triton ``src/http_server.cc``
(``HandleServerHealth``, ``HandleModelReady``) and ``src/grpc/grpc_server.cc``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import redis.exceptions

from sluice.api.handlers.shutdown import Shutdown
from sluice.api.models import ModelRegistry
from sluice.api.settings import GatewaySettings
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.states import ModelState

__all__ = ["HEALTH_DEADLINE_S", "Health"]

#: longest wait of a health check (live, ready) on Redis, in s: Kubernetes probes time
#: out after 1 s by default, the Redis socket timeout is 15 s.
HEALTH_DEADLINE_S = 2.0


class Health:
    """Liveness and readiness of the server and its models.

    Args:
        settings: the gateway settings (``strict_readiness``).
        registry: cached model views.
        shutdown: the gateway's shutdown state.
    """

    def __init__(
        self, settings: GatewaySettings, registry: ModelRegistry, shutdown: Shutdown
    ) -> None:
        self._settings = settings
        self._registry = registry
        self._shutdown = shutdown

    async def server_live(self) -> bool:
        """Liveness: this gateway serves (its event loop answers) and is not stopping.

        Redis is not asked: Triton's live depends on nothing but the server itself (200
        once initialized). A Redis outage makes the server and its models not ready, and a
        liveness probe that restarted every gateway for it would not bring Redis back.
        """
        return not self._shutdown.exiting

    async def any_instance_live(self) -> bool:
        """Whether some instance of some model version has a fresh heartbeat (one that
        may still answer a request in flight).

        Raises:
            redis.exceptions.RedisError: Redis unreachable.
        """
        for record in await self._registry.records():
            for version in record.versions:
                if await self._registry.live_instances(record.name, version):
                    return True
        return False

    async def server_ready(self) -> bool:
        """Readiness (Triton ``--strict-readiness``): start-up done and every model READY.

        A version UNAVAILABLE with reason ``unloaded`` does not count against readiness;
        a READY version with no live instance (every heartbeat stale, e.g. the
        supervisor was killed) does. Not ready when Redis does not answer within
        :data:`HEALTH_DEADLINE_S`.
        """
        return await _probe(self._ready())

    async def _ready(self) -> bool:
        facts = await self._registry.server_facts()
        if facts.get("startup") != "done":
            return False
        if not self._settings.strict_readiness:
            return True
        for record in await self._registry.records():
            for version, state in record.versions.items():
                if state.state is ModelState.READY:
                    if record.is_ensemble:
                        continue  # no instances of its own
                    if not await self._registry.live_instances(record.name, version):
                        return False  # READY on record, but no instance answers
                    continue
                if state.state is ModelState.UNAVAILABLE and state.reason == "unloaded":
                    continue
                return False
        return True

    async def model_ready(self, model: str, version: int | None) -> bool:
        """Whether the model (version) is READY in Redis (not only in the gateway's
        cache) and has a live instance now; False when Redis does not answer within
        :data:`HEALTH_DEADLINE_S` (a probe, like the server's).

        Raises:
            SluiceError: from model resolution (NOT_FOUND unknown, UNAVAILABLE loading or
                unloaded); the HTTP endpoint answers them all "not ready", as Triton's.
        """

        async def check() -> bool:
            view, resolved = await self._registry.resolve(model, version, fresh=True)
            return await self._registry.serving(view, resolved)

        return await _probe(check())

    async def model_readiness(self, model: str, version: int | None) -> bool:
        """gRPC ``ModelReady``: an unknown model or version raises, a known one answers
        (READY in Redis with a live instance; False when Redis does not answer within
        :data:`HEALTH_DEADLINE_S`).

        Raises:
            SluiceError: NOT_FOUND for a model that never loaded or a version it
                does not have (the gRPC servicer answers it ``ready: false``, as Triton
                does).
        """

        async def check() -> bool:
            view = await self._registry.get(model, fresh=True)
            if version is not None and version not in view.versions:
                raise SluiceError(
                    ErrorCode.NOT_FOUND,
                    f"Request for unknown model: '{model}' version {version} is not found",
                    model=model,
                )
            try:
                resolved = view.resolve(version)
            except SluiceError:
                return False
            return await self._registry.serving(view, resolved)

        return await _probe(check())


async def _probe(check: Coroutine[Any, Any, bool]) -> bool:
    """Run a health or readiness ``check`` within :data:`HEALTH_DEADLINE_S`; Redis
    failing, unreachable or silent means not live / not ready (a probe gets its answer
    in time, not after the Redis socket timeout). Other errors (``SluiceError``:
    unknown model, ...) are raised."""
    try:
        async with asyncio.timeout(HEALTH_DEADLINE_S):
            return await check
    except (TimeoutError, redis.exceptions.RedisError):
        return False
