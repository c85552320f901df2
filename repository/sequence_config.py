"""The ``sequence_batching`` block of a model config: checked at load, and read into the
plain facts the gateways and the model instances work from.

Rules (Triton ``model_config.proto`` ``ModelSequenceBatching``, ``model_config_utils.cc``
``ValidateModelConfig``; docs/reference/model-configuration.md, Sequence batcher):

* A control input names one tensor and carries one or more controls; every control kind
  appears at most once in the config. START, END and READY take exactly one of
  ``int32_false_true``, ``fp32_false_true`` or ``bool_false_true``, with two values
  (false, then true); CORRID takes ``data_type`` TYPE_UINT64, TYPE_INT64, TYPE_UINT32,
  TYPE_INT32 or TYPE_STRING.
* A state has an ``input_name``, an ``output_name``, a ``data_type`` and ``dims``; its
  ``initial_state`` (at most one) is ``zero_data`` or a ``data_file`` under the model's
  ``initial_state/`` folder, with the state's data type and fixed ``dims``.
* The response cache cannot be combined with sequence batching.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig, ModelSequenceBatching

from sluice.repository.errors import ConfigError

__all__ = ["ControlSpec", "SequenceSpec", "StateSpec", "check_sequence_batching", "sequence_spec"]

Kind = Literal["START", "END", "READY", "CORRID"]

_KINDS: dict[int, Kind] = {
    ModelSequenceBatching.Control.CONTROL_SEQUENCE_START: "START",
    ModelSequenceBatching.Control.CONTROL_SEQUENCE_END: "END",
    ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY: "READY",
    ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID: "CORRID",
}
_CORRID_TYPES = frozenset(
    {DataType.TYPE_UINT64, DataType.TYPE_INT64, DataType.TYPE_UINT32, DataType.TYPE_INT32,
     DataType.TYPE_STRING}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ControlSpec:
    """One control tensor the sequence batcher adds to every request.

    Attributes:
        name: the model input it feeds.
        kind: START, END, READY or CORRID.
        data_type: the config type name, e.g. ``TYPE_INT32``.
        false_value: the value for "false" (START/END/READY).
        true_value: the value for "true" (START/END/READY).
    """

    name: str
    kind: Kind
    data_type: str
    false_value: float | int | bool = 0
    true_value: float | int | bool = 1


@dataclass(frozen=True, slots=True)
class StateSpec:
    """One implicit state tensor.

    Attributes:
        input_name: the model input that receives the state.
        output_name: the model output that produces the next state.
        data_type: the config type name, e.g. ``TYPE_FP32``.
        dims: the state's dims without the batch dimension (-1 allowed).
        initial_dims: the dims of the state at a sequence's start (``initial_state.dims``,
            else ``dims`` with each -1 as 1).
        initial_zero: the start state is zeros (``zero_data``); else ``initial_file``
            or, when both are unset, zeros too (Triton leaves it uninitialized).
        initial_file: the ``data_file`` path, absolute (None: not given).
    """

    input_name: str
    output_name: str
    data_type: str
    dims: tuple[int, ...]
    initial_dims: tuple[int, ...]
    initial_zero: bool = True
    initial_file: str | None = None


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    """What the ``sequence_batching`` block asks for.

    Attributes:
        strategy: ``direct`` or ``oldest``.
        candidates: ``oldest.max_candidate_sequences`` (0 for ``direct``).
        preferred_batch_sizes: ``oldest.preferred_batch_size``.
        max_queue_delay_us: the strategy's ``max_queue_delay_microseconds``.
        idle_us: ``max_sequence_idle_microseconds`` (normalized: never 0).
        controls: the control tensors.
        states: the implicit state tensors.
    """

    strategy: Literal["direct", "oldest"]
    candidates: int
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_us: int
    idle_us: int
    controls: tuple[ControlSpec, ...]
    states: tuple[StateSpec, ...]

    @property
    def corrid_type(self) -> str | None:
        """The CORRID control's data type, or None when the model has no CORRID control."""
        for control in self.controls:
            if control.kind == "CORRID":
                return control.data_type
        return None

    @property
    def tensor_names(self) -> frozenset[str]:
        """Inputs the batcher feeds (controls, states) and outputs it takes (states)."""
        names = {c.name for c in self.controls}
        for state in self.states:
            names.update((state.input_name, state.output_name))
        return frozenset(names)


def _fail(config: ModelConfig, path: Path, field: str, message: str) -> ConfigError:
    return ConfigError(message, model=config.name, path=path, field=field)


def _control(config: ModelConfig, path: Path, field: str, name: str, raw: object) -> ControlSpec:
    control: ModelSequenceBatching.Control = raw  # type: ignore[assignment]
    kind = _KINDS.get(control.kind)
    if kind is None:
        raise _fail(config, path, f"{field}.kind", "unknown sequence batching control kind")
    if kind == "CORRID":
        if control.data_type not in _CORRID_TYPES:
            raise _fail(
                config, path, f"{field}.data_type",
                f"sequence batching control {name} of kind CONTROL_SEQUENCE_CORRID must "
                "specify data_type TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or "
                "TYPE_STRING",
            )  # fmt: skip
        return ControlSpec(name, kind, DataType.Name(control.data_type))
    pairs = [
        ("TYPE_INT32", list(control.int32_false_true)),
        ("TYPE_FP32", list(control.fp32_false_true)),
        ("TYPE_BOOL", list(control.bool_false_true)),
    ]
    given = [(t, v) for t, v in pairs if v]
    if len(given) != 1 or len(given[0][1]) != 2:
        raise _fail(
            config, path, field,
            f"sequence batching control {name} of kind CONTROL_SEQUENCE_{kind} must specify "
            "exactly one of int32_false_true, fp32_false_true or bool_false_true, with two "
            "values (false, true)",
        )  # fmt: skip
    data_type, (false_value, true_value) = given[0]
    return ControlSpec(name, kind, data_type, false_value, true_value)


