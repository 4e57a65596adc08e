"""Read only what was appended to a growing Change List (pure helpers + state).

A Source appends to its open Change List; re-reading 50,000 entries to find
the one that is new would make detection cost grow with the list.  After one
full read we remember three things: the document's *header* (everything before
the first ``<url>``: the root start tag, ``rs:md``, ``rs:ln``), the byte
*offset* just past the last complete ``</url>``, and the *overlap* bytes just
before that offset.  The next read asks for ``Range: bytes=<offset - overlap>-``
and accepts the answer only if it starts with exactly the overlap we
remember; the new entries are then parsed from ``header + new bytes``, a
complete, tiny document.  Anything unexpected (no Range support, a shrunken
or rewritten list, an unfamiliar serialization) falls back to a full read,
which is always correct.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OVERLAP = 64
MAX_HEADER = 16 * 1024
_FIRST_ENTRY = re.compile(rb"<url[\s>]")
_ANY_ENTRY = re.compile(rb"<(?:url|sitemap)[\s>]")  # a Change List's or an index's entry
_LONGEST_START = len(b"<sitemap ")
_ENTRY_END = b"</url>"
_ROOT_END = b"</urlset"


@dataclass(frozen=True, slots=True)
class TailState:
    """Where the last complete entry of a list ends, and how to recognise that place."""

    header: bytes
    offset: int
    overlap: bytes

    @property
    def range_start(self) -> int:
        return self.offset - len(self.overlap)


def scan(body: bytes) -> TailState | None:
    """The tail state of a complete list body, or None if it cannot be read incrementally."""
    match = _FIRST_ENTRY.search(body, 0, MAX_HEADER + 5)
    if match is not None:
        first = match.start()
    else:  # no entries yet: the header runs up to the root's end tag
        first = body.rfind(_ROOT_END)
        if first < 0 or first > MAX_HEADER:
            return None
    end = body.rfind(_ENTRY_END)
    offset = first if end < first else end + len(_ENTRY_END)
    start = max(0, offset - OVERLAP)
    return TailState(header=body[:first], offset=offset, overlap=body[start:offset])


def fragment(state: TailState, body: bytes, start: int) -> tuple[bytes, TailState] | None:
    """Turn a Range answer starting at ``start`` into a small document of the new entries.

    Returns ``(document bytes, new state)``, or None when the answer does not
    continue the list we know (the overlap differs): the caller reads in full.
    """
    if start != state.range_start or not body.startswith(state.overlap):
        return None
    new = body[len(state.overlap) :]
    end = new.rfind(_ENTRY_END)
    if end < 0:  # nothing complete was appended
        return state.header + new, state
    consumed = end + len(_ENTRY_END)
    joined = state.overlap + new[:consumed]
    offset = state.offset + consumed
    return state.header + new, TailState(
        header=state.header, offset=offset, overlap=joined[-OVERLAP:]
    )


def regrown(state: TailState, body: bytes) -> tuple[bytes, TailState] | None:
    """The entries after the known end of a list read whole whose *header* alone changed.

    A Source closes a Change List by adding ``until`` to its ``rs:md``
    (Z39.99 section 12.1): every byte after the header shifts, so the ranged
    read fails its overlap check and the list is read whole, and a walk then
    parsed again the thousand entries it had consumed.  If ``body``'s entries
    still hold the overlap we remember at the shifted end offset, the entries
    before it are taken as unchanged, the same test a ranged read passes,
    and only those after it are returned, as :func:`fragment` does (with the
    new header).  None: anything else changed; parse the whole list.
    """
    match = _FIRST_ENTRY.search(body, 0, MAX_HEADER + 5)
    if match is None or len(state.overlap) < OVERLAP:
        return None  # no entries, or too few known bytes to recognise the place
    first = match.start()
    offset = state.offset + first - len(state.header)
    if offset < first or body[offset - OVERLAP : offset] != state.overlap:
        return None
    tail = scan(body)
    if tail is None or tail.offset < offset:
        return None
    return body[:first] + body[offset:], tail


class EntryCounter:
    """Counts entry start tags (``<url>``, ``<sitemap>``) in a document read chunk by chunk.

    Lets a reader refuse a list with too many entries while its bytes arrive,
    before it has buffered them all; :mod:`rsnotify.sitemap` still counts
    exactly when it parses.  A tag split between two chunks is counted once,
    when it completes; ``<urlset>`` and ``<sitemapindex>`` are not entries.
    Prefixed names (``<sm:url>``) are not counted: the parser's own limit
    covers those documents.
    """

    def __init__(self) -> None:
        self.count = 0
        self._carry = b""

    def feed(self, chunk: bytes) -> int:
        """Add one chunk; returns the entries seen so far."""
        buffer = self._carry + chunk
        carried = len(self._carry)
        self.count += sum(1 for m in _ANY_ENTRY.finditer(buffer) if m.end() > carried)
        self._carry = buffer[-(_LONGEST_START - 1) :]
        return self.count
