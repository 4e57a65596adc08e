"""What the Destination has applied, per resource, durably: the applier's memory.

The applier asks this store one question before touching a resource: "what is
the newest change of this ``loc`` already applied?"  That answer is what makes
applying a change idempotent and keeps an older change from overwriting a
newer one, across restarts, whichever path (push, log replay, Change List
walk) delivers the change.  Deletes are remembered too, so a late "created"
cannot resurrect a deleted resource.

Next to the per-resource state sits an append-only apply log: one row per
outcome, written in the same transaction as the state.  Operators use it to see
why a resource is missing or stale; tests use it to prove that no resource was
ever overwritten by an older version.

SQLite in WAL mode with ``synchronous=FULL``: a recorded apply survives
``kill -9`` and a power cut.  Every call runs on one worker thread (the
connection's owner), so the event loop never waits on an fsync.  Times are
stored as integer microseconds since the epoch so comparisons are exact.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from ..errors import RsNotifyError
from ..model import ChangeType

__all__ = ["ApplyRecord", "ResourceState", "ResourceStore", "ResourceStoreError"]

T = TypeVar("T")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS resources (
  loc TEXT PRIMARY KEY,
  change TEXT NOT NULL,
  datetime_us INTEGER NOT NULL,
  seq INTEGER,
  sha256 TEXT,
  length INTEGER,
  applied_us INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS apply_log (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  loc TEXT NOT NULL,
  change TEXT NOT NULL,
  datetime_us INTEGER NOT NULL,
  seq INTEGER,
  applied_us INTEGER NOT NULL,
  sha256 TEXT,
  length INTEGER,
  outcome TEXT NOT NULL,
  detail TEXT
);
CREATE INDEX IF NOT EXISTS apply_log_by_loc ON apply_log(loc, id);
"""


class ResourceStoreError(RsNotifyError):
    """The resource store cannot be read or written (locked, disk full, corrupt)."""


@dataclass(frozen=True, slots=True)
class ResourceState:
    """The newest change of one ``loc`` applied to the mirror."""

    loc: str
    change: ChangeType
    datetime: datetime
    seq: int | None
    sha256: str | None
    length: int | None
    applied_at: datetime


@dataclass(frozen=True, slots=True)
class ApplyRecord:
    """One row of the apply log: a change and what became of it."""

    id: int
    loc: str
    change: ChangeType
    datetime: datetime
    seq: int | None
    applied_at: datetime
    sha256: str | None
    length: int | None
    outcome: str
    detail: str | None


def _to_us(value: datetime) -> int:
    if value.tzinfo is None:
        raise ValueError("naive datetime: rsnotify times are aware (UTC)")
    return (value - _EPOCH) // _MICROSECOND


