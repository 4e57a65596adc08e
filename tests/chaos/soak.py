"""The soak: ``python -m tests.chaos.soak --minutes 30`` (``make soak``; not in CI).

A Source changing at ``--rate`` (500/s) for ``--minutes``, the publisher
(Redis log, MQTT, WebSocket), one MQTT subscriber mirroring everything, and a
pool of ``--clients`` (200) WebSocket clients in one process
(:mod:`.wspool`).  Every ``--sample`` seconds (60) the resident memory, open
file descriptors and CPU time of every process are recorded.  At the end:

* latency percentiles per minute: WebSocket delivery (change datetime at the
  Source -> arrival at a sampled pool client) and the subscriber's apply
  latency (change datetime -> written to the mirror, from its apply log);
* a least-squares trend of RSS and fds per process over the run after the
  warm-up (:data:`WARM_UP_MIN`); growth beyond the limits below, over the
  measured part of the run, fails the soak;
* per process, RSS and fds at the start, after the warm-up and at the end,
  and the subscriber's lag (:func:`figures`);
* the mirror compared with the frozen Source.

The limits judge growth after the warm-up, never absolute RSS: what a
process needs depends on the host and the Python build, what it keeps
adding is a leak.  The warm-up is what the subscriber's bounded structures
take to fill at the default 500 changes/s (2 collections, 100 creations/s):
the resource-state cache (20,000 URIs) and the path caches (16,384) in
about 3 minutes, the unordered checkpoints' identity stores (2 x 50,000 per
store, 250 entries/s per collection) in about 7; after that a bounded
process is flat, and a leak of even 1 KB per change would add 30 MB a
minute.  A slope of :data:`RSS_GROWTH_LIMIT_MB` over the measured part (or
:data:`RSS_GROWTH_LIMIT_RATIO` of the median RSS, whichever is larger: a
big process's RSS also breathes with the allocator) is growth.  Open
descriptors are judged by their usual count, not a slope or an extreme: the
subscriber's count swings with the fetches in flight (34 most of the time,
up to 175 with fetches in flight, down to 18 during a stall when its
connections close), which a least-squares slope, or the lowest count, reads
as growth when a swing falls near one end of the run.  A leaked descriptor
never closes and raises the usual count, so a median in the second half of
the measured part :data:`FD_GROWTH_LIMIT` above the first half's is growth.
A run shorter than three warm-ups uses a third of its length, and says so:
it can find a leak, not clear one.

Writes ``soak-report.json`` and ``soak.png`` (matplotlib) to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from rsnotify import memtrace
from tests.devstack import ManagedProcess

from .stack import Stack, StackOptions
from .wspool import percentiles

RSS_GROWTH_LIMIT_MB = 20.0  # extrapolated over the run, after warm-up
RSS_GROWTH_LIMIT_RATIO = 0.15  # ... or this fraction of the process's median RSS, if larger
FD_GROWTH_LIMIT = 10
RETAIN = 20_000  # log entries: at 500/s Redis reaches its steady size in 40 s
WARM_UP_MIN = 8.0  # samples before this (or a third of a shorter run) are left out of trends
# Growth that is the test's own design, reported but not failed.
EXPECTED_GROWTH = {
    "simulate": "the simulated Source keeps every Change List it ever published",
}


def processes(stack: Stack, pool: ManagedProcess) -> dict[str, int]:
    found = {
        "redis": stack.redis.pid,
        "mosquitto": stack.broker.pid,
        "wspool": pool.pid,
    }
    for name, process in (("simulate", stack.simulator), ("publish", stack.publisher)):
        assert process is not None
        found[name] = process.pid
    for name, process in stack.subscribers.items():
        found[f"subscribe-{name}"] = process.pid
    return found


def sample(pids: dict[str, int], started: float) -> dict[str, Any]:
    row: dict[str, Any] = {"t_min": round((time.monotonic() - started) / 60, 3)}
    for name, pid in pids.items():
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                cpu = proc.cpu_times()
                row[name] = {
                    "rss_mb": round(proc.memory_info().rss / 2**20, 2),
                    "fds": proc.num_fds(),
                    "cpu_s": round(cpu.user + cpu.system, 2),
                }
        except psutil.Error:
            row[name] = None  # gone: reported as a problem
    return row


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y) points (0 with fewer than two distinct x)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    if var == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / var


def warm_up_min(samples: list[dict[str, Any]]) -> float:
    """Minutes left out of the trends: :data:`WARM_UP_MIN`, or a third of a shorter run."""
    return min(WARM_UP_MIN, samples[-1]["t_min"] / 3) if samples else 0.0


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def trends(samples: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Per process: RSS and fd slopes (per minute) after warm-up, and whether they grow."""
    out: dict[str, Any] = {}
    warm_up = warm_up_min(samples)
    steady = [s for s in samples if s["t_min"] >= warm_up]
    for name in names:
        series = [(s["t_min"], s[name]) for s in steady if s.get(name)]
        if len(series) < 2:
            out[name] = {"growing": None, "why": "fewer than two samples after warm-up"}
            continue
        span = series[-1][0] - series[0][0]
        rss = [(t, v["rss_mb"]) for t, v in series]
        fds = [(t, float(v["fds"])) for t, v in series]
        rss_slope, fd_slope = slope(rss), slope(fds)
        median = sorted(v for _, v in rss)[len(rss) // 2]
        rss_limit = max(RSS_GROWTH_LIMIT_MB, RSS_GROWTH_LIMIT_RATIO * median)
        half = len(fds) // 2
        fd_growth = _median([v for _, v in fds[half:]]) - _median([v for _, v in fds[:half]])
        growing = rss_slope * span > rss_limit or fd_growth > FD_GROWTH_LIMIT
        out[name] = {
            "rss_mb_per_min": round(rss_slope, 3),
            "fds_per_min": round(fd_slope, 3),
            "fd_median_growth": fd_growth,
            "rss_growth_over_run_mb": round(rss_slope * span, 2),
            "rss_limit_mb": round(rss_limit, 1),
            "growing": growing and name not in EXPECTED_GROWTH,
        }
        if growing and name in EXPECTED_GROWTH:
            out[name]["expected"] = EXPECTED_GROWTH[name]
    return out


def figures(samples: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Per process: RSS (MiB) and fds at the start, after the warm-up and at the end; lag."""
    warm_up = warm_up_min(samples)
    after = next((s for s in samples if s["t_min"] >= warm_up), samples[-1])
    out: dict[str, Any] = {"warm_up_min": round(warm_up, 2), "processes": {}}
    for name in names:
        points = {"start": samples[0], "after_warm_up": after, "end": samples[-1]}
        out["processes"][name] = {
            key: {"t_min": s["t_min"], **s[name]} if s.get(name) else None
            for key, s in points.items()
        }
    lags = sorted(s["subscriber_lag_s"] for s in samples if s.get("subscriber_lag_s") is not None)
    out["subscriber_lag_s"] = percentiles(lags)
    return out


def apply_latency_by_minute(stack: Stack, name: str, started_wall: float) -> list[dict[str, Any]]:
    """Per minute of the run: percentiles of (written to the mirror - change datetime), ms."""
    from tests.helpers import read_apply_log

    records = asyncio.run(read_apply_log(stack.mirrors[name], stack.state_dir(name)))
    buckets: dict[int, list[float]] = {}
    for r in records:
        if r.outcome not in ("applied", "deleted") or r.seq is None:
            continue
        applied = r.applied_at.timestamp()
        minute = int((applied - started_wall) // 60)
        if minute >= 0:
            buckets.setdefault(minute, []).append((applied - r.datetime.timestamp()) * 1000)
    return [{"minute": m, **percentiles(sorted(v))} for m, v in sorted(buckets.items())]


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    names = report["processes"]
    fig, axes = plt.subplots(4, 1, figsize=(10, 14), sharex=False)
    for name in names:
        xs = [s["t_min"] for s in samples if s.get(name)]
        axes[0].plot(
            xs, [s[name]["rss_mb"] for s in samples if s.get(name)], marker="o", label=name
        )
        axes[1].plot(xs, [s[name]["fds"] for s in samples if s.get(name)], marker="o", label=name)
    axes[0].set_ylabel("RSS (MiB)")
    axes[1].set_ylabel("open fds")
    for ax in axes[:2]:
        ax.set_xlabel("minutes")
        ax.legend(fontsize="small", ncol=2)
        ax.grid(alpha=0.3)
    pool = [p for p in report["ws_pool"] if p["latency_ms"]["n"]]
    xs = [(p["t"] - report["started"]) / 60 for p in pool]
    for q in ("p50", "p95", "p99"):
        axes[2].plot(xs, [p["latency_ms"][q] for p in pool], marker="o", label=f"WebSocket {q}")
    apply = report["apply_latency_ms"]
    for q in ("p50", "p99"):
        axes[2].plot(
            [a["minute"] + 1 for a in apply],
            [a[q] for a in apply],
            linestyle="--",
            marker="x",
            label=f"subscriber apply {q}",
        )
    axes[2].set_yscale("log")
    axes[2].set_ylabel("latency (ms, from the change at the Source)")
    axes[2].set_xlabel("minutes")
    axes[2].legend(fontsize="small")
    axes[2].grid(alpha=0.3)
    lagged = [s for s in samples if s.get("subscriber_lag_s") is not None]
    axes[3].plot([s["t_min"] for s in lagged], [s["subscriber_lag_s"] for s in lagged], marker="o")
    axes[3].set_ylabel("subscriber lag (s)")
    axes[3].set_xlabel("minutes")
    axes[3].grid(alpha=0.3)
    fig.suptitle(
        f"rsnotify soak: {report['rate']}/s, {report['clients']} WebSocket clients, "
        f"{report['minutes']} min"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.memtrace:  # inherited by the subscriber (only it reads these)
        os.environ[memtrace.ENV_PATH] = str(out.resolve() / "memtrace-{pid}.txt")
        os.environ[memtrace.ENV_INTERVAL] = str(args.sample)
        os.environ.setdefault(memtrace.ENV_FRAMES, "0")  # tracing would slow it down
    options = StackOptions(
        collections=2,
        resources=500,
        payload_bytes=512,
        rate=args.rate,
        changelist_size=2000,
        subscribers=("mqtt",),
        publisher_args=["--retain", str(RETAIN)],
        # The report reads every apply-log row (latency per minute, nothing applied
        # out of order): an hour at 500/s is past the default bound of a million.
        subscriber_args=["--apply-log-rows", "0"],
    )
    with tempfile.TemporaryDirectory(prefix="rsnotify-soak-") as tmp:
        workdir = args.workdir or Path(tmp)
        with Stack(workdir, options) as stack:
            stack.start()
            started, started_wall = time.monotonic(), time.time()
            pool_out = workdir / "wspool.jsonl"
            pool = ManagedProcess(
                [
                    sys.executable, "-m", "tests.chaos.wspool",
                    "--url", f"ws://127.0.0.1:{stack.ws_port}/",
                    *[a for c in stack.collection_ids() for a in ("--collection", c)],
                    "--clients", str(args.clients),
                    "--interval", str(args.sample),
                    "--out", str(pool_out),
                ],
                workdir=workdir / "logs",
                name="wspool",
                cwd=Path(__file__).resolve().parents[2],
            ).start()  # fmt: skip
            try:
                pool.wait_for_line(r"wspool: \d+ clients", timeout=30)
                pids = processes(stack, pool)
                samples = [sample(pids, started)]
                samples[-1]["subscriber_lag_s"] = stack.lag_s("mqtt")
                end = started + args.minutes * 60
                while time.monotonic() < end:
                    # The soak itself: the stack runs; we look once per sample period.
                    time.sleep(min(args.sample, max(0.0, end - time.monotonic())))
                    samples.append(sample(pids, started))
                    samples[-1]["subscriber_lag_s"] = stack.lag_s("mqtt")
                    print(json.dumps(samples[-1]), flush=True)
                pool.terminate()
                stats = stack.stats()
                elapsed = time.monotonic() - started
                state = stack.freeze()
                lag_at_freeze = stack.lag_s("mqtt")
                converge_started = time.monotonic()
                differences = stack.converge(state, 600)
                report = {
                    "minutes": args.minutes,
                    "rate": args.rate,
                    "rate_achieved": round(stats["changes"] / elapsed, 1),
                    "subscriber_lag_at_freeze_s": lag_at_freeze,
                    "converge_s": round(time.monotonic() - converge_started, 1),
                    "clients": args.clients,
                    "started": started_wall,
                    "processes": list(pids),
                    "samples": samples,
                    "trend": trends(samples, list(pids)),
                    "figures": figures(samples, list(pids)),
                    "ws_pool": [json.loads(line) for line in pool_out.read_text().splitlines()],
                    "apply_latency_ms": apply_latency_by_minute(stack, "mqtt", started_wall),
                    "published": stack.published(),
                    "source_changes": stats["changes"],
                    "mirror_equal": not any(differences.values()),
                    "mirror_differences": {k: v[:10] for k, v in differences.items()},
                    "dead": stack.dead(),
                }
            finally:
                pool.terminate()
    (out / "soak-report.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out / "soak.png")
    growing = [n for n, t in report["trend"].items() if t.get("growing")]
    print(json.dumps({k: report[k] for k in ("rate_achieved", "published", "mirror_equal")}))
    print(json.dumps(report["trend"], indent=1))
    print(f"written {out / 'soak-report.json'} and {out / 'soak.png'}")
    ok = report["mirror_equal"] and not growing and not report["dead"]
    if not ok:
        print(f"SOAK FAILED: growing={growing} dead={report['dead']}", file=sys.stderr)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, default=Path("soak"))
    parser.add_argument("--workdir", type=Path, help="keep logs here (default: a temp dir)")
    parser.add_argument(
        "--memtrace",
        action="store_true",
        help="the subscriber appends what grew (rsnotify.memtrace) to OUT/memtrace-PID.txt "
        "every sample period",
    )
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
