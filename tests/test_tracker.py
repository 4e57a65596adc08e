"""The pure change tracker: what is new after a checkpoint, across list changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from rsnotify.model import ChangeType, Entry
from rsnotify.tracker import (
    Checkpoint,
    ListRef,
    detect,
    entry_key,
    lists_to_read,
    starting_point,
)

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def e(
    i: int, loc: str | None = None, change: ChangeType = ChangeType.UPDATED, t: int | None = None
) -> Entry:
    return Entry(
        loc=loc or f"http://s/r{i}",
        lastmod=T0 + timedelta(seconds=i if t is None else t),
        change=change,
    )


def test_detect_from_scratch_returns_everything_with_a_checkpoint_per_entry() -> None:
    entries = [e(i) for i in range(5)]
    found = detect(entries, "L1", Checkpoint(started=True))
    assert found.entries == entries
    assert [c.last_time for c in found.checkpoints] == [x.change_time for x in entries]
    assert found.checkpoints[-1].changelist == "L1"
    assert found.checkpoints[-1].position == 5


def test_resuming_from_any_checkpoint_yields_exactly_the_rest() -> None:
    entries = [e(i) for i in range(10)]
    all_found = detect(entries, "L1", Checkpoint(started=True))
    for k, checkpoint in enumerate(all_found.checkpoints):
        rest = detect(entries, "L1", checkpoint)
        assert rest.entries == entries[k + 1 :]


def test_entries_sharing_one_datetime_are_resumed_exactly() -> None:
    entries = [
        e(0),
        e(1, "http://s/a", t=5),
        e(2, "http://s/b", t=5),
        e(3, "http://s/c", t=5),
        e(4, t=6),
    ]
    first = detect(entries[:3], "L1", Checkpoint(started=True))  # logged up to b
    rest = detect(entries, "L1", first.checkpoints[-1])
    assert [x.loc for x in rest.entries] == ["http://s/c", "http://s/r4"]
    assert first.checkpoints[-1].boundary == (entry_key(entries[1]), entry_key(entries[2]))


def test_the_same_resource_changed_twice_at_one_time_is_two_changes() -> None:
    a = e(1, "http://s/a", ChangeType.CREATED, t=5)
    b = e(2, "http://s/a", ChangeType.UPDATED, t=5)
    first = detect([a], "L1", Checkpoint(started=True))
    assert detect([a, b], "L1", first.checkpoints[-1]).entries == [b]


def test_a_republished_unchanged_list_yields_nothing() -> None:
    entries = [e(i) for i in range(4)]
    done = detect(entries, "L1", Checkpoint(started=True)).checkpoints[-1]
    assert detect(list(entries), "L1", done).entries == []


def test_an_entry_removed_from_the_list_does_not_make_others_new_again() -> None:
    entries = [e(i) for i in range(6)]
    done = detect(entries, "L1", Checkpoint(started=True)).checkpoints[-1]
    rewritten = entries[:2] + entries[3:] + [e(7)]
    assert detect(rewritten, "L1", done).entries == [rewritten[-1]]


def test_rollover_reads_the_closed_list_then_the_new_one() -> None:
    refs = [
        ListRef("L1", T0, T0 + timedelta(seconds=10)),
        ListRef("L2", T0 + timedelta(seconds=10), None),
    ]
    checkpoint = Checkpoint(changelist="L1", last_time=T0 + timedelta(seconds=3), started=True)
    assert [r.url for r in lists_to_read(refs, checkpoint)] == ["L1", "L2"]
    later = Checkpoint(changelist="L2", last_time=T0 + timedelta(seconds=12), started=True)
    assert [r.url for r in lists_to_read(refs, later)] == ["L2"]


def test_a_dropped_list_falls_back_to_the_checkpoint_time() -> None:
    refs = [
        ListRef("L2", T0 + timedelta(seconds=10), T0 + timedelta(seconds=20)),
        ListRef("L3", T0 + timedelta(seconds=20), T0 + timedelta(seconds=30)),
        ListRef("L4", T0 + timedelta(seconds=30), None),
    ]
    gone = Checkpoint(changelist="L1", last_time=T0 + timedelta(seconds=25), started=True)
    assert [r.url for r in lists_to_read(refs, gone)] == ["L3", "L4"]
    boundary = Checkpoint(changelist="L1", last_time=T0 + timedelta(seconds=20), started=True)
    assert [r.url for r in lists_to_read(refs, boundary)] == ["L2", "L3", "L4"]


def test_starting_point_is_the_end_of_the_list() -> None:
    entries = [e(i) for i in range(3)]
    checkpoint = starting_point(entries, "L1")
    assert detect(entries, "L1", checkpoint).entries == []
    assert detect([*entries, e(9)], "L1", checkpoint).entries == [e(9)]
    assert starting_point([], "L1").started


def test_checkpoints_round_trip_through_json() -> None:
    found = detect([e(1, t=5), e(2, t=5)], "L1", Checkpoint(started=True))
    checkpoint = found.checkpoints[-1].with_validators('"etag"', "Mon, 01 Jan 2024 00:00:00 GMT")
    assert Checkpoint.from_json(checkpoint.to_json()) == checkpoint
    assert Checkpoint.from_json(None) == Checkpoint()


@settings(max_examples=200, deadline=None)
@given(
    times=st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=40),
    cut=st.integers(min_value=0, max_value=40),
)
def test_any_split_point_partitions_the_list_exactly(times: list[int], cut: int) -> None:
    """Logging a prefix and resuming gives back exactly the rest, whatever the ties."""
    times.sort()
    entries = [e(i, f"http://s/r{i % 7}", t=t) for i, t in enumerate(times)]
    # (loc, time) pairs must be unique, as the specification asks of a Source.
    unique: dict[tuple[str, int], Entry] = {}
    for entry, t in zip(entries, times, strict=True):
        unique.setdefault((entry.loc, t), entry)
    entries = list(unique.values())
    cut = min(cut, len(entries))
    head = detect(entries[:cut], "L1", Checkpoint(started=True))
    checkpoint = head.checkpoints[-1] if head.checkpoints else Checkpoint(started=True)
    assert head.entries + detect(entries, "L1", checkpoint).entries == entries


@settings(max_examples=60, deadline=None)
@given(
    limit=st.integers(min_value=1, max_value=12),
    times=st.lists(st.integers(min_value=0, max_value=6), min_size=0, max_size=30),
    resume_at=st.integers(min_value=0, max_value=30),
)
def test_detect_with_a_limit_resumes_on_the_same_iterator_to_the_same_result(
    limit: int, times: list[int], resume_at: int
) -> None:
    # Shared datetimes included: the boundary must carry across the cut.
    entries = [e(i, t=t) for i, t in enumerate(sorted(times))]
    start = Checkpoint(started=True)
    if resume_at and entries:
        start = detect(entries[: min(resume_at, len(entries))], "L1", start).checkpoints[-1]
    whole = detect(entries, "L1", start)
    it = iter(entries)
    current, got, checkpoints = start, [], []
    while True:
        part = detect(it, "L1", current, limit=limit)
        assert len(part) <= limit
        got += part.entries
        checkpoints += part.checkpoints
        if part.entries:
            current = part.checkpoints[-1]
        if len(part) < limit:
            break
    assert got == whole.entries
    assert checkpoints == whole.checkpoints
