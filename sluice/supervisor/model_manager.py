"""Model lifecycle: load, reload without downtime, unload, repository polling.

Triton's model control protocol (PROTOCOL.md 1.8, 5.13), with the state in
Redis so that every gateway answers alike:

* **load** reads the model's directory (or the files and config a load request
  carries), completes its config, and starts the instances of every version the
  version policy selects. A version turns READY once all its instances are.
* **reload** (a load of a model whose files or config changed) starts the new
  instances beside the old ones; only when all are ready is the new config
  published and the old instances stopped (new instances take requests only once
  it is: ``gpu_workers.main._await_publication``). Old instances finish what they hold;
  requests queued in Redis are taken by the new ones — none is dropped. A failed
  reload stops the new instances and leaves the old model serving.
* **unload** marks the versions UNLOADING (gateways stop admitting), waits until
  their streams are empty, stops the instances, and answers anything left with
  an error; the versions end UNAVAILABLE with reason ``unloaded``.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import redis
from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig, ModelInstanceGroup

from sluice.broker.codec import CodecError, decode_request, encode_response
from sluice.broker.consumer import ensure_group
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.keys import WORKER_GROUP, KeySchema
from sluice.broker.messages import ErrorInfo, InferResponseMessage
from sluice.broker.model_store import ModelStore, VersionState
from sluice.broker.producer import PAYLOAD_FIELD
from sluice.broker.scheduling import StreamLayout, scheduling_policy
from sluice.broker.states import RETIRED_HOLDING, InstanceState, ModelState
from sluice.broker.stats_store import fold_stats_shards, reset_version_stats
from sluice.gpu_workers.backends.registry import auto_complete, gpu_available
from sluice.gpu_workers.device import gpu_ids
from sluice.gpu_workers.processes import (
    HAND_OVER_SIGNAL,
    Instance,
    Spawner,
    generation_suffix,
    terminate,
)
from sluice.repository import (
    ModelSource,
    RepositoryError,
    ScanResult,
    config_from_json,
    load_model_config,
    scan_repositories,
    version_directories,
)

logger = logging.getLogger(__name__)

_KIND_NAMES = {
    ModelInstanceGroup.KIND_CPU: "CPU",
    ModelInstanceGroup.KIND_GPU: "GPU",
    ModelInstanceGroup.KIND_MODEL: "MODEL",
}

#: how long after marking a version UNLOADING before draining it, in s: longer than a
#: gateway reuses a cached model view (``GatewaySettings.model_cache_s``, 0.5 s).
ADMISSION_SETTLE_S = 1.0


@dataclass(frozen=True, slots=True)
class ManagerOptions:
    """Repository and load settings (Triton's flag names in comments)."""

    repositories: tuple[Path, ...]  # --model-repository
    strict_model_config: bool = False  # --disable-auto-complete-config
    model_config_name: str | None = None  # --model-config-name
    load_timeout_s: float = 300.0
    drain_timeout_s: float = 30.0  # --exit-timeout-secs


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


def _unsupported_feature(config: ModelConfig) -> str:
    """The first config feature Sluice cannot serve yet ("" when none); refused at load
    rather than accepted and silently ignored."""
    if config.platform == "ensemble" or config.HasField("ensemble_scheduling"):
        return "the ensemble scheduler (platform 'ensemble')"
    if config.HasField("sequence_batching"):
        return "the sequence batcher (sequence_batching)"
    if config.model_transaction_policy.decoupled:
        return "a decoupled model_transaction_policy"
    return ""


class LoadError(SluiceError):
    """A load or unload that failed; ``code`` and message are what the client sees."""


def _own_record(info: dict[str, Any], instance: Instance) -> dict[str, Any]:
    """``info`` when the instance's running process wrote it (its pid), else empty."""
    process = instance.process
    if process is None:
        return info
    try:
        return info if int(info.get("pid", -1)) == process.pid else {}
    except (TypeError, ValueError):
        return {}


class ModelManager:
    """Starts, replaces and stops the instances of models.

    Args:
        options: repository and load settings.
        client: the supervisor's Redis client.
        keys: the key schema.
        spawner: starts worker processes.
    """

    def __init__(
        self, options: ManagerOptions, client: redis.Redis, keys: KeySchema, spawner: Spawner
    ) -> None:
        self.options = options
        self._redis = client
        self._keys = keys
        self._store = ModelStore(client, keys)
        self._spawner = spawner
        self.loaded: dict[str, LoadedModel] = {}
        self._failed: dict[str, str] = {}  # name -> fingerprint of the files that failed
        self.stopping = False

    # -- repository -------------------------------------------------------------------------

    def scan(self) -> ScanResult:
        """Scan the repositories and publish the index (every model directory found)."""
        result = scan_repositories(self.options.repositories)
        found = {name: {"repository": str(src.repository)} for name, src in result.models.items()}
        for name, paths in result.duplicates.items():
            found[name] = {"repository": ",".join(str(p) for p in paths)}
        for name, model in self.loaded.items():
            if model.overridden and name not in found:
                found[name] = {"repository": str(model.source.repository)}
        self._store.register_models(found)
        for name, paths in result.duplicates.items():
            reason = f"model '{name}' appears in more than one model repository: " + ", ".join(
                str(p) for p in paths
            )
            self._store.set_state(name, 1, VersionState(ModelState.UNAVAILABLE, reason))
        return result

    def instances(self) -> Iterator[Instance]:
        """Every instance of every loaded model."""
        for model in self.loaded.values():
            for instances in model.versions.values():
                yield from instances

    def republish(self) -> None:
        """Publish again what Redis lost (it restarted without its data): the repository
        index, and for every loaded model its config, the config its instances start
        with, its versions' consumer groups and READY states. The instances write their
        own records again with their next heartbeat.

        Raises:
            redis.exceptions.RedisError: Redis unreachable.
        """
        self.scan()
        for model in self.loaded.values():
            config_json = json_format.MessageToJson(model.config)
            self._redis.set(self._keys.staged_config(model.name, model.generation), config_json)
            self._store.publish_config(model.name, config_json)
            for version in model.versions:
                self._ensure_groups(model.name, version, model.config)
                self._store.set_state(
                    model.name,
                    version,
                    VersionState(ModelState.READY, load_s=model.load_s, load_id=model.load_id),
                )

    # -- load -------------------------------------------------------------------------------

    def load_many(self, names: Sequence[str]) -> list[str]:
        """Load several models, starting all their instances before waiting for any.

        Returns:
            One ``load failed for model 'm': reason`` line per model that failed.
        """
        scan = self.scan()
        failures: list[str] = []
        started: list[tuple[LoadedModel, list[int]]] = []
        for name in names:
            try:
                model = self._prepare(name, scan, "", {})
                if model is not None:
                    started.append((model, sorted(model.versions)))
            except LoadError as exc:
                failures.append(exc.message)
        for model, _versions in started:
            try:
                self._finish_load(model, previous=None)
            except LoadError as exc:
                failures.append(exc.message)
        return failures

    def load(self, name: str, config_json: str = "", files: dict[str, bytes] | None = None) -> None:
        """Load or reload ``name`` (Triton ``POST /v2/repository/models/{m}/load``).

        Args:
            name: model name.
            config_json: a ``ModelConfig`` JSON to use instead of ``config.pbtxt``.
            files: ``<version>/<path>`` -> content: a complete model directory.

        Raises:
            LoadError: INTERNAL "failed to load 'm', failed to poll from model repository"
                for an unknown model; INVALID_ARG "load failed for model 'm': ..." otherwise.
        """
        scan = self.scan()
        previous = self.loaded.get(name)
        model = self._prepare(name, scan, config_json, files or {})
        if model is None:
            return
        self._finish_load(model, previous)
        if model.temp_dir is not None:
            self.scan()  # a model sent with the request joins the repository index

    def _source(
        self, name: str, scan: ScanResult, files: dict[str, bytes], config_json: str
    ) -> tuple[ModelSource, Path | None]:
        if files:
            if not config_json:
                raise LoadError(
                    ErrorCode.INVALID_ARG,
                    f"load failed for model '{name}': file parameters need the 'config' parameter",
                    model=name,
                )
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

    def _prepare(
        self, name: str, scan: ScanResult, config_json: str, files: dict[str, bytes]
    ) -> LoadedModel | None:
        """Complete the config and start the new instances; None when nothing changed."""
        started = time.monotonic()
        load_id = uuid.uuid4().hex[:16]
        previous = self.loaded.get(name)
        source, temp = self._source(name, scan, files, config_json)
        fingerprint = (
            directory_fingerprint(source.path) + hashlib.sha1(config_json.encode()).hexdigest()
        )
        if previous is not None and previous.fingerprint == fingerprint and not config_json:
            return None  # Triton: a load of an unchanged model is a no-op
        try:
            override = config_from_json(config_json) if config_json else None
            loaded = load_model_config(
                source,
                autocomplete=None if self.options.strict_model_config else auto_complete,
                config_name=self.options.model_config_name,
                gpu_ids=gpu_ids(),
                gpu_backend=gpu_available,
                strict=self.options.strict_model_config,
                config_override=override,
            )
        except (RepositoryError, SluiceError, ValueError) as exc:
            reason = str(exc) or type(exc).__name__
            self._record_failure(name, source, previous, reason, fingerprint)
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)
            raise LoadError(
                ErrorCode.INVALID_ARG, f"load failed for model '{name}': {reason}", model=name
            ) from exc
        unsupported = _unsupported_feature(loaded.config)
        if unsupported:
            reason = f"{unsupported} is not supported by Sluice yet"
            self._record_failure(name, source, previous, reason, fingerprint)
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)
            raise LoadError(
                ErrorCode.INVALID_ARG, f"load failed for model '{name}': {reason}", model=name
            )
        generation = previous.generation + 1 if previous is not None else 1
        model = LoadedModel(
            name,
            source,
            fingerprint,
            loaded.config,
            generation,
            overridden=bool(config_json),
            temp_dir=temp,
            load_started=started,
            load_id=load_id,
        )
        config_key = self._keys.staged_config(name, generation)
        self._redis.set(config_key, json_format.MessageToJson(loaded.config))
        if previous is None:
            self._store.publish_config(name, json_format.MessageToJson(loaded.config))
        for version in loaded.versions:
            if previous is None or version not in previous.versions:
                # a new load starts from zero, as Triton's new model (not a reload of a
                # version that keeps serving meanwhile)
                reset_version_stats(self._redis, self._keys, name, version)
                self._store.set_state(name, version, VersionState(ModelState.LOADING))
            self._ensure_groups(name, version, loaded.config)
            model.versions[version] = self._start_version(model, version, config_key)
        return model

    def _ensure_groups(self, name: str, version: int, config: ModelConfig) -> None:
        """Create the consumer group (and stream) of every priority level of a version."""
        layout = StreamLayout(self._keys, name, version, scheduling_policy(config))
        for stream in layout.streams():
            ensure_group(self._redis, stream)

    def _start_version(self, model: LoadedModel, version: int, config_key: str) -> list[Instance]:
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
                    )
                    self._spawner.start_instance(instance)
                    instances.append(instance)
        return instances

    def _finish_load(self, model: LoadedModel, previous: LoadedModel | None) -> None:
        """Wait for the new instances; publish and retire the old ones, or roll back."""
        reasons = {v: self._await_ready(instances) for v, instances in model.versions.items()}
        failed = {v: r for v, r in reasons.items() if r is not None}
        if failed:
            for instances in model.versions.values():
                terminate([i.process for i in instances if i.process], 10)
            # the next load reuses this generation's instance names: their records (state
            # UNAVAILABLE with this failure's reason) must not answer for the new processes
            self._forget_generation(model)
            reason = next(iter(failed.values())) or "load failed"
            for version in model.versions:
                if previous is None or version not in previous.versions:
                    self._store.set_state(
                        model.name,
                        version,
                        VersionState(ModelState.UNAVAILABLE, failed.get(version) or reason),
                    )
            self._failed[model.name] = model.fingerprint
            if model.temp_dir is not None:
                shutil.rmtree(model.temp_dir, ignore_errors=True)
            raise LoadError(
                ErrorCode.INVALID_ARG,
                f"load failed for model '{model.name}': {reason}",
                model=model.name,
            )
        self._store.publish_config(model.name, json_format.MessageToJson(model.config))
        model.load_s = round(time.monotonic() - model.load_started, 6)
        for version in model.versions:
            self._store.set_state(
                model.name,
                version,
                VersionState(ModelState.READY, load_s=model.load_s, load_id=model.load_id),
            )
            logger.info(
                "model '%s' version %d is READY (%d instances)",
                model.name,
                version,
                len(model.versions[version]),
            )
        self.loaded[model.name] = model
        self._failed.pop(model.name, None)
        if previous is not None:
            gone = [v for v in previous.versions if v not in model.versions]
            self._retire(previous, gone, drain=True)
            kept = {v: i for v, i in previous.versions.items() if v in model.versions}
            for instances in kept.values():
                terminate(
                    [i.process for i in instances if i.process],
                    self.options.drain_timeout_s,
                    HAND_OVER_SIGNAL,
                )
            self._forget_generation(previous)
            if previous.temp_dir is not None and previous.temp_dir != model.temp_dir:
                shutil.rmtree(previous.temp_dir, ignore_errors=True)

    def _forget_generation(self, previous: LoadedModel) -> None:
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
            layout = StreamLayout(
                self._keys, previous.name, version, scheduling_policy(previous.config)
            )
            holding = self._pending_owners(layout.streams()) & set(names)
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

    def died_serving(self, instance: Instance) -> bool:
        """Whether a dead instance had reported READY (its own process, by pid) and still
        owns pending entries: it died running requests (a segfault or ``os._exit`` in the
        model's code, the kernel's out-of-memory kill), not while it started. Such an
        instance is started again at once, as Triton's python_backend restarts a stub
        that died in ``execute``; one that keeps dying on start keeps the supervisor's
        backoff. False when Redis cannot be reached.
        """
        loaded = self.loaded.get(instance.model)
        if loaded is None:
            return False
        try:
            records = self._store.instances(instance.model, instance.version)
            if (
                _own_record(records.get(instance.name, {}), instance).get("state")
                != InstanceState.READY
            ):
                return False
            layout = StreamLayout(
                self._keys, instance.model, instance.version, scheduling_policy(loaded.config)
            )
            return instance.name in self._pending_owners(layout.streams())
        except redis.exceptions.RedisError:
            return False

    def _pending_owners(self, streams: Sequence[str]) -> set[str]:
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

    def _await_ready(self, instances: list[Instance]) -> str | None:
        """Wait until every instance reports READY; the failure reason otherwise.

        Only a record written by the instance's own process counts (its ``pid``): an
        earlier process under the same name that died without a last word (SIGKILL while
        its version unloaded) left its READY or UNAVAILABLE record behind, which must
        neither publish a load before any instance is up nor fail it.
        """
        if not instances:
            return None
        model, version = instances[0].model, instances[0].version
        deadline = time.monotonic() + self.options.load_timeout_s
        while time.monotonic() < deadline and not self.stopping:
            records = self._store.instances(model, version)
            states = {i.name: _own_record(records.get(i.name, {}), i) for i in instances}
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
        if self.stopping:
            return "server exiting"
        return (
            f"model '{model}' version {version} did not load within "
            f"{self.options.load_timeout_s:.0f}s"
        )

    def _record_failure(
        self,
        name: str,
        source: ModelSource,
        previous: LoadedModel | None,
        reason: str,
        fingerprint: str,
    ) -> None:
        logger.error("failed to load model '%s': %s", name, reason)
        self._failed[name] = fingerprint
        if previous is not None:
            return  # a failed reload leaves the old model serving
        for version in version_directories(source.path) or [1]:
            self._store.set_state(name, version, VersionState(ModelState.UNAVAILABLE, reason))

    # -- unload -----------------------------------------------------------------------------

    def unload(self, name: str) -> None:
        """Unload every version of ``name`` (Triton ``.../unload``); no-op if not loaded."""
        model = self.loaded.pop(name, None)
        if model is None:
            return
        self._retire(model, list(model.versions), drain=True)
        if model.temp_dir is not None:
            shutil.rmtree(model.temp_dir, ignore_errors=True)

    def _retire(self, model: LoadedModel, versions: Sequence[int], drain: bool) -> None:
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
        layouts = [
            StreamLayout(self._keys, model.name, v, scheduling_policy(model.config))
            for v in versions
        ]
        if drain:
            time.sleep(ADMISSION_SETTLE_S)
            deadline = time.monotonic() + self.options.drain_timeout_s
            restarted: set[str] = set()
            while time.monotonic() < deadline and any(
                self._redis.xlen(s) for layout in layouts for s in layout.streams()
            ):
                self._restart_dead_once(model, versions, restarted)
                time.sleep(0.05)
        procs = [i.process for v in versions for i in model.versions.get(v, []) if i.process]
        terminate(procs, self.options.drain_timeout_s)
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

    # -- poll mode --------------------------------------------------------------------------

    def poll(self) -> None:
        """Triton poll mode: load new or changed models, unload removed ones."""
        scan = self.scan()
        for name, source in scan.models.items():
            fingerprint = directory_fingerprint(source.path) + hashlib.sha1(b"").hexdigest()
            current = self.loaded.get(name)
            if current is not None and (current.overridden or current.fingerprint == fingerprint):
                continue
            if current is None and self._failed.get(name) == fingerprint:
                continue  # still the files that failed
            if current is not None and self._failed.get(name) == fingerprint:
                continue  # a reload of these files already failed; keep the old one
            try:
                self.load(name)
            except LoadError as exc:
                logger.error("%s", exc.message)
        for name in [
            n for n, m in self.loaded.items() if n not in scan.models and not m.overridden
        ]:
            logger.info("model '%s' left the repository; unloading", name)
            self.unload(name)

    # -- shutdown ---------------------------------------------------------------------------

    def shutdown(self, timeout_s: float) -> None:
        """Mark every version UNLOADING, stop every instance, end UNAVAILABLE ``unloaded``."""
        self.stopping = True
        for model in self.loaded.values():
            for version in model.versions:
                self._store.set_state(
                    model.name, version, VersionState(ModelState.UNLOADING, "server exiting")
                )
        terminate([i.process for i in self.instances() if i.process], timeout_s)
        for model in self.loaded.values():
            for version in model.versions:
                self._store.set_state(
                    model.name, version, VersionState(ModelState.UNAVAILABLE, "unloaded")
                )
            if model.temp_dir is not None:
                shutil.rmtree(model.temp_dir, ignore_errors=True)
