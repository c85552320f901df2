"""Label files of Triton's classification extension (``label_filename``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.gpu_workers.classification import read_labels


def test_labels_are_the_file_lines(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("zero\none\ntwo\n")
    assert read_labels(tmp_path, "labels.txt", "m", "OUT") == ["zero", "one", "two"]
    assert read_labels(tmp_path, "", "m", "OUT") == []


def test_a_missing_label_file_names_the_model_output_and_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        read_labels(tmp_path, "nope.txt", "m", "OUT")
    assert str(info.value) == (
        f"model 'm', output 'OUT': cannot read label_filename 'nope.txt' "
        f"({tmp_path / 'nope.txt'}): No such file or directory"
    )
