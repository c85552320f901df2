"""Per-model metric families: Triton's ``nv_inference_*`` and ``sluice_*``
(docs/reference/metrics.md; Triton ``src/metric_model_reporter.cc``).

Only READY versions have series; each starts at 0 (the four ``reason`` values of
``nv_inference_request_failure`` included) and goes away when the version is
unloaded. Durations are kept in ns in Redis and exposed in µs, as Triton's counters.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluice.api.metrics.exposition import Family
from sluice.api.metrics.snapshot import VersionSample
from sluice.broker.latency_window import DEFAULT_QUANTILES, quantile
from sluice.broker.stats_store import FAIL_REASONS

__all__ = [
    "CACHE_METRICS",
    "SLUICE_MODEL_METRICS",
    "SUMMARY_METRICS",
    "TRITON_MODEL_METRICS",
    "model_families",
]

#: (name, type, help, stats field or None) of Triton's per-model metrics we expose.
TRITON_MODEL_METRICS: tuple[tuple[str, str, str], ...] = (
    (
        "nv_inference_request_success",
        "counter",
        "Number of successful inference requests, all batch sizes",
    ),
    (
        "nv_inference_request_failure",
        "counter",
        "Number of failed inference requests, all batch sizes",
    ),
    (
        "nv_inference_count",
        "counter",
        "Number of inferences performed (does not include cached requests)",
    ),
    (
        "nv_inference_exec_count",
        "counter",
        "Number of model executions performed (does not include cached requests)",
    ),
    (
        "nv_inference_pending_request_count",
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
    ),
    ("nv_model_load_duration_secs", "gauge", "Model load time in seconds"),
    (
        "nv_inference_request_duration_us",
        "counter",
        "Cumulative inference request duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_queue_duration_us",
        "counter",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "counter",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "counter",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "counter",
        "Cumulative inference compute output duration in microseconds "
        "(does not include cached requests)",
    ),
)

#: Triton's latency summaries (``--metrics-config summary_latencies=true``): (name, help,
#: histogram kind, stats field prefix of ``_count``/``_sum``). Help texts as Triton 2.51
#: writes them (the compute ones repeat the counters').
SUMMARY_METRICS: tuple[tuple[str, str, str, str], ...] = (
    (
        "nv_inference_request_summary_us",
        "Summary of inference request duration in microseconds (includes cached requests)",
        "request",
        "success",
    ),
    (
        "nv_inference_queue_summary_us",
        "Summary of inference queuing duration in microseconds (includes cached requests)",
        "queue",
        "queue",
    ),
    (
        "nv_inference_compute_input_summary_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        "compute_input",
        "compute_input",
    ),
    (
        "nv_inference_compute_infer_summary_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        "compute_infer",
        "compute_infer",
    ),
    (
        "nv_inference_compute_output_summary_us",
        "Cumulative inference compute output duration in microseconds "
        "(does not include cached requests)",
        "compute_output",
        "compute_output",
    ),
)

#: Triton's per-model response cache counters (only while the cache is on): (name, help,
#: stats field). Help texts as Triton 2.51 writes them.
CACHE_METRICS: tuple[tuple[str, str, str], ...] = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", "cache_hit_count"),
    (
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds",
        "cache_hit_ns",
    ),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", "cache_miss_count"),
    (
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert+lookup) duration per model, in microseconds",
        "cache_miss_ns",
    ),
)

#: Sluice's own per-model-version gauges (what an autoscaler scales workers on).
SLUICE_MODEL_METRICS: tuple[tuple[str, str, str], ...] = (
    (
        "sluice_queue_depth",
        "gauge",
        "Requests queued on the model version's streams that no instance has taken yet",
    ),
    (
        "sluice_queue_oldest_age_seconds",
        "gauge",
        "Age of the oldest request no instance has taken yet, in seconds (0 when none)",
    ),
    (
        "sluice_queue_pending",
        "gauge",
        "Requests taken by an instance and not yet answered (held or executing)",
    ),
    (
        "sluice_instances_live",
        "gauge",
        "Instances of the model version that are READY with a fresh heartbeat",
    ),
)

_DURATIONS = {
    "nv_inference_request_duration_us": "success_ns",
    "nv_inference_queue_duration_us": "queue_ns",
    "nv_inference_compute_input_duration_us": "compute_input_ns",
    "nv_inference_compute_infer_duration_us": "compute_infer_ns",
    "nv_inference_compute_output_duration_us": "compute_output_ns",
}
_COUNTS = {
    "nv_inference_request_success": "success_count",
    "nv_inference_count": "inference_count",
    "nv_inference_exec_count": "execution_count",
}


def model_families(
    samples: Sequence[VersionSample],
    now_ms: int,
    *,
    counter_latencies: bool = True,
    summary_quantiles: Sequence[tuple[float, float]] | None = None,
    cache: bool = False,
) -> list[Family]:
    """Families of every READY version in ``samples``.

    Args:
        samples: versions as read by :func:`api.metrics.snapshot.read_versions`.
        now_ms: the time the queue ages are measured at, ms since the epoch.
        counter_latencies: Triton ``--metrics-config counter_latencies`` (the
            ``*_duration_us`` counters).
        summary_quantiles: Triton ``--metrics-config summary_latencies=true`` with these
            (quantile, error) pairs: the five ``*_summary_us`` summaries (``_count`` and
            ``_sum`` are the counters' totals, the quantiles those of the samples'
            ``latencies``, NaN with no request in the window); None: none.
        cache: the response cache is on (Triton ``--cache-config``): the four
            ``nv_cache_*_per_model`` counters of the models that enable it, while
            ``counter_latencies`` is on (Triton ``metric_model_reporter.cc``).
    """
    ready = [s for s in samples if s.ready]
    families: list[Family] = []
    for name, kind, help_text in TRITON_MODEL_METRICS:
        if name in _DURATIONS and not counter_latencies:
            continue
        family = Family(name, kind, help_text)
        for sample in ready:
            labels = {"model": sample.model, "version": str(sample.version)}
            if name == "nv_inference_request_failure":
                for reason in FAIL_REASONS:
                    family.add(
                        {**labels, "reason": reason}, sample.stats.get(f"fail_reason:{reason}")
                    )
            elif name == "nv_inference_pending_request_count":
                family.add(labels, sample.queue.depth + sample.queue.pending)
            elif name == "nv_model_load_duration_secs":
                if sample.load_s is not None:
                    family.add(labels, sample.load_s)
            elif name in _DURATIONS:
                family.add(labels, sample.stats.get(_DURATIONS[name]) // 1000)
            else:
                family.add(labels, sample.stats.get(_COUNTS[name]))
        families.append(family)
    if cache and counter_latencies:
        for name, help_text, stat in CACHE_METRICS:
            family = Family(name, "counter", help_text)
            for sample in (s for s in ready if s.response_cache):
                value = sample.stats.get(stat)
                family.add(
                    {"model": sample.model, "version": str(sample.version)},
                    value // 1000 if stat.endswith("_ns") else value,
                )
            families.append(family)
    if summary_quantiles is not None:
        families += _summaries(ready, summary_quantiles or DEFAULT_QUANTILES)
    values = {
        "sluice_queue_depth": lambda s: s.queue.depth,
        "sluice_queue_oldest_age_seconds": lambda s: s.queue.oldest_age_s(now_ms),
        "sluice_queue_pending": lambda s: s.queue.pending,
        "sluice_instances_live": lambda s: s.live_instances,
    }
    for name, kind, help_text in SLUICE_MODEL_METRICS:
        family = Family(name, kind, help_text)
        for sample in ready:
            family.add(
                {"model": sample.model, "version": str(sample.version)}, values[name](sample)
            )
        families.append(family)
    return families


def _summaries(
    ready: Sequence[VersionSample], quantiles: Sequence[tuple[float, float]]
) -> list[Family]:
    families: list[Family] = []
    for name, help_text, kind, prefix in SUMMARY_METRICS:
        family = Family(name, "summary", help_text)
        for sample in ready:
            labels = {"model": sample.model, "version": str(sample.version)}
            family.add(labels, sample.stats.get(f"{prefix}_count"), "_count")
            family.add(labels, sample.stats.get(f"{prefix}_ns") // 1000, "_sum")
            bins = sample.latencies.get(kind, {})
            for q, _ in quantiles:
                family.add({**labels, "quantile": format(q, "g")}, quantile(bins, q))
        families.append(family)
    return families
