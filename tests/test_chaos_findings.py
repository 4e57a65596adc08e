"""Regression tests for what the chaos matrix (tests/chaos/) found in rsnotify itself."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rsnotify.changes.access import DirectoryAccess
from rsnotify.changes.watcher import CollectionWatcher
from rsnotify.errors import RsNotifyError
from rsnotify.fetch import Fetcher
from rsnotify.metrics import serving
from rsnotify.subscriber.applier import Applier
from rsnotify.subscriber.cursor import Checkpoint, CursorStore
from rsnotify.subscriber.gaps import GapDetector
from rsnotify.subscriber.sync import CollectionSync, _Pending
from tests.devstack import async_wait_for

from .test_applier import Env, Source


async def _full_disk(path: Path) -> CursorStore:
    """A cursor store whose every save fails the way a full disk does (a real SQLite error)."""
    cursors = CursorStore(path)
    assert await cursors.get("x") is None  # the schema exists now
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TRIGGER full BEFORE INSERT ON cursor "
        "BEGIN SELECT RAISE(FAIL, 'database or disk is full'); END"
    )
    db.commit()
    db.close()
    return cursors


@pytest.mark.timeout(30)
async def test_a_cursor_that_cannot_be_saved_stops_the_engine_instead_of_hanging(
    tmp_path: Path,
) -> None:
    """disk-full scenario: the subscriber hung for good once the disk had room again.

    The commit loop saves the cursor; when that save failed (``database or
    disk is full``) the loop's task ended with the exception, nobody noticed,
    and the catch-up's ``drain()`` waited for it forever.  Now the failure
    stops the pipeline like any local failure, so the engine restarts from its
    durable cursor.  The failing save is a real SQLite error (a trigger).
    """
    cursors = await _full_disk(tmp_path / "cursor.sqlite3")
    try:
        engine = CollectionSync(
            collection="c",
            capability_list="http://example.org/c/capabilitylist.xml",
            watcher=_idle_watcher("c"),
            applier=None,  # type: ignore[arg-type]
            cursors=cursors,
            detector=GapDetector(),
        )
        engine._committer = asyncio.create_task(engine._commit_loop())
        engine._pending.append(_Pending(None, 1, Checkpoint()))
        with pytest.raises(Exception, match="disk is full"):
            await asyncio.wait_for(engine.drain(), timeout=10)
        assert engine.failure is not None
    finally:
        await cursors.close()


@pytest.fixture
async def shared_env(tmp_path: Path) -> AsyncIterator[Env]:
    """A real Source on a loopback port and one Env (mirror, store, fetcher) over it."""
    source = Source()
    async with serving(source.app) as base, Fetcher() as fetcher:
        source.base = base
        env = Env(tmp_path, source, fetcher)
        try:
            yield env
        finally:
            for gate in source.gates.values():
                gate.set()
            await env.store.close()


def _idle_watcher(name: str) -> CollectionWatcher:
    """A real watcher that is never polled here (nothing is fetched); the engine pins it."""
    return CollectionWatcher(
        access=DirectoryAccess(Path("/nonexistent")),
        collection=name,
        capability_list=f"http://example.org/{name}/capabilitylist.xml",
        changelist_url=f"http://example.org/{name}/changelist.xml",
        checkpoint=Checkpoint(),
    )


def _engine(name: str, applier: Applier, cursors: CursorStore) -> CollectionSync:
    return CollectionSync(
        collection=name,
        capability_list=f"http://example.org/{name}/capabilitylist.xml",
        watcher=_idle_watcher(name),
        applier=applier,
        cursors=cursors,
        detector=GapDetector(),
    )


@pytest.mark.timeout(60)
async def test_one_collections_local_failure_leaves_the_other_collections_changes_alone(
    shared_env: Env, tmp_path: Path
) -> None:
    """disk-full scenario, second finding: a collection hung at ``gap: start-up`` for good.

    Every collection of a subscriber shares one applier.  When collection A
    stopped on a local failure, its ``close()`` abandoned *every* change in
    the applier, collection B's included; B's commit loop then died of the
    cancellation without a word and B's next ``drain()`` waited forever.
    Now A abandons only its own changes and B's change completes.
    """
    env, source = shared_env, shared_env.source
    gate = source.gates["/b"] = asyncio.Event()
    source.files["/a"], source.files["/b"] = b"a", b"b"
    applier = env.applier()
    good = CursorStore(tmp_path / "b.sqlite3")
    bad = await _full_disk(tmp_path / "a.sqlite3")
    a, b = _engine("a", applier, bad), _engine("b", applier, good)
    try:
        for engine in (a, b):
            engine._committer = asyncio.create_task(engine._commit_loop())
        b_note = env.note("/b", body=b"b")
        b._submit_pushed(b_note)
        await async_wait_for(lambda: "/b" in source.requests, timeout=10)  # B is mid-fetch
        a_note = env.note("/a", body=b"a")
        a._submit_pushed(a_note)
        with pytest.raises(Exception, match="disk is full"):
            await asyncio.wait_for(a.drain(), timeout=10)
        await asyncio.wait_for(a.close(), timeout=10)  # what the service does before a restart
        b_future = b._pending[0].future
        assert b_future is not None and not b_future.cancelled()
        gate.set()
        await asyncio.wait_for(b.drain(), timeout=20)
        assert env.path("/b").read_bytes() == b"b"
        assert b.applied_seq == b_note.seq and b.stats.applied == 1
    finally:
        gate.set()
        for engine in (a, b):
            await engine.close()
        await good.close()
        await bad.close()


@pytest.mark.timeout(60)
async def test_a_change_cancelled_under_the_engine_stops_it_instead_of_hanging(
    shared_env: Env, tmp_path: Path
) -> None:
    """Whatever cancels a submitted change, ``drain()`` ends with an error, never waits forever."""
    env, source = shared_env, shared_env.source
    source.gates["/held"] = asyncio.Event()
    source.files["/held"] = b"held"
    cursors = CursorStore(tmp_path / "cursor.sqlite3")
    engine = _engine("c", env.applier(), cursors)
    try:
        engine._committer = asyncio.create_task(engine._commit_loop())
        note = env.note("/held", body=b"held")
        engine._submit_pushed(note)
        await async_wait_for(lambda: "/held" in source.requests, timeout=10)
        future = engine._pending[0].future
        assert future is not None
        future.cancel()
        with pytest.raises(RsNotifyError, match="cancelled before it was applied"):
            await asyncio.wait_for(engine.drain(), timeout=10)
        assert engine.applied_seq is None  # the cursor did not pass the cancelled change
    finally:
        await engine.close()
        await cursors.close()
