"""The pure trust rules of the Destination (rsnotify.subscriber.trust), without sockets."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from rsnotify.subscriber.gaps import GapDetector, Verdict
from rsnotify.subscriber.trust import DoubtLimiter, SeqMemory, beyond_skew

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def test_beyond_skew_allows_a_clock_a_little_ahead() -> None:
    assert not beyond_skew(NOW + timedelta(seconds=299), NOW, 300)
    assert not beyond_skew(NOW + timedelta(seconds=300), NOW, 300)
    assert beyond_skew(NOW + timedelta(seconds=301), NOW, 300)
    assert beyond_skew(datetime(2099, 1, 1, tzinfo=UTC), NOW, 300)
    assert not beyond_skew(NOW - timedelta(days=3650), NOW, 300)


def test_seq_memory_tells_a_redelivery_from_a_collision() -> None:
    memory = SeqMemory(size=3)
    a = ("http://s/a", NOW, "updated")
    b = ("http://s/b", NOW, "created")
    assert memory.remember(1, a) is None
    assert memory.seen(1, a) and not memory.seen(1, b)
    assert memory.remember(1, a) is None  # the same change again: a redelivery
    assert memory.remember(1, b) == a  # another change under the same number
    for seq in (2, 3, 4):
        memory.remember(seq, b)
    assert not memory.seen(1, a), "bounded: the oldest number is forgotten"


def test_doubts_become_one_walk_per_interval_and_none_is_lost() -> None:
    limiter = DoubtLimiter(interval=5.0)
    assert limiter.due(0.0) is None  # nothing doubted
    limiter.raise_doubt("forged deletion")
    assert limiter.due(0.0) == "forged deletion"
    for i in range(100):
        limiter.raise_doubt(f"garbage {i}")
    assert limiter.due(4.9) is None, "too soon after the last walk"
    assert limiter.due(5.0) == "garbage 0 (and 99 more)"
    assert limiter.due(100.0) is None
    limiter.raise_doubt("late")
    limiter.settled(101.0)  # a walk for another reason settles it
    assert limiter.due(200.0) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1000), st.booleans()), max_size=60))
def test_doubt_walks_are_spaced_and_every_doubt_is_followed_by_one(
    events: list[tuple[float, bool]],
) -> None:
    """Walks never come closer than the interval; a doubt never waits past one interval."""
    limiter = DoubtLimiter(interval=5.0)
    walks: list[float] = []
    pending_since: float | None = None
    now = 0.0
    for step, doubt in events:
        now += step / 100
        if doubt:
            limiter.raise_doubt("x")
            pending_since = now if pending_since is None else pending_since
        if limiter.due(now) is not None:
            walks.append(now)
            pending_since = None
    assert all(b - a >= 5.0 for a, b in itertools.pairwise(walks))
    if pending_since is not None:
        assert limiter.due(max(now, (walks[-1] if walks else now) + 5.0)) is not None


def test_a_forged_jump_is_undone_by_rewinding_to_the_genuine_sequence() -> None:
    detector = GapDetector(last_seq=10)
    assert detector.on_notification(11)[0] is Verdict.APPLY
    verdict, gap = detector.on_notification(1011)  # forged, far ahead
    assert verdict is Verdict.GAP and gap is not None
    assert detector.on_notification(12)[0] is Verdict.DUPLICATE  # what a seq counter says
    detector.rewind(12)  # what an unsigned channel does with an unseen "duplicate"
    assert detector.on_notification(13)[0] is Verdict.APPLY
