"""Instance names: a reload's suffix in Redis, Triton's name for the model."""

from __future__ import annotations

import pytest

from sluice.gpu_workers.processes import generation_suffix, triton_instance_name


def test_generation_suffix_only_after_the_first_load() -> None:
    assert generation_suffix(1) == ""
    assert [generation_suffix(g) for g in (2, 3, 17)] == ["_g2", "_g3", "_g17"]


@pytest.mark.parametrize(
    ("name", "seen"),
    [
        ("digits_0_1", "digits_0_1"),
        ("digits_0_1_g4", "digits_0_1"),  # a reload's instance: the model sees Triton's name
        ("multi_0_0_gpu1", "multi_0_0_gpu1"),  # a GPU instance's device is kept
        ("multi_0_0_gpu1_g2", "multi_0_0_gpu1"),
        ("my_g2_0", "my_g2_0"),  # a group named like a suffix: only the end is a suffix
    ],
)
def test_the_model_sees_the_name_without_the_reload_suffix(name: str, seen: str) -> None:
    assert triton_instance_name(name) == seen
    assert triton_instance_name(seen + generation_suffix(5)) == seen
