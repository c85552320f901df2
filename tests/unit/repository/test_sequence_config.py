"""sluice.repository.sequence_config: the sequence_batching block checked and read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.repository.errors import ConfigError
from sluice.repository.sequence_config import ControlSpec, sequence_spec

BASE = 'name: "m" max_batch_size: 4 '


def _spec(text: str, model_dir: Path = Path("/nonexistent")) -> object:
    return sequence_spec(text_format.Parse(BASE + text, ModelConfig()), model_dir)


def test_direct_is_the_default_strategy_and_controls_are_read() -> None:
    spec = _spec(
        "sequence_batching { max_sequence_idle_microseconds: 5 control_input ["
        ' { name: "S" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },'
        ' { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ] }'
    )
    assert spec.strategy == "direct"  # type: ignore[attr-defined]
    assert spec.controls == (  # type: ignore[attr-defined]
        ControlSpec("S", "START", "TYPE_FP32", 0.0, 1.0),
        ControlSpec("C", "CORRID", "TYPE_STRING"),
    )
    assert spec.corrid_type == "TYPE_STRING"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (
            'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] } ]',
            "control S of kind CONTROL_SEQUENCE_START must specify exactly one of",
        ),
        (
            'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_END '
            "int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ] } ] } ]",
            "exactly one of int32_false_true, fp32_false_true or bool_false_true",
        ),
        (
            'control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
            "data_type: TYPE_FP32 } ] } ]",
            "control C of kind CONTROL_SEQUENCE_CORRID must specify data_type TYPE_UINT64",
        ),
        (
            'control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_READY '
            'int32_false_true: [ 0, 1 ] } ] }, { name: "B" control [ { kind: '
            "CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] } ]",
            "multiple CONTROL_SEQUENCE_READY tensors",
        ),
        ('state [ { input_name: "I" data_type: TYPE_FP32 dims: [ 1 ] } ]', "both input_name"),
        (
            'state [ { input_name: "I" output_name: "O" data_type: TYPE_STRING dims: [ 1 ] } ]',
            "non-string data_type",
        ),
        (
            'state [ { input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [ 1 ] '
            'initial_state { data_type: TYPE_FP32 dims: [ 1 ] data_file: "x.bin" } } ]',
            "initial_state data_file 'x.bin' of state 'I' not found",
        ),
        ("oldest { max_candidate_sequences: 0 }", "max_candidate_sequences must be > 0"),
    ],
)
def test_invalid_blocks_are_refused_naming_the_rule(block: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        _spec("sequence_batching { " + block + " }")
    assert "'m'" in str(info.value)


def test_response_cache_cannot_be_combined() -> None:
    with pytest.raises(ConfigError, match="response cache is not supported"):
        _spec("sequence_batching { } response_cache { enable: true }")


def test_state_initial_dims_and_file(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    np.zeros(3, dtype=np.float32).tofile(tmp_path / "initial_state" / "s.bin")
    spec = _spec(
        'sequence_batching { oldest { max_candidate_sequences: 2 } state [ { input_name: "I" '
        'output_name: "O" data_type: TYPE_FP32 dims: [ -1 ] initial_state { data_type: '
        'TYPE_FP32 dims: [ 3 ] data_file: "s.bin" } }, { input_name: "J" output_name: "P" '
        "data_type: TYPE_INT32 dims: [ 2, -1 ] } ] }",
        tmp_path,
    )
    first, second = spec.states  # type: ignore[attr-defined]
    assert (first.initial_dims, first.initial_zero) == ((3,), False)
    assert first.initial_file == str(tmp_path / "initial_state" / "s.bin")
    assert (second.initial_dims, second.initial_zero) == ((2, 1), True)
    assert spec.candidates == 2  # type: ignore[attr-defined]
