"""``benchmarks/bench_anchors.py``: which attempt of a measured configuration counts."""

from __future__ import annotations

import json
from pathlib import Path

from e2e_support import load_module


def test_the_least_disturbed_attempt_counts_for_both_generators(tmp_path: Path) -> None:
    """wrk rows name the foreign CPU ``other_cpu_s``, perf_analyzer rows
    ``other_cpu_s_whole_run``; for both the attempt with the least is kept, as the
    harness's report keeps it (the perf_analyzer rows kept the first attempt)."""
    base = {"label": "sluice", "protocol": "http", "tensor_format": "binary",
            "model": "identity_fp32", "concurrency": 1}  # fmt: skip
    pa = [
        {**base, "generator": "perf_analyzer 2.60.0", "p50_us": 884, "other_cpu_s_whole_run": 1.6},
        {**base, "generator": "perf_analyzer 2.60.0", "p50_us": 768, "other_cpu_s_whole_run": 0.9},
        {**base, "generator": "perf_analyzer 2.60.0", "p50_us": 822, "other_cpu_s_whole_run": 1.2},
    ]
    wrk = [
        {**base, "generator": "wrk", "p50_us": 700, "other_cpu_s": 0.8},
        {**base, "generator": "wrk", "p50_us": 666, "other_cpu_s": 0.2},
    ]
    (tmp_path / "pa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pa))
    (tmp_path / "wrk.jsonl").write_text("".join(json.dumps(r) + "\n" for r in wrk))
    rows = load_module("benchmarks/bench_anchors.py", "bench_anchors").load_rows(tmp_path)  # type: ignore[attr-defined]
    assert sorted((r["generator"], r["p50_us"]) for r in rows) == [
        ("perf_analyzer 2.60.0", 768),
        ("wrk", 666),
    ]
