"""What the Destination has applied, per resource, durably: the applier's memory.

The applier asks this store one question before touching a resource: "what is
the newest change of this ``loc`` already applied?"  That answer is what makes
applying a change idempotent and keeps an older change from overwriting a
newer one, across restarts, whichever path (push, log replay, Change List
walk) delivers the change.  Deletes are remembered too, so a late "created"
cannot resurrect a deleted resource.

A state written from a change nobody vouched for (pushed without a
signature, or dated beyond the allowed clock skew) is *provisional*
(``confirmed`` = 0): its datetime may be forged, so it never stops an older
change from being re-checked, and the guard lets any later write replace it.
When the Source's own Change List lists exactly that change, it is confirmed
in place (see :mod:`.trust`).

Next to the per-resource state sits an append-only apply log: one row per
outcome, written in the same transaction as the state.  Operators use it to see
why a resource is missing or stale; tests use it to prove that no resource was
ever overwritten by an older version.  It is history, not state: nothing
decides from it, so it is bounded.  The newest ``log_rows`` rows are kept
(``rsnotify subscribe --apply-log-rows``, a million by default: ~150 bytes a
row, ~150 MB; 0 keeps every row); older ones are deleted a tenth of the bound
at a time, after the commit that passed it, so that a Destination following
a busy Source for months does not fill its disk with the log.

The log has no index but its id: it is written far more than read.  An index
on ``loc`` (which it had until the catch-up work of issue 21) made each row a
random insert into a B-tree of URLs, and each transaction rewrote the pages
those touched: 50,000 rows in 50 transactions onto a log of 100,000 took
3.0-3.3 s with it against 0.24-0.32 s without (``synchronous=FULL``), most
of a metadata-only catch-up's store work.  A question about one resource
(:meth:`ResourceStore.apply_log` with ``loc``, or an operator's ``SELECT``)
reads the whole log instead: 0.34 s for 2 million rows (300 MB, in the page
cache).  The old index is dropped when a store is opened; an index of another
name that an operator made stays.

SQLite in WAL mode with ``synchronous=FULL``: a recorded apply survives
``kill -9`` and a power cut.  Every call runs on one worker thread (a
:class:`~rsnotify.sqlitedb.SQLiteWorker`), so the event loop never waits on an
fsync.  Times are stored as integer microseconds since the epoch so
comparisons are exact.

A catch-up submits tens of thousands of changes at once, and a thread round
trip per question would dominate it.  So writes are group-committed, reads
that arrive together are answered by one query, and recent answers are kept
in a bounded write-through cache.  The cache is coherent because the store is
the only writer of its file (one subscriber per DIR, enforced by a lock) and
it is updated only after a commit, with the same "never backwards" rule the
database applies.

Why one module of ~710 lines: it is one store, and its parts keep one
invariant together -- the cache never disagrees with the database.  The
group commit, the batched reads, the write-through cache and the worker
thread that owns the connection share the same queues, and the cache takes a
write only once it is committed and only if the database's "never backwards"
rule let it change the state (:meth:`ResourceStore._remember_write`); split
apart, that coherence would rest on callers.  The rules about *which* change
may be applied are not here: they are :mod:`.rules` and :mod:`.trust`.
"""

from __future__ import annotations

import asyncio
import datetime as dt  # for classes with a field named datetime
import logging
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from ..errors import ResourceStoreError
from ..model import ChangeType
from ..sqlitedb import SQLiteWorker, StoreUnavailable, select_in, select_rows
from .storewrites import APPLY, CONFIRM, KEEP, prune_log, record_many

__all__ = [
    "APPLY",
    "CONFIRM",
    "KEEP",
    "ApplyRecord",
    "ResourceState",
    "ResourceStore",
    "ResourceStoreError",
    "state_of_row",
    "to_us",
]

T = TypeVar("T")

CACHE_SIZE = 20_000  # resource states kept in memory (~350 bytes each with the key)
# Apply-log rows kept by default (``rsnotify subscribe --apply-log-rows``): about
# 150 MB of log, a day of outcomes at 10 changes/s (see the module's docstring).
LOG_ROWS = 1_000_000

