"""WebSocket gateway memory: publisher RSS before, during and after 10,000 connections.

Issue 22's probe: one client took 10,000 connections and the publisher's RSS
went from 145 to 290 MB and stayed at ~297 MB after they closed.  This bench
runs the real ``rsnotify publish --ws`` (``--ws-max-per-address 0``, so one
address may open them all) against an in-process simulated Source, and a
client process that opens ``--connections`` WebSocket subscriptions, holds
them, then closes them all; twice (two waves), with the publisher's resident
set (``VmRSS``) read before, at the peak of each wave, and after each once
the publisher has logged its memory release and RSS has settled (no change
for 5 s).  The same scenario runs with CPython's
default allocator (pymalloc) and with ``PYTHONMALLOC=malloc``.  Also checked:
with the default ``--ws-max-per-address`` (256), connection 257 from one
address is refused with HTTP 429.

Targets (PASS/FAIL):

* bounded growth: the second wave's peak within 10 % of the first's, with
  either allocator (memory of closed connections is reused, not added to);
* returned: with ``PYTHONMALLOC=malloc``, at least 60 % of a wave's growth is
  given back to the system once its connections have closed.  (With pymalloc
  the freed memory stays in CPython's partly used arenas: reusable by the
  process, not returnable; the table shows how much.)

Run ``.venv/bin/python -m bench.ws_connections`` (about 6 minutes on 2 cores;
``--quick``: 1,000 connections, under a minute).  Writes
``bench/results/ws_connections.json``; exits 0 either way.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import format_table, machine_info, source_digest, write_json

TARGETS = {"second_peak_ratio_max": 1.10, "returned_fraction_malloc_min": 0.60}
SETTLE_S = 5.0  # RSS unchanged (within 1 MB) this long counts as settled
CONNECT_SLOTS = 200  # handshakes in flight at once from the client process


# --- the client process -----------------------------------------------------------------


async def _client_main(url: str, count: int) -> None:
    """Open ``count`` connections, say so; close them all on a line from stdin; repeat."""
    from websockets.asyncio.client import connect

    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(CONNECT_SLOTS)

    async def one() -> Any:
        async with slots:
            return await connect(url, ping_interval=None, open_timeout=60)

    while True:
        command = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if command != "open":
            return
        started = time.perf_counter()
        outcomes = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
        held = [o for o in outcomes if not isinstance(o, BaseException)]
        failed = {type(o).__name__ + ": " + str(o)[:60] for o in outcomes if o not in held}
        print(f"open {len(held)} {time.perf_counter() - started:.1f} {sorted(failed)}", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)
        await asyncio.gather(*(ws.close() for ws in held), return_exceptions=True)
        print("closed", flush=True)


# --- the scenario -------------------------------------------------------------------------


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _settled(pid: int, timeout: float = 60.0) -> float:
    """RSS once it has not moved by more than 1 MB for SETTLE_S seconds."""
    deadline = time.monotonic() + timeout
    last, since = _rss_mb(pid), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = _rss_mb(pid)
        if abs(now - last) > 1.0:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= SETTLE_S:
            return now
    return _rss_mb(pid)


def _released(log: Path, count: int, timeout: float = 120.0) -> bool:
    """Wait until the publisher has logged its ``count``-th memory release."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.read_text(errors="replace").count("released memory after") >= count:
            return True
        time.sleep(0.2)
    return False


def _wait_line(path: Path, pattern: str, timeout: float = 60.0) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, path.read_text(errors="replace"))
        if found:
            return found
        time.sleep(0.1)
    raise RuntimeError(f"no {pattern!r} in {path}:\n{path.read_text(errors='replace')}")


def _publisher(source: str, workdir: Path, allocator: str, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.pop("PYTHONMALLOC", None)
    if allocator == "malloc":
        env["PYTHONMALLOC"] = "malloc"
    out = (workdir / "publish.log").open("w")
    argv = [sys.executable, "-m", "rsnotify.cli", "publish", source, "--ws", "127.0.0.1:0"]
    argv += ["--state-dir", str(workdir / "state"), "--log-level", "info", *extra]
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)


