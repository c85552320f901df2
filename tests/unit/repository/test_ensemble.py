"""Ensemble graphs: planning, parallel stages, and every load error named."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.repository.ensemble import (
    EnsembleError,
    composing_models,
    plan_ensemble,
    validate_ensemble,
)


def cfg(text: str) -> ModelConfig:
    return text_format.Parse(text, ModelConfig())


def model(name: str, ins: str, outs: str, mbs: int = 8, dtype: str = "TYPE_FP32") -> ModelConfig:
    """A composing model with FP32 [4] tensors named by comma lists."""
    text = f'name: "{name}" backend: "python" max_batch_size: {mbs} '
    for n in filter(None, ins.split(",")):
        text += f'input {{ name: "{n}" data_type: {dtype} dims: [4] }} '
    for n in filter(None, outs.split(",")):
        text += f'output {{ name: "{n}" data_type: {dtype} dims: [4] }} '
    return cfg(text)


def step(
    model_name: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1
) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'step {{ model_name: "{model_name}" model_version: {version} {ins} {outs} }}'


def ensemble(steps: list[str], ins: str = "IN", outs: str = "OUT", mbs: int = 8) -> ModelConfig:
    text = f'name: "ens" platform: "ensemble" max_batch_size: {mbs} '
    for n in filter(None, ins.split(",")):
        text += f'input {{ name: "{n}" data_type: TYPE_FP32 dims: [4] }} '
    for n in filter(None, outs.split(",")):
        text += f'output {{ name: "{n}" data_type: TYPE_FP32 dims: [4] }} '
    return cfg(text + "ensemble_scheduling { " + " ".join(steps) + " }")


CHAIN = ensemble(
    [
        step("a", {"X": "IN"}, {"Y": "mid"}),
        step("b", {"X": "mid"}, {"Y": "OUT"}),
    ]
)
#: IN -> a -> m1 -> b -> OUT1, IN -> c -> OUT2; d joins m1 and OUT2 into OUT3
DIAMOND = ensemble(
    [
        step("a", {"X": "IN"}, {"Y": "m1"}),
        step("b", {"X": "m1"}, {"Y": "OUT1"}),
        step("c", {"X": "IN"}, {"Y": "OUT2"}),
        step("d", {"X": "m1", "Z": "OUT2"}, {"Y": "OUT3"}),
    ],
    outs="OUT1,OUT2,OUT3",
)
MODELS = {
    "a": model("a", "X", "Y"),
    "b": model("b", "X", "Y"),
    "c": model("c", "X", "Y"),
    "d": model("d", "X,Z", "Y"),
}


def test_chain_plan() -> None:
    plan = validate_ensemble(CHAIN, MODELS)
    assert [s.model for s in plan.steps] == ["a", "b"]
    assert plan.producer == {"mid": 0, "OUT": 1}
    assert plan.stages() == [[0], [1]]
    assert plan.ready_steps({"IN"}, {0, 1}) == [0]
    assert plan.ready_steps({"IN", "mid"}, {1}) == [1]


def test_parallel_steps_found() -> None:
    plan = validate_ensemble(DIAMOND, MODELS)
    assert plan.stages() == [[0, 2], [1, 3]]
    assert plan.ready_steps({"IN"}, range(4)) == [0, 2]


@pytest.mark.parametrize(
    ("outputs", "steps"),
    [
        ((), {0, 1, 2, 3}),
        (("OUT2",), {2}),
        (("OUT1",), {0, 1}),
        (("OUT3",), {0, 2, 3}),
    ],
)
def test_needed_steps_for_a_subset(outputs: tuple[str, ...], steps: set[int]) -> None:
    assert plan_ensemble(DIAMOND).needed_steps(outputs) == steps


def test_composing_models_listed_once() -> None:
    config = ensemble(
        [step("a", {"X": "IN"}, {"Y": "mid"}), step("a", {"X": "mid"}, {"Y": "OUT"}, version=2)]
    )
    assert composing_models(config) == [("a", -1), ("a", 2)]
    assert composing_models(CHAIN) == [("a", -1), ("b", -1)]


def test_batching_and_non_batching_models_share_full_shapes() -> None:
    nobatch = cfg(
        'name: "b" backend: "python" max_batch_size: 0 '
        'input { name: "X" data_type: TYPE_FP32 dims: [-1, 4] } '
        'output { name: "Y" data_type: TYPE_FP32 dims: [-1, 4] }'
    )
    validate_ensemble(CHAIN, {"a": MODELS["a"], "b": nobatch})


def test_optional_input_may_stay_unmapped() -> None:
    opt = cfg(
        'name: "a" backend: "python" max_batch_size: 8 '
        'input { name: "X" data_type: TYPE_FP32 dims: [4] } '
        'input { name: "W" data_type: TYPE_FP32 dims: [4] optional: true } '
        'output { name: "Y" data_type: TYPE_FP32 dims: [4] }'
    )
    validate_ensemble(CHAIN, {"a": opt, "b": MODELS["b"]})


def _with_warmup(config: ModelConfig) -> ModelConfig:
    config.model_warmup.add(name="w", batch_size=1)
    return config


STRUCTURE_ERRORS = [
    (
        'name: "ens" platform: "ensemble" input { name: "IN" data_type: TYPE_FP32 dims: [4] } '
        "ensemble_scheduling { }",
        "must specify 'step' for ensemble 'ens'",
    ),
    (ensemble([step("", {"X": "IN"}, {"Y": "OUT"})]), "must specify 'model_name' in step 0"),
    (ensemble([step("a", {}, {"Y": "OUT"})]), "must specify 'input_map' in step 0"),
    (ensemble([step("a", {"X": "IN"}, {})]), "must specify 'output_map' in step 0"),
    (
        ensemble([step("a", {"X": "IN"}, {"Y": "OUT"}), step("b", {"X": "IN"}, {"Y": "OUT"})]),
        "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'ens' step 1",
    ),
    (
        ensemble([step("a", {"X": "IN"}, {"Y": "OUT"})], ins="IN,UNUSED"),
        "ensemble input 'UNUSED' for ensemble 'ens' is not used",
    ),
    (
        ensemble([step("a", {"X": "IN"}, {"Y": "OUT"})], outs="OUT,NEVER"),
        "ensemble output 'NEVER' for ensemble 'ens' is not used",
    ),
    (
        ensemble([step("a", {"X": "IN"}, {"Y": "OUT"}), step("b", {"X": "IN"}, {"Y": "spare"})]),
        "ensemble tensor 'spare' is unused in ensemble 'ens'",
    ),
    (
        ensemble([step("a", {"X": "IN", "Z": "ghost"}, {"Y": "OUT"})]),
        "output 'OUT' for ensemble 'ens' is not written: at least one of its depending "
        "tensors, 'ghost', is not connected",
    ),
    (
        ensemble(
            [
                step("a", {"X": "IN", "Z": "back"}, {"Y": "fwd"}),
                step("b", {"X": "fwd"}, {"Y": "back"}),
                step("c", {"X": "fwd"}, {"Y": "OUT"}),
            ]
        ),
        "in ensemble 'ens', steps form a cycle: step 0 (model 'a') waits for tensor 'back', "
        "step 1 (model 'b') waits for tensor 'fwd'",
    ),
    (
        _with_warmup(ensemble([step("a", {"X": "IN"}, {"Y": "OUT"})])),
        "model_warmup can not be specified for ensemble 'ens'",
    ),
]


@pytest.mark.parametrize(("config", "message"), STRUCTURE_ERRORS)
def test_structure_errors(config: ModelConfig | str, message: str) -> None:
    if isinstance(config, str):
        config = cfg(config)
    with pytest.raises(EnsembleError) as info:
        plan_ensemble(config)
    assert message in str(info.value)
    assert info.value.code == "INVALID_ARG"
    assert info.value.model == "ens"


COMPOSING_ERRORS = [
    ({"a": MODELS["a"]}, "ensemble 'ens' contains models that are not available or ambiguous: b"),
    (
        {"a": MODELS["a"], "b": model("b", "X", "Y", mbs=4)},
        "ensemble 'ens' allows maximum batch size 8, but it contains model 'b' which only "
        "allows maximum batch size to be 4",
    ),
    (
        {"a": model("a", "Q", "Y"), "b": MODELS["b"]},
        "ensemble tensor 'IN' is mapping to non-existing input 'X' in model 'a' "
        "(step 0 (model 'a'))",
    ),
    (
        {"a": model("a", "X,W", "Y"), "b": MODELS["b"]},
        "input 'W' in model 'a' is not mapped to any ensemble tensors (step 0 (model 'a'))",
    ),
    (
        {"a": model("a", "X", "Q"), "b": MODELS["b"]},
        "ensemble tensor 'mid' is mapped from non-existing output 'Y' in model 'a' "
        "(step 0 (model 'a'))",
    ),
    (
        {"a": MODELS["a"], "b": model("b", "X", "Y", dtype="TYPE_INT32")},
        "in ensemble 'ens', ensemble tensor 'mid': inconsistent data type: TYPE_FP32 is "
        "inferred from model 'a' while TYPE_INT32 is inferred from model 'b'",
    ),
    (
        {
            "a": MODELS["a"],
            "b": cfg(
                'name: "b" backend: "python" max_batch_size: 8 '
                'input { name: "X" data_type: TYPE_FP32 dims: [5] } '
                'output { name: "Y" data_type: TYPE_FP32 dims: [4] }'
            ),
        },
        "in ensemble 'ens', ensemble tensor 'mid': inconsistent shape: [-1, 4] is inferred "
        "from model 'a' while [-1, 5] is inferred from model 'b'",
    ),
    (
        {
            "a": MODELS["a"],
            "b": cfg(
                'name: "b" backend: "python" max_batch_size: 8 '
                'input { name: "X" data_type: TYPE_FP32 dims: [4] } '
                'output { name: "Y" data_type: TYPE_FP32 dims: [3] }'
            ),
        },
        "in ensemble 'ens', ensemble tensor 'OUT': inconsistent shape: [-1, 4] is inferred "
        "from model 'ens' while [-1, 3] is inferred from model 'b'",
    ),
]


@pytest.mark.parametrize(("models", "message"), COMPOSING_ERRORS)
def test_composing_errors(models: dict[str, ModelConfig], message: str) -> None:
    with pytest.raises(EnsembleError) as info:
        validate_ensemble(CHAIN, models)
    assert message in str(info.value)


def test_wildcard_dims_match() -> None:
    var = model("b", "X", "Y")
    var.input[0].dims[:] = [-1]
    validate_ensemble(CHAIN, {"a": MODELS["a"], "b": var})
