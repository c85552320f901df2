"""sluice.gpu_workers.backends.ort_options: Triton onnxruntime_backend options -> ORT settings."""

from __future__ import annotations

import logging

import pytest
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.gpu_workers.backends.ort_options import apply_settings, session_settings

CPU_ONLY = ["CPUExecutionProvider"]
CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]
ALL = ["TensorrtExecutionProvider", *CUDA]

TRT_ACCELERATOR = """
optimization { execution_accelerators { gpu_execution_accelerator: [ {
  name: "tensorrt"
  parameters { key: "precision_mode" value: "FP16" }
  parameters { key: "max_workspace_size_bytes" value: "1073741824" }
  parameters { key: "trt_engine_cache_enable" value: "1" }
} ] } }
"""


def _config(text: str = "") -> ModelConfig:
    return text_format.Parse('name: "m"\n' + text, ModelConfig())


def _params(**values: str) -> str:
    return "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in values.items()
    )


def test_defaults_cpu_and_no_spinning() -> None:
    settings = session_settings(_config(), "GPU", 0, CUDA)
    assert settings.intra_op_threads is None  # ORT's default off the CPU
    settings = session_settings(_config(), "CPU", 0, CPU_ONLY, cores=2)
    assert settings.providers == ["CPUExecutionProvider"]
    assert settings.intra_op_threads == 2 and settings.inter_op_threads is None
    assert settings.execution_mode is None and settings.graph_level is None
    assert settings.config_entries == {"session.intra_op.allow_spinning": "0"}
    assert settings.helper_priority == "idle"
    assert settings.warnings == []


@pytest.mark.parametrize(
    ("value", "expected"), [("normal", "normal"), ("IDLE", "idle"), ("idle", "idle")]
)
def test_helper_thread_priority(value: str, expected: str) -> None:
    config = _config(_params(intra_op_thread_priority=value))
    assert session_settings(config, "CPU", 0, CPU_ONLY).helper_priority == expected


@pytest.mark.parametrize(("value", "warned"), [(None, False), ("idle", True), ("normal", False)])
def test_no_thread_is_made_idle_in_parallel_execution_mode(value: str | None, warned: bool) -> None:
    """The calling thread waits for the inter-op pool's threads, which cannot be told
    apart from the intra-op helpers."""
    priority = {} if value is None else {"intra_op_thread_priority": value}
    config = _config(_params(execution_mode="1", **priority))
    settings = session_settings(config, "CPU", 0, CPU_ONLY)
    assert settings.helper_priority == "normal"
    assert settings.warnings == (
        [
            "model 'm': 'intra_op_thread_priority' 'idle' is not applied with execution_mode "
            "parallel (the inter-op threads, which the calling thread waits for, cannot be "
            "told apart from the intra-op helpers)"
        ]
        if warned
        else []
    )


@pytest.mark.parametrize(
    ("groups", "cores", "threads"),
    [
        ("", 2, 2),  # no group: one instance, every core (ORT's default)
        ("instance_group [ { kind: KIND_CPU count: 1 } ]", 2, 2),
        ("instance_group [ { kind: KIND_CPU count: 1 } ]", 1, 1),
        ("instance_group [ { kind: KIND_CPU count: 1 } ]", 16, 16),
        ("instance_group [ { kind: KIND_CPU count: 4 } ]", 16, 4),
        ("instance_group [ { kind: KIND_CPU count: 2 }, { kind: KIND_CPU count: 2 } ]", 16, 4),
        ("instance_group [ { kind: KIND_CPU count: 2 } ]", 2, 1),
        ("instance_group [ { kind: KIND_CPU count: 3 } ]", 2, 1),
        ("instance_group [ { kind: KIND_CPU count: 3 } ]", 16, 5),
        ("instance_group [ { kind: KIND_CPU count: 1 }, { kind: KIND_GPU count: 4 } ]", 8, 8),
    ],
)
def test_default_intra_op_threads_share_the_cores(groups: str, cores: int, threads: int) -> None:
    settings = session_settings(_config(groups), "CPU", 0, CPU_ONLY, cores=cores)
    assert settings.intra_op_threads == threads


