"""Dashboard under load: 50 subscribers and 10 collections, page in real Chromium.

A generator process writes, into a private Redis (``tests.devstack``),
exactly what a real deployment writes: 10 collections' logs (``rsn:{c}:log``
entries with their logged time and change ``datetime``, ``meta`` heads,
``rsn:collections``), a publisher status every second, and for 50 subscribers
following all 10 collections one latency sample per change applied (the
``rsn:tm:samples`` stream), a status per subscriber every second and, now and
then, gap and catch-up events.  Two subscribers stop reporting (offline) and
three apply at half speed (catching up), so every code path of a snapshot
runs.  ``rsnotify dashboard`` runs as its own process (the CLI); headless
Chromium (Debian's, through Playwright) shows the page for the whole run.

Scenarios: *realistic* = 20 changes/s over the 10 collections, so 1,000
samples/s from 50 subscribers; *heavy* = 100 changes/s, 5,000 samples/s.
500 subscriber rows either way.  Measured, while the load runs:

* snapshot: Redis read and build+encode time of every snapshot (each pushed
  snapshot carries its read time and the previous one's build time), its size;
* push interval: time between snapshots received by a WebSocket client here;
* page: render time of each snapshot in the page and the interval between
  renders (``window.rsnotifyDashboard.stats``, ``performance.now()``);
* API: response time of ``/api/snapshot``, ``/api/subscribers``,
  ``/api/latency``, ``/metrics`` and ``/healthz`` (sequential, keep-alive, 10/s);
* the dashboard process's CPU and RSS (psutil), and whether it counted every
  sample the generator wrote.

Run ``.venv/bin/python -m bench.dashboard`` (``--quick``: realistic only,
15 s).  Prints a table with PASS/FAIL per target, writes
``bench/results/dashboard.json`` (``dashboard-quick.json``), exits 0 either way.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import random
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench._common import format_table, machine_info, source_digest, write_json

CHROMIUM = "/usr/bin/chromium"
SUBSCRIBERS = 50
COLLECTIONS = 10
OFFLINE = 2
CATCHING_UP = 3
TARGETS = {
    "snapshot_ms_p99": 100.0,  # read + build + encode, 10 % of the 1 s interval
    "push_interval_s_p99": 1.5,
    "page_interval_s_p99": 1.5,
    "page_render_ms_p99": 100.0,
    "api_ms_p99": 100.0,  # /api/* and /healthz, while everything else runs
    "metrics_ms_p99": 1000.0,  # /metrics renders ~2,000 series with prometheus-client
}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


# -- the generator (a child process) ---------------------------------------------------------


def generate(url: str, rate: float, seconds: float, seed: int = 1) -> None:
    """Write the telemetry and logs of 10 collections and 50 subscribers for ``seconds``."""
    import redis

    from rsnotify import report, w3cdt
    from rsnotify.report import LatencySample

    rng = random.Random(seed)
    client = redis.Redis.from_url(url)
    cids = [f"bench.example.org-c{i:02d}-capabilitylist-{i:08x}" for i in range(COLLECTIONS)]
    subs = [f"dest-{i:02d}" for i in range(SUBSCRIBERS)]
    offline = set(subs[:OFFLINE])
    slow = set(subs[OFFLINE : OFFLINE + CATCHING_UP])
    heads = dict.fromkeys(cids, 0)
    cursors = {s: dict.fromkeys(cids, 0) for s in subs}
    entries: dict[str, dict[int, float]] = {c: {} for c in cids}  # seq -> change time
    for cid in cids:
        client.hset("rsn:collections", cid, f"http://bench.example.org/{cid}/capabilitylist.xml")
    per_tick = rate / COLLECTIONS / 10  # 10 ticks a second
    carry = dict.fromkeys(cids, 0.0)
    written = 0
    started = time.time()
    next_status = 0.0
    next_event = started + 3
    tick = 0
    print(json.dumps({"ready": True}), flush=True)
    while (now := time.time()) < started + seconds:
        pipe = client.pipeline(transaction=False)
        for cid in cids:
            carry[cid] += per_tick
            while carry[cid] >= 1:
                carry[cid] -= 1
                heads[cid] += 1
                seq = heads[cid]
                changed = now - rng.uniform(0.05, 0.3)
                entries[cid][seq] = changed
                body = {
                    "v": 1,
                    "collection": cid,
                    "seq": seq,
                    "loc": f"http://bench.example.org/{cid}/r{seq}.txt",
                    "change": "updated",
                    "datetime": w3cdt.format(datetime.fromtimestamp(changed, UTC)),
                }
                pipe.xadd(
                    "rsn:{" + cid + "}:log",
                    {"d": json.dumps(body), "t": int(now * 1000)},
                    id=f"{seq}-0",
                    maxlen=5000,
                    approximate=True,
                )
            pipe.hset("rsn:{" + cid + "}:meta", "head", heads[cid])
        for s in subs:
            if s in offline and now > started + 1:
                continue
            for cid in cids:
                target = heads[cid]
                if s in slow:  # applies at half speed: falls behind
                    target = cursors[s][cid] + (1 if tick % 2 else 0)
                    target = min(target, heads[cid])
                for seq in range(cursors[s][cid] + 1, target + 1):
                    applied = now
                    received = applied - rng.lognormvariate(math.log(0.01), 0.5)
                    published = received - rng.lognormvariate(math.log(0.003), 0.5)
                    detected = published - rng.lognormvariate(math.log(0.002), 0.5)
                    sample = LatencySample(
                        cid, s, seq, entries[cid][seq], detected, published, received, applied
                    )
                    pipe.xadd(report.SAMPLES_KEY, sample.fields(), maxlen=report.SAMPLES_MAXLEN)
                    written += 1
                cursors[s][cid] = target
        if now >= next_status:
            next_status = now + 1.0
            for s in subs:
                if s in offline and now > started + 1:
                    continue
                collections = {
                    cid: {
                        "cursor": cursors[s][cid],
                        "cursor_datetime": entries[cid].get(cursors[s][cid]),
                        "state": "catching-up" if s in slow else "live",
                        "transport": "mqtt" if int(s[-2:]) % 2 else "websocket",
                        "applied": cursors[s][cid],
                        "last_gap": {},
                    }
                    for cid in cids
                }
                body = {"v": 1, "subscriber": s, "at": now, "host": "bench", "pid": 0}
                body["collections"] = collections
                pipe.set(report.subscriber_key(s), json.dumps(body), ex=3600)
                pipe.zadd(report.SUBSCRIBERS_KEY, {s: now})
            pub = {
                "v": 1,
                "publisher": "bench-publisher",
                "at": now,
                "healthy": True,
                "collections": {c: {"head": heads[c]} for c in cids},
            }
            pipe.set(report.publisher_key("bench-publisher"), json.dumps(pub), ex=3600)
            pipe.zadd(report.PUBLISHERS_KEY, {"bench-publisher": now})
        if now >= next_event:
            next_event = now + 2.0
            s, cid = rng.choice(subs[OFFLINE:]), rng.choice(cids)
            for kind, detail in (
                ("gap", "sequence jump"),
                ("catch-up", "12 change(s) from the Change List Index in 0.08s"),
            ):
                pipe.xadd(
                    report.EVENTS_KEY,
                    {"c": cid, "s": s, "k": kind, "m": detail, "j": "{}", "a": f"{now:.6f}"},
                    maxlen=report.EVENTS_MAXLEN,
                )
        pipe.execute()
        tick += 1
        time.sleep(max(0.0, started + tick * 0.1 - time.time()))
    print(json.dumps({"samples": written, "heads": heads}), flush=True)


# -- measuring ------------------------------------------------------------------------------


class PushWatcher(threading.Thread):
    """A WebSocket client: when each snapshot arrives, and what it says about itself."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.arrivals: list[float] = []
        self.read_ms: list[float] = []
        self.build_ms: list[float] = []
        self.sizes: list[int] = []
        self.last: dict[str, Any] | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        from websockets.sync.client import connect

        with connect(self.url, max_size=None) as ws:
            while not self.stop.is_set():
                try:
                    text = ws.recv(timeout=0.5)
                except TimeoutError:
                    continue
                self.arrivals.append(time.monotonic())
                snap = json.loads(text)
                meta = snap["dashboard"]
                self.read_ms.append(meta["read_ms"])
                if meta.get("build_ms") is not None:
                    self.build_ms.append(meta["build_ms"])
                self.sizes.append(len(text))
                self.last = snap


