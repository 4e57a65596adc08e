"""The apply log is bounded: the newest rows are kept, the states never touched.

The log is history (one row per change and what became of it), not state:
nothing decides from it, so a Destination following a busy Source for months
must not fill its disk with it (``rsnotify subscribe --apply-log-rows``).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rsnotify.model import ChangeType
from rsnotify.subscriber.resources import APPLY, ResourceStore
from tests.devstack import ManagedProcess
from tests.helpers import post_json, read_apply_log

T0 = datetime(2025, 3, 1, tzinfo=UTC)


def _row(store: ResourceStore, n: int, locs: int = 7) -> Any:
    """Change ``n``: the ``n``-th second, of one of ``locs`` resources in turn."""
    return store.row(
        f"http://s/{n % locs}", ChangeType.UPDATED, T0 + timedelta(seconds=n),
        outcome="recorded", seq=n, sha256=f"{n:064x}", length=n,
    )  # fmt: skip


async def _write(store: ResourceStore, first: int, count: int) -> None:
    await store.record_rows([(_row(store, n), APPLY) for n in range(first, first + count)])


async def test_the_log_keeps_its_newest_rows_and_every_state(tmp_path: Path) -> None:
    store = ResourceStore(tmp_path / "r.sqlite", log_rows=20)
    try:
        written = 0
        for size in (10, 10, 5, 30, 1, 1, 1, 17):
            await _write(store, written, size)
            written += size
            log = await store.apply_log()
            # At most the bound plus what came since the last trim (a tenth of it),
            # and always the newest rows, in the order they were written.
            assert len(log) <= 20 + 2
            assert [r.seq for r in log] == list(range(written - len(log), written))
            assert len(log) >= min(written, 20)
        # Trimming the history never touches a state: each loc is at its last change.
        for loc in range(7):
            last = max(n for n in range(written) if n % 7 == loc)
            state = await store.get(f"http://s/{loc}")
            assert state is not None and state.seq == last
    finally:
        await store.close()


async def test_without_a_bound_every_row_stays(tmp_path: Path) -> None:
    store = ResourceStore(tmp_path / "r.sqlite", log_rows=None)
    try:
        for start in range(0, 300, 50):
            await _write(store, start, 50)
        assert [r.seq for r in await store.apply_log()] == list(range(300))
    finally:
        await store.close()


async def test_a_log_kept_longer_before_is_cut_at_the_first_write(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    store = ResourceStore(path, log_rows=None)
    await _write(store, 0, 100)
    await store.close()
    store = ResourceStore(path, log_rows=10)
    try:
        assert len(await store.apply_log()) == 100  # opening alone writes nothing
        await _write(store, 100, 1)
        assert [r.seq for r in await store.apply_log()] == list(range(91, 101))
    finally:
        await store.close()


async def test_the_file_stops_growing(tmp_path: Path) -> None:
    """The pages a trim frees are reused: the database's size levels off."""
    path = tmp_path / "r.sqlite"
    store = ResourceStore(path, log_rows=200)

    def pages() -> int:
        with sqlite3.connect(path) as db:  # reads through the WAL: what the store holds
            return int(db.execute("PRAGMA page_count").fetchone()[0])

    try:
        sizes = []
        for batch in range(60):
            await _write(store, batch * 50, 50)
            if batch in (20, 59):
                sizes.append(pages())
        unbounded = ResourceStore(tmp_path / "all.sqlite", log_rows=None)
        try:
            for batch in range(60):
                await _write(unbounded, batch * 50, 50)
            with sqlite3.connect(tmp_path / "all.sqlite") as db:
                all_pages = int(db.execute("PRAGMA page_count").fetchone()[0])
        finally:
            await unbounded.close()
    finally:
        await store.close()
    assert sizes[1] <= sizes[0] + 2, sizes  # 2,000 more rows, no more pages
    assert all_pages > 3 * sizes[1], (all_pages, sizes)  # what the bound saved


async def test_a_trim_that_fails_loses_no_write_and_is_done_at_the_next(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "r.sqlite"
    store = ResourceStore(path, log_rows=10)
    try:
        await _write(store, 0, 10)
        with sqlite3.connect(path) as db:  # the store's trims refused from now on
            db.execute(
                "CREATE TRIGGER no_trim BEFORE DELETE ON apply_log "
                "BEGIN SELECT RAISE(ABORT, 'trim refused'); END"
            )
        await _write(store, 10, 15)
        assert "apply log not trimmed: trim refused" in caplog.text
        log = await store.apply_log()
        assert [r.seq for r in log] == list(range(25))  # the batch is durable all the same
        assert (await store.get("http://s/3")).seq == 24  # type: ignore[union-attr]
        with sqlite3.connect(path) as db:
            db.execute("DROP TRIGGER no_trim")
        await _write(store, 25, 1)  # fewer rows than a trim's step: still due, so done
        assert [r.seq for r in await store.apply_log()] == list(range(16, 26))
    finally:
        await store.close()


def test_a_bound_below_one_row_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="apply-log rows"):
        ResourceStore(tmp_path / "r.sqlite", log_rows=0)


def test_the_subscriber_keeps_the_log_within_apply_log_rows(
    rsnotify_process: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    """``--apply-log-rows`` reaches the store: a catch-up of 400 changes leaves 50 rows."""
    simulator = rsnotify_process(
        "simulate", "--port", "0", "--rate", "0", "--resources", "40", "--seed", "5",
        "--changelist-size", "100", "--quiet",
    )  # fmt: skip
    base = simulator.wait_for_line(r"serving (http://\S+)", timeout=60).group(1)
    argv = ("subscribe", base, "--into", str(tmp_path / "mirror"),
            "--state", str(tmp_path / "state"), "--once", "--log-format", "text",
            "--metadata-only", "--apply-log-rows", "50")  # fmt: skip
    baseline = rsnotify_process(*argv, name="baseline")
    assert baseline.wait(timeout=120) == 0, baseline.tail()
    post_json(f"{base}_simulator/advance?n=400")
    catching = rsnotify_process(*argv, name="catch-up")
    assert catching.wait(timeout=120) == 0, catching.tail()
    assert "up to date (400 applied, 0 failed)" in catching.output()
    records = asyncio.run(read_apply_log(tmp_path / "mirror", tmp_path / "state"))
    assert 50 <= len(records) <= 55, len(records)
    ids = [r.id for r in records]
    assert ids == sorted(ids) and ids[-1] - ids[0] == len(ids) - 1  # the newest, no hole
