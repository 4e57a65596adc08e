"""Notifications per second through a third-party WebSub hub, beside rsnotify's own hub.

One run, one log: ``rsnotify simulate`` (paused) is the Source and ``rsnotify
publish --websub --websub-hub FLASK --websub-hub-mode ping`` both serves its
own hub and hands every notification to flask-websub (PyPI; its Flask app and
a Celery worker with ``--pool solo`` on a Redis of its own, as
``tests/websub_flask_hub.py`` sets it up).  Two callbacks in this process
subscribe to the same topic, one at each hub.  Then the Source makes N
changes at once (``/_simulator/advance``) and the bench times, per path, how
long until every change has arrived, how many notifications carried them,
and the rates.

Why the two differ: rsnotify's hub reads its log and POSTs to each callback
as soon as the previous POST is answered, grouping what waits (up to 100
changes); the third-party path is ping, then the hub's worker fetches the
topic, then a delivery task per subscriber, one notification in flight at a
time (the publisher hands the next one over only after the fetch).

Run ``.venv/bin/python -m bench.websub_hubs`` (``--changes N``).  It prints a
table and writes ``bench/results/websub_hubs.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from bench._common import REPO_ROOT, format_table, machine_info, source_digest, write_json
from tests.devstack import ManagedProcess, Redis, free_port, wait_for

_URL = re.compile(rb"<url>")


@dataclass
class Counter:
    """A callback that counts what arrives (verifies intent, never fails a delivery)."""

    port: int = field(default_factory=free_port)
    changes: int = 0
    notifications: int = 0
    first: float | None = None
    last: float | None = None
    verified: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/cb"

    async def get(self, request: web.Request) -> web.Response:
        self.verified = True
        return web.Response(text=request.query.get("hub.challenge", ""))

    async def post(self, request: web.Request) -> web.Response:
        body = await request.read()
        now = time.perf_counter()
        self.first = self.first or now
        self.last = now
        found = len(_URL.findall(body))
        if found:
            self.notifications += 1
            self.changes += found
        return web.Response(status=204)


def _post(url: str, form: dict[str, str] | None = None) -> int:
    data = urllib.parse.urlencode(form).encode() if form else b""
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as response:
        status: int = response.status
        return status


async def _run(changes: int, workdir: Path) -> list[dict[str, Any]]:
    redis = Redis(workdir / "redis").start()
    processes: list[ManagedProcess] = []

    def spawn(argv: list[str], name: str, env: dict[str, str] | None = None) -> ManagedProcess:
        process = ManagedProcess(argv, workdir=workdir / "logs", name=name, env=env, cwd=REPO_ROOT)
        processes.append(process)
        return process.start()

    counters = {"rsnotify hub": Counter(), "flask-websub (ping)": Counter()}
    runners = []
    try:
        for counter in counters.values():
            one = web.Application(client_max_size=8 * 1024 * 1024)
            one.router.add_get("/cb", counter.get)
            one.router.add_post("/cb", counter.post)
            runner = web.AppRunner(one, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", counter.port).start()
            runners.append(runner)
        flask_port, ours = free_port(), free_port()
        env = {
            "HUB_BROKER": redis.url,
            "HUB_DB": str(workdir / "flask-hub.db"),
            "HUB_PORT": str(flask_port),
            "PYTHONPATH": str(REPO_ROOT),
        }
        spawn([sys.executable, "-m", "tests.websub_flask_hub"], "flask-hub", env)
        worker = spawn(
            [sys.executable, "-m", "celery", "-A", "tests.websub_flask_hub:celery", "worker",
             "--pool", "solo", "--loglevel", "info", "--without-gossip", "--without-mingle",
             "--without-heartbeat"],
            "flask-worker", env,
        )  # fmt: skip
        sim = spawn(
            [sys.executable, "-m", "rsnotify.cli", "simulate", "--port", "0", "--quiet",
             "--paused", "--rate", "0", "--resources", "100", "--changelist-size", "100000"],
            "simulate",
        )  # fmt: skip
        source = sim.wait_for_line(r"serving (http://\S+/)", timeout=30).group(1)
        flask_hub = f"http://127.0.0.1:{flask_port}/hub"
        publisher = spawn(
            [sys.executable, "-m", "rsnotify.cli", "publish", source, "--redis", redis.url,
             "--poll", "0.05", "--websub", f"127.0.0.1:{ours}",
             "--websub-allow-callback", "127.0.0.1", "--websub-hub", flask_hub,
             "--websub-hub-mode", "ping", "--log-level", "warning"],
            "publish",
        )  # fmt: skip
        line = publisher.wait_for_line(r"rsnotify publish: collection (\S+)", timeout=30)
        topic = f"http://127.0.0.1:{ours}/{line.group(1)}"
        hubs = {"rsnotify hub": f"http://127.0.0.1:{ours}/", "flask-websub (ping)": flask_hub}

        def flask_up() -> bool:
            try:
                _post(flask_hub)
            except urllib.error.HTTPError:
                return "ready" in worker.output()
            except OSError:
                return False
            return False

        wait_for(flask_up, timeout=60, interval=0.2, message="flask-websub did not start")
        for name, counter in counters.items():
            form = {"hub.mode": "subscribe", "hub.topic": topic, "hub.callback": counter.url}
            await asyncio.to_thread(_post, hubs[name], {**form, "hub.lease_seconds": "3600"})
        deadline = time.monotonic() + 30
        while not all(c.verified for c in counters.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # both subscriptions active (flask stores after verifying)
        started = time.perf_counter()
        await asyncio.to_thread(_post, f"{source}_simulator/advance?n={changes}")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and any(c.changes < changes for c in counters.values()):
            await asyncio.sleep(0.05)
        rows = []
        for name, counter in counters.items():
            seconds = (counter.last or started) - started
            rows.append(
                {
                    "path": name,
                    "changes": counter.changes,
                    "notifications": counter.notifications,
                    "seconds": round(seconds, 3),
                    "changes_per_s": round(counter.changes / seconds, 1) if seconds else None,
                    "notifications_per_s": (
                        round(counter.notifications / seconds, 1) if seconds else None
                    ),
                    "complete": counter.changes >= changes,
                }
            )
        return rows
    finally:
        for runner in runners:
            await runner.cleanup()
        for process in reversed(processes):
            process.terminate()
        redis.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.websub_hubs", description=__doc__)
    parser.add_argument("--changes", type=int, default=5_000, help="changes in the burst")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rsnotify-bench-websub-") as tmp:
        rows = asyncio.run(_run(args.changes, Path(tmp)))
    headers = ["path", "changes", "notifications", "seconds", "changes/s", "notifications/s"]
    print(
        format_table(
            headers,
            [
                [r["path"], r["changes"], r["notifications"], r["seconds"], r["changes_per_s"],
                 r["notifications_per_s"]]
                for r in rows
            ],
        )
    )  # fmt: skip
    ours, theirs = rows
    if ours["changes_per_s"] and theirs["changes_per_s"]:
        ratio = theirs["changes_per_s"] / ours["changes_per_s"]
        print(f"third-party path / rsnotify hub: {ratio:.2f}x (changes/s)")
    path = write_json(
        "websub_hubs",
        {
            "changes": args.changes,
            "results": rows,
            "machine": machine_info(),
            "source": source_digest(
                "rsnotify/transport/websub.py", "rsnotify/transport/websubpush.py"
            ),
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
