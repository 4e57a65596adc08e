"""Issue 20, item 5: one documented exception tree, every class rsnotify defines in it.

``rsnotify.errors`` says callers catch :class:`RsNotifyError` (or one of its
three branches) and nothing else.  That holds only if every exception class
anywhere in the package is in the tree, so this walks every module and
inspects what it defines, rather than trusting a list.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import rsnotify
from rsnotify import errors
from rsnotify.errors import LocalError, RemoteInputError, RsNotifyError, Unavailable

BRANCHES = (RemoteInputError, LocalError, Unavailable)
# In the tree but in no branch: the root, a family whose every member names its
# branch (LogError is never raised itself), and a signal that is no error.
UNBRANCHED = {RsNotifyError, *BRANCHES, errors.LogError, errors.AlreadyHeld}

# Where each class moved into rsnotify.errors used to live: the old import keeps working.
OLD_HOMES = {
    "rsnotify.config": ["ConfigError", "ValueRefused"],
    "rsnotify.envelope": ["InvalidNotification", "SignatureError"],
    "rsnotify.fetch": [
        "DeadlineExceeded",
        "OriginNotAllowed",
        "ResponseTooLarge",
        "UnwantedEncoding",
    ],
    "rsnotify.log": ["Fenced", "LogConflict", "LogError", "LogUnavailable"],
    "rsnotify.changes.watcher": ["CoverageHole"],  # was rsnotify.publisher.watcher
    "rsnotify.report": ["ReportError"],
    "rsnotify.simulator.source": ["SimulatorError"],
    "rsnotify.spare": ["SpareUnusable"],
    "rsnotify.sqlitedb": ["StoreUnavailable"],
    "rsnotify.subscriber.cursor": ["AlreadyRunning"],
    "rsnotify.subscriber.dump": ["UnusableDump"],
    "rsnotify.subscriber.redis_cursor": ["CursorStoreUnavailable"],
    "rsnotify.subscriber.resources": ["ResourceStoreError"],
    "rsnotify.subscriber.rules": ["AlreadyHeld", "InvalidChange"],
    "rsnotify.transport": ["InvalidBrokerURL", "TransportError"],
    "rsnotify.transport.mqttsig": ["TrailerUnsupported"],
    "rsnotify.transport.topics": ["InvalidTopic"],
    "rsnotify.transport.websubproto": ["RequestError"],
    "rsnotify.transport.wsproto": ["InvalidSubscription"],
}


def defined_exceptions() -> dict[type[BaseException], str]:
    """Every exception class defined in an rsnotify module -> that module's name."""
    found: dict[type[BaseException], str] = {}
    for info in pkgutil.walk_packages(rsnotify.__path__, "rsnotify."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ):
                found[value] = module.__name__
    return found


DEFINED = defined_exceptions()


def test_the_walk_finds_the_tree_and_the_classes_defined_elsewhere():
    modules = set(DEFINED.values())
    assert "rsnotify.errors" in modules
    # MirrorError's family stays in the mirror (see errors.py), a module or a package.
    assert any(m.startswith("rsnotify.subscriber.mirror") for m in modules)
    assert len(DEFINED) >= 50


@pytest.mark.parametrize("cls", sorted(DEFINED, key=lambda c: (DEFINED[c], c.__name__)), ids=str)
def test_every_exception_class_is_an_rsnotify_error(cls):
    assert issubclass(cls, RsNotifyError), f"{DEFINED[cls]}.{cls.__name__} is outside the tree"
    if cls not in UNBRANCHED:
        assert issubclass(cls, BRANCHES), (
            f"{DEFINED[cls]}.{cls.__name__} names no branch: remote input, local or unavailable"
        )


def test_the_three_unavailable_errors_share_one_base():
    for name in ("LogUnavailable", "StoreUnavailable", "CursorStoreUnavailable"):
        assert issubclass(getattr(errors, name), Unavailable)


def test_classes_that_stay_outside_errors_py_are_the_mirror_family():
    outside = {c.__name__: m for c, m in DEFINED.items() if m != "rsnotify.errors"}
    mirror = {"MirrorError", "UnsafePath", "SymlinkInMirror", "PathConflict", "FixityMismatch"}
    expected = {
        **{name: "rsnotify.subscriber.mirror" for name in mirror},
        "MirrorRefused": "rsnotify.subscriber.ownership",
        "MirrorInUse": "rsnotify.subscriber.ownership",
    }
    stray = sorted(
        f"{module}.{name}"
        for name, module in outside.items()
        if not module.startswith(expected.get(name, "-"))
    )
    assert not stray, f"define these in rsnotify/errors.py: {stray}"


@pytest.mark.parametrize("module_name", sorted(OLD_HOMES))
def test_moved_classes_keep_their_old_import_names(module_name):
    module = importlib.import_module(module_name)
    for name in OLD_HOMES[module_name]:
        assert getattr(module, name) is getattr(errors, name)


def test_remote_faults_raised_by_local_families_are_remote_input():
    from rsnotify.subscriber.mirror import FixityMismatch, UnsafePath

    for cls in (FixityMismatch, UnsafePath, errors.ResponseTooLarge, errors.OriginNotAllowed):
        assert issubclass(cls, RemoteInputError)


def test_classes_keep_the_builtin_bases_callers_catch():
    assert issubclass(errors.SpareUnusable, OSError)
    assert issubclass(errors.TrailerUnsupported, ValueError)
    exc = errors.SpareUnusable(18, "no swap here")
    assert (exc.errno, exc.strerror) == (18, "no swap here")


def test_two_family_classes_keep_both_families_attributes():
    exc = errors.ResponseTooLarge("http://x/a", 10, declared=20)
    assert (exc.url, exc.status, exc.limit, exc.declared) == ("http://x/a", None, 10, 20)
    assert isinstance(exc, errors.DocumentTooLarge) and exc.reason.startswith("http://x/a: ")
