"""Acceptance: the dashboard page in real headless Chromium over the whole real pipeline.

Mosquitto, redis-server, ``rsnotify simulate``, ``rsnotify publish``, two
``rsnotify subscribe --report`` (one on MQTT, one on WebSocket) and
``rsnotify dashboard`` run as processes; Debian's ``chromium`` is driven by
Playwright (``executable_path``: Playwright never downloads a browser here).

What is checked, with the tolerances:

* the figures on the page change while changes flow (a newer snapshot, more
  samples, cursors moving);
* latency: for each stage, the 1 minute sample count shown equals the number
  of samples in Redis up to the snapshot's last stream id and inside the
  window, exactly; each p50/p90/p99 shown for the 1, 5 and 60 minute windows
  is within 2.5 % + 0.2 ms of the exact nearest-rank percentile of those
  samples (the dashboard's bins promise 2.2 %);
* lags: for a row whose heartbeat (shown to the millisecond) is the
  subscriber's status now in Redis, the cursor shown equals the status's
  cursor; the lag in sequences equals the log's head at that report (from
  the log entries' logged times) minus the cursor, exactly; the lag in
  seconds equals the report time minus the change time of the first
  unapplied entry, within 1 ms; and the cursor covers the highest seq in the
  subscriber's latency samples applied by then;
* a subscriber killed with SIGKILL is shown offline, then catching up, then
  live (every state change of its rows is recorded in the page by a
  MutationObserver, so a short state is not missed between two polls);
* ``/metrics`` of the dashboard, the publisher and a subscriber parse with
  prometheus-client's own parser.

A screenshot is saved as ``<tmp_path>/dashboard.png``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.devstack import ManagedProcess, Mosquitto, Redis, free_port, wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OFFLINE_AFTER = 3
REL, ABS = 0.025, 0.0002


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Any]:
    """A page in real headless Chromium with a fresh profile (Debian's browser, no download)."""
    assert os.access(CHROMIUM, os.X_OK), "chromium is not installed: run `make services`"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1440, "height": 900},
        )
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


# -- reading the page -------------------------------------------------------------------------

READ_PAGE = """() => {
  const t = document.getElementById("latency-table");
  const num = (v) => (v === undefined || v === null || v === "" ? null : Number(v));
  const cells = {};
  t.querySelectorAll("td[data-stage]").forEach((td) => {
    cells[td.dataset.stage + "/" + td.dataset.window + "/" + td.dataset.q] =
      {text: td.textContent, value: num(td.dataset.value)};
  });
  const rows = [...document.querySelectorAll("#subscribers-body tr")].map((tr) => {
    const row = {subscriber: tr.dataset.subscriber, collection: tr.dataset.collection,
                 state: tr.dataset.state};
    tr.querySelectorAll("td[data-field]").forEach((td) => {
      row[td.dataset.field] = td.dataset.value;
      row[td.dataset.field + "_text"] = td.textContent;
    });
    const cursor = tr.querySelector('td[data-field="cursor"]');
    const lag = tr.querySelector('td[data-field="lag_s"]');
    row.head = num(cursor.dataset.head);
    row.lag_at = num(lag.dataset.at);
    for (const k of ["cursor", "lag_seq", "lag_s", "heartbeat"]) row[k] = num(row[k]);
    return row;
  });
  const start = {};
  for (const w of ["1m", "5m", "60m"]) start[w] = num(t.getAttribute("data-start-" + w));
  return {at: num(document.body.dataset.at), version: num(document.body.dataset.version),
          through: t.dataset.through || null, start, cells, rows};
}"""

WATCH_STATES = """() => {
  window.__states = [];
  const body = document.getElementById("subscribers-body");
  const record = (tr) => window.__states.push(
    [tr.dataset.subscriber, tr.dataset.collection, tr.dataset.state]);
  new MutationObserver((mutations) => {
    for (const m of mutations) {
      if (m.type === "attributes") record(m.target);
      else m.addedNodes.forEach((n) => n.dataset && n.dataset.state && record(n));
    }
  }).observe(body, {subtree: true, childList: true, attributes: true,
                    attributeFilter: ["data-state"]});
}"""


def read(page: Any) -> dict[str, Any]:
    return page.evaluate(READ_PAGE)


