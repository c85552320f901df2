"""``benchmarks/bench_pairs.py``: the ratio of interleaved pairs."""

from __future__ import annotations

import argparse

import pytest
from e2e_support import load_module


def _row(infer_per_s: float, batch: float = 15.0) -> dict:
    return {"infer_per_s": infer_per_s, "p50_us": 6000, "server_cpu_us_per_req": 300.0,
            "machine_cpu_busy_pct": 90.0, "redis_cpu_us_per_req": 20.0,
            "batch": batch}  # fmt: skip


def test_median_of_pair_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    """Each pair's ratio is Sluice over Triton of that pair; the median of the ratios is
    returned (not the ratio of the medians: a fast minute for both cancels out)."""
    bench = load_module("benchmarks/bench_pairs.py", "bench_pairs")
    pairs = [(_row(5000), _row(4500)), (_row(4000, 21.5), _row(4400)), (_row(6000), _row(5400))]
    args = argparse.Namespace(model="mlp_fp32", conc=32, duration=6)
    median = bench.report(pairs, args)  # type: ignore[attr-defined]
    assert median == pytest.approx(0.9)
    out = capsys.readouterr().out
    assert (
        "| 2 | 4000 | 6000 | 300.0 | 90.0 | 21.5 | 4400 | 6000 | 300.0 | 20.0 | 90.0 | 15.0 "
        "| 1.10 |"
    ) in out
    assert "median 0.90 (min 0.90, max 1.10, 3 pairs)" in out


def test_counts_must_be_positive() -> None:
    bench = load_module("benchmarks/bench_pairs.py", "bench_pairs")
    assert bench.positive("3") == 3  # type: ignore[attr-defined]
    with pytest.raises(argparse.ArgumentTypeError, match="must be >= 1, got 0"):
        bench.positive("0")  # type: ignore[attr-defined]
