"""same_position: when a walk may take the watcher's checkpoints as the engine's own."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from rsnotify.model import ChangeType, Entry
from rsnotify.subscriber.sync import same_position
from rsnotify.tracker import Checkpoint, Known, detect

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def _entries(n: int) -> list[Entry]:
    return [
        Entry(loc=f"r{i % 5}", change=ChangeType.UPDATED, datetime=T0 + timedelta(seconds=i))
        for i in range(n)
    ]


def test_the_chain_the_engine_would_compute_is_the_same_position() -> None:
    for start in (Checkpoint(started=True), Checkpoint(started=True, known=Known.of())):
        found = detect(_entries(10), "L", start)
        mine = start
        for entry in _entries(10):
            mine = mine.advance(entry, "L")
        assert same_position(found.checkpoints[-1], mine)
        # The watcher adds validators after a pass; they locate nothing.
        assert same_position(found.checkpoints[-1].with_validators('"e"', "yesterday"), mine)


def test_a_different_position_is_not_the_same() -> None:
    for start in (Checkpoint(started=True), Checkpoint(started=True, known=Known.of())):
        found = detect(_entries(10), "L", start)
        end = found.checkpoints[-1]
        assert not same_position(found.checkpoints[-2], end)
        assert not same_position(replace(end, changelist="M"), end)
        assert not same_position(replace(end, boundary=()), end)
        assert not same_position(end.ordered(), end) or end.known is None
    unordered = detect(_entries(3), "L", Checkpoint(started=True, known=Known.of()))
    reordered = Checkpoint(started=True, known=Known.of())
    for entry in reversed(_entries(3)):
        reordered = reordered.advance(entry, "L")
    # The same identities consumed in another order: not taken as the same position
    # (the engine then works positions out entry by entry, as before).
    assert not same_position(unordered.checkpoints[-1], reordered)
