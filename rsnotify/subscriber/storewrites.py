"""The resource store's write transaction: a batch of rows in a few statements.

:class:`~.resources.ResourceStore` writes on its own thread, and that
thread shares the interpreter lock with the event loop.  SQLite's Python
module releases the lock around every statement it runs and must take it
back afterwards; while the event loop computes (a catch-up parsing its
Change Lists), each take waits for the loop to yield, up to the
interpreter's switch interval.  One statement per row -- a state upsert and
an apply-log insert for each change -- made a 50,000-change catch-up's
store thread wait about 100,000 times: it fell behind the walk, and the
hand-overs themselves cost CPU (0.7 s of the thread's CPU, against 0.45 s
for the same SQL alone; in a test with a busy second thread, 14 s of wall
time against 2 s).

So a batch is written with multi-row statements (``INSERT ... VALUES
(...), (...), ...``, :data:`ROWS_PER_STATEMENT` rows each): the state
upserts of consecutive rows that apply a change, then the whole apply log.
SQLite runs a multi-row upsert row by row, in order, each row against what
the rows before it left (as the single statements did), and the guard in
its ``WHERE`` still decides.  What a statement does not tell is which rows
moved their state, which callers get (and the store's cache follows): so
they are worked out beforehand from the states read at the start of the
transaction, by the same rule (:func:`_moves`), and the statement's count
of changed rows must agree, or the transaction is rolled back
(a :class:`sqlite3.DatabaseError`, which the store reports as its own
error) -- never a cache that disagrees with the file.
"""

from __future__ import annotations

import sqlite3
from itertools import chain
from operator import itemgetter
from typing import Any

from ..sqlitedb import select_in

__all__ = ["APPLY", "CONFIRM", "KEEP", "ROWS_PER_STATEMENT", "prune_log", "record_many"]

# Rows per multi-row statement, at most (and fewer where SQLite's limit on a
# statement's parameters is lower: 999 before 3.32, 32,766 after): a
# 10,000-row batch takes 4 statements per table.  Each statement gives the
# interpreter lock away and must take it back (see the module's docstring):
# in bench.sqlite_gil, 40,000 rows beside a busy thread took 1.56-1.57 s at
# 500 rows per statement, 0.66-0.77 s at 3,000 (alone 0.29-0.39 s either way).
ROWS_PER_STATEMENT = 3000

# What a state write does (the second item of every row).
KEEP = 0  # log the outcome only (skipped, refused, failed)
APPLY = 1  # the change is now the state of its loc (moving forward only)
CONFIRM = 2  # the Source's Change List lists the change a provisional state holds

_UPSERT_HEAD = (
    "INSERT INTO resources(loc, change, datetime_us, seq, sha256, length, applied_us, "
    "confirmed, collection) VALUES "
)
# The guard makes the store itself refuse to move a resource backwards in time,
# whatever the caller checked before; a provisional state (nobody vouched for its
# datetime) gives way.
_UPSERT_TAIL = (
    " ON CONFLICT(loc) DO UPDATE SET change=excluded.change, "
    "datetime_us=excluded.datetime_us, seq=excluded.seq, "
    "sha256=excluded.sha256, length=excluded.length, "
    "applied_us=excluded.applied_us, confirmed=excluded.confirmed, "
    "collection=COALESCE(excluded.collection, resources.collection) "
    "WHERE excluded.datetime_us >= resources.datetime_us "
    "OR resources.confirmed = 0"
)
_CONFIRM_SQL = (
    "UPDATE resources SET confirmed=1 WHERE loc=? AND change=? AND datetime_us=? AND confirmed=0"
)
_LOG_HEAD = (
    "INSERT INTO apply_log(loc, change, datetime_us, seq, applied_us, sha256, "
    "length, outcome, detail, confirmed) VALUES "
)
_MISMATCH = "the states moved are not the ones worked out before (rolled back)"

_upsert_values = itemgetter(0, 1, 2, 3, 5, 6, 4, 9, 10)  # a row, in _UPSERT_HEAD's order
_log_values = itemgetter(0, 1, 2, 3, 4, 5, 6, 7, 8, 9)  # a row, in _LOG_HEAD's order


def _moves(state: tuple[str, int, int] | None, row: tuple[Any, ...], update: int) -> bool:
    """Whether ``row`` moves its loc's ``state`` ((change, datetime_us, confirmed)).

    The rule of the statements' own ``WHERE`` clauses, read in Python.
    """
    if update == APPLY:
        return state is None or row[2] >= state[1] or state[2] == 0
    if update == CONFIRM:
        return state is not None and state[2] == 0 and state[0] == row[1] and state[1] == row[2]
    return False


def _statement(head: str, width: int, count: int, tail: str = "") -> str:
    return head + ",".join(["(" + ",".join("?" * width) + ")"] * count) + tail