def rows_of(view: dict[str, Any], subscriber: str) -> list[dict[str, Any]]:
    return [r for r in view["rows"] if r["subscriber"] == subscriber]


# -- what Redis says ----------------------------------------------------------------------------


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def samples_with_ids(client: Any, through: str = "+") -> list[tuple[str, dict[str, str]]]:
    """Every latency sample up to stream id ``through``, with its id (Redis write time, ms)."""
    return [
        (stream_id.decode(), {k.decode(): v.decode() for k, v in f.items()})
        for stream_id, f in client.xrange("rsn:tm:samples", "-", through)
    ]


def samples_upto(client: Any, through: str) -> list[dict[str, str]]:
    return [sample for _, sample in samples_with_ids(client, through)]


def stages_of(g: dict[str, Any]) -> dict[str, float]:
    t, r, a = float(g["t"]), float(g["r"]), float(g["a"])
    d = float(g["d"]) if "d" in g else None
    p = float(g["p"]) if "p" in g else None
    out = {"e2e": a - t, "apply": a - r}
    if d is not None:
        out["detect"] = d - t
        if p is not None:
            out["publish"] = p - d
    if p is not None:
        out["deliver"] = r - p
    return {k: max(0.0, v) for k, v in out.items()}


def check_latency(view: dict[str, Any], client: Any) -> int:
    """Compare every latency cell with the samples in Redis; returns the 1 min e2e count."""
    samples = samples_upto(client, view["through"])
    checked = 0
    for window in ("1m", "5m", "60m"):
        start = view["start"][window]
        inside = [stages_of(g) for g in samples if math.floor(float(g["a"])) >= start]
        for stage in ("e2e", "detect", "publish", "deliver", "apply"):
            values = [s[stage] for s in inside if stage in s]
            if window == "1m":
                shown_n = view["cells"][f"{stage}/1m/n"]["value"]
                assert shown_n == len(values), (stage, shown_n, len(values))
            for q, name in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
                cell = view["cells"][f"{stage}/{window}/{name}"]
                if not values:
                    assert cell["value"] is None and cell["text"] == "\u2013"  # en dash
                    continue
                want = nearest_rank(values, q)
                got = cell["value"]
                assert got is not None and cell["text"].endswith(("ms", "s")), cell
                assert abs(got - want) <= REL * want + ABS, (stage, window, name, got, want)
                checked += 1
    assert checked >= 30, "every stage has samples in every window"
    return view["cells"]["e2e/1m/n"]["value"]


class LogView:
    """The collection logs as Redis holds them: logged time and change time per seq."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def entries(self, collection: str) -> list[tuple[int, float, float]]:
        from rsnotify import w3cdt

        out = []
        for stream_id, f in self.client.xrange("rsn:{" + collection + "}:log", "-", "+"):
            seq = int(stream_id.decode().split("-")[0])
            changed = w3cdt.parse(json.loads(f[b"d"])["datetime"]).timestamp()
            out.append((seq, int(f[b"t"]) / 1000.0, changed))
        return out

    def expected_lag(self, collection: str, cursor: int, at: float) -> tuple[int, float]:
        entries = self.entries(collection)
        head_at = max((seq for seq, logged, _ in entries if logged <= at), default=0)
        lag = max(0, head_at - cursor)
        if lag == 0:
            return 0, 0.0
        changed = next(c for seq, _, c in entries if seq == cursor + 1)
        return lag, max(0.0, at - changed)


def check_lags(page: Any, client: Any, subscribers: list[str]) -> int:
    """Rows whose report is Redis's current status: cursor and lags as Redis says."""
    log = LogView(client)
    confirmed: set[tuple[str, str]] = set()
    wanted = {(r["subscriber"], r["collection"]) for r in read(page)["rows"]}
    assert len(wanted) == 2 * len(subscribers)

    def attempt() -> bool:
        view = read(page)
        statuses = {s: json.loads(client.get(f"rsn:tm:sub:{s}")) for s in subscribers}
        for row in view["rows"]:
            status = statuses[row["subscriber"]]
            if row["state"] != "live" or abs(status["at"] - row["heartbeat"]) > 0.0006:
                continue  # a newer report arrived since the page was drawn: try again
            cs = status["collections"][row["collection"]]
            assert row["cursor"] == cs["cursor"], (row, cs)
            assert abs(row["lag_at"] - status["at"]) <= 0.0006  # shown to the millisecond
            lag_seq, lag_s = log.expected_lag(row["collection"], row["cursor"], status["at"])
            assert row["lag_seq"] == lag_seq, (row, lag_seq)
            assert abs(row["lag_s"] - lag_s) <= 0.001, (row, lag_s)
            # A sample is written once the cursor has passed its change, and its
            # `a` is when the change was applied, which can be before the cursor
            # got there (a change applied at once behind a slow one).  So what the
            # status's cursor covers is every sample written before the status:
            # stream ids (Redis's clock, this machine's) before its `at`.
            before = int(status["at"] * 1000)
            applied = [
                int(g["q"])
                for stream_id, g in samples_with_ids(client)
                if g["s"] == row["subscriber"]
                and g["c"] == row["collection"]
                and int(stream_id.split("-")[0]) < before
            ]
            assert applied and row["cursor"] >= max(applied), "samples are covered by the cursor"
            confirmed.add((row["subscriber"], row["collection"]))
        return confirmed == wanted

    wait_for(attempt, timeout=25, interval=0.1, message=lambda: f"lags confirmed for {confirmed}")
    return len(confirmed)


