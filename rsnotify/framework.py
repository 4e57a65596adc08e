"""ResourceSync Framework Notification 1.0.1: the payload, and what a Destination makes of it.

Pure, no I/O.  A framework notification tells Destinations that a capability
document of a Source changed -- a new Resource List, an updated Change List,
a new Resource Dump -- "thereby providing an explicit trigger to poll a
Source" (section 1.1).  The text is
``shared/reference/resourcesync-framework-notification-1.0.1.txt``.

The payload (section 3)
    The structure is Change Notification's (a ``<urlset>``, a root
    ``rs:md``, an optional ``rs:ln rel="up"``, one ``<url>`` per change), so
    it is written and read with the same code (:func:`rsnotify.envelope.
    entry_fragment`, :func:`~rsnotify.envelope.compose`,
    :func:`~rsnotify.envelope.read_document`).  What differs: the root
    ``rs:md`` says ``capability="framework-notification"`` and its
    ``from``/``until`` are optional; each ``<url>`` names the changed
    document in ``<loc>`` and carries ``rs:md change=... capability=...``
    (both mandatory) and an optional ``datetime``; a document that resides
    under an index gets ``<rs:ln rel="index" href=INDEX>`` (notifications are
    never about the index itself, section 2).

What rsnotify writes
    ``up`` is the Capability List (the notifications are about its
    capability documents).  ``datetime`` is the document's own time when it
    has one -- a Resource List's ``at`` (or ``completed``), a Change List's
    last change -- so a Destination can compare it with where its mirror
    stands.  ``from``/``until`` are written, chained like Change
    Notification's: every logged framework change remembers when the one
    before it was detected (``since``), and a notification of changes
    ``a..b`` covers ``from`` = ``since`` of ``a`` up to ``until`` = the
    detection time of ``b``, so a Destination can see that one went missing.
    rsnotify's own fields ride in the ``urn:x-rsnotify:notification:1``
    namespace (``rsn:seq``, ``rsn:detected`` on each ``rs:md``,
    ``rsn:collection`` on the root), as in Change Notifications.

Table 2 (which change types a Source sends for which capability)
    Our copy of the text lost the table's columns; we read it as: Resource
    List created/updated, Resource Dump created (a changed Resource Dump is a
    new one), Change List and Change Dump created/updated, Capability List
    and Source Description created/updated/deleted.  :data:`CHANGE_TYPES`.
"""

from __future__ import annotations

import datetime as dt  # for classes with a field named datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from . import envelope, w3cdt
from .collection import is_valid_collection_id
from .envelope import (
    FRAMEWORK_CAPABILITY,
    MAX_XML_PAYLOAD_BYTES,
    RSNOTIFY_NS,
    InvalidNotification,
)
from .model import Capability, ChangeType, Entry, Link

# Any (strict module): JSON objects, checked field by field (_checked).

SPEC = "Framework Notification 1.0.1 section 3"
#: The log stream of a collection's framework notifications: ``<collection>.framework``.
#: A collection id always ends in ``-<8 hex digits>``, so no collection is named so.
STREAM_SUFFIX = ".framework"
#: The framework topic of a collection on rsnotify's hub: ``<hub><collection>/framework``.
TOPIC_SUFFIX = "/framework"
_RSN = f"{{{RSNOTIFY_NS}}}"
_CHANGES = {c.value: c for c in ChangeType}
MAX_CAPABILITY_CHARS = 64

C, U, D = ChangeType.CREATED, ChangeType.UPDATED, ChangeType.DELETED
#: Section 2.1, Table 2, as we read it (see the module docstring).
CHANGE_TYPES: dict[str, tuple[ChangeType, ...]] = {
    Capability.RESOURCELIST.value: (C, U),
    Capability.RESOURCEDUMP.value: (C,),
    Capability.CHANGELIST.value: (C, U),
    Capability.CHANGEDUMP.value: (C, U),
    Capability.CAPABILITYLIST.value: (C, U, D),
    Capability.DESCRIPTION.value: (C, U, D),
}


