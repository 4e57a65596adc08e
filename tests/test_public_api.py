"""Issue 20, item 5: ``rsnotify`` exports what an embedding program uses, lazily, and
importing it changes nothing outside the package.
"""

from __future__ import annotations

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


def test_importing_rsnotify_imports_no_submodule():
    """The publisher and subscriber pull in aiohttp, paho-mqtt, redis: only when asked for.

    That importing any rsnotify module changes no global state (signals, atexit,
    logging, threads) is checked by tests/test_packaging.py (issue 20, item 3).
    """
    probe = (
        "import sys, rsnotify; print(sorted(m for m in sys.modules if m.startswith('rsnotify.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
