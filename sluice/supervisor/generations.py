"""A loaded model's instances, one generation per load: start, wait, retire, forget.

Each load of a model is a generation: its instances get their own names (the
generation suffix) and the config they start with under its own key, so that a reload
starts new instances beside the old ones. The :class:`Generations` here starts a
generation's instances, waits until they report READY, retires versions (UNLOADING,
drain the streams, stop the instances, answer what is left) and drops the Redis records
of a replaced generation. Instance states and their transitions: ``broker.states``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from tritonclient.grpc.model_config_pb2 import ModelConfig, ModelInstanceGroup

from sluice.broker.codec import CodecError, decode_request, encode_response
from sluice.broker.consumer import ensure_group
from sluice.broker.keys import WORKER_GROUP, KeySchema
from sluice.broker.messages import ErrorInfo, InferResponseMessage
from sluice.broker.model_store import ModelStore, VersionState
from sluice.broker.producer import PAYLOAD_FIELD
from sluice.broker.requeue import move_left_behind
from sluice.broker.scheduling import stream_layout
from sluice.broker.states import RETIRED_HOLDING, InstanceState, ModelState
from sluice.broker.stats_store import fold_stats_shards
from sluice.gpu_workers.processes import Instance, Spawner, generation_suffix, terminate
from sluice.repository import ModelSource

logger = logging.getLogger(__name__)

_KIND_NAMES = {
    ModelInstanceGroup.KIND_CPU: "CPU",
    ModelInstanceGroup.KIND_GPU: "GPU",
    ModelInstanceGroup.KIND_MODEL: "MODEL",
}

#: how long after marking a version UNLOADING before draining it, in s: longer than a
#: gateway reuses a cached model view (``GatewaySettings.model_cache_s``, 0.5 s).
ADMISSION_SETTLE_S = 1.0


@dataclass(slots=True)
class LoadedModel:
    """A model whose instances run."""

    name: str
    source: ModelSource
    fingerprint: str
    config: ModelConfig
    generation: int
    versions: dict[int, list[Instance]] = field(default_factory=dict)
    overridden: bool = False
    temp_dir: Path | None = None
    #: when the load began (``time.monotonic``, s) and how long it took (s, once READY)
    load_started: float = 0.0
    load_s: float | None = None
    load_id: str = ""


def own_record(info: dict[str, Any], instance: Instance) -> dict[str, Any]:
    """``info`` when the instance's running process wrote it (its pid), else empty."""
    process = instance.process
    if process is None:
        return info
    try:
        return info if int(info.get("pid", -1)) == process.pid else {}
    except (TypeError, ValueError):
        return {}