def _from_us(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


class ResourceStore:
    """Per-resource applied state plus the apply log, in one SQLite file at ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rsnotify-resources")
        self._db: sqlite3.Connection | None = None
        self._queue: list[tuple[tuple[Any, ...], bool, asyncio.Future[bool]]] = []
        self._flusher: asyncio.Task[None] | None = None
        try:
            self._executor.submit(self._open).result()
        except sqlite3.Error as exc:
            self._executor.shutdown(wait=False)
            raise ResourceStoreError(f"resource store {self.path}: {exc}") from None

    def _open(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=5000")
            db.executescript(_SCHEMA)
        except BaseException:
            db.close()
            raise
        self._db = db

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._db is None:
            raise ResourceStoreError(f"resource store {self.path} is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
        except sqlite3.Error as exc:
            raise ResourceStoreError(f"resource store {self.path}: {exc}") from None

    # -- worker-thread functions --------------------------------------------------

    def _get(self, loc: str) -> ResourceState | None:
        assert self._db is not None
        row = self._db.execute(
            "SELECT change, datetime_us, seq, sha256, length, applied_us "
            "FROM resources WHERE loc=?",
            (loc,),
        ).fetchone()
        if row is None:
            return None
        change, when, seq, sha256, length, applied = row
        return ResourceState(
            loc=loc,
            change=ChangeType(change),
            datetime=_from_us(when),
            seq=seq,
            sha256=sha256,
            length=length,
            applied_at=_from_us(applied),
        )

    def _record_many(self, batch: list[tuple[tuple[Any, ...], bool]]) -> list[bool]:
        """Write a batch of rows in one transaction: one fsync for all of them."""
        db = self._db
        assert db is not None
        results: list[bool] = []
        db.execute("BEGIN IMMEDIATE")
        try:
            for row, update_state in batch:
                loc, change, when, seq, applied, sha256, length = row[:7]
                changed = False
                if update_state:
                    # The guard makes the store itself refuse to move a resource
                    # backwards in time, whatever the caller checked before.
                    cursor = db.execute(
                        "INSERT INTO resources(loc, change, datetime_us, seq, sha256, length, "
                        "applied_us) VALUES (?,?,?,?,?,?,?) "
                        "ON CONFLICT(loc) DO UPDATE SET change=excluded.change, "
                        "datetime_us=excluded.datetime_us, seq=excluded.seq, "
                        "sha256=excluded.sha256, length=excluded.length, "
                        "applied_us=excluded.applied_us "
                        "WHERE excluded.datetime_us >= resources.datetime_us",
                        (loc, change, when, seq, sha256, length, applied),
                    )
                    changed = cursor.rowcount > 0
                db.execute(
                    "INSERT INTO apply_log(loc, change, datetime_us, seq, applied_us, sha256, "
                    "length, outcome, detail) VALUES (?,?,?,?,?,?,?,?,?)",
                    row,
                )
                results.append(changed)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return results

    async def _record(self, row: tuple[Any, ...], update_state: bool) -> bool:
        """Queue a row for the next group commit and wait until it is durable.

        Callers that arrive while a commit is running share the next one, so
        under load one fsync covers many changes and durability is unchanged:
        nobody is told "recorded" before their row is on disk.
        """
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.append((row, update_state, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                results = await self._run(self._record_many, [(r, u) for r, u, _ in batch])
            except BaseException as exc:
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(
                            exc if isinstance(exc, Exception) else ResourceStoreError(str(exc))
                        )
                if not isinstance(exc, Exception):
                    raise
                continue
            for (_, _, future), changed in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(changed)

    def _log(self, loc: str | None, limit: int | None) -> list[ApplyRecord]:
        assert self._db is not None
        query = (
            "SELECT id, loc, change, datetime_us, seq, applied_us, sha256, length, outcome, "
            "detail FROM apply_log"
        )
        args: list[Any] = []
        if loc is not None:
            query += " WHERE loc=?"
            args.append(loc)
        query += " ORDER BY id"
        if limit is not None:
            query += " LIMIT ?"
            args.append(limit)
        return [
            ApplyRecord(
                id=row[0],
                loc=row[1],
                change=ChangeType(row[2]),
                datetime=_from_us(row[3]),
                seq=row[4],
                applied_at=_from_us(row[5]),
                sha256=row[6],
                length=row[7],
                outcome=row[8],
                detail=row[9],
            )
            for row in self._db.execute(query, args)
        ]

    def _count(self) -> int:
        assert self._db is not None
        return int(self._db.execute("SELECT COUNT(*) FROM resources").fetchone()[0])

    # -- the interface ------------------------------------------------------------

    async def get(self, loc: str) -> ResourceState | None:
        """The newest applied change of ``loc``, or None if none was ever applied."""
        return await self._run(self._get, loc)

    async def record_applied(
        self,
        loc: str,
        change: ChangeType | str,
        when: datetime,
        *,
        seq: int | None = None,
        sha256: str | None = None,
        length: int | None = None,
        outcome: str = "applied",
        detail: str | None = None,
        applied_at: datetime | None = None,
    ) -> bool:
        """Make ``change`` at ``when`` the state of ``loc`` and log it, atomically.

        The state only moves forward: if a change with a later datetime is
        already recorded, the state is kept (the log row is still written) and
        False is returned.
        """
        row = self._row(loc, change, when, seq, sha256, length, outcome, detail, applied_at)
        return await self._record(row, True)

    async def record_outcome(
        self,
        loc: str,
        change: ChangeType | str,
        when: datetime,
        *,
        outcome: str,
        seq: int | None = None,
        detail: str | None = None,
        sha256: str | None = None,
        length: int | None = None,
        applied_at: datetime | None = None,
    ) -> None:
        """Log an outcome that did not change the mirror (skipped, refused, failed)."""
        row = self._row(loc, change, when, seq, sha256, length, outcome, detail, applied_at)
        await self._record(row, False)

    @staticmethod
    def _row(
        loc: str,
        change: ChangeType | str,
        when: datetime,
        seq: int | None,
        sha256: str | None,
        length: int | None,
        outcome: str,
        detail: str | None,
        applied_at: datetime | None,
    ) -> tuple[Any, ...]:
        kind = ChangeType(change)  # ValueError for anything but created/updated/deleted
        now = applied_at if applied_at is not None else datetime.now(UTC)
        return (
            loc,
            kind.value,
            _to_us(when),
            seq,
            _to_us(now),
            sha256,
            length,
            outcome,
            detail[:2000] if detail else detail,
        )

    async def apply_log(
        self, loc: str | None = None, limit: int | None = None
    ) -> list[ApplyRecord]:
        """Apply-log rows in the order they were written, for one ``loc`` or all."""
        return await self._run(self._log, loc, limit)

    async def count(self) -> int:
        """How many resources have a recorded state (deleted ones included)."""
        return await self._run(self._count)

    async def close(self) -> None:
        """Close the database and its worker thread; idempotent."""
        if self._flusher is not None and not self._flusher.done():
            await self._flusher
        if self._db is not None:
            db, self._db = self._db, None
            await asyncio.get_running_loop().run_in_executor(self._executor, db.close)
        self._executor.shutdown(wait=True)
