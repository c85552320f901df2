"""Latency observations over a sliding window, for Triton's summary metrics.

Triton's ``--metrics-config summary_latencies=true`` adds five Prometheus summaries
per model version (``nv_inference_{request,queue,compute_input,compute_infer,
compute_output}_summary_us``): quantiles of the successful requests' durations over
a sliding window, plus ``_count`` and ``_sum``. Triton keeps them in
prometheus-cpp ``Summary`` objects (default window: 60 s max age in 5 age buckets;
Triton core ``metric_model_reporter.h`` quantiles 0.5, 0.9, 0.95, 0.99, 0.999).

Sluice's requests run in many worker processes, and every gateway must report the
same quantiles, so each model instance counts its observations in a mergeable
histogram: a :class:`LatencyRecorder` in memory, added to Redis with ``HINCRBY``
at most once a second, into one hash per version and 12 s age bucket
(:func:`window_keys`; each expires after the window). A reader adds up the hashes of
the last five age buckets (:func:`merge_windows`) and reads the quantiles off the
merged histogram (:func:`quantile`). Histogram bins keep 7 significant bits
(:func:`bin_floor`): a quantile is exact to within 0.8% of its value (Triton's CKMS
estimate is exact to within the configured rank error instead).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "AGE_BUCKET_S",
    "DEFAULT_QUANTILES",
    "KEY_TTL_S",
    "KINDS",
    "WINDOW_S",
    "LatencyRecorder",
    "bin_floor",
    "bucket_key",
    "live_bucket_keys",
    "merge_windows",
    "parse_quantiles",
    "quantile",
    "window_keys",
]

#: the sliding window, in s (prometheus-cpp ``Summary`` default ``max_age``, as Triton).
WINDOW_S = 60
#: age buckets of the window (prometheus-cpp default ``age_buckets``).
AGE_BUCKETS = 5
#: length of one age bucket, in s.
AGE_BUCKET_S = WINDOW_S // AGE_BUCKETS
#: a bucket's hash expires this long after its last write, in s (past the window).
KEY_TTL_S = WINDOW_S + 2 * AGE_BUCKET_S
#: longest wait of an observation in an instance's memory before it is sent, in ns.
FLUSH_NS = 1_000_000_000
#: the durations observed, in Triton's order (the ``*_summary_us`` families).
KINDS = ("request", "queue", "compute_input", "compute_infer", "compute_output")
#: Triton's default ``summary_quantiles`` (quantile, allowed rank error).
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001),
)  # fmt: skip

_BITS = 7


def bin_floor(us: int) -> int:
    """The lower bound of the histogram bin of a duration of ``us`` µs (≥ 0).

    Values below 128 µs have a bin each; above, a bin spans 1/64 to 1/128 of its
    floor (the top 7 bits of the value are kept).
    """
    if us < 1 << _BITS:
        return max(0, us)
    shift = us.bit_length() - _BITS
    return (us >> shift) << shift


def _bin_middle(floor: int) -> int:
    """The value reported for a bin, in whole µs as Triton's summaries: its middle,
    rounded down (its floor below 128 µs)."""
    if floor < 1 << _BITS:
        return floor
    width = 1 << (floor.bit_length() - _BITS)
    return floor + (width - 1) // 2


class LatencyRecorder:
    """One model instance's observations not yet sent to Redis.

    Args:
        key_prefix: the version's window keys without the age bucket
            (``KeySchema.latency_window`` of bucket "").
    """

    def __init__(self, key_prefix: str) -> None:
        self.key_prefix = key_prefix
        self._bins: list[dict[int, int]] = [{} for _ in KINDS]
        self._pending = False
        self._since_ns = 0

    def observe(self, kind: str, us: int, now_ns: int) -> None:
        """One observation of ``kind`` (one of :data:`KINDS`), in µs."""
        if not self._pending:
            self._pending = True
            self._since_ns = now_ns
        bins = self._bins[KINDS.index(kind)]
        floor = bin_floor(us)
        bins[floor] = bins.get(floor, 0) + 1

    def observe_batch(
        self,
        request_us: Sequence[int],
        queue_us: Sequence[int],
        compute_us: tuple[int, int, int],
        now_ns: int,
    ) -> None:
        """The successful requests of one execution.

        Args:
            request_us: each request's end-to-end duration, in µs.
            queue_us: each request's queue duration, in µs.
            compute_us: the execution's compute input, infer and output durations, in
                µs, charged to every request (Triton: a request in a batch is charged
                the whole batch's durations).
            now_ns: wall-clock ns, the oldest unsent observation's time when first.
        """
        if not request_us:
            return
        if not self._pending:
            self._pending = True
            self._since_ns = now_ns
        bins = self._bins
        for index, values in ((0, request_us), (1, queue_us)):
            kind_bins = bins[index]
            get = kind_bins.get
            for us in values:
                floor = bin_floor(us)
                kind_bins[floor] = get(floor, 0) + 1
        n = len(request_us)
        for index, us in enumerate(compute_us, 2):
            floor = bin_floor(us)
            bins[index][floor] = bins[index].get(floor, 0) + n

    def flush(self, now_ns: int, force: bool = False) -> list[tuple[object, ...]]:
        """The commands that add what was observed to the current age bucket's hash
        (``HINCRBY`` per bin, ``EXPIRE``), once the oldest observation waited
        :data:`FLUSH_NS` (or at once with ``force``); nothing otherwise. Sent twice
        (a pipeline retried after a lost connection), the bins count twice: an estimate
        over a window, not a counter."""
        if not self._pending or (not force and now_ns - self._since_ns < FLUSH_NS):
            return []
        bins, self._bins, self._pending = self._bins, [{} for _ in KINDS], False
        key = bucket_key(self.key_prefix, now_ns)
        commands: list[tuple[object, ...]] = [
            ("HINCRBY", key, f"{kind}:{floor}", count)
            for kind, kind_bins in zip(KINDS, bins, strict=True)
            for floor, count in kind_bins.items()
        ]
        commands.append(("EXPIRE", key, KEY_TTL_S))
        return commands


def bucket_key(key_prefix: str, now_ns: int) -> str:
    """The hash of the age bucket that holds wall-clock time ``now_ns``."""
    return _recent_keys(key_prefix, now_ns, 1)[0]


def _recent_keys(key_prefix: str, now_ns: int, count: int) -> list[str]:
    """The hashes of the ``count`` age buckets up to the one holding ``now_ns``, newest
    first."""
    current = now_ns // 1_000_000_000 // AGE_BUCKET_S
    return [f"{key_prefix}{current - age}" for age in range(count)]


def live_bucket_keys(key_prefix: str, now_ns: int) -> list[str]:
    """Every bucket hash that may still exist at ``now_ns`` (not yet expired)."""
    return _recent_keys(key_prefix, now_ns, KEY_TTL_S // AGE_BUCKET_S + 2)


def window_keys(key_prefix: str, now_ns: int) -> list[str]:
    """The hashes of the window ending at ``now_ns`` (wall-clock ns), newest first."""
    return _recent_keys(key_prefix, now_ns, AGE_BUCKETS)


def merge_windows(
    hashes: Iterable[Mapping[bytes | str, bytes | str | int]],
) -> dict[str, dict[int, int]]:
    """Add up window hashes: kind -> bin floor (µs) -> count. Fields that are not
    ``<kind>:<floor>`` are skipped."""
    merged: dict[str, dict[int, int]] = {kind: {} for kind in KINDS}
    for raw in hashes:
        for field, value in raw.items():
            text = field.decode() if isinstance(field, bytes) else field
            kind, _, floor_text = text.partition(":")
            bins = merged.get(kind)
            if bins is None or not floor_text.isdigit():
                continue
            floor = int(floor_text)
            bins[floor] = bins.get(floor, 0) + int(value)
    return merged


def quantile(bins: Mapping[int, int], q: float) -> float:
    """The ``q``-quantile (0 ≤ q ≤ 1) of a histogram (bin floor µs -> count), in whole
    µs: the middle of the bin holding the observation of rank ⌈q·n⌉ (the first for q = 0).
    NaN when the histogram is empty (as a prometheus-cpp summary with no observation
    in its window)."""
    total = sum(bins.values())
    if total <= 0:
        return math.nan
    rank = max(1, math.ceil(q * total))
    seen = 0
    for floor in sorted(bins):
        seen += bins[floor]
        if seen >= rank:
            return _bin_middle(floor)
    return _bin_middle(max(bins))


def parse_quantiles(text: str) -> tuple[tuple[float, float], ...]:
    """Triton's ``summary_quantiles`` value: ``<quantile>:<error>`` pairs separated by
    commas (``0.5:0.05,0.9:0.01``). Triton core ``MetricReporterConfig::ParseQuantiles``.
    Empty items are skipped; a quantile given twice is kept once (the first).

    Raises:
        ValueError: a pair without ``:``, a number that does not parse, a quantile
            outside [0, 1], or no pair at all; the message names the pair.
    """
    pairs: list[tuple[float, float]] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        q_text, sep, e_text = item.partition(":")
        if not sep:
            raise ValueError(f"summary_quantiles: '{item}' has no ':'; expected <quantile>:<error>")
        try:
            q, error = float(q_text), float(e_text)
        except ValueError:
            raise ValueError(f"summary_quantiles: '{item}' is not two numbers") from None
        if not 0.0 <= q <= 1.0 or not math.isfinite(error) or error < 0:
            raise ValueError(
                f"summary_quantiles: '{item}': the quantile must be in [0, 1] and the error ≥ 0"
            )
        if all(q != seen for seen, _ in pairs):  # a quantile given twice: the first counts
            pairs.append((q, error))
    if not pairs:
        raise ValueError("summary_quantiles: no <quantile>:<error> pair given")
    return tuple(pairs)
