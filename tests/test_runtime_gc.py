"""The collector's settings: a --once run collects far less often than a service."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from rsnotify import cli
from rsnotify.runtime import GC_GEN0_THRESHOLD, GC_GEN0_THRESHOLD_BATCH, tune_gc


@pytest.fixture
def gc_settings() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.mark.usefixtures("gc_settings")
@pytest.mark.parametrize(
    ("name", "argv", "gen0"),
    [
        ("subscribe", ["http://s/", "--into", "m", "--once"], GC_GEN0_THRESHOLD_BATCH),
        ("subscribe", ["http://s/", "--into", "m"], GC_GEN0_THRESHOLD),
        ("publish", ["http://s/"], GC_GEN0_THRESHOLD),
    ],
)
def test_only_a_once_run_is_a_batch(name: str, argv: list[str], gen0: int) -> None:
    _, args = cli.parse_command(name, argv)
    gc.set_threshold(700, 10, 10)  # CPython's default
    tune_gc(batch=cli.is_batch(args))
    assert gc.get_threshold() == (gen0, 10, 10)


def test_a_batch_threshold_is_higher_than_a_service_s() -> None:
    """Services keep pauses short (publisher p99); a batch has none to keep."""
    assert GC_GEN0_THRESHOLD_BATCH > GC_GEN0_THRESHOLD