def api_timings(base: str, stop_at: float) -> dict[str, list[float]]:
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    paths = ["/api/snapshot", "/api/subscribers", "/api/latency", "/metrics", "/healthz"]
    out: dict[str, list[float]] = {p: [] for p in paths}
    i = 0
    while time.monotonic() < stop_at:
        path = paths[i % len(paths)]
        started = time.perf_counter()
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        out[path].append((time.perf_counter() - started) * 1000)
        assert response.status == 200, (path, response.status)
        i += 1
        time.sleep(0.1)
    conn.close()
    return out


def run_scenario(name: str, rate: float, seconds: float, root: Path) -> dict[str, Any]:
    import psutil
    from playwright.sync_api import sync_playwright

    from tests.devstack import ManagedProcess, Redis, wait_for

    redis = Redis(root / "redis", appendonly=False).start()
    processes: list[ManagedProcess] = []
    try:
        dashboard = ManagedProcess.rsnotify(
            "dashboard", "--redis", redis.url, "--port", "0", "--log-format", "text",
            workdir=root / "logs", name=f"dashboard-{name}",
        ).start()  # fmt: skip
        processes.append(dashboard)
        url = dashboard.wait_for_line(r"serving (http://\S+)", timeout=30).group(1)
        warmup = 6.0
        generator = ManagedProcess(
            [sys.executable, "-m", "bench.dashboard", "--generate", redis.url, str(rate),
             str(seconds + warmup)],
            workdir=root / "logs", name=f"generator-{name}", cwd=Path(__file__).parent.parent,
        ).start()  # fmt: skip
        processes.append(generator)
        generator.wait_for_line(r'"ready"', timeout=30)
        proc = psutil.Process(dashboard.pid)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM,
                args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                      "--disable-background-networking", "--disable-component-update",
                      "--disable-sync"],
            )  # fmt: skip
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(url)
            wait_for(
                lambda: (
                    page.evaluate("() => document.querySelectorAll('#subscribers-body tr').length")
                    == SUBSCRIBERS * COLLECTIONS
                ),
                timeout=30,
                interval=0.2,
                message="the page never showed 500 rows",
            )
            time.sleep(warmup - 3)  # let the windows fill before measuring (measurement, not sync)
            page.evaluate(
                "() => { const s = window.rsnotifyDashboard.stats;"
                " s.renderMs.length = 0; s.intervals.length = 0; }"
            )
            watcher = PushWatcher(url.replace("http://", "ws://") + "ws")
            watcher.start()
            proc.cpu_percent(None)
            psutil.cpu_percent(None)
            cpu: list[float] = []
            rss: list[float] = []
            machine_cpu: list[float] = []  # all cores together, 100 % = one core
            stop_at = time.monotonic() + seconds
            api: dict[str, list[float]] = {}
            sampler_stop = threading.Event()

            def sample_process() -> None:
                while not sampler_stop.wait(1.0):
                    cpu.append(proc.cpu_percent(None))
                    rss.append(proc.memory_info().rss / 1e6)
                    machine_cpu.append(psutil.cpu_percent(None) * (psutil.cpu_count() or 1))

            sampler = threading.Thread(target=sample_process, daemon=True)
            sampler.start()
            api = api_timings(url, stop_at)
            sampler_stop.set()
            sampler.join()
            watcher.stop.set()
            watcher.join(5)
            page_stats = page.evaluate(
                "() => { const s = window.rsnotifyDashboard.stats;"
                " return {renderMs: s.renderMs.slice(), intervals: s.intervals.slice()}; }"
            )
            page.screenshot(path=str(root / f"dashboard-{name}.png"))
            browser.close()
        end = json.loads(generator.wait_for_line(r'(\{"samples".*\})', timeout=60).group(1))
        generated = end["samples"]

        def counted() -> int:
            conn = http.client.HTTPConnection("127.0.0.1", urlsplit(url).port, timeout=10)
            conn.request("GET", "/api/snapshot")
            total = json.loads(conn.getresponse().read())["totals"]["samples_total"]
            conn.close()
            return total

        ingested = wait_for(lambda: (n := counted()) >= generated and n, timeout=15, interval=0.5)
    finally:
        for process in processes:
            process.terminate()
        redis.stop()
    intervals = [b - a for a, b in zip(watcher.arrivals, watcher.arrivals[1:], strict=False)]
    snapshot_ms = [r + b for r, b in zip(watcher.read_ms[1:], watcher.build_ms, strict=False)]
    api_all = [v for path, values in api.items() if path != "/metrics" for v in values]
    rows = len(watcher.last["subscribers"]) if watcher.last else 0
    return {
        "scenario": name,
        "changes_per_s": rate,
        "samples_per_s": rate * SUBSCRIBERS * 1.0,
        "subscriber_rows": rows,
        "collections": COLLECTIONS,
        "seconds": seconds,
        "snapshot_read_ms": {"p50": pct(watcher.read_ms, 0.5), "p99": pct(watcher.read_ms, 0.99)},
        "snapshot_build_ms": {
            "p50": pct(watcher.build_ms, 0.5),
            "p99": pct(watcher.build_ms, 0.99),
        },
        "snapshot_ms": {"p50": pct(snapshot_ms, 0.5), "p99": pct(snapshot_ms, 0.99)},
        "snapshot_kb": statistics.mean(watcher.sizes) / 1000 if watcher.sizes else None,
        "push_interval_s": {"p50": pct(intervals, 0.5), "p99": pct(intervals, 0.99)},
        "page_render_ms": {
            "p50": pct(page_stats["renderMs"], 0.5),
            "p99": pct(page_stats["renderMs"], 0.99),
        },
        "page_interval_s": {
            "p50": (pct(page_stats["intervals"], 0.5) or 0) / 1000,
            "p99": (pct(page_stats["intervals"], 0.99) or 0) / 1000,
            "renders": len(page_stats["renderMs"]),
        },
        "api_ms": {
            path: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "n": len(v)} for path, v in api.items()
        },
        "api_ms_all": {"p50": pct(api_all, 0.5), "p99": pct(api_all, 0.99)},
        "dashboard_cpu_percent": {"mean": statistics.mean(cpu) if cpu else None, "max": max(cpu)},
        "dashboard_rss_mb": {"max": max(rss) if rss else None},
        # Everything on the machine (this bench's generator, Redis and Chromium, and
        # anything else running): a busy machine stretches every figure above.
        "machine_cpu_percent": {"mean": statistics.mean(machine_cpu) if machine_cpu else None},
        "machine_cores": psutil.cpu_count(),
        "loadavg_1m_after": psutil.getloadavg()[0],
        "samples_generated": generated,
        "samples_counted": ingested,
    }


