"""The resource store's cache when it holds every state (preload), and batch cache writes."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rsnotify.model import ChangeType
from rsnotify.subscriber.resources import APPLY, CONFIRM, KEEP, ResourceStore

T0 = datetime(2025, 2, 1, tzinfo=UTC)


def _fields(state: Any) -> Any:
    return state and (
        state.change, state.datetime, state.seq, state.sha256, state.length, state.confirmed
    )  # fmt: skip


async def _from_disk(path: Path, locs: list[str]) -> dict[str, Any]:
    """What the database itself holds (a store with no cache)."""
    store = ResourceStore(path, cache_size=0)
    try:
        return {loc: _fields(await store.get(loc)) for loc in locs}
    finally:
        await store.close()


def _row(store: ResourceStore, loc: str, seconds: int, *, confirmed: bool = True) -> Any:
    return store.row(
        loc, ChangeType.UPDATED, T0 + timedelta(seconds=seconds), outcome="recorded",
        sha256=f"{seconds:064x}", length=seconds, confirmed=confirmed,
    )  # fmt: skip


async def test_a_preloaded_cache_answers_like_the_database(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    store = ResourceStore(path, cache_size=1_000)
    try:
        await store.record_rows([(_row(store, f"http://s/{i}", i), APPLY) for i in range(20)])
        await store.close()
        store = ResourceStore(path, cache_size=1_000)
        assert await store.preload()
        assert await store.preload()  # once is enough; the answer stays
        rng = random.Random(3)
        rows = []
        for n in range(300):  # rewrites, older changes, provisional states and confirmations
            loc = f"http://s/{rng.randrange(40)}"
            kind = rng.choice([APPLY, APPLY, KEEP, CONFIRM])
            rows.append((_row(store, loc, rng.randrange(60), confirmed=n % 7 != 0), kind))
        for start in range(0, len(rows), 50):
            await store.record_rows(rows[start : start + 50])
            # Read some back between batches: a later write or confirmation then
            # meets a state built from its row in the cache, not the row itself.
            await store.get_many([f"http://s/{i}" for i in range(0, 40, 3)])
        locs = [f"http://s/{i}" for i in range(45)]
        cached = await store.get_many(locs)
        assert {loc: _fields(cached[loc]) for loc in locs} == await _from_disk(path, locs)
        assert [_fields(await store.get(loc)) for loc in locs] == list(
            (await _from_disk(path, locs)).values()
        )
    finally:
        await store.close()


async def test_an_eviction_sends_reads_back_to_the_database(tmp_path: Path) -> None:
    """A loc missing from a cache that once held everything may have been evicted."""
    path = tmp_path / "r.sqlite"
    store = ResourceStore(path, cache_size=8)
    try:
        assert await store.preload()  # empty: all of it fits
        await store.record_rows([(_row(store, f"http://s/{i}", i), APPLY) for i in range(30)])
        state = await store.get("http://s/0")  # evicted long ago
        assert state is not None and state.length == 0
        found = await store.get_many([f"http://s/{i}" for i in range(30)])
        assert all(found[f"http://s/{i}"] is not None for i in range(30))
    finally:
        await store.close()


async def test_a_store_too_large_is_not_preloaded(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    store = ResourceStore(path, cache_size=10)
    try:
        await store.record_rows([(_row(store, f"http://s/{i}", i), APPLY) for i in range(6)])
        await store.close()
        store = ResourceStore(path, cache_size=10)
        assert not await store.preload()  # 6 states would fill more than half of it
        state = await store.get("http://s/5")
        assert state is not None and state.length == 5
        assert await store.get("http://s/99") is None
    finally:
        await store.close()


async def test_a_batch_leaves_each_loc_cached_as_its_last_write(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    store = ResourceStore(path)
    try:
        loc = "http://s/x"
        rows = [
            (_row(store, loc, 5), APPLY),
            (_row(store, loc, 9), APPLY),
            (_row(store, loc, 7), APPLY),  # older: the store keeps 9
            (_row(store, loc, 12, confirmed=False), APPLY),
            (_row(store, loc, 12), KEEP),
        ]
        assert await store.record_rows(rows) == [True, True, False, True, False]
        assert _fields(await store.get(loc)) == (await _from_disk(path, [loc]))[loc]
        assert (await store.get(loc)).length == 12  # type: ignore[union-attr]
    finally:
        await store.close()


async def test_states_written_by_a_batch_read_back_as_the_database_holds_them(
    tmp_path: Path,
) -> None:
    """A batch's writes wait in the cache as rows until read; read, they are the states.

    Through every reader (get, get_many, a confirmation of a provisional
    write, a later batch), applied_at included, as a store without a cache
    reads them from the file.
    """
    path = tmp_path / "r.sqlite"
    store = ResourceStore(path)
    try:
        locs = [f"http://s/{i}" for i in range(4)]
        first = [(_row(store, loc, 10 + i, confirmed=i != 2), APPLY) for i, loc in enumerate(locs)]
        await store.record_rows(first)
        confirm = store.row(
            locs[2], ChangeType.UPDATED, T0 + timedelta(seconds=12), outcome="confirmed"
        )
        await store.record_rows([(confirm, CONFIRM), (_row(store, locs[3], 20), APPLY)])
        disk = await _from_disk(path, locs)
        cached = await store.get_many(locs[:2])
        assert {loc: _fields(state) for loc, state in cached.items()} == {
            loc: disk[loc] for loc in locs[:2]
        }
        assert [_fields(await store.get(loc)) for loc in locs[2:]] == [
            disk[loc] for loc in locs[2:]
        ]
        assert disk[locs[2]][-1] is True  # confirmed in place
        fresh = ResourceStore(path, cache_size=0)
        try:
            for loc in locs:
                assert (await store.get(loc)).applied_at == (await fresh.get(loc)).applied_at  # type: ignore[union-attr]
        finally:
            await fresh.close()
    finally:
        await store.close()


@pytest.mark.parametrize("read_first", [False, True])
async def test_a_confirmation_reaches_the_cache_as_row_or_as_state(
    tmp_path: Path, read_first: bool
) -> None:
    """A walk confirms a provisional state push wrote: read since (a state) or not (a row)."""
    path = tmp_path / "r.sqlite"
    store = ResourceStore(path)
    try:
        loc = "http://s/p"
        await store.record_rows([(_row(store, loc, 12, confirmed=False), APPLY)])
        if read_first:
            state = await store.get(loc)
            assert state is not None and not state.confirmed
        confirm = store.row(loc, ChangeType.UPDATED, T0 + timedelta(seconds=12), outcome="x")
        assert await store.record_rows([(confirm, CONFIRM)]) == [True]
        assert _fields(await store.get(loc)) == (await _from_disk(path, [loc]))[loc]
        assert (await store.get(loc)).confirmed  # type: ignore[union-attr]
        # A confirmation of a change the loc has moved past changes nothing.
        await store.record_rows([(_row(store, loc, 30, confirmed=False), APPLY)])
        assert await store.record_rows([(confirm, CONFIRM)]) == [False]
        state = await store.get(loc)
        assert state is not None and not state.confirmed and state.length == 30
    finally:
        await store.close()


async def test_a_batch_joins_the_group_commit_of_single_rows_queued_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few rows (a group of deletions at a live rate) share the next transaction.

    Run as a transaction of their own, each group of a push-fed subscriber
    paid an fsync beside the group commit every other change shares.
    """
    store = ResourceStore(tmp_path / "r.sqlite")
    transactions: list[list[str]] = []
    real = store._record_many

    def counting(rows: list[tuple[tuple[Any, ...], int]]) -> list[bool]:
        transactions.append([row[0] for row, _ in rows])
        return real(rows)

    monkeypatch.setattr(store, "_record_many", counting)
    try:
        when = T0 + timedelta(seconds=1)
        single = store.record_applied("http://s/a", ChangeType.CREATED, when, sha256="a" * 64)
        many = store.record_rows(
            [(_row(store, "http://s/b", 2), APPLY), (_row(store, "http://s/a", 0), APPLY)]
        )
        late = store.record_applied("http://s/c", ChangeType.CREATED, when, sha256="c" * 64)
        results = await asyncio.gather(single, many, late)
        assert results == [True, [True, False], True]  # a's older row keeps a's state
        assert transactions == [["http://s/a", "http://s/b", "http://s/a", "http://s/c"]]
        assert await store.record_rows([]) == [] and len(transactions) == 1
    finally:
        await store.close()
