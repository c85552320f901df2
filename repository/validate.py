"""Load-time checks of a completed model config.

Each rule cites Triton ``model_config.proto`` / ``model_config_utils.cc``
``ValidateModelConfig`` (docs/reference/model-configuration.md). Run after
`normalize`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from tritonclient.grpc.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelInstanceGroup,
    ModelOutput,
)

from sluice.repository.backend import ENSEMBLE_PLATFORM
from sluice.repository.errors import ConfigError
from sluice.repository.normalize import is_ensemble
from sluice.repository.sequence_config import check_sequence_batching

__all__ = ["QUEUE_SHARDS_PARAMETER", "queue_shards", "validate"]

_WILDCARD = -1

#: the config parameter splitting a model's queue over several Redis streams (Sluice's
#: own; Triton has no such setting and ignores the parameter).
QUEUE_SHARDS_PARAMETER = "queue_shards"
#: most queue shards one model may have.
MAX_QUEUE_SHARDS = 64


class _Checker:
    """Raises ConfigError with the model and file filled in."""

    def __init__(self, model: str, path: Path) -> None:
        self.model = model
        self.path = path

    def fail(self, field: str, message: str) -> ConfigError:
        return ConfigError(message, model=self.model, path=self.path, field=field)


def _segments(shape: Sequence[int]) -> list[int]:
    """Element counts of the runs of fixed dims between wildcards."""
    counts = [1]
    for dim in shape:
        if dim == _WILDCARD:
            counts.append(1)
        else:
            counts[-1] *= dim
    return counts


def _check_reshape(
    check: _Checker, io: ModelInput | ModelOutput, field: str, max_batch_size: int
) -> None:
    """Triton model_config.proto: reshape keeps the element count and wildcards of dims."""
    shape = list(io.reshape.shape)
    if not shape and max_batch_size == 0:
        raise check.fail(
            f"{field}.reshape",
            "empty reshape is only allowed when batching (max_batch_size > 0) "
            "(Triton model_config.proto: reshape)",
        )
    if any(dim != _WILDCARD and dim < 1 for dim in shape):
        raise check.fail(
            f"{field}.reshape.shape",
            f"reshape {shape} must contain only integers >= 1 or -1 "
            "(Triton model_config.proto: reshape)",
        )
    dims = list(io.dims)
    # Without wildcards the element counts must match; with them, the same
    # number of -1s and equal counts in each run of fixed dims between them.
    if _segments(dims) != _segments(shape):
        raise check.fail(
            f"{field}.reshape",
            f"dims {dims} and reshape {shape} have different element counts "
            "(Triton model_config.proto: reshape must keep the element count and wildcards)",
        )


def _check_tensors(
    check: _Checker,
    tensors: Iterable[ModelInput | ModelOutput],
    kind: str,
    max_batch_size: int,
) -> None:
    """Triton model_config.proto: input/output name, data_type, dims, reshape."""
    seen: set[str] = set()
    for index, io in enumerate(tensors):
        field = f"{kind}[{index}]"
        if not io.name:
            raise check.fail(f"{field}.name", f"{kind} must have a name")
        field = f"{kind} '{io.name}'"
        if io.name in seen:
            raise check.fail(field, f"{kind} '{io.name}' is listed more than once")
        seen.add(io.name)
        if io.data_type == DataType.TYPE_INVALID:
            raise check.fail(f"{field}.data_type", f"{kind} '{io.name}' must specify a data_type")
        dims = list(io.dims)
        if not dims:
            raise check.fail(
                f"{field}.dims",
                f"{kind} '{io.name}' must specify 'dims'; write a scalar as dims: [1] with "
                "reshape: { shape: [] } (Triton model_config.proto: dims)",
            )
        if any(dim != _WILDCARD and dim < 1 for dim in dims):
            raise check.fail(
                f"{field}.dims",
                f"{kind} '{io.name}' dims {dims} must contain only integers >= 1 or -1 "
                "(Triton model_config.proto: dims)",
            )
        if io.HasField("reshape"):
            _check_reshape(check, io, field, max_batch_size)


def _check_preferred(check: _Checker, field: str, sizes: Sequence[int], mbs: int) -> None:
    """Triton model_config.proto: preferred_batch_size in [1, max_batch_size]."""
    if mbs <= 0:
        return
    for size in sizes:
        if not 1 <= size <= mbs:
            raise check.fail(
                field,
                f"preferred batch size {size} must be in [1, {mbs}] (max_batch_size)",
            )


def _check_dynamic_batching(check: _Checker, config: ModelConfig) -> None:
    """Triton model_config.proto: ModelDynamicBatching (docs/reference/model-configuration.md)."""
    if not config.HasField("dynamic_batching"):
        return
    db = config.dynamic_batching
    field = "dynamic_batching"
    _check_preferred(
        check, f"{field}.preferred_batch_size", db.preferred_batch_size, config.max_batch_size
    )
    levels = db.priority_levels
    if levels != 0:
        if not 1 <= db.default_priority_level <= levels:
            raise check.fail(
                f"{field}.default_priority_level",
                f"default priority level must be in range [1, {levels}], "
                f"got {db.default_priority_level}",
            )
        for level in db.priority_queue_policy:
            if not 1 <= level <= levels:
                raise check.fail(
                    f"{field}.priority_queue_policy",
                    f"priority queue policy must have priority level in range [1, {levels}], "
                    f"got {level}",
                )
    if db.preserve_ordering:
        if levels > 1:
            raise check.fail(
                f"{field}.preserve_ordering",
                "Only one priority level is allowed when 'preserve_ordering' is true",
            )
        policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
        for policy in policies:
            if policy.default_timeout_microseconds != 0 and policy.timeout_action == policy.DELAY:
                raise check.fail(
                    f"{field}.default_queue_policy",
                    "Queue policy can not have DELAY as timeout action when "
                    "'preserve_ordering' is true",
                )


def _check_sequence_batching(check: _Checker, config: ModelConfig) -> None:
    """Triton model_config.proto: ModelSequenceBatching.StrategyOldest.preferred_batch_size."""
    seq = config.sequence_batching
    if config.HasField("sequence_batching") and seq.HasField("oldest"):
        _check_preferred(
            check,
            "sequence_batching.oldest.preferred_batch_size",
            seq.oldest.preferred_batch_size,
            config.max_batch_size,
        )


def _check_instance_groups(check: _Checker, config: ModelConfig, gpu_ids: Sequence[int]) -> None:
    """Triton model_config.proto: ModelInstanceGroup kind, count, gpus."""
    model = config.name
    available = set(gpu_ids)
    for index, group in enumerate(config.instance_group):
        field = f"instance_group[{index}]"
        prefix = f"instance group '{group.name}' of model '{model}'"
        if group.count < 1:
            raise check.fail(f"{field}.count", f"{prefix} must specify count >= 1")
        if group.kind == ModelInstanceGroup.KIND_GPU:
            if not available:
                raise check.fail(
                    f"{field}.kind",
                    f"{prefix} has kind KIND_GPU but server does not support GPUs "
                    "(NVML finds no GPU on this host, or nvidia-ml-py is not installed)",
                )
            for gpu in group.gpus:
                if gpu not in available:
                    listed = ", ".join(map(str, sorted(available)))
                    raise check.fail(
                        f"{field}.gpus",
                        f"{prefix} specifies invalid or unsupported gpu id {gpu}; "
                        f"GPUs available: {listed}",
                    )
        elif group.gpus:
            kind = ModelInstanceGroup.Kind.Name(group.kind)
            raise check.fail(
                f"{field}.gpus", f"{prefix} has kind {kind} but specifies one or more GPUs"
            )


def _check_ensemble(check: _Checker, config: ModelConfig) -> None:
    """Triton model_config.proto: ensembles have ensemble_scheduling and no instance_group."""
    if config.platform == ENSEMBLE_PLATFORM and not config.HasField("ensemble_scheduling"):
        raise check.fail(
            "ensemble_scheduling", "ensemble_scheduling must be set for an ensemble model"
        )
    if config.platform != ENSEMBLE_PLATFORM:
        raise check.fail(
            "ensemble_scheduling",
            "ensemble_scheduling is only allowed when platform is 'ensemble'",
        )
    if config.instance_group:
        raise check.fail("instance_group", "an ensemble model must not have instance_group")


def queue_shards(config: ModelConfig, path: Path | None = None) -> int:
    """How many streams the model's queue is split over: the ``queue_shards`` parameter
    (``parameters { key: "queue_shards" value: { string_value: "3" } }``), 1 without it.

    Raises:
        ConfigError: not a whole number from 1 to :data:`MAX_QUEUE_SHARDS`, or set on an
            ensemble (which has no queue of its own).
    """
    if QUEUE_SHARDS_PARAMETER not in config.parameters:
        return 1
    text = config.parameters[QUEUE_SHARDS_PARAMETER].string_value.strip()
    field = f"parameters.{QUEUE_SHARDS_PARAMETER}"
    check = _Checker(config.name, path or Path(config.name))
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_QUEUE_SHARDS:
        raise check.fail(
            field,
            f"parameter '{QUEUE_SHARDS_PARAMETER}' of model '{config.name}' must be a whole "
            f"number from 1 to {MAX_QUEUE_SHARDS}, got '{text}'",
        )
    if config.platform == ENSEMBLE_PLATFORM and int(text) > 1:
        raise check.fail(
            field,
            f"parameter '{QUEUE_SHARDS_PARAMETER}' of ensemble '{config.name}': an ensemble "
            "has no queue of its own; shard the queues of its steps' models instead",
        )
    return int(text)


def validate(
    config: ModelConfig,
    *,
    model_dir: Path,
    gpu_ids: Sequence[int] = (),
    config_path: Path | None = None,
) -> None:
    """Check a completed config against Triton's load-time rules.

    Args:
        config: The normalized model config.
        model_dir: The model directory; its name must equal ``config.name``.
        gpu_ids: CUDA device ids of this host; empty on a CPU-only host.
        config_path: The config file, for messages (default: ``model_dir``).

    Raises:
        ConfigError: The first rule broken, naming the model, field and rule.
    """
    check = _Checker(config.name or model_dir.name, config_path or model_dir)
    if config.name != model_dir.name:
        raise check.fail(
            "name",
            f"unexpected directory name '{model_dir.name}' for model '{config.name}', "
            "directory name must equal model name",
        )
    if config.max_batch_size < 0:
        raise check.fail("max_batch_size", f"must be >= 0, got {config.max_batch_size}")
    _check_tensors(check, config.input, "input", config.max_batch_size)
    _check_tensors(check, config.output, "output", config.max_batch_size)
    _check_dynamic_batching(check, config)
    _check_sequence_batching(check, config)
    check_sequence_batching(config, model_dir, check.path)
    queue_shards(config, check.path)
    if is_ensemble(config):
        _check_ensemble(check, config)
    else:
        _check_instance_groups(check, config, gpu_ids)