@dataclass(slots=True)
class FrameworkChange:
    """One change to a Source's framework: ``loc`` (a ``capability`` document) was ``change``d."""

    loc: str
    capability: str
    change: ChangeType
    datetime: dt.datetime | None = None  # the document's own time (a Resource List's ``at``)
    index: str | None = None  # the index the document resides under (section 2)
    seq: int | None = None  # rsnotify's sequence number in the collection's framework stream
    detected: dt.datetime | None = None  # when the publisher found it: the interval's end
    since: dt.datetime | None = None  # when the framework change before it was found

    @property
    def interval_start(self) -> dt.datetime | None:
        return self.since if self.since is not None else self.detected

    def describe(self) -> str:
        """One line for logs and the Destination's event table."""
        when = f" at {w3cdt.format(self.datetime)}" if self.datetime is not None else ""
        under = f" (under {self.index})" if self.index else ""
        return f"{self.capability} {self.change.value}: {self.loc}{when}{under}"


@dataclass(slots=True)
class FrameworkNotification:
    """One framework notification payload: its optional interval and its changes."""

    capabilitylist: str | None  # the ``up`` link
    from_: datetime | None
    until: datetime | None
    changes: list[FrameworkChange]
    collection: str | None = None
    published: datetime | None = None


# --- streams and topics ------------------------------------------------------------


def stream(collection: str) -> str:
    """The log stream holding ``collection``'s framework notifications."""
    return collection + STREAM_SUFFIX


def collection_of(name: str) -> str | None:
    """The collection of a framework stream, or None when ``name`` is not one."""
    if not name.endswith(STREAM_SUFFIX):
        return None
    base = name[: -len(STREAM_SUFFIX)]
    return base if is_valid_collection_id(base) else None


def base_collection(name: str) -> str:
    """The collection a stream belongs to (itself for a change stream)."""
    return collection_of(name) or name


# --- the logged form (JSON, one record per change) ----------------------------------


def to_record(change: FrameworkChange, *, collection: str, capabilitylist: str) -> bytes:
    """The log record of one framework change (canonical JSON, optional fields omitted)."""
    out: dict[str, Any] = {
        "v": envelope.VERSION,
        "kind": "framework",
        "collection": collection,
        "capabilitylist": capabilitylist,
        "loc": change.loc,
        "capability": change.capability,
        "change": change.change.value,
    }
    optional = {
        "seq": change.seq,
        "index": change.index,
        "datetime": change.datetime and w3cdt.format(change.datetime),
        "detected": change.detected and w3cdt.format(change.detected),
        "from": change.since and w3cdt.format(change.since),
    }
    out.update({k: v for k, v in optional.items() if v is not None})
    return envelope.dumps(out)


def _checked(obj: dict[str, Any]) -> FrameworkChange:
    """A framework change from decoded fields, by the rules of section 3."""
    loc = envelope._uri(envelope._require(obj, "loc", str), "loc")
    capability = envelope._require(obj, "capability", str)
    if not capability.strip() or len(capability) > MAX_CAPABILITY_CHARS:
        raise InvalidNotification(f"a framework change needs a capability ({SPEC})")
    change = _CHANGES.get(envelope._require(obj, "change", str))
    if change is None:
        raise InvalidNotification(
            f"unknown change {obj.get('change')!r}: created, updated or deleted ({SPEC})"
        )
    index = envelope._optional(obj, "index", str)
    seq = envelope._optional(obj, "seq", int)
    if seq is not None and seq < 1:
        raise InvalidNotification(f"sequence number {seq} is not positive")
    envelope._check_chars([loc, capability, index])

    def when(key: str) -> datetime | None:
        value = obj.get(key)
        return envelope._time(value, key) if value is not None else None

    return FrameworkChange(
        loc=loc,
        capability=capability.strip(),
        change=change,
        datetime=when("datetime"),
        index=envelope._uri(index, "index") if index else None,
        seq=seq,
        detected=when("detected"),
        since=when("from"),
    )


def from_record(data: bytes) -> FrameworkChange:
    """Decode a log record written by :func:`to_record` (InvalidNotification if it is not)."""
    try:
        obj = orjson.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidNotification(f"framework record is not JSON: {exc}") from None
    if not isinstance(obj, dict) or obj.get("kind") != "framework":
        raise InvalidNotification("not a framework notification record")
    return _checked(obj)


# --- the payload (XML) -----------------------------------------------------------------


def url_fragment(change: FrameworkChange) -> bytes:
    """The ``<url>`` of one framework change (section 3), rsnotify's fields namespaced."""
    extra = {_RSN + "seq": str(change.seq)} if change.seq is not None else {}
    if change.detected is not None:
        extra[_RSN + "detected"] = w3cdt.format(change.detected)
    entry = Entry(
        loc=change.loc,
        capability=change.capability,
        change=change.change,
        datetime=change.datetime,
        links=[Link(rel="index", href=change.index)] if change.index else [],
        md_extra=extra,
    )
    return envelope.entry_fragment(entry)


