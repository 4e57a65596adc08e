"""Latency percentiles over sliding windows, in bounded memory (pure: time passed in).

Every sample is put in a logarithmic bin (16 per octave from 0.1 ms, so a
reported percentile is within 2.2 % of the exact one), and counted in the
bucket of the second it was applied and of its minute.  Running totals per
window (1 and 5 minutes from second buckets, 60 minutes from minute buckets)
are kept up to date by adding each sample once and subtracting each bucket
when it leaves the window, so a snapshot costs a walk over a few hundred bins,
however many samples arrived: memory is bounded by the number of buckets
kept (300 seconds, 60 minutes), not by the rate.

Percentiles use the nearest-rank definition: the value of the ``ceil(q*n)``-th
smallest sample, reported as the geometric middle of its bin.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..envelope import LATENCY_STAGES

MIN_SECONDS = 1e-4
BINS_PER_OCTAVE = 16
QUANTILES = (0.5, 0.9, 0.99)
STAGES = LATENCY_STAGES
SECOND_BUCKETS = 300
MINUTE_BUCKETS = 60
# name -> (span in buckets, bucket size in seconds)
WINDOWS: dict[str, tuple[int, int]] = {"1m": (60, 1), "5m": (300, 1), "60m": (60, 60)}
_LOG_SCALE = BINS_PER_OCTAVE / math.log(2)


def bin_of(seconds: float) -> int:
    """Bin 0 holds everything under 0.1 ms; bin b >= 1 holds [0.1 ms * 2^((b-1)/16), ...)."""
    if not seconds >= MIN_SECONDS:  # also catches NaN
        return 0
    return int(math.log(seconds / MIN_SECONDS) * _LOG_SCALE) + 1


def bin_value(b: int) -> float:
    """The geometric middle of bin ``b`` (0 for bin 0)."""
    if b <= 0:
        return 0.0
    value: float = MIN_SECONDS * 2.0 ** ((b - 0.5) / BINS_PER_OCTAVE)  # float ** float: Any
    return round(value, 7)


def bin_lower(b: int) -> float:
    return 0.0 if b <= 0 else MIN_SECONDS * 2.0 ** ((b - 1) / BINS_PER_OCTAVE)


class Histogram:
    """Counts per bin (sparse)."""

    __slots__ = ("counts", "n")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0

    def add(self, b: int, k: int = 1) -> None:
        self.counts[b] = self.counts.get(b, 0) + k
        self.n += k

    def merge(self, other: Histogram, sign: int = 1) -> None:
        counts = self.counts
        for b, k in other.counts.items():
            left = counts.get(b, 0) + sign * k
            if left:
                counts[b] = left
            else:
                counts.pop(b, None)
        self.n += sign * other.n

    def percentiles(self, quantiles: Iterable[float] = QUANTILES) -> list[float | None]:
        """Nearest-rank percentiles, one pass over the sorted bins."""
        qs = list(quantiles)
        if self.n <= 0:
            return [None] * len(qs)
        ranks = [max(1, math.ceil(q * self.n)) for q in qs]
        out: list[float | None] = [None] * len(qs)
        order = sorted(range(len(qs)), key=lambda i: ranks[i])
        position = 0
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            while position < len(order) and seen >= ranks[order[position]]:
                out[order[position]] = bin_value(b)
                position += 1
            if position == len(order):
                break
        return out


@dataclass(slots=True)
class _Bucket:
    stages: dict[str, Histogram] = field(default_factory=dict)

    def add(self, stage: str, b: int, k: int = 1) -> None:
        h = self.stages.get(stage)
        if h is None:
            h = self.stages[stage] = Histogram()
        h.add(b, k)


def _summary(h: Histogram | None) -> dict[str, float | int | None]:
    if h is None or h.n <= 0:
        return {"p50": None, "p90": None, "p99": None, "n": 0}
    p50, p90, p99 = h.percentiles()
    return {"p50": p50, "p90": p90, "p99": p99, "n": h.n}


class LatencyWindows:
    """Samples in, percentiles per stage over 1/5/60 minutes and per-second series out."""

    def __init__(self, now: float) -> None:
        self.seconds: dict[int, _Bucket] = {}
        self.minutes: dict[int, _Bucket] = {}
        self.totals: dict[str, dict[str, Histogram]] = {w: {} for w in WINDOWS}
        # Per window: the newest bucket already subtracted (everything <= it is out).
        self.expired: dict[str, int] = {}
        self.now_s = int(now)
        for name, (span, size) in WINDOWS.items():
            self.expired[name] = self.now_s // size - span
        self.added = 0
        self.too_old = 0
        self._series_cache: dict[int, dict[str, list[float | None]]] = {}

    # -- input -------------------------------------------------------------------------

    def add(self, stages: Mapping[str, float], applied: float) -> None:
        """Count one sample whose stages are ``stages`` (seconds), applied at ``applied``."""
        self.add_many([(stages, applied)])

    def add_many(self, samples: Iterable[tuple[Mapping[str, float], float]]) -> None:
        """Count a batch: identical (second, stage, bin) triples are counted once, with a weight.

        Thousands of samples a second mostly fall in a few dozen bins, so the
        five places each is counted in (second, minute, three windows) are
        updated once per distinct triple rather than once per sample.
        """
        now_s = self.now_s
        oldest_minute = now_s // 60 - MINUTE_BUCKETS
        counts: dict[tuple[int, str, int], int] = {}
        for stages, applied in samples:
            second = min(int(applied), now_s)  # a clock ahead of ours counts as now
            if second // 60 <= oldest_minute:
                self.too_old += 1
                continue
            self.added += 1
            for stage, value in stages.items():
                key = (second, stage, bin_of(value))
                counts[key] = counts.get(key, 0) + 1
        for (second, stage, b), k in counts.items():
            self._count(second, stage, b, k)

    def _count(self, second: int, stage: str, b: int, k: int) -> None:
        minute = second // 60
        if second > self.now_s - SECOND_BUCKETS:
            bucket = self.seconds.get(second)
            if bucket is None:
                bucket = self.seconds[second] = _Bucket()
            bucket.add(stage, b, k)
            self._series_cache.pop(second, None)
        mbucket = self.minutes.get(minute)
        if mbucket is None:
            mbucket = self.minutes[minute] = _Bucket()
        mbucket.add(stage, b, k)
        self._series_cache.pop(-minute - 1, None)
        for name, (_span, size) in WINDOWS.items():
            if second // size > self.expired[name]:
                totals = self.totals[name]
                h = totals.get(stage)
                if h is None:
                    h = totals[stage] = Histogram()
                h.add(b, k)

    def advance(self, now: float) -> None:
        """Move the windows to ``now``: buckets that left a window are subtracted from it."""
        now_s = int(now)
        if now_s < self.now_s:
            return  # the clock went back: keep the windows where they are
        self.now_s = now_s
        for name, (span, size) in WINDOWS.items():
            newest_out = now_s // size - span
            buckets = self.seconds if size == 1 else self.minutes
            totals = self.totals[name]
            # Walk only the buckets that exist (a long idle gap may skip thousands of units).
            for unit in sorted(u for u in buckets if self.expired[name] < u <= newest_out):
                for stage, h in buckets[unit].stages.items():
                    total = totals.get(stage)
                    if total is not None:
                        total.merge(h, -1)
            self.expired[name] = max(self.expired[name], newest_out)
        for second in [s for s in self.seconds if s <= now_s - SECOND_BUCKETS]:
            del self.seconds[second]
            self._series_cache.pop(second, None)
        for minute in [m for m in self.minutes if m <= now_s // 60 - MINUTE_BUCKETS]:
            del self.minutes[minute]
            self._series_cache.pop(-minute - 1, None)

    # -- output ------------------------------------------------------------------------

    def summary(self) -> dict[str, dict[str, dict[str, float | int | None]]]:
        """{window: {stage: {p50, p90, p99, n}}} as of the last :meth:`advance`."""
        return {
            name: {stage: _summary(self.totals[name].get(stage)) for stage in STAGES}
            for name in WINDOWS
        }

    def window_start(self, name: str) -> float:
        """Earliest applied time (epoch s) counted in window ``name`` as of :meth:`advance`."""
        _span, size = WINDOWS[name]
        return float((self.expired[name] + 1) * size)

    def _bucket_percentiles(self, key: int, bucket: _Bucket) -> dict[str, list[float | None]]:
        cached = self._series_cache.get(key)
        if cached is None:
            cached = {stage: h.percentiles() for stage, h in bucket.stages.items()}
            cached["n"] = [float(bucket.stages["e2e"].n)] if "e2e" in bucket.stages else [0.0]
            self._series_cache[key] = cached
        return cached

    def series(self, resolution: str = "1s") -> dict[str, list[float | None]]:
        """Per-bucket percentiles of every stage: ``t`` (bucket start), ``<stage>_p50`` ..., ``n``.

        ``1s``: the last 300 seconds; ``1m``: the last 60 minutes.  Buckets
        without samples are left out (the chart draws a break, not a zero).
        """
        if resolution == "1s":
            items = [(s, s, b) for s, b in sorted(self.seconds.items())]
        else:
            items = [(-m - 1, m * 60, b) for m, b in sorted(self.minutes.items())]
        out: dict[str, list[float | None]] = {"t": [], "n": []}
        for stage in STAGES:
            for q in ("p50", "p90", "p99"):
                out[f"{stage}_{q}"] = []
        for key, start, bucket in items:
            values = self._bucket_percentiles(key, bucket)
            out["t"].append(float(start))
            out["n"].append(values["n"][0])
            for stage in STAGES:
                p = values.get(stage) or [None, None, None]
                out[f"{stage}_p50"].append(p[0])
                out[f"{stage}_p90"].append(p[1])
                out[f"{stage}_p99"].append(p[2])
        return out

    def histogram(
        self, window: str, stage: str = "e2e", per_octave: int = 4
    ) -> dict[str, list[float]]:
        """Counts in coarser log bins (``per_octave``) for a chart: ``lower``, ``upper``, ``count``.

        Bin 0 (under 0.1 ms) is shown as [0, 0.1 ms).
        """
        h = self.totals[window].get(stage)
        out: dict[str, list[float]] = {"lower": [], "upper": [], "count": []}
        if h is None or h.n <= 0:
            return out
        group = BINS_PER_OCTAVE // per_octave
        merged: dict[int, int] = {}
        for b, k in h.counts.items():
            g = 0 if b == 0 else (b - 1) // group + 1
            merged[g] = merged.get(g, 0) + k
        first, last = min(merged), max(merged)
        for g in range(first, last + 1):
            lower = 0.0 if g == 0 else bin_lower((g - 1) * group + 1)
            upper = MIN_SECONDS if g == 0 else bin_lower(g * group + 1)
            out["lower"].append(lower)
            out["upper"].append(upper)
            out["count"].append(merged.get(g, 0))
        return out