def verdicts(result: dict[str, Any]) -> dict[str, bool]:
    return {
        "snapshot_ms_p99": (result["snapshot_ms"]["p99"] or 1e9) <= TARGETS["snapshot_ms_p99"],
        "push_interval_s_p99": (result["push_interval_s"]["p99"] or 1e9)
        <= TARGETS["push_interval_s_p99"],
        "page_interval_s_p99": (result["page_interval_s"]["p99"] or 1e9)
        <= TARGETS["page_interval_s_p99"],
        "page_render_ms_p99": (result["page_render_ms"]["p99"] or 1e9)
        <= TARGETS["page_render_ms_p99"],
        "api_ms_p99": (result["api_ms_all"]["p99"] or 1e9) <= TARGETS["api_ms_p99"],
        "metrics_ms_p99": (result["api_ms"]["/metrics"]["p99"] or 1e9) <= TARGETS["metrics_ms_p99"],
        "no_sample_lost": result["samples_counted"] >= result["samples_generated"],
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--generate":
        generate(argv[1], float(argv[2]), float(argv[3]))
        return 0
    ap = argparse.ArgumentParser(
        prog="python -m bench.dashboard", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="realistic scenario only, 15 s")
    ap.add_argument("--seconds", type=float, default=30.0, help="measured seconds per scenario")
    opts = ap.parse_args(argv)
    scenarios = [("realistic", 20.0)] if opts.quick else [("realistic", 20.0), ("heavy", 100.0)]
    seconds = 15.0 if opts.quick else opts.seconds
    machine = machine_info()
    results = []
    with tempfile.TemporaryDirectory(prefix="rsnotify-bench-dashboard-") as tmp:
        for name, rate in scenarios:
            print(f"scenario {name}: {rate:g} changes/s, {SUBSCRIBERS} subscribers x "
                  f"{COLLECTIONS} collections, {seconds:g} s ...", flush=True)  # fmt: skip
            result = run_scenario(name, rate, seconds, Path(tmp) / name)
            result["pass"] = verdicts(result)
            results.append(result)
    headers = [
        "scenario", "samples/s", "rows", "snap ms p50", "snap ms p99", "snap KB",
        "push s p99", "render ms p50", "render ms p99", "page s p50", "page s p99",
        "api ms p50", "api ms p99", "metrics ms p99", "cpu %", "rss MB", "lost",
        "machine cpu %", "load 1m",
    ]  # fmt: skip
    table = [
        [
            r["scenario"], r["samples_per_s"], r["subscriber_rows"], r["snapshot_ms"]["p50"],
            r["snapshot_ms"]["p99"], r["snapshot_kb"], r["push_interval_s"]["p99"],
            r["page_render_ms"]["p50"], r["page_render_ms"]["p99"], r["page_interval_s"]["p50"],
            r["page_interval_s"]["p99"], r["api_ms_all"]["p50"], r["api_ms_all"]["p99"],
            r["api_ms"]["/metrics"]["p99"], r["dashboard_cpu_percent"]["mean"],
            r["dashboard_rss_mb"]["max"],
            max(0, r["samples_generated"] - r["samples_counted"]),
            r["machine_cpu_percent"]["mean"], r["loadavg_1m_after"],
        ]
        for r in results
    ]  # fmt: skip
    print()
    print(format_table(headers, table))
    print()
    print(format_table(
        ["scenario", "endpoint", "ms p50", "ms p99", "requests"],
        [[r["scenario"], path, v["p50"], v["p99"], v["n"]]
         for r in results for path, v in r["api_ms"].items()],
    ))  # fmt: skip
    print()
    for r in results:
        for target, ok in r["pass"].items():
            limit = TARGETS.get(target, "")
            print(f"{'PASS' if ok else 'FAIL'}  {r['scenario']}: {target} {limit}")
    path = write_json(
        "dashboard-quick" if opts.quick else "dashboard",
        {
            "bench": "dashboard",
            "targets": TARGETS,
            "results": results,
            "machine": machine,
            "machine_after": machine_info(),
            "source": source_digest(
                "rsnotify/dashboard/state.py",
                "rsnotify/dashboard/latency.py",
                "rsnotify/dashboard/collector.py",
                "rsnotify/dashboard/server.py",
                "rsnotify/dashboard/static/app.js",
            ),
        },
    )
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