def to_xml(
    changes: Sequence[FrameworkChange],
    *,
    capabilitylist: str | None,
    collection: str | None = None,
    published: datetime | None = None,
) -> bytes:
    """One framework notification of ``changes`` (from the first's ``since`` to the last's
    detection; no interval when the changes carry no detection time)."""
    if not changes:
        raise ValueError("a framework notification holds at least one change")
    start, end = changes[0].interval_start, changes[-1].detected
    if start is not None and end is not None and end < start:
        end = start
    return envelope.compose(
        [url_fragment(c) for c in changes],
        capabilitylist=capabilitylist,
        from_=start,
        until=end,
        collection=collection,
        published=published,
        capability=FRAMEWORK_CAPABILITY,
    )


def decode(payload: bytes, *, max_bytes: int = MAX_XML_PAYLOAD_BYTES) -> FrameworkNotification:
    """Read a framework notification (any Source's: rsnotify's attributes are optional)."""
    document = envelope.read_document(
        payload, (FRAMEWORK_CAPABILITY,), spec=SPEC, max_bytes=max_bytes
    )
    start, end = document.from_, document.until
    if start is not None and end is not None and start > end:
        raise InvalidNotification(
            f"a framework notification's from is later than its until ({SPEC})"
        )
    changes = []
    for entry in document.entries:
        if entry.change is None or not entry.capability:
            raise InvalidNotification(
                f"{entry.loc[:200]!r}: each <url> of a framework notification needs rs:md "
                f"change and capability ({SPEC})"
            )
        extra = entry.md_extra
        index = next((link.href for link in entry.links if link.rel == "index"), None)
        seq = extra.get(_RSN + "seq")
        changes.append(
            _checked(
                {
                    "loc": entry.loc,
                    "capability": entry.capability,
                    "change": entry.change.value,
                    "datetime": entry.datetime and w3cdt.format(entry.datetime),
                    "index": index,
                    "seq": int(seq) if seq and seq.isascii() and seq.isdigit() else None,
                    "detected": extra.get(_RSN + "detected"),
                }
            )
        )
    if not changes:
        raise InvalidNotification(f"a framework notification without any <url> ({SPEC})")
    root = document.md_extra
    published = root.get(_RSN + "published")
    return FrameworkNotification(
        capabilitylist=document.up,
        from_=start,
        until=end,
        changes=changes,
        collection=root.get(_RSN + "collection"),
        published=envelope._time(published, "published") if published else None,
    )


# --- what a Destination makes of it ----------------------------------------------------


def rebaseline_cue(
    changes: Iterable[FrameworkChange],
    *,
    position: datetime | None,
    coverage_start: datetime | None,
) -> str | None:
    """Why a fresh baseline is due, or None.

    ``position`` is where the mirror stood when the Destination last came
    back (its Change List position before its latest catch-up: at or after
    its last baseline); ``coverage_start`` is the earliest ``from`` of the
    Source's Change Lists.  A Resource List created or updated with an
    ``at`` newer than ``position`` is a cue to re-baseline when the Change
    Lists no longer reach back to ``position``: the Destination was away
    longer than they cover, so no walk of them can bring the mirror up to
    date, and this Resource List can.  Without a datetime the Resource List
    is taken to be newer (the cue only makes the Destination read it).
    """
    if position is None or coverage_start is None or position >= coverage_start:
        return None  # the Change Lists cover the time away: a walk of them is enough
    for change in changes:
        if change.capability != Capability.RESOURCELIST or change.change is ChangeType.DELETED:
            continue
        if change.datetime is None or change.datetime > position:
            at = w3cdt.format(change.datetime) if change.datetime else "undated"
            return (
                f"Resource List {change.loc} {change.change.value} ({at}) is newer than this "
                f"mirror's position {w3cdt.format(position)}, and the Change Lists start at "
                f"{w3cdt.format(coverage_start)}: the Destination was away longer than they cover"
            )
    return None


def polls_change_lists(changes: Iterable[FrameworkChange]) -> bool:
    """True when a change says the Change Lists hold something new (a cue to read them)."""
    return any(c.capability == Capability.CHANGELIST for c in changes)
