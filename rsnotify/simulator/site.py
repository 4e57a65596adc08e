"""What the simulated Source publishes, as cached bytes with HTTP validators.

:class:`Site` sits between the pure :class:`~rsnotify.simulator.source.Source`
and the adapters that expose it (the aiohttp server, the ``--dir`` writer).  It
maps request paths to :class:`Representation` objects -- body, ETag,
Last-Modified, Content-Type -- and does the one expensive thing, serializing,
as rarely as possible:

* the Source Description and Capability Lists never change: serialized once;
* a closed Change List never changes: serialized once, when it closes, after
  which the Source forgets its entry objects (memory is then about one
  serialized entry per past change);
* the open Change List is appended to, so each entry is serialized once into a
  fragment and the document is ``head + fragments + tail`` (see
  :class:`_Splicer`), rebuilt lazily on request only when it has grown;
* the Change List Index is rebuilt only when a list closes;
* ``--change-dump``: a closed list's package (:mod:`.changedump`) is built
  once, as the list closes; the Change Dump only when a package is added;
* the Resource List is rebuilt lazily when the state has changed, and while
  the rate-driven generator runs at most every ``max_age`` seconds (callers
  pass it), since a 50,000-entry snapshot per request would starve the
  generator; when the Source is still it is always exact.

All of it is still pure: callers pass ``now``; nothing here touches a socket,
a file or a clock.

Validators
----------
ETags are strong: a BLAKE2b digest of the document bytes, or the SHA-256 of a
resource's body.  ``Last-Modified`` has one-second granularity while the Source
changes many times a second, so :meth:`Representation.not_modified` answers
``If-Modified-Since`` with 304 only when that second identifies exactly one
version this site has produced; otherwise it sends the body again (always
allowed).  A client that echoes our ``Last-Modified`` therefore never misses a
change, and ``If-None-Match`` (which takes precedence) gives exact 304s.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

from .. import sitemap
from ..model import Capability, ChangeType, Document, Entry, Link, Root, make_document
from . import changedump, payload
from .source import Applied, ChangeListState, Collection, SimulatorError, Source

XML_TYPE = "application/xml"
RESOURCE_LIST_LIMIT = sitemap.MAX_ENTRIES_PER_DOCUMENT


def http_date(when: datetime) -> str:
    """RFC 9110 IMF-fixdate of ``when`` truncated to the second."""
    return format_datetime(when.astimezone(UTC).replace(microsecond=0), usegmt=True)


def _same_second(a: datetime | None, b: datetime) -> bool:
    return a is not None and a.replace(microsecond=0) == b.replace(microsecond=0)


@dataclass(frozen=True, slots=True)
class Representation:
    """One published body with its HTTP metadata.

    ``second_is_unique`` is False when an earlier version produced at this
    URL had the same ``Last-Modified`` second (so that date cannot validate).
    """

    body: bytes
    etag: str
    modified: datetime
    last_modified: str
    content_type: str
    link: str | None = None
    second_is_unique: bool = True

    @classmethod
    def document(
        cls, body: bytes, modified: datetime, previous: Representation | None
    ) -> Representation:
        digest = hashlib.blake2b(body, digest_size=16).hexdigest()
        return cls(
            body=body,
            etag=f'"{digest}"',
            modified=modified,
            last_modified=http_date(modified),
            content_type=XML_TYPE,
            second_is_unique=previous is None
            or previous.body == body
            or not _same_second(previous.modified, modified),
        )

    def not_modified(self, if_none_match: str | None, if_modified_since: datetime | None) -> bool:
        """Whether a conditional GET with these headers gets 304 (RFC 9110 section 13.2.2)."""
        if if_none_match is not None:
            for token in if_none_match.split(","):
                tag = token.strip()
                if tag == "*":
                    return True
                if tag.startswith("W/"):
                    tag = tag[2:]
                if tag == self.etag:
                    return True
            return False
        if if_modified_since is None:
            return False
        since = if_modified_since.astimezone(UTC)
        mine = self.modified.replace(microsecond=0)
        return mine < since or (mine == since and self.second_is_unique)


# --- splicing urlset bytes -------------------------------------------------------


class _Splicer:
    """Serializes a urlset as ``head + sep.join(fragments) + tail``.

    Each entry is serialized once, by :func:`rsnotify.sitemap.serialize` itself
    (a batch of new entries in one call, cut apart at ``<url>`` tags, which
    cannot occur in escaped text), so the bytes are exactly the document
    layer's.  On first use the splicer checks that splicing reproduces
    ``serialize`` on a sample; if the serializer's layout ever made that false,
    :attr:`enabled` turns off and callers serialize whole documents instead.
    """

    OPEN = b"<url>"
    CLOSE = b"</url>"

    def __init__(self) -> None:
        self.sep = b""
        self.enabled = self._calibrate()

    @classmethod
    def cut(cls, xml: bytes) -> tuple[bytes, list[bytes], list[bytes], bytes]:
        """(head, fragments, gaps between fragments, tail) of a non-empty urlset."""
        start = xml.find(cls.OPEN)
        if start < 0:
            raise ValueError("no <url> in document")
        head = xml[:start]
        fragments: list[bytes] = []
        gaps: list[bytes] = []
        pos = start
        while True:
            end = xml.find(cls.CLOSE, pos)
            if end < 0:
                raise ValueError("unterminated <url>")
            end += len(cls.CLOSE)
            fragments.append(xml[pos:end])
            nxt = xml.find(cls.OPEN, end)
            if nxt < 0:
                return head, fragments, gaps, xml[end:]
            gaps.append(xml[end:nxt])
            pos = nxt

    def _calibrate(self) -> bool:
        t = datetime(2020, 1, 1, tzinfo=UTC)
        entries = [
            Entry(
                loc=f"http://example.org/r{i}?a=1&b=<2>",
                lastmod=t,
                change=ChangeType.UPDATED,
                datetime=t,
                hash="md5:00",
                length=i,
                type="text/plain",
            )
            for i in range(3)
        ]
        header = make_document(
            Root.URLSET,
            Capability.CHANGELIST,
            from_=t,
            links=[Link(rel="up", href="http://example.org/cl.xml")],
        )
        try:
            full = sitemap.serialize(self._with(header, entries))
            _, _, gaps, _ = self.cut(full)
            if len(set(gaps)) != 1:
                return False
            self.sep = gaps[0]
            fragments = self.fragments(header, entries[:1]) + self.fragments(header, entries[1:])
            head, tail = self.frame(header, entries[-1])
            return self.join(head, fragments, tail) == full
        except ValueError:
            return False

    @staticmethod
    def _with(header: Document, entries: list[Entry]) -> Document:
        return make_document(
            header.root,
            header.capability,
            from_=header.from_,
            until=header.until,
            at=header.at,
            completed=header.completed,
            links=header.links,
            entries=entries,
        )

    def fragments(self, header: Document, entries: list[Entry]) -> list[bytes]:
        if not entries:
            return []
        _, fragments, gaps, _ = self.cut(sitemap.serialize(self._with(header, entries)))
        if len(fragments) != len(entries) or any(g != self.sep for g in gaps):
            raise ValueError("serializer output cannot be spliced")
        return fragments

    def frame(self, header: Document, sample: Entry) -> tuple[bytes, bytes]:
        head, _, _, tail = self.cut(sitemap.serialize(self._with(header, [sample])))
        return head, tail

    def join(self, head: bytes, fragments: list[bytes], tail: bytes) -> bytes:
        return b"".join((head, self.sep.join(fragments), tail))


@functools.cache
def _splicer() -> _Splicer:
    """The process-wide splicer, calibrated on first use."""
    return _Splicer()


class _ChangeListBytes:
    """The growing bytes of one Change List, one fragment per entry."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.fragments: list[bytes] = []
        self.representation: Representation | None = None
        self.rendered = -1  # entry count the representation was built for

    def extend(self, source: Source, collection: Collection, state: ChangeListState) -> None:
        """Serialize the entries added since the last call (one serializer call for all)."""
        splicer = _splicer()
        new = state.changes[len(self.fragments) :]
        if not new or not splicer.enabled:
            return
        header = source.changelist(collection, state.number, with_entries=False)
        try:
            self.fragments.extend(splicer.fragments(header, [source.change_entry(c) for c in new]))
        except ValueError:
            splicer.enabled = False  # never seen; whole documents are always right

    def render(self, source: Source, collection: Collection, state: ChangeListState) -> bytes:
        header = source.changelist(collection, state.number, with_entries=False)
        if not state.changes:
            return sitemap.serialize(header)
        self.extend(source, collection, state)
        splicer = _splicer()
        if splicer.enabled:
            try:
                head, tail = splicer.frame(header, source.change_entry(state.changes[-1]))
                return splicer.join(head, self.fragments, tail)
            except ValueError:
                splicer.enabled = False
        return sitemap.serialize(source.changelist(collection, state.number))


