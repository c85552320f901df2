"""sluice.repository.scan: models, duplicates and version folders.

Rules: docs/reference/model-configuration.md.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sluice.repository import ModelSource, RepositoryError, scan_repositories, version_directories


def _make_dirs(root: Path, names: list[str]) -> None:
    for name in names:
        (root / name).mkdir(parents=True)


@pytest.mark.parametrize(
    ("subdirs", "files", "expected", "warned"),
    [
        (["1", "2", "10"], [], [1, 2, 10], []),
        (["0"], [], [0], []),
        (["01", "1"], [], [1], ["01"]),
        (["abc", "3abc", "2"], [], [2], ["3abc", "abc"]),
        (["warmup", "initial_state", "configs", ".git", "4"], [], [4], []),
        (["-1", "1"], [], [1], ["-1"]),
        ([], ["5", "config.pbtxt"], [], []),
        (["99999999999999999999"], [], [], ["99999999999999999999"]),
    ],
)
def test_version_directories(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    subdirs: list[str],
    files: list[str],
    expected: list[int],
    warned: list[str],
) -> None:
    _make_dirs(tmp_path, subdirs)
    for name in files:
        (tmp_path / name).write_text("")
    with caplog.at_level(logging.WARNING, logger="sluice.repository.scan"):
        assert version_directories(tmp_path) == expected
    warned_names = sorted(r.args[0] for r in caplog.records if isinstance(r.args, tuple))
    assert warned_names == warned


def test_scan_single_root_sorted_skips_hidden_and_files(tmp_path: Path) -> None:
    _make_dirs(tmp_path, ["zeta/1", "alpha/1", ".hidden/1"])
    (tmp_path / "README.md").write_text("")
    result = scan_repositories([tmp_path])
    assert list(result.models) == ["alpha", "zeta"]
    assert result.models["alpha"] == ModelSource("alpha", tmp_path / "alpha", tmp_path)
    assert result.duplicates == {}


def test_scan_duplicates_across_roots(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    _make_dirs(first, ["shared/1", "only_a/1"])
    _make_dirs(second, ["shared/1", "only_b/1"])
    result = scan_repositories([first, second])
    assert list(result.models) == ["only_a", "only_b"]
    assert result.models["only_b"].repository == second
    assert result.duplicates == {"shared": (first / "shared", second / "shared")}


def test_scan_same_root_twice_is_not_a_duplicate(tmp_path: Path) -> None:
    _make_dirs(tmp_path, ["m/1"])
    assert list(scan_repositories([tmp_path, tmp_path]).models) == ["m"]


@pytest.mark.parametrize("make_file", [False, True])
def test_scan_missing_root(tmp_path: Path, make_file: bool) -> None:
    root = tmp_path / "nope"
    if make_file:
        root.write_text("")
    with pytest.raises(RepositoryError, match=str(root)):
        scan_repositories([root])
