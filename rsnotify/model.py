"""The ResourceSync document model (Z39.99 sections 6-13, Appendix A).

Plain dataclasses, no I/O.  A document is a root (``urlset`` or
``sitemapindex``) with document-level ``rs:md`` and ``rs:ln``, and a sequence of
entries (``<url>`` or ``<sitemap>``) each with ``loc``, ``lastmod``,
``changefreq``, an ``rs:md`` and repeated ``rs:ln``.  Every specific document
(Resource List, Change List Index, ...) is that same shape with a capability,
so one :class:`Document` class carries them all and typed subclasses add the
vocabulary of each; :func:`document_class` picks the subclass the way the
specification says a Destination must: root element first, then capability.

Times are aware UTC ``datetime`` values.  ResourceSync 1.0 puts a change's time
in ``<lastmod>``; 1.1 adds ``rs:md datetime``.  :attr:`Entry.change_time` reads
either, so no caller has to care which version a Source speaks.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

SITEMAP_NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
RS_NS = "http://www.openarchives.org/rs/terms/"


class Capability(StrEnum):
    """Values of ``rs:md capability`` (section 7)."""

    DESCRIPTION = "description"
    CAPABILITYLIST = "capabilitylist"
    RESOURCELIST = "resourcelist"
    RESOURCEDUMP = "resourcedump"
    RESOURCEDUMP_MANIFEST = "resourcedump-manifest"
    CHANGELIST = "changelist"
    CHANGEDUMP = "changedump"
    CHANGEDUMP_MANIFEST = "changedump-manifest"


#: Capability values other published ResourceSync specifications define: the
#: Archives specification's four, and the notification documents'
#: (ResourceSync Change Notification and Framework Notification 1.0.1; the 1.0
#: draft's ``changelist-notification`` too).  A reader accepts them without a
#: word; any other value is read as a generic document, with a warning.
EXTENSION_CAPABILITIES = frozenset(
    {
        "resourcelist-archive",
        "resourcedump-archive",
        "changelist-archive",
        "changedump-archive",
        "change-notification",
        "framework-notification",
        "changelist-notification",
    }
)
KNOWN_CAPABILITIES = frozenset({c.value for c in Capability}) | EXTENSION_CAPABILITIES

#: The ``rs:ln rel`` of rsnotify's MQTT and WebSocket channels in a Capability
#: List: an extension relation type (RFC 8288 section 2.1.2), which a Destination
#: following the standard ignores.  :mod:`rsnotify.discovery` reads it; the
#: publisher's advertisement and the simulator write it.
CHANNEL_REL = "urn:x-rsnotify:channel"


class ChangeType(StrEnum):
    """Values of ``rs:md change`` (section 7)."""

    CREATED = "created"
    UPDATED = "updated"
    DELETED = "deleted"


class Root(StrEnum):
    """The two Sitemap root elements; an index is always a ``sitemapindex``."""

    URLSET = "urlset"
    SITEMAPINDEX = "sitemapindex"


CHANGEFREQS = frozenset({"always", "hourly", "daily", "weekly", "monthly", "yearly", "never"})


@dataclass(slots=True)
class Link:
    """An ``rs:ln`` element: ``rel`` and ``href`` plus the Table 3 attributes.

    ``extra`` keeps attributes from community namespaces (Clark notation keys,
    ``{ns}name``) so a document round-trips without losing them.
    """

    rel: str
    href: str
    hash: str | None = None
    length: int | None = None
    modified: dt.datetime | None = None
    path: str | None = None
    type: str | None = None
    pri: int | None = None
    encoding: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def priority(self) -> int:
        """``pri`` with the specification's default of 999,999 when absent."""
        return 999_999 if self.pri is None else self.pri


