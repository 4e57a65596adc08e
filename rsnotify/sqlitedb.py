"""One SQLite connection owned by one worker thread, for async callers.

Every durable store in rsnotify that lives in a local file uses this: the
embedded notification log (:mod:`rsnotify.log.sqlite_log`), the subscriber's
cursors (:mod:`rsnotify.subscriber.cursor`) and resource states
(:mod:`rsnotify.subscriber.resources`), and the WebSub subscriptions
(:mod:`rsnotify.transport.websubstore`).  The rules are the same for all of
them, so they live here once:

* WAL journal and ``synchronous=FULL``: a committed transaction survives
  ``kill -9`` and a power cut;
* ``busy_timeout`` of 5 s: another process holding the write lock briefly
  (a second gateway on the same log) is waited for, not an error;
* every call runs on one thread, the connection's owner, so the event loop
  never waits on an fsync and the connection is never shared across threads;
* an :class:`sqlite3.OperationalError` (locked, disk I/O error, disk full)
  becomes :class:`StoreUnavailable`, which each store turns into its own
  "unavailable" error; a closed worker raises it too;
* a read of many rows while the event loop is busy takes them in one step
  (:func:`select_rows`), see there.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from .errors import StoreUnavailable

__all__ = ["SQLiteWorker", "StoreUnavailable", "select_in", "select_rows"]

T = TypeVar("T")

IN_CHUNK = 5000  # keys per SELECT ... IN (...), at most (fewer where SQLite allows fewer)
# SQLite's JSON functions are built in since 3.38 (a build may still leave them out).
JSON_ROWS = sqlite3.sqlite_version_info >= (3, 38)


def select_rows(
    db: sqlite3.Connection, columns: str, rest: str, args: Sequence[Any] = ()
) -> list[list[Any]]:
    """Rows of ``SELECT columns rest``, read in one step of the statement.

    A worker thread shares the interpreter lock with the event loop, and
    SQLite's Python module lets go of it around every step of a statement:
    once per row read.  Taking it back waits for the loop to yield it, up to
    the interpreter's switch interval (5 ms), whenever the loop is computing
    -- as a Destination's loop does while a walk settles against the store,
    or push keeps it busy.  ``bench.sqlite_gil``: 10,000 states read a row
    per step took 24-37 ms alone and 3.1-17 s beside a busy thread; as one
    value, 27-36 ms alone and 41 ms beside it.  Every other call on the
    worker (the group commits push waits for) queues behind such a read.

    So the rows come back as one value, ``json_group_array`` of
    ``json_array(columns)``, built by SQLite and read by :func:`json.loads`:
    TEXT, INTEGER and NULL come back as they are (not for BLOB columns).  The
    text is held until it is read, so a large result (the locs of a mirror's
    whole collection, at a re-baseline) briefly takes about as much memory
    again as its rows.  An SQLite without its JSON functions (before 3.38, or
    built without them) is read a row per step instead.
    """
    if JSON_ROWS:
        try:
            ((text,),) = db.execute(
                f"SELECT json_group_array(json_array({columns})) {rest}", args
            ).fetchall()
        except sqlite3.OperationalError as exc:
            if "json" not in str(exc):
                raise
        else:
            rows: list[list[Any]] = json.loads(text)
            return rows
    return [list(row) for row in db.execute(f"SELECT {columns} {rest}", args)]


def select_in(
    db: sqlite3.Connection, columns: str, table: str, key: str, keys: list[str]
) -> list[list[Any]]:
    """:func:`select_rows` of ``table`` where ``key`` is one of ``keys``, a chunk at a time."""
    found: list[list[Any]] = []
    size = min(IN_CHUNK, db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))
    for start in range(0, len(keys), size):
        chunk = keys[start : start + size]
        marks = ",".join("?" * len(chunk))
        found.extend(select_rows(db, columns, f"FROM {table} WHERE {key} IN ({marks})", chunk))
    return found


class SQLiteWorker:
    """The connection to the file at ``path`` and the one thread that uses it.

    ``schema`` (idempotent SQL) runs when the file is opened, then ``migrate``
    (if given) brings a file written by an older rsnotify up to date.  Opening
    raises :class:`sqlite3.Error` as it comes (the caller knows what the file
    is for); the worker thread is gone again when it does.
    """

    def __init__(
        self,
        path: str | Path,
        schema: str,
        *,
        migrate: Callable[[sqlite3.Connection], None] | None = None,
        thread_name: str = "rsnotify-db",
    ) -> None:
        self.path = Path(path)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
        self._closed = False
        try:
            self.db: sqlite3.Connection = self._executor.submit(
                self._open, schema, migrate
            ).result()
        except BaseException:
            self._executor.shutdown(wait=True)  # idle: the open has ended either way
            raise

    def _open(
        self, schema: str, migrate: Callable[[sqlite3.Connection], None] | None
    ) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=5000")
            db.executescript(schema)
            if migrate is not None:
                migrate(db)
        except BaseException:
            db.close()
            raise
        return db

    @property
    def closed(self) -> bool:
        return self._closed

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the worker thread; ``fn`` uses :attr:`db`."""
        if self._closed:
            raise StoreUnavailable(f"{self.path} is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"{self.path}: {exc}") from None

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Synchronous use (start-up, tests)."""
        return self._executor.submit(fn, *args).result()

    async def close(self) -> None:
        """Close the connection and end the thread; idempotent.

        Calls already handed to :meth:`run` finish first (the thread runs them
        in order); calls made afterwards raise :class:`StoreUnavailable`.
        """
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self.db.close)
        self._executor.shutdown(wait=True)
