"""``make demo`` run for real, bounded in time: everything comes up, converges, and stops."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent


def _ours(directory: Path) -> list[psutil.Process]:
    """Processes whose command line mentions the demo's directory (what it started)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(str(directory) in part for part in process.info["cmdline"] or ()):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_make_demo_converges_and_leaves_nothing_running(tmp_path: Path) -> None:
    demo_dir = tmp_path / "demo"
    env = dict(os.environ, DEMO_SECONDS="8", DEMO_DIR=str(demo_dir), PYTHON=sys.executable)
    result = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "rsnotify demo is running" in output
    assert "both mirrors equal the Source, file for file" in output
    assert "every process it started is stopped" in output
    logs = demo_dir / "logs"
    for name in ("simulate", "publish", "subscribe-mqtt", "subscribe-ws"):
        assert (logs / f"{name}.stdout.log").exists(), f"{name} never started"
    assert "live" in (logs / "subscribe-mqtt.stdout.log").read_text()
    assert "live" in (logs / "subscribe-ws.stdout.log").read_text()
    mirrors = [demo_dir / "mirror-mqtt", demo_dir / "mirror-ws"]
    assert all(any(p.is_file() for p in m.rglob("*")) for m in mirrors)
    started = [line.split() for line in (demo_dir / "pids").read_text().splitlines()]
    assert {name for name, _ in started} >= {
        "redis-server",
        "mosquitto",
        "simulate",
        "publish",
        "subscribe-mqtt",
        "subscribe-ws",
    }
    alive = [
        (name, pid)
        for name, pid in started
        if psutil.pid_exists(int(pid)) and psutil.Process(int(pid)).status() != "zombie"
    ]
    assert alive == [], f"the demo left processes running: {alive}"
    assert _ours(demo_dir) == [], "the demo left processes running"