@dataclass(slots=True)
class Entry:
    """A ``<url>`` (or ``<sitemap>``) element with its ``rs:md`` flattened in.

    ``datetime`` is the ResourceSync 1.1 ``rs:md datetime`` attribute;
    :attr:`change_time` is what callers should use.
    """

    loc: str
    lastmod: dt.datetime | None = None
    changefreq: str | None = None
    change: ChangeType | None = None
    datetime: dt.datetime | None = None
    hash: str | None = None
    length: int | None = None
    type: str | None = None
    path: str | None = None
    encoding: str | None = None
    capability: str | None = None
    at: dt.datetime | None = None
    completed: dt.datetime | None = None
    from_: dt.datetime | None = None
    until: dt.datetime | None = None
    links: list[Link] = field(default_factory=list)
    md_extra: dict[str, str] = field(default_factory=dict)
    line: int | None = field(default=None, compare=False, repr=False)

    def __reduce__(self) -> tuple[Callable[..., Entry], tuple[Any, ...]]:
        """Pickled as the call that makes it, every field positional.

        A catch-up's Change Lists are parsed in a worker process
        (:mod:`rsnotify.changes.listparse`) and come back pickled: by the
        default protocol for a class with slots, unpickling a 1,000-entry list
        took 4.4 ms, this way 1.9 ms (19 ms to parse it).
        """
        return (Entry, (
            self.loc, self.lastmod, self.changefreq, self.change, self.datetime, self.hash,
            self.length, self.type, self.path, self.encoding, self.capability, self.at,
            self.completed, self.from_, self.until, self.links, self.md_extra, self.line,
        ))  # fmt: skip

    @property
    def change_time(self) -> dt.datetime | None:
        """When the change happened: ``rs:md datetime`` (1.1) else ``<lastmod>`` (1.0)."""
        return self.datetime if self.datetime is not None else self.lastmod

    @property
    def position(self) -> tuple[dt.datetime | None, str]:
        """(change time, loc): how the specification locates an entry in a Change List."""
        return (self.change_time, self.loc)

    def hashes(self) -> dict[str, str]:
        """``hash`` as ``{"md5": hex, "sha-256": hex}``."""
        return parse_hashes(self.hash)

    def link(self, rel: str) -> Link | None:
        """The highest-priority link with this relation, if any."""
        matches = [ln for ln in self.links if ln.rel == rel]
        return min(matches, key=lambda ln: ln.priority) if matches else None


#: Digest sizes in bytes of the hash algorithms rsnotify verifies (``hash`` tokens, section 7).
DIGEST_SIZES = {"md5": 16, "sha-1": 20, "sha-256": 32, "sha-512": 64}
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
# Hex digits only (ASCII: a regular expression's \d or isalnum() would take more): a
# match is several times faster than set(text) <= _HEX_DIGITS, and every change read
# from a Change List has its hashes normalised.
_HEX = re.compile("[0-9a-fA-F]+")
# "md5:<hex> sha-256:<hex>" in lowercase, the form rsnotify and resync write: parse_hashes'
# general path gives exactly these two, so they are taken as they are.
_COMMON_HASH = re.compile("md5:([0-9a-f]{32}) sha-256:([0-9a-f]{64})")


