"""Inference statistics kept in Redis, added to by every process (Triton's statistics extension).

One hash per model version (``KeySchema.stats``); every field is a counter
incremented with ``HINCRBY`` inside the pipeline that already carries the
replies, so recording costs no extra round trip. Field names:

* ``success_count``/``success_ns``, ``fail_count``/``fail_ns``, ``queue_count``/``queue_ns``,
  ``compute_input_count``/``_ns``, ``compute_infer_count``/``_ns``,
  ``compute_output_count``/``_ns`` — per request, durations in ns (Triton: a request in a
  batch is charged the whole batch's compute durations);
* ``inference_count`` (Σ batch sizes of successful requests), ``execution_count``;
* ``batch:<n>:count`` and ``batch:<n>:compute_{input,infer,output}_ns`` per executed batch size;
* ``fail_reason:<REASON>`` with Triton's metric reasons REJECTED, CANCELED, BACKEND, OTHER;
* ``last_inference_ms`` (ms since the epoch, written with HSET).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.client import Pipeline

FAIL_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
_DURATIONS = ("queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True, slots=True)
class ExecutionTimes:
    """Durations of one model execution (a batch), in ns."""

    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int


def record_execution(pipe: Pipeline, key: str, batch_size: int, times: ExecutionTimes) -> None:
    """Count one execution of ``batch_size`` (Triton ``execution_count``, ``batch_stats``)."""
    pipe.hincrby(key, "execution_count", 1)
    prefix = f"batch:{batch_size}:"
    pipe.hincrby(key, prefix + "count", 1)
    pipe.hincrby(key, prefix + "compute_input_ns", times.compute_input_ns)
    pipe.hincrby(key, prefix + "compute_infer_ns", times.compute_infer_ns)
    pipe.hincrby(key, prefix + "compute_output_ns", times.compute_output_ns)


def record_success(
    pipe: Pipeline,
    key: str,
    *,
    batch_size: int,
    request_ns: int,
    queue_ns: int,
    times: ExecutionTimes,
    now_ms: int,
) -> None:
    """Count one successful request (``success``, ``queue``, ``compute_*``, ``inference_count``)."""
    values = {
        "success": request_ns,
        "queue": queue_ns,
        "compute_input": times.compute_input_ns,
        "compute_infer": times.compute_infer_ns,
        "compute_output": times.compute_output_ns,
    }
    for name, ns in values.items():
        pipe.hincrby(key, f"{name}_count", 1)
        pipe.hincrby(key, f"{name}_ns", max(0, ns))
    pipe.hincrby(key, "inference_count", max(1, batch_size))
    pipe.hset(key, "last_inference_ms", now_ms)


def record_failure(pipe: Pipeline, key: str, *, request_ns: int, reason: str) -> None:
    """Count one failed request; ``reason`` is one of :data:`FAIL_REASONS`."""
    pipe.hincrby(key, "fail_count", 1)
    pipe.hincrby(key, "fail_ns", max(0, request_ns))
    pipe.hincrby(key, f"fail_reason:{reason}", 1)


@dataclass(frozen=True, slots=True)
class VersionStats:
    """One version's statistics, decoded from its hash."""

    counters: dict[str, int] = field(default_factory=dict)

    def get(self, name: str) -> int:
        return self.counters.get(name, 0)

    def batch_sizes(self) -> list[int]:
        """Executed batch sizes, ascending."""
        sizes = {int(k.split(":")[1]) for k in self.counters if k.startswith("batch:")}
        return sorted(sizes)


def decode_stats(raw: Mapping[bytes, bytes]) -> VersionStats:
    """Decode ``HGETALL`` of a stats hash."""
    return VersionStats({k.decode(): int(v) for k, v in raw.items()})


def triton_model_stats(name: str, version: int, stats: VersionStats) -> dict[str, Any]:
    """One ``model_stats`` entry in Triton's JSON shape (PROTOCOL.md 1.9)."""

    def pair(prefix: str) -> dict[str, int]:
        return {"count": stats.get(f"{prefix}_count"), "ns": stats.get(f"{prefix}_ns")}

    inference_stats = {
        "success": pair("success"),
        "fail": pair("fail"),
        **{d: pair(d) for d in _DURATIONS},
        "cache_hit": {"count": 0, "ns": 0},
        "cache_miss": {"count": 0, "ns": 0},
    }
    batch_stats = []
    for size in stats.batch_sizes():
        count = stats.get(f"batch:{size}:count")
        batch_stats.append(
            {
                "batch_size": size,
                "compute_input": {
                    "count": count,
                    "ns": stats.get(f"batch:{size}:compute_input_ns"),
                },
                "compute_infer": {
                    "count": count,
                    "ns": stats.get(f"batch:{size}:compute_infer_ns"),
                },
                "compute_output": {
                    "count": count,
                    "ns": stats.get(f"batch:{size}:compute_output_ns"),
                },
            }
        )
    return {
        "name": name,
        "version": str(version),
        "last_inference": stats.get("last_inference_ms"),
        "inference_count": stats.get("inference_count"),
        "execution_count": stats.get("execution_count"),
        "inference_stats": inference_stats,
        "response_stats": {},
        "batch_stats": batch_stats,
        "memory_usage": [],
    }
