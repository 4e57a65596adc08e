"""The resource store's reads and writes beside a busy thread: what the interpreter lock costs.

The store runs SQLite on a worker thread that shares the interpreter lock
with the event loop.  SQLite's Python module gives the lock away around every
step of a statement (one per row read) and around each statement's prepare
and reset; taking it back waits for the other thread to yield it, up to the
switch interval (5 ms), whenever that thread computes.  This bench measures a
read of 10,000 states (a row per step, as the store read them before, against
:func:`rsnotify.sqlitedb.select_in`, one step per chunk) and the store's
batch writes of 40,000 rows (500 against :data:`ROWS_PER_STATEMENT` rows per
statement), each alone and beside a thread that runs Python without pause:
the worst case of a busy event loop.

Figures are ratios within one run: "beside / alone" per contender, and the
contenders against each other.  Prints a table; writes
``bench/results/sqlite_gil.json``.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench._common import format_table, machine_info, write_json
from rsnotify.sqlitedb import select_in
from rsnotify.subscriber import storewrites
from rsnotify.subscriber.resources import _SCHEMA, _STATE_COLUMNS

NAME = "sqlite_gil"
T0_US = 1_700_000_000_000_000


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.executescript(_SCHEMA)
    return db


def _locs(n: int) -> list[str]:
    return [f"http://source.example/c1/resources/r{i:06d}.txt" for i in range(n)]


def _rows_per_step(db: sqlite3.Connection, locs: list[str]) -> list[Any]:
    """The store's reads before select_in: 500 locs per statement, a row per step."""
    found: list[Any] = []
    for start in range(0, len(locs), 500):
        chunk = locs[start : start + 500]
        marks = ",".join("?" * len(chunk))
        found.extend(
            db.execute(f"SELECT {_STATE_COLUMNS} FROM resources WHERE loc IN ({marks})", chunk)
        )
    return found


def _batches(rows: int, distinct: int, batch: int) -> list[list[Any]]:
    locs = _locs(distinct)
    out: list[list[Any]] = []
    for start in range(0, rows, batch):
        out.append(
            [
                (
                    (
                        locs[(i * 7) % distinct],
                        "updated",
                        T0_US + i,
                        None,
                        T0_US,
                        "a" * 64,
                        1024,
                        "recorded",
                        None,
                        1,
                        "c1",
                    ),
                    storewrites.APPLY,
                )
                for i in range(start, min(rows, start + batch))
            ]
        )
    return out


def _write_all(db: sqlite3.Connection, batches: list[list[Any]]) -> None:
    for batch in batches:
        storewrites.record_many(db, batch)


def _timed(work: Callable[[], object], busy: bool) -> tuple[float, float]:
    """Wall and thread CPU seconds of ``work`` in a thread, beside a spinning one if ``busy``."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            for _ in range(1000):
                pass

    spinner = threading.Thread(target=spin) if busy else None
    result: dict[str, tuple[float, float]] = {}

    def run() -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        work()
        result["t"] = (time.perf_counter() - wall, time.thread_time() - cpu)

    if spinner is not None:
        spinner.start()
    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    stop.set()
    if spinner is not None:
        spinner.join()
    return result["t"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.sqlite_gil", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="a tenth of the rows: a smoke test")
    opts = ap.parse_args(argv)
    scale = 10 if opts.quick else 1
    states, writes = 10_000 // scale, 40_000 // scale
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rsnotify-sqlite-gil-") as tmp:
        db = _connect(Path(tmp) / "reads.sqlite3")
        locs = _locs(states)
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO resources(loc, change, datetime_us, seq, sha256, length, applied_us, "
            "confirmed, collection) VALUES (?, 'updated', ?, NULL, ?, 1024, ?, 1, 'c1')",
            [(loc, T0_US + i, "a" * 64, T0_US) for i, loc in enumerate(locs)],
        )
        db.execute("COMMIT")
        readers: dict[str, Callable[[], object]] = {
            "read, a row per step": lambda: _rows_per_step(db, locs),
            "read, select_in": lambda: select_in(db, _STATE_COLUMNS, "resources", "loc", locs),
        }
        for label, work in readers.items():
            alone, beside = _timed(work, False), _timed(work, True)
            results.append({"what": label, "rows": states, "alone": alone, "beside": beside})
        for per_statement in (500, storewrites.ROWS_PER_STATEMENT):
            saved = storewrites.ROWS_PER_STATEMENT
            storewrites.ROWS_PER_STATEMENT = per_statement
            try:
                timings = []
                for busy in (False, True):
                    target = _connect(Path(tmp) / f"writes-{per_statement}-{busy}.sqlite3")
                    batches = _batches(writes, 2_000, 10_000 // scale)
                    timings.append(_timed(partial(_write_all, target, batches), busy))
                    target.close()
            finally:
                storewrites.ROWS_PER_STATEMENT = saved
            results.append(
                {
                    "what": f"write, {per_statement} rows per statement",
                    "rows": writes,
                    "alone": timings[0],
                    "beside": timings[1],
                }
            )
        db.close()
    headers = ["what", "rows", "alone ms", "CPU ms", "beside a busy thread ms", "CPU ms", "x"]
    table = [
        [
            r["what"],
            r["rows"],
            r["alone"][0] * 1e3,
            r["alone"][1] * 1e3,
            r["beside"][0] * 1e3,
            r["beside"][1] * 1e3,
            r["beside"][0] / r["alone"][0],
        ]
        for r in results
    ]
    print(format_table(headers, table))
    path = write_json(
        NAME,
        {
            "machine": machine_info(),
            "switch_interval_s": sys.getswitchinterval(),
            "results": [
                {
                    "what": r["what"],
                    "rows": r["rows"],
                    "alone_s": r["alone"][0],
                    "alone_cpu_s": r["alone"][1],
                    "beside_busy_thread_s": r["beside"][0],
                    "beside_busy_thread_cpu_s": r["beside"][1],
                }
                for r in results
            ],
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
