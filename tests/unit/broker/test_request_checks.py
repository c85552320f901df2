"""sluice.broker.request_checks: a request against its model's config, with Triton's texts."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.broker.datatypes import serialize_bytes
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.messages import WireTensor
from sluice.broker.request_checks import RequestRules, validate_request

CONFIG = """
name: "m" max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 2 ] },
        { name: "INPUT2" data_type: TYPE_STRING dims: [ 3 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""
RULES = RequestRules.from_config(text_format.Parse(CONFIG, ModelConfig()))
FP32 = WireTensor("INPUT0", "FP32", (1, 2), bytes(8))


def _strings(count: int) -> WireTensor:
    return WireTensor("INPUT2", "BYTES", (1, 3), serialize_bytes([b"x"] * count))


def _refusal(inputs: list[WireTensor]) -> str:
    with pytest.raises(SluiceError) as info:
        validate_request(RULES, inputs, [])
    assert info.value.code is ErrorCode.INVALID_ARG
    return info.value.message


def test_the_rules_of_a_config() -> None:
    assert RULES.name == "m" and RULES.max_batch_size == 8
    assert [(s.name, s.datatype, s.dims) for s in RULES.inputs.values()] == [
        ("INPUT0", "FP32", (2,)),
        ("INPUT1", "FP32", (2,)),
        ("INPUT2", "BYTES", (3,)),
    ]
    full = [FP32, WireTensor("INPUT1", "FP32", (2, 2), bytes(16)), _strings(3)]
    with pytest.raises(SluiceError):  # batch sizes 1 and 2
        validate_request(RULES, full, [])
    full[1] = WireTensor("INPUT1", "FP32", (1, 2), bytes(8))
    assert validate_request(RULES, full, []) == 1


def test_missing_inputs_are_named_as_triton_names_them() -> None:
    assert _refusal([FP32]) == (
        "expected 3 inputs but got 1 inputs for model 'm'. Got input(s) ['INPUT0'], but "
        "missing required input(s) ['INPUT1','INPUT2']. Please provide all required input(s)."
    )
    assert _refusal([]) == (
        "expected 3 inputs but got 0 inputs for model 'm'. Got input(s) [], but missing "
        "required input(s) ['INPUT0','INPUT1','INPUT2']. Please provide all required input(s)."
    )


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (2, "expected 3 string elements for inference input 'INPUT2' for model 'm', got 2"),
        (
            5,
            "unexpected number of string elements 4 for inference input 'INPUT2' for model "
            "'m', expecting 3",
        ),
    ],
)
def test_a_string_input_with_another_element_count(count: int, text: str) -> None:
    inputs = [FP32, WireTensor("INPUT1", "FP32", (1, 2), bytes(8)), _strings(count)]
    assert _refusal(inputs) == text
