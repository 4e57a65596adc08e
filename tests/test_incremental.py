"""Reading only the appended bytes of a Change List, with overlap verification."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rsnotify import sitemap
from rsnotify.changes.incremental import OVERLAP, fragment, regrown, scan
from rsnotify.model import ChangeType, Entry, Link, Root, make_document

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def changelist(n: int, *, closed: bool = False) -> bytes:
    entries = [
        Entry(loc=f"http://s/r{i}", lastmod=T0 + timedelta(seconds=i), change=ChangeType.CREATED)
        for i in range(n)
    ]
    doc = make_document(
        Root.URLSET,
        "changelist",
        from_=T0,
        until=T0 + timedelta(seconds=n) if closed else None,
        links=[Link("up", "http://s/cap.xml")],
        entries=entries,
    )
    return sitemap.serialize(doc)


def test_appended_entries_are_read_from_the_range_answer_alone() -> None:
    old, new = changelist(100), changelist(103)
    state = scan(old)
    assert state is not None and new.startswith(old[: state.offset])
    answer = new[state.range_start :]
    piece = fragment(state, answer, state.range_start)
    assert piece is not None
    document, after = piece
    assert [e.loc for e in sitemap.parse(document)] == [
        "http://s/r100",
        "http://s/r101",
        "http://s/r102",
    ]
    assert after.offset == scan(new).offset  # type: ignore[union-attr]
    assert len(after.overlap) == OVERLAP
    # Nothing appended since: the next fragment holds no entry.
    again = fragment(after, new[after.range_start :], after.range_start)
    assert again is not None and list(sitemap.parse(again[0])) == []


def test_a_rewritten_prefix_is_detected_and_refused() -> None:
    old = changelist(50)
    state = scan(old)
    assert state is not None
    tampered = bytearray(changelist(52))
    tampered[state.range_start + 3] ^= 0x20  # a byte inside the overlap changed
    assert fragment(state, bytes(tampered[state.range_start :]), state.range_start) is None
    assert fragment(state, changelist(52)[state.range_start + 1 :], state.range_start + 1) is None


def test_an_empty_list_can_be_followed_incrementally() -> None:
    state = scan(changelist(0))
    assert state is not None
    grown = changelist(2)
    piece = fragment(state, grown[state.range_start :], state.range_start)
    assert piece is not None
    assert len(sitemap.parse(piece[0])) == 2


def test_a_body_without_a_recognisable_header_is_not_followed() -> None:
    assert scan(b"<x/>") is None


def test_a_list_closed_since_is_parsed_from_the_known_end() -> None:
    """Closing adds ``until`` to the header (section 12.1): the entries after it only shift."""
    old, closed = changelist(100), changelist(103, closed=True)
    state = scan(old)
    assert state is not None and fragment(state, closed[state.range_start :], 0) is None
    piece = regrown(state, closed)
    assert piece is not None
    document, after = piece
    assert b"until=" in document and document.count(b"<url>") == 3
    assert [e.loc for e in sitemap.parse(document)] == [
        "http://s/r100",
        "http://s/r101",
        "http://s/r102",
    ]
    assert after == scan(closed)
    # Unchanged but for the header, nothing new: a document of no entries.
    assert regrown(state, changelist(100, closed=True))[0].count(b"<url>") == 0  # type: ignore[index]


def test_a_list_rewritten_before_its_known_end_is_parsed_whole() -> None:
    old = changelist(100)
    state = scan(old)
    assert state is not None
    at = old.rindex(b'change="created"')  # the last known entry changed (its overlap)
    assert regrown(state, old[:at] + b'change="updated"' + old[at + 16 :]) is None
    assert regrown(state, changelist(99, closed=True)) is None  # shrank
    assert regrown(state, b"<urlset/>") is None
