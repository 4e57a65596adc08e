"""Subscriber metrics: end-to-end latency by stage, lag, gaps (Prometheus).

Stages of one change, from the timestamps the envelope carries:
``detect`` (change time in the Change List -> publisher detected it),
``publish`` (detected -> sent on the transport), ``deliver`` (sent ->
received here) and ``apply`` (received -> on disk).  ``e2e`` is change time
-> applied.  Clocks of Source, publisher and Destination differ; negative
stage values are clamped to zero and the dashboard says so.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from ..envelope import Notification
from ..metrics import LATENCY_BUCKETS

# Any (strict module): prometheus_client's labelled children, of several metric types.


class SubscriberMetrics:
    def __init__(self, subscriber: str) -> None:
        self.subscriber = subscriber
        self._by_collection: dict[str, tuple[Any, ...]] = {}
        self._polling: set[str] = set()  # collections in degraded mode (polling)
        self.registry = CollectorRegistry()
        r = self.registry
        labels = ["collection", "subscriber"]
        self.e2e = Histogram(
            "rsnotify_e2e_latency_seconds",
            "Change time in the Change List to applied in the mirror",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stage = Histogram(
            "rsnotify_stage_latency_seconds",
            "Latency of one stage: detect, publish, deliver, apply",
            [*labels, "stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.applied = Counter("rsnotify_applied_total", "Changes applied", labels, registry=r)
        self.events = Counter(
            "rsnotify_subscriber_events_total",
            "Gaps, catch-ups, replays, reconnects",
            [*labels, "kind"],
            registry=r,
        )
        self.cursor = Gauge(
            "rsnotify_subscriber_cursor", "Last sequence number applied", labels, registry=r
        )
        self.lag = Gauge(
            "rsnotify_subscriber_lag_seconds",
            "Now minus the change time of the last change applied",
            labels,
            registry=r,
        )
        self.state_info = Gauge(
            "rsnotify_subscriber_live",
            "1 when live, 0 when catching up or offline",
            labels,
            registry=r,
        )
        self.mode = Gauge(
            "rsnotify_subscriber_polling",
            "1 while push is unavailable and the Change Lists are polled on a timer "
            "(degraded mode), 0 on push",
            labels,
            registry=r,
        )
        self.transport = Info(
            "rsnotify_subscriber_transport", "Push channel in use", ["collection"], registry=r
        )

    def _children(self, collection: str) -> tuple[Any, ...]:
        """The labelled series of one collection, looked up once (``labels()`` locks)."""
        children = self._by_collection.get(collection)
        if children is None:
            labels = (collection, self.subscriber)
            children = self._by_collection[collection] = (
                self.applied.labels(*labels),
                self.e2e.labels(*labels),
                {},  # stage -> series, made on first use (unused stages stay absent)
                self.cursor.labels(*labels),
                self.lag.labels(*labels),
            )
        return children

    def observe(self, collection: str, n: Notification, received: float, applied: float) -> None:
        applied_total, e2e, stage, cursor, lag = self._children(collection)
        changed = n.datetime.timestamp()
        applied_total.inc()
        e2e.observe(max(0.0, applied - changed))
        detected = n.detected.timestamp() if n.detected is not None else None
        published = n.published.timestamp() if n.published is not None else None
        stages = {"apply": applied - received}
        if detected is not None:
            stages["detect"] = detected - changed
            if published is not None:
                stages["publish"] = published - detected
        if published is not None:
            stages["deliver"] = received - published
        for name, seconds in stages.items():
            series = stage.get(name)
            if series is None:
                series = stage[name] = self.stage.labels(collection, self.subscriber, name)
            series.observe(max(0.0, seconds))
        if n.seq is not None:
            cursor.set(n.seq)
        lag.set(max(0.0, time.time() - changed))

    def event(self, collection: str, kind: str) -> None:
        """Count an engine event and keep ``live``/``polling`` in step with the engine's state.

        ``live`` is 1 only on push: a gap drops it, a catch-up or replay
        restores it unless the collection is polling (degraded mode), where
        it stays 0 until push is back and its catch-up ends.
        """
        self.events.labels(collection, self.subscriber, kind).inc()
        live = self.state_info.labels(collection, self.subscriber)
        if kind == "gap":
            live.set(0)
        elif kind in ("catch-up", "replay"):
            live.set(0 if collection in self._polling else 1)
        elif kind in ("polling", "push"):  # degraded mode entered or left (sync._report_mode)
            if kind == "polling":
                self._polling.add(collection)
                live.set(0)
            else:
                self._polling.discard(collection)
            self.mode.labels(collection, self.subscriber).set(1 if kind == "polling" else 0)

    def state(self, collection: str, state: str) -> None:
        live = state == "live" and collection not in self._polling
        self.state_info.labels(collection, self.subscriber).set(1 if live else 0)