def test_spinning_can_be_turned_back_on() -> None:
    config = _config(_params(**{"session.intra_op.allow_spinning": "1"}))
    settings = session_settings(config, "CPU", 0, CPU_ONLY)
    assert settings.config_entries["session.intra_op.allow_spinning"] == "1"


@pytest.mark.parametrize(
    ("params", "intra", "inter", "mode"),
    [
        ({"intra_op_thread_count": "2"}, 2, None, None),
        ({"intra_op_thread_count": "1", "inter_op_thread_count": "3"}, 1, 3, None),
        ({"execution_mode": "0"}, None, None, "ORT_SEQUENTIAL"),
        ({"execution_mode": "1"}, None, None, "ORT_PARALLEL"),
        ({"execution_mode": "parallel"}, None, None, "ORT_PARALLEL"),
        ({"execution_mode": "Sequential"}, None, None, "ORT_SEQUENTIAL"),
        ({"intra_op_thread_count": "0"}, 0, None, None),
    ],
)
def test_thread_counts_and_execution_mode(
    params: dict[str, str], intra: int | None, inter: int | None, mode: str | None
) -> None:
    settings = session_settings(_config(_params(**params)), "CPU", 0, CPU_ONLY, cores=8)
    default = 8  # max(1, 8 // 1) when the config names none
    assert settings.intra_op_threads == (default if intra is None else intra)
    assert settings.inter_op_threads == inter
    assert settings.execution_mode == mode


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"intra_op_thread_count": "two"},
            "model 'm': parameter 'intra_op_thread_count' must be an integer, got 'two'",
        ),
        (
            {"inter_op_thread_count": "-1"},
            "model 'm': parameter 'inter_op_thread_count' must be >= 0, got -1",
        ),
        (
            {"execution_mode": "2"},
            "model 'm': parameter 'execution_mode' must be 0 (sequential) or 1 (parallel), got '2'",
        ),
        (
            {"enable_mem_arena": "maybe"},
            "model 'm': parameter 'enable_mem_arena' must be 0/1 or true/false, got 'maybe'",
        ),
        (
            {"intra_op_thread_priority": "high"},
            "model 'm': parameter 'intra_op_thread_priority' must be 'idle' or 'normal', "
            "got 'high'",
        ),
        (
            {"intra_op_thread_count": "100000"},
            "model 'm': parameter 'intra_op_thread_count' must be <= 1024, got 100000",
        ),
        (
            {"inter_op_thread_count": "1025"},
            "model 'm': parameter 'inter_op_thread_count' must be <= 1024, got 1025",
        ),
        # empty values are refused, as Triton's std::stoi-based parsing refuses them
        (
            {"intra_op_thread_count": ""},
            "model 'm': parameter 'intra_op_thread_count' must be an integer, got ''",
        ),
        (
            {"execution_mode": ""},
            "model 'm': parameter 'execution_mode' must be 0 (sequential) or 1 (parallel), got ''",
        ),
        (
            {"enable_mem_pattern": ""},
            "model 'm': parameter 'enable_mem_pattern' must be 0/1 or true/false, got ''",
        ),
        (
            {"intra_op_thread_priority": ""},
            "model 'm': parameter 'intra_op_thread_priority' must be 'idle' or 'normal', got ''",
        ),
    ],
)
def test_invalid_parameters_fail_the_load(params: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as info:
        session_settings(_config(_params(**params)), "CPU", 0, CPU_ONLY)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("level", "expected"),
    [(-1, "ORT_ENABLE_BASIC"), (1, "ORT_ENABLE_EXTENDED"), (2, "ORT_DISABLE_ALL")],
)
def test_graph_level(level: int, expected: str) -> None:
    config = _config(f"optimization {{ graph {{ level: {level} }} }}")
    assert session_settings(config, "CPU", 0, CPU_ONLY).graph_level == expected


