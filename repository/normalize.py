"""Defaults Triton fills in before serving a model (docs/reference/model-configuration.md).

Triton ``model_config_utils.cc`` ``NormalizeModelConfig`` and
``NormalizeInstanceGroup``; the result is what ``GET .../config`` shows.
"""

from __future__ import annotations

from collections.abc import Sequence

from tritonclient.grpc.model_config_pb2 import ModelConfig, ModelInstanceGroup

from sluice.repository.backend import ENSEMBLE_PLATFORM

__all__ = ["DEFAULT_SEQUENCE_IDLE_US", "is_ensemble", "normalize"]

DEFAULT_SEQUENCE_IDLE_US = 1_000_000
# Triton SetDefaultInstanceCount: backends that default to 2 CPU instances.
_TWO_CPU_INSTANCE_BACKENDS = frozenset({"onnxruntime", "tensorflow"})


def is_ensemble(config: ModelConfig) -> bool:
    """Triton model_config.proto: platform ``ensemble`` or ``ensemble_scheduling`` set."""
    return config.platform == ENSEMBLE_PLATFORM or config.HasField("ensemble_scheduling")


def _normalize_version_policy(config: ModelConfig) -> None:
    """Triton model_config.proto: version_policy defaults to latest { num_versions: 1 }."""
    if config.version_policy.WhichOneof("policy_choice") is None:
        config.version_policy.latest.num_versions = 1


def _normalize_batching(config: ModelConfig) -> None:
    """Triton model_config.proto: preferred_batch_size, max_sequence_idle_microseconds."""
    mbs = config.max_batch_size
    dynamic = config.dynamic_batching
    if config.HasField("dynamic_batching") and not dynamic.preferred_batch_size and mbs > 0:
        dynamic.preferred_batch_size.append(mbs)
    if config.HasField("sequence_batching"):
        seq = config.sequence_batching
        if seq.max_sequence_idle_microseconds == 0:
            seq.max_sequence_idle_microseconds = DEFAULT_SEQUENCE_IDLE_US
        if seq.HasField("oldest") and not seq.oldest.preferred_batch_size and mbs > 0:
            seq.oldest.preferred_batch_size.append(mbs)


def _normalize_optimization(config: ModelConfig) -> None:
    """Triton model_config.proto: optimization.{input,output}_pinned_memory default on."""
    if not config.optimization.HasField("input_pinned_memory"):
        config.optimization.input_pinned_memory.enable = True
    if not config.optimization.HasField("output_pinned_memory"):
        config.optimization.output_pinned_memory.enable = True


def _resolve_kind(group: ModelInstanceGroup, gpu_ids: Sequence[int], auto_gpu: bool) -> None:
    """KIND_AUTO -> KIND_GPU if GPUs exist, every listed gpu exists and the backend can
    run on a GPU here (``auto_gpu``), else KIND_CPU."""
    if group.kind != ModelInstanceGroup.KIND_AUTO:
        return
    available = set(gpu_ids)
    if auto_gpu and available and all(gpu in available for gpu in group.gpus):
        group.kind = ModelInstanceGroup.KIND_GPU
    else:
        group.kind = ModelInstanceGroup.KIND_CPU


def _normalize_instance_groups(config: ModelConfig, gpu_ids: Sequence[int], auto_gpu: bool) -> None:
    """Triton model_config.proto: instance_group name, kind, count and gpus defaults."""
    if not config.instance_group:
        config.instance_group.add(name=config.name)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        _resolve_kind(group, gpu_ids, auto_gpu)
        if group.kind == ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.extend(sorted(set(gpu_ids)))
        if group.count < 1:
            two = (
                group.kind == ModelInstanceGroup.KIND_CPU
                and config.backend in _TWO_CPU_INSTANCE_BACKENDS
            )
            group.count = 2 if two else 1


def normalize(config: ModelConfig, *, gpu_ids: Sequence[int] = (), auto_gpu: bool = True) -> None:
    """Apply Triton's serving defaults in place (docs/reference/model-configuration.md).

    * ``version_policy`` := ``latest { num_versions: 1 }`` if unset.
    * ``dynamic_batching.preferred_batch_size`` := ``[max_batch_size]`` if empty
      and ``max_batch_size > 0``; the same for ``sequence_batching.oldest``.
    * ``sequence_batching.max_sequence_idle_microseconds`` := 1 000 000 if 0.
    * Non-ensembles: both pinned-memory flags on unless set; one instance group
      named after the model if there is none; unnamed groups ``<model>_<i>``;
      ``KIND_AUTO`` resolved (Triton ``NormalizeInstanceGroup``: KIND_GPU where GPUs
      are supported, else KIND_CPU); ``count`` 1 (2 for KIND_CPU groups of the
      onnxruntime and tensorflow backends) when unset; KIND_GPU groups
      without ``gpus`` get every GPU.

    Args:
        config: The model config, with name and backend resolved; changed in place.
        gpu_ids: CUDA device ids of this host; empty on a CPU-only host.
        auto_gpu: whether the model's backend can run on a GPU here. False resolves
            ``KIND_AUTO`` to KIND_CPU even with GPUs present, as Triton does for a
            backend built without GPU support (Sluice: onnxruntime without the CUDA
            execution provider, a CPU build of torch).
    """
    _normalize_version_policy(config)
    _normalize_batching(config)
    if is_ensemble(config):
        return
    _normalize_optimization(config)
    _normalize_instance_groups(config, gpu_ids, auto_gpu)
