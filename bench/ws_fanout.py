"""WebSocket fan-out: 2,000 subscribers on one gateway, and the gateway's frames/s ceiling.

Why one module of ~540 lines: it is one experiment -- the gateway's own process, the
appender, both phases for each variant and the verdicts -- read as its method, top to
bottom; the clients live in ``bench/wsclients.py`` and ``bench/wsclients.c``, what the
benches share in ``bench/_common.py``.

Issue 21 item 4.  A private Redis holds the notification log; one gateway
process (:class:`rsnotify.transport.ws.WebSocketGateway`, ``--ws-only``'s
gateway, alone in its process so its RSS and CPU are its own) serves it;
``--processes`` client processes hold ``--clients`` WebSocket subscriptions
between them; this process appends to the log.  For each gateway *variant*
-- ``current`` (this tree: each frame encoded once and written to every
unfiltered client in one pass, :mod:`rsnotify.transport.wsfeed`) and
``baseline`` (the package as of ``--baseline-rev``, extracted with ``git
archive``: one writer task and one frame per client) -- in one run:

(a) **live**: ``--rate`` notifications/s for ``--seconds``; every client
    times every notification (arrival minus the send time the appender wrote
    into its ``loc``), checks ``prev`` continuity and counts ``skipped``; the
    gateway's RSS is sampled every second.
(b) **ceiling** (run first, after a 3 s warm-up at ``--rate``, so that both
    start with every client caught up): ``--burst`` notifications appended
    as fast as the log takes them (batches of 500); frames/s = notification
    frames received by all clients / time until the last client has the
    last one; also per second of gateway CPU (the gateway's own ceiling on
    one core, whatever the clients and other work on a shared machine take).

The clients are plain sockets in one ``epoll`` loop per process that read
``seq``, ``prev`` and the send time from fixed places in each frame:
``bench/wsclients.c``, compiled at run time (:mod:`bench.wsclients_c`), or,
without a C compiler or with ``--client-impl python``, the same client in
Python (:mod:`bench.wsclients`), which at 200,000 frames/s takes most of a
core beside the gateway it measures.  Which one ran is in the table and the
JSON (``client_impl``).  Latency is measured to the frame's *arrival*: the
kernel's receive timestamp of the read (``SO_TIMESTAMPNS``), so the time a client
process waits for a CPU before reading -- a cost of this machine hosting the
clients, not of the gateway -- is not counted; the time to the read is
reported beside it (*read p99*).  One client per process also splits its
latency at the gateway's ``published`` stamp: *log* (append, Redis, the
gateway's wake-up and render) and *fan-out* (the gateway's writes and the
kernel).  On a shared 2-core machine both halves include the gateway's wait
for a CPU: the table gives the CPUs others kept busy just before the run,
the load average and the CPU pressure (PSI: the share of the live phase in
which something runnable had no CPU) beside them.

Targets (PASS/FAIL): delivery p99 <= 50 ms in (a) with every notification
delivered, gateway RSS bounded (peak within 20 % of the RSS after the
warm-up), and the current ceiling >= 2x the baseline's (frames per gateway
CPU-second, also shown per wall second).

Run ``.venv/bin/python -m bench.ws_fanout`` (about 5 minutes on 2 cores;
``--quick``: 400 clients, 10 s, one minute).  Writes
``bench/results/ws_fanout.json``; exits 0 either way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import wsclients_c
from bench._common import REPO_ROOT, format_table, machine_info, source_digest, write_json
from bench.wsclients import percentiles

TARGETS = {"p99_ms_max": 50.0, "rss_growth_max": 0.20, "ceiling_ratio_min": 2.0}
#: The last commit whose gateway fed every client from its own writer task.
BASELINE_REV = "86cbcf0"
CAP = "http://bench.invalid/fanout/capabilitylist.xml"
#: Niceness added to the client processes (--client-nice).  0: they compete with
#: the gateway for the two CPUs as equals; their arrival stamps come from the
#: kernel either way, so their own wait for a CPU is not counted as latency.
CLIENT_NICE = 0
#: How often the clients look at their sockets (see bench/wsclients.py).
CLIENT_POLL_MS = 0.0


# --- the gateway process -----------------------------------------------------------------


class _GcPauses:
    """The cyclic collector's runs in the gateway process: when, which generation, how long.

    Both in wall time and in the thread's CPU time: on a shared machine a
    collection can be preempted, and only the CPU time is the collector's.
    """

    def __init__(self) -> None:
        self.started = self.started_cpu = 0.0
        self.runs: list[tuple[float, int, float, float]] = []  # (end, generation, ms, CPU ms)

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started, self.started_cpu = time.perf_counter(), time.thread_time()
            return
        pause = (time.perf_counter() - self.started) * 1e3
        cpu = (time.thread_time() - self.started_cpu) * 1e3
        self.runs.append((time.time(), info["generation"], pause, cpu))


def _gc_during(runs: list[list[float]], start: float, end: float) -> dict[str, Any]:
    """The gateway's collections between two wall times: count and longest, per generation."""
    out: dict[str, Any] = {"runs": [0, 0, 0], "longest_ms": [0.0] * 3, "longest_cpu_ms": [0.0] * 3}
    for at, generation, pause, cpu in runs:
        if start <= at <= end:
            g = int(generation)
            out["runs"][g] += 1
            out["longest_ms"][g] = max(out["longest_ms"][g], pause)
            out["longest_cpu_ms"][g] = max(out["longest_cpu_ms"][g], cpu)
    return out


