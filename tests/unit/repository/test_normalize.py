"""sluice.repository.normalize: Triton's serving defaults.

Rules: docs/reference/model-configuration.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from tritonclient.grpc.model_config_pb2 import ModelInstanceGroup

from sluice.repository import normalize, parse_config_text

CPU = ModelInstanceGroup.KIND_CPU
GPU = ModelInstanceGroup.KIND_GPU
MODEL = ModelInstanceGroup.KIND_MODEL


def _groups(text: str, gpu_ids: Sequence[int] = ()) -> list[tuple[str, int, int, list[int]]]:
    config = parse_config_text(f'name: "m" {text}')
    normalize(config, gpu_ids=gpu_ids)
    return [(g.name, g.kind, g.count, list(g.gpus)) for g in config.instance_group]


@pytest.mark.parametrize(
    ("text", "gpu_ids", "expected"),
    [
        ('backend: "onnxruntime"', (), [("m", CPU, 2, [])]),
        ('backend: "tensorflow"', (), [("m", CPU, 2, [])]),
        ('backend: "python"', (), [("m", CPU, 1, [])]),
        ('backend: "onnxruntime"', (0, 1), [("m", GPU, 1, [0, 1])]),
        ('backend: "onnxruntime" instance_group { count: 3 }', (), [("m_0", CPU, 3, [])]),
        (
            'backend: "onnxruntime" instance_group [ { kind: KIND_CPU }, { name: "g" } ]',
            (0,),
            [("m_0", CPU, 2, []), ("g", GPU, 1, [0])],
        ),
        ('backend: "python" instance_group { kind: KIND_GPU }', (2, 0), [("m_0", GPU, 1, [0, 2])]),
        ('backend: "python" instance_group { gpus: [1] }', (0, 1), [("m_0", GPU, 1, [1])]),
        # a listed gpu that does not exist turns KIND_AUTO into KIND_CPU
        ('backend: "python" instance_group { gpus: [5] }', (0,), [("m_0", CPU, 1, [5])]),
        ('backend: "python" instance_group { gpus: [0] }', (), [("m_0", CPU, 1, [0])]),
        ('backend: "python" instance_group { kind: KIND_MODEL }', (0,), [("m_0", MODEL, 1, [])]),
        ('backend: "python" instance_group { kind: KIND_GPU }', (), [("m_0", GPU, 1, [])]),
        ('platform: "ensemble"', (), []),
        ('ensemble_scheduling { step { model_name: "a" } }', (), []),
    ],
)
def test_instance_groups(
    text: str, gpu_ids: Sequence[int], expected: list[tuple[str, int, int, list[int]]]
) -> None:
    assert _groups(text, gpu_ids) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('backend: "onnxruntime"', [("m", CPU, 2, [])]),
        ('backend: "pytorch" instance_group { gpus: [0] }', [("m_0", CPU, 1, [0])]),
        # an explicit KIND_GPU stays: its load then names what is missing
        ('backend: "onnxruntime" instance_group { kind: KIND_GPU }', [("m_0", GPU, 1, [0, 1])]),
    ],
)
def test_kind_auto_is_cpu_where_the_backend_cannot_use_gpus(
    text: str, expected: list[tuple[str, int, int, list[int]]]
) -> None:
    config = parse_config_text(f'name: "m" {text}')
    normalize(config, gpu_ids=(0, 1), auto_gpu=False)
    assert [(g.name, g.kind, g.count, list(g.gpus)) for g in config.instance_group] == expected


@pytest.mark.parametrize(
    ("text", "preferred"),
    [
        ("max_batch_size: 8 dynamic_batching { }", [8]),
        ("max_batch_size: 8 dynamic_batching { preferred_batch_size: [2, 4] }", [2, 4]),
        ("max_batch_size: 0 dynamic_batching { }", []),
    ],
)
def test_dynamic_batching_preferred(text: str, preferred: list[int]) -> None:
    config = parse_config_text(text)
    normalize(config)
    assert list(config.dynamic_batching.preferred_batch_size) == preferred


def test_no_dynamic_batching_is_not_added() -> None:
    config = parse_config_text("max_batch_size: 8")
    normalize(config)
    assert not config.HasField("dynamic_batching")
    assert not config.HasField("sequence_batching")


@pytest.mark.parametrize(
    ("text", "idle", "oldest"),
    [
        ("max_batch_size: 4 sequence_batching { }", 1_000_000, None),
        ("max_batch_size: 4 sequence_batching { max_sequence_idle_microseconds: 5 }", 5, None),
        ("max_batch_size: 4 sequence_batching { oldest { } }", 1_000_000, [4]),
        (
            "max_batch_size: 4 sequence_batching { oldest { preferred_batch_size: 2 } }",
            1_000_000,
            [2],
        ),
    ],
)
def test_sequence_batching(text: str, idle: int, oldest: list[int] | None) -> None:
    config = parse_config_text(text)
    normalize(config)
    seq = config.sequence_batching
    assert seq.max_sequence_idle_microseconds == idle
    assert seq.HasField("oldest") == (oldest is not None)
    if oldest is not None:
        assert list(seq.oldest.preferred_batch_size) == oldest


@pytest.mark.parametrize(
    ("text", "pinned"),
    [
        ("", (True, True)),
        ("optimization { input_pinned_memory { enable: false } }", (False, True)),
        ("optimization { output_pinned_memory { } }", (True, False)),
    ],
)
def test_pinned_memory(text: str, pinned: tuple[bool, bool]) -> None:
    config = parse_config_text(text)
    normalize(config)
    opt = config.optimization
    assert (opt.input_pinned_memory.enable, opt.output_pinned_memory.enable) == pinned


def test_ensemble_gets_no_optimization() -> None:
    config = parse_config_text('platform: "ensemble" max_batch_size: 4')
    normalize(config)
    assert not config.HasField("optimization")
    assert config.version_policy.latest.num_versions == 1


@pytest.mark.parametrize(
    ("text", "choice"),
    [
        ("", "latest"),
        ("version_policy { all { } }", "all"),
        ("version_policy { specific { versions: 3 } }", "specific"),
    ],
)
def test_version_policy(text: str, choice: str) -> None:
    config = parse_config_text(text)
    normalize(config)
    assert config.version_policy.WhichOneof("policy_choice") == choice


def test_idempotent() -> None:
    config = parse_config_text(
        'name: "m" backend: "onnxruntime" max_batch_size: 4 dynamic_batching {}'
    )
    normalize(config)
    once = config.SerializeToString()
    normalize(config)
    assert config.SerializeToString() == once
