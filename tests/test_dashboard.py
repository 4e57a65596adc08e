"""Dashboard: the pure core (windows, percentiles, states, lags), the reporter, the server.

The browser acceptance test (real processes, real Chromium) is in
``test_dashboard_browser.py``; these run in well under a second each.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from rsnotify import report
from rsnotify.dashboard.latency import Histogram, LatencyWindows, bin_of, bin_value
from rsnotify.dashboard.server import Dashboard, DashboardConfig
from rsnotify.dashboard.state import DashboardState, LogIndex
from rsnotify.report import LatencySample, ReportError
from tests.devstack import Redis, async_wait_for, free_port

T0 = 1_800_000_000.0  # a fixed "now" for the pure tests


def exact(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


# -- latency bins and windows --------------------------------------------------------------


def test_a_bin_reports_a_value_within_its_stated_error() -> None:
    rng = random.Random(3)
    for _ in range(2000):
        v = 10 ** rng.uniform(-4, 3)
        assert abs(bin_value(bin_of(v)) - v) <= 0.022 * v + 1e-7
    assert bin_of(0.0) == 0 and bin_of(-1.0) == 0 and bin_of(float("nan")) == 0
    assert bin_value(0) == 0.0


def test_percentiles_match_nearest_rank_within_the_bin_error() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(-3, 1) for _ in range(5000)]
    h = Histogram()
    for v in values:
        h.add(bin_of(v))
    for q, got in zip((0.5, 0.9, 0.99), h.percentiles(), strict=True):
        want = exact(values, q)
        assert got is not None
        assert abs(got - want) <= 0.022 * want + 1e-7, (q, got, want)
    assert Histogram().percentiles() == [None, None, None]


def test_windows_count_exactly_the_samples_of_their_span() -> None:
    w = LatencyWindows(T0)
    # One sample per second for ten minutes, value = its age in minutes (+1 ms).
    for i in range(600):
        t = T0 + i
        w.advance(t)
        w.add({"e2e": 0.001 * (1 + i // 60)}, t)
    w.advance(T0 + 599.5)
    s = w.summary()
    assert s["1m"]["e2e"]["n"] == 60
    assert s["5m"]["e2e"]["n"] == 300
    assert s["60m"]["e2e"]["n"] == 600
    assert w.window_start("1m") == T0 + 540
    assert s["1m"]["e2e"]["p50"] == pytest.approx(0.010, rel=0.022)
    # Time passes with no samples: everything leaves the 1 and 5 minute windows.
    w.advance(T0 + 1000)
    s = w.summary()
    assert s["1m"]["e2e"]["n"] == 0 and s["1m"]["e2e"]["p50"] is None
    assert s["5m"]["e2e"]["n"] == 0
    assert s["60m"]["e2e"]["n"] == 600
    w.advance(T0 + 5000)
    assert w.summary()["60m"]["e2e"]["n"] == 0
    assert not w.seconds and not w.minutes, "old buckets are dropped: memory stays bounded"


def test_a_late_sample_counts_in_the_windows_that_still_cover_its_second() -> None:
    w = LatencyWindows(T0)
    w.advance(T0 + 120)
    w.add({"e2e": 0.5}, T0 + 100)  # 20 s late: in 1m, 5m and 60m
    w.add({"e2e": 0.5}, T0 + 30)  # 90 s late: not in 1m
    w.add({"e2e": 0.5}, T0 + 130)  # a clock ahead of ours counts as now
    s = w.summary()
    assert (s["1m"]["e2e"]["n"], s["5m"]["e2e"]["n"], s["60m"]["e2e"]["n"]) == (2, 3, 3)
    w.add({"e2e": 0.5}, T0 - 4000)
    assert w.too_old == 1


def test_series_and_histogram_come_from_the_same_buckets() -> None:
    w = LatencyWindows(T0)
    for i in range(10):
        w.add({"e2e": 0.002, "apply": 0.0005}, T0 - 5 + i * 0.5)
    w.advance(T0)
    series = w.series("1s")
    assert series["t"] == [T0 - 5 + i for i in range(5)]
    assert sum(series["n"]) == 10
    assert series["e2e_p50"][0] == pytest.approx(0.002, rel=0.022)
    assert series["detect_p50"] == [None] * 5
    h = w.histogram("1m", "e2e")
    assert sum(h["count"]) == 10
    (i,) = [k for k, c in enumerate(h["count"]) if c]
    assert h["lower"][i] <= 0.002 < h["upper"][i]


# -- the dashboard's state: lag, states, events ------------------------------------------------


def test_log_index_answers_head_at_and_change_times() -> None:
    index = LogIndex(capacity=8)
    index.extend((seq, T0 + seq, T0 + seq - 0.5) for seq in range(1, 21))
    assert index.last == 20
    assert index.first == 13, "bounded: only the newest entries are kept"
    assert index.head_at(T0 + 15.2) == 15
    assert index.head_at(T0 + 7) is None, "before the tail: unknown, not guessed"
    assert index.get(15) == (T0 + 15, T0 + 14.5)
    assert index.count_since(T0 + 18) == 3
    index.extend([(30, T0 + 30, None)])  # a hole (trimmed log): start again there
    assert index.get(20) is None and index.last == 30


def _status(at: float, cursor: int | None, state: str = "live", **extra: Any) -> dict[str, Any]:
    cs = {"cursor": cursor, "state": state, "transport": "mqtt", "cursor_datetime": None}
    cs.update(extra)
    return {"subscriber": "s1", "at": at, "collections": {"c": cs}}


def _state_with_log(head: int) -> DashboardState:
    state = DashboardState(T0, offline_after=3.0, hold=2.0)
    info = state.collection("c")
    info.head = head
    info.earliest = 1
    # seq n logged at T0 + n/10, changed 0.2 s before.
    info.index.extend((n, T0 + n / 10, T0 + n / 10 - 0.2) for n in range(1, head + 1))
    return state


def test_lag_of_an_online_subscriber_is_measured_at_its_report() -> None:
    state = _state_with_log(head=100)
    # Reported at T0+5.05: seq 50 was logged by then; its cursor is 45.
    state.subscribers = {"s1": _status(T0 + 5.05, 45)}
    (row,) = state.build(T0 + 5.5)["subscribers"]
    assert row["state"] == "live"
    assert row["lag_seq"] == 5
    assert row["lag_s"] == pytest.approx((T0 + 5.05) - (T0 + 4.6 - 0.2))
    # Everything logged by its report applied: no lag, although the head moved on.
    state.subscribers = {"s1": _status(T0 + 5.05, 50)}
    (row,) = state.build(T0 + 5.5)["subscribers"]
    assert (row["lag_seq"], row["lag_s"]) == (0, 0.0)


def test_states_offline_then_catching_up_then_live_with_events() -> None:
    state = _state_with_log(head=100)
    state.subscribers = {"s1": _status(T0 + 1, 40)}
    assert state.build(T0 + 1.5)["subscribers"][0]["state"] == "live"
    # Silent for longer than offline_after: offline, lag measured now against the head.
    snap = state.build(T0 + 5)
    (row,) = snap["subscribers"]
    assert row["state"] == "offline"
    assert row["lag_seq"] == 60
    assert row["lag_s"] == pytest.approx((T0 + 5) - (T0 + 4.1 - 0.2))
    assert snap["events"][0]["kind"] == "offline"
    # Back, starting: catching up.
    state.subscribers = {"s1": _status(T0 + 6, 40, state="starting")}
    snap = state.build(T0 + 6.2)
    assert snap["subscribers"][0]["state"] == "catching-up"
    assert snap["events"][0]["kind"] == "online"
    # Live again, but a catch-up ended under `hold` seconds ago: still shown catching up.
    state.subscribers = {"s1": _status(T0 + 7, 100, caught_up_at=T0 + 6.9)}
    assert state.build(T0 + 7.5)["subscribers"][0]["state"] == "catching-up"
    assert state.build(T0 + 9.0)["subscribers"][0]["state"] == "live"
    # A clean stop is offline at once.
    state.subscribers = {"s1": {**_status(T0 + 10, 100), "stopped": True}}
    assert state.build(T0 + 10.1)["subscribers"][0]["state"] == "offline"


def test_a_subscriber_polling_while_push_is_down_says_so_and_why() -> None:
    """Degraded mode (issue 18 item 3): the row shows ``polling`` and the channel's last word."""
    state = _state_with_log(head=100)
    down = "MQTT broker mqtt://b:1883 is unreachable"
    state.subscribers = {"s1": _status(T0 + 1, 40, state="polling", mode_reason=down)}
    (row,) = state.build(T0 + 1.5)["subscribers"]
    assert (row["state"], row["mode_reason"]) == ("polling", down)
    state.subscribers = {"s1": _status(T0 + 2, 40, mode_reason="push is back")}
    (row,) = state.build(T0 + 2.5)["subscribers"]
    assert (row["state"], row["mode_reason"]) == ("live", None)


