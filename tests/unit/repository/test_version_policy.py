"""sluice.repository.version_policy: latest / all / specific.

Rules: docs/reference/model-configuration.md.
"""

from __future__ import annotations

import pytest
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.repository import ConfigError, parse_config_text, select_versions


@pytest.mark.parametrize(
    ("policy", "available", "expected"),
    [
        ("", [1, 2, 3], [3]),
        ("version_policy { latest { num_versions: 1 } }", [3, 1, 2], [3]),
        ("version_policy { latest { num_versions: 2 } }", [1, 2, 10], [2, 10]),
        ("version_policy { latest { num_versions: 9 } }", [1, 2], [1, 2]),
        ("version_policy { all { } }", [0, 5, 2], [0, 2, 5]),
        ("version_policy { specific { versions: [1, 3] } }", [1, 2, 3], [1, 3]),
        ("version_policy { specific { versions: [3, 7] } }", [1, 2, 3], [3]),
        ("version_policy { }", [4, 5], [5]),
    ],
)
def test_select_versions(policy: str, available: list[int], expected: list[int]) -> None:
    config = parse_config_text(f'name: "m" {policy}')
    assert select_versions(config, available) == expected


@pytest.mark.parametrize(
    ("policy", "available"),
    [
        ("", []),
        ("version_policy { all { } }", []),
        ("version_policy { specific { versions: [7] } }", [1, 2]),
        ("version_policy { latest { num_versions: 0 } }", [1]),
    ],
)
def test_select_versions_none_left(policy: str, available: list[int]) -> None:
    config = parse_config_text(f'name: "m" {policy}')
    with pytest.raises(ConfigError) as info:
        select_versions(config, available)
    assert info.value.message == (
        "at least one version must be available under the version policy of model 'm'"
    )
    assert info.value.field == "version_policy"


def test_select_versions_does_not_mutate() -> None:
    config = ModelConfig(name="m")
    select_versions(config, [1])
    assert not config.HasField("version_policy")
