"""Ensemble graphs: the steps of ``ensemble_scheduling``, checked and planned.

An ensemble (``platform: "ensemble"``) names no model file of its own: its
``ensemble_scheduling.step`` list maps ensemble tensors to the inputs and outputs of
composing models. This module turns that list into an :class:`EnsemblePlan` (which
step produces which tensor, which steps may run once some tensors exist) and checks
it with Triton's rules, in two stages as Triton does:

* :func:`plan_ensemble` needs only the ensemble's own config (Triton core
  ``src/model_config_utils.cc`` ``ValidateEnsembleSchedulingConfig``): every step
  names a model and maps inputs and outputs, a tensor is written once, every
  ensemble input is used, every output is written, no tensor is left unused, and
  the steps form no cycle;
* :func:`validate_ensemble` adds the composing models' completed configs (Triton
  core ``src/ensemble_scheduler/ensemble_utils.cc`` ``ValidateEnsembleConfig``):
  ``max_batch_size`` no larger than a batching step's, every mapped name is a real
  input or output, every required input mapped exactly once, and one data type and
  a compatible shape per tensor along every edge.

Pure code: no I/O, no clock; the model manager and the gateway call it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import ClassVar

from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig

from sluice.repository.backend import ENSEMBLE_PLATFORM
from sluice.repository.errors import RepositoryError

__all__ = [
    "EnsembleError",
    "EnsemblePlan",
    "EnsembleStep",
    "composing_models",
    "plan_ensemble",
    "validate_ensemble",
]

#: ``model_version`` of a step that takes the composing model's latest ready version.
LATEST = -1


class EnsembleError(RepositoryError):
    """An ensemble that cannot load; the message names the ensemble, the step and the
    tensor (Triton INVALID_ARG)."""

    code: ClassVar[str] = "INVALID_ARG"


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """One step of an ensemble.

    Attributes:
        index: position in ``ensemble_scheduling.step`` (0-based, as Triton's messages).
        model: the composing model's name.
        version: the composing model's version; -1 = its latest ready version.
        inputs: ``(composing model input, ensemble tensor)`` pairs (Triton ``input_map``).
        outputs: ``(composing model output, ensemble tensor)`` pairs (``output_map``).
    """

    index: int
    model: str
    version: int
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]

    def label(self) -> str:
        """``step 1 (model 'encoder')``: how messages name a step."""
        return f"step {self.index} (model '{self.model}')"


@dataclass(frozen=True, slots=True)
class EnsemblePlan:
    """The data flow of one ensemble.

    Attributes:
        name: the ensemble's name.
        inputs: the ensemble's input tensor names, config order.
        outputs: the ensemble's output tensor names, config order.
        steps: the steps, config order.
        producer: ensemble tensor -> index of the step that writes it (ensemble inputs
            are written by the request and are not listed).
    """

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    steps: tuple[EnsembleStep, ...]
    producer: Mapping[str, int] = field(default_factory=dict)

    def needed_steps(self, outputs: Iterable[str]) -> frozenset[int]:
        """The steps that must run to write ``outputs`` (every step they depend on, and
        no other): a request for a subset of the outputs runs only their branch.

        Args:
            outputs: ensemble output names; empty = every output.
        """
        wanted = list(outputs) or list(self.outputs)
        needed: set[int] = set()
        while wanted:
            index = self.producer.get(wanted.pop())
            if index is None or index in needed:
                continue
            needed.add(index)
            wanted.extend(tensor for _, tensor in self.steps[index].inputs)
        return frozenset(needed)

    def ready_steps(self, available: Set[str], pending: Iterable[int]) -> list[int]:
        """The steps of ``pending`` whose every mapped input is in ``available``, in
        config order: they may start now, side by side."""
        return sorted(i for i in pending if all(t in available for _, t in self.steps[i].inputs))

    def stages(self) -> list[list[int]]:
        """The steps grouped by depth: a stage's steps depend only on earlier stages and
        may run in parallel (step indexes, config order within a stage)."""
        available = set(self.inputs)
        pending = set(range(len(self.steps)))
        stages: list[list[int]] = []
        while pending:
            ready = self.ready_steps(available, pending)
            if not ready:
                break  # a cycle: plan_ensemble refuses those
            stages.append(ready)
            pending.difference_update(ready)
            for i in ready:
                available.update(t for _, t in self.steps[i].outputs)
        return stages


def is_ensemble_config(config: ModelConfig) -> bool:
    """Triton model_config.proto: platform ``ensemble`` or ``ensemble_scheduling`` set."""
    return config.platform == ENSEMBLE_PLATFORM or config.HasField("ensemble_scheduling")


def composing_models(config: ModelConfig) -> list[tuple[str, int]]:
    """``(model, version)`` of every step, config order, each pair once."""
    seen: dict[tuple[str, int], None] = {}
    for step in config.ensemble_scheduling.step:
        seen.setdefault((step.model_name, int(step.model_version)), None)
    return list(seen)


def _fail(name: str, message: str) -> EnsembleError:
    return EnsembleError(message, model=name)


def plan_ensemble(config: ModelConfig) -> EnsemblePlan:
    """The plan of an ensemble, checked against its own config.

    Triton core ``src/model_config_utils.cc`` (``ValidateEnsembleSchedulingConfig``,
    ``BuildEnsembleGraph``); the texts are Triton's where it has one. A cycle, which
    Triton reports as an output that is not written, is named with its steps and
    tensors.

    Raises:
        EnsembleError: the first rule broken, naming the ensemble, the step and the
            tensor.
    """
    name = config.name
    if config.model_warmup:
        raise _fail(name, f"model_warmup can not be specified for ensemble '{name}'")
    if not config.ensemble_scheduling.step:
        raise _fail(name, f"must specify 'step' for ensemble '{name}'")
    inputs = tuple(t.name for t in config.input)
    outputs = tuple(t.name for t in config.output)
    steps: list[EnsembleStep] = []
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    for index, raw in enumerate(config.ensemble_scheduling.step):
        where = f"step {index} of ensemble '{name}'"
        if not raw.model_name:
            raise _fail(name, f"must specify 'model_name' in {where}")
        if not raw.input_map:
            raise _fail(name, f"must specify 'input_map' in {where}")
        if not raw.output_map:
            raise _fail(name, f"must specify 'output_map' in {where}")
        step = EnsembleStep(
            index,
            raw.model_name,
            int(raw.model_version),
            tuple(sorted(raw.input_map.items())),
            tuple(sorted(raw.output_map.items())),
        )
        for _, tensor in step.outputs:
            if tensor in producer or tensor in inputs:
                raise _fail(
                    name,
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{name}' step {index}",
                )
            producer[tensor] = index
        for _, tensor in step.inputs:
            consumers.setdefault(tensor, []).append(index)
        steps.append(step)
    plan = EnsemblePlan(name, inputs, outputs, tuple(steps), producer)
    for tensor in inputs:
        if tensor not in consumers:
            raise _fail(name, f"ensemble input '{tensor}' for ensemble '{name}' is not used")
    _check_cycles(plan)
    written = set(inputs)
    for stage in plan.stages():
        for i in stage:
            written.update(t for _, t in plan.steps[i].outputs)
    for tensor in outputs:
        if tensor not in producer:
            raise _fail(name, f"ensemble output '{tensor}' for ensemble '{name}' is not used")
        if tensor not in written:
            source = _unwritten_source(plan, tensor, written)
            raise _fail(
                name,
                f"output '{tensor}' for ensemble '{name}' is not written: at least one of "
                f"its depending tensors, '{source}', is not connected",
            )
    for step in plan.steps:
        for _, tensor in step.inputs:
            if tensor not in written:
                raise _fail(
                    name,
                    f"in ensemble '{name}', ensemble tensor '{tensor}' read by "
                    f"{step.label()} is neither an ensemble input nor written by a step",
                )
    for tensor in producer:
        if tensor not in consumers and tensor not in outputs:
            raise _fail(name, f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")
    return plan


def _unwritten_source(plan: EnsemblePlan, tensor: str, written: Set[str]) -> str:
    """The first tensor upstream of ``tensor`` that nothing writes (Triton names it)."""
    seen = {tensor}
    while (index := plan.producer.get(tensor)) is not None:
        missing = [t for _, t in plan.steps[index].inputs if t not in written and t not in seen]
        if not missing:
            break
        tensor = missing[0]
        seen.add(tensor)
    return tensor


def _check_cycles(plan: EnsemblePlan) -> None:
    """Refuse steps that wait on each other (a step needing, through other steps, a
    tensor it writes itself): such a request would never finish.

    Raises:
        EnsembleError: naming every step of the cycle and the tensor it waits for.
    """
    # step -> (tensor, producing step) for each mapped input written by a step
    edges = {
        s.index: [(t, plan.producer[t]) for _, t in s.inputs if t in plan.producer]
        for s in plan.steps
    }
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    path: list[tuple[int, str]] = []

    def visit(index: int) -> None:
        state[index] = 1
        for tensor, before in edges[index]:
            path.append((index, tensor))
            if state.get(before) == 1:
                start = next(i for i, (s, _) in enumerate(path) if s == before)
                links = [f"{plan.steps[s].label()} waits for tensor '{t}'" for s, t in path[start:]]
                raise _fail(
                    plan.name,
                    f"in ensemble '{plan.name}', steps form a cycle: " + ", ".join(links),
                )
            if state.get(before) is None:
                visit(before)
            path.pop()
        state[index] = 2

    for step in plan.steps:
        if step.index not in state:
            visit(step.index)


def _dims_match(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Triton ``CompareDimsWithWildcard``: same rank, each dim equal or either -1."""
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


@dataclass(frozen=True, slots=True)
class _TensorInfo:
    """An ensemble tensor's type and shape as one model sees it."""

    model: str
    datatype: int
    dims: tuple[int, ...]
    batching: bool

    @property
    def full_dims(self) -> tuple[int, ...]:
        return ((-1,) if self.batching else ()) + self.dims

    def check_same(self, other: _TensorInfo, ensemble: str, tensor: str) -> None:
        """Triton ``ValidateTensorConsistency``: one data type; shapes that match with
        wildcards, with or without the batch dimension (a batching and a non-batching
        model may share a tensor when the full shapes agree)."""
        prefix = f"in ensemble '{ensemble}', ensemble tensor '{tensor}': "
        if self.datatype != other.datatype:
            raise _fail(
                ensemble,
                f"{prefix}inconsistent data type: {DataType.Name(self.datatype)} is inferred "
                f"from model '{self.model}' while {DataType.Name(other.datatype)} is "
                f"inferred from model '{other.model}'",
            )
        if not _dims_match(self.dims, other.dims) and not _dims_match(
            self.full_dims, other.full_dims
        ):
            raise _fail(
                ensemble,
                f"{prefix}inconsistent shape: {list(self.full_dims)} is inferred from model "
                f"'{self.model}' while {list(other.full_dims)} is inferred from model "
                f"'{other.model}'",
            )


def validate_ensemble(config: ModelConfig, composing: Mapping[str, ModelConfig]) -> EnsemblePlan:
    """Check an ensemble against the completed configs of its composing models.

    Args:
        config: the ensemble's completed config.
        composing: composing model name -> the completed config of the version its
            steps run on (every step's model must be there).

    Returns:
        The ensemble's plan (:func:`plan_ensemble`).

    Raises:
        EnsembleError: the first rule broken (Triton core ``ensemble_utils.cc`` texts),
            naming the ensemble, the step's model and the tensor.
    """
    plan = plan_ensemble(config)
    name = config.name
    missing = sorted({s.model for s in plan.steps if s.model not in composing})
    if missing:
        raise _fail(
            name,
            f"ensemble '{name}' contains models that are not available or ambiguous: "
            + ", ".join(missing),
        )
    batching = config.max_batch_size > 0
    tensors: dict[str, _TensorInfo] = {}
    for t in config.input:
        dims = tuple(t.reshape.shape) if t.HasField("reshape") else tuple(t.dims)
        tensors[t.name] = _TensorInfo(name, t.data_type, dims, batching)
    for t in config.output:
        dims = tuple(t.reshape.shape) if t.HasField("reshape") else tuple(t.dims)
        tensors[t.name] = _TensorInfo(name, t.data_type, dims, batching)
    for step in plan.steps:
        model = composing[step.model]
        if 0 < model.max_batch_size < config.max_batch_size:
            raise _fail(
                name,
                f"ensemble '{name}' allows maximum batch size {config.max_batch_size}, but "
                f"it contains model '{step.model}' which only allows maximum batch size "
                f"to be {model.max_batch_size}",
            )
        _check_step(name, step, model, tensors)
    return plan


def _check_step(
    ensemble: str, step: EnsembleStep, model: ModelConfig, tensors: dict[str, _TensorInfo]
) -> None:
    """Triton ``ValidateTensorMapping`` for one step."""
    batching = model.max_batch_size > 0
    known_inputs = {t.name: t for t in model.input}
    mapped = dict(step.inputs)
    for model_input, tensor in step.inputs:
        if model_input not in known_inputs:
            raise _fail(
                ensemble,
                f"in ensemble '{ensemble}', ensemble tensor '{tensor}' is mapping to "
                f"non-existing input '{model_input}' in model '{step.model}' "
                f"({step.label()})",
            )
    for t in model.input:
        tensor = mapped.get(t.name)
        if tensor is None:
            if t.optional:
                continue
            raise _fail(
                ensemble,
                f"in ensemble '{ensemble}', input '{t.name}' in model '{step.model}' is not "
                f"mapped to any ensemble tensors ({step.label()})",
            )
        _merge(tensors, tensor, _TensorInfo(step.model, t.data_type, tuple(t.dims), batching),
               ensemble)  # fmt: skip
    known_outputs = {t.name: t for t in model.output}
    for model_output, tensor in step.outputs:
        out = known_outputs.get(model_output)
        if out is None:
            raise _fail(
                ensemble,
                f"in ensemble '{ensemble}', ensemble tensor '{tensor}' is mapped from "
                f"non-existing output '{model_output}' in model '{step.model}' "
                f"({step.label()})",
            )
        _merge(tensors, tensor, _TensorInfo(step.model, out.data_type, tuple(out.dims), batching),
               ensemble)  # fmt: skip


def _merge(tensors: dict[str, _TensorInfo], tensor: str, seen: _TensorInfo, ensemble: str) -> None:
    known = tensors.get(tensor)
    if known is None:
        tensors[tensor] = seen
    else:
        known.check_same(seen, ensemble, tensor)
