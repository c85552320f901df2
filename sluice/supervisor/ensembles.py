"""Ensembles at load time: their composing models, loaded first and checked against.

An ensemble has no instance of its own; loading it means its composing models are
loaded (a missing one is loaded with it, as Triton's explicit mode does) and its steps
are checked against their completed configs (:func:`sluice.repository.ensemble.validate_ensemble`).
The texts follow Triton core ``src/model_repository_manager/model_repository_manager.cc``
(``CheckNode``, ``ConnectDependencyGraph``, ``CircularDependencyCheck``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.repository.ensemble import (
    LATEST,
    EnsembleError,
    EnsemblePlan,
    composing_models,
    is_ensemble_config,
    validate_ensemble,
)
from sluice.supervisor.generations import LoadedModel
from sluice.supervisor.model_source import LoadError

__all__ = ["Deferred", "EnsembleLoads", "check_ensemble"]


class Deferred(Exception):
    """An ensemble met while several models load at once: it loads after the others."""


class EnsembleLoads:
    """What the model manager knows about ensembles: which models were loaded on their
    own (not only for an ensemble), the ensembles being loaded, and the checks.

    Args:
        loaded: the model manager's loaded models (shared, changed by the manager).
    """

    def __init__(self, loaded: Mapping[str, LoadedModel]) -> None:
        self.loaded = loaded
        #: models loaded on their own (not only as an ensemble's composing model)
        self.explicit: set[str] = set()
        #: while true (several models load at once), ensembles raise :class:`Deferred`
        self.defer = False
        #: ensembles being loaded, outermost first (a step on one of them is a cycle)
        self._chain: list[str] = []

    def check(
        self, config: ModelConfig, load: Callable[[str], None], known: Callable[[str], bool]
    ) -> EnsemblePlan:
        """Load an ensemble's missing composing models and check its steps against them.

        Args:
            config: the ensemble's completed config.
            load: loads one composing model (raises :class:`LoadError`).
            known: whether a model name is in the repositories.

        Raises:
            Deferred: while :attr:`defer` is set.
            EnsembleError: as :func:`check_ensemble`.
        """
        if self.defer:
            raise Deferred(config.name)
        self._chain.append(config.name)
        try:
            return check_ensemble(config, self.loaded, load, known, self._chain)
        finally:
            self._chain.pop()

    def dependents(self, name: str) -> list[str]:
        """The loaded ensembles with a step on model ``name``."""
        return [
            other
            for other, model in self.loaded.items()
            if is_ensemble_config(model.config)
            and any(m == name for m, _ in composing_models(model.config))
        ]

    def orphaned(self, ensemble: ModelConfig) -> list[str]:
        """The composing models of an unloaded ensemble that were loaded only for
        ensembles and that no loaded ensemble uses any more (Triton unloads them with the
        ensemble when ``unload_dependents`` is set)."""
        return [
            model
            for model, _ in dict.fromkeys(composing_models(ensemble))
            if model in self.loaded and model not in self.explicit and not self.dependents(model)
        ]

    def broken_dependents(self, name: str) -> list[tuple[str, str]]:
        """``(ensemble, reason)`` for each loaded ensemble using ``name`` whose steps no
        longer fit the loaded composing models (after ``name`` was reloaded)."""
        broken = []
        for dependent in self.dependents(name):
            try:
                check_ensemble(
                    self.loaded[dependent].config, self.loaded, _no_load, _known, [dependent]
                )
            except EnsembleError as exc:
                broken.append((dependent, exc.message))
        return broken


def _no_load(_: str) -> None:
    return None


def _known(_: str) -> bool:
    return True


def check_ensemble(
    config: ModelConfig,
    loaded: Mapping[str, LoadedModel],
    load: Callable[[str], None],
    known: Callable[[str], bool],
    chain: Sequence[str],
) -> EnsemblePlan:
    """Load what an ensemble's steps need and check its steps against them.

    Args:
        config: the ensemble's completed config.
        loaded: the models loaded now (it grows as ``load`` runs).
        load: loads one composing model (raises :class:`LoadError`).
        known: whether a model name is in the repositories.
        chain: the ensembles being loaded, outermost first (this one last): a step
            naming one of them is a cycle between ensembles.

    Raises:
        EnsembleError: an unknown composing model, one that failed to load or lacks the
            version a step asks for, a cycle between ensembles, or a step that does not
            fit its model (:func:`validate_ensemble`).
    """
    name = config.name
    needed = composing_models(config)
    unknown = sorted({m for m, _ in needed if m not in loaded and not known(m)})
    if unknown:
        raise EnsembleError(
            f"ensemble '{name}' contains models that are not available or ambiguous: "
            + ", ".join(unknown),
            model=name,
        )
    for model, _ in needed:
        if model in chain:
            path = " -> ".join([*chain[chain.index(model) :], model])
            raise EnsembleError(f"circular dependency between ensembles: {path}", model=name)
        if model in loaded:
            continue
        try:
            load(model)
        except LoadError as exc:
            raise EnsembleError(
                f"ensemble '{name}' depends on '{model}' which has no loaded version. "
                f"Model '{model}' loading failed with error: {exc.message}",
                model=name,
            ) from exc
        if model not in loaded:
            raise EnsembleError(
                f"ensemble '{name}' depends on '{model}' which has no loaded version.",
                model=name,
            )
    for model, version in needed:
        if version != LATEST and version not in loaded[model].versions:
            raise EnsembleError(
                f"ensemble '{name}' depends on '{model}' whose required version {version} "
                "is not loaded.",
                model=name,
            )
    return validate_ensemble(config, {m: loaded[m].config for m, _ in needed})