def sequence_spec(config: ModelConfig, model_dir: Path, path: Path | None = None) -> SequenceSpec:
    """Check ``config.sequence_batching`` and read it.

    Args:
        config: a normalized config that has ``sequence_batching``.
        model_dir: the model's directory (``initial_state/`` files are read from it).
        path: the config file, for messages (default: ``model_dir``).

    Raises:
        ConfigError: the first rule broken, naming the model and field.
    """
    path = path or model_dir
    seq = config.sequence_batching
    if config.response_cache.enable:
        raise _fail(
            config, path, "response_cache",
            "response cache is not supported for models with sequence batching",
        )  # fmt: skip
    controls: list[ControlSpec] = []
    seen: set[str] = set()
    for i, control_input in enumerate(seq.control_input):
        field = f"sequence_batching.control_input[{i}]"
        if not control_input.name:
            raise _fail(config, path, f"{field}.name", "control input must have a name")
        for j, raw in enumerate(control_input.control):
            spec = _control(config, path, f"{field}.control[{j}]", control_input.name, raw)
            if spec.kind in seen:
                raise _fail(
                    config, path, field,
                    f"sequence batching specifies multiple CONTROL_SEQUENCE_{spec.kind} tensors",
                )  # fmt: skip
            seen.add(spec.kind)
            controls.append(spec)
    states = tuple(
        _state(config, path, model_dir, f"sequence_batching.state[{i}]", raw)
        for i, raw in enumerate(seq.state)
    )
    if seq.HasField("oldest"):
        oldest = seq.oldest
        if oldest.max_candidate_sequences < 1:
            raise _fail(
                config, path, "sequence_batching.oldest.max_candidate_sequences",
                "max_candidate_sequences must be > 0",
            )  # fmt: skip
        return SequenceSpec(
            "oldest",
            int(oldest.max_candidate_sequences),
            tuple(int(s) for s in oldest.preferred_batch_size),
            int(oldest.max_queue_delay_microseconds),
            int(seq.max_sequence_idle_microseconds),
            tuple(controls),
            states,
        )
    return SequenceSpec(
        "direct",
        0,
        (),
        int(seq.direct.max_queue_delay_microseconds),
        int(seq.max_sequence_idle_microseconds),
        tuple(controls),
        states,
    )


def _state(config: ModelConfig, path: Path, model_dir: Path, field: str, raw: object) -> StateSpec:
    state: ModelSequenceBatching.State = raw  # type: ignore[assignment]
    if not state.input_name or not state.output_name:
        raise _fail(config, path, field, "state must specify both input_name and output_name")
    if state.data_type in (DataType.TYPE_INVALID, DataType.TYPE_STRING):
        raise _fail(
            config, path, f"{field}.data_type",
            f"state '{state.input_name}' must specify a non-string data_type",
        )  # fmt: skip
    if not state.dims or any(d < 1 and d != -1 for d in state.dims):
        raise _fail(
            config, path, f"{field}.dims",
            f"state '{state.input_name}' must specify dims of integers >= 1 or -1",
        )  # fmt: skip
    dims = tuple(int(d) for d in state.dims)
    initial_dims = tuple(1 if d == -1 else d for d in dims)
    if len(state.initial_state) > 1:
        raise _fail(
            config, path, f"{field}.initial_state",
            f"state '{state.input_name}' specifies more than one initial_state",
        )  # fmt: skip
    if not state.initial_state:
        return StateSpec(state.input_name, state.output_name, DataType.Name(state.data_type),
                         dims, initial_dims)  # fmt: skip
    initial = state.initial_state[0]
    ifield = f"{field}.initial_state[0]"
    if initial.data_type != state.data_type:
        raise _fail(
            config, path, f"{ifield}.data_type",
            f"initial_state of state '{state.input_name}' must have the state's data_type "
            f"{DataType.Name(state.data_type)}",
        )  # fmt: skip
    if initial.dims:
        initial_dims = tuple(int(d) for d in initial.dims)
        if any(d < 1 for d in initial_dims) or len(initial_dims) != len(dims):
            raise _fail(
                config, path, f"{ifield}.dims",
                f"initial_state of state '{state.input_name}' must have fixed dims of the "
                "state's rank",
            )  # fmt: skip
    which = initial.WhichOneof("state_data")
    if which == "data_file":
        file = model_dir / "initial_state" / initial.data_file
        if not file.is_file():
            raise _fail(
                config, path, f"{ifield}.data_file",
                f"initial_state data_file '{initial.data_file}' of state "
                f"'{state.input_name}' not found in {model_dir / 'initial_state'}",
            )  # fmt: skip
        return StateSpec(state.input_name, state.output_name, DataType.Name(state.data_type),
                         dims, initial_dims, False, str(file))  # fmt: skip
    return StateSpec(state.input_name, state.output_name, DataType.Name(state.data_type),
                     dims, initial_dims)  # fmt: skip


def check_sequence_batching(config: ModelConfig, model_dir: Path, path: Path | None) -> None:
    """:func:`sequence_spec` for its errors only (no-op without ``sequence_batching``)."""
    if config.HasField("sequence_batching"):
        sequence_spec(config, model_dir, path)
