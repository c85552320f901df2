"""sluice.repository.config: text-format parsing and config file choice.

Rules: docs/reference/model-configuration.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig, ModelInstanceGroup

from sluice.repository import ConfigError, find_config_file, parse_config_text, read_model_config

SEQUENCE_CONFIG = """
name: "seq"
max_batch_size: 4
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] }
  control_input [
    {
      name: "START"
      control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ]
    },
    {
      name: "CORRID"
      control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ]
    }
  ]
  state [
    {
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: [ -1 ]
      initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zeros" }
    }
  ]
}
"""

ENSEMBLE_CONFIG = """
name: "ens"
platform: "ensemble"
ensemble_scheduling {
  step [
    {
      model_name: "pre"
      model_version: -1
      input_map { key: "IN" value: "INPUT0" }
      output_map { key: "OUT" value: "mid" }
    }
  ]
}
"""

FULL_CONFIG = """
# every field the repository package reads
name: "full"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
max_batch_size: 8
version_policy: { specific: { versions: [1, 3] } }
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 16 ]
  },
  {
    name: "SCALAR"
    data_type: TYPE_INT32
    dims: [ 1 ]
    reshape: { shape: [ ] }
    optional: true
  }
]
output {
  name: "OUTPUT0"
  data_type: TYPE_FP32
  dims: 4   # repeated scalar lines
  dims: 4
  label_filename: "labels.txt"
}
instance_group [
  { name: "gpu_group" kind: KIND_GPU count: 2 gpus: [ 0, 1 ] },
  { kind: KIND_CPU }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 5000 }
  priority_queue_policy {
    key: 2
    value: { timeout_action: DELAY default_timeout_microseconds: 100 max_queue_size: 7 }
  }
}
model_warmup [
  {
    name: "zeros"
    batch_size: 2
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
  }
]
parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env" } }
optimization {
  input_pinned_memory { enable: false }
  execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] }
}
model_transaction_policy { decoupled: false }
response_cache { enable: true }
default_model_filename: "model.onnx"
"""


def test_parse_every_field() -> None:
    config = parse_config_text(FULL_CONFIG)
    assert config.name == "full"
    assert list(config.version_policy.specific.versions) == [1, 3]
    assert [list(i.dims) for i in config.input] == [[16], [1]]
    assert config.input[1].HasField("reshape") and list(config.input[1].reshape.shape) == []
    assert config.input[1].optional
    assert list(config.output[0].dims) == [4, 4]
    assert config.output[0].data_type == DataType.TYPE_FP32
    gpu_group, cpu_group = config.instance_group
    assert (gpu_group.kind, gpu_group.count, list(gpu_group.gpus)) == (
        ModelInstanceGroup.KIND_GPU,
        2,
        [0, 1],
    )
    assert cpu_group.kind == ModelInstanceGroup.KIND_CPU
    db = config.dynamic_batching
    assert list(db.preferred_batch_size) == [4, 8]
    assert db.default_queue_policy.default_timeout_microseconds == 5000
    assert db.priority_queue_policy[2].max_queue_size == 7


def test_parse_sequence_batching() -> None:
    config = parse_config_text(SEQUENCE_CONFIG)
    seq = config.sequence_batching
    assert seq.max_sequence_idle_microseconds == 5_000_000
    assert list(seq.oldest.preferred_batch_size) == [2]
    assert [c.name for c in seq.control_input] == ["START", "CORRID"]
    assert list(seq.control_input[0].control[0].fp32_false_true) == [0.0, 1.0]
    assert seq.state[0].initial_state[0].name == "zeros"


def test_parse_ensemble_scheduling() -> None:
    config = parse_config_text(ENSEMBLE_CONFIG)
    assert config.ensemble_scheduling.step[0].model_version == -1
    assert config.ensemble_scheduling.step[0].output_map["OUT"] == "mid"


def test_parse_warmup_parameters_optimization() -> None:
    config = parse_config_text(FULL_CONFIG)
    assert config.model_warmup[0].inputs["INPUT0"].zero_data
    assert config.parameters["EXECUTION_ENV_PATH"].string_value.endswith("/env")
    assert not config.optimization.input_pinned_memory.enable
    assert config.optimization.HasField("input_pinned_memory")
    assert not config.optimization.HasField("output_pinned_memory")
    assert config.response_cache.enable


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('name: "m"\nfoo: 1\n', "line 2 column 1"),
        ('name: "m"\nmax_batch_size: "x"\n', "line 2"),
        ("input { data_type: TYPE_NOPE }", "TYPE_NOPE"),
        ("input {", "line 1"),
    ],
)
def test_parse_error_names_file_and_line(text: str, fragment: str) -> None:
    path = Path("/repo/m/config.pbtxt")
    with pytest.raises(ConfigError) as info:
        parse_config_text(text, path=path, model="m")
    message = str(info.value)
    assert message.startswith("model 'm' (/repo/m/config.pbtxt): ")
    assert fragment in message
    assert info.value.code == "INVALID_ARG"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("files", "config_name", "expected"),
    [
        ({}, None, None),
        ({"config.pbtxt": 'name: "default"'}, None, "default"),
        ({"config.pbtxt": 'name: "default"'}, "h100", "default"),
        (
            {"config.pbtxt": 'name: "default"', "configs/h100.pbtxt": 'name: "h100"'},
            "h100",
            "h100",
        ),
        ({"configs/h100.pbtxt": 'name: "h100"'}, None, None),
    ],
)
def test_read_model_config_choice(
    tmp_path: Path, files: dict[str, str], config_name: str | None, expected: str | None
) -> None:
    for relative, text in files.items():
        _write(tmp_path / relative, text)
    config = read_model_config(tmp_path, config_name=config_name)
    assert (config.name if config is not None else None) == expected
    assert (find_config_file(tmp_path, config_name=config_name) is None) == (expected is None)


def test_read_model_config_parse_error_names_file(tmp_path: Path) -> None:
    model_dir = tmp_path / "digits"
    path = _write(model_dir / "config.pbtxt", "max_batch_size: [")
    with pytest.raises(ConfigError, match=f"model 'digits' \\({path}\\): line 1"):
        read_model_config(model_dir)


def test_empty_config_file_is_an_empty_config(tmp_path: Path) -> None:
    _write(tmp_path / "config.pbtxt", "# nothing\n")
    assert read_model_config(tmp_path) == ModelConfig()
