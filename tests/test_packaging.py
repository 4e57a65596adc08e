"""What ships, and what importing it does: a library changes nothing behind its host's back.

An operator embeds rsnotify (a subscriber with hooks, a publisher) in an
application that has its own signal handlers, logging configuration and
shutdown hooks.  Importing any rsnotify module must leave all of them as they
were: only the CLI (``rsnotify.cli.main``) configures the process it runs.
And the wheel holds the library only: no tests, no test infrastructure
(``tests/devstack``, the demo), no ``psutil`` or ``pytest`` among its
requirements or imports.

Both checks run in a fresh interpreter (``-I``: no user site, no current
directory on ``sys.path``), so nothing the test run itself imported or
configured can hide a change.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: Modules the installed library must never need (test-only dependencies).
BLOCKED = ("psutil", "pytest", "_pytest", "hypothesis", "tests")

#: Run with ``-I -c``: argv[1] is the directory that holds the ``rsnotify`` to import.
#: Every module is imported; the process-wide state is compared before and after.
IMPORT_EVERYTHING = r"""
import sys
sys.path.insert(0, sys.argv[1])
for name in sys.argv[2].split(","):
    sys.modules[name] = None  # "import psutil" now raises ImportError

import ast, atexit, gc, importlib, json, logging, os, pathlib, pkgutil, signal, threading
import warnings

# What other libraries do when imported (aiohttp.web adds a warnings filter) is
# theirs: import everything rsnotify imports first, then look at rsnotify alone.
for path in pathlib.Path(sys.argv[1], "rsnotify").rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            if name.split(".")[0] not in ("rsnotify", "__future__"):
                try:
                    importlib.import_module(name)
                except ImportError:
                    pass

def snapshot():
    return {
        "signal handlers": {str(s): repr(signal.getsignal(s)) for s in signal.valid_signals()},
        "atexit callbacks": atexit._ncallbacks(),
        "root logger handlers": [repr(h) for h in logging.root.handlers],
        "root logger level": logging.root.level,
        "logging disabled below": logging.root.manager.disable,
        "environment": dict(os.environ),
        "excepthook": repr(sys.excepthook),
        "warnings filters": [repr(f) for f in warnings.filters],
        "gc thresholds": list(gc.get_threshold()),
        "gc frozen objects": gc.get_freeze_count(),
        "threads": sorted(t.name for t in threading.enumerate()),
        "working directory": os.getcwd(),
    }

before = snapshot()
import rsnotify
modules = ["rsnotify"]
for info in pkgutil.walk_packages(rsnotify.__path__, "rsnotify."):
    if info.name.rsplit(".", 1)[-1] == "__main__":
        continue
    importlib.import_module(info.name)
    modules.append(info.name)
after = snapshot()
print(json.dumps({
    "before": before,
    "after": after,
    "modules": modules,
    "file": rsnotify.__file__,
    "blocked": sorted(n for n, m in sys.modules.items() if m is None and n in sys.argv[2]),
}))
"""


def import_everything(package_parent: Path, cwd: Path) -> dict[str, Any]:
    """Import every ``rsnotify`` module found under ``package_parent`` in a fresh interpreter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    result = subprocess.run(
        [sys.executable, "-I", "-c", IMPORT_EVERYTHING, str(package_parent), ",".join(BLOCKED)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def assert_nothing_changed(report: dict[str, Any]) -> None:
    before, after = report["before"], report["after"]
    changed = {key: (before[key], after[key]) for key in before if before[key] != after[key]}
    assert changed == {}, f"importing rsnotify changed global state: {changed}"


def test_importing_every_module_changes_no_global_state(tmp_path: Path) -> None:
    report = import_everything(ROOT, tmp_path)
    assert report["file"] == str(ROOT / "rsnotify" / "__init__.py")
    # The walk really reached every corner (a silent empty walk would prove nothing).
    assert {"rsnotify.cli", "rsnotify.transport.ws", "rsnotify.subscriber.mirror"} <= set(
        report["modules"]
    )
    assert len(report["modules"]) >= 60
    assert_nothing_changed(report)


def _copy_tree(destination: Path) -> Path:
    """The checkout without build output, venvs or caches (pip builds in the source tree)."""
    ignored = shutil.ignore_patterns(
        ".git",
        ".venv",
        "build",
        "*.egg-info",
        "__pycache__",
        ".*_cache",
        ".hypothesis",
        ".demo",
        ".rsnotify",
        "soak",
        "results",
        "chaos-report.json",
    )
    shutil.copytree(ROOT, destination, ignore=ignored)
    return destination


def test_wheel_holds_the_library_only_and_imports_without_test_dependencies(
    tmp_path: Path,
) -> None:
    source = _copy_tree(tmp_path / "src")
    out = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, (build.stdout + build.stderr)[-4000:]
    (wheel,) = out.glob("rsnotify-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        members = archive.namelist()
        metadata_name = next(m for m in members if m.endswith(".dist-info/METADATA"))
        metadata = archive.read(metadata_name).decode()
        archive.extractall(tmp_path / "installed")

    outside = [m for m in members if not m.startswith(("rsnotify/", "rsnotify-"))]
    assert outside == [], f"the wheel ships files outside the package: {outside}"
    test_like = [
        m
        for m in members
        if Path(m).name.startswith("test_")
        or Path(m).name in ("conftest.py", "devstack.py", "devstatic.py", "demo.py")
        or "/tests/" in m
        or "/devstack/" in m
    ]
    assert test_like == [], f"the wheel ships test code: {test_like}"
    assert "rsnotify/transport/ws.py" in members

    # Runtime requirements: nothing the tests need (``extra == "test"`` lines are fine).
    requires = [
        line.removeprefix("Requires-Dist:").strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    names = {r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].strip() for r in requires}
    assert "lxml" in names
    assert names.isdisjoint({"psutil", "pytest", "hypothesis"}), requires

    report = import_everything(tmp_path / "installed", tmp_path)
    assert report["file"] == str(tmp_path / "installed" / "rsnotify" / "__init__.py")
    assert set(report["blocked"]) == set(BLOCKED)
    assert len(report["modules"]) >= 60
    assert_nothing_changed(report)
