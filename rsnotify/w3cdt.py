"""W3C Datetime (https://www.w3.org/TR/NOTE-datetime) parsing and formatting.

ResourceSync times are W3C Datetimes: ``YYYY``, ``YYYY-MM``, ``YYYY-MM-DD`` or a
full time with an explicit zone (``Z`` or ``+hh:mm``) and optional fractions.
We normalise everything to timezone-aware UTC ``datetime`` values so that times
from different documents compare correctly, and always write UTC with ``Z``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

from .errors import InvalidDatetime

_W3C = re.compile(
    r"(?P<Y>[0-9]{4})(?:-(?P<M>[0-9]{2})(?:-(?P<D>[0-9]{2})"
    r"(?:T(?P<h>[0-9]{2}):(?P<m>[0-9]{2})(?::(?P<s>[0-9]{2})(?:\.(?P<f>[0-9]+))?)?"
    r"(?P<tz>Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9]))?)?)?"
)


def parse(value: str) -> datetime:
    """Parse a W3C Datetime into an aware UTC datetime, or raise InvalidDatetime."""
    text = value.strip()
    # Fast path for the common full form: fromisoformat is C-fast, and the
    # shape checks reject what W3C Datetime does not allow but fromisoformat
    # would take (basic format, comma fractions, offsets with seconds or
    # minutes past 59, non-ASCII digits): those fall through to the regex.
    if (
        len(text) >= 20
        and text.isascii()
        and text[4] == "-"
        and text[7] == "-"
        and text[10] == "T"
        and text[13] == ":"
        and text[16] == ":"
        and (text[19] != "." or text[20:21].isdigit())
        and (text[-1] == "Z" or (text[-6] in "+-" and text[-3] == ":" and text[-2] in "012345"))
        and "," not in text
    ):
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return parsed if parsed.tzinfo is UTC else _to_utc(parsed, value)
    match = _W3C.fullmatch(text)
    if match is None:
        raise InvalidDatetime(f"not a W3C datetime: {value!r}")
    g = match.groupdict()
    try:
        frac = g["f"] or "0"
        micro = int((frac + "000000")[:6])
        tz = UTC
        if g["tz"] and g["tz"] != "Z":
            sign = 1 if g["tz"][0] == "+" else -1
            tz = timezone(sign * timedelta(hours=int(g["tz"][1:3]), minutes=int(g["tz"][4:6])))
        parsed = datetime(
            int(g["Y"]),
            int(g["M"] or 1),
            int(g["D"] or 1),
            int(g["h"] or 0),
            int(g["m"] or 0),
            int(g["s"] or 0),
            micro,
            tzinfo=tz,
        )
    except ValueError as exc:
        raise InvalidDatetime(f"not a W3C datetime: {value!r} ({exc})") from None
    return _to_utc(parsed, value)


def _to_utc(parsed: datetime, value: str) -> datetime:
    # 9999-12-31T23:59:59-01:00 is a valid W3C datetime whose UTC instant is
    # past datetime.max: refuse it as a bad value, not with an OverflowError.
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise InvalidDatetime(f"not a representable time: {value!r}") from None


def format(value: datetime) -> str:
    """Write an aware datetime as UTC ``YYYY-MM-DDThh:mm:ss[.ffffff]Z``.

    Naive datetimes are refused: guessing a zone is how mirrors drift by hours.
    """
    if value.tzinfo is None:
        raise ValueError("refusing to serialize a naive datetime; use an aware UTC datetime")
    # isoformat (not strftime, whose %Y does not zero-pad years below 1000 on
    # glibc) is C code: this runs for every notification a transport sends,
    # and for every change time a Destination's detection digests
    # (tracker.entry_digest), nearly all of them in the UTC the parser makes.
    if value.tzinfo is UTC:
        return value.isoformat()[:-6] + "Z"  # "+00:00" -> "Z", without a conversion
    return value.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"


def now() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(UTC)
