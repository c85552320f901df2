"""The gateway's view of the served models, read from Redis and cached briefly.

Model and version resolution follow Triton (docs/reference/model-configuration.md,
Version policy; docs/reference/errors.md for the texts): a
request without a version goes to the highest-numbered READY version.
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.batching import DynamicBatchingPolicy
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.model_store import AsyncModelStore, ModelRecord, VersionState
from sluice.broker.request_checks import TensorSpec, tensor_spec
from sluice.broker.scheduling import scheduling_policy
from sluice.broker.sequences import SequenceRules
from sluice.broker.states import ModelState
from sluice.repository.ensemble import EnsemblePlan, is_ensemble_config, plan_ensemble
from sluice.repository.render import config_to_json


@dataclass(frozen=True, slots=True)
class ModelView:
    """Everything a gateway needs to admit a request for one model."""

    name: str
    config: ModelConfig
    config_json: dict[str, Any]
    versions: dict[int, VersionState]
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    policy: DynamicBatchingPolicy
    ready: tuple[int, ...] = ()
    fetched_at: float = field(default=0.0, compare=False)
    max_batch_size: int = 0
    """Triton model_config.proto ``max_batch_size`` (0 = no batch dimension)."""
    platform: str = ""
    """Metadata ``platform``: the config's platform, else its backend."""
    decoupled: bool = False
    """Triton ``model_transaction_policy.decoupled``."""
    sequence: SequenceRules | None = None
    """The sequence batcher's request rules (None: no ``sequence_batching``)."""
    ensemble: EnsemblePlan | None = None
    """The steps of an ensemble (None: not an ensemble); checked when it loaded."""

    def ready_versions(self) -> list[int]:
        """Versions in state READY, ascending."""
        return list(self.ready)

    def resolve(self, version: int | None) -> int:
        """The version a request for ``version`` (None = policy default) runs on.

        Raises:
            SluiceError: NOT_FOUND for a version the model does not have or, with
                ``version`` None, none READY; UNAVAILABLE "is not at ready state" for a
                version it has that is not READY (loading, unloading, unloaded, failed).
                Triton core ``ModelLifeCycle::GetModel``: a version in its map answers
                UNAVAILABLE unless READY; an unloaded version stays in the map (the
                repository index lists it UNAVAILABLE).
        """
        if version is None:
            ready = self.ready_versions()
            if not ready:
                raise SluiceError(
                    ErrorCode.NOT_FOUND,
                    f"Request for unknown model: '{self.name}' has no available versions",
                    model=self.name,
                )
            return ready[-1]
        state = self.versions.get(version)
        if state is None:
            raise SluiceError(
                ErrorCode.NOT_FOUND,
                f"Request for unknown model: '{self.name}' version {version} is not found",
                model=self.name,
            )
        if state.state is not ModelState.READY:
            raise SluiceError(
                ErrorCode.UNAVAILABLE,
                f"Request for unknown model: '{self.name}' version {version} is not at ready state",
                model=self.name,
            )
        return version


def build_view(record: ModelRecord) -> ModelView:
    """Turn what Redis holds into a :class:`ModelView`."""
    config = json_format.Parse(record.config_json, ModelConfig())
    return ModelView(
        name=record.name,
        config=config,
        config_json=config_to_json(config),
        versions=record.versions,
        inputs={t.name: tensor_spec(t) for t in config.input},
        outputs={t.name: tensor_spec(t) for t in config.output},
        policy=scheduling_policy(config),
        ready=tuple(sorted(v for v, s in record.versions.items() if s.state is ModelState.READY)),
        fetched_at=time.monotonic(),
        max_batch_size=int(config.max_batch_size),
        platform=config.platform or config.backend,
        decoupled=bool(config.model_transaction_policy.decoupled),
        sequence=SequenceRules.from_config(config),
        ensemble=plan_ensemble(config) if is_ensemble_config(config) else None,
    )


class ModelRegistry:
    """Cached model views of one gateway.

    Args:
        store: read access to the model records in Redis.
        cache_s: how long a view is reused before Redis is read again, in seconds.
    """

    def __init__(self, store: AsyncModelStore, cache_s: float) -> None:
        self._store = store
        self._cache_s = cache_s
        self._views: dict[str, ModelView] = {}
        #: model name -> the Redis read in flight for it
        self._fetching: dict[str, asyncio.Future[ModelView]] = {}

    async def get(self, name: str, fresh: bool = False) -> ModelView:
        """The view of model ``name``; concurrent callers share one Redis read.

        Args:
            name: the model.
            fresh: read Redis even when a cached view is fresh enough (readiness
                probes: a model Redis no longer knows is not ready, whatever the cache
                says).

        Raises:
            SluiceError: NOT_FOUND "Request for unknown model: 'm' is not found" when
                the model never loaded, "... has no available versions" when its load
                failed (Triton's texts).
        """
        view = None if fresh else self.cached(name)
        if view is not None:
            return view
        fetch = self._fetching.get(name)
        if fetch is None:
            fetch = asyncio.ensure_future(self._fetch(name))
            self._fetching[name] = fetch
            fetch.add_done_callback(functools.partial(self._fetched, name))
        return await asyncio.shield(fetch)

    def _fetched(self, name: str, fetch: asyncio.Future[ModelView]) -> None:
        if self._fetching.get(name) is fetch:
            del self._fetching[name]
        if not fetch.cancelled():
            fetch.exception()  # retrieved: its waiters may all have been cancelled

    async def _fetch(self, name: str) -> ModelView:
        record = await self._store.get(name)
        if not record.config_json or not record.versions:
            self._views.pop(name, None)
            # Triton: a model whose load failed has versions (UNAVAILABLE) and answers
            # "has no available versions"; one never loaded is "not found"
            raise SluiceError(
                ErrorCode.NOT_FOUND,
                f"Request for unknown model: '{name}' "
                + ("has no available versions" if record.versions else "is not found"),
                model=name,
            )
        view = build_view(record)
        self._views[name] = view
        return view

    def cached(self, name: str) -> ModelView | None:
        """The view of ``name`` when cached and fresh, else None (no Redis read)."""
        view = self._views.get(name)
        if view is not None and time.monotonic() - view.fetched_at < self._cache_s:
            return view
        return None

    def invalidate(self, name: str) -> None:
        """Forget the cached view of ``name`` (after a load or unload through this gateway)."""
        self._views.pop(name, None)
        self._fetching.pop(name, None)

    async def resolve(
        self, name: str, version: int | None, fresh: bool = False
    ) -> tuple[ModelView, int]:
        """The view of ``name`` and the version a request runs on (:meth:`ModelView.resolve`;
        ``fresh`` as :meth:`get`)."""
        view = await self.get(name, fresh)
        return view, view.resolve(version)

    async def records(self) -> list[ModelRecord]:
        """Every model found in the repositories with its states (uncached)."""
        return [await self._store.get(name) for name in await self._store.model_names()]

    async def live_instances(self, name: str, version: int) -> int:
        """Live instances of a version (fresh heartbeat, uncached)."""
        return await self._store.live_instances(name, version)

    async def serving(self, view: ModelView, version: int) -> bool:
        """Whether a READY version can answer: it has a live instance, or it is an
        ensemble (which has none; its steps go to the composing models)."""
        return view.ensemble is not None or await self.live_instances(view.name, version) > 0

    async def server_facts(self) -> dict[str, str]:
        """Server-wide facts the supervisor published (startup phase, control mode)."""
        return await self._store.server()
