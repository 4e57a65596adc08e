"""The one SQLite worker every local store uses: durable settings, one thread, clean ends."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from rsnotify.log import LogUnavailable
from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.sqlitedb import SQLiteWorker, StoreUnavailable
from rsnotify.subscriber.cursor import CursorStore
from rsnotify.subscriber.resources import ResourceStore, ResourceStoreError
from rsnotify.transport.websubstore import SQLiteStore

SCHEMA = "CREATE TABLE IF NOT EXISTS t (x INTEGER);"


def _threads(prefix: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]


async def test_every_call_runs_on_one_thread_with_durable_settings(tmp_path: Path) -> None:
    worker = SQLiteWorker(tmp_path / "db.sqlite3", SCHEMA, thread_name="test-worker")
    try:
        names = {await worker.run(lambda: threading.current_thread().name) for _ in range(5)}
        assert len(names) == 1 and next(iter(names)).startswith("test-worker")
        mode = await worker.run(lambda: worker.db.execute("PRAGMA journal_mode").fetchone()[0])
        sync = await worker.run(lambda: worker.db.execute("PRAGMA synchronous").fetchone()[0])
        assert (mode, sync) == ("wal", 2)  # 2: FULL
    finally:
        await worker.close()


async def test_migrate_runs_after_the_schema(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    def migrate(db: sqlite3.Connection) -> None:
        seen.append([row[1] for row in db.execute("PRAGMA table_info(t)")])
        db.execute("ALTER TABLE t ADD COLUMN y TEXT")

    worker = SQLiteWorker(tmp_path / "db.sqlite3", SCHEMA, migrate=migrate)
    try:
        assert seen == [["x"]]
        columns = await worker.run(
            lambda: [r[1] for r in worker.db.execute("PRAGMA table_info(t)")]
        )
        assert columns == ["x", "y"]
    finally:
        await worker.close()


async def test_a_closed_worker_refuses_calls_and_closes_once(tmp_path: Path) -> None:
    worker = SQLiteWorker(tmp_path / "db.sqlite3", SCHEMA, thread_name="test-closed")
    await worker.run(lambda: worker.db.execute("INSERT INTO t VALUES (1)"))
    await worker.close()
    await worker.close()
    assert worker.closed
    assert _threads("test-closed") == []
    with pytest.raises(StoreUnavailable, match="is closed"):
        await worker.run(lambda: None)


def test_a_file_that_cannot_be_opened_leaves_no_thread(tmp_path: Path) -> None:
    with pytest.raises(sqlite3.Error):
        SQLiteWorker(tmp_path, SCHEMA, thread_name="test-unopenable")  # a directory
    assert _threads("test-unopenable") == []


async def test_operational_errors_become_store_unavailable(tmp_path: Path) -> None:
    worker = SQLiteWorker(tmp_path / "db.sqlite3", SCHEMA)
    try:
        with pytest.raises(StoreUnavailable, match="no such table"):
            await worker.run(lambda: worker.db.execute("SELECT * FROM missing"))
    finally:
        await worker.close()


async def test_every_store_speaks_its_own_error_through_the_one_worker(tmp_path: Path) -> None:
    """Closed stores say so in their own terms; none keeps a thread of its own."""
    log = SQLiteLog(tmp_path / "log.sqlite3")
    resources = ResourceStore(tmp_path / "resources.sqlite3")
    cursors = CursorStore(tmp_path / "cursor.sqlite3")
    websub = SQLiteStore(tmp_path / "websub.sqlite3")
    for store in (log, resources, cursors, websub):
        await store.close()
    with pytest.raises(LogUnavailable, match=r"SQLite log .*log\.sqlite3 is closed"):
        await log.head("c")
    with pytest.raises(ResourceStoreError, match=r"resource store .*resources\.sqlite3 is closed"):
        await resources.get("http://example.org/a")
    with pytest.raises(StoreUnavailable, match=r"cursor\.sqlite3 is closed"):
        await cursors.get("c")
    with pytest.raises(LogUnavailable, match=r"WebSub store .*websub\.sqlite3 is closed"):
        await websub.load()
    for prefix in ("rsnotify-sqlite", "rsnotify-resources", "rsnotify-db"):
        assert _threads(prefix) == []
