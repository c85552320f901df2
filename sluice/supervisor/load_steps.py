"""The two steps of one model load, which the :class:`ModelManager` runs.

**prepare** reads the model's directory (or the files and config a load request
carries), completes its config, publishes it for the new generation and starts the
instances of every version the version policy selects. **finish** waits until they are
ready, then publishes the config and READY states and retires the previous generation
(a reload: its instances finish what they hold and hand the queues over), or stops the
new instances and records the failure (a failed reload leaves the old model serving).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from google.protobuf import json_format

from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.keys import KeySchema
from sluice.broker.model_store import ModelStore, VersionState
from sluice.broker.states import ModelState
from sluice.broker.stats_store import reset_version_stats
from sluice.gpu_workers.backends.registry import auto_complete, gpu_available
from sluice.gpu_workers.device import gpu_ids
from sluice.gpu_workers.processes import HAND_OVER_SIGNAL, terminate
from sluice.repository import (
    ModelSource,
    RepositoryError,
    ScanResult,
    config_from_json,
    load_model_config,
    version_directories,
)
from sluice.repository.ensemble import is_ensemble_config
from sluice.supervisor.ensembles import EnsembleLoads
from sluice.supervisor.generations import Generations, LoadedModel
from sluice.supervisor.model_source import (
    LoadError,
    discard,
    source_fingerprint,
    stage_source,
    unsupported_feature,
)

__all__ = ["LoadSteps", "ManagerOptions"]

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


class LoadSteps:
    """Prepares and finishes the loads of a :class:`ModelManager`.

    Args:
        options: repository and load settings.
        client: the supervisor's Redis client.
        keys: the key schema.
        store: the models' states and configs in Redis.
        generations: starts, awaits and retires instances.
        ensembles: the loaded ensembles' composing models.
        loaded: model name -> the loaded model (the manager's; a finished load adds to it).
        failed: model name -> fingerprint of the files that failed (the manager's).
    """

    def __init__(
        self,
        options: ManagerOptions,
        client: redis.Redis,
        keys: KeySchema,
        store: ModelStore,
        generations: Generations,
        ensembles: EnsembleLoads,
        loaded: dict[str, LoadedModel],
        failed: dict[str, str],
    ) -> None:
        self.options = options
        self._redis = client
        self._keys = keys
        self._store = store
        self._generations = generations
        self._ensembles = ensembles
        self.loaded = loaded
        self._failed = failed

    def prepare(
        self,
        name: str,
        scan: ScanResult,
        config_json: str,
        files: dict[str, bytes],
        load_composing: Callable[[str], None],
    ) -> LoadedModel | None:
        """Complete the config and start the new instances; None when nothing changed.

        Args:
            name: model name.
            scan: the repositories as just scanned.
            config_json: a ``ModelConfig`` JSON to use instead of ``config.pbtxt``.
            files: ``<version>/<path>`` -> content: a complete model directory.
            load_composing: loads a composing model an ensemble needs that is not loaded.

        Raises:
            LoadError: INVALID_ARG "load failed for model 'm': ..." (the failure recorded).
        """
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
                self._ensembles.check(loaded.config, load_composing, scan.models.__contains__)
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

    def finish(
        self, model: LoadedModel, previous: LoadedModel | None, stopping: Callable[[], bool]
    ) -> None:
        """Wait for the new instances; publish and retire the old ones, or roll back.

        Args:
            model: what :meth:`prepare` started.
            previous: the loaded model it replaces (None: a first load).
            stopping: whether the server is stopping (the wait ends then).

        Raises:
            LoadError: INVALID_ARG "load failed for model 'm': reason" (rolled back).
        """
        reasons = {
            v: self._generations.await_ready(instances, stopping)
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
        published_at = time.monotonic()
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
            self._generations.requeue_left_behind(previous, model, published_at)
            self._generations.forget(previous)
            if previous.temp_dir != model.temp_dir:
                discard(previous.temp_dir)

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