def run_scenario(source: str, allocator: str, connections: int, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True)
    publisher = _publisher(source, workdir, allocator, "--ws-max-per-address", "0")
    client: subprocess.Popen[str] | None = None
    try:
        log = workdir / "publish.log"
        port = _wait_line(log, r"ws://127\.0\.0\.1:(\d+)/")[1]
        collection = _wait_line(log, r"rsnotify publish: collection (\S+) ")[1]
        url = f"ws://127.0.0.1:{port}/{collection}"
        client = subprocess.Popen(
            [sys.executable, "-m", "bench.ws_connections", "--client", url, str(connections)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert client.stdin is not None and client.stdout is not None
        before = _settled(publisher.pid)
        waves = []
        for _ in range(2):
            client.stdin.write("open\n")
            client.stdin.flush()
            _, opened, seconds, failed = client.stdout.readline().split(" ", 3)
            peak = _rss_mb(publisher.pid)
            client.stdin.write("close\n")
            client.stdin.flush()
            client.stdout.readline()
            closed_at = time.monotonic()
            released = _released(log, len(waves) + 1)
            release_s = time.monotonic() - closed_at if released else None
            after = _settled(publisher.pid)
            waves.append(
                {
                    "opened": int(opened),
                    "open_s": float(seconds),
                    "failures": failed.strip(),
                    "peak_mb": peak,
                    "after_mb": after,
                    "returned_fraction": (peak - after) / max(peak - before, 1e-9),
                    "release_s": release_s,
                }
            )
        client.stdin.write("quit\n")
        client.stdin.flush()
        client.wait(60)
        return {"allocator": allocator, "connections": connections, "before_mb": before,
                "waves": waves}  # fmt: skip
    finally:
        for process in (client, publisher):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(30)


def default_limit_refuses(source: str, workdir: Path) -> dict[str, Any]:
    """With the default --ws-max-per-address, connection 257 from one address gets 429."""
    workdir.mkdir(parents=True)
    publisher = _publisher(source, workdir, "pymalloc")
    try:
        log = workdir / "publish.log"
        port = _wait_line(log, r"ws://127\.0\.0\.1:(\d+)/")[1]
        collection = _wait_line(log, r"rsnotify publish: collection (\S+) ")[1]
        return asyncio.run(_count_admitted(f"ws://127.0.0.1:{port}/{collection}", 300))
    finally:
        publisher.terminate()
        publisher.wait(30)


async def _count_admitted(url: str, count: int) -> dict[str, Any]:
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    held, statuses = [], []
    for _ in range(count):
        try:
            held.append(await connect(url, ping_interval=None))
        except InvalidStatus as refused:
            statuses.append(refused.response.status_code)
    await asyncio.gather(*(ws.close() for ws in held), return_exceptions=True)
    return {"tried": count, "admitted": len(held), "refused_statuses": sorted(set(statuses))}


async def _with_source(body: Any) -> Any:
    from rsnotify.simulator.server import Simulator, SimulatorConfig

    simulator = Simulator(SimulatorConfig(rate=0))
    url = await simulator.start()
    try:
        return await asyncio.to_thread(body, url)
    finally:
        await simulator.stop()


def verdicts(results: list[dict[str, Any]], limit: dict[str, Any]) -> dict[str, bool]:
    out = {}
    for r in results:
        first, second = r["waves"]
        ratio = second["peak_mb"] / first["peak_mb"]
        out[f"{r['allocator']}: second peak <= first x 1.10"] = (
            ratio <= TARGETS["second_peak_ratio_max"]
        )
        if r["allocator"] == "malloc":
            returned = min(w["returned_fraction"] for w in r["waves"])
            out["malloc: >= 60 % of each wave's growth returned"] = (
                returned >= TARGETS["returned_fraction_malloc_min"]
            )
    out["default limit: 256 admitted from one address, then HTTP 429"] = limit[
        "admitted"
    ] == 256 and limit["refused_statuses"] == [429]
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--client":
        asyncio.run(_client_main(argv[1], int(argv[2])))
        return 0
    ap = argparse.ArgumentParser(
        prog="python -m bench.ws_connections", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="1,000 connections: a smoke test")
    ap.add_argument("--connections", type=int, default=10_000, help="per wave (10,000)")
    opts = ap.parse_args(argv)
    connections = 1_000 if opts.quick else opts.connections
    machine = machine_info()
    results = []
    with tempfile.TemporaryDirectory(prefix="rsnotify-bench-ws-") as tmp:
        for allocator in ("pymalloc", "malloc"):
            print(f"{allocator}: 2 waves of {connections:,} connections ...", flush=True)
            workdir = Path(tmp) / allocator

            def scenario(url: str, a: str = allocator, w: Path = workdir) -> Any:
                return run_scenario(url, a, connections, w)

            results.append(asyncio.run(_with_source(scenario)))
        limit = asyncio.run(_with_source(lambda url: default_limit_refuses(url, Path(tmp) / "l")))
    rows = [
        [r["allocator"], i + 1, w["opened"], w["open_s"], r["before_mb"], w["peak_mb"],
         w["after_mb"], w["peak_mb"] - r["before_mb"], w["after_mb"] - r["before_mb"],
         100 * w["returned_fraction"], w["release_s"]]
        for r in results for i, w in enumerate(r["waves"])
    ]  # fmt: skip
    print()
    print(format_table(
        ["allocator", "wave", "connections", "open s", "before MB", "peak MB", "after MB",
         "grown MB", "kept MB", "returned %", "release s"],
        rows,
    ))  # fmt: skip
    print(
        f"\ndefault --ws-max-per-address: {limit['admitted']} of {limit['tried']} admitted "
        f"from one address, refused with {limit['refused_statuses']}\n"
    )
    passed = verdicts(results, limit)
    for target, ok in passed.items():
        print(f"{'PASS' if ok else 'FAIL'}  {target}")
    path = write_json(
        "ws_connections-quick" if opts.quick else "ws_connections",
        {
            "bench": "ws_connections",
            "targets": TARGETS,
            "results": results,
            "default_limit": limit,
            "pass": passed,
            "machine": machine,
            "machine_after": machine_info(),
            "source": source_digest("rsnotify/transport/ws.py", "rsnotify/runtime.py"),
        },
    )
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
