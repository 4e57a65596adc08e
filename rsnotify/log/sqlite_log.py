"""Embedded SQLite backend of the notification log: one file, nothing to install.

For a single small Source run by one publisher process.  Same semantics as
the Redis backend: atomic append-with-checkpoint, dense sequence numbers kept
apart from the retained entries, forward-only cursors, fencing.  The database
runs in WAL mode with ``synchronous=FULL``: a committed append survives a
``kill -9`` and a power cut.

All SQLite calls run on one worker thread (:class:`~rsnotify.sqlitedb.SQLiteWorker`),
so the event loop never blocks on an fsync and the connection is only ever
used from the thread that owns it.
Waiting readers in the same process are woken by appends; readers in another
process (a second gateway on the same file) fall back to polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..sqlitedb import SQLiteWorker, StoreUnavailable
from . import Fenced, LogConflict, LogRecord, LogUnavailable, NotificationLog, Retention

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
  collection TEXT PRIMARY KEY,
  head INTEGER NOT NULL DEFAULT 0,
  checkpoint TEXT,
  fence INTEGER NOT NULL DEFAULT 0,
  capabilitylist TEXT
);
CREATE TABLE IF NOT EXISTS log (
  collection TEXT NOT NULL,
  seq INTEGER NOT NULL,
  data BLOB NOT NULL,
  logged_ms INTEGER NOT NULL,
  PRIMARY KEY (collection, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cursors (
  collection TEXT NOT NULL,
  name TEXT NOT NULL,
  seq INTEGER NOT NULL,
  PRIMARY KEY (collection, name)
) WITHOUT ROWID;
"""

POLL_INTERVAL = 0.2  # cross-process readers


