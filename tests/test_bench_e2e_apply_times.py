"""bench.e2e's reader of a subscriber's apply log (the arrival times its latencies come from).

Written by the real :class:`~rsnotify.subscriber.resources.ResourceStore`,
read incrementally as the bench does while it waits for a window's changes:
a row written between two reads is seen once, a change counts as reached
when its own change or a later one of its resource was applied, and rows
that did not bring the mirror to a change (superseded, failed) count for
nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.e2e import ApplyTimes, Change
from rsnotify.subscriber.resources import ResourceStore

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
LOC = "http://s.example/r1"


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _us(when: datetime) -> int:
    return round(when.timestamp() * 1_000_000)


def _change(seconds: float, loc: str = LOC) -> Change:
    return Change(loc, "updated", _us(_at(seconds)))


async def test_rows_are_read_once_and_a_later_change_reaches_an_earlier_one(
    tmp_path: Path,
) -> None:
    store = ResourceStore(tmp_path / "resources.sqlite3")
    try:
        times = ApplyTimes(tmp_path / "resources.sqlite3")
        await store.record_applied(LOC, "updated", _at(1), applied_at=_at(1.5))
        await store.record_applied(
            "http://s.example/r2", "updated", _at(2), outcome="superseded", applied_at=_at(2.1)
        )
        times.update()
        assert times.reached(_change(1)) == _us(_at(1.5))
        assert times.reached(_change(3)) is None  # not applied yet
        assert times.reached(_change(2, "http://s.example/r2")) is None  # superseded: no arrival
        first = times.last_id

        await store.record_applied(LOC, "updated", _at(4), applied_at=_at(4.2))
        times.update()
        assert times.last_id > first
        assert times.per_loc[LOC] == ([_us(_at(1)), _us(_at(4))], [_us(_at(1.5)), _us(_at(4.2))])
        # Change 3 was never applied itself; the mirror held something newer at 4.2 s.
        assert times.reached(_change(3)) == _us(_at(4.2))
        times.update()  # nothing new: nothing counted twice
        assert len(times.per_loc[LOC][0]) == 2
    finally:
        await store.close()


async def test_a_change_applied_out_of_datetime_order_is_kept_in_order(tmp_path: Path) -> None:
    store = ResourceStore(tmp_path / "resources.sqlite3")
    try:
        times = ApplyTimes(tmp_path / "resources.sqlite3")
        await store.record_applied(LOC, "updated", _at(5), applied_at=_at(5.1))
        times.update()
        # A replay after a restart logs an older change after a newer one.
        await store.record_applied(LOC, "updated", _at(2), applied_at=_at(6.0))
        times.update()
        assert times.per_loc[LOC][0] == [_us(_at(2)), _us(_at(5))]
        # Change 1 first reached the mirror when change 5 did (5.1 s), not at 6.0 s.
        assert times.reached(_change(1)) == _us(_at(5.1))
        assert times.reached(_change(2)) == _us(_at(5.1))
    finally:
        await store.close()
