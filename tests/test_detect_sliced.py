"""A Destination's walk detects a list a slice at a time, to the result of one detect().

A walk that follows push meets ~1,000 entries; detected in one call they
were one step of 5-7 ms of the event loop, and push notifications waited
behind it.  The watcher now detects :data:`DETECT_SLICE` entries between two
looks at the loop, resuming each slice from the last checkpoint found; its
callers must get exactly what a single :func:`rsnotify.tracker.detect` call
gives, lists read out of order (an unordered checkpoint) included.
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsnotify.changes import watcher as watcher_module
from rsnotify.model import ChangeType, Entry
from rsnotify.tracker import Checkpoint, Known, detect
from tests.test_watcher import _source, _watcher

T0 = datetime(2025, 3, 1, tzinfo=UTC)


def entries_at(times: list[int], locs: int) -> list[Entry]:
    return [
        Entry(
            loc=f"http://s/r{i % locs}",
            change=ChangeType.UPDATED,
            datetime=T0 + timedelta(seconds=t),
        )
        for i, t in enumerate(times)
    ]


@settings(max_examples=150, deadline=None)
@given(
    times=st.lists(st.integers(min_value=0, max_value=15), min_size=0, max_size=60),
    locs=st.integers(min_value=1, max_value=9),
    ordered=st.booleans(),
    unordered_checkpoint=st.booleans(),
    seen=st.integers(min_value=0, max_value=60),
    same_list=st.booleans(),
    size=st.integers(min_value=1, max_value=7),
)
def test_sliced_detection_is_one_detect_call(
    times: list[int],
    locs: int,
    ordered: bool,
    unordered_checkpoint: bool,
    seen: int,
    same_list: bool,
    size: int,
) -> None:
    if ordered:
        times.sort()
    entries = entries_at(times, locs)
    start = Checkpoint(started=True, known=Known.of() if unordered_checkpoint else None)
    if seen and entries:  # resume from part of the list, read with validators
        head = detect(entries[: min(seen, len(entries))], "L1", start)
        if head.entries:
            start = head.checkpoints[-1].with_validators('"v1"', None)
    changelist = "L1" if same_list else "L2"
    whole = detect(entries, changelist, start)

    async def sliced() -> tuple[list[Entry], list[Checkpoint]]:
        found = await watcher_module._detect_sliced(iter(entries), changelist, start)
        return found.entries, list(found.checkpoints)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(watcher_module, "DETECT_SLICE", size)
        got_entries, got_checkpoints = asyncio.run(sliced())
    assert got_entries == whole.entries
    assert got_checkpoints == list(whole.checkpoints)


async def test_a_walk_s_detection_lets_the_loop_run_between_slices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cl1 (2,400 entries) and cl2 (2,600) read whole, as a Destination's walk does.
    _source(tmp_path)
    watcher = _watcher(tmp_path)
    turns = 0
    polling = True
    calls: list[tuple[int, int]] = []  # per detect() call: entries it read, the loop's turns
    real = watcher_module.detect

    def counted(entries: Any, changelist: str, checkpoint: Checkpoint, **kw: Any) -> Any:
        read = list(entries)
        calls.append((len(read), turns))
        return real(read, changelist, checkpoint, **kw)

    async def ticker() -> None:
        nonlocal turns
        while polling:
            turns += 1
            await asyncio.sleep(0)

    monkeypatch.setattr(watcher_module, "detect", counted)
    ticking = asyncio.create_task(ticker())
    result = await watcher.poll()
    polling = False
    await ticking
    assert result.count == 5_000 and len(result.detections) == 2  # one detection per list
    assert sum(n for n, _ in calls) == 5_000
    assert max(n for n, _ in calls) <= watcher_module.DETECT_SLICE
    seen = [t for _, t in calls]
    assert all(b > a for a, b in itertools.pairwise(seen)), "no turn between slices"


def test_positions_of_another_list_are_appended_as_the_checkpoints_they_stand_for() -> None:
    start = Checkpoint(started=True, known=Known.of())
    first = detect(entries_at([1, 2, 3], 5), "L1", start.with_validators('"a"', None))
    other = detect(entries_at([4, 5], 5), "L2", first.checkpoints[-1])
    joined = detect(entries_at([1, 2, 3], 5), "L1", start.with_validators('"a"', None))
    joined.checkpoints.extend(other.checkpoints)
    assert list(joined.checkpoints) == list(first.checkpoints) + list(other.checkpoints)
    assert joined.checkpoints[-1].changelist == "L2"
