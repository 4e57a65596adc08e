"""A metadata-only walk hands its changes to the batch recorder in transactions of
``RECORD_BATCH`` (sync engine's ``_hold``), and whatever ends the walk hands over
what it held: nothing read is left behind the position the engine moved to.

A real engine (tests/syncrig.py) against the minimal Source of
tests/minisource.py; the batch size is patched small so that one Change List
makes several transactions.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from rsnotify.errors import FetchError
from rsnotify.subscriber import recorder as recorder_module
from rsnotify.subscriber import sync as sync_module
from rsnotify.subscriber.gaps import Gap
from tests.minisource import Source
from tests.syncrig import running_engine

CHANGES = 10
BATCH = 3


async def _recorded(engine: Any) -> list[tuple[str, str]]:
    log = await engine.applier.resources.apply_log()
    return [(r.loc, r.outcome) for r in log if r.outcome == "recorded"]


async def test_a_walk_records_in_transactions_of_the_batch_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sync_module, "RECORD_BATCH", BATCH)
    monkeypatch.setattr(recorder_module, "RECORD_BATCH", BATCH)  # a transaction per group
    source = Source()
    await source.start({"a.txt": b"alpha\n"})
    try:
        async with running_engine(source, tmp_path, metadata_only=True) as (engine, _):
            store = engine.applier.resources
            written: list[int] = []
            record_rows = store.record_rows

            async def counted(rows: list[Any]) -> list[bool]:
                written.append(len(rows))
                return await record_rows(rows)

            monkeypatch.setattr(store, "record_rows", counted)
            baseline = len(await _recorded(engine))
            counted_before = engine.stats.applied
            changes = [source.change(f"f{i}.txt", b"x" * i) for i in range(CHANGES)]
            await engine.catch_up(Gap("test"))
            assert written == [BATCH, BATCH, BATCH, CHANGES - 3 * BATCH]  # the rest at the end
            assert engine.stats.applied - counted_before == CHANGES  # each batch's count
            recorded = (await _recorded(engine))[baseline:]
            assert [loc for loc, _ in recorded] == [c.loc for c in changes]
            assert engine.applied == engine.watcher.checkpoint  # the cursor passed them all
    finally:
        await source.stop()


async def test_what_a_failed_walk_held_is_recorded_before_it_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk holds changes (fewer than a batch), then a read fails: the retry
    starts from the engine's position, past them, so they must be handed over."""
    monkeypatch.setattr(sync_module, "RECORD_BATCH", 100)
    source = Source()
    await source.start({"a.txt": b"alpha\n"})
    try:
        async with running_engine(source, tmp_path, metadata_only=True) as (engine, _):
            baseline = len(await _recorded(engine))
            changes = [source.change(f"f{i}.txt", b"y" * i) for i in range(CHANGES)]
            watcher = engine.watcher
            poll = watcher.poll
            calls = itertools.count()

            held_at_retry: list[int] = []

            async def failing_after_one_list(*args: Any, **kwargs: Any) -> Any:
                call = next(calls)
                if call == 1:
                    assert engine._held[0]  # the first list is held, not handed over yet
                    raise FetchError(source.changelist, "the next list cannot be read")
                if call == 2:
                    held_at_retry.append(len(engine._held[0]))
                result = await poll(*args, **kwargs)
                if result.count:
                    result.more = True  # as if another list followed
                return result

            monkeypatch.setattr(watcher, "poll", failing_after_one_list)
            monkeypatch.setattr(sync_module.Backoff, "next", lambda self: 0.0)
            await engine.catch_up(Gap("test"))
            recorded = (await _recorded(engine))[baseline:]
            assert [loc for loc, _ in recorded] == [c.loc for c in changes]
            assert engine.applied == engine._submitted
            # Handed over when the walk failed, not left to the retry (which could
            # start a new baseline, whose positions the held ones must not follow).
            assert held_at_retry == [0]
    finally:
        await source.stop()
