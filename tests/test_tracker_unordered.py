"""The tracker on Change Lists out of forward chronological order (issue 17, item 1).

resync-build writes lists grouped by change type, deletions dated with the deleted
file's old time, and rewrites the whole list each run.  With ``--lenient order`` the
publisher's checkpoint remembers the identities it consumed; these properties drive
:func:`rsnotify.tracker.detect` the way the watcher and the service do (passes cut at
random limits, batches committed through JSON, crashes between batches) and check that
every entry is published exactly once.  In-order reading is untouched: same decisions,
same checkpoint bytes.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsnotify.model import ChangeType, Entry
from rsnotify.tracker import (
    MAX_KNOWN,
    Checkpoint,
    Known,
    adopt_unordered,
    chronological,
    detect,
    entry_digest,
    starting_point,
)

T0 = datetime(2024, 1, 1, tzinfo=UTC)
KINDS = list(ChangeType)


def entry(i: int, second: int, kind: int = 0) -> Entry:
    return Entry(
        loc=f"http://s/res/{i % 7}/{i}",
        lastmod=T0 + timedelta(seconds=second),
        change=KINDS[kind % 3],
    )


def identity(e: Entry) -> tuple[str, str | None, datetime | None]:
    return (e.loc, e.change.value if e.change else None, e.change_time)


class Publisher:
    """detect() as the watcher and the service use it, with crashes and restarts."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.durable = checkpoint.to_json()  # what the log holds
        self.published: list[Entry] = []

    def poll(self, listed: list[Entry], draw: st.DataObject, *, crash: bool) -> None:
        current = Checkpoint.from_json(self.durable)
        rest = iter(listed)  # one read, resumed from the same bytes while a pass goes on
        while True:
            limit = draw.draw(st.integers(1, 6), label="limit")
            found = detect(rest, "L", current, limit=limit)
            if not found.entries:
                return
            batches = draw.draw(st.integers(1, len(found)), label="batch size")
            for start in range(0, len(found), batches):
                part = found.entries[start : start + batches]
                if crash and draw.draw(st.integers(0, 9), label="crash") == 0:
                    return  # crashed before logging this batch: the durable state stands
                self.published += part
                self.durable = found.checkpoints[start + len(part) - 1].to_json()
            current = Checkpoint.from_json(self.durable)


@settings(max_examples=150, deadline=None)
@given(draw=st.data())
def test_a_list_growing_out_of_order_publishes_every_entry_once(draw: st.DataObject) -> None:
    size = draw.draw(st.integers(1, 60), label="size")
    seconds = draw.draw(st.lists(st.integers(0, 15), min_size=size, max_size=size))
    listed = [entry(i, s, i) for i, s in enumerate(seconds)]  # many ties, any order
    cuts = sorted(draw.draw(st.lists(st.integers(0, size), max_size=6), label="growth"))
    publisher = Publisher(Checkpoint(started=True, known=Known.of()))
    for cut in [*cuts, size]:
        publisher.poll(listed[:cut], draw, crash=True)
    publisher.poll(listed, draw, crash=False)  # a last poll that does not crash
    published = [identity(e) for e in publisher.published]
    assert sorted(published, key=repr) == sorted(map(identity, listed), key=repr)


@settings(max_examples=100, deadline=None)
@given(draw=st.data())
def test_a_list_rewritten_each_round_like_resync_builds_publishes_every_entry_once(
    draw: st.DataObject,
) -> None:
    """Each round the Source writes a new version: this round's changes (any times, deletions
    back-dated) plus, for a cumulative list, earlier ones again, regrouped by change type."""
    rounds = draw.draw(st.integers(1, 6), label="rounds")
    ever: list[Entry] = []
    version: list[Entry] = []
    publisher = Publisher(starting_point([], "L", unordered=True))
    for r in range(rounds):
        new = [
            entry(len(ever) + k, draw.draw(st.integers(0, 10 * (r + 1))), k)
            for k in range(draw.draw(st.integers(0, 8), label="changes"))
        ]
        keep = draw.draw(st.lists(st.sampled_from(version)), label="kept") if version else []
        version = sorted({id(e): e for e in [*keep, *new]}.values(), key=lambda e: e.change.value)
        ever += new
        publisher.poll(version, draw, crash=True)
        publisher.poll(version, draw, crash=False)  # each version is read at least once
    published = [identity(e) for e in publisher.published]
    assert sorted(published, key=repr) == sorted(map(identity, ever), key=repr)


