"""The one SQLite worker every local store uses: durable settings, one thread, clean ends."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from rsnotify import sqlitedb
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


# --- reads in one step ---------------------------------------------------------------

_ODD_TEXTS = [
    "plain",
    'quote " and \\ backslash',
    "tab\tnewline\ncontrol\x01",
    "unicode é 漢字 \U0001f600",
    "",
]


def _odd_table(db: sqlite3.Connection) -> list[tuple[object, ...]]:
    db.execute("CREATE TABLE odd (k TEXT PRIMARY KEY, n INTEGER, t TEXT)")
    rows: list[tuple[object, ...]] = [
        (f"k{i}", n, t)
        for i, (n, t) in enumerate(
            [(2**63 - 1, _ODD_TEXTS[0]), (-(2**63), _ODD_TEXTS[1]), (0, None), (None, "x")]
            + [(i, text) for i, text in enumerate(_ODD_TEXTS)]
        )
    ]
    db.executemany("INSERT INTO odd VALUES (?, ?, ?)", rows)
    return rows


@pytest.mark.parametrize("json_rows", [True, False])
def test_select_rows_gives_the_rows_a_plain_select_gives(
    json_rows: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TEXT (quotes, control characters, any Unicode), INTEGER at both ends of 64 bits
    and NULL come back as they went in, through JSON and through the row-per-step way."""
    monkeypatch.setattr(sqlitedb, "JSON_ROWS", json_rows)
    db = sqlite3.connect(":memory:")
    rows = _odd_table(db)
    got = sqlitedb.select_rows(db, "k, n, t", "FROM odd")
    assert sorted(map(tuple, got), key=str) == sorted(rows, key=str)
    assert sqlitedb.select_rows(db, "k", "FROM odd WHERE n > ?", (10**6,)) == [["k0"]]
    assert sqlitedb.select_rows(db, "k, n", "FROM odd WHERE k = ?", ("none",)) == []


def test_select_in_reads_every_chunk_each_in_one_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """One statement per chunk of keys, its rows as one value: the worker thread gives
    the interpreter lock away once per chunk, not once per row (select_rows)."""
    monkeypatch.setattr(sqlitedb, "IN_CHUNK", 3)
    db = sqlite3.connect(":memory:")
    rows = _odd_table(db)
    statements: list[str] = []
    db.set_trace_callback(statements.append)
    keys = [str(row[0]) for row in rows] + ["absent", "k1"]  # unknown and repeated keys
    got = sqlitedb.select_in(db, "k, n, t", "odd", "k", keys)
    assert set(map(tuple, got)) == set(rows)
    assert len(statements) == -(-len(keys) // 3)
    assert all(s.startswith("SELECT json_group_array(json_array(k, n, t))") for s in statements)
    assert sqlitedb.select_in(db, "k", "odd", "k", []) == []


def test_select_rows_reads_a_row_per_step_where_sqlite_has_no_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An SQLite built without its JSON functions answers "no such function": the rows
    are read the usual way; any other error is the caller's."""
    db = sqlite3.connect(":memory:")
    rows = _odd_table(db)
    real = db.execute

    class NoJson:
        def execute(self, sql: str, args: object = ()) -> sqlite3.Cursor:
            if "json_" in sql:
                raise sqlite3.OperationalError("no such function: json_group_array")
            return real(sql, args)  # type: ignore[arg-type]

        def getlimit(self, category: int) -> int:
            return db.getlimit(category)

    fake = NoJson()
    got = sqlitedb.select_rows(fake, "k, n, t", "FROM odd")  # type: ignore[arg-type]
    assert sorted(map(tuple, got), key=str) == sorted(rows, key=str)
    with pytest.raises(sqlite3.OperationalError, match="no such column"):
        sqlitedb.select_rows(db, "nope", "FROM odd")