def test_memory_flags_and_passthrough_entries() -> None:
    config = _config(
        _params(
            enable_mem_arena="0",
            enable_mem_pattern="true",
            **{"memory.enable_memory_arena_shrinkage": "cpu:0"},
        )
    )
    settings = session_settings(config, "CPU", 0, CPU_ONLY)
    assert (settings.enable_mem_arena, settings.enable_mem_pattern) == (False, True)
    assert settings.config_entries["memory.enable_memory_arena_shrinkage"] == "cpu:0"


def test_tensorrt_accelerator_on_gpu_with_trt_provider() -> None:
    settings = session_settings(_config(TRT_ACCELERATOR), "GPU", 1, ALL)
    assert settings.providers == [
        (
            "TensorrtExecutionProvider",
            {
                "device_id": "1",
                "trt_fp16_enable": "True",
                "trt_max_workspace_size": "1073741824",
                "trt_engine_cache_enable": "1",
            },
        ),
        ("CUDAExecutionProvider", {"device_id": "1"}),
        "CPUExecutionProvider",
    ]
    assert settings.warnings == []


def test_tensorrt_accelerator_without_trt_provider_warns_and_uses_cuda() -> None:
    settings = session_settings(_config(TRT_ACCELERATOR), "GPU", 0, CUDA)
    assert settings.providers == [
        ("CUDAExecutionProvider", {"device_id": "0"}),
        "CPUExecutionProvider",
    ]
    assert settings.warnings == [
        "model 'm': gpu_execution_accelerator 'tensorrt' asked for but this onnxruntime has "
        "no TensorrtExecutionProvider; running on CUDA"
    ]


def test_gpu_accelerator_ignored_for_cpu_instances() -> None:
    settings = session_settings(_config(TRT_ACCELERATOR), "CPU", 0, ALL)
    assert settings.providers == ["CPUExecutionProvider"]


def test_cuda_accelerator_parameters_reach_the_cuda_provider() -> None:
    config = _config(
        'optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "cuda" '
        'parameters { key: "cudnn_conv_use_max_workspace" value: "0" } } ] } }'
    )
    settings = session_settings(config, "GPU", 0, CUDA)
    assert settings.providers[0] == (
        "CUDAExecutionProvider",
        {"device_id": "0", "cudnn_conv_use_max_workspace": "0"},
    )


def test_openvino_is_ignored_with_a_warning() -> None:
    config = _config(
        "optimization { execution_accelerators { cpu_execution_accelerator: [ "
        '{ name: "openvino" } ] } }'
    )
    settings = session_settings(config, "CPU", 0, CPU_ONLY)
    assert settings.providers == ["CPUExecutionProvider"]
    assert settings.warnings == [
        "model 'm': cpu_execution_accelerator 'openvino' is not available in Sluice's "
        "onnxruntime backend; running on the default CPU execution provider"
    ]


def test_gpu_instance_without_cuda_fails() -> None:
    with pytest.raises(
        RuntimeError, match="KIND_GPU but this onnxruntime has no CUDAExecutionProvider"
    ):
        session_settings(_config(), "GPU", 0, CPU_ONLY)


def test_apply_settings_on_a_real_session_options(caplog: pytest.LogCaptureFixture) -> None:
    ort = pytest.importorskip("onnxruntime")
    config = _config(
        _params(
            intra_op_thread_count="1",
            inter_op_thread_count="2",
            execution_mode="1",
            enable_mem_pattern="0",
        )
        + "optimization { graph { level: 1 } "
        'execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } }'
    )
    settings = session_settings(config, "CPU", 0, ort.get_available_providers())
    options = ort.SessionOptions()
    with caplog.at_level(logging.WARNING):
        apply_settings(settings, options, ort)
    assert "cpu_execution_accelerator 'openvino'" in caplog.text
    assert options.intra_op_num_threads == 1
    assert options.inter_op_num_threads == 2
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    assert options.enable_mem_pattern is False
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
