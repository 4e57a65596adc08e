"""The Change Lists and Change List Index of one collection, from its notifications (pure).

:class:`ChangeListSet` is the sans-I/O half of ``--write-changelist``
(:mod:`.changelistwriter` does the files and the log): notifications in,
``(file name, bytes)`` out, in the order to write them.

The documents (section 12, Appendix A)
    ``changelist-index.xml``: a ``<sitemapindex>`` with ``rs:md
    capability="changelist" from=…`` (the first list's ``from``), ``rs:ln
    rel="up"`` to the Capability List, and one ``<sitemap>`` per Change List
    in forward chronological order with ``rs:md from`` and, once closed,
    ``until`` (and ``<lastmod>`` = ``until``, as section 12.2 says of Example
    20).  ``changelist-00000001.xml``, ``…02.xml``: ``<urlset>`` with ``rs:md
    capability="changelist" from=…`` (``until`` once closed), ``rs:ln
    rel="up"`` and ``rel="index"``, one ``<url>`` per notification in log
    order: ``loc``, ``<lastmod>``, ``rs:md change datetime hash length type``
    and the notification's links.  Numbers are zero-padded because resync
    2.0.1 reads an index's lists in the *string* order of their URIs.

Times
    ``rs:md datetime`` and ``<lastmod>`` are both the change time: section 12
    says a Change List entry's ``<lastmod>`` is when the change happened (its
    examples carry nothing else), and a ResourceSync 1.0 reader orders and
    resumes by it; the resource's own ``lastmod`` (a derived change's, say,
    which may be far older) is not written.  Section 12.1 wants forward
    chronological order, and a log need not be in it (a Source read with
    ``--lenient order``, a change derived from a Resource List whose
    ``lastmod`` is older than a change already logged): such an entry is
    written at the latest time already written.  That is also what makes it
    reachable: a Destination that resumes from a datetime skips entries
    before it, so an entry written at its own, older time after later ones
    would never be applied.
    A list's ``from`` is the ``from`` of its first notification (the change
    time of the notification logged before it, so it says "every change
    since") or, for later lists, the ``until`` of the list before.  A list is
    closed when the next entry does not fit: ``until`` is that entry's time
    and the next list's ``from`` (as :func:`rsnotify.sitemap.split` does);
    a Destination's walk keeps a list ending exactly at its cursor time.

Size
    A list holds at most ``max_entries`` (default 50,000, the section 7
    limit).  Its entries are serialized once, when added, and kept as bytes
    (:func:`rsnotify.envelope.entry_fragment`, rsnotify's own serializer),
    with the header and closing tag from :func:`rsnotify.sitemapwriter.iter_xml`:
    rewriting the open list is a join, not a serialization, and its cost is
    bounded by ``max_entries``.  The index is rendered only when a list
    opens or closes.

What is written
    Each list's root ``rs:md`` carries ``rsn:seq`` (rsnotify's namespace, as
    in its Change Notification payloads; the XSD allows other namespaces'
    attributes and resync ignores it): the log sequence number of the list's
    last entry.  :meth:`ChangeListSet.resume` takes it back, so the files
    alone say what was written.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urljoin

from .. import sitemap, sitemapwriter
from ..envelope import RSNOTIFY_NS, Notification, entry_fragment, link_of
from ..errors import RsNotifyError
from ..model import ChangeType, Document, Entry, Link, Root, make_document

__all__ = [
    "CHANGELIST",
    "INDEX_NAME",
    "MAX_ENTRIES",
    "SEQ",
    "ChangeListSet",
    "base_url",
    "list_name",
    "number_of",
]

INDEX_NAME = "changelist-index.xml"
_LIST_NAME = re.compile(r"changelist-(\d{8,})\.xml")
SEQ = f"{{{RSNOTIFY_NS}}}seq"  # rs:md attribute: log seq of the list's last entry
CHANGELIST = "changelist"
MAX_ENTRIES = sitemapwriter.MAX_ENTRIES_PER_DOCUMENT


def list_name(number: int) -> str:
    """The file name of Change List ``number`` (from 1), sortable as a string."""
    return f"changelist-{number:08d}.xml"


def number_of(loc: str) -> int | None:
    """The number of the Change List at ``loc`` (by its file name), or None."""
    match = _LIST_NAME.fullmatch(loc.rpartition("/")[2])
    return int(match.group(1)) if match else None


def base_url(capability_list: str, collection: str, base: str | None) -> str:
    """Where ``DIR/<collection>/`` is served: ``base``, else the Capability List's directory."""
    root = base if base is not None else urljoin(capability_list, ".")
    return root.rstrip("/") + "/" + collection + "/"


def _entry(n: Notification, when: dt.datetime) -> Entry:
    """A notification as a Change List entry at change time ``when``."""
    links = [link_of(d) for d in n.links]
    return Entry(
        loc=n.loc,
        lastmod=when,  # the change time, as section 12 (and every 1.0 reader) reads it
        change=ChangeType(n.change),
        datetime=when,
        hash=n.hash,
        length=n.length,
        type=n.type,
        links=links,
    )


@dataclass(slots=True)
class _OpenList:
    """The Change List being appended to: its header fields and its entries, serialized."""

    number: int
    from_: dt.datetime
    fragments: list[bytes]