class Generations:
    """Starts, awaits and stops the instances of loaded models' generations.

    Args:
        client: the supervisor's Redis client.
        keys: the key schema.
        store: the model records in Redis.
        spawner: starts worker processes.
        load_timeout_s: longest wait for a version's instances to be READY.
        drain_timeout_s: longest drain of a retired version's streams, and longest
            wait for its instances to exit (``--exit-timeout-secs``).
        start_instances: False: start no instance process (``sluice serve
            --start-instances=false``): a version is published READY at once and served
            by ``sluice worker`` processes started apart (containers).
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: KeySchema,
        store: ModelStore,
        spawner: Spawner,
        load_timeout_s: float,
        drain_timeout_s: float,
        start_instances: bool = True,
    ) -> None:
        self._redis = client
        self._keys = keys
        self._store = store
        self._spawner = spawner
        self._load_timeout_s = load_timeout_s
        self._drain_timeout_s = drain_timeout_s
        self._start_instances = start_instances

    def ensure_groups(self, name: str, version: int, config: ModelConfig) -> None:
        """Create the consumer group (and stream) of every priority level of a version."""
        layout = stream_layout(self._keys, name, version, config)
        for stream in layout.streams():
            ensure_group(self._redis, stream)

    def start_version(self, model: LoadedModel, version: int, config_key: str) -> list[Instance]:
        """Start the instances of ``version`` that the config's instance groups ask for
        (none with ``start_instances`` False)."""
        if not self._start_instances:
            return []
        suffix = generation_suffix(model.generation)
        instances: list[Instance] = []
        for group in model.config.instance_group:
            kind = _KIND_NAMES.get(group.kind, "CPU")
            devices = list(group.gpus) if kind == "GPU" else [0]
            for device in devices:
                for index in range(group.count):
                    gpu = f"_gpu{device}" if kind == "GPU" else ""
                    instance = Instance(
                        model.name,
                        version,
                        f"{group.name}_{index}{gpu}{suffix}",
                        kind,
                        device,
                        model.source.path,
                        config_key,
                        model.generation,
                        model.load_id,
                        ordinal=len(instances),
                    )
                    self._spawner.start_instance(instance)
                    instances.append(instance)
        return instances

    def await_ready(self, instances: list[Instance], stopping: Callable[[], bool]) -> str | None:
        """Wait until every instance reports READY; the failure reason otherwise
        ("server exiting" once ``stopping()`` is true).

        Only a record written by the instance's own process counts (its ``pid``): an
        earlier process under the same name that died without a last word (SIGKILL while
        its version unloaded) left its READY or UNAVAILABLE record behind, which must
        neither publish a load before any instance is up nor fail it.
        """
        if not instances:
            return None
        model, version = instances[0].model, instances[0].version
        deadline = time.monotonic() + self._load_timeout_s
        while time.monotonic() < deadline and not stopping():
            records = self._store.instances(model, version)
            states = {i.name: own_record(records.get(i.name, {}), i) for i in instances}
            for instance in instances:
                info = states[instance.name]
                if info.get("state") == InstanceState.UNAVAILABLE:
                    return info.get("reason") or "instance failed to load"
                process = instance.process
                if (
                    process is not None
                    and process.poll() is not None
                    and info.get("state") != InstanceState.READY
                ):
                    return (
                        f"instance '{instance.name}' exited with code "
                        f"{process.returncode} while loading"
                    )
            if all(states[i.name].get("state") == InstanceState.READY for i in instances):
                return None
            time.sleep(0.05)
        if stopping():
            return "server exiting"
        return f"model '{model}' version {version} did not load within {self._load_timeout_s:.0f}s"

    def forget(self, previous: LoadedModel) -> None:
        """Drop the Redis records of a replaced generation (nothing grows with reloads).

        An instance of it that still owns pending entries (SIGKILLed, or stopped past the
        drain timeout, with requests read and not answered) keeps a record in state
        STOPPED with reason :data:`RETIRED_HOLDING` instead: the live instances'
        recovery claims its entries at once and then drops the record
        (:meth:`gpu_workers.liveness.Liveness.recover`), so no accepted request waits
        for its deadline.
        """
        self._redis.delete(self._keys.staged_config(previous.name, previous.generation))
        for version, instances in previous.versions.items():
            names = [i.name for i in instances]
            if not names:
                continue
            layout = stream_layout(self._keys, previous.name, version, previous.config)
            holding = self.pending_owners(layout.streams()) & set(names)
            for name in holding:
                logger.warning(
                    "instance '%s' of model '%s' left requests pending; live instances take them",
                    name,
                    previous.name,
                )
                self._store.set_instance(
                    previous.name,
                    version,
                    name,
                    {"state": InstanceState.STOPPED, "reason": RETIRED_HOLDING},
                )
            gone = [n for n in names if n not in holding]
            if gone:
                self._store.forget_instances(previous.name, version, gone)
            fold_stats_shards(self._redis, self._keys, previous.name, version, names)

    def requeue_left_behind(
        self, previous: LoadedModel, model: LoadedModel, published_at: float
    ) -> None:
        """After a reload whose queue layout changed (``queue_shards``, priority levels)
        and once the old instances have stopped: move what is still queued on streams
        the new layout lacks onto its streams (``broker.requeue``), after the gateways
        stopped queueing there (:data:`ADMISSION_SETTLE_S` after ``published_at``, a
        ``time.monotonic()`` value)."""
        pairs = []
        for version in model.versions:
            if version not in previous.versions:
                continue
            old = stream_layout(self._keys, previous.name, version, previous.config)
            new = stream_layout(self._keys, model.name, version, model.config)
            if not set(old.streams()) <= set(new.streams()):
                pairs.append((old, new))
        if not pairs:
            return
        time.sleep(max(0.0, published_at + ADMISSION_SETTLE_S - time.monotonic()))
        for old, new in pairs:
            move_left_behind(self._redis, old, new)

    def pending_owners(self, streams: Sequence[str]) -> set[str]:
        """Consumers that own pending (read, not acknowledged) entries of ``streams``."""
        owners: set[str] = set()
        for stream in streams:
            try:
                summary = self._redis.xpending(stream, WORKER_GROUP)
            except redis.exceptions.ResponseError:  # no stream or group (never read)
                continue
            for consumer in summary.get("consumers") or ():
                if int(consumer.get("pending", 0)) > 0:
                    name = consumer.get("name")
                    owners.add(name.decode() if isinstance(name, bytes) else str(name))
        return owners

    def retire(self, model: LoadedModel, versions: Sequence[int], drain: bool) -> None:
        """UNLOADING → drain the streams → stop instances → answer leftovers → UNAVAILABLE."""
        if not versions:
            return
        for version in versions:
            # the load id stays: an instance of this load started again while the version
            # drains takes what is queued (gpu_workers.main._await_publication)
            self._store.set_state(
                model.name,
                version,
                VersionState(ModelState.UNLOADING, "unloading", load_id=model.load_id),
            )
        layouts = [stream_layout(self._keys, model.name, v, model.config) for v in versions]
        if drain:
            time.sleep(ADMISSION_SETTLE_S)
            deadline = time.monotonic() + self._drain_timeout_s
            restarted: set[str] = set()
            while time.monotonic() < deadline and any(
                self._redis.xlen(s) for layout in layouts for s in layout.streams()
            ):
                self._restart_dead_once(model, versions, restarted)
                time.sleep(0.05)
        procs = [i.process for v in versions for i in model.versions.get(v, []) if i.process]
        terminate(procs, self._drain_timeout_s)
        for version in versions:
            names = [i.name for i in model.versions.get(version, [])]
            fold_stats_shards(self._redis, self._keys, model.name, version, names)
        for layout in layouts:
            for stream in layout.streams():
                self._fail_leftovers(stream, model.name)
        for version in versions:
            self._store.set_state(
                model.name, version, VersionState(ModelState.UNAVAILABLE, "unloaded")
            )
            model.versions.pop(version, None)

    def _restart_dead_once(
        self, model: LoadedModel, versions: Sequence[int], restarted: set[str]
    ) -> None:
        """Start again, once per drain (``restarted`` holds the names), an instance of
        ``versions`` that died (SIGKILL, out of memory): the supervisor restarts none
        while a command runs, and what it held or what is queued must run rather than
        fail at the drain's end."""
        dead = [
            instance
            for version in versions
            for instance in model.versions.get(version, [])
            if instance.process is not None
            and instance.process.poll() is not None
            and instance.name not in restarted
        ]
        for instance in dead:
            restarted.add(instance.name)
            logger.warning(
                "instance '%s' of model '%s' exited while the version drains; "
                "starting it again to run what is queued",
                instance.name,
                model.name,
            )
            self._spawner.start_instance(instance)

    def _fail_leftovers(self, stream: str, model: str) -> None:
        """Answer every request still in ``stream`` with UNAVAILABLE and delete it."""
        entries = self._redis.xrange(stream, count=10_000)
        if not entries:
            return
        pipe = self._redis.pipeline(transaction=False)
        for entry_id, fields in entries:
            try:
                message = decode_request(fields[PAYLOAD_FIELD])
            except (CodecError, KeyError):
                pipe.xdel(stream, entry_id)
                continue
            reply = InferResponseMessage(
                message.request_id,
                model,
                message.version,
                error=ErrorInfo(
                    "UNAVAILABLE",
                    f"Request for unknown model: '{model}' version {message.version} "
                    "is not at ready state (unloaded)",
                ),
            )
            pipe.rpush(message.reply_to, encode_response(reply))
            pipe.xdel(stream, entry_id)
        pipe.execute()
        logger.warning("answered %d requests left on %s after unload", len(entries), stream)
