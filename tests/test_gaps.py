"""The pure gap detector: every kind of gap, and no false ones."""

from __future__ import annotations

from rsnotify.subscriber.gaps import GapDetector, Verdict


def test_in_order_notifications_apply_and_duplicates_drop() -> None:
    d = GapDetector(last_seq=4)
    assert d.on_notification(5) == (Verdict.APPLY, None)
    assert d.on_notification(6) == (Verdict.APPLY, None)
    assert d.on_notification(5)[0] is Verdict.DUPLICATE
    assert d.on_notification(6)[0] is Verdict.DUPLICATE
    assert d.expected == 7


def test_a_sequence_jump_is_a_gap_naming_the_missing_range() -> None:
    d = GapDetector(last_seq=10)
    verdict, gap = d.on_notification(14)
    assert verdict is Verdict.GAP
    assert gap is not None and (gap.first_missing, gap.last_missing, gap.size) == (11, 13, 3)
    assert d.on_notification(15) == (Verdict.APPLY, None)


def test_an_unknown_position_starts_at_the_first_notification() -> None:
    d = GapDetector()
    assert d.on_notification(100) == (Verdict.APPLY, None)
    assert d.on_notification(101) == (Verdict.APPLY, None)
    assert d.on_notification(103)[0] is Verdict.GAP


def test_filtered_streams_use_prev_and_raise_no_false_gap() -> None:
    d = GapDetector(last_seq=3)
    assert d.on_notification(9, prev=3) == (Verdict.APPLY, None)
    assert d.on_notification(12, prev=9) == (Verdict.APPLY, None)
    verdict, gap = d.on_notification(20, prev=15)
    assert verdict is Verdict.GAP and gap is not None


def test_reconnect_without_a_session_is_a_gap_with_one_it_is_not() -> None:
    d = GapDetector(last_seq=3, now=0.0)
    assert d.on_connect(session_present=True, now=1.0) is None
    gap = d.on_connect(session_present=False, now=2.0)
    assert gap is not None and "session" in gap.reason
    assert GapDetector().on_connect(session_present=False, now=0.0) is None  # nothing to lose yet


def test_a_session_less_subscription_is_a_gap_only_if_made_after_the_last_catch_up_began() -> None:
    """What a catch-up read covers what came before it; push covers what came after ``at``."""
    d = GapDetector()  # a first run: no sequence count to lose
    d.catching_up(10.0)
    d.caught_up(None, now=12.0)
    # Subscribed at 9, the catch-up began at 10: nothing fell between them.
    assert d.on_connect(session_present=False, now=13.0, at=9.0) is None
    # Subscribed at 11 (a broker that acknowledged late): 10..11 reached nobody.
    gap = d.on_connect(session_present=False, now=13.0, at=11.0)
    assert gap is not None and "after the last catch-up began" in gap.reason
    assert d.on_connect(session_present=True, now=13.0, at=11.0) is None  # the broker kept it
    # Read late, made early: what counts is when it was made, not when it is read.
    d.catching_up(20.0)
    assert d.on_connect(session_present=False, now=25.0, at=19.5) is None
    assert d.on_connect(session_present=False, now=25.0) is not None  # at defaults to now


def test_a_head_ahead_is_a_gap_only_if_not_filled_within_the_grace_period() -> None:
    d = GapDetector(last_seq=5, head_grace=2.0, now=0.0)
    assert d.on_head(8, now=0.0) is None
    assert d.tick(1.0) is None
    d.on_notification(6)
    d.on_notification(7)
    d.on_notification(8)
    assert d.tick(5.0) is None  # filled: no gap
    assert d.on_head(10, now=5.0) is None
    assert d.tick(6.0) is None
    gap = d.tick(7.5)
    assert gap is not None and (gap.first_missing, gap.last_missing) == (9, 10)
    assert d.tick(8.0) is None  # raised once


def test_a_head_at_the_cursor_is_no_gap() -> None:
    d = GapDetector(last_seq=5, head_grace=1.0, now=0.0)
    assert d.on_head(5, now=0.0) is None
    assert d.tick(10.0) is None


def test_a_silent_publisher_is_a_gap_once_per_silence() -> None:
    d = GapDetector(last_seq=1, heartbeat_timeout=3.0, safety_interval=1e9, now=0.0)
    assert d.tick(2.0) is None
    gap = d.tick(3.5)
    assert gap is not None and "heartbeat" in gap.reason
    assert d.tick(10.0) is None
    d.on_head(1, now=11.0)
    assert d.tick(13.0) is None
    assert d.tick(14.5) is not None


def test_the_safety_poll_comes_round_on_its_interval() -> None:
    d = GapDetector(safety_interval=300.0, heartbeat_timeout=1e9, now=0.0)
    assert d.tick(299.0) is None
    gap = d.tick(300.0)
    assert gap is not None and gap.reason == "safety poll"
    assert d.tick(301.0) is None
    d.caught_up(None, now=400.0)
    assert d.tick(650.0) is None
    assert d.tick(700.0) is not None


def test_caught_up_sets_the_next_expected_sequence() -> None:
    d = GapDetector(last_seq=3)
    d.on_notification(9)  # a gap...
    d.caught_up(12, now=0.0)  # ...resolved through 12
    assert d.on_notification(12)[0] is Verdict.DUPLICATE
    assert d.on_notification(13) == (Verdict.APPLY, None)
    d.caught_up(None, now=0.0)
    assert d.expected is None


def test_invalid_payloads_and_skips_are_gaps() -> None:
    d = GapDetector(last_seq=3)
    assert "invalid" in d.on_invalid("bad signature").reason
    gap = d.on_skipped(4, 10)
    assert (gap.first_missing, gap.last_missing) == (4, 9)
