"""The collector's settings: a --once run collects far less often than a service, and a
subscriber freezes what its baseline built once it is live."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from rsnotify import cli
from rsnotify.runtime import GC_GEN0_THRESHOLD, GC_GEN0_THRESHOLD_BATCH, tune_gc
from rsnotify.simulator.server import Simulator, SimulatorConfig
from rsnotify.subscriber.service import Subscriber, SubscriberConfig
from tests.devstack import async_wait_for


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


SETTLE_PROBE = """
import gc, weakref
from rsnotify import runtime

class Node:
    pass

def freeze_growth():
    before = gc.get_freeze_count()
    runtime.settle_gc()
    return gc.get_freeze_count() - before

kept = [[i] for i in range(5000)]
untuned = freeze_growth()          # a host embedding rsnotify: nothing changes
runtime.tune_gc()
kept += [[i] for i in range(5000)]
garbage = Node(); garbage.me = garbage  # a cycle nothing refers to
gone = weakref.ref(garbage)
del garbage
tuned = freeze_growth()
print(untuned, tuned, gone() is None)
"""


def test_settling_freezes_what_start_up_built_only_in_rsnotify_s_own_program() -> None:
    # A subprocess: tune_gc and freeze change the whole interpreter's collector.
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", SETTLE_PROBE], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    untuned, tuned, collected = int(out[0]), int(out[1]), out[2]
    assert untuned == 0
    assert tuned >= 5000  # the lists made after tune_gc's own freeze, at least
    assert collected == "True"  # garbage is collected first, never frozen for good


async def test_a_subscriber_settles_once_a_collection_is_live(tmp_path: Path) -> None:
    sim = Simulator(SimulatorConfig(rate=0, seed=3, resources=30, payload_bytes=128))
    base = await sim.start()
    lived: list[int] = []  # files in the mirror when it was called
    sub = Subscriber(
        SubscriberConfig(source=base, into=str(tmp_path / "m")),
        on_live=lambda: lived.append(len(list((tmp_path / "m").rglob("*.txt")))),
    )
    try:
        await sub.start()
        running = asyncio.create_task(sub.run_forever())
        await async_wait_for(lambda: bool(lived), timeout=30, message="never live")
        sub.stopping.set()
        await asyncio.wait_for(running, timeout=10)
    finally:
        await sub.stop()
        await sim.stop()
    assert lived == [30]  # once, after the baseline (30 resources), not before