def test_lag_behind_what_the_log_still_holds_counts_from_its_earliest_entry() -> None:
    state = DashboardState(T0, offline_after=3.0)
    info = state.collection("c")
    info.head, info.earliest = 500, 400  # 1..399 trimmed away
    info.index.extend((n, T0 + n / 10, T0 + n / 10 - 0.2) for n in range(400, 501))
    state.subscribers = {"s1": _status(T0, 100)}
    assert state.wanted_lookups() == [("c", 101)]
    state.remember("c", 101, None)  # the collector found nothing: trimmed
    assert state.wanted_lookups() == [], "not asked again every second"
    (row,) = state.build(T0 + 60)["subscribers"]
    assert row["state"] == "offline" and row["lag_seq"] == 400
    assert row["lag_s"] == pytest.approx(60 - (40 - 0.2), abs=1e-3), "at least this old"


def test_publisher_health_from_the_freshest_heartbeat() -> None:
    state = _state_with_log(head=10)
    snap = state.build(T0 + 2)
    assert snap["collections"][0]["publisher"]["health"] == "unknown"
    state.publishers = {"p": {"at": T0 + 1, "healthy": True, "collections": {"c": {}}}}
    assert state.build(T0 + 2)["collections"][0]["publisher"]["health"] == "ok"
    assert state.build(T0 + 30)["collections"][0]["publisher"]["health"] == "stale"
    state.mqtt_heads["c"] = {"heartbeat": T0 + 29, "publisher": "p", "head": 10}
    publisher = state.build(T0 + 30)["collections"][0]["publisher"]
    assert (publisher["health"], publisher["via"]) == ("ok", "mqtt")


