"""The subscriber's durable position per collection, and the one-process lock.

A cursor is (last sequence number applied, the tracker checkpoint of the last
change applied: its time and the identities at that time, whether the
baseline is done).  The checkpoint is what makes catch-up from the Change
List Index exact; the sequence number is what push gap detection counts.
Both advance only after the changes they cover are applied, in one SQLite
transaction, so a crash re-applies at most a few changes, which is a no-op.

Two subscribers writing into one mirror would corrupt it, so the state
directory holds an ``flock``-ed lock file naming the owner's pid.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import AlreadyRunning as AlreadyRunning  # re-exported: its old home
from ..sqlitedb import SQLiteWorker
from ..tracker import Checkpoint

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cursor (
  collection TEXT PRIMARY KEY,
  capabilitylist TEXT NOT NULL,
  last_seq INTEGER,
  checkpoint TEXT NOT NULL,
  baseline_done INTEGER NOT NULL DEFAULT 0,
  updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  time REAL NOT NULL,
  collection TEXT NOT NULL,
  kind TEXT NOT NULL,
  detail TEXT NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Cursor:
    collection: str
    capabilitylist: str
    last_seq: int | None
    checkpoint: Checkpoint
    baseline_done: bool


class Cursors(Protocol):
    """Where a collection's cursor is kept: :class:`CursorStore` (SQLite, the
    default) or ``redis_cursor.RedisCursorStore`` (``--redis``); all a
    collection's sync needs of either."""

    async def get(self, collection: str) -> Cursor | None: ...

    async def put(self, cursor: Cursor) -> None: ...


class StateLock:
    """An exclusive, non-blocking ``flock`` on ``<state>/lock``; released on close or exit."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunning(
                f"another rsnotify subscribe (pid {owner}) is using the state in {self.path.parent}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the flock
            self._fd = None


class CursorStore:
    def __init__(self, path: str | Path) -> None:
        self._db = SQLiteWorker(path, _SCHEMA)

    def _get(self, collection: str) -> Cursor | None:
        row = self._db.db.execute(
            "SELECT capabilitylist, last_seq, checkpoint, baseline_done FROM cursor "
            "WHERE collection=?",
            (collection,),
        ).fetchone()
        if row is None:
            return None
        return Cursor(collection, row[0], row[1], Checkpoint.from_json(row[2]), bool(row[3]))

    def _put(self, cursor: Cursor) -> None:
        self._db.db.execute(
            "INSERT INTO cursor(collection, capabilitylist, last_seq, checkpoint, baseline_done, "
            "updated) VALUES (?,?,?,?,?,?) ON CONFLICT(collection) DO UPDATE SET "
            "capabilitylist=excluded.capabilitylist, last_seq=excluded.last_seq, "
            "checkpoint=excluded.checkpoint, baseline_done=excluded.baseline_done, "
            "updated=excluded.updated",
            (
                cursor.collection,
                cursor.capabilitylist,
                cursor.last_seq,
                cursor.checkpoint.to_json(),
                int(cursor.baseline_done),
                time.time(),
            ),
        )

    def _event(self, collection: str, kind: str, detail: str) -> None:
        self._db.db.execute(
            "INSERT INTO events(time, collection, kind, detail) VALUES (?,?,?,?)",
            (time.time(), collection, kind, detail),
        )

    def _events(self, limit: int) -> list[tuple[float, str, str, str]]:
        return self._db.db.execute(
            "SELECT time, collection, kind, detail FROM events ORDER BY id DESC LIMIT ?", (limit,)
        ).fetchall()

    async def get(self, collection: str) -> Cursor | None:
        return await self._db.run(self._get, collection)

    async def put(self, cursor: Cursor) -> None:
        await self._db.run(self._put, cursor)

    async def event(self, collection: str, kind: str, detail: str) -> None:
        """Record a gap, catch-up, reconnect or refusal for audits and the dashboard."""
        await self._db.run(self._event, collection, kind, detail)

    async def events(self, limit: int = 100) -> list[tuple[float, str, str, str]]:
        return await self._db.run(self._events, limit)

    async def close(self) -> None:
        await self._db.close()
