"""sluice.repository.validate: Triton's load-time rules with their messages."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from sluice.repository import ConfigError, parse_config_text, validate

MODEL_DIR = Path("/repo/m")
IO = (
    'input { name: "X" data_type: TYPE_FP32 dims: [4] } '
    'output { name: "Y" data_type: TYPE_FP32 dims: [4] } '
)
CPU_GROUP = 'instance_group { name: "g" kind: KIND_CPU count: 1 } '


def _validate(text: str, gpu_ids: Sequence[int] = ()) -> None:
    validate(parse_config_text(text), model_dir=MODEL_DIR, gpu_ids=gpu_ids)


@pytest.mark.parametrize(
    ("text", "gpu_ids"),
    [
        (f'name: "m" {IO}{CPU_GROUP}', ()),
        (
            f'name: "m" max_batch_size: 8 {IO}{CPU_GROUP}'
            "dynamic_batching { preferred_batch_size: [1, 8] }",
            (),
        ),
        (
            f'name: "m" {IO}instance_group {{ name: "g" kind: KIND_GPU count: 1 gpus: [0, 1] }}',
            (0, 1),
        ),
        (
            f'name: "m" max_batch_size: 2 {CPU_GROUP}'
            'input { name: "S" data_type: TYPE_FP32 dims: [1] reshape { shape: [] } } '
            'output { name: "Y" data_type: TYPE_FP32 dims: [-1, 6] reshape { shape: [-1, 2, 3] } }',
            (),
        ),
        (
            f'name: "m" {IO}{CPU_GROUP}'
            "dynamic_batching { priority_levels: 2 default_priority_level: 2 "
            "priority_queue_policy { key: 1 value { } } }",
            (),
        ),
        (
            f'name: "m" {IO}{CPU_GROUP}'
            "dynamic_batching { preserve_ordering: true priority_levels: 1 "
            "default_priority_level: 1 default_queue_policy { timeout_action: DELAY } }",
            (),
        ),
        ('name: "m" platform: "ensemble" ensemble_scheduling { step { model_name: "a" } }', ()),
    ],
)
def test_valid(text: str, gpu_ids: Sequence[int]) -> None:
    _validate(text, gpu_ids)


@pytest.mark.parametrize(
    ("text", "gpu_ids", "field", "message"),
    [
        (
            'name: "other"',
            (),
            "name",
            "unexpected directory name 'm' for model 'other', directory name must equal model name",
        ),
        ('name: "m" max_batch_size: -1', (), "max_batch_size", "must be >= 0, got -1"),
        (
            'name: "m" input { name: "X" data_type: TYPE_FP32 }',
            (),
            "input 'X'.dims",
            "input 'X' must specify 'dims'",
        ),
        (
            'name: "m" output { name: "Y" data_type: TYPE_FP32 dims: [0] }',
            (),
            "output 'Y'.dims",
            "output 'Y' dims [0] must contain only integers >= 1 or -1",
        ),
        (
            'name: "m" input { name: "X" data_type: TYPE_FP32 dims: [-2] }',
            (),
            "input 'X'.dims",
            "input 'X' dims [-2] must contain only integers >= 1 or -1",
        ),
        (
            'name: "m" input { name: "X" dims: [1] }',
            (),
            "input 'X'.data_type",
            "input 'X' must specify a data_type",
        ),
        (
            'name: "m" input { data_type: TYPE_FP32 dims: [1] }',
            (),
            "input[0].name",
            "input must have a name",
        ),
        (
            'name: "m" input [ { name: "X" data_type: TYPE_FP32 dims: [1] }, '
            '{ name: "X" data_type: TYPE_FP32 dims: [1] } ]',
            (),
            "input 'X'",
            "input 'X' is listed more than once",
        ),
        (
            'name: "m" input { name: "X" data_type: TYPE_FP32 dims: [1] reshape { } }',
            (),
            "input 'X'.reshape",
            "empty reshape is only allowed when batching",
        ),
        (
            'name: "m" input { name: "X" data_type: TYPE_FP32 dims: [6] reshape { shape: [4] } }',
            (),
            "input 'X'.reshape",
            "dims [6] and reshape [4] have different element counts",
        ),
        (
            'name: "m" input { name: "X" data_type: TYPE_FP32 dims: [-1, 6] '
            "reshape { shape: [6] } }",
            (),
            "input 'X'.reshape",
            "dims [-1, 6] and reshape [6] have different element counts",
        ),
        (
            'name: "m" input { name: "X" data_type: TYPE_FP32 dims: [1] reshape { shape: [0] } }',
            (),
            "input 'X'.reshape.shape",
            "reshape [0] must contain only integers >= 1 or -1",
        ),
        (
            'name: "m" max_batch_size: 4 dynamic_batching { preferred_batch_size: [8] }',
            (),
            "dynamic_batching.preferred_batch_size",
            "preferred batch size 8 must be in [1, 4]",
        ),
        (
            'name: "m" max_batch_size: 4 dynamic_batching { preferred_batch_size: [0] }',
            (),
            "dynamic_batching.preferred_batch_size",
            "preferred batch size 0 must be in [1, 4]",
        ),
        (
            'name: "m" max_batch_size: 4 sequence_batching { oldest { preferred_batch_size: 5 } }',
            (),
            "sequence_batching.oldest.preferred_batch_size",
            "preferred batch size 5 must be in [1, 4]",
        ),
        (
            'name: "m" dynamic_batching { priority_levels: 2 }',
            (),
            "dynamic_batching.default_priority_level",
            "default priority level must be in range [1, 2], got 0",
        ),
        (
            'name: "m" dynamic_batching { priority_levels: 2 default_priority_level: 3 }',
            (),
            "dynamic_batching.default_priority_level",
            "default priority level must be in range [1, 2], got 3",
        ),
        (
            'name: "m" dynamic_batching { priority_levels: 2 default_priority_level: 1 '
            "priority_queue_policy { key: 3 value { } } }",
            (),
            "dynamic_batching.priority_queue_policy",
            "priority queue policy must have priority level in range [1, 2], got 3",
        ),
        (
            'name: "m" dynamic_batching { preserve_ordering: true priority_levels: 2 '
            "default_priority_level: 1 }",
            (),
            "dynamic_batching.preserve_ordering",
            "Only one priority level is allowed when 'preserve_ordering' is true",
        ),
        (
            'name: "m" dynamic_batching { preserve_ordering: true default_queue_policy '
            "{ timeout_action: DELAY default_timeout_microseconds: 10 } }",
            (),
            "dynamic_batching.default_queue_policy",
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true",
        ),
        (
            'name: "m" instance_group { name: "g" kind: KIND_GPU count: 1 }',
            (),
            "instance_group[0].kind",
            "instance group 'g' of model 'm' has kind KIND_GPU but server does not support GPUs "
            "(NVML finds no GPU on this host, or nvidia-ml-py is not installed)",
        ),
        (
            'name: "m" instance_group { name: "g" kind: KIND_GPU count: 1 gpus: [0, 3] }',
            (0, 1),
            "instance_group[0].gpus",
            "instance group 'g' of model 'm' specifies invalid or unsupported gpu id 3; "
            "GPUs available: 0, 1",
        ),
        (
            'name: "m" instance_group { name: "g" kind: KIND_CPU count: 1 gpus: [0] }',
            (0,),
            "instance_group[0].gpus",
            "instance group 'g' of model 'm' has kind KIND_CPU but specifies one or more GPUs",
        ),
        (
            'name: "m" instance_group { name: "g" kind: KIND_CPU count: 0 }',
            (),
            "instance_group[0].count",
            "instance group 'g' of model 'm' must specify count >= 1",
        ),
        (
            'name: "m" platform: "ensemble" ensemble_scheduling { step { model_name: "a" } } '
            'instance_group { name: "g" kind: KIND_CPU count: 1 }',
            (),
            "instance_group",
            "an ensemble model must not have instance_group",
        ),
        (
            'name: "m" platform: "ensemble"',
            (),
            "ensemble_scheduling",
            "ensemble_scheduling must be set for an ensemble model",
        ),
        (
            'name: "m" ensemble_scheduling { step { model_name: "a" } }',
            (),
            "ensemble_scheduling",
            "ensemble_scheduling is only allowed when platform is 'ensemble'",
        ),
    ],
)
def test_invalid(text: str, gpu_ids: Sequence[int], field: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _validate(text, gpu_ids)
    error = info.value
    assert error.field == field
    assert error.message.startswith(message)
    assert str(error).startswith(f"model '{error.model}' ({MODEL_DIR}): field '{field}': ")
    assert error.code == "INVALID_ARG"


def test_config_path_in_message() -> None:
    path = MODEL_DIR / "configs" / "h100.pbtxt"
    with pytest.raises(ConfigError, match=r"model 'm' \(/repo/m/configs/h100.pbtxt\)"):
        validate(
            parse_config_text('name: "m" max_batch_size: -1'), model_dir=MODEL_DIR, config_path=path
        )


@pytest.mark.parametrize("value", ["0", "65", "two", " ", "-1", "1.5", "٣"])
def test_queue_shards_must_be_a_whole_number_in_range(value: str) -> None:
    shards = f'parameters {{ key: "queue_shards" value: {{ string_value: "{value}" }} }}'
    text = f'name: "m" {IO}{CPU_GROUP}{shards}'
    with pytest.raises(ConfigError) as info:
        _validate(text)
    assert "parameter 'queue_shards' of model 'm' must be a whole number from 1 to 64" in str(
        info.value
    )
    assert info.value.field == "parameters.queue_shards"


def test_queue_shards_read_from_parameters() -> None:
    from sluice.repository.validate import queue_shards

    base = f'name: "m" {IO}{CPU_GROUP}'
    assert queue_shards(parse_config_text(base)) == 1
    shards = 'parameters { key: "queue_shards" value: { string_value: " 3 " } }'
    assert queue_shards(parse_config_text(base + shards)) == 3
