"""``make demo``: the whole pipeline on one machine, started, shown and stopped cleanly.

Starts its own Redis and Mosquitto on free loopback ports (never the ones
already running), a simulated Source with two collections changing 20 times a
second, a publisher on MQTT, WebSocket and WebSub, and two subscribers (one
per transport) mirroring into ``.demo/mirror-*``.  The Source tells the
publisher "I just wrote my Change List" (``simulate --ping``, a signed
``hub.mode=publish`` to the publisher's hub), so detection over HTTP takes a
round trip instead of waiting for the next poll; the poll (every 5 s) is
only the fallback.  Everything runs under
``.demo/`` and is stopped by pid on Ctrl-C.

``DEMO_SECONDS=N`` runs for N seconds, then freezes the Source, waits for both
mirrors to equal the Source file for file, stops everything and exits 0 only
if they do (this is what the test of the demo runs).

Why it is here and not in the ``rsnotify`` package: the demo is a
development tool, run from a checkout by ``make demo`` (``python -m
tests.demo``) after ``make services`` has installed Mosquitto and Redis.  It
starts and reaps those servers with the test suite's process machinery
(:mod:`tests.devstack`), which kills process groups, installs safety nets
and needs ``psutil``; a copy of that machinery inside the wheel would be a
second implementation to keep right, and an operator running the installed
package has no use for either.  The signal handlers below are installed by
:func:`main`, never on import.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from tests.devstack import ManagedProcess, Mosquitto, Redis, free_port, wait_for
from tests.groundtruth import mirror_differences

RATE = float(os.environ.get("DEMO_RATE", "20"))
COLLECTIONS = 2


def _post(url: str) -> Any:
    request = urllib.request.Request(url, method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


class Demo:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.stack = ExitStack()
        self.processes: list[ManagedProcess] = []

    def _rsnotify(self, name: str, *args: str) -> ManagedProcess:
        process = ManagedProcess.rsnotify(*args, workdir=self.root / "logs", name=name)
        self.processes.append(process)
        self.stack.callback(process.terminate)
        process.start()
        self._record(name, process.pid)
        return process

    def _record(self, name: str, pid: int) -> None:
        """Every pid the demo starts, so anyone can check it left nothing behind."""
        with open(self.root / "pids", "a") as handle:
            handle.write(f"{name} {pid}\n")

    def start(self) -> dict[str, str]:
        root = self.root
        redis = Redis(root / "redis")
        self.stack.callback(redis.stop)
        redis.start()
        self._record("redis-server", redis.pid)
        broker = Mosquitto(root / "mosquitto", max_queued_messages=100_000)
        self.stack.callback(broker.stop)
        broker.start()
        self._record("mosquitto", broker.pid)
        ws_port = free_port()
        hub_port = free_port()
        ping_secret = os.urandom(16).hex()
        mqtt = f"mqtt://127.0.0.1:{broker.port}"
        ws = f"ws://127.0.0.1:{ws_port}"
        sim = self._rsnotify(
            "simulate",
            "simulate",
            "--port", "0",
            "--collections", str(COLLECTIONS),
            "--rate", str(RATE),
            "--resources", "50",
            "--changelist-size", "200",
            "--payload-bytes", "512",
            "--hub", f"{ws}/{{id}}",
            "--hub", f"{mqtt}/resourcesync/{{id}}/changes",
            "--hub", f"http://127.0.0.1:{hub_port}/{{id}}",
            "--ping", f"http://127.0.0.1:{hub_port}/",
            "--ping-secret", ping_secret,
        )  # fmt: skip
        source = sim.wait_for_line(r"serving (http://\S+)", timeout=30).group(1)
        self._rsnotify(
            "publish",
            "publish",
            source,
            "--redis", redis.url,
            "--mqtt", mqtt,
            "--ws", f"127.0.0.1:{ws_port}",
            "--websub", f"127.0.0.1:{hub_port}",
            "--secret", ping_secret,
            "--poll", "5",
            "--metrics-port", "0",
            "--log-format", "text",
        ).wait_for_line(r"rsnotify publish: running", timeout=30)  # fmt: skip
        for transport, via in (("mqtt", mqtt), ("ws", ws)):
            self._rsnotify(
                f"subscribe-{transport}",
                "subscribe",
                source,
                "--into", str(root / f"mirror-{transport}"),
                "--via", via,
                "--name", f"demo-{transport}",
                "--report", redis.url,
                "--metrics-port", "0",
                "--log-format", "text",
            )  # fmt: skip
        port = os.environ.get("DEMO_DASHBOARD_PORT", "0")
        dashboard = self._rsnotify(
            "dashboard", "dashboard", "--redis", redis.url, "--mqtt", mqtt, "--port", port
        )
        page = dashboard.wait_for_line(r"serving (http://\S+)", timeout=30).group(1)
        websub = f"http://127.0.0.1:{hub_port}/"
        return {
            "source": source,
            "mqtt": mqtt,
            "ws": ws,
            "websub": websub,
            "redis": redis.url,
            "dashboard": page,
        }

    def converge(self, source: str, timeout: float = 60.0) -> list[str]:
        """Freeze the Source and wait for both mirrors to equal it."""
        _post(f"{source}_simulator/pause")
        state = _get_json(f"{source}_simulator/state")
        mirrors = [self.root / "mirror-mqtt", self.root / "mirror-ws"]
        last: list[str] = []

        def equal() -> bool:
            nonlocal last
            last = [d for m in mirrors for d in mirror_differences(state, m)]
            return not last

        try:
            wait_for(equal, timeout=timeout, interval=0.5, message="mirrors did not converge")
        except AssertionError:
            return last
        return []

    def stop(self) -> None:
        self.stack.close()


def main() -> int:
    root = Path(os.environ.get("DEMO_DIR", ".demo")).resolve()
    if root.exists():
        shutil.rmtree(root)  # a fresh Source each run: old mirrors would not match it
    root.mkdir(parents=True)
    seconds = float(os.environ.get("DEMO_SECONDS", "0") or 0)
    demo = Demo(root)
    stop = {"now": False}

    def interrupt(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    try:
        urls = demo.start()
        print(
            f"""
