"""The resource store's batch transaction against one statement per row.

:func:`rsnotify.subscriber.storewrites.record_many` writes a batch with
multi-row statements and works out beforehand which rows move their state;
the reference below is what the store did before, one upsert (or update) per
row, each answering for itself.  Both run on copies of the same file.
"""

from __future__ import annotations

import random
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rsnotify.subscriber import storewrites
from rsnotify.subscriber.resources import _SCHEMA, ResourceStore
from rsnotify.subscriber.storewrites import APPLY, CONFIRM, KEEP, record_many

T0 = datetime(2024, 5, 1, tzinfo=UTC)


def _reference(db: sqlite3.Connection, batch: list[tuple[tuple[Any, ...], int]]) -> list[bool]:
    """One statement per row, as the store wrote before."""
    results = []
    db.execute("BEGIN IMMEDIATE")
    for row, update in batch:
        loc, change, when, seq, applied, sha256, length = row[:7]
        changed = False
        if update == CONFIRM:
            cursor = db.execute(
                "UPDATE resources SET confirmed=1 WHERE loc=? AND change=? "
                "AND datetime_us=? AND confirmed=0",
                (loc, change, when),
            )
            changed = cursor.rowcount > 0
        elif update == APPLY:
            cursor = db.execute(
                "INSERT INTO resources(loc, change, datetime_us, seq, sha256, length, "
                "applied_us, confirmed, collection) VALUES (?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT(loc) DO UPDATE SET change=excluded.change, "
                "datetime_us=excluded.datetime_us, seq=excluded.seq, "
                "sha256=excluded.sha256, length=excluded.length, "
                "applied_us=excluded.applied_us, confirmed=excluded.confirmed, "
                "collection=COALESCE(excluded.collection, resources.collection) "
                "WHERE excluded.datetime_us >= resources.datetime_us "
                "OR resources.confirmed = 0",
                (loc, change, when, seq, sha256, length, applied, row[9], row[10]),
            )
            changed = cursor.rowcount > 0
        results.append(changed)
    db.executemany(
        "INSERT INTO apply_log(loc, change, datetime_us, seq, applied_us, sha256, "
        "length, outcome, detail, confirmed) VALUES (?,?,?,?,?,?,?,?,?,?)",
        [row[:10] for row, _ in batch],
    )
    db.execute("COMMIT")
    return results


def _open(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(_SCHEMA)
    return db


def _tables(db: sqlite3.Connection) -> tuple[list[Any], list[Any]]:
    return (
        db.execute("SELECT * FROM resources ORDER BY loc").fetchall(),
        db.execute("SELECT * FROM apply_log ORDER BY id").fetchall(),
    )


def _batch(rng: random.Random, size: int) -> list[tuple[tuple[Any, ...], int]]:
    batch = []
    for _ in range(size):
        row = ResourceStore._row(
            f"http://s/{rng.randrange(8)}",
            rng.choice(["created", "updated", "deleted"]),
            T0 + timedelta(seconds=rng.randrange(6)),  # few times: ties
            rng.choice([None, rng.randrange(100)]),
            rng.choice([None, "ab"]),
            rng.choice([None, 3]),
            rng.choice(["recorded", "skipped_already_applied", "confirmed"]),
            rng.choice([None, "why"]),
            None,
            rng.random() < 0.7,
            rng.choice([None, "a", "b"]),
        )
        update = rng.choice([APPLY, APPLY, APPLY, CONFIRM, KEEP])
        if update == CONFIRM and batch and rng.random() < 0.5:
            # The change an earlier row wrote: one that may be provisional now.
            earlier = rng.choice(batch)[0]
            row = (*earlier[:3], *row[3:])
        batch.append((row, update))
    return batch


@pytest.mark.parametrize("seed", range(40))
def test_a_batch_writes_what_one_statement_per_row_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng = random.Random(seed)
    monkeypatch.setattr(storewrites, "ROWS_PER_STATEMENT", rng.choice([1, 2, 3, 500]))
    mine, theirs = _open(tmp_path / "mine.sqlite3"), _open(tmp_path / "theirs.sqlite3")
    try:
        for _ in range(4):  # transactions on top of each other's states
            batch = _batch(rng, rng.randrange(1, 40))
            assert record_many(mine, batch) == _reference(theirs, batch)
            assert _tables(mine) == _tables(theirs)
    finally:
        mine.close()
        theirs.close()


def test_a_batch_the_database_disagrees_with_is_rolled_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = _open(tmp_path / "db.sqlite3")
    try:
        rng = random.Random(1)
        record_many(db, _batch(rng, 30))
        before = _tables(db)
        # A rule that says every write moves its state: the statements count otherwise.
        monkeypatch.setattr(storewrites, "_moves", lambda state, row, update: update != KEEP)
        with pytest.raises(sqlite3.DatabaseError, match="not the ones worked out"):
            record_many(db, [(row, APPLY) for row, _ in _batch(rng, 30)])
        assert not db.in_transaction
        assert _tables(db) == before
    finally:
        db.close()


async def test_a_store_that_indexed_its_log_by_loc_loses_that_index_and_keeps_the_log(
    tmp_path: Path,
) -> None:
    """The apply log is written far more than read: no index on loc (see resources)."""
    path = tmp_path / "resources.sqlite3"
    db = _open(path)
    db.executescript(
        "CREATE INDEX apply_log_by_loc ON apply_log(loc, id);"  # what older stores had
        "CREATE INDEX an_operators_own ON apply_log(outcome);"
    )
    batch = _batch(random.Random(3), 60)
    record_many(db, batch)
    written = _tables(db)
    db.close()

    store = ResourceStore(path)
    try:
        one = await store.apply_log("http://s/5")
        whole = await store.apply_log()
    finally:
        await store.close()
    assert [record.id for record in whole] == [row[0] for row in written[1]]
    assert [record.id for record in one] == [row[0] for row in written[1] if row[1] == "http://s/5"]
    assert one  # the seed writes that loc
    db = sqlite3.connect(path)
    try:
        indexes = db.execute(
            "SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='apply_log'"
        ).fetchall()
        assert _tables(db) == written
    finally:
        db.close()
    assert indexes == [("an_operators_own",)]


def test_a_loc_moved_many_times_in_a_batch_is_written_once(tmp_path: Path) -> None:
    """Only the last of a run of later changes is what the state becomes: one upsert."""
    db = _open(tmp_path / "db.sqlite3")
    try:
        rows = [
            (ResourceStore._row(f"http://s/{n % 2}", "updated", T0 + timedelta(seconds=n),
                                n, "ab", 3, "recorded", None, None, True, "c"), APPLY)
            for n in range(100)
        ]  # fmt: skip
        before = db.total_changes
        assert record_many(db, rows) == [True] * 100
        assert db.total_changes - before == 2 + 100  # two states, every change logged
        assert [r[3] for r in _tables(db)[0]] == [98, 99]  # each loc at its last change
    finally:
        db.close()