@settings(max_examples=60, deadline=None)
@given(
    seconds=st.lists(st.integers(0, 50), max_size=40).map(sorted),
    cut=st.integers(0, 40),
)
def test_in_order_lists_are_read_as_before_and_the_checkpoint_is_the_same(
    seconds: list[int], cut: int
) -> None:
    listed = [entry(i, s) for i, s in enumerate(seconds)]
    start = starting_point(listed[:cut], "L")
    assert start.known is None
    found = detect(listed, "L", start)
    assert found.entries == listed[min(cut, len(listed)) :]
    for checkpoint in found.checkpoints:
        assert "known" not in json.loads(checkpoint.to_json())
        assert Checkpoint.from_json(checkpoint.to_json()) == checkpoint


def test_old_checkpoints_load_and_switching_modes_publishes_nothing_twice() -> None:
    listed = [entry(0, 5), entry(1, 9), entry(2, 9)]
    old = '{"boundary":["created http://s/res/1/1"],"changelist":"L","etag":null,' \
          '"last_modified":null,"last_time":"2024-01-01T00:00:09Z","position":2,' \
          '"started":true,"v":1}'  # fmt: skip
    checkpoint = Checkpoint.from_json(old)
    assert checkpoint.known is None and checkpoint.last_time == T0 + timedelta(seconds=9)
    # Adopted on the list as the in-order checkpoint knew it (what it would skip: consumed) ...
    adopted = adopt_unordered(checkpoint, listed)
    assert len(adopted.known or ()) == 2
    # ... then the Source appends a deletion dated before everything (resync-build's way).
    late = entry(3, 1, 2)
    grown = [*listed, late]
    assert detect(grown, "L", checkpoint).entries == [listed[2]]  # in order: the late one lost
    assert detect(grown, "L", adopted).entries == [listed[2], late]
    back = detect(grown, "L", adopted).checkpoints[-1].ordered()
    assert back.known is None and "known" not in back.to_json()
    assert detect(grown, "L", back).entries == []


def test_the_memory_is_bounded_and_forgets_the_oldest_first() -> None:
    known = Known.of()
    digests = [i.to_bytes(8, "big") for i in range(MAX_KNOWN + 10)]
    for digest in digests:
        known = known.add(digest)
    assert len(known) == MAX_KNOWN
    assert digests[0] not in known and digests[10] in known and digests[-1] in known
    assert Known.from_text(known.to_text()) == known
    assert len(known.to_text()) < 600_000  # about 0.5 MB in the log, for a full Sitemap


def test_older_checkpoints_of_a_pass_stay_what_they_were() -> None:
    """A batch commits the checkpoint of its last entry, not the pass's last one."""
    listed = [entry(i, 10 - i) for i in range(10)]
    found = detect(listed, "L", Checkpoint(started=True, known=Known.of()))
    third = found.checkpoints[2]
    assert len(third.known or ()) == 3
    assert entry_digest(listed[3]) not in (third.known or Known.of())
    branch = third.advance(entry(99, 0), "L")  # a branch copies, it does not overwrite
    assert entry_digest(listed[3]) in (found.checkpoints[-1].known or Known.of())
    assert entry_digest(entry(99, 0)) not in (found.checkpoints[-1].known or Known.of())
    assert len(branch.known or ()) == 4


@settings(max_examples=100, deadline=None)
@given(seconds=st.lists(st.integers(0, 5), max_size=30))
def test_chronological_is_a_stable_sort_and_names_the_first_entry_out_of_place(
    seconds: list[int],
) -> None:
    listed = [entry(i, s) for i, s in enumerate(seconds)]
    result = chronological(listed)
    times = [e.change_time for e in result.entries]
    assert times == sorted(times)
    for t in set(times):  # entries sharing a time keep their document order
        assert [e for e in result.entries if e.change_time == t] == [
            e for e in listed if e.change_time == t
        ]
    in_order = seconds == sorted(seconds)
    assert (result.moved == 0) == in_order == (result.first is None)
    if result.first is not None:
        before = listed[: listed.index(result.first)]
        assert max(e.change_time for e in before) > result.first.change_time


def _reference_digest(entry: Entry) -> bytes:
    """The digest as first written (checkpoints on disk hold these bytes)."""
    import hashlib

    from rsnotify import w3cdt

    when = entry.change_time
    key = f"{entry.change.value if entry.change else '?'} {entry.loc}"
    text = f"{key}\n{w3cdt.format(when) if when is not None else ''}"
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()