def _insert(
    db: sqlite3.Connection, head: str, width: int, values: list[tuple[Any, ...]], tail: str = ""
) -> int:
    """Run ``head VALUES ... tail`` over ``values``; the rows it changed."""
    changed = 0
    step = min(ROWS_PER_STATEMENT, db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width)
    for start in range(0, len(values), step):
        part = values[start : start + step]
        cursor = db.execute(
            _statement(head, width, len(part), tail), list(chain.from_iterable(part))
        )
        changed += cursor.rowcount
    return changed


def _states(db: sqlite3.Connection, locs: list[str]) -> dict[str, tuple[str, int, int]]:
    rows = select_in(db, "loc, change, datetime_us, confirmed", "resources", "loc", locs)
    return {loc: (change, when, confirmed) for loc, change, when, confirmed in rows}


def record_many(db: sqlite3.Connection, batch: list[tuple[tuple[Any, ...], int]]) -> list[bool]:
    """Write ``batch`` (rows of :meth:`.resources.ResourceStore.row`, each with what it
    does to its state) in one transaction; per row, whether its state moved."""
    results: list[bool] = []
    db.execute("BEGIN IMMEDIATE")
    try:
        states = _states(db, list({row[0] for row, update in batch if update}))
        # Consecutive state writes not yet made, per loc: the state before the
        # first of them, then the rows that move it (see _flush).
        run: dict[str, list[Any]] = {}
        for row, update in batch:
            loc = row[0]
            state = states.get(loc)
            moved = _moves(state, row, update)
            results.append(moved)
            if update == APPLY:
                if moved:
                    moves = run.get(loc)
                    if moves is None:
                        run[loc] = [state, row]
                    else:
                        moves.append(row)
            elif update == CONFIRM:
                _flush(db, run)
                cursor = db.execute(_CONFIRM_SQL, (loc, row[1], row[2]))
                if cursor.rowcount != moved:
                    raise sqlite3.DatabaseError(f"{_MISMATCH}: confirming {loc}")
            if moved:
                confirmed = 1 if update == CONFIRM else row[9]
                states[loc] = (row[1], row[2], confirmed)
        _flush(db, run)
        _insert(db, _LOG_HEAD, 10, [_log_values(row) for row, _ in batch])
        db.execute("COMMIT")
    except BaseException:
        # SQLite may already have rolled back (SQLITE_FULL, SQLITE_IOERR): a
        # second ROLLBACK would raise and hide the real error ("disk is full").
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return results


def _flush(db: sqlite3.Connection, run: dict[str, list[Any]]) -> None:
    """Make the state writes of ``run``: each loc's last one, where that is the same.

    A catch-up moves the state of each loc many times in a batch (50,000
    changes of 2,000 resources: 10,000 upserts a batch for 2,000 states).
    Only the last move is what the state becomes, so only it is written --
    as one row of the statement, guard and all -- when the guard lets it
    move the state from where the run began (:func:`_moves` again: a run of
    confirmed, ever later changes always does), with the latest collection
    any of its rows named (the upserts' ``COALESCE``).  Otherwise (a
    provisional state moved past by an older change) every move is written,
    in order, as before.  Rows the guard refuses move nothing and are not
    written.  Every row written must move its state, or the transaction is
    rolled back (the module's docstring).
    """
    if not run:
        return
    values: list[tuple[Any, ...]] = []
    for before, *moves in run.values():
        last = moves[-1]
        if len(moves) == 1 or _moves(before, last, APPLY):
            upsert = _upsert_values(last)
            if last[10] is None:  # the state keeps the latest collection named
                named = next((row[10] for row in reversed(moves) if row[10] is not None), None)
                upsert = (*upsert[:8], named)
            values.append(upsert)
        else:
            values.extend(map(_upsert_values, moves))
    changed = _insert(db, _UPSERT_HEAD, 9, values, _UPSERT_TAIL)
    if changed != len(values):
        raise sqlite3.DatabaseError(f"{_MISMATCH}: {changed} moved, {len(values)} expected")
    run.clear()


def prune_log(db: sqlite3.Connection, keep: int) -> int:
    """Delete all but the newest ``keep`` apply-log rows (its own transaction); how many went.

    The log's ids only grow (``AUTOINCREMENT``: never reused, even after a
    delete), so "the newest ``keep``" is every id above ``max(id) - keep``:
    two lookups of the primary key and one range delete, whatever the log's
    size.  The pages freed are reused by later inserts, so the file stops
    growing; it does not shrink (a ``VACUUM`` would rewrite all of it).
    """
    if keep < 0:
        raise ValueError(f"apply-log rows to keep must be >= 0, not {keep}")
    first, last = db.execute("SELECT min(id), max(id) FROM apply_log").fetchone()
    if last is None or first > last - keep:
        return 0
    return db.execute("DELETE FROM apply_log WHERE id <= ?", (last - keep,)).rowcount
