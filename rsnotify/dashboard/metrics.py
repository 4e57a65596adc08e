"""The dashboard's ``/metrics``: what it computed, in Prometheus form.

Latency histograms are Prometheus histograms (cumulative ``le`` buckets, sum,
count) of every sample the dashboard reads, so ``histogram_quantile`` works
over any range a Prometheus server keeps; everything else is read from the latest snapshot at scrape
time by a custom collector, so a subscriber that disappears from the page
disappears from ``/metrics`` too (no stale label sets).

Names are stable; labels are ``collection``, ``subscriber``, ``transport``,
``stage``, ``window``, ``quantile`` and ``state``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..metrics import LATENCY_BUCKETS
from ..report import LatencySample

# Any (strict module): snapshots and events are JSON documents (dashboard.state).


class _SnapshotCollector(Collector):
    def __init__(self, snapshot: Callable[[], dict[str, Any] | None]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self.snapshot()
        if snap is None:
            return
        head = GaugeMetricFamily(
            "rsnotify_dashboard_collection_head", "Last sequence number", labels=["collection"]
        )
        earliest = GaugeMetricFamily(
            "rsnotify_dashboard_collection_earliest",
            "Earliest sequence number the log still holds",
            labels=["collection"],
        )
        rate = GaugeMetricFamily(
            "rsnotify_dashboard_publish_rate",
            "Changes logged per second over the last 10 s",
            labels=["collection"],
        )
        beat = GaugeMetricFamily(
            "rsnotify_dashboard_publisher_heartbeat_age_seconds",
            "Seconds since the publisher of a collection last reported",
            labels=["collection"],
        )
        for c in snap["collections"]:
            head.add_metric([c["id"]], c["head"])
            if c["earliest"] is not None:
                earliest.add_metric([c["id"]], c["earliest"])
            rate.add_metric([c["id"]], c["rate_10s"])
            if c["publisher"]["age_s"] is not None:
                beat.add_metric([c["id"]], c["publisher"]["age_s"])
        yield from (head, earliest, rate, beat)
        labels = ["collection", "subscriber", "transport"]
        cursor = GaugeMetricFamily(
            "rsnotify_dashboard_subscriber_cursor", "Last sequence number applied", labels=labels
        )
        lag_seq = GaugeMetricFamily(
            "rsnotify_dashboard_subscriber_lag_sequences",
            "Sequences logged but not yet applied",
            labels=labels,
        )
        lag_s = GaugeMetricFamily(
            "rsnotify_dashboard_subscriber_lag_seconds",
            "Age of the oldest change logged but not applied (0 when up to date)",
            labels=labels,
        )
        state = GaugeMetricFamily(
            "rsnotify_dashboard_subscriber_state",
            "Always 1; the state label is the current state (live, catching-up, offline)",
            labels=[*labels, "state"],
        )
        for r in snap["subscribers"]:
            key = [r["collection"], r["subscriber"], r["transport"]]
            if r["cursor"] is not None:
                cursor.add_metric(key, r["cursor"])
            if r["lag_seq"] is not None:
                lag_seq.add_metric(key, r["lag_seq"])
            if r["lag_s"] is not None:
                lag_s.add_metric(key, r["lag_s"])
            # One series per row, not one per possible state: a 500-row dashboard
            # would otherwise expose 1,500 series that are almost all zero.
            state.add_metric([*key, r["state"]], 1.0)
        yield from (cursor, lag_seq, lag_s, state)
        quantiles = GaugeMetricFamily(
            "rsnotify_dashboard_latency_quantile_seconds",
            "Latency percentiles over a sliding window (nearest rank, within 2.2 %)",
            labels=["stage", "window", "quantile"],
        )
        for window, stages in snap["latency"]["windows"].items():
            for stage, summary in stages.items():
                for q in ("p50", "p90", "p99"):
                    if summary[q] is not None:
                        quantiles.add_metric([stage, window, "0." + q[1:]], summary[q])
        yield quantiles


class _LatencyHistograms(Collector):
    """``rsnotify_dashboard_latency_seconds{collection, stage}``, counted in batches.

    A prometheus-client ``Histogram.observe`` per stage per sample costs more
    than everything else the dashboard does with a sample; counting bucket
    indexes in plain lists and exposing them at scrape time gives the same
    histogram for a tenth of the cost.
    """

    def __init__(self) -> None:
        self.bounds = list(LATENCY_BUCKETS)
        self.counts: dict[tuple[str, str], list[int]] = {}
        self.sums: dict[tuple[str, str], float] = {}

    def observe_many(self, samples: list[LatencySample], stages: list[dict[str, float]]) -> None:
        counts, sums, bounds = self.counts, self.sums, self.bounds
        for sample, values in zip(samples, stages, strict=True):
            for stage, seconds in values.items():
                key = (sample.collection, stage)
                row = counts.get(key)
                if row is None:
                    row = counts[key] = [0] * (len(bounds) + 1)
                    sums[key] = 0.0
                row[bisect.bisect_left(bounds, seconds)] += 1  # le: value <= bound
                sums[key] += seconds

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "rsnotify_dashboard_latency_seconds",
            "Latency of applied changes by stage (e2e, detect, publish, deliver, apply)",
            labels=["collection", "stage"],
        )
        for key, row in sorted(self.counts.items()):
            cumulative, buckets = 0, []
            for bound, count in zip([*self.bounds, math.inf], row, strict=True):
                cumulative += count
                # prometheus_client leaves floatToGoString unannotated.
                buckets.append((floatToGoString(bound), cumulative))  # type: ignore[no-untyped-call]
            family.add_metric(list(key), buckets, self.sums[key])
        yield family


class DashboardMetrics:
    def __init__(self, snapshot: Callable[[], dict[str, Any] | None]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.latency = _LatencyHistograms()
        r.register(self.latency)
        self.samples = Counter(
            "rsnotify_dashboard_samples_total", "Latency samples read", registry=r
        )
        self.events = Counter(
            "rsnotify_dashboard_events_total", "Subscriber events read", ["kind"], registry=r
        )
        self.snapshot_seconds = Histogram(
            "rsnotify_dashboard_snapshot_seconds",
            "Time to read Redis and build one snapshot",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self.clients = Gauge(
            "rsnotify_dashboard_clients", "Pages connected over WebSocket", registry=r
        )
        self.redis_up = Gauge(
            "rsnotify_dashboard_redis_up", "1 when the last Redis read succeeded", registry=r
        )
        r.register(_SnapshotCollector(snapshot))

    def samples_seen(self, samples: list[LatencySample], stages: list[dict[str, float]]) -> None:
        self.samples.inc(len(samples))
        self.latency.observe_many(samples, stages)

    def event(self, event: dict[str, Any]) -> None:
        self.events.labels(event.get("kind") or "unknown").inc()