rsnotify demo is running (logs and state under {root})

  Source (simulated)    {urls["source"]}   ({COLLECTIONS} collections, {RATE:g} changes/s)
      ground truth      {urls["source"]}_simulator/state
  MQTT broker           {urls["mqtt"]}   topics resourcesync/<collection>/changes
  WebSocket gateway     {urls["ws"]}/<collection>
  WebSub hub            {urls["websub"]}   (topics <hub><collection>; the Source pings it)
  Redis log             {urls["redis"]}
  Dashboard             {urls["dashboard"]}   (latency, lags, events; /metrics)
  mirrors               {root / "mirror-mqtt"}   {root / "mirror-ws"}

What you are seeing: the simulator changes resources and appends to its Change
Lists; the publisher detects each new entry, gives it a sequence number, logs
it in Redis and pushes it over MQTT and WebSocket; each subscriber did a
baseline from the Resource List and now applies every change (fetch, verify
hash, write atomically, delete) within milliseconds.  Try: kill -9 a
subscriber's pid (see {root / "logs"}) and watch it catch up when restarted.
""",
            flush=True,
        )
        deadline = time.monotonic() + seconds if seconds else None
        while not stop["now"] and (deadline is None or time.monotonic() < deadline):
            for process in demo.processes:
                if not process.running:
                    print(f"demo: {process.name} exited:\n{process.tail()}", file=sys.stderr)
                    return 1
            time.sleep(0.5)  # the demo's own heartbeat, not synchronisation
        if seconds:
            differences = demo.converge(urls["source"])
            if differences:
                print("demo: mirrors differ from the Source:", *differences[:20], sep="\n  ")
                return 1
            print("demo: both mirrors equal the Source, file for file")
        return 0
    finally:
        demo.stop()
        print("demo: every process it started is stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