async def _gateway_main(redis_url: str) -> None:
    import gc

    import rsnotify.runtime
    import rsnotify.transport.ws as ws_module
    from rsnotify.log.redis_log import RedisLog

    # As `rsnotify publish --ws-only` runs it: rsnotify.cli tunes the collector first.
    rsnotify.runtime.tune_gc()
    pauses = _GcPauses()
    gc.callbacks.append(pauses)
    log = RedisLog(redis_url)
    gateway = ws_module.WebSocketGateway(log, max_per_address=0, max_clients=20_000)
    await gateway.start()
    print(json.dumps({"port": gateway.port, "module": ws_module.__file__}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    stats = {"shared_frames": getattr(gateway, "shared_frames", None), "replayed": gateway.replayed,
             "gc": pauses.runs}  # fmt: skip
    await gateway.stop()
    await log.close()
    print(json.dumps(stats), flush=True)


def gateway_main() -> None:
    """``python -c`` entry: ``sys.path`` is set by the caller to pick the variant's rsnotify."""
    asyncio.run(_gateway_main(sys.argv[1]))


# --- the run --------------------------------------------------------------------------------


class _Process:
    """A child speaking one JSON line per command on stdin/stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def ask(self, command: str, timeout: float = 120.0) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command.encode() + b"\n")
        await self.proc.stdin.drain()
        async with asyncio.timeout(timeout):
            line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"child {self.proc.pid} ended on {command!r}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    async def end(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()


def _envelope(collection: str, seq: int) -> bytes:
    from rsnotify import envelope
    from rsnotify.model import ChangeType

    now = datetime.now(UTC)
    return envelope.to_json(
        envelope.Notification(
            collection=collection, seq=seq, capabilitylist=CAP,
            changelist=CAP.replace("capabilitylist", "changelist"),
            loc=f"http://bench.invalid/fanout/res/{seq}.xml?t={time.time_ns()}",
            change=ChangeType.UPDATED, datetime=now, hash=f"md5:{seq:032x}", length=1024,
            type="application/xml", detected=now,
        )
    )  # fmt: skip


async def _append(log: Any, collection: str, count: int) -> None:
    head = await log.head(collection)
    payloads = [_envelope(collection, head + i) for i in range(1, count + 1)]
    await log.append(collection, payloads, expected_head=head, checkpoint=f"cp{head + count}")


async def _paced(log: Any, collection: str, rate: float, seconds: float) -> int:
    """Append at ``rate``/s for ``seconds`` (late ticks append together); returns the count."""
    loop = asyncio.get_running_loop()
    start, sent, total = loop.time(), 0, int(rate * seconds)
    while sent < total:
        due = min(total, int((loop.time() - start) * rate) + 1)
        if due > sent:
            await _append(log, collection, due - sent)
            sent = due
        await asyncio.sleep(max(0.0, start + sent / rate - loop.time()))
    return sent


def _merge(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """One process's counts summed, latency histograms merged into percentiles."""
    counts = ("connected", "notifications", "skipped", "breaks", "closed", "unstamped", "done")
    out: dict[str, Any] = {k: sum(s[k] for s in stats) for k in counts}
    out["done_at"] = max((s["done_at"] for s in stats if s["done_at"]), default=None)
    for name, key in (("latency_ms", "histogram"), ("read_ms", "read_histogram"),
                      ("to_gateway_ms", "to_gateway"), ("fan_out_ms", "fan_out")):  # fmt: skip
        merged: dict[int, int] = {}
        for s in stats:
            for bucket, n in s[key].items():
                merged[int(bucket)] = merged.get(int(bucket), 0) + n
        out[name] = percentiles(merged)
    return out


async def run_variant(variant: str, tree: Path, redis_url: str, opts: argparse.Namespace,
                      collection: str) -> dict[str, Any]:  # fmt: skip
    import psutil

    from rsnotify.log.redis_log import RedisLog

    code = "import sys; sys.path[:0] = [sys.argv[2], sys.argv[3]]; "
    code += "from bench.ws_fanout import gateway_main; gateway_main()"
    gateway = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, redis_url, str(tree), str(REPO_ROOT), cwd=tree,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    children: list[_Process] = []
    log = RedisLog(redis_url)
    try:
        assert gateway.stdout is not None and gateway.stdin is not None
        ready = json.loads(await asyncio.wait_for(gateway.stdout.readline(), 60))
        if not ready["module"].startswith(str(tree)):
            raise RuntimeError(f"{variant}: imported {ready['module']}, not from {tree}")
        per = opts.clients // opts.processes
        for _ in range(opts.processes):
            proc = await asyncio.create_subprocess_exec(
                *opts.client_command, str(ready["port"]),
                collection, str(per), "--nice", str(opts.client_nice),
                "--poll-ms", str(opts.client_poll_ms),
                *(["--cpus", opts.client_cpus] if opts.client_cpus else []),
                cwd=REPO_ROOT, limit=2**24,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            children.append(_Process(proc))
        opened = await asyncio.gather(*(c.ask("open", 300) for c in children))
        connected = sum(o["opened"] for o in opened)
        print(f"  {variant}: {connected:,} clients connected", flush=True)
        gw = psutil.Process(gateway.pid)

        # Warm up (allocator pools, the ring), then (b) the ceiling: a burst as
        # fast as the log takes it.
        await _paced(log, collection, opts.rate, 3.0)
        await _until_done(children, await log.head(collection), connected, 60.0)
        target = await log.head(collection) + opts.burst
        await _reset(children, target - opts.burst + 1)
        cpu_start, started = sum(gw.cpu_times()[:2]), time.time()
        for done in range(0, opts.burst, 500):
            await _append(log, collection, min(500, opts.burst - done))
        burst = await _until_done(children, target, connected, opts.burst_timeout)
        cpu_burst = sum(gw.cpu_times()[:2]) - cpu_start
        wall = (burst["done_at"] or time.time()) - started
        burst.update(notifications_appended=opts.burst, seconds=wall, gateway_cpu_s=cpu_burst,
                     frames_per_s=burst["notifications"] / wall,
                     # CPU time is counted in 10 ms ticks: too few of them say nothing.
                     frames_per_cpu_s=burst["notifications"] / cpu_burst
                     if cpu_burst >= 0.1 else None,
                     rss_mb_after=gw.memory_info().rss / 1e6)  # fmt: skip
        print(f"  {variant}: ceiling {burst['frames_per_s']:,.0f} frames/s", flush=True)
        # (a) live, after the ceiling: both start with every client caught up.
        await _reset(children, await log.head(collection) + 1)
        rss_start = gw.memory_info().rss / 1e6
        cpu_start, rss = sum(gw.cpu_times()[:2]), [rss_start]
        sys_start = gw.cpu_times().system
        clients = [psutil.Process(c.proc.pid) for c in children]
        clients_start = sum(sum(p.cpu_times()[:2]) for p in clients)
        # Each time a client process sleeps, a gateway send wakes it (on loopback in
        # the gateway's own system time): how often is part of what the harness costs.
        sleeps_start = sum(p.num_ctx_switches().voluntary for p in clients)
        sampler = asyncio.create_task(_sample_rss(gw, rss))
        stalled, load_before = _cpu_stalled(), os.getloadavg()[0]
        live_from = time.time()
        sent = await _paced(log, collection, opts.rate, opts.seconds)
        live_to = time.time()
        cpu_live = sum(gw.cpu_times()[:2]) - cpu_start
        sys_live = gw.cpu_times().system - sys_start
        stalled = _cpu_stalled() - stalled
        cpu_clients = sum(sum(p.cpu_times()[:2]) for p in clients) - clients_start
        sleeps = sum(p.num_ctx_switches().voluntary for p in clients) - sleeps_start
        live = await _until_done(children, await log.head(collection), connected, 30.0)
        sampler.cancel()
        live.update(sent=sent, expected=sent * connected, rss_mb_start=rss_start,
                    rss_mb_peak=max(rss), rss_mb_end=rss[-1],
                    gateway_cpu_pct=100 * cpu_live / opts.seconds,
                    gateway_sys_pct=100 * sys_live / opts.seconds,
                    loadavg_1m_before=load_before, loadavg_1m_after=os.getloadavg()[0],
                    cpu_pressure_pct=100 * stalled / opts.seconds if stalled >= 0 else None,
                    clients_cpu_pct=100 * cpu_clients / opts.seconds,
                    clients_wakeups_per_s=sleeps / opts.seconds)  # fmt: skip
        print(f"  {variant}: live p99 {live['latency_ms']['p99']} ms", flush=True)

        gateway.stdin.write(b"quit\n")
        await gateway.stdin.drain()
        stats = json.loads(await asyncio.wait_for(gateway.stdout.readline(), 60))
        live["gateway_gc"] = _gc_during(stats.pop("gc"), live_from, live_to)
        return {"variant": variant, "module": ready["module"], "clients": connected,
                "client_impl": opts.client_ran,
                "open_s": max(o["seconds"] for o in opened), "live": live, "burst": burst,
                "gateway": stats, "loadavg_after": list(os.getloadavg())}  # fmt: skip
    finally:
        await log.close()
        for child in children:
            await child.end()
        if gateway.returncode is None:
            gateway.terminate()
            await gateway.wait()


async def _reset(children: list[_Process], first: int) -> None:
    await asyncio.gather(*(c.ask(f"reset {first}") for c in children))


async def _until_done(
    children: list[_Process], target: int, clients: int, timeout: float
) -> dict[str, Any]:
    """Merged stats once every client has seq ``target`` (or skipped past it), or at timeout."""
    await asyncio.gather(*(c.ask(f"target {target}") for c in children))
    deadline = time.monotonic() + timeout
    while True:
        stats = _merge(await asyncio.gather(*(c.ask("stats") for c in children)))
        if stats["done"] >= clients or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.1)


async def _busy_cores(seconds: float) -> float:
    """CPUs kept busy by everything on the machine over ``seconds`` (/proc/stat), -1: unknown.

    Measured before any of the bench's processes work: what others sharing
    the machine take from the two cores the gateway and its clients need.
    """

    def busy_and_total() -> tuple[int, int]:
        with open("/proc/stat") as handle:
            ticks = [int(x) for x in handle.readline().split()[1:]]
        return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # less idle and iowait

    try:
        busy0, total0 = busy_and_total()
        await asyncio.sleep(seconds)
        busy1, total1 = busy_and_total()
    except OSError:
        return -1.0
    return (os.cpu_count() or 1) * (busy1 - busy0) / max(1, total1 - total0)


def _cpu_stalled() -> float:
    """Seconds some runnable task waited for a CPU since boot (PSI, /proc/pressure/cpu); -1: none.

    Over a phase, the share of wall time in which something on the machine --
    the bench's processes or anyone else's -- was ready to run and had no
    CPU: how contended the shared machine was while the figures were taken.
    """
    try:
        with open("/proc/pressure/cpu") as handle:
            some = handle.readline().split()
    except OSError:
        return -1e9
    return int(some[-1].split("=")[1]) / 1e6


async def _sample_rss(process: Any, into: list[float]) -> None:
    while True:
        await asyncio.sleep(1.0)
        into.append(process.memory_info().rss / 1e6)


def _baseline_tree(rev: str, into: Path) -> Path:
    """The rsnotify package as of ``rev``, extracted beside nothing else."""
    archive = subprocess.run(["git", "archive", rev, "rsnotify"], cwd=REPO_ROOT,
                             capture_output=True, check=True).stdout  # fmt: skip
    into.mkdir(parents=True)
    with tempfile.TemporaryFile() as handle:
        handle.write(archive)
        handle.seek(0)
        with tarfile.open(fileobj=handle) as tar:
            tar.extractall(into, filter="data")
    return into


async def _main_async(opts: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    from rsnotify.collection import collection_id
    from rsnotify.log.redis_log import RedisLog
    from tests.devstack import Redis

    redis = Redis(root / "redis", appendonly=False).start()
    try:
        collection = collection_id(CAP)
        log = RedisLog(redis.url)
        await log.register(collection, CAP)
        await log.close()
        trees = {"baseline": _baseline_tree(opts.baseline_rev, root / "baseline"),
                 "current": REPO_ROOT}  # fmt: skip
        results = []
        busy = await _busy_cores(3.0)
        print(f"before the run: {busy:.2f} of {os.cpu_count()} CPUs busy with other work",
              flush=True)  # fmt: skip
        for variant in opts.variants.split(","):
            print(f"{variant}: {opts.clients:,} clients over {opts.processes} processes ...",
                  flush=True)  # fmt: skip
            result = await run_variant(variant, trees[variant], redis.url, opts, collection)
            result["busy_cores_before"] = busy
            results.append(result)
        return results
    finally:
        redis.stop()


def verdicts(results: list[dict[str, Any]]) -> dict[str, bool]:
    out = {}
    by = {r["variant"]: r for r in results}
    for r in results:
        live, name = r["live"], r["variant"]
        p99 = live["latency_ms"]["p99"]
        out[f"{name}: delivery p99 <= 50 ms, all delivered"] = (
            p99 is not None and p99 <= TARGETS["p99_ms_max"]
            and live["notifications"] == live["expected"]
        )  # fmt: skip
        out[f"{name}: gateway RSS peak <= start x 1.2"] = live["rss_mb_peak"] <= live[
            "rss_mb_start"
        ] * (1 + TARGETS["rss_growth_max"])
    if "baseline" in by and "current" in by:
        now, then = (by[v]["burst"]["frames_per_cpu_s"] for v in ("current", "baseline"))
        ratio = now / then if now and then else 0.0
        out["current ceiling >= 2x baseline (frames per gateway CPU-second)"] = (
            ratio >= TARGETS["ceiling_ratio_min"]
        )
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m bench.ws_fanout",
                                 description=__doc__.split("\n")[0])  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="400 clients, 10 s, burst 500")
    ap.add_argument("--clients", type=int, help="2,000 (--quick: 400)")
    ap.add_argument("--processes", type=int, default=4, help="client processes")
    ap.add_argument("--rate", type=float, default=100.0, help="notifications/s in (a)")
    ap.add_argument("--seconds", type=float, help="length of (a): 30 s (--quick: 10)")
    ap.add_argument("--burst", type=int, help="notifications in (b): 1,000 (--quick: 500)")
    ap.add_argument("--burst-timeout", type=float, default=180.0)
    ap.add_argument(
        "--client-nice",
        type=int,
        default=CLIENT_NICE,
        help="niceness added to the client processes (they stand for other machines)",
    )
    ap.add_argument(
        "--client-poll-ms",
        type=float,
        default=CLIENT_POLL_MS,
        help="clients look at their sockets every N ms (0: sleep in epoll_wait)",
    )
    ap.add_argument("--client-cpus", help="pin the client processes to these CPUs, e.g. 1")
    ap.add_argument(
        "--client-impl",
        choices=wsclients_c.IMPLEMENTATIONS,
        default="auto",
        help="the clients: bench/wsclients.c compiled now, or bench/wsclients.py "
        "(auto: C when it builds)",
    )
    ap.add_argument("--baseline-rev", default=BASELINE_REV)
    ap.add_argument("--variants", default="baseline,current")
    opts = ap.parse_args(argv)
    for name, full, quick in (("clients", 2_000, 400), ("seconds", 30.0, 10.0),
                              ("burst", 1_000, 500)):  # fmt: skip
        if getattr(opts, name) is None:
            setattr(opts, name, quick if opts.quick else full)
    opts.client_ran, opts.client_command = wsclients_c.command(opts.client_impl)
    print(f"clients: {opts.client_ran} ({' '.join(opts.client_command)})", flush=True)
    machine = machine_info()
    with tempfile.TemporaryDirectory(prefix="rsnotify-bench-fanout-") as tmp:
        results = asyncio.run(_main_async(opts, Path(tmp)))
    rows = []
    for r in results:
        live, burst = r["live"], r["burst"]
        rows.append([
            r["variant"], r["client_impl"], r["clients"], live["sent"], live["latency_ms"]["p50"],
            live["latency_ms"]["p99"], live["latency_ms"]["max"], live["to_gateway_ms"]["p99"],
            live["fan_out_ms"]["p99"], live["read_ms"]["p99"],
            live["expected"] - live["notifications"], live["skipped"], live["breaks"],
            "{:.0f} ({:.0f} sys)".format(live["gateway_cpu_pct"], live["gateway_sys_pct"]),
            live["clients_cpu_pct"], live["rss_mb_start"],
            live["rss_mb_peak"],
            burst["frames_per_s"], burst["frames_per_cpu_s"], burst["skipped"],
            r["gateway"]["shared_frames"],
            "{} / {:.1f}".format(sum(live["gateway_gc"]["runs"]),
                                 max(live["gateway_gc"]["longest_cpu_ms"])),
            "{:.1f} -> {:.1f}".format(live["loadavg_1m_before"], live["loadavg_1m_after"]),
            live["cpu_pressure_pct"],
        ])  # fmt: skip
    print()
    print(format_table(
        ["variant", "client", "clients", "sent", "p50 ms", "p99 ms", "max ms", "log p99",
         "fan-out p99", "read p99",
         "lost", "skipped", "breaks", "gw CPU %", "clients CPU %", "RSS MB", "peak MB",
         "ceiling frames/s",
         "frames/CPU-s",
         "burst skipped", "shared frames", "live GCs / longest CPU ms", "load 1m (live)",
         "CPU pressure %"],
        rows,
    ))  # fmt: skip
    print(f"\nload average before {machine['loadavg_1_5_15']}, after {list(os.getloadavg())}\n")
    passed = verdicts(results)
    for target, ok in passed.items():
        print(f"{'PASS' if ok else 'FAIL'}  {target}")
    path = write_json(
        "ws_fanout-quick" if opts.quick else "ws_fanout",
        {"bench": "ws_fanout", "targets": TARGETS, "options": vars(opts), "results": results,
         "pass": passed, "machine": machine, "machine_after": machine_info(),
         "source": source_digest("rsnotify/transport/ws.py", "rsnotify/transport/wsfeed.py",
                                 "rsnotify/transport/tail.py", "bench/ws_fanout.py",
                                 "bench/wsclients.py", "bench/wsclients.c")},
    )  # fmt: skip
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
