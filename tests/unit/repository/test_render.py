"""sluice.repository.render: Triton's config JSON (docs/reference/http-protocol.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.repository import (
    ConfigError,
    config_from_json,
    config_to_json,
    normalize,
    parse_config_text,
    resolve_backend,
)

SIMPLE = """
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
"""

# Triton's answer for this config on a CPU-only host, verbatim (docs/reference/http-protocol.md).
SIMPLE_JSON = json.loads("""
{"name":"simple","platform":"onnxruntime_onnx","backend":"onnxruntime","runtime":"",
 "version_policy":{"latest":{"num_versions":1}},"max_batch_size":8,
 "input":[{"name":"INPUT0","data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[16],
           "is_shape_tensor":false,"allow_ragged_batch":false,"optional":false,"is_non_linear_format_io":false}],
 "output":[{"name":"OUTPUT0","data_type":"TYPE_FP32","dims":[16],"label_filename":"",
            "is_shape_tensor":false,"is_non_linear_format_io":false}],
 "batch_input":[],"batch_output":[],
 "optimization":{"priority":"PRIORITY_DEFAULT","input_pinned_memory":{"enable":true},
                 "output_pinned_memory":{"enable":true},"gather_kernel_buffer_threshold":0,"eager_batching":false},
 "dynamic_batching":{"preferred_batch_size":[8],"max_queue_delay_microseconds":100,"preserve_ordering":false,
                     "priority_levels":0,"default_priority_level":0,"priority_queue_policy":{}},
 "instance_group":[{"name":"simple","kind":"KIND_CPU","count":2,"gpus":[],"secondary_devices":[],
                    "profile":[],"passive":false,"host_policy":""}],
 "default_model_filename":"model.onnx","cc_model_filenames":{},"metric_tags":{},"parameters":{},
 "model_warmup":[]}
""")


def test_protocol_example_exactly(tmp_path: Path) -> None:
    config = parse_config_text(SIMPLE)
    resolve_backend(config, tmp_path / "simple", [1])
    normalize(config)
    assert config_to_json(config) == SIMPLE_JSON


def _get(data: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        data = data[key]
    return data


@pytest.mark.parametrize(
    ("text", "path", "expected"),
    [
        (
            "input { name: 'x' dims: [2, -1] reshape { shape: [-1, 2] } }",
            ("input", 0, "dims"),
            [2, -1],
        ),
        (
            "input { name: 'x' dims: [4] reshape { shape: [2, 2] } }",
            ("input", 0, "reshape", "shape"),
            [2, 2],
        ),
        (
            "output { name: 'y' dims: [3] reshape { shape: [3] } }",
            ("output", 0, "reshape", "shape"),
            [3],
        ),
        (
            "version_policy { specific { versions: [1, 3] } }",
            ("version_policy", "specific", "versions"),
            [1, 3],
        ),
        (
            "dynamic_batching { priority_levels: 3 default_priority_level: 2 }",
            ("dynamic_batching", "priority_levels"),
            3,
        ),
        (
            "dynamic_batching { default_queue_policy { default_timeout_microseconds: 9 } }",
            ("dynamic_batching", "default_queue_policy", "default_timeout_microseconds"),
            9,
        ),
        (
            "dynamic_batching { priority_queue_policy "
            "{ key: 1 value { default_timeout_microseconds: 5 } } }",
            ("dynamic_batching", "priority_queue_policy", "1", "default_timeout_microseconds"),
            5,
        ),
        (
            "sequence_batching { max_sequence_idle_microseconds: 7 }",
            ("sequence_batching", "max_sequence_idle_microseconds"),
            7,
        ),
        (
            "sequence_batching { oldest { max_queue_delay_microseconds: 6 } }",
            ("sequence_batching", "oldest", "max_queue_delay_microseconds"),
            6,
        ),
        (
            "sequence_batching { direct { max_queue_delay_microseconds: 5 } }",
            ("sequence_batching", "direct", "max_queue_delay_microseconds"),
            5,
        ),
        (
            "sequence_batching { state { input_name: 'a' output_name: 'b' dims: [-1, 4] } }",
            ("sequence_batching", "state", 0, "dims"),
            [-1, 4],
        ),
        (
            "ensemble_scheduling { step { model_name: 'p' model_version: -1 } }",
            ("ensemble_scheduling", "step", 0, "model_version"),
            -1,
        ),
        (
            "model_warmup { name: 'w' inputs { key: 'x' value { dims: [2, 3] } } }",
            ("model_warmup", 0, "inputs", "x", "dims"),
            [2, 3],
        ),
    ],
)
def test_64_bit_fields_become_numbers(
    text: str, path: tuple[str | int, ...], expected: Any
) -> None:
    data = config_to_json(parse_config_text(text.replace("'", '"')))
    value = _get(data, path)
    assert value == expected
    assert json.loads(json.dumps(data)) == data


def test_unset_messages_omitted_and_map_keys_stay_strings() -> None:
    data = config_to_json(
        parse_config_text("dynamic_batching { priority_queue_policy { key: 2 value { } } }")
    )
    assert "sequence_batching" not in data
    assert "model_transaction_policy" not in data
    assert "version_policy" not in data
    assert list(data["dynamic_batching"]["priority_queue_policy"]) == ["2"]
    assert data["max_batch_size"] == 0 and data["platform"] == ""


def test_round_trip(tmp_path: Path) -> None:
    config = parse_config_text(SIMPLE)
    resolve_backend(config, tmp_path / "simple", [1])
    normalize(config)
    data = config_to_json(config)
    assert config_from_json(data) == config
    assert config_from_json(json.dumps(data)) == config


@pytest.mark.parametrize(
    "data",
    ['{"name": "m", "nope": 1}', "{not json", {"max_batch_size": "eight"}, {"input": 3}],
)
def test_config_from_json_errors(data: str | dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="invalid model configuration JSON"):
        config_from_json(data)


def test_empty_config_renders_defaults() -> None:
    data = config_to_json(ModelConfig())
    assert data["input"] == [] and data["parameters"] == {}