class SQLiteLog(NotificationLog):
    """The log in a local SQLite file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._sql = SQLiteWorker(path, _SCHEMA, thread_name="rsnotify-sqlite")
        self._appended: asyncio.Condition | None = None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await self._sql.run(fn, *args)
        except StoreUnavailable as exc:  # locked, disk I/O error, disk full, closed
            raise LogUnavailable(f"SQLite log {exc}") from None

    def _condition(self) -> asyncio.Condition:
        if self._appended is None:
            self._appended = asyncio.Condition()
        return self._appended

    # -- worker-thread functions ------------------------------------------------

    def _head(self, collection: str) -> int:
        row = self._sql.db.execute(
            "SELECT head FROM meta WHERE collection=?", (collection,)
        ).fetchone()
        return int(row[0]) if row else 0

    def _append(
        self,
        collection: str,
        payloads: Sequence[bytes],
        expected_head: int,
        checkpoint: str,
        fence: int | None,
        max_len: int | None,
        logged_ms: int | None = None,
    ) -> int:
        db = self._sql.db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute(
                "SELECT head, fence FROM meta WHERE collection=?", (collection,)
            ).fetchone()
            head, current_fence = (int(row[0]), int(row[1])) if row else (0, 0)
            if head != expected_head:
                raise LogConflict(f"{collection}: head is {head}, expected {expected_head}")
            if fence is not None and fence < current_fence:
                raise Fenced(f"{collection}: fencing token {fence} is stale")
            now = int(time.time() * 1000) if logged_ms is None else logged_ms
            db.executemany(
                "INSERT INTO log(collection, seq, data, logged_ms) VALUES (?,?,?,?)",
                [(collection, head + i, p, now) for i, p in enumerate(payloads, start=1)],
            )
            head += len(payloads)
            db.execute(
                "INSERT INTO meta(collection, head, checkpoint, fence) VALUES (?,?,?,?) "
                "ON CONFLICT(collection) DO UPDATE SET head=excluded.head, "
                "checkpoint=excluded.checkpoint, fence=MAX(meta.fence, excluded.fence)",
                (collection, head, checkpoint, fence or 0),
            )
            if max_len is not None:
                db.execute(
                    "DELETE FROM log WHERE collection=? AND seq<=?", (collection, head - max_len)
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return head

    def _read(self, collection: str, after: int, limit: int) -> list[LogRecord]:
        rows = self._sql.db.execute(
            "SELECT seq, data, logged_ms FROM log "
            "WHERE collection=? AND seq>? ORDER BY seq LIMIT ?",
            (collection, after, limit),
        ).fetchall()
        return [LogRecord(seq=int(s), data=bytes(d), logged_ms=int(t)) for s, d, t in rows]

    def _earliest(self, collection: str) -> int:
        # One statement, so one snapshot: another process's append committed
        # between two would make an empty log's earliest skip its first entry.
        row = self._sql.db.execute(
            "SELECT COALESCE((SELECT MIN(seq) FROM log WHERE collection=?),"
            " (SELECT head FROM meta WHERE collection=?) + 1, 1)",
            (collection, collection),
        ).fetchone()
        return int(row[0])

    def _trim(self, collection: str, retention: Retention, now_ms: int) -> int:
        db = self._sql.db
        if retention.max_len is not None:
            head = self._head(collection)
            db.execute(
                "DELETE FROM log WHERE collection=? AND seq<=?",
                (collection, head - retention.max_len),
            )
        if retention.max_age_s is not None:
            cutoff = now_ms - int(retention.max_age_s * 1000)
            db.execute("DELETE FROM log WHERE collection=? AND logged_ms<?", (collection, cutoff))
        return self._earliest(collection)

    def _cursor(self, collection: str, name: str) -> int:
        row = self._sql.db.execute(
            "SELECT seq FROM cursors WHERE collection=? AND name=?", (collection, name)
        ).fetchone()
        return int(row[0]) if row else 0

    def _set_cursor(self, collection: str, name: str, seq: int) -> None:
        self._sql.db.execute(
            "INSERT INTO cursors(collection, name, seq) VALUES (?,?,?) "
            "ON CONFLICT(collection, name) DO UPDATE SET seq=MAX(cursors.seq, excluded.seq)",
            (collection, name, seq),
        )

    def _checkpoint(self, collection: str) -> str | None:
        row = self._sql.db.execute(
            "SELECT checkpoint FROM meta WHERE collection=?", (collection,)
        ).fetchone()
        return row[0] if row else None

    def _collections(self) -> dict[str, str]:
        rows = self._sql.db.execute(
            "SELECT collection, capabilitylist FROM meta WHERE capabilitylist IS NOT NULL"
        ).fetchall()
        return {c: u for c, u in rows}

    def _register(self, collection: str, capability_list: str) -> None:
        self._sql.db.execute(
            "INSERT INTO meta(collection, capabilitylist) VALUES (?,?) "
            "ON CONFLICT(collection) DO UPDATE SET capabilitylist=excluded.capabilitylist",
            (collection, capability_list),
        )

    # -- the interface ----------------------------------------------------------

    async def head(self, collection: str) -> int:
        return await self._run(self._head, collection)

    async def earliest(self, collection: str) -> int:
        return await self._run(self._earliest, collection)

    async def append(
        self,
        collection: str,
        payloads: Sequence[bytes],
        *,
        expected_head: int,
        checkpoint: str,
        fence: int | None = None,
        max_len: int | None = None,
        logged_ms: int | None = None,
    ) -> int:
        head = await self._run(
            self._append,
            collection,
            list(payloads),
            expected_head,
            checkpoint,
            fence,
            max_len,
            logged_ms,
        )
        if payloads:
            condition = self._condition()
            async with condition:
                condition.notify_all()
        return head

    async def checkpoint(self, collection: str) -> str | None:
        return await self._run(self._checkpoint, collection)

    async def read(self, collection: str, after: int, limit: int = 1000) -> list[LogRecord]:
        return await self._run(self._read, collection, after, limit)

    async def wait(
        self, collection: str, after: int, timeout: float, limit: int = 1000
    ) -> list[LogRecord]:
        deadline = asyncio.get_running_loop().time() + timeout
        condition = self._condition()
        while True:
            records = await self.read(collection, after, limit)
            remaining = deadline - asyncio.get_running_loop().time()
            if records or remaining <= 0:
                return records
            async with condition:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                # cancellation that lands as the wait ends, hanging shutdown.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, POLL_INTERVAL)):
                        await condition.wait()

    async def trim(self, collection: str, retention: Retention, now_ms: int) -> int:
        return await self._run(self._trim, collection, retention, now_ms)

    async def cursor(self, collection: str, name: str) -> int:
        return await self._run(self._cursor, collection, name)

    async def set_cursor(self, collection: str, name: str, seq: int) -> None:
        await self._run(self._set_cursor, collection, name, seq)

    async def collections(self) -> dict[str, str]:
        return await self._run(self._collections)

    async def register(self, collection: str, capability_list: str) -> None:
        await self._run(self._register, collection, capability_list)

    async def close(self) -> None:
        await self._sql.close()
