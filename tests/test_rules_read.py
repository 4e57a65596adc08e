"""Reading changes: the batch reader takes the decisions of the one-change reader."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsnotify.model import ChangeType, Entry, Link
from rsnotify.subscriber.rules import ChangeView, _view, read_change, read_changes
from rsnotify.subscriber.trust import beyond_skew

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
SKEW = 300.0


@st.composite
def entries(draw: st.DrawFn) -> Entry:
    # Change times on both sides of the skew bound, to the microsecond, in any zone.
    offset = draw(st.integers(-3, 3)) + draw(st.sampled_from([0, SKEW]))
    micros = draw(st.integers(-2, 2))
    zone = timezone(timedelta(minutes=draw(st.sampled_from([0, 90, -330]))))
    when = (NOW + timedelta(seconds=offset, microseconds=micros)).astimezone(zone)
    lastmod_only = draw(st.booleans())
    links = [Link(rel="duplicate", href="http://m/x")] if draw(st.booleans()) else []
    return Entry(
        loc=f"http://s/{draw(st.integers(0, 9))}",
        change=draw(st.sampled_from(list(ChangeType))),
        lastmod=when if lastmod_only else None,
        datetime=None if lastmod_only else when,
        hash=draw(st.sampled_from([None, "md5:" + "a" * 32 + " sha-256:" + "b" * 64])),
        length=draw(st.sampled_from([None, 0, 7])),
        links=links,
    )


@settings(max_examples=200, deadline=None)
@given(batch=st.lists(entries(), max_size=8), unordered=st.booleans())
def test_read_changes_is_read_change_of_each(batch: list[Entry], unordered: bool) -> None:
    views = read_changes(batch, max_skew=SKEW, now=NOW, collection="c", unordered=unordered)
    assert views == [
        read_change(e, max_skew=SKEW, now=NOW, collection="c", unordered=unordered) for e in batch
    ]
    for entry, view in zip(batch, views, strict=True):
        assert view.confirmed is not beyond_skew(view.datetime, NOW, SKEW)
        assert view.datetime == entry.change_time


def test_views_made_through_the_slots_equal_views_made_by_init() -> None:
    """rules._view skips the frozen __init__: every field must land where __init__ puts it."""
    # A distinct value per field, so a setter wired to the wrong field shows.
    values = (
        "http://s/a", ChangeType.DELETED, NOW, 7, {"md5": "ab"}, 3, ("http://m/a",),
        False, "c1", True, True,
    )  # fmt: skip
    assert len(values) == len(fields(ChangeView))
    made, built = _view(*values), ChangeView(*values)
    assert made == built
    assert [getattr(made, f.name) for f in fields(ChangeView)] == list(values)
    with pytest.raises(FrozenInstanceError):
        made.loc = "http://s/b"  # type: ignore[misc]
