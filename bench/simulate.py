"""How many changes per second ``rsnotify simulate`` sustains while being polled.

The simulator runs as the real CLI in its own process (one core); 20 clients in
this process (the other core) poll its open Change List with conditional GETs
(``If-None-Match`` with the last ETag), each on its own keep-alive connection,
exactly as a publisher would.  When the list they poll closes (its ``rs:md``
gains ``until``) a client re-reads the Change List Index to find the new open
list.  Over a measured window (after a warm-up) the bench records:

* changes/s achieved, from ``/_simulator/stats`` at both ends of the window,
  against the ``--rate`` asked for;
* the clients' request rate, how many polls got 200 and 304, and p50 / p99
  poll latency;
* the simulator's CPU use (psutil, user+system over the window).

Scenarios: polling every 100 ms (a realistic publisher) and polling flat out
(the worst case: every poll is answered as soon as the previous one returns),
at 1,000 changes/s (the issue's target) and at 5,000/s for headroom.

Run ``.venv/bin/python -m bench.simulate`` (``--quick`` for a smoke run).  It
prints a table, PASS/FAIL against the target, and writes
``bench/results/simulate.json``; it exits 0 either way.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp
import psutil

from bench._common import format_table, machine_info, source_digest, write_json
from rsnotify import sitemap

NAME = "simulate"
TARGET_RATE = 1000.0  # changes/s with 20 clients polling (issue 3)
PACE = 0.99  # fraction of the asked rate a scenario must deliver
SERVING = re.compile(rb"rsnotify simulate: serving (\S+)")
_HEAD_BYTES = 1024  # the document-level rs:md is in the first few hundred bytes


@dataclass(slots=True)
class Scenario:
    rate: float
    clients: int
    interval: float  # seconds between one client's polls; 0 = back to back


@dataclass(slots=True)
class Result:
    rate_target: float
    clients: int
    poll_interval_s: float
    changes_per_s: float
    requests_per_s: float
    polls_200: int
    polls_304: int
    errors: int
    p50_ms: float
    p99_ms: float
    server_cpu_pct: float
    seconds: float
    changes: int
    dropped_backlog: int


async def _open_list(session: aiohttp.ClientSession, index_url: str) -> str:
    async with session.get(index_url) as response:
        index = sitemap.parse(await response.read())
    return next(e.loc for e in index.entries if e.until is None)


async def _poller(
    session: aiohttp.ClientSession,
    index_url: str,
    interval: float,
    stop: asyncio.Event,
    record: asyncio.Event,
    latencies: list[float],
    statuses: Counter[int],
) -> None:
    url = await _open_list(session, index_url)
    etag: str | None = None
    while not stop.is_set():
        headers = {"If-None-Match": etag} if etag else {}
        started = time.perf_counter()
        try:
            async with session.get(url, headers=headers) as response:
                data = await response.read()
                status = response.status
                if status == 200:
                    etag = response.headers.get("ETag")
        except aiohttp.ClientError:
            status = 0
            data = b""
        elapsed = time.perf_counter() - started
        if record.is_set():
            latencies.append(elapsed)
            statuses[status] += 1
        if status == 200 and b' until="' in data[:_HEAD_BYTES]:
            url = await _open_list(session, index_url)  # the list closed: find the new one
            etag = None
        if interval:
            await asyncio.sleep(interval)


async def _stats(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with session.get(f"{base}_simulator/stats") as response:
        data: dict[str, Any] = await response.json()
        return data


async def run_scenario(scenario: Scenario, warmup: float, duration: float) -> Result:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rsnotify.cli",
        "simulate",
        "--port",
        "0",
        "--rate",
        str(scenario.rate),
        "--resources",
        "1000",
        "--changelist-size",
        "1000",
        "--seed",
        "1",
        "--quiet",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        match = SERVING.search(line)
        if match is None:
            raise RuntimeError(f"simulator did not start: {line!r}")
        base = match.group(1).decode()
        server = psutil.Process(proc.pid)
        index_url = f"{base}c1/changelist.xml"
        stop, record = asyncio.Event(), asyncio.Event()
        latencies: list[float] = []
        statuses: Counter[int] = Counter()
        sessions = [
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
            for _ in range(scenario.clients)
        ]
        async with aiohttp.ClientSession() as control:
            tasks = [
                asyncio.create_task(
                    _poller(s, index_url, scenario.interval, stop, record, latencies, statuses)
                )
                for s in sessions
            ]
            await asyncio.sleep(warmup)
            before = await _stats(control, base)
            cpu_before = server.cpu_times()
            started = time.perf_counter()
            record.set()
            await asyncio.sleep(duration)
            record.clear()
            seconds = time.perf_counter() - started
            cpu_after = server.cpu_times()
            after = await _stats(control, base)
            stop.set()
            await asyncio.gather(*tasks)
        for s in sessions:
            await s.close()
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
    cpu = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    ordered = sorted(latencies) or [0.0]
    changes = after["changes"] - before["changes"]
    return Result(
        rate_target=scenario.rate,
        clients=scenario.clients,
        poll_interval_s=scenario.interval,
        changes_per_s=changes / seconds,
        requests_per_s=len(latencies) / seconds,
        polls_200=statuses[200],
        polls_304=statuses[304],
        errors=sum(n for code, n in statuses.items() if code not in (200, 304)),
        p50_ms=statistics.median(ordered) * 1000,
        p99_ms=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        server_cpu_pct=100 * cpu / seconds,
        seconds=seconds,
        changes=changes,
        dropped_backlog=after["dropped_backlog"],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simulate", description=__doc__)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--rates", default="1000,5000", help="comma-separated changes/s")
    parser.add_argument(
        "--intervals", default="0.1,0", help="comma-separated poll intervals (0: flat out)"
    )
    parser.add_argument("--quick", action="store_true", help="one short scenario")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    intervals = [float(i) for i in args.intervals.split(",")]
    if args.quick:
        rates, intervals, args.duration, args.warmup = [TARGET_RATE], [0.0], 3.0, 1.0
    scenarios = [Scenario(r, args.clients, i) for r in rates for i in intervals]
    results = []
    for scenario in scenarios:
        result = asyncio.run(run_scenario(scenario, args.warmup, args.duration))
        results.append(result)
        print(
            f"rate {scenario.rate:g}/s, interval {scenario.interval:g}s: "
            f"{result.changes_per_s:,.0f} changes/s",
            file=sys.stderr,
        )
    headers = [
        "target/s", "clients", "interval s", "changes/s", "req/s", "200", "304",
        "err", "p50 ms", "p99 ms", "server CPU %",
    ]  # fmt: skip
    rows = [
        [
            r.rate_target,
            r.clients,
            r.poll_interval_s,
            r.changes_per_s,
            r.requests_per_s,
            r.polls_200,
            r.polls_304,
            r.errors,
            r.p50_ms,
            r.p99_ms,
            r.server_cpu_pct,
        ]
        for r in results
    ]
    print(format_table(headers, rows))
    # A scenario "keeps pace" when it delivers its rate to within 1%: the count
    # is read at both ends of the window, so one generator tick of batch (10 ms
    # of changes) can fall either side of it.
    kept = [r.changes_per_s >= PACE * r.rate_target and r.errors == 0 for r in results]
    capacity = max(
        (r.changes_per_s for r in results if r.clients >= 20 and r.poll_interval_s == 0),
        default=0.0,
    )
    passed = all(kept) and capacity >= TARGET_RATE
    print(
        f"{'PASS' if passed else 'FAIL'}: every scenario kept pace ({sum(kept)}/{len(kept)}); "
        f"best rate with >= 20 clients polling flat out {capacity:,.0f} changes/s "
        f"(target >= {TARGET_RATE:,.0f})"
    )
    path = write_json(
        NAME,
        {
            "target": {"changes_per_s": TARGET_RATE, "clients": args.clients, "pace": PACE},
            "passed": passed,
            "results": [asdict(r) for r in results],
            "machine": machine_info(),
            "source": source_digest(
                "rsnotify/simulator/source.py",
                "rsnotify/simulator/site.py",
                "rsnotify/simulator/server.py",
                "rsnotify/sitemap.py",
            ),
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
