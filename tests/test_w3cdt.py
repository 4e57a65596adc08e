"""W3C Datetime (https://www.w3.org/TR/NOTE-datetime) as ResourceSync uses it.

Every time in a ResourceSync document goes through :mod:`rsnotify.w3cdt`, and
Change List positions are compared across documents, so a value parsed in the
wrong zone (or accepted when it should not be) silently reorders changes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsnotify import w3cdt
from rsnotify.errors import DocumentError, InvalidDatetime, InvalidValue, RsNotifyError


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


VALID = [
    # The six forms of the W3C note, with its own example values.
    ("1997", utc(1997, 1, 1)),
    ("1997-07", utc(1997, 7, 1)),
    ("1997-07-16", utc(1997, 7, 16)),
    ("1997-07-16T19:20+01:00", utc(1997, 7, 16, 18, 20)),
    ("1997-07-16T19:20:30+01:00", utc(1997, 7, 16, 18, 20, 30)),
    ("1997-07-16T19:20:30.45+01:00", utc(1997, 7, 16, 18, 20, 30, 450000)),
    # The form the specification recommends, and the ones its examples use.
    ("2013-01-03T09:00:00Z", utc(2013, 1, 3, 9)),
    ("2013-01-03T09:00Z", utc(2013, 1, 3, 9)),
    ("2013-01-03T09:00:00.000001Z", utc(2013, 1, 3, 9, 0, 0, 1)),
    ("2013-01-03T09:00:00.5Z", utc(2013, 1, 3, 9, 0, 0, 500000)),
    # Offsets are normalised to UTC, across day and year boundaries.
    ("1997-07-16T22:00:00-05:00", utc(1997, 7, 17, 3)),
    ("2013-01-01T01:00:00+14:00", utc(2012, 12, 31, 11)),
    ("2013-01-01T00:00:00-00:00", utc(2013, 1, 1)),
    ("2013-01-01T05:30:00+05:30", utc(2013, 1, 1)),
    ("2013-01-01T00:00:00.25-09:30", utc(2013, 1, 1, 9, 30, 0, 250000)),
    # Fractions finer than a microsecond are cut to what datetime holds.
    ("2013-01-03T09:00:00.123456789Z", utc(2013, 1, 3, 9, 0, 0, 123456)),
    # Leap day, and whitespace around element content.
    ("2012-02-29T12:00:00Z", utc(2012, 2, 29, 12)),
    ("  2013-01-03T09:00:00Z\n", utc(2013, 1, 3, 9)),
]


@pytest.mark.parametrize(("text", "expected"), VALID)
def test_valid_forms_parse_to_aware_utc(text: str, expected: datetime) -> None:
    parsed = w3cdt.parse(text)
    assert parsed == expected
    assert parsed.tzinfo is not None
    assert parsed.utcoffset() == timedelta(0)
    # Written back, every value is the recommended UTC form and reads the same.
    assert w3cdt.parse(w3cdt.format(parsed)) == parsed


INVALID = [
    ("", "empty"),
    ("now", "not a date"),
    ("19970716", "basic format date"),
    ("19970716T192030Z", "basic format date and time"),
    ("1997-07-16T192030Z", "basic format time"),
    ("1997-07-16T19:20:30", "time without a zone"),
    ("1997-07-16T19:20", "hours and minutes without a zone"),
    ("1997-07-16T19:20:30,45Z", "comma fraction"),
    ("1997-07-16 19:20:30Z", "space separator"),
    ("1997-07-16t19:20:30z", "lowercase designators"),
    ("1997-07-16T19Z", "hours only"),
    ("1997-07-16Z", "zone without a time"),
    ("1997-07-16T19:20.5Z", "fraction of a minute"),
    ("1997-07-16T19:20:30+0100", "offset without colon"),
    ("1997-07-16T19:20:30+01", "offset without minutes"),
    ("1997-07-16T19:20:30+24:00", "offset of a whole day"),
    ("1997-07-16T19:20:30ZZ", "two zones"),
    ("1997-07-16T19:20:30+01:00Z", "offset and Z"),
    ("1997-07-16T19:20:30Zjunk", "trailing text"),
    ("1997-13-01", "month 13"),
    ("1997-00-10", "month 0"),
    ("1997-07-32", "day 32"),
    ("2013-02-29", "29 February of a common year"),
    ("1997-07-16T24:00:00Z", "hour 24"),
    ("1997-07-16T19:60:00Z", "minute 60"),
    ("1997-07-16T19:20:60Z", "second 60"),
    ("1997-7-16", "one-digit month"),
    ("97-07-16", "two-digit year"),
    ("+1997-07-16", "signed year"),
    ("0000", "year 0"),
    ("1997-W29", "ISO week date"),
    ("1997-197", "ISO ordinal date"),
    ("1997-07-16T19:20:30+01:60", "offset minute 60"),
    ("1997-07-16T19:20:30+24:00", "offset hour 24"),
    ("1997-07-16T19:20:30+01:00:30", "offset with seconds"),
    ("1997-07-16T19:20:30.Z", "fraction without digits"),
    ("\uff11\uff19\uff19\uff17-07-16", "full-width digits"),
    ("1997-07-16T19:20:3\uff10Z", "full-width digit in a full time"),
]


@pytest.mark.parametrize(("text", "why"), INVALID)
def test_invalid_forms_are_refused(text: str, why: str) -> None:
    try:
        result = w3cdt.parse(text)
    except InvalidDatetime as exc:
        assert repr(text) in str(exc)
        return
    raise AssertionError(f"{why}: {text!r} was accepted as {result!r}")


def test_invalid_datetime_belongs_to_the_documented_families() -> None:
    with pytest.raises(InvalidDatetime) as caught:
        w3cdt.parse("1997-13-01")
    assert isinstance(caught.value, InvalidValue)
    assert isinstance(caught.value, DocumentError)
    assert isinstance(caught.value, RsNotifyError)


def test_format_writes_utc_with_z() -> None:
    plus_two = timezone(timedelta(hours=2))
    assert w3cdt.format(datetime(2013, 1, 3, 1, 0, tzinfo=plus_two)) == "2013-01-02T23:00:00Z"
    assert w3cdt.format(utc(2013, 1, 3, 9)) == "2013-01-03T09:00:00Z"


def test_format_keeps_microseconds_only_when_present() -> None:
    assert w3cdt.format(utc(2013, 1, 3, 9, 0, 0, 1)) == "2013-01-03T09:00:00.000001Z"
    assert w3cdt.format(utc(2013, 1, 3, 9, 0, 0, 450000)) == "2013-01-03T09:00:00.450000Z"


def test_format_refuses_naive_datetimes() -> None:
    """A naive value has no zone: guessing one shifts a mirror by hours."""
    with pytest.raises(ValueError, match="naive"):
        w3cdt.format(datetime(2013, 1, 3, 9))


@pytest.mark.parametrize(
    "value",
    [
        utc(1000, 1, 1),
        utc(2013, 1, 3),
        utc(999, 12, 31, 23, 59, 59),
        utc(1, 1, 1),
    ],
)
def test_format_writes_four_digit_years(value: datetime) -> None:
    text = w3cdt.format(value)
    assert text[:5] == f"{value.year:04d}-"
    assert w3cdt.parse(text) == value


@pytest.mark.parametrize(
    "value",
    [utc(1970, 1, 1), utc(2013, 1, 3, 9, 0, 0, 123456), utc(9999, 12, 31, 23, 59, 59, 999999)],
)
def test_format_then_parse_is_identity(value: datetime) -> None:
    assert w3cdt.parse(w3cdt.format(value)) == value


def _formatted_afresh(value: datetime) -> str:
    """What format() writes, by the general way (convert, strip the zone, format)."""
    return value.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"


@given(
    value=st.datetimes(
        min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
    ),
    fraction=st.sampled_from(["", ".0", ".000000", ".5", ".500000", ".123456", ".1234567"]),
    zone=st.sampled_from(["Z", "+00:00", "+05:30", "-01:00"]),
)
def test_format_of_a_utc_time_takes_a_short_way_to_the_same_text(
    value: datetime, fraction: str, zone: str
) -> None:
    """format()'s short way for UTC times writes what the general way writes.

    From texts in every form (with or without a fraction, in any zone), and
    the same instant in another zone.
    """
    text = f"{value.replace(microsecond=0).isoformat()[:19]}{fraction}{zone}"
    parsed = w3cdt.parse(text)
    assert w3cdt.format(parsed) == _formatted_afresh(parsed)
    assert w3cdt.format(parsed.astimezone(timezone(timedelta(hours=3)))) == _formatted_afresh(
        parsed
    )
    with pytest.raises(ValueError):
        w3cdt.format(parsed.replace(tzinfo=None))  # naive: refused


def test_now_is_aware_utc() -> None:
    before = datetime.now(UTC)
    now = w3cdt.now()
    after = datetime.now(UTC)
    assert now.utcoffset() == timedelta(0)
    assert before <= now <= after