log = logging.getLogger("rsnotify.subscribe")

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
  applied_us INTEGER NOT NULL,
  confirmed INTEGER NOT NULL DEFAULT 1,
  collection TEXT
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
  detail TEXT,
  confirmed INTEGER NOT NULL DEFAULT 1
);
"""


@dataclass(frozen=True, slots=True)
class ResourceState:
    """The newest change of one ``loc`` applied to the mirror.

    ``confirmed`` is False for a *provisional* state: one written from a
    notification nobody vouched for (pushed without a signature, or dated
    beyond the allowed clock skew).  Its datetime may be a forgery, so it
    never makes another change look older (see :mod:`.trust`).
    """

    loc: str
    change: ChangeType
    datetime: dt.datetime
    seq: int | None
    sha256: str | None
    length: int | None
    applied_at: dt.datetime
    confirmed: bool = True


@dataclass(frozen=True, slots=True)
class ApplyRecord:
    """One row of the apply log: a change and what became of it."""

    id: int
    loc: str
    change: ChangeType
    datetime: dt.datetime
    seq: int | None
    applied_at: dt.datetime
    sha256: str | None
    length: int | None
    outcome: str
    detail: str | None
    confirmed: bool = True


_CHANGE_TYPES = {kind.value: kind for kind in ChangeType}  # a row's change, without Enum's call


def to_us(value: datetime) -> int:
    """``value`` (aware) as integer microseconds since the epoch: how the store keeps times."""
    if value.tzinfo is None:
        raise ValueError("naive datetime: rsnotify times are aware (UTC)")
    return (value - _EPOCH) // _MICROSECOND


def _from_us(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


# The columns a ResourceState is read from, in the order _state_of takes them.
_STATE_COLUMNS = "loc, change, datetime_us, seq, sha256, length, applied_us, confirmed"


def _state_of(row: Sequence[Any]) -> ResourceState:
    """A row of :data:`_STATE_COLUMNS` as a state."""
    loc, change, when, seq, sha256, length, applied, confirmed = row
    return ResourceState(
        loc=loc,
        change=ChangeType(change),
        datetime=_from_us(when),
        seq=seq,
        sha256=sha256,
        length=length,
        applied_at=_from_us(applied),
        confirmed=bool(confirmed),
    )


def state_of_row(row: tuple[Any, ...], applied_at: datetime | None = None) -> ResourceState:
    """The state a row made by :meth:`ResourceStore.row` leaves when it moves the state.

    ``applied_at``: its stamp (``row[4]``) already converted, by a caller that
    converts many rows of one batch.  For the store's cache and the batch
    recorder, which keep rows and build a state only when one is read.
    """
    loc, change, when, seq, applied, sha256, length = row[:7]
    return ResourceState(
        loc=loc,
        change=_CHANGE_TYPES[change],
        datetime=_from_us(when),
        seq=seq,
        sha256=sha256,
        length=length,
        applied_at=_from_us(applied) if applied_at is None else applied_at,
        confirmed=bool(row[9]),
    )


def _migrate(db: sqlite3.Connection) -> None:
    """Bring a store written by an older rsnotify up to this schema (idempotent).

    Before ``confirmed`` existed every state was trusted; they stay so (a
    state dated beyond the clock-skew bound is still treated as provisional
    by the applier, which undoes what a forged far-future notification did).
    """
    # Older stores indexed the log by loc: see the module's docstring for why no more.
    db.execute("DROP INDEX IF EXISTS apply_log_by_loc")
    for table in ("resources", "apply_log"):
        columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if "confirmed" not in columns:
            db.execute(f"ALTER TABLE {table} ADD COLUMN confirmed INTEGER NOT NULL DEFAULT 1")
        if table == "resources" and "collection" not in columns:
            # Unknown for rows written before: filled in by the next change of each loc.
            db.execute("ALTER TABLE resources ADD COLUMN collection TEXT")


class ResourceStore:
    """Per-resource applied state plus the apply log, in one SQLite file at ``path``."""

    def __init__(
        self, path: str | Path, *, cache_size: int = CACHE_SIZE, log_rows: int | None = LOG_ROWS
    ) -> None:
        """``log_rows``: the newest apply-log rows kept (None: every row, forever)."""
        if log_rows is not None and log_rows < 1:
            raise ValueError(f"apply-log rows must be >= 1 or None, not {log_rows}")
        self.path = Path(path)
        # The worker thread's: rows logged since the log was last trimmed.  A
        # trim is due every tenth of log_rows, and at the first write after
        # opening (a log written under a larger bound, or none, is cut then).
        self._log_rows = log_rows
        self._since_trim = 0 if log_rows is None else log_rows
        # Waiting for the next group commit: rows with what each does to its state,
        # and the future of their results (one bool for a single row, else a list).
        self._queue: list[tuple[list[tuple[tuple[Any, ...], int]], asyncio.Future[Any], bool]] = []
        self._flusher: asyncio.Task[None] | None = None
        # loc -> state (None: known absent; a row: the state a committed write
        # wrote, built when first read, see _cached); most recently used last.
        self._cache: OrderedDict[str, ResourceState | tuple[Any, ...] | None] = OrderedDict()
        self._cache_size = cache_size
        # The cache holds every state in the database (preload), so a loc it
        # lacks has none: no query for it.  Lost for good at the first eviction.
        self._complete = False
        self._preloaded = False
        self._applied_us, self._applied_at = 0, _EPOCH  # the last stamp _remember_write converted
        self._reads: dict[str, list[asyncio.Future[ResourceState | None]]] = {}
        self._reader: asyncio.Task[None] | None = None
        try:
            self._sql = SQLiteWorker(
                path, _SCHEMA, migrate=_migrate, thread_name="rsnotify-resources"
            )
        except sqlite3.Error as exc:
            raise ResourceStoreError(f"resource store {self.path}: {exc}") from None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await self._sql.run(fn, *args)
        except StoreUnavailable as exc:  # locked, disk I/O error, disk full, closed
            raise ResourceStoreError(f"resource store {exc}") from None
        except sqlite3.Error as exc:  # corrupt, or any other refusal: unusable all the same
            raise ResourceStoreError(f"resource store {self.path}: {exc}") from None

    # -- worker-thread functions --------------------------------------------------

    def _get_many(self, locs: list[str]) -> dict[str, ResourceState]:
        rows = select_in(self._sql.db, _STATE_COLUMNS, "resources", "loc", locs)
        return {row[0]: _state_of(row) for row in rows}

    def _record_many(self, batch: list[tuple[tuple[Any, ...], int]]) -> list[bool]:
        """Write a batch of rows in one transaction: one fsync for all of them.

        Then, when due, trim the apply log to its newest ``log_rows`` rows, in
        a transaction of its own: the batch is durable whatever becomes of the
        trim, and a trim that fails (the disk full) is retried at the next.
        """
        results = record_many(self._sql.db, batch)
        if self._log_rows is not None:
            self._since_trim += len(batch)
            if self._since_trim >= max(1, self._log_rows // 10):
                try:
                    removed = prune_log(self._sql.db, self._log_rows)
                except sqlite3.Error as exc:
                    log.warning("resource store %s: apply log not trimmed: %s", self.path, exc)
                else:
                    self._since_trim = 0
                    if removed:
                        log.debug(
                            "resource store %s: %d older apply-log row(s) removed (keeping %d)",
                            self.path,
                            removed,
                            self._log_rows,
                        )
        return results

    async def _record(self, row: tuple[Any, ...], update_state: int) -> bool:
        """Queue a row for the next group commit and wait until it is durable.

        Callers that arrive while a commit is running share the next one, so
        under load one fsync covers many changes and durability is unchanged:
        nobody is told "recorded" before their row is on disk.
        """
        changed: bool = await self._enqueue([(row, update_state)], single=True)
        return changed

    def _enqueue(
        self, rows: list[tuple[tuple[Any, ...], int]], *, single: bool
    ) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((rows, future, single))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return future

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            rows = [row for part, _, _ in batch for row in part] if len(batch) > 1 else batch[0][0]
            try:
                results = await self._run(self._record_many, rows)
            except BaseException as exc:
                for _, future, _ in batch:
                    if not future.done():
                        future.set_exception(
                            exc if isinstance(exc, Exception) else ResourceStoreError(str(exc))
                        )
                if not isinstance(exc, Exception):
                    raise
                continue
            for (row, update_state), changed in zip(rows, results, strict=True):
                if update_state:
                    self._remember_write(row, update_state, changed)
            start = 0
            for part, future, single in batch:
                end = start + len(part)
                if not future.done():
                    future.set_result(results[start] if single else results[start:end])
                start = end

    # -- the cache ------------------------------------------------------------------

    def _remember(self, loc: str, state: ResourceState | tuple[Any, ...] | None) -> None:
        cache = self._cache
        cache[loc] = state
        cache.move_to_end(loc)
        if len(cache) > self._cache_size:
            cache.popitem(last=False)
            self._complete = False

    def _remember_write(self, row: tuple[Any, ...], update_state: int, changed: bool) -> None:
        """Mirror a committed state write in the cache (the database decided ``changed``)."""
        loc = row[0]
        if not changed:
            # The database kept a newer state; the cached one (if any) is it.
            return
        if update_state == CONFIRM:
            cached = self._cache.get(loc)
            if isinstance(cached, tuple) and cached[1:3] == row[1:3]:
                # Still a row (a walk confirms what push wrote, mostly unread
                # since): flagged as a row, no state built to be copied.
                self._cache[loc] = (*cached[:9], 1, *cached[10:])  # in place: not a use
            elif (
                isinstance(cached, ResourceState)
                and cached.change.value == row[1]
                and to_us(cached.datetime) == row[2]
            ):
                self._cache[loc] = replace(cached, confirmed=True)
            elif cached is None:
                self._cache.pop(loc, None)  # unknown here: the next read asks the database
            # else: the cache already holds a later write of this loc
            return
        # The row itself, made a state only if it is read (_cached): a catch-up
        # writes the state of each loc batch after batch and reads almost none
        # of them back, and building them was most of its cache upkeep.
        self._remember(loc, row)

    def _cached(self, loc: str) -> ResourceState | None:
        """The cached state of ``loc`` (in the cache), built from its row on first read."""
        value = self._cache[loc]
        if not isinstance(value, tuple):
            return value
        applied = value[4]
        if applied != self._applied_us:  # a batch's rows share one stamp: converted once
            self._applied_us, self._applied_at = applied, _from_us(applied)
        state = state_of_row(value, self._applied_at)
        self._cache[loc] = state  # in place: the recency order is the reader's business
        return state

    async def _read_batch(self) -> None:
        """Answer every read queued meanwhile with one query (per chunk of locs)."""
        while self._reads:
            reads, self._reads = self._reads, {}
            try:
                found = await self._run(self._get_many, list(reads))
            except BaseException as exc:
                for futures in reads.values():
                    for future in futures:
                        if not future.done():
                            future.set_exception(
                                exc if isinstance(exc, Exception) else ResourceStoreError(str(exc))
                            )
                if not isinstance(exc, Exception):
                    raise
                continue
            for loc, futures in reads.items():
                # A write committed while this read was in flight is newer than
                # what the read saw: the cache (filled by that write) wins.
                state = self._cached(loc) if loc in self._cache else found.get(loc)
                if loc not in self._cache:
                    self._remember(loc, state)
                for future in futures:
                    if not future.done():
                        future.set_result(state)

    def _log(self, loc: str | None, limit: int | None) -> list[ApplyRecord]:
        query = (
            "SELECT id, loc, change, datetime_us, seq, applied_us, sha256, length, outcome, "
            "detail, confirmed FROM apply_log"
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
                confirmed=bool(row[10]),
            )
            for row in self._sql.db.execute(query, args)
        ]

    def _count(self) -> int:
        return int(self._sql.db.execute("SELECT COUNT(*) FROM resources").fetchone()[0])

    # -- the interface ------------------------------------------------------------

    def _all_states(self, limit: int) -> dict[str, ResourceState] | None:
        """Every state, or None when there are more than ``limit`` of them."""
        db = self._sql.db
        if int(db.execute("SELECT COUNT(*) FROM resources").fetchone()[0]) > limit:
            return None
        return {row[0]: _state_of(row) for row in select_rows(db, _STATE_COLUMNS, "FROM resources")}

    async def preload(self) -> bool:
        """Read every state into the cache if they fill at most half of it; True if so.

        For a catch-up, which reads the states of thousands of locs, many never
        recorded (created since): with every state cached, a loc the cache
        lacks has none, and no read waits for the database, where it would
        queue behind the previous batch's transaction.  Tried once per store
        (a store too large for it stays too large); writes keep the cache
        whole until the first eviction.
        """
        if self._preloaded:
            return self._complete
        self._preloaded = True
        found = await self._run(self._all_states, self._cache_size // 2)
        if found is None:
            return False
        self._complete = True  # unless filling the cache evicts something (_remember)
        for loc, state in found.items():
            if loc not in self._cache:  # a write answered meanwhile is newer
                self._remember(loc, state)
        return self._complete

    async def get(self, loc: str) -> ResourceState | None:
        """The newest applied change of ``loc``, or None if none was ever applied."""
        cache = self._cache
        if loc in cache:
            cache.move_to_end(loc)
            return self._cached(loc)
        if self._complete:
            return None
        if self._sql.closed:
            raise ResourceStoreError(f"resource store {self.path} is closed")
        future: asyncio.Future[ResourceState | None] = asyncio.get_running_loop().create_future()
        self._reads.setdefault(loc, []).append(future)
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read_batch())
        return await future

    async def get_many(self, locs: list[str]) -> dict[str, ResourceState | None]:
        """:meth:`get` for many locs: cached answers, the rest in one query per chunk."""
        answers: dict[str, ResourceState | None] = {}
        missing: list[str] = []
        for loc in locs:
            if loc in self._cache:
                answers[loc] = self._cached(loc)
            elif loc not in answers:
                missing.append(loc)
                answers[loc] = None
        if missing and not self._complete:
            found = await self._run(self._get_many, missing)
            for loc in missing:
                state = self._cached(loc) if loc in self._cache else found.get(loc)
                if loc not in self._cache:
                    self._remember(loc, state)
                answers[loc] = state
        return answers

    async def record_rows(self, rows: list[tuple[tuple[Any, ...], int]]) -> list[bool]:
        """Write rows made by :meth:`row` in one transaction, in order.

        ``(row, APPLY)`` is :meth:`record_applied`, ``(row, KEEP)`` is
        :meth:`record_outcome`, ``(row, CONFIRM)`` is :meth:`record_confirmed`;
        the result says, per row, whether the state moved.  For callers that
        already hold a whole batch (a catch-up of recorded-only changes) and
        would otherwise pay a future per row.  The rows join the next group
        commit after everything queued before them, as single rows do: a
        handful (a group of deletions at a live rate) shares a transaction
        with the rest instead of paying an fsync of its own.
        """
        if not rows:
            return []
        results: list[bool] = await self._enqueue(rows, single=False)
        return results

    def row(
        self,
        loc: str,
        change: ChangeType | str,
        when: datetime,
        *,
        outcome: str,
        seq: int | None = None,
        sha256: str | None = None,
        length: int | None = None,
        detail: str | None = None,
        applied_at: datetime | None = None,
        confirmed: bool = True,
        collection: str | None = None,
    ) -> tuple[Any, ...]:
        """An apply-log row for :meth:`record_rows`."""
        return self._row(
            loc, change, when, seq, sha256, length, outcome, detail, applied_at, confirmed,
            collection,
        )  # fmt: skip

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
        confirmed: bool = True,
        collection: str | None = None,
    ) -> bool:
        """Make ``change`` at ``when`` the state of ``loc`` and log it, atomically.

        The state only moves forward: if a change with a later datetime is
        already recorded (and that state is not provisional), the state is
        kept (the log row is still written) and False is returned.
        ``confirmed=False`` writes a provisional state (see :class:`ResourceState`).
        ``collection`` (kept when None) lets a re-baseline find what it must delete.
        """
        row = self._row(
            loc, change, when, seq, sha256, length, outcome, detail, applied_at, confirmed,
            collection,
        )  # fmt: skip
        return await self._record(row, APPLY)

    async def record_confirmed(
        self,
        loc: str,
        change: ChangeType | str,
        when: datetime,
        *,
        seq: int | None = None,
        outcome: str = "confirmed",
    ) -> bool:
        """The Source listed exactly the change a provisional state holds: trust it now.

        Nothing is fetched and the file is untouched: the bytes came from the
        Source when the provisional state was written.  Returns False if the
        state is not that change (anymore) or was already confirmed.
        """
        row = self._row(loc, change, when, seq, None, None, outcome, None, None, True, None)
        return await self._record(row, CONFIRM)

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
        confirmed: bool = True,
    ) -> None:
        """Log an outcome that did not change the mirror (skipped, refused, failed)."""
        row = self._row(
            loc, change, when, seq, sha256, length, outcome, detail, applied_at, confirmed, None
        )
        await self._record(row, KEEP)

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
        confirmed: bool,
        collection: str | None,
    ) -> tuple[Any, ...]:
        # ValueError for anything but created/updated/deleted (a member is taken as it is:
        # Enum's call is slow, and this runs for every change of a catch-up).
        kind = change if type(change) is ChangeType else ChangeType(change)
        now = applied_at if applied_at is not None else datetime.now(UTC)
        return (
            loc,
            kind.value,
            to_us(when),
            seq,
            to_us(now),
            sha256,
            length,
            outcome,
            detail[:2000] if detail else detail,
            int(confirmed),
            collection,
        )

    def _held(self, collection: str, before_us: int, unknown_too: bool) -> list[str]:
        where = (
            "FROM resources WHERE change != 'deleted' AND datetime_us < ? "
            "AND (collection = ?" + (" OR collection IS NULL)" if unknown_too else ")")
        )
        return [row[0] for row in select_rows(self._sql.db, "loc", where, (before_us, collection))]

    async def held(
        self, collection: str, *, before: datetime, unknown_too: bool = False
    ) -> list[str]:
        """Locs of ``collection`` the mirror holds from changes dated before ``before``.

        What a re-baseline compares with the new Resource List: those it no
        longer lists were deleted meanwhile.  ``unknown_too`` includes states
        written before the collection was recorded (safe when a subscriber
        follows one collection only).
        """
        return await self._run(self._held, collection, to_us(before), unknown_too)

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
        if self._reader is not None and not self._reader.done():
            await self._reader
        self._cache.clear()
        self._complete = False
        await self._sql.close()