@given(
    micros=st.integers(0, 10**14),
    offset_minutes=st.sampled_from([0, 60, -330, 24 * 60 - 1]),
    change=st.sampled_from([*ChangeType, None]),
    loc=st.text(min_size=1, max_size=20),
    lastmod_only=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_entry_digest_is_byte_for_byte_what_checkpoints_hold(
    micros: int, offset_minutes: int, change: ChangeType | None, loc: str, lastmod_only: bool
) -> None:
    """The fast path (UTC times, StrEnum formatting) must not change a stored identity."""
    from datetime import timezone

    when = (T0 + timedelta(microseconds=micros)).astimezone(
        timezone(timedelta(minutes=offset_minutes))
    )
    if offset_minutes == 0:
        when = when.astimezone(UTC)  # the parser's own zone object: the fast path
    entry = (
        Entry(loc=loc, change=change, lastmod=when)
        if lastmod_only
        else Entry(loc=loc, change=change, datetime=when)
    )
    assert entry_digest(entry) == _reference_digest(entry)
    assert entry_digest(Entry(loc=loc, change=change)) == _reference_digest(
        Entry(loc=loc, change=change)
    )


@pytest.mark.parametrize("on_the_list", [False, True])
@pytest.mark.parametrize("limit", [None, 9])
def test_detect_unordered_takes_the_same_decisions_as_is_new_and_advance(
    on_the_list: bool, limit: int | None
) -> None:
    """detect's one-digest loop against the two-call definition it replaces.

    From a checkpoint on another list (position, validators reset) and on the
    same one (position counted on, validators kept), with and without a limit.
    """
    listed = [
        Entry(loc=f"r{i % 7}", change=ChangeType.UPDATED, datetime=T0 + timedelta(seconds=i % 5))
        for i in range(40)
    ]
    listed.insert(5, Entry(loc="r-no-time", change=ChangeType.CREATED))
    known = Known.of([entry_digest(listed[3])])
    on_l = Checkpoint(
        changelist="L", last_time=T0 + timedelta(seconds=2), boundary=("updated r2",),
        position=7, etag='"e"', last_modified="m", started=True, known=known,
    )  # fmt: skip
    on_k = Checkpoint(
        changelist="K", position=3, etag='"k"', last_modified="k", started=True, known=known
    )
    start = on_l if on_the_list else on_k
    found = detect([*listed, *listed], "L", start, limit=limit)
    current, expected = start, []
    for entry in [*listed, *listed]:
        if current.is_new(entry):
            current = current.advance(entry, "L")
            expected.append((entry, current))
    expected = expected[:limit]
    assert found.entries == [e for e, _ in expected]
    assert found.checkpoints == [c for _, c in expected]
    assert [c.to_json() for c in found.checkpoints] == [c.to_json() for _, c in expected]


@pytest.mark.parametrize("limit", [None, 9])
def test_detect_takes_digests_computed_elsewhere_in_step_with_the_entries(
    limit: int | None,
) -> None:
    """A list parsed in the worker process comes with its digests: detect uses them.

    Given the true digests, the same detection; given other ones, the
    decisions follow them (so they are used, not computed again), and with
    a limit exactly one digest is taken per entry taken.
    """
    listed = [
        Entry(loc=f"r{i % 7}", change=ChangeType.UPDATED, datetime=T0 + timedelta(seconds=i))
        for i in range(20)
    ]
    start = Checkpoint(changelist="L", started=True, known=Known.of())
    plain = detect(listed, "L", start, limit=limit)
    digests = iter([entry_digest(e) for e in listed])
    given = detect(iter(listed), "L", start, limit=limit, digests=digests)
    assert given.entries == plain.entries
    assert [c.to_json() for c in given.checkpoints] == [c.to_json() for c in plain.checkpoints]
    if limit is not None:
        assert next(digests) == entry_digest(listed[limit])  # in step: the next is unread
    # Every entry given the first one's digest: only the first is new.
    same = detect(listed, "L", start, digests=iter([entry_digest(listed[0])] * len(listed)))
    assert same.entries == [listed[0]]


def test_positions_read_in_any_order_are_the_checkpoints_of_advance() -> None:
    """Detection.checkpoints makes each unordered checkpoint when read: any index, slice, order."""
    listed = [
        Entry(loc=f"r{i % 5}", change=ChangeType.UPDATED, datetime=T0 + timedelta(seconds=i % 3))
        for i in range(12)
    ]
    start = Checkpoint(changelist="L", position=2, etag='"e"', started=True, known=Known.of())
    found = detect(listed, "L", start)
    current, expected = start, []
    for entry in listed:
        if current.is_new(entry):
            current = current.advance(entry, "L")
            expected.append(current)
    assert len(found.checkpoints) == len(expected) > 3
    assert found.checkpoints[-1] == expected[-1]
    assert found.checkpoints[1:4] == expected[1:4]
    assert found.checkpoints[-2] is found.checkpoints[-2]  # made once, then kept
    assert list(reversed(found.checkpoints)) == expected[::-1]
    assert found.checkpoints == expected and expected == found.checkpoints
