"""Regression tests for what the chaos matrix (tests/chaos/) found in rsnotify itself."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from rsnotify.subscriber.cursor import Checkpoint, CursorStore
from rsnotify.subscriber.gaps import GapDetector
from rsnotify.subscriber.sync import CollectionSync, _Pending


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
    path = tmp_path / "cursor.sqlite3"
    cursors = CursorStore(path)
    try:
        assert await cursors.get("c") is None  # the schema exists now
        db = sqlite3.connect(path)
        db.execute(
            "CREATE TRIGGER full BEFORE INSERT ON cursor "
            "BEGIN SELECT RAISE(FAIL, 'database or disk is full'); END"
        )
        db.commit()
        db.close()
        engine = CollectionSync(
            collection="c",
            capability_list="http://example.org/c/capabilitylist.xml",
            watcher=None,  # type: ignore[arg-type]  # not reached: nothing is fetched
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