def parse_metrics(url: str, expect: set[str]) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    missing = expect - families.keys()
    assert not missing, f"{url} lacks {missing}"
    return families


# -- the test ----------------------------------------------------------------------------------


def test_the_page_shows_live_figures_that_agree_with_redis(
    tmp_path: Path,
    mosquitto: Mosquitto,
    redis_server: Redis,
    rsnotify_process: Callable[..., ManagedProcess],
    page: Any,
) -> None:
    ws_port = free_port()
    sim = rsnotify_process(
        "simulate",
        "--port", "0",
        "--collections", "2",
        "--rate", "40",
        "--resources", "30",
        "--changelist-size", "200",
        "--payload-bytes", "256",
        "--seed", "5",
        "--hub", f"ws://127.0.0.1:{ws_port}/{{id}}",
        "--hub", f"{mosquitto.url}/resourcesync/{{id}}/changes",
        name="simulate",
    )  # fmt: skip
    source = sim.wait_for_line(r"serving (http://\S+)", timeout=30).group(1)
    publisher = rsnotify_process(
        "publish", source,
        "--redis", redis_server.url,
        "--mqtt", mosquitto.url,
        "--ws", f"127.0.0.1:{ws_port}",
        "--poll", "0.2",
        "--metrics-port", "0",
        "--log-format", "text",
        name="publish",
    )  # fmt: skip
    publisher_metrics = publisher.wait_for_line(r"metrics (http://\S+/metrics)", timeout=30).group(
        1
    )

    def subscriber(transport: str, via: str) -> ManagedProcess:
        return rsnotify_process(
            "subscribe", source,
            "--into", str(tmp_path / f"mirror-{transport}"),
            "--via", via,
            "--name", f"sub-{transport}",
            "--report", redis_server.url,
            "--metrics-port", "0",
            "--log-format", "text",
            name=f"subscribe-{transport}",
        )  # fmt: skip

    sub_mqtt = subscriber("mqtt", mosquitto.url)
    sub_ws = subscriber("ws", f"ws://127.0.0.1:{ws_port}")
    dashboard = rsnotify_process(
        "dashboard",
        "--redis", redis_server.url,
        "--mqtt", mosquitto.url,
        "--port", "0",
        "--offline-after", str(OFFLINE_AFTER),
        "--log-format", "text",
        name="dashboard",
    )  # fmt: skip
    url = dashboard.wait_for_line(r"serving (http://\S+)", timeout=30).group(1)
    client = redis_server.client()
    processes = [sim, publisher, sub_mqtt, sub_ws, dashboard]

    def tails() -> str:
        return "\n".join(p.tail(15) for p in processes)

    page.goto(url)
    page.evaluate(WATCH_STATES)

    # 1. Everything live and latency figures on the page.
    def all_live() -> dict[str, Any] | None:
        view = read(page)
        live = [r for r in view["rows"] if r["state"] == "live"]
        n = view["cells"]["e2e/1m/n"]["value"] or 0
        return view if len(live) == 4 and n >= 40 else None

    first = wait_for(all_live, timeout=45, interval=0.2, message=lambda: "not live\n" + tails())
    # 2. The figures update during the run.
    second = wait_for(
        lambda: (
            (v := read(page))["version"] > first["version"] + 1
            and v["cells"]["e2e/1m/n"]["value"] != first["cells"]["e2e/1m/n"]["value"]
            and v
        ),
        timeout=15,
        interval=0.2,
    )
    assert second["through"] != first["through"]
    moved = {
        (r["subscriber"], r["collection"])
        for r in second["rows"]
        for old in first["rows"]
        if (old["subscriber"], old["collection"]) == (r["subscriber"], r["collection"])
        and r["cursor"] > old["cursor"]
    }
    assert len(moved) == 4, "every subscriber's cursor moved on the page"
    # 3. ... and agree with Redis.
    check_latency(second, client)
    check_lags(page, client, ["sub-mqtt", "sub-ws"])
    text = page.inner_text("#k-p50")
    assert text.endswith(("ms", "s")), text

    # 4. kill -9 the MQTT subscriber: offline, then (restarted) catching up, then live.
    collections = [r["collection"] for r in rows_of(read(page), "sub-mqtt")]
    sub_mqtt.kill()
    offline = wait_for(
        lambda: (
            (rows := rows_of(read(page), "sub-mqtt"))
            and all(r["state"] == "offline" for r in rows)
            and rows
        ),
        timeout=OFFLINE_AFTER + 10,
        interval=0.1,
        message="the killed subscriber never showed offline",
    )
    for row in offline:
        assert row["lag_seq"] == row["head"] - row["cursor"] and row["cursor"] <= row["head"]
    # Let a few hundred changes pass while it is down (the page shows its lag grow), so the
    # catch-up has work to do.
    behind = wait_for(
        lambda: (
            (rows := rows_of(read(page), "sub-mqtt"))
            and all(r["state"] == "offline" and r["lag_seq"] >= 100 for r in rows)
            and rows
        ),
        timeout=30,
        interval=0.1,
        message="the offline subscriber's lag did not grow on the page",
    )
    last_report = json.loads(client.get("rsn:tm:sub:sub-mqtt"))  # its final one
    for row in behind:
        head = int(client.hget("rsn:{" + row["collection"] + "}:meta", "head"))
        assert row["cursor"] == last_report["collections"][row["collection"]]["cursor"]
        assert row["lag_seq"] == row["head"] - row["cursor"] and row["head"] <= head
    sub_mqtt.start()
    wait_for(
        lambda: (
            (rows := rows_of(read(page), "sub-mqtt")) and all(r["state"] == "live" for r in rows)
        ),
        timeout=40,
        interval=0.1,
        message=lambda: "the restarted subscriber never went live\n" + sub_mqtt.tail(),
    )
    history = page.evaluate("() => window.__states")
    for collection in collections:
        states = [s for sub, c, s in history if sub == "sub-mqtt" and c == collection]
        compact = [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]]
        i = compact.index("offline")
        j = compact.index("catching-up", i)
        assert "live" in compact[j:], compact
    events = page.inner_text("#events")
    assert "offline" in events and "catch-up" in events
    page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)

    # 5. /metrics everywhere parses with prometheus-client's parser.
    families = parse_metrics(
        url + "metrics",
        {
            "rsnotify_dashboard_latency_seconds",
            "rsnotify_dashboard_subscriber_lag_seconds",
            "rsnotify_dashboard_subscriber_state",
            "rsnotify_dashboard_collection_head",
        },
    )
    states = families["rsnotify_dashboard_subscriber_state"].samples
    assert {s.labels["subscriber"] for s in states} == {"sub-mqtt", "sub-ws"}
    assert {s.labels["transport"] for s in states} == {"mqtt", "websocket"}
    parse_metrics(publisher_metrics, {"rsnotify_detected", "rsnotify_published"})
    sub_metrics = sub_ws.wait_for_line(r"metrics (http://\S+/metrics)", timeout=5).group(1)
    parse_metrics(
        sub_metrics,
        {
            "rsnotify_e2e_latency_seconds",
            "rsnotify_subscriber_lag_seconds",
            "rsnotify_report_samples",
        },
    )
    client.close()
