"""Change -> MQTT over HTTP: a Source on stock web servers, beside ``--watch`` (issue 17 item 8).

Most Sources are files behind a plain web server.  This bench runs the same
scenario as ``bench.publish``'s latency part (a driver writes the Source
directory at ``--rate`` changes/s, one atomic write every ``--flush-interval``,
stamping each write; one MQTT subscriber receives) three ways, in one run:

* ``watch``       -- ``rsnotify publish DIR --watch``: inotify, the baseline;
* ``http.server`` -- ``python -m http.server`` serving DIR, ``rsnotify publish
  URL --poll P``: no ETag, ``Last-Modified`` in whole seconds, no ranges, so
  every poll within a second of a write is a full, unconditional read
  (RFC 9110 section 8.8.2.2: such a date is weak and never sent back);
* ``nginx``       -- nginx with its defaults serving DIR: a strong ETag, so
  polls are conditional and the growing list is read by ranged tail reads.

Figures are *write -> MQTT received* (the stamp just before the Change List's
rename to the subscriber's receipt) per notification after the warm-up, and
the notifications never received.  Over HTTP the poll interval bounds the
detection delay from below (p50 ~ P/2); what this bench watches is that
nothing is missed and that the tail stays near the poll interval.  It prints a
table, writes ``bench/results/http_detect.json`` and exits 0 either way.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from bench._common import format_table, machine_info, source_digest, write_json
from bench.publish import (
    add_filesystem_options,
    bench_stack,
    parse_filesystem_options,
    run_latency,
    source_places,
)

NAME = "http_detect"
MODES = ("watch", "http.server", "nginx")


def _row(run: Any) -> dict[str, Any]:
    stats = run.stats("write_recv")
    detected = run.stats("write_detected")
    return {
        "mode": run.mode,
        "fs": run.fs,
        "run": run.run,
        "open_list": run.prefill,
        "changes": run.changes,
        "rate": run.rate,
        "notifications": run.notifications,
        "missing": run.missing,
        "write_recv": stats,
        "write_detected": detected,
        "publisher_cpu_pct": run.cpu.get("publisher"),
    }


async def _run(opts: argparse.Namespace) -> list[Any]:
    runs = []
    async with bench_stack(opts) as stack:
        with source_places(opts, stack.workdir) as places:
            for run in range(1, opts.repeat + 1):
                for mode in opts.modes:
                    for parent, fs_name in places:
                        result = await run_latency(
                            stack, opts, opts.prefill, run, None,
                            mode=mode, source_parent=parent, fs_name=fs_name,
                        )  # fmt: skip
                        runs.append(result)
                        st = result.stats("write_recv")
                        print(
                            f"  {mode:<11} {result.fs} run {run}: "
                            f"{result.notifications:,} notifications, {result.missing} missing, "
                            f"write->MQTT p50 {st['p50_ms'] or 0:.1f} ms "
                            f"p99 {st['p99_ms'] or 0:.1f} ms",
                            flush=True,
                        )
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.http_detect", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="short windows: a smoke run")
    ap.add_argument("--rate", type=float, default=200.0, help="changes/s (200)")
    ap.add_argument("--poll", type=float, default=0.1, help="publisher --poll over HTTP (0.1)")
    ap.add_argument("--prefill", type=int, default=1000, help="open Change List entries (1000)")
    ap.add_argument("--duration", type=float, default=None, help="measured seconds (15)")
    ap.add_argument("--warmup", type=float, default=None, help="discarded seconds (2)")
    ap.add_argument("--flush-interval", type=float, default=0.1, help="Source write interval")
    ap.add_argument("--repeat", type=int, default=1, help="runs per mode (1)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated: " + ",".join(MODES))
    ap.add_argument("--workdir", type=Path, default=None, help="parent of the work directory")
    add_filesystem_options(ap)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    opts = ap.parse_args(argv)
    parse_filesystem_options(ap, opts)
    opts.duration = opts.duration or (4.0 if opts.quick else 15.0)
    opts.warmup = opts.warmup if opts.warmup is not None else (1.0 if opts.quick else 2.0)
    opts.modes = [m.strip() for m in opts.modes.split(",") if m.strip()]
    unknown = set(opts.modes) - set(MODES)
    if unknown:
        ap.error(f"unknown mode(s): {', '.join(sorted(unknown))}")
    machine = machine_info()
    started = time.perf_counter()
    runs = asyncio.run(_run(opts))
    rows = [_row(r) for r in runs]
    print(
        f"\nChange List written -> MQTT received at {opts.rate:g} changes/s, open list "
        f"{opts.prefill:,} entries, HTTP polled every {opts.poll:g} s (ms)"
    )
    headers = [
        "mode",
        "Source fs",
        "run",
        "got/s",
        "notif.",
        "miss",
        "p50",
        "p90",
        "p99",
        "max",
        "pub CPU %",
    ]
    table = [
        [
            r["mode"], r["fs"], r["run"], r["rate"], r["notifications"], r["missing"],
            r["write_recv"]["p50_ms"], r["write_recv"]["p90_ms"], r["write_recv"]["p99_ms"],
            r["write_recv"]["max_ms"], r["publisher_cpu_pct"],
        ]
        for r in rows
    ]  # fmt: skip
    print(format_table(headers, table))
    missing = sum(r["missing"] for r in rows)
    print(f"\n{'PASS' if missing == 0 else 'FAIL'}  every change published: {missing} missing")
    payload = {
        "bench": NAME,
        "settings": {
            "rate": opts.rate,
            "poll_s": opts.poll,
            "prefill": opts.prefill,
            "duration_s": opts.duration,
            "warmup_s": opts.warmup,
            "flush_interval_s": opts.flush_interval,
            "modes": opts.modes,
            "source_filesystems": opts.filesystems,
        },
        "loop_skipped": opts.loop_skipped,
        "runs": rows,
        "missing": missing,
        "machine": machine,
        "wall_s": time.perf_counter() - started,
        "source": source_digest(
            "bench/http_detect.py",
            "bench/publish.py",
            "rsnotify/fetch.py",
            "rsnotify/validators.py",
            "rsnotify/httppolicy.py",
            "rsnotify/changes/access.py",
            "rsnotify/changes/watcher.py",
        ),
    }
    path = write_json(f"{NAME}-quick" if opts.quick else NAME, payload)
    print(f"wrote {path} ({payload['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
