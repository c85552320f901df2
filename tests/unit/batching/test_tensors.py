"""Tests for batching.tensors: concat along dim 0 and split back by batch size."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.batching import BatchingError, concat_inputs, split_outputs


def test_single_request_is_not_copied() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    merged = concat_inputs([{"INPUT0": x}])
    assert merged["INPUT0"] is x


def test_concat_then_split_bytes() -> None:
    a = np.array([[b"a", b"bb"]], dtype=object)
    b = np.array([[b"c", b""], [b"dd", b"e"]], dtype=object)
    merged = concat_inputs([{"TEXT": a}, {"TEXT": b}])
    assert merged["TEXT"].dtype == object
    assert merged["TEXT"].shape == (3, 2)
    parts = split_outputs(merged, [1, 2])
    assert parts[0]["TEXT"].tolist() == a.tolist()
    assert parts[1]["TEXT"].tolist() == b.tolist()


def test_split_returns_views() -> None:
    out = np.arange(10, dtype=np.int64).reshape(5, 2)
    parts = split_outputs({"OUT": out, "IDX": np.arange(5)}, [2, 0, 3])
    assert [p["OUT"].shape for p in parts] == [(2, 2), (0, 2), (3, 2)]
    assert all(np.shares_memory(p["OUT"], out) for p in parts if p["OUT"].size)
    assert parts[2]["IDX"].tolist() == [2, 3, 4]


@pytest.mark.parametrize(
    ("outputs", "sizes", "message"),
    [
        (
            {"OUTPUT0": np.zeros((3, 2))},
            [1, 1],
            "output 'OUTPUT0': first dimension is 3, expected 2",
        ),
        ({"OK": np.zeros(2), "SCALAR": np.float32(1)}, [2], "output 'SCALAR'"),
        ({"OUT": np.zeros(2)}, [3, -1], "batch sizes must be >= 0"),
    ],
)
def test_split_mismatch_names_the_output(
    outputs: dict[str, np.ndarray], sizes: list[int], message: str
) -> None:
    with pytest.raises(BatchingError, match=message) as info:
        split_outputs(outputs, sizes)
    assert info.value.code == "INTERNAL"


@pytest.mark.parametrize(
    ("per_request", "message"),
    [
        ([], "empty batch"),
        ([{"A": np.zeros(1)}, {"B": np.zeros(1)}], "supplies inputs"),
        ([{"A": np.zeros((1, 2))}, {"A": np.zeros((1, 3))}], "input 'A': cannot batch"),
        ([{"A": np.zeros(1, np.float32)}, {"A": np.zeros(1, np.float64)}], "input 'A'"),
        ([{"A": np.zeros(())}, {"A": np.zeros(())}], "input 'A' has no batch dimension"),
    ],
)
def test_concat_refuses_what_cannot_batch(
    per_request: list[dict[str, np.ndarray]], message: str
) -> None:
    with pytest.raises(BatchingError, match=message):
        concat_inputs(per_request)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    width=st.integers(0, 3),
    as_bytes=st.booleans(),
)
def test_concat_split_round_trip(sizes: list[int], width: int, as_bytes: bool) -> None:
    requests = []
    start = 0
    for b in sizes:
        values = np.arange(start, start + b * width).reshape(b, width)
        start += b * width
        if as_bytes:
            values = np.array(
                [[str(v).encode() for v in row] for row in values.tolist()], dtype=object
            ).reshape(b, width)
        requests.append({"X": values, "Y": np.full((b,), b, dtype=np.int32)})
    merged = concat_inputs(requests)
    assert merged["X"].shape == (sum(sizes), width)
    parts = split_outputs(merged, sizes)
    assert len(parts) == len(sizes)
    for original, part in zip(requests, parts, strict=True):
        for name in ("X", "Y"):
            assert part[name].dtype == original[name].dtype
            np.testing.assert_array_equal(part[name], original[name])