def normalize_digest(algo: str, digest: str) -> str | None:
    """A ``hash`` token's digest as lowercase hex, or None when it is in neither known form.

    Section 7 says "hex-encoded", but the field writes both: resync before 1.0
    and the Cornell simulator wrote base64 MD5 (``md5:E+0tzxHYD0ohNZG+DFqXrA==``),
    and a base64 digest lowercased and compared as hex never matches.  For the
    algorithms of :data:`DIGEST_SIZES` the two forms cannot be confused: the
    hex form of an n-byte digest has 2n characters, the base64 form 4*ceil(n/3)
    (padded) or fewer (unpadded), so the length says which it is.  Standard
    and URL-safe base64 are both read.  Other algorithms are returned as
    written (lowercased when hex): rsnotify cannot verify them anyway.
    """
    text = digest.strip()
    size = DIGEST_SIZES.get(algo.lower())
    if size is None:
        return text.lower() if _HEX.fullmatch(text) else text
    if len(text) == 2 * size and _HEX.fullmatch(text):
        return text.lower()
    if len(text) not in (-(-size // 3) * 4, -(-size * 4 // 3)):
        return None
    padded = text + "=" * (-len(text) % 4)
    try:
        raw = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (ValueError, binascii.Error):
        return None
    return raw.hex() if len(raw) == size else None


def parse_hashes(value: str | None) -> dict[str, str]:
    """Split a ``hash`` attribute (whitespace-delimited ``algo:digest``) into a dict.

    Keys are lowercase algorithm names; digests of known algorithms come back
    as lowercase hex whether the Source wrote hex or base64 (see
    :func:`normalize_digest`).  A digest in neither form is kept *as written*
    so that the verifier can name it (:func:`is_checkable` tells which).
    """
    if not value:
        return {}
    common = _COMMON_HASH.fullmatch(value)
    if common is not None:  # what most Sources write, already in normal form
        return {"md5": common[1], "sha-256": common[2]}
    out: dict[str, str] = {}
    for token in value.split():
        algo, sep, digest = token.partition(":")
        if sep and algo and digest:
            algo = algo.lower()
            normal = normalize_digest(algo, digest)
            out[algo] = digest if normal is None else normal
    return out


def is_checkable(algo: str, digest: str) -> bool:
    """True when ``digest`` is the lowercase hex digest of a known algorithm's size."""
    size = DIGEST_SIZES.get(algo)
    return (
        size is not None
        and len(digest) == 2 * size
        and set(digest) <= _HEX_DIGITS
        and (digest == digest.lower())
    )


@dataclass(slots=True)
class Document:
    """Any ResourceSync document: root kind, document-level metadata and links, entries."""

    root: Root
    capability: str
    at: dt.datetime | None = None
    completed: dt.datetime | None = None
    from_: dt.datetime | None = None
    until: dt.datetime | None = None
    links: list[Link] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    md_extra: dict[str, str] = field(default_factory=dict)

    @property
    def is_index(self) -> bool:
        """True for a ``sitemapindex`` (Resource List Index, Change List Index...)."""
        return self.root is Root.SITEMAPINDEX

    def link(self, rel: str) -> Link | None:
        """The highest-priority document-level link with this relation, if any."""
        matches = [ln for ln in self.links if ln.rel == rel]
        return min(matches, key=lambda ln: ln.priority) if matches else None

    def links_with(self, rel: str) -> list[Link]:
        """All document-level links with this relation, by priority."""
        return sorted((ln for ln in self.links if ln.rel == rel), key=lambda ln: ln.priority)

    @property
    def up(self) -> str | None:
        link = self.link("up")
        return link.href if link else None

    @property
    def index(self) -> str | None:
        link = self.link("index")
        return link.href if link else None

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


# --- typed documents ---------------------------------------------------------
# Subclasses add no fields, only vocabulary, so any Document converts freely.


@dataclass(slots=True)
class SourceDescription(Document):
    """Section 8: enumerates the Source's Capability Lists."""

    @property
    def capability_lists(self) -> list[str]:
        return [e.loc for e in self.entries if e.capability == Capability.CAPABILITYLIST]


@dataclass(slots=True)
class SourceDescriptionIndex(Document):
    """Section 8: groups several Source Descriptions."""


@dataclass(slots=True)
class CapabilityList(Document):
    """Section 9: one entry per capability for one set of resources.

    ``hubs`` are the push channels rsnotify advertises with ``rs:ln rel="hub"``.
    """

    @property
    def capabilities(self) -> dict[str, str]:
        return {e.capability: e.loc for e in self.entries if e.capability}

    def capability_url(self, capability: str) -> str | None:
        return self.capabilities.get(capability)

    @property
    def hubs(self) -> list[Link]:
        return self.links_with("hub")


@dataclass(slots=True)
class ResourceList(Document):
    """Section 10.1: a snapshot of the resources at ``at``."""


@dataclass(slots=True)
class ResourceListIndex(Document):
    """Section 10.2: groups Resource Lists."""


@dataclass(slots=True)
class ResourceDump(Document):
    """Section 11.1: points at ZIP packages of resources."""


@dataclass(slots=True)
class ResourceDumpIndex(Document):
    """Section 11.1: groups Resource Dumps."""


@dataclass(slots=True)
class ResourceDumpManifest(Document):
    """Section 11.2: the bitstreams inside one Resource Dump package."""


@dataclass(slots=True)
class ChangeList(Document):
    """Section 12.1: changes in forward chronological order since ``from``.

    A list without ``until`` is open: the Source will append to it.
    """

    @property
    def is_open(self) -> bool:
        return self.until is None


@dataclass(slots=True)
class ChangeListIndex(Document):
    """Section 12.2: Change Lists in forward chronological order.

    Each entry's ``from_``/``until`` is the interval of one Change List; the one
    without ``until`` is the open list.
    """

    @property
    def open_lists(self) -> list[Entry]:
        return [e for e in self.entries if e.until is None]

    def lists_since(self, when: dt.datetime | None) -> list[Entry]:
        """The Change Lists that may hold changes at or after ``when``.

        Lists that ended before ``when`` are skipped; a list ending exactly at
        ``when`` is kept, since entries sharing the boundary time may sit in it.
        """
        if when is None:
            return list(self.entries)
        return [e for e in self.entries if e.until is None or e.until >= when]


@dataclass(slots=True)
class ChangeDump(Document):
    """Section 13.1: points at ZIP packages of changed resources."""


@dataclass(slots=True)
class ChangeDumpIndex(Document):
    """Section 13.1: groups Change Dumps."""


@dataclass(slots=True)
class ChangeDumpManifest(Document):
    """Section 13.2: the bitstreams inside one Change Dump package."""


_CLASSES: dict[tuple[Root, str], type[Document]] = {
    (Root.URLSET, Capability.DESCRIPTION): SourceDescription,
    (Root.SITEMAPINDEX, Capability.DESCRIPTION): SourceDescriptionIndex,
    (Root.URLSET, Capability.CAPABILITYLIST): CapabilityList,
    (Root.URLSET, Capability.RESOURCELIST): ResourceList,
    (Root.SITEMAPINDEX, Capability.RESOURCELIST): ResourceListIndex,
    (Root.URLSET, Capability.RESOURCEDUMP): ResourceDump,
    (Root.SITEMAPINDEX, Capability.RESOURCEDUMP): ResourceDumpIndex,
    (Root.URLSET, Capability.RESOURCEDUMP_MANIFEST): ResourceDumpManifest,
    (Root.URLSET, Capability.CHANGELIST): ChangeList,
    (Root.SITEMAPINDEX, Capability.CHANGELIST): ChangeListIndex,
    (Root.URLSET, Capability.CHANGEDUMP): ChangeDump,
    (Root.SITEMAPINDEX, Capability.CHANGEDUMP): ChangeDumpIndex,
    (Root.URLSET, Capability.CHANGEDUMP_MANIFEST): ChangeDumpManifest,
}


def document_class(root: Root, capability: str) -> type[Document]:
    """The typed class for a (root element, capability) pair; plain Document if unknown."""
    return _CLASSES.get((root, capability), Document)


def make_document(root: Root, capability: str, **fields: object) -> Document:
    """Build the typed document for ``root`` and ``capability``."""
    cls = document_class(root, capability)
    # The parser passes each class its own fields; **fields: object cannot say which.
    return cls(root=root, capability=capability, **fields)  # type: ignore[arg-type]


def is_change_document(capability: str, root: Root) -> bool:
    """True when entries describe changes (need ``change`` and a change time)."""
    return root is Root.URLSET and capability in (
        Capability.CHANGELIST,
        Capability.CHANGEDUMP_MANIFEST,
    )


def sort_chronologically(entries: Iterable[Entry]) -> list[Entry]:
    """Entries in forward chronological order (stable for equal times)."""
    return sorted(entries, key=lambda e: (e.change_time is None, e.change_time or _EPOCH))


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
