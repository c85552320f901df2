"""sluice.repository.autocomplete: the ONNX Runtime backend's rules.

Rules: docs/reference/model-configuration.md.
"""

from __future__ import annotations

import pytest
from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig

from sluice.repository import (
    ONNX_TO_CONFIG,
    ORT_TYPE_TO_CONFIG,
    ConfigError,
    TensorSignature,
    autocomplete_from_signature,
    config_to_json,
    parse_config_text,
)

BATCHABLE_IN = (
    TensorSignature("INPUT0", "TYPE_INT32", (-1, 16)),
    TensorSignature("INPUT1", "TYPE_INT32", (-1, 16)),
)
BATCHABLE_OUT = (
    TensorSignature("OUTPUT0", "TYPE_INT8", (-1, 16)),
    TensorSignature("OUTPUT1", "TYPE_INT8", (-1, 16)),
)


def _io(config: ModelConfig, kind: str) -> list[tuple[str, str, list[int], list[int] | None]]:
    return [
        (
            io.name,
            DataType.Name(io.data_type),
            list(io.dims),
            list(io.reshape.shape) if io.HasField("reshape") else None,
        )
        for io in getattr(config, kind)
    ]


def test_both_listed_is_untouched() -> None:
    config = parse_config_text(
        'name: "m" input { name: "X" data_type: TYPE_FP32 dims: [3] } '
        'output { name: "Y" data_type: TYPE_FP32 dims: [3] }'
    )
    before = config.SerializeToString()
    autocomplete_from_signature(config, BATCHABLE_IN, BATCHABLE_OUT)
    assert config.SerializeToString() == before


def test_batchable_model_with_empty_config() -> None:
    """Triton qa expectation: two [-1,16] INT32 inputs, two INT8 outputs."""
    config = ModelConfig(name="m")
    autocomplete_from_signature(config, BATCHABLE_IN, BATCHABLE_OUT)
    assert config.max_batch_size == 4
    assert config.HasField("dynamic_batching")
    assert _io(config, "input") == [
        ("INPUT0", "TYPE_INT32", [16], None),
        ("INPUT1", "TYPE_INT32", [16], None),
    ]
    assert _io(config, "output") == [
        ("OUTPUT0", "TYPE_INT8", [16], None),
        ("OUTPUT1", "TYPE_INT8", [16], None),
    ]


@pytest.mark.parametrize(
    ("given", "default_mbs", "mbs", "dynamic"),
    [
        ("", 4, 4, True),
        ("", 8, 8, True),
        ("max_batch_size: 16", 4, 16, True),
        ("max_batch_size: 1", 4, 1, False),
        ("", 1, 1, False),
        ("sequence_batching { }", 4, 4, False),
        ("dynamic_batching { max_queue_delay_microseconds: 7 }", 4, 4, True),
    ],
)
def test_batching_fields(given: str, default_mbs: int, mbs: int, dynamic: bool) -> None:
    config = parse_config_text(f'name: "m" {given}')
    autocomplete_from_signature(
        config, BATCHABLE_IN, BATCHABLE_OUT, default_max_batch_size=default_mbs
    )
    assert config.max_batch_size == mbs
    assert config.HasField("dynamic_batching") == dynamic


def test_existing_dynamic_batching_is_kept() -> None:
    config = parse_config_text('name: "m" dynamic_batching { max_queue_delay_microseconds: 7 }')
    autocomplete_from_signature(config, BATCHABLE_IN, BATCHABLE_OUT)
    assert config.dynamic_batching.max_queue_delay_microseconds == 7


@pytest.mark.parametrize(
    ("inputs", "outputs"),
    [
        (
            (TensorSignature("X", "TYPE_FP32", (3, 16)),),
            (TensorSignature("Y", "TYPE_FP32", (-1,)),),
        ),
        ((TensorSignature("X", "TYPE_FP32", (-1, 16)),), (TensorSignature("Y", "TYPE_FP32", ()),)),
    ],
)
def test_not_batchable(
    inputs: tuple[TensorSignature, ...], outputs: tuple[TensorSignature, ...]
) -> None:
    config = ModelConfig(name="m")
    autocomplete_from_signature(config, inputs, outputs)
    assert config.max_batch_size == 0
    assert not config.HasField("dynamic_batching")
    assert _io(config, "input")[0][2] == list(inputs[0].dims)

    with pytest.raises(ConfigError) as info:
        autocomplete_from_signature(ModelConfig(name="m", max_batch_size=8), inputs, outputs)
    assert info.value.message == (
        "autofill failed for model 'm': model does not support batching while non-zero "
        "max_batch_size is specified"
    )


@pytest.mark.parametrize(
    ("dims", "batching", "expected_dims", "expected_reshape"),
    [
        ((-1,), True, [1], []),
        ((), False, [1], None),
        ((-1, 3), True, [3], None),
        ((2, -1), False, [2, -1], None),
    ],
)
def test_generated_dims(
    dims: tuple[int, ...],
    batching: bool,
    expected_dims: list[int],
    expected_reshape: list[int] | None,
) -> None:
    config = ModelConfig(name="m")
    sig = (TensorSignature("T", "TYPE_FP32", dims),)
    out = (TensorSignature("O", "TYPE_FP32", (-1, 1) if batching else (1,)),)
    autocomplete_from_signature(config, sig, out)
    assert (config.max_batch_size > 0) == batching
    assert _io(config, "input") == [("T", "TYPE_FP32", expected_dims, expected_reshape)]


def test_only_missing_list_is_generated() -> None:
    config = parse_config_text('name: "m" input { name: "mine" data_type: TYPE_FP32 dims: [16] }')
    autocomplete_from_signature(config, BATCHABLE_IN, BATCHABLE_OUT)
    assert [io.name for io in config.input] == ["mine"]
    assert [io.name for io in config.output] == ["OUTPUT0", "OUTPUT1"]


def test_scalar_reshape_renders_as_empty_shape() -> None:
    config = ModelConfig(name="m")
    autocomplete_from_signature(
        config,
        (TensorSignature("S", "TYPE_FP32", (-1,)),),
        (TensorSignature("O", "TYPE_FP32", (-1,)),),
    )
    assert config_to_json(config)["input"][0]["reshape"] == {"shape": []}


def test_unknown_data_type() -> None:
    with pytest.raises(ConfigError, match="unsupported data type 'TYPE_COMPLEX'"):
        autocomplete_from_signature(
            ModelConfig(name="m"),
            (TensorSignature("X", "TYPE_COMPLEX", (-1,)),),
            (),
        )


def test_type_tables_cover_the_same_config_types() -> None:
    assert set(ONNX_TO_CONFIG.values()) == set(ORT_TYPE_TO_CONFIG.values())
    assert set(ONNX_TO_CONFIG.values()) == set(DataType.keys()) - {"TYPE_INVALID"}
    assert ONNX_TO_CONFIG[1] == ORT_TYPE_TO_CONFIG["tensor(float)"] == "TYPE_FP32"
    assert ONNX_TO_CONFIG[16] == ORT_TYPE_TO_CONFIG["tensor(bfloat16)"] == "TYPE_BF16"
    assert ONNX_TO_CONFIG[8] == ORT_TYPE_TO_CONFIG["tensor(string)"] == "TYPE_STRING"