class ChangeListSet:
    """One collection's Change Lists and Change List Index (pure: bytes in, bytes out).

    :meth:`add` takes the next notifications in log order and returns the
    files to write, ``(name, bytes)`` in the order to write them: lists
    first (ascending), the index last.
    """

    def __init__(self, *, capability_list: str, base: str, max_entries: int = MAX_ENTRIES) -> None:
        if not 1 <= max_entries <= MAX_ENTRIES:
            raise ValueError(f"a Change List holds 1 to {MAX_ENTRIES} entries (section 7)")
        self.capability_list = capability_list
        self.base = base
        self.max_entries = max_entries
        self.lists: list[Entry] = []  # the index's entries; the last may be open
        self.open: _OpenList | None = None
        self.seq = 0  # the log seq of the last entry written
        self.last_time: dt.datetime | None = None  # the latest change time written

    @property
    def index_url(self) -> str:
        return self.base + INDEX_NAME

    def list_url(self, number: int) -> str:
        return self.base + list_name(number)

    # -- adding --------------------------------------------------------------------

    def add(
        self, changes: Sequence[Notification], *, upto: int, gap: bool = False
    ) -> list[tuple[str, bytes]]:
        """Append ``changes`` (seqs after :attr:`seq`, up to ``upto``); the files to write.

        ``gap``: records before the first change left the log unwritten (see
        the module docstring).  ``upto`` may pass the last change's seq when
        the records after it could not be decoded.
        """
        files: list[tuple[str, bytes]] = []
        opened = False
        for position, n in enumerate(changes):
            when = n.datetime if self.last_time is None else max(n.datetime, self.last_time)
            hole = gap and position == 0
            current = self.open
            if current is not None and (len(current.fragments) >= self.max_entries or hole):
                until = self.last_time if hole else when
                assert until is not None
                files.append((list_name(current.number), self._close(current, until)))
                current = None
            if current is None:
                current = self._open(n, when, gap=hole)
                opened = True
            current.fragments.append(entry_fragment(_entry(n, when)))
            self.seq = n.seq if n.seq is not None else self.seq
            self.last_time = when
        self.seq = max(self.seq, upto)
        if self.open is not None and (changes or opened):
            files.append((list_name(self.open.number), self._render_list(self.open)))
        if opened:
            files.append((INDEX_NAME, self.render_index()))
        return files

    def _open(self, n: Notification, when: dt.datetime, *, gap: bool) -> _OpenList:
        previous = self.lists[-1] if self.lists else None
        if previous is not None and previous.until is not None and not gap:
            start = previous.until
        elif previous is None and n.since is not None:
            start = min(n.since, when)  # every change since the one logged before it
        else:
            start = when
        number = (number_of(previous.loc) or len(self.lists)) + 1 if previous else 1
        self.open = _OpenList(number, start, [])
        self.lists.append(Entry(loc=self.list_url(number), from_=start))
        return self.open

    def _close(self, current: _OpenList, until: dt.datetime) -> bytes:
        """Close the open list at ``until``; its final bytes."""
        entry = self.lists[-1]
        entry.until = entry.lastmod = until
        self.open = None
        return self._render_list(current)

    # -- rendering -----------------------------------------------------------------

    def _render_list(self, current: _OpenList) -> bytes:
        entry = self.lists[-1]
        header = make_document(
            Root.URLSET,
            CHANGELIST,
            from_=current.from_,
            until=entry.until,
            links=[
                Link(rel="up", href=self.capability_list),
                Link(rel="index", href=self.index_url),
            ],
            md_extra={SEQ: str(self.seq)},
        )
        *head, tail = sitemapwriter.iter_xml(header)  # no entries: the last piece closes
        return b"".join([("".join(head)).encode("utf-8"), *current.fragments, tail.encode()])

    def render_index(self) -> bytes:
        """The Change List Index as it stands."""
        return sitemap.serialize(
            make_document(
                Root.SITEMAPINDEX,
                CHANGELIST,
                from_=self.lists[0].from_ if self.lists else None,
                links=[Link(rel="up", href=self.capability_list)],
                entries=[
                    Entry(loc=e.loc, lastmod=e.until, from_=e.from_, until=e.until)
                    for e in self.lists
                ],
            )
        )

    # -- resuming ------------------------------------------------------------------

    def resume(self, index: Document | None, lists: Mapping[int, Document]) -> None:
        """Take up where written documents end: the index read back and the lists read back.

        ``lists`` must hold every list newer than the index's last closed one
        (a crash may have left the index behind them) and always the newest.
        Their locations are rebuilt from :attr:`base` and their numbers.
        """
        known: dict[int, Entry] = {}
        for entry in index.entries if index is not None else []:
            number = number_of(entry.loc)
            if number is not None:
                known[number] = Entry(
                    loc=self.list_url(number), from_=entry.from_, until=entry.until
                )
        for number, document in lists.items():
            known[number] = Entry(
                loc=self.list_url(number), from_=document.from_, until=document.until
            )
        if lists:  # an index entry past the newest list on disk names nothing written
            known = {number: e for number, e in known.items() if number <= max(lists)}
        for number, entry in sorted(known.items()):
            if number != max(known) and entry.until is None:
                raise RsNotifyError(f"Change List {entry.loc} is open but not the newest")
            entry.lastmod = entry.until
        self.lists = [known[number] for number in sorted(known)]
        if not lists:
            return
        newest = max(lists)
        document = lists[newest]
        self.seq = int(document.md_extra.get(SEQ, "0"))
        times = [e.change_time for e in document.entries if e.change_time is not None]
        self.last_time = times[-1] if times else document.from_
        if document.until is None:
            assert document.from_ is not None
            self.open = _OpenList(
                newest, document.from_, [entry_fragment(e) for e in document.entries]
            )
