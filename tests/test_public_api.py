"""Issue 20, item 5: ``rsnotify`` exports what an embedding program uses, lazily, and
importing it changes nothing outside the package.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import rsnotify

ROOT = Path(__file__).resolve().parent.parent


def test_every_name_in_all_resolves():
    missing = [name for name in rsnotify.__all__ if getattr(rsnotify, name, None) is None]
    assert not missing


def test_all_lists_exactly_the_lazy_exports():
    assert set(rsnotify.__all__) == {"__version__", *rsnotify._EXPORTS}
    assert len(rsnotify.__all__) == len(set(rsnotify.__all__))


def test_exports_are_the_documented_objects():
    from rsnotify import envelope, errors, sitemap
    from rsnotify.subscriber.applier import Hooks

    assert rsnotify.Hooks is Hooks  # the name README pointed at before
    assert rsnotify.sitemap is sitemap and rsnotify.envelope is envelope
    assert rsnotify.RsNotifyError is errors.RsNotifyError
    assert "Subscriber" in dir(rsnotify)


def test_an_unknown_name_is_an_attribute_error():
    try:
        rsnotify.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("rsnotify.NoSuchThing resolved")


# Run in a fresh interpreter: what it prints is the state before and after.  The
# third-party libraries are imported first: aiohttp.web adds a warnings filter of
# its own, which is aiohttp's business, not rsnotify's.
PROBE = r"""
import atexit, gc, json, logging, signal, sys, threading, warnings
import aiohttp.web, lxml.etree, orjson, paho.mqtt.client, prometheus_client, redis, websockets

def state():
    return {
        "atexit": atexit._ncallbacks(),
        "signals": {s.name: repr(signal.getsignal(s)) for s in signal.valid_signals()
                    if isinstance(s, signal.Signals)},
        "root_handlers": len(logging.root.handlers),
        "root_level": logging.root.level,
        "logger_disabled": logging.root.manager.disable,
        "threads": threading.active_count(),
        "gc": [gc.isenabled(), gc.get_threshold()],
        "warnings": len(warnings.filters),
        "excepthook": repr(sys.excepthook),
    }

before = state()
import rsnotify
bare = sorted(m for m in sys.modules if m.startswith("rsnotify."))
for name in rsnotify.__all__:
    getattr(rsnotify, name)
print(json.dumps({"before": before, "after": state(), "bare": bare}))
"""


def test_importing_rsnotify_changes_no_global_state():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    result = json.loads(out)
    assert result["bare"] == [], "import rsnotify alone imported submodules"
    assert result["after"] == result["before"]