# -- the reporter --------------------------------------------------------------------------------


def test_a_sample_round_trips_and_bad_ones_are_refused() -> None:
    s = LatencySample("c", "s", 7, T0, T0 + 0.5, T0 + 0.51, T0 + 0.52, T0 + 0.6)
    back = LatencySample.from_fields({k.encode(): v.encode() for k, v in s.fields().items()})
    assert back == s
    stages = back.stages()
    assert stages["e2e"] == pytest.approx(0.6)
    assert stages["detect"] == pytest.approx(0.5)
    assert stages["deliver"] == pytest.approx(0.01)
    skewed = LatencySample("c", "s", 8, T0, None, None, T0 + 1, T0 - 1)
    assert skewed.stages() == {"e2e": 0.0, "apply": 0.0}  # clamped, and no stage it cannot know
    with pytest.raises(ValueError):
        LatencySample.from_fields({**s.fields(), "a": "nan"})
    with pytest.raises(ReportError):
        report.check_url("http://example.org/")


def _fake_subscriber(name: str) -> Any:
    from rsnotify.subscriber.sync import SyncStats

    registry = CollectorRegistry()
    engine = SimpleNamespace(
        on_applied=None,
        on_event=None,
        applied_seq=3,
        applied=SimpleNamespace(last_time=None),
        detector=SimpleNamespace(expected=4),
        queue=asyncio.Queue(),
        stats=SyncStats(state="live"),
    )
    metrics = SimpleNamespace(registry=registry, subscriber=name)
    return SimpleNamespace(metrics=metrics, engines={"c": engine}), engine


def _notification(seq: int) -> Any:
    from datetime import UTC, datetime

    return SimpleNamespace(
        seq=seq, datetime=datetime.fromtimestamp(T0, UTC), detected=None, published=None
    )


async def test_the_reporter_writes_samples_events_and_status(redis_server: Redis) -> None:
    sub, engine = _fake_subscriber("alpha")
    reporter = report.SubscriberReporter(redis_server.url, sub, interval=0.2).attach()
    task = asyncio.create_task(reporter.run())
    client = redis_server.client()
    try:
        engine.on_applied(_notification(1), T0 + 1, T0 + 2)
        engine.on_event("gap", "invalid payload: signature does not match the payload", {})
        await async_wait_for(lambda: client.xlen(report.SAMPLES_KEY) == 1, timeout=5)
        await async_wait_for(lambda: client.xlen(report.EVENTS_KEY) == 2, timeout=5)
        kinds = [f[b"k"] for _, f in client.xrange(report.EVENTS_KEY)]
        assert kinds == [b"signature", b"gap"]
        status = json.loads(client.get(report.subscriber_key("alpha")))
        assert status["collections"]["c"]["cursor"] == 3
        assert client.zscore(report.SUBSCRIBERS_KEY, "alpha") is not None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    status = json.loads(client.get(report.subscriber_key("alpha")))
    assert status["stopped"] is True, "a clean stop is reported, so the page shows it at once"
    client.close()


