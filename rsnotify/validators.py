"""Which HTTP validators may be relied on, as RFC 9110 defines them (sections 8.8.1-8.8.3, 13.1).

Polling a Change List with conditional GET is only safe if a ``304 Not
Modified`` can never hide a change.  Two rules make it so:

* **A Last-Modified is weak unless the response's Date is at least one second
  later** (section 8.8.2.2).  File servers (``python -m http.server``, nginx,
  Apache) give ``Last-Modified`` in whole seconds: a list written twice within
  one second, and fetched between the writes, keeps the same
  ``Last-Modified``, and a later ``If-Modified-Since`` is answered 304 until
  the file changes again in a later second, possibly never.  Such a date (or
  one without a ``Date`` to compare with) is therefore never sent back as
  ``If-Modified-Since``: the next poll is unconditional, and once a response
  shows the date a second or more in the past, it is strong and used.
* **Ranges need a strong entity tag** (sections 8.8.3, 13.1.5, 14.2).  A range
  of a representation can only be combined with bytes read earlier when both
  carry the same strong validator, and a client must not send ``If-Range``
  with a weak one.  rsnotify's tail read of a growing Change List asks for the
  bytes after the last complete entry *of a changed list*, so it sends no
  ``If-Range`` (which would turn every append into a full read) and instead
  checks that the answer continues the bytes it holds
  (:mod:`rsnotify.changes.incremental`); it makes such a request only to a
  server that identifies representations with a strong entity tag, and reads
  the whole list from any other.

An entity tag is used in ``If-None-Match`` whatever its strength: that header
uses the weak comparison function (section 13.1.2), and a server that marks a
tag weak has said that representations sharing it are equivalent.
"""

from __future__ import annotations

from email.utils import parsedate_to_datetime

__all__ = ["is_strong_etag", "strong_last_modified"]

STRONG_AFTER = 1.0  # seconds between Last-Modified and Date (RFC 9110 section 8.8.2.2)


def is_strong_etag(etag: str | None) -> bool:
    """True for a strong entity tag (``"xyz"``), False for a weak one (``W/"xyz"``) or none."""
    if not etag:
        return False
    tag = etag.strip()
    return len(tag) >= 2 and tag[0] == '"' and tag[-1] == '"'


def _http_date(value: str | None) -> float | None:
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


def strong_last_modified(last_modified: str | None, date: str | None) -> str | None:
    """``last_modified`` if it may be sent back as ``If-Modified-Since``, else None.

    Strong (RFC 9110 section 8.8.2.2) when the response's ``Date`` is at least
    one second after it, by the same (the server's) clock.  No ``Date``, an
    unparsable value or a gap under a second make it weak: None.
    """
    modified = _http_date(last_modified)
    generated = _http_date(date)
    if modified is None or generated is None or generated - modified < STRONG_AFTER:
        return None
    return last_modified