# --- the site --------------------------------------------------------------------


@dataclass(slots=True)
class _ResourceListCache:
    version: int  # collection.changes when built
    built: datetime
    index: Representation
    parts: dict[str, Representation]  # path -> part (empty when not split)


class Site:
    """Path -> :class:`Representation` for everything a Source publishes.

    Always change the Source through :meth:`apply`, never directly: the site
    must see each closed Change List before the Source releases it.
    """

    def __init__(self, source: Source, *, resourcelist_size: int = RESOURCE_LIST_LIMIT) -> None:
        if not 1 <= resourcelist_size <= RESOURCE_LIST_LIMIT:
            raise SimulatorError(
                f"resource list size must be 1..{RESOURCE_LIST_LIMIT}, got {resourcelist_size}"
            )
        self.source = source
        self.layout = source.layout
        self.resourcelist_size = resourcelist_size
        self.prefix = self.layout.path(self.layout.base_url)  # "/" or "/some/prefix/"
        self._static: dict[str, Representation] = {}
        self._closed: dict[str, Representation] = {}
        self._open: dict[str, _ChangeListBytes] = {}
        self._index: dict[str, tuple[int, Representation]] = {}
        self._resource_lists: dict[str, _ResourceListCache] = {}
        self._packages: dict[str, list[changedump.Package]] = {}  # --change-dump
        self._dumps: dict[str, tuple[int, Representation]] = {}  # its Change Dumps
        start = source.start
        sd = self.layout.source_description()
        self._static[self.layout.path(sd)] = Representation.document(
            sitemap.serialize(source.source_description()), start, None
        )
        for c in source.collections:
            self._static[self.layout.path(c.capability_list_url)] = Representation.document(
                sitemap.serialize(source.capability_list(c)), start, None
            )
            self._open[c.name] = _ChangeListBytes(1)

    # -- changing ----------------------------------------------------------------

    def apply(self, n: int, now: datetime) -> list[Applied]:
        """Make up to ``n`` changes (fewer once ``max_changes`` is reached), in order.

        The new entries are serialized right away, a batch at a time, so the
        cost is spread over the changes rather than paid in one stall when a
        list closes or is first requested.
        """
        applied = self.source.apply(n, now)
        touched: dict[str, Collection] = {}
        for item in applied:
            if item.closed is not None:
                self._close(item.collection, item.closed)
            touched[item.collection.name] = item.collection
        for collection in touched.values():
            self._open[collection.name].extend(self.source, collection, collection.open_changelist)
        return applied

    def drop_superseded(self, collection: Collection) -> str | None:
        """Republish the open Change List without one entry; return its ``loc`` (None: none).

        The entry dropped is the latest one whose resource changes again later
        in the same list, so the Source's state is still fully described by
        what remains, while the document shrinks in the middle: a reader that
        remembers byte offsets or entry counts must notice.  The change still
        counts as made.
        """
        state = collection.open_changelist
        later: set[str] = set()
        for i in range(len(state.changes) - 1, -1, -1):
            loc = state.changes[i].loc
            if loc in later:
                break
            later.add(loc)
        else:
            return None
        del state.changes[i]
        state.count -= 1
        renderer = self._open[collection.name]
        if i < len(renderer.fragments):
            del renderer.fragments[i]
        renderer.rendered = -1  # rebuild on the next request
        return loc

    def _close(self, collection: Collection, state: ChangeListState) -> None:
        renderer = self._open[collection.name]
        if renderer.number != state.number:
            renderer = _ChangeListBytes(state.number)
        body = renderer.render(self.source, collection, state)
        url = self.layout.changelist(collection.name, state.number)
        self._closed[self.layout.path(url)] = Representation.document(
            body, state.last_time, renderer.representation
        )
        if self.source.change_dump:  # packaged now: release() forgets the entries
            made = changedump.package(self.source, collection, state)
            self._packages.setdefault(collection.name, []).append(made)
            etag, until = f'"{made.sha256[:40]}"', made.until
            self._closed[self.layout.path(made.loc)] = Representation(
                made.body, etag, until, http_date(until), changedump.ZIP_TYPE
            )
        self.source.release(collection, state.number)
        self._open[collection.name] = _ChangeListBytes(state.number + 1)

    # -- reading -----------------------------------------------------------------

    def lookup(
        self, path: str, now: datetime, *, resourcelist_max_age: float = 0.0
    ) -> Representation | None:
        """The representation at ``path`` (a request path), or None for 404."""
        found = self._static.get(path) or self._closed.get(path)
        if found is not None:
            return found
        if not path.startswith(self.prefix):
            return None
        parts = path[len(self.prefix) :].split("/")
        collection = self.source.by_name.get(parts[0])
        if collection is None:
            return None
        if len(parts) == 2:
            if parts[1] == "changelist.xml":
                return self.changelist_index(collection)
            if parts[1] == "resourcelist.xml":
                return self.resource_list(collection, now, resourcelist_max_age)
            if parts[1] == "changedump.xml" and self.source.change_dump:
                return self.change_dump(collection)
            return None
        if len(parts) == 3:
            if parts[1] == "resources":
                return self.resource(collection, parts[2])
            if parts[1] == "changes":
                open_state = collection.open_changelist
                open_url = self.layout.changelist(collection.name, open_state.number)
                if path == self.layout.path(open_url):
                    return self.open_changelist(collection)
                return None
            if parts[1] == "resourcelist":
                cache = self._fresh_resource_list(collection, now, resourcelist_max_age)
                return cache.parts.get(path)
        return None

    def open_changelist(self, collection: Collection) -> Representation:
        state = collection.open_changelist
        renderer = self._open[collection.name]
        if renderer.representation is None or renderer.rendered != state.count:
            body = renderer.render(self.source, collection, state)
            renderer.representation = Representation.document(
                body, state.last_time, renderer.representation
            )
            renderer.rendered = state.count
        return renderer.representation

    def changelist_index(self, collection: Collection) -> Representation:
        lists = len(collection.changelists)
        cached = self._index.get(collection.name)
        if cached is not None and cached[0] == lists:
            return cached[1]
        body = sitemap.serialize(self.source.changelist_index(collection))
        rep = Representation.document(
            body, collection.open_changelist.from_, cached[1] if cached else None
        )
        self._index[collection.name] = (lists, rep)
        return rep

    def change_dump(self, collection: Collection) -> Representation:
        """The Change Dump (``--change-dump``), rebuilt only when a package is added."""
        packages, cached = self._packages.get(collection.name, []), self._dumps.get(collection.name)
        if cached is not None and cached[0] == len(packages):
            return cached[1]
        modified = packages[-1].until if packages else collection.changelists[0].from_
        body = sitemap.serialize(changedump.change_dump(collection, packages))
        rep = Representation.document(body, modified, cached[1] if cached else None)
        self._dumps[collection.name] = (len(packages), rep)
        return rep

    def resource_list(
        self, collection: Collection, now: datetime, max_age: float = 0.0
    ) -> Representation:
        return self._fresh_resource_list(collection, now, max_age).index

    def _fresh_resource_list(
        self, collection: Collection, now: datetime, max_age: float
    ) -> _ResourceListCache:
        cached = self._resource_lists.get(collection.name)
        if cached is not None and (
            cached.version == collection.changes or now - cached.built < timedelta(seconds=max_age)
        ):
            return cached
        at = self.source.snapshot_time(now)
        document = self.source.resource_list(collection, at)
        layout = self.layout
        index, parts = sitemap.split(
            document,
            index_url=layout.resource_list(collection.name),
            part_url=lambda n: layout.resource_list_part(collection.name, n),
            max_entries=self.resourcelist_size,
        )
        previous = cached.index if cached else None
        if index is None:
            top = Representation.document(sitemap.serialize(document), at, previous)
            part_reps: dict[str, Representation] = {}
        else:
            top = Representation.document(sitemap.serialize(index), at, previous)
            part_reps = {}
            for url, part in parts:
                path = layout.path(url)
                before = cached.parts.get(path) if cached else None
                part_reps[path] = Representation.document(sitemap.serialize(part), at, before)
        fresh = _ResourceListCache(
            version=collection.changes, built=now, index=top, parts=part_reps
        )
        self._resource_lists[collection.name] = fresh
        return fresh

    def resource(self, collection: Collection, name: str) -> Representation | None:
        loc = self.layout.resource(collection.name, name)
        record = collection.resources.get(loc)
        if record is None or record.deleted:
            return None
        return Representation(
            body=self.source.body(loc, record.version),
            etag=f'"{record.fixity.sha256[:40]}"',
            modified=record.modified,
            last_modified=http_date(record.modified),
            content_type=payload.MEDIA_TYPE,
            link=f'<{collection.capability_list_url}>; rel="resourcesync"',
            second_is_unique=not _same_second(record.previous_modified, record.modified),
        )

    # -- enumeration (for the --dir writer) ----------------------------------------

    def static_documents(self) -> dict[str, Representation]:
        """Source Description and Capability Lists, by path."""
        return dict(self._static)

    def closed_changelists(self) -> dict[str, Representation]:
        """Every closed Change List, by path (insertion order is chronological per collection)."""
        return self._closed

    def live_documents(
        self, now: datetime, *, resourcelist_max_age: float = 0.0
    ) -> dict[str, Representation]:
        """Documents that still change: Change List Indexes, open lists, Resource Lists."""
        out: dict[str, Representation] = {}
        layout = self.layout
        for c in self.source.collections:
            out[layout.path(layout.changelist_index(c.name))] = self.changelist_index(c)
            if self.source.change_dump:
                out[layout.path(layout.changedump(c.name))] = self.change_dump(c)
            open_url = layout.changelist(c.name, c.open_changelist.number)
            out[layout.path(open_url)] = self.open_changelist(c)
            cache = self._fresh_resource_list(c, now, resourcelist_max_age)
            out[layout.path(layout.resource_list(c.name))] = cache.index
            out.update(cache.parts)
        return out
