"""Model lifecycle: load, reload without downtime, unload, repository polling.

Triton's model control protocol (docs/reference/model-configuration.md, "Model control
modes"; docs/reference/http-protocol.md for the repository endpoints), with the state
in Redis so that every gateway answers alike:

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

Where a load's files come from: :mod:`sluice.supervisor.model_source`; starting,
awaiting and retiring a generation's instances: :mod:`sluice.supervisor.generations`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import redis
from google.protobuf import json_format

from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.keys import KeySchema
from sluice.broker.model_store import ModelStore, VersionState
from sluice.broker.scheduling import stream_layout
from sluice.broker.states import InstanceState, ModelState
from sluice.broker.stats_store import reset_version_stats
from sluice.gpu_workers.backends.registry import auto_complete, gpu_available
from sluice.gpu_workers.device import gpu_ids
from sluice.gpu_workers.processes import HAND_OVER_SIGNAL, Instance, Spawner, terminate
from sluice.repository import (
    ModelSource,
    RepositoryError,
    ScanResult,
    config_from_json,
    load_model_config,
    scan_repositories,
    version_directories,
)
from sluice.repository.ensemble import is_ensemble_config
from sluice.supervisor.ensembles import Deferred, EnsembleLoads
from sluice.supervisor.generations import Generations, LoadedModel, own_record
from sluice.supervisor.model_source import (
    LoadError,
    discard,
    duplicate_reason,
    repository_index,
    source_fingerprint,
    stage_source,
    unsupported_feature,
)
from sluice.supervisor.removed_versions import mark_removed_versions

__all__ = ["LoadError", "LoadedModel", "ManagerOptions", "ModelManager"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ManagerOptions:
    """Repository and load settings (Triton's flag names in comments)."""

    repositories: tuple[Path, ...]  # --model-repository
    strict_model_config: bool = False  # --disable-auto-complete-config
    model_config_name: str | None = None  # --model-config-name
    load_timeout_s: float = 300.0
    drain_timeout_s: float = 30.0  # --exit-timeout-secs
    start_instances: bool = True  # False: no instance processes (`sluice worker`s apart)


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
        self._generations = Generations(
            client, keys, self._store, spawner, options.load_timeout_s, options.drain_timeout_s,
            options.start_instances,
        )  # fmt: skip
        self.loaded: dict[str, LoadedModel] = {}
        self._failed: dict[str, str] = {}  # name -> fingerprint of the files that failed
        self._ensembles = EnsembleLoads(self.loaded)
        self.stopping = False

    # -- repository -------------------------------------------------------------------------

    def scan(self) -> ScanResult:
        """Scan the repositories and publish the index (every model directory found)."""
        result = scan_repositories(self.options.repositories)
        overridden = {name: m.source for name, m in self.loaded.items() if m.overridden}
        self._store.register_models(repository_index(result, overridden))
        for name, paths in result.duplicates.items():
            reason = duplicate_reason(name, paths)
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
                if not is_ensemble_config(model.config):
                    self._generations.ensure_groups(model.name, version, model.config)
                self._store.set_state(
                    model.name,
                    version,
                    VersionState(ModelState.READY, load_s=model.load_s, load_id=model.load_id),
                )

    # -- load -------------------------------------------------------------------------------

    def load_many(self, names: Sequence[str]) -> list[str]:
        """Load several models, starting all their instances before waiting for any;
        ensembles after the others (their steps are checked against those configs).

        Returns:
            One ``load failed for model 'm': reason`` line per model that failed.
        """
        scan = self.scan()
        failures: list[str] = []
        started: list[tuple[LoadedModel, list[int]]] = []
        deferred: list[str] = []
        self._ensembles.explicit.update(names)
        self._ensembles.defer = True
        try:
            for name in names:
                try:
                    model = self._prepare(name, scan, "", {})
                    if model is not None:
                        started.append((model, sorted(model.versions)))
                except Deferred:
                    deferred.append(name)
                except LoadError as exc:
                    failures.append(exc.message)
        finally:
            self._ensembles.defer = False
        for model, _versions in started:
            try:
                self._finish_load(model, previous=None)
            except LoadError as exc:
                failures.append(exc.message)
        for name in deferred:
            if name in self.loaded:
                continue  # loaded meanwhile as another ensemble's step
            try:
                self.load(name)
            except LoadError as exc:
                failures.append(exc.message)
        return failures

    def load(
        self,
        name: str,
        config_json: str = "",
        files: dict[str, bytes] | None = None,
        explicit: bool = True,
    ) -> None:
        """Load or reload ``name`` (Triton ``POST /v2/repository/models/{m}/load``).

        An ensemble loads its missing composing models first; a reload checks the loaded
        ensembles that use the model again.

        Args:
            name: model name.
            config_json: a ``ModelConfig`` JSON to use instead of ``config.pbtxt``.
            files: ``<version>/<path>`` -> content: a complete model directory.
            explicit: False when loaded only as an ensemble's composing model.

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
        if explicit:
            self._ensembles.explicit.add(name)
        if model.temp_dir is not None:
            self.scan()  # a model sent with the request joins the repository index
        if previous is not None:
            self._recheck_dependents(name)

    def _prepare(
        self, name: str, scan: ScanResult, config_json: str, files: dict[str, bytes]
    ) -> LoadedModel | None:
        """Complete the config and start the new instances; None when nothing changed."""
        started = time.monotonic()
        load_id = uuid.uuid4().hex[:16]
        previous = self.loaded.get(name)
        source, temp = stage_source(name, scan, files, config_json)
        fingerprint = source_fingerprint(source.path, config_json)
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
            if is_ensemble_config(loaded.config):
                self._ensembles.check(
                    loaded.config, lambda m: self.load(m, explicit=False), scan.models.__contains__
                )
        except (RepositoryError, SluiceError, ValueError) as exc:
            reason = str(exc) or type(exc).__name__
            self._record_failure(name, source, previous, reason, fingerprint)
            discard(temp)
            raise LoadError(
                ErrorCode.INVALID_ARG, f"load failed for model '{name}': {reason}", model=name
            ) from exc
        unsupported = unsupported_feature(loaded.config)
        if unsupported:
            reason = f"{unsupported} is not supported by Sluice yet"
            self._record_failure(name, source, previous, reason, fingerprint)
            discard(temp)
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
            if not is_ensemble_config(loaded.config):
                self._generations.ensure_groups(name, version, loaded.config)
            model.versions[version] = self._generations.start_version(model, version, config_key)
        return model

    def _finish_load(self, model: LoadedModel, previous: LoadedModel | None) -> None:
        """Wait for the new instances; publish and retire the old ones, or roll back."""
        reasons = {
            v: self._generations.await_ready(instances, lambda: self.stopping)
            for v, instances in model.versions.items()
        }
        failed = {v: r for v, r in reasons.items() if r is not None}
        if failed:
            for instances in model.versions.values():
                terminate([i.process for i in instances if i.process], 10)
            # the next load reuses this generation's instance names: their records (state
            # UNAVAILABLE with this failure's reason) must not answer for the new processes
            self._generations.forget(model)
            reason = next(iter(failed.values())) or "load failed"
            for version in model.versions:
                if previous is None or version not in previous.versions:
                    self._store.set_state(
                        model.name,
                        version,
                        VersionState(ModelState.UNAVAILABLE, failed.get(version) or reason),
                    )
            self._failed[model.name] = model.fingerprint
            discard(model.temp_dir)
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
            count = len(model.versions[version])
            how = f"{count} instances" if self.options.start_instances else "instances apart"
            logger.info("model '%s' version %d is READY (%s)", model.name, version, how)
        self.loaded[model.name] = model
        self._failed.pop(model.name, None)
        if previous is not None:
            gone = [v for v in previous.versions if v not in model.versions]
            self._generations.retire(previous, gone, drain=True)
            kept = {v: i for v, i in previous.versions.items() if v in model.versions}
            for instances in kept.values():
                terminate(
                    [i.process for i in instances if i.process],
                    self.options.drain_timeout_s,
                    HAND_OVER_SIGNAL,
                )
            self._generations.forget(previous)
            if previous.temp_dir != model.temp_dir:
                discard(previous.temp_dir)

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
                own_record(records.get(instance.name, {}), instance).get("state")
                != InstanceState.READY
            ):
                return False
            layout = stream_layout(self._keys, instance.model, instance.version, loaded.config)
            return instance.name in self._generations.pending_owners(layout.streams())
        except redis.exceptions.RedisError:
            return False

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

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Unload every version of ``name`` (Triton ``.../unload``); no-op if not loaded.
        ``unload_dependents``: the ensembles using ``name`` first, and after an ensemble
        the composing models loaded only for it (without it, an ensemble whose step model
        is gone stays loaded and its requests fail at that step)."""
        if unload_dependents:
            for dependent in self._ensembles.dependents(name):
                self.unload(dependent, unload_dependents=True)
        model = self.loaded.pop(name, None)
        self._ensembles.explicit.discard(name)
        if model is None:
            return
        self._generations.retire(model, list(model.versions), drain=True)
        discard(model.temp_dir)
        if unload_dependents and is_ensemble_config(model.config):
            for composing in self._ensembles.orphaned(model.config):
                self.unload(composing, unload_dependents=True)

    def _recheck_dependents(self, name: str) -> None:
        """After a reload of ``name``, an ensemble whose steps no longer fit turns UNAVAILABLE."""
        for dependent, reason in self._ensembles.broken_dependents(name):
            logger.error("ensemble '%s' no longer loads: %s", dependent, reason)
            for version in self.loaded.pop(dependent).versions:
                self._store.set_state(
                    dependent, version, VersionState(ModelState.UNAVAILABLE, reason)
                )

    # -- poll mode --------------------------------------------------------------------------

    def poll(self) -> None:
        """Triton poll mode: load new or changed models, unload removed ones."""
        scan = self.scan()
        for name, source in scan.models.items():
            fingerprint = source_fingerprint(source.path)
            current = self.loaded.get(name)
            mark_removed_versions(self._store, name, source.path, current and current.versions)
            if current is not None and (current.overridden or current.fingerprint == fingerprint):
                continue
            if self._failed.get(name) == fingerprint:
                continue  # still the files that failed (a failed reload: the old one serves)
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
            discard(model.temp_dir)
