"""ONNX Runtime session settings from a model config (Triton onnxruntime_backend options).

A pure mapping, tested without a session: :func:`session_settings` reads the
config and the providers this onnxruntime offers and returns
:class:`OrtSettings`; :func:`apply_settings` writes them onto an
``onnxruntime.SessionOptions``. Sources (triton-inference-server/onnxruntime_backend
README, "Model Config Options" and "ONNX Runtime with TensorRT optimization"):

* ``parameters`` ``intra_op_thread_count`` / ``inter_op_thread_count`` (int,
  0 = ORT's default), ``execution_mode`` (``0`` sequential, ``1`` parallel;
  Sluice also takes the words), ``enable_mem_arena``, ``enable_mem_pattern``
  (``0``/``1``), and ``memory.enable_memory_arena_shrinkage`` /
  ``session.use_device_allocator_for_initializers`` passed on as ORT config entries.
* ``optimization { graph { level } }``: ``-1`` basic, ``1`` basic + extended,
  ``2`` everything off, unset = everything on.
* ``optimization { execution_accelerators { gpu_execution_accelerator [ { name:
  "tensorrt" ... } ] } }``: the TensorRT execution provider ahead of CUDA for
  GPU instances, its ``parameters`` mapped to ``trt_*`` provider options;
  ``name: "cuda"`` passes its parameters to the CUDA provider. An accelerator
  this onnxruntime cannot offer is skipped with a warning (Triton would fail the
  load; serving on CUDA/CPU is the friendlier choice for a Python server whose
  onnxruntime build is chosen by pip). ``cpu_execution_accelerator`` ``openvino``
  is likewise skipped with a warning.
* Sluice's own: ORT's intra-op thread pool does not spin-wait by default
  (``session.intra_op.allow_spinning`` = ``"0"``), because spinning threads burn
  the cores that the worker's Redis polling and the gateway need; the config
  parameter ``session.intra_op.allow_spinning`` = ``"1"`` turns it back on.
* A KIND_CPU instance whose config sets no ``intra_op_thread_count`` gets
  ``max(1, cores // CPU instances of the model)`` intra-op threads
  (:func:`default_intra_op_threads`): ORT's own default (every core) for a single
  instance, as Triton's onnxruntime backend leaves it, and a share of the cores for
  several (ORT would give each instance every core, so N instances would oversubscribe
  them N times). ``intra_op_thread_count: 0`` still asks for ORT's default. Which
  count serves best depends on the machine (a compute-bound batch gains from a second
  thread, a memory-bound one does not, and the gateway and Redis want cores too), which
  is why Sluice follows ORT and Triton rather than a rule of its own
  (docs/user-guide/backends.md, "Threads").
* Sluice's own: ORT's intra-op helper threads (every thread of the pool but the caller)
  run at ``SCHED_IDLE`` (:mod:`gpu_workers.thread_priority`), so they use a core only
  when nothing else on the machine wants it (the gateway, Redis, other instances); the
  config parameter ``intra_op_thread_priority`` = ``"normal"`` leaves them at the
  process's priority. The price: on a machine kept busy by other work at normal
  priority, a helper that took its share of an operator and was then preempted keeps
  the calling thread waiting until a core frees up (a rare slow call; the p99 stays as
  with one thread). Not applied with ``execution_mode`` parallel: the calling thread
  waits for whole nodes on the inter-op pool, whose threads cannot be told apart from
  the intra-op helpers, so every call would wait for preempted inter-op threads.
* ``intra_op_thread_count`` / ``inter_op_thread_count`` above :data:`MAX_THREADS` are
  refused at load (ORT would try to start them all and the load would not end).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tritonclient.grpc.model_config_pb2 import ModelConfig, ModelInstanceGroup

logger = logging.getLogger(__name__)

__all__ = ["OrtSettings", "apply_settings", "default_intra_op_threads", "session_settings"]

#: Session config entries a model config may set directly (Triton onnxruntime_backend).
_PASSTHROUGH_ENTRIES = (
    "memory.enable_memory_arena_shrinkage",
    "session.use_device_allocator_for_initializers",
)
_SPINNING = "session.intra_op.allow_spinning"
_PRIORITY = "intra_op_thread_priority"
_PRIORITIES = ("idle", "normal")

#: Triton's TensorRT accelerator parameter -> TensorRT EP option (value kept as text).
_TRT_RENAMES = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}

#: ``optimization.graph.level`` -> GraphOptimizationLevel member name.
_GRAPH_LEVELS = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}

_EXECUTION_MODES = {
    "0": "ORT_SEQUENTIAL",
    "sequential": "ORT_SEQUENTIAL",
    "1": "ORT_PARALLEL",
    "parallel": "ORT_PARALLEL",
}


@dataclass(frozen=True, slots=True)
class OrtSettings:
    """What a session of one model instance is created with.

    Attributes:
        providers: ``InferenceSession(providers=...)``: names or ``(name, options)``.
        intra_op_threads: ``SessionOptions.intra_op_num_threads`` (None = ORT default).
        inter_op_threads: ``SessionOptions.inter_op_num_threads`` (None = ORT default).
        execution_mode: ``ExecutionMode`` member name, None = ORT default (sequential).
        graph_level: ``GraphOptimizationLevel`` member name, None = ORT default (all).
        enable_mem_arena: ``enable_cpu_mem_arena`` (None = ORT default).
        enable_mem_pattern: ``enable_mem_pattern`` (None = ORT default).
        config_entries: ``add_session_config_entry`` key -> value.
        helper_priority: ``"idle"``: the session's pool threads (not the caller) are moved
            to ``SCHED_IDLE`` once it is created; ``"normal"``: left as they are.
        warnings: what was asked for but is ignored here, one sentence each.
    """

    providers: list[str | tuple[str, dict[str, str]]]
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    execution_mode: str | None = None
    graph_level: str | None = None
    enable_mem_arena: bool | None = None
    enable_mem_pattern: bool | None = None
    config_entries: dict[str, str] = field(default_factory=dict)
    helper_priority: str = "idle"
    warnings: list[str] = field(default_factory=list)


def _param(config: ModelConfig, key: str) -> str | None:
    if key not in config.parameters:
        return None
    return config.parameters[key].string_value.strip()


#: most intra-op or inter-op threads a config may ask for (ORT would try to start them all
#: and the load would not end).
MAX_THREADS = 1024


def _thread_count(config: ModelConfig, key: str) -> int | None:
    """An ``*_thread_count`` parameter: an integer from 0 (ORT's default) to
    :data:`MAX_THREADS`, or None when absent.

    Raises:
        ValueError: another value, the empty string included (Triton's backends parse the
            value with ``std::stoi``, which refuses it), naming the model and the parameter.
    """
    text = _param(config, key)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(
            f"model '{config.name}': parameter '{key}' must be an integer, got '{text}'"
        ) from None
    if value < 0:
        raise ValueError(f"model '{config.name}': parameter '{key}' must be >= 0, got {value}")
    if value > MAX_THREADS:
        raise ValueError(
            f"model '{config.name}': parameter '{key}' must be <= {MAX_THREADS}, got {value}"
        )
    return value


def _bool_param(config: ModelConfig, key: str) -> bool | None:
    """A flag parameter: 0/1, true/false, yes/no, on/off (any case), or None when absent.

    Raises:
        ValueError: another value, the empty string included, naming the model and the
            parameter.
    """
    text = _param(config, key)
    if text is None:
        return None
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(
        f"model '{config.name}': parameter '{key}' must be 0/1 or true/false, got '{text}'"
    )


def _trt_options(params: Any, device_id: int) -> dict[str, str]:
    """Triton's TensorRT accelerator parameters -> TensorRT EP provider options."""
    options = {"device_id": str(device_id)}
    for key, value in params.items():
        if key == "precision_mode":
            mode = value.upper()
            if mode == "FP16":
                options["trt_fp16_enable"] = "True"
            elif mode == "INT8":
                options["trt_int8_enable"] = "True"
        elif key in _TRT_RENAMES:
            options[_TRT_RENAMES[key]] = value
        elif key.startswith("trt_"):
            options[key] = value
        else:
            logger.warning("TensorRT accelerator parameter '%s' is not known; ignored", key)
    return options


def _providers(
    config: ModelConfig, kind: str, device_id: int, available: Sequence[str], warnings: list[str]
) -> list[str | tuple[str, dict[str, str]]]:
    accelerators = config.optimization.execution_accelerators
    model = config.name
    for accelerator in accelerators.cpu_execution_accelerator:
        warnings.append(
            f"model '{model}': cpu_execution_accelerator '{accelerator.name}' is not available "
            "in Sluice's onnxruntime backend; running on the default CPU execution provider"
        )
    providers: list[str | tuple[str, dict[str, str]]] = []
    if kind == "GPU":
        cuda_options: dict[str, str] = {"device_id": str(device_id)}
        for accelerator in accelerators.gpu_execution_accelerator:
            name = accelerator.name
            if name == "tensorrt":
                if "TensorrtExecutionProvider" in available:
                    providers.append(
                        (
                            "TensorrtExecutionProvider",
                            _trt_options(accelerator.parameters, device_id),
                        )
                    )
                else:
                    warnings.append(
                        f"model '{model}': gpu_execution_accelerator 'tensorrt' asked for but "
                        "this onnxruntime has no TensorrtExecutionProvider; running on CUDA"
                    )
            elif name == "cuda":
                cuda_options.update(dict(accelerator.parameters))
            else:
                warnings.append(
                    f"model '{model}': gpu_execution_accelerator '{name}' is not supported; ignored"
                )
        if "CUDAExecutionProvider" not in available:
            raise RuntimeError(
                f"model '{model}' is KIND_GPU but this onnxruntime has no "
                "CUDAExecutionProvider (install onnxruntime-gpu)"
            )
        providers.append(("CUDAExecutionProvider", cuda_options))
    elif accelerators.gpu_execution_accelerator:
        logger.info(
            "model '%s': gpu_execution_accelerator ignored for a KIND_%s instance", model, kind
        )
    providers.append("CPUExecutionProvider")
    return providers


def default_intra_op_threads(config: ModelConfig, cores: int) -> int:
    """Intra-op threads of a KIND_CPU instance whose config names none (Sluice's default).

    ``max(1, cores // n)`` where ``n`` is the model's KIND_CPU instance count
    (Σ ``instance_group.count``): every core for one instance (ORT's default, which
    Triton's onnxruntime backend keeps), an equal share of them for several.

    Args:
        config: the effective model config (``instance_group`` completed).
        cores: CPUs this process may run on.
    """
    instances = sum(
        max(1, group.count)
        for group in config.instance_group
        if group.kind == ModelInstanceGroup.Kind.KIND_CPU
    )
    return max(1, cores // max(1, instances))


def session_settings(
    config: ModelConfig,
    kind: str,
    device_id: int,
    available: Sequence[str],
    cores: int | None = None,
) -> OrtSettings:
    """The session settings of one instance of ``config``.

    Args:
        config: the effective model config.
        kind: instance kind without ``KIND_`` (``CPU``, ``GPU``, ``MODEL``).
        device_id: the GPU ordinal of a ``GPU`` instance.
        available: ``onnxruntime.get_available_providers()``.
        cores: CPUs this process may run on (None = ``os.sched_getaffinity``), for the
            default intra-op thread count of a CPU instance.

    Returns:
        The settings; ``warnings`` lists each option that is ignored here.

    Raises:
        ValueError: a parameter that is not a valid number/flag/mode, naming it.
        RuntimeError: a KIND_GPU instance on an onnxruntime without CUDA.
    """
    warnings: list[str] = []
    providers = _providers(config, kind, device_id, available, warnings)
    mode_text = _param(config, "execution_mode")
    execution_mode = None
    if mode_text is not None:
        execution_mode = _EXECUTION_MODES.get(mode_text.lower())
        if execution_mode is None:
            raise ValueError(
                f"model '{config.name}': parameter 'execution_mode' must be 0 (sequential) or "
                f"1 (parallel), got '{mode_text}'"
            )
    graph_level = None
    if config.optimization.HasField("graph"):
        level = config.optimization.graph.level
        graph_level = _GRAPH_LEVELS.get(level)
        if graph_level is None and level != 0:
            raise ValueError(
                f"model '{config.name}': optimization.graph.level must be -1, 1 or 2, got {level}"
            )
    entries = {_SPINNING: "0"}
    if _bool_param(config, _SPINNING):
        entries[_SPINNING] = "1"
    for key in _PASSTHROUGH_ENTRIES:
        value = _param(config, key)
        if value:
            entries[key] = value
    asked = _param(config, _PRIORITY)
    asked_priority = "" if asked is None else asked.lower()
    if asked is not None and asked_priority not in _PRIORITIES:
        raise ValueError(
            f"model '{config.name}': parameter '{_PRIORITY}' must be 'idle' or 'normal', got "
            f"'{_param(config, _PRIORITY)}'"
        )
    helper_priority = asked_priority or "idle"
    if execution_mode == "ORT_PARALLEL":
        # the calling thread waits for whole nodes on the inter-op pool, whose threads
        # cannot be told apart from the intra-op helpers: none is made idle
        if asked_priority == "idle":
            warnings.append(
                f"model '{config.name}': '{_PRIORITY}' 'idle' is not applied with "
                "execution_mode parallel (the inter-op threads, which the calling thread "
                "waits for, cannot be told apart from the intra-op helpers)"
            )
        helper_priority = "normal"
    intra_op_threads = _thread_count(config, "intra_op_thread_count")
    if intra_op_threads is None and kind == "CPU":
        if cores is None:
            cores = len(os.sched_getaffinity(0))
        intra_op_threads = default_intra_op_threads(config, cores)
    return OrtSettings(
        providers=providers,
        intra_op_threads=intra_op_threads,
        inter_op_threads=_thread_count(config, "inter_op_thread_count"),
        execution_mode=execution_mode,
        graph_level=graph_level,
        enable_mem_arena=_bool_param(config, "enable_mem_arena"),
        enable_mem_pattern=_bool_param(config, "enable_mem_pattern"),
        config_entries=entries,
        helper_priority=helper_priority,
        warnings=warnings,
    )


def apply_settings(settings: OrtSettings, options: Any, ort: Any) -> None:
    """Write ``settings`` onto ``options`` (an ``ort.SessionOptions``) and log its warnings.

    Args:
        settings: from :func:`session_settings`.
        options: the ``onnxruntime.SessionOptions`` to fill.
        ort: the ``onnxruntime`` module (for its enums).
    """
    for warning in settings.warnings:
        logger.warning("%s", warning)
    if settings.intra_op_threads is not None:
        options.intra_op_num_threads = settings.intra_op_threads
    if settings.inter_op_threads is not None:
        options.inter_op_num_threads = settings.inter_op_threads
    if settings.execution_mode is not None:
        options.execution_mode = getattr(ort.ExecutionMode, settings.execution_mode)
    if settings.graph_level is not None:
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, settings.graph_level)
    if settings.enable_mem_arena is not None:
        options.enable_cpu_mem_arena = settings.enable_mem_arena
    if settings.enable_mem_pattern is not None:
        options.enable_mem_pattern = settings.enable_mem_pattern
    for key, value in settings.config_entries.items():
        options.add_session_config_entry(key, value)
