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

The two steps of one load (prepare, then finish or roll back):
:mod:`sluice.supervisor.load_steps`; where a load's files come from:
:mod:`sluice.supervisor.model_source`; starting,
awaiting and retiring a generation's instances: :mod:`sluice.supervisor.generations`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import redis
from google.protobuf import json_format

from sluice.broker.keys import KeySchema
from sluice.broker.model_store import ModelStore, VersionState
from sluice.broker.scheduling import stream_layout
from sluice.broker.states import InstanceState, ModelState
from sluice.gpu_workers.processes import Instance, Spawner, terminate
from sluice.repository import ScanResult, scan_repositories
from sluice.repository.ensemble import is_ensemble_config
from sluice.supervisor.ensembles import Deferred, EnsembleLoads
from sluice.supervisor.generations import Generations, LoadedModel, own_record
from sluice.supervisor.load_steps import LoadSteps, ManagerOptions
from sluice.supervisor.model_source import (
    LoadError,
    discard,
    duplicate_reason,
    repository_index,
    source_fingerprint,
)
from sluice.supervisor.removed_versions import mark_removed_versions

__all__ = ["LoadError", "LoadedModel", "ManagerOptions", "ModelManager"]

logger = logging.getLogger(__name__)


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
        self._steps = LoadSteps(
            options, client, keys, self._store, self._generations, self._ensembles,
            self.loaded, self._failed,
        )  # fmt: skip
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
                    model = self._steps.prepare(name, scan, "", {}, self._load_composing)
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
                self._steps.finish(model, None, self._is_stopping)
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
        model = self._steps.prepare(name, scan, config_json, files or {}, self._load_composing)
        if model is None:
            return
        self._steps.finish(model, previous, self._is_stopping)
        if explicit:
            self._ensembles.explicit.add(name)
        if model.temp_dir is not None:
            self.scan()  # a model sent with the request joins the repository index
        if previous is not None:
            self._recheck_dependents(name)

    def _load_composing(self, name: str) -> None:
        """Load ``name`` as an ensemble's composing model (not asked for by itself)."""
        self.load(name, explicit=False)

    def _is_stopping(self) -> bool:
        return self.stopping

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