async def test_the_reporter_drops_and_counts_when_redis_is_down(tmp_path: Path) -> None:
    sub, engine = _fake_subscriber("beta")
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    reporter = report.SubscriberReporter(url, sub, interval=0.1).attach()
    task = asyncio.create_task(reporter.run())
    try:
        started = time.perf_counter()
        for seq in range(1, 1001):
            engine.on_applied(_notification(seq), T0, T0)
        assert time.perf_counter() - started < 1.0, "callbacks only enqueue"
        await async_wait_for(lambda: reporter.dropped >= 1000, timeout=10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    text = "".join(
        f"{s.name} {s.value}\n"
        for f in sub.metrics.registry.collect()
        for s in f.samples
        if s.name == "rsnotify_report_dropped_total"
    )
    assert float(text.split()[1]) >= 1000


# -- the server against a real Redis ------------------------------------------------------------


async def test_the_api_metrics_and_healthz_over_synthetic_telemetry(redis_server: Redis) -> None:
    client = redis_server.client()
    now = time.time()
    client.hset("rsn:collections", "c1", "http://src/c1/capabilitylist.xml")
    for seq in range(1, 11):
        body = json.dumps({"datetime": "2020-01-01T00:00:00Z", "seq": seq})
        client.xadd("rsn:{c1}:log", {"d": body, "t": int((now - 20 + seq) * 1000)}, id=f"{seq}-0")
    client.hset("rsn:{c1}:meta", "head", 10)
    samples = [
        LatencySample("c1", "s1", n, now - 1, now - 0.9, now - 0.8, now - 0.7, now - 0.7 + n / 1000)
        for n in range(1, 11)
    ]
    for s in samples:
        client.xadd(report.SAMPLES_KEY, s.fields())
    status = {"at": now, "collections": {"c1": {"cursor": 10, "state": "live", "transport": "ws"}}}
    client.set(report.subscriber_key("s1"), json.dumps(status))
    client.zadd(report.SUBSCRIBERS_KEY, {"s1": now})
    dashboard = Dashboard(DashboardConfig(redis=redis_server.url, port=0, interval=0.2))
    await dashboard.start()
    try:
        base = dashboard.url
        await async_wait_for(
            lambda: (dashboard.snapshot or {}).get("totals", {}).get("samples_total") == 10,
            timeout=10,
        )
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "api/subscribers?state=live") as response:
                rows = await response.json()
            assert [(r["subscriber"], r["cursor"], r["lag_seq"]) for r in rows] == [("s1", 10, 0)]
            async with http.get(base + "api/latency") as response:
                lat = await response.json()
            e2e = lat["windows"]["1m"]["e2e"]
            want = exact([s.stages()["e2e"] for s in samples], 0.5)
            assert e2e["n"] == 10 and abs(e2e["p50"] - want) <= 0.022 * want
            async with http.get(base + "metrics") as response:
                assert response.status == 200
                text = await response.text()
            async with http.get(base + "healthz") as response:
                assert response.status == 200
            async with http.get(base) as response:
                page = await response.text()
                assert "uPlot.iife.min.js" in page
                assert "script-src 'self'" in response.headers["Content-Security-Policy"]
            async with http.get(base + "static/uPlot.iife.min.js") as response:
                assert response.status == 200 and len(await response.read()) > 40_000
            async with http.ws_connect(base + "ws") as ws:
                first = json.loads((await ws.receive(timeout=5)).data)
                second = json.loads((await ws.receive(timeout=5)).data)
                assert second["dashboard"]["version"] > first["dashboard"]["version"]
        families = {f.name: f for f in text_string_to_metric_families(text)}
        latency_family = families["rsnotify_dashboard_latency_seconds"]
        counts = [
            s.value
            for s in latency_family.samples
            if s.name.endswith("_count") and s.labels == {"collection": "c1", "stage": "e2e"}
        ]
        assert counts == [10.0]
        lag = families["rsnotify_dashboard_subscriber_lag_sequences"].samples
        assert lag[0].labels == {"collection": "c1", "subscriber": "s1", "transport": "ws"}
        assert families["rsnotify_dashboard_collection_head"].samples[0].value == 10
        # Redis gone: /healthz says so, the page keeps the last figures.
        redis_server.stop()
        await async_wait_for(lambda: not dashboard.collector.ok, timeout=15)
        async with aiohttp.ClientSession() as http, http.get(base + "healthz") as response:
            assert response.status == 503
        assert dashboard.snapshot is not None
        assert dashboard.snapshot["dashboard"]["redis"]["ok"] is False
        assert dashboard.snapshot["totals"]["samples_total"] == 10
    finally:
        await dashboard.stop()
        client.close()


def test_the_dashboard_refuses_a_bad_redis_url() -> None:
    from rsnotify.cli import main

    assert main(["dashboard", "--redis", "http://nope/", "--port", "0"]) == 2
