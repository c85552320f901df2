"""Model states, effective configs and the repository index, as kept in Redis.

Every gateway answers readiness, metadata and config from here, so all of them
answer alike; the supervisor and the workers write it. State names are
Triton's (``ModelReadyState``: UNKNOWN, READY, UNAVAILABLE, LOADING, UNLOADING).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from sluice.broker.keys import KeySchema
from sluice.broker.states import InstanceState, ModelState


@dataclass(frozen=True, slots=True)
class VersionState:
    """State of one model version and why it is in it (``reason`` may be empty);
    ``load_s``: how long its last load took, in s, once READY (Triton's
    ``nv_model_load_duration_secs``; None before); ``load_id``: names that load (new for
    every load, reload and server start; the response cache keys on it, so an answer of
    an older load of the model is never served)."""

    state: ModelState
    reason: str = ""
    load_s: float | None = None
    load_id: str = ""

    def to_json(self) -> str:
        data: dict[str, object] = {"state": self.state.value, "reason": self.reason}
        if self.load_s is not None:
            data["load_s"] = self.load_s
        if self.load_id:
            data["load_id"] = self.load_id
        return json.dumps(data)

    @classmethod
    def from_json(cls, raw: bytes | str) -> VersionState:
        data = json.loads(raw)
        load_s = data.get("load_s")
        return cls(
            ModelState(data["state"]),
            data.get("reason", ""),
            float(load_s) if isinstance(load_s, int | float) else None,
            str(data.get("load_id", "")),
        )


@dataclass(frozen=True, slots=True)
class ModelRecord:
    """What Redis holds about one model.

    Attributes:
        name: model name.
        config_json: the effective config as protobuf JSON text ("" if never loaded).
        versions: version -> state, for every version that ever had a state.
    """

    name: str
    config_json: str
    versions: dict[int, VersionState]

    @property
    def is_ensemble(self) -> bool:
        """Whether the config is an ensemble's (it has no instances of its own)."""
        return (
            '"ensemble"' in self.config_json
            and json.loads(self.config_json).get("platform") == "ensemble"
        )


def _decode_versions(raw: dict[bytes, bytes]) -> dict[int, VersionState]:
    return {int(k): VersionState.from_json(v) for k, v in raw.items()}


class ModelStore:
    """Synchronous access, for the supervisor and the workers."""

    def __init__(self, client: redis.Redis, keys: KeySchema) -> None:
        self._redis = client
        self._keys = keys

    def register_models(self, found: dict[str, dict[str, Any]]) -> None:
        """Replace the repository index with ``found`` (name -> where it lives)."""
        key = self._keys.models()
        pipe = self._redis.pipeline()
        pipe.delete(key)
        if found:
            pipe.hset(key, mapping={n: json.dumps(v) for n, v in found.items()})
        pipe.execute()

    def publish_config(self, model: str, config_json: str) -> None:
        """Store the effective config of ``model`` (protobuf JSON text)."""
        self._redis.set(self._keys.config(model), config_json)

    def set_state(self, model: str, version: int, state: VersionState) -> None:
        """Record the state of one version."""
        self._redis.hset(self._keys.state(model), str(version), state.to_json())

    def get(self, model: str) -> ModelRecord:
        """Config and version states of ``model`` (empty if Redis knows nothing)."""
        pipe = self._redis.pipeline()
        pipe.get(self._keys.config(model))
        pipe.hgetall(self._keys.state(model))
        config, states = pipe.execute()
        return ModelRecord(model, (config or b"").decode(), _decode_versions(states))

    def version_state(self, model: str, version: int) -> VersionState | None:
        """The state of one version (None if Redis has none), without the config."""
        raw = self._redis.hget(self._keys.state(model), str(version))
        return None if raw is None else VersionState.from_json(raw)

    def set_instance(self, model: str, version: int, instance: str, info: dict[str, Any]) -> None:
        """Record the state of one model instance (a worker process)."""
        self._redis.hset(self._keys.instances(model, version), instance, json.dumps(info))

    def instances(self, model: str, version: int) -> dict[str, dict[str, Any]]:
        """Instance name -> info for one model version."""
        raw = self._redis.hgetall(self._keys.instances(model, version))
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    def forget_instances(self, model: str, version: int, names: list[str]) -> None:
        """Remove the records of instances that no longer run."""
        self._redis.hdel(self._keys.instances(model, version), *names)

    def set_server(self, **fields: str) -> None:
        """Set server-wide facts (e.g. ``startup="done"``)."""
        self._redis.hset(self._keys.server(), mapping=fields)


#: an instance whose heartbeat is older than this is not live (the workers' default
#: ``--stale-instance-secs``; they beat every second), in ns.
LIVE_HEARTBEAT_NS = 5_000_000_000


def count_live(raw: dict[bytes, bytes], now_ns: int) -> tuple[dict[str, str], int]:
    """States of a version's instances hash (``HGETALL``) and how many are live.

    Live: state READY and a heartbeat no older than :data:`LIVE_HEARTBEAT_NS`.
    """
    states: dict[str, str] = {}
    live = 0
    for name, info_raw in raw.items():
        try:
            info = json.loads(info_raw)
        except ValueError:
            continue
        states[name.decode()] = str(info.get("state", ModelState.UNKNOWN))
        beat = int(info.get("heartbeat_ns", 0) or 0)
        if info.get("state") == InstanceState.READY and beat and now_ns - beat <= LIVE_HEARTBEAT_NS:
            live += 1
    return states, live


class AsyncModelStore:
    """Asynchronous read access, for the gateways."""

    def __init__(self, client: redis.asyncio.Redis, keys: KeySchema) -> None:
        self._redis = client
        self._keys = keys

    async def model_names(self) -> list[str]:
        """Names of every model found in the repositories, sorted."""
        names = await self._redis.hkeys(self._keys.models())
        return sorted(n.decode() for n in names)

    async def get(self, model: str) -> ModelRecord:
        """Config and version states of ``model`` in one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(self._keys.config(model))
            pipe.hgetall(self._keys.state(model))
            config, states = await pipe.execute()
        return ModelRecord(model, (config or b"").decode(), _decode_versions(states))

    async def live_instances(self, model: str, version: int) -> int:
        """How many instances of the version are live now (:func:`count_live`)."""
        raw = await self._redis.hgetall(self._keys.instances(model, version))
        return count_live(raw, time.time_ns())[1]

    async def server(self) -> dict[str, str]:
        """Server-wide facts."""
        raw = await self._redis.hgetall(self._keys.server())
        return {k.decode(): v.decode() for k, v in raw.items()}
