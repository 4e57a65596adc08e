"""One SQLite connection owned by one worker thread, for async callers.

Every durable store in rsnotify that lives in a local file (subscriber
cursors, resource states) uses this: WAL journal, ``synchronous=FULL`` so a
committed transaction survives a power cut, and every call on a single
thread so the event loop never waits on an fsync.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from .errors import StoreUnavailable

T = TypeVar("T")


class SQLiteWorker:
    def __init__(self, path: str | Path, schema: str) -> None:
        self.path = Path(path)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rsnotify-db")
        self.db: sqlite3.Connection = self._executor.submit(self._open, schema).result()

    def _open(self, schema: str) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA busy_timeout=5000")
        db.executescript(schema)
        return db

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"{self.path}: {exc}") from None

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Synchronous use (start-up, tests)."""
        return self._executor.submit(fn, *args).result()

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self.db.close)
        self._executor.shutdown(wait=True)
