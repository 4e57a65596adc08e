"""Write the Change List a Source never had, from the notification log (issue 23, item 3).

``rsnotify publish SOURCE --write-changelist DIR`` turns every logged
notification of a collection into an entry of a Change List under
``DIR/<collection id>/``, grouped by a Change List Index (Z39.99 section 12),
so a Source that offers only a Resource List can start offering a Change
List: the operator serves ``DIR`` and adds the ``<url>`` printed at start-up
to the Capability List.  It works for any collection's log, whether the
notifications came from a Change List or were derived from Resource List
snapshots: it reads the log, never the Source.

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
    ``rs:md datetime`` is the logged change time and ``<lastmod>`` the logged
    ``lastmod`` if any, else the change time too (what a ResourceSync 1.0
    reader takes as the change time).  Section 12.1 wants forward
    chronological order, and a log need not be in it (a Source read with
    ``--lenient order``, a change derived from a Resource List whose
    ``lastmod`` is older than a change already logged): such an entry is
    written at the latest time already written (its own time stays in
    ``<lastmod>``).  That is also what makes it reachable: a Destination that
    resumes from a datetime skips entries before it, so an entry written at
    its own, older time after later ones would never be applied.
    A list's ``from`` is the ``from`` of its first notification (the change
    time of the notification logged before it, so it says "every change
    since") or, for later lists, the ``until`` of the list before.  A list is
    closed when the next entry does not fit: ``until`` is that entry's time
    and the next list's ``from`` (as :func:`rsnotify.sitemap.split` does);
    a Destination's walk keeps a list ending exactly at its cursor time.

Size
    A list holds at most ``max_entries`` (default 50,000, the section 7
    limit).  Each batch of records rewrites the open list once; its entries
    are serialized once, when added, and kept as bytes, so a rewrite is a
    join and a write whose size is bounded by ``max_entries``, and writes are
    at most one per ``interval`` (records read meanwhile join the next
    batch).  The index is rewritten only when a list opens or closes.

Durability and idempotence
    Every file is written with :func:`rsnotify.durable.write_file` (temporary
    file, fsync, rename, directory fsync), lists before the index.  The files
    are the truth: each list's root ``rs:md`` carries ``rsn:seq``, the log
    sequence number of its last entry, in rsnotify's namespace (the XSD
    allows other namespaces' attributes; resync ignores it), written in the
    same atomic rename as the entries it counts.  At start-up the writer
    resumes after the ``rsn:seq`` of the newest list and repairs an index
    that a crash left behind its lists, so a crash anywhere (after a list,
    before the index; after the files, before the cursor) neither loses nor
    repeats an entry.  The named log cursor ``changelist-writer`` is moved
    only after the files are durable: it reports progress and is where a
    writer with no files yet (a new ``DIR``) starts.  A state file beside
    the lists would have needed its own write after theirs, a second
    crash window; the attribute has none.

Gaps
    Records trimmed from the log before they were written (the writer was
    stopped longer than the retention) cannot be written.  The open list is
    then closed at the last time written and the next one starts at the
    first change read again: the index shows the hole between two lists
    instead of a ``from`` that claims every change since.

The pure part is :class:`ChangeListSet` (documents of one collection from
notifications); :class:`CollectionWriter` does the files and the log, reading
through a :class:`~rsnotify.transport.tail.LogTail` (its retries and outage
logging) paced so it never reads ahead of what was written.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin

from .. import sitemap, sitemapwriter, w3cdt
from ..backoff import Backoff
from ..cancellation import raise_if_cancelled
from ..collection import is_valid_collection_id
from ..durable import write_file
from ..envelope import RSNOTIFY_NS, InvalidNotification, Notification, entry_fragment, from_json
from ..errors import RsNotifyError
from ..log import LogRecord, LogUnavailable, NotificationLog
from ..model import ChangeType, Document, Entry, Link, Root, make_document
from ..transport.tail import LogTail
from .tasks import TaskGroup

__all__ = [
    "CURSOR",
    "INDEX_NAME",
    "ChangeListSet",
    "ChangeListWriter",
    "CollectionWriter",
    "advice_lines",
    "list_name",
    "read_back",
]

log = logging.getLogger("rsnotify.publish")

CURSOR = "changelist-writer"  # the named log cursor
INDEX_NAME = "changelist-index.xml"
_LIST_NAME = re.compile(r"changelist-(\d{8,})\.xml")
SEQ = f"{{{RSNOTIFY_NS}}}seq"  # rs:md attribute: log seq of the list's last entry
CHANGELIST = "changelist"
MAX_ENTRIES = sitemapwriter.MAX_ENTRIES_PER_DOCUMENT
BATCH = 5_000  # records read per batch
INTERVAL = 0.5  # seconds between two rewrites of a collection's open list
FILE_MODE = 0o644  # served by the Source's web server


def list_name(number: int) -> str:
    """The file name of Change List ``number`` (from 1), sortable as a string."""
    return f"changelist-{number:08d}.xml"


def _number(loc: str) -> int | None:
    match = _LIST_NAME.fullmatch(loc.rpartition("/")[2])
    return int(match.group(1)) if match else None


def base_url(capability_list: str, collection: str, base: str | None) -> str:
    """Where ``DIR/<collection>/`` is served: ``base``, else the Capability List's directory."""
    root = base if base is not None else urljoin(capability_list, ".")
    return root.rstrip("/") + "/" + collection + "/"


def _entry(n: Notification, when: dt.datetime) -> Entry:
    """A notification as a Change List entry at change time ``when``."""
    links = [
        Link(
            rel=d["rel"],
            href=d["href"],
            hash=d.get("hash"),
            length=d.get("length"),
            path=d.get("path"),
            type=d.get("type"),
            pri=d.get("pri"),
            encoding=d.get("encoding"),
            modified=w3cdt.parse(d["modified"]) if d.get("modified") else None,
        )
        for d in n.links
    ]
    return Entry(
        loc=n.loc,
        lastmod=n.lastmod if n.lastmod is not None else n.datetime,
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
        number = (_number(previous.loc) or len(self.lists)) + 1 if previous else 1
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
            number = _number(entry.loc)
            if number is not None:
                known[number] = Entry(
                    loc=self.list_url(number), from_=entry.from_, until=entry.until
                )
        for number, document in lists.items():
            known[number] = Entry(
                loc=self.list_url(number), from_=document.from_, until=document.until
            )
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


# --- the files and the log -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Logged:
    """A record as the tail renders it: its seq and its notification (None: undecodable)."""

    seq: int
    change: Notification | None


def _decode(record: LogRecord, read_at: float) -> _Logged:
    try:
        return _Logged(record.seq, from_json(record.data))
    except InvalidNotification as exc:
        log.warning("seq %d is not a notification, not written: %s", record.seq, exc)
        return _Logged(record.seq, None)


def read_back(directory: Path, changes: ChangeListSet) -> bool:
    """Resume ``changes`` from the files in ``directory``; True when the index needs rewriting."""
    index_path = directory / INDEX_NAME
    index = sitemap.parse(index_path) if index_path.exists() else None
    numbers = sorted(
        number
        for path in directory.glob("changelist-*.xml")
        if (number := _number(path.name)) is not None
    )
    indexed = {_number(e.loc): e for e in index.entries} if index is not None else {}
    wanted = [
        n for n in numbers if n not in indexed or indexed[n].until is None or n == numbers[-1]
    ]
    changes.resume(index, {n: sitemap.parse(directory / list_name(n)) for n in wanted})
    if not changes.lists:
        return False
    return not index_path.exists() or index_path.read_bytes() != changes.render_index()


class CollectionWriter:
    """Writes one collection's log into ``directory``, a batch at a time."""

    def __init__(
        self,
        notification_log: NotificationLog,
        collection: str,
        changes: ChangeListSet,
        directory: Path,
        *,
        batch: int = BATCH,
        interval: float = INTERVAL,
    ) -> None:
        self.log = notification_log
        self.collection = collection
        self.changes = changes
        self.directory = directory
        self.batch = batch
        self.interval = interval
        self.wake = asyncio.Event()  # set by the tail: records are in its ring
        self._written = asyncio.Event()
        self._last_write = 0.0
        self.tail: LogTail[_Logged, CollectionWriter] | None = None

    async def open(self) -> None:
        """Read back what earlier runs wrote, repair the index, find where to resume."""
        self.directory.mkdir(parents=True, exist_ok=True)
        repair = await asyncio.to_thread(read_back, self.directory, self.changes)
        if repair:
            await asyncio.to_thread(self._write, [(INDEX_NAME, self.changes.render_index())])
            log.info("%s: repaired %s", self.collection, self.directory / INDEX_NAME)
        if not self.changes.lists:  # nothing written yet: start where the cursor says
            self.changes.seq = await self.log.cursor(self.collection, CURSOR)

    async def run(self) -> None:
        """Write until cancelled."""
        await self.open()
        tail = self.tail = LogTail(
            self.log,
            self.collection,
            self.changes.seq,
            self.batch,
            _decode,
            batch=self.batch,
        )
        tail.readers.add(self)
        reading = asyncio.create_task(tail.run(pace=self._pace), name="Change List tail")
        try:
            while True:
                await self.wake.wait()
                self.wake.clear()
                await self._write_ring(tail)
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)

    async def _pace(self) -> None:
        """Before each read: what was read is written, and ``interval`` has passed."""
        assert self.tail is not None
        while self.tail.position > self.changes.seq:
            self._written.clear()
            await self._written.wait()
        delay = self._last_write + self.interval - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _write_ring(self, tail: LogTail[_Logged, CollectionWriter]) -> None:
        items = [item for item in tail.ring if item.seq > self.changes.seq]
        if not items:
            return
        gap = items[0].seq != self.changes.seq + 1
        if gap:
            log.warning(
                "%s: seqs %d..%d left the log before they were written to the Change List; "
                "a new Change List starts after the hole",
                self.collection,
                self.changes.seq + 1,
                items[0].seq - 1,
            )
        files = self.changes.add(
            [item.change for item in items if item.change is not None],
            upto=items[-1].seq,
            gap=gap,
        )
        await self._write_durably(files)
        with contextlib.suppress(LogUnavailable):  # the files are the truth: best effort
            await self.log.set_cursor(self.collection, CURSOR, self.changes.seq)
        self._last_write = asyncio.get_running_loop().time()
        self._written.set()

    async def _write_durably(self, files: list[tuple[str, bytes]]) -> None:
        """Write ``files`` in order, retrying a failing disk with backoff (never skipping)."""
        backoff = Backoff(initial=0.2, maximum=10.0)
        failing = False
        while files:
            raise_if_cancelled()
            try:
                await asyncio.to_thread(self._write, files[:1])
            except OSError as exc:
                if not failing:
                    log.warning("%s: cannot write %s: %s", self.collection, files[0][0], exc)
                failing = True
                await asyncio.sleep(backoff.next())
                continue
            if failing:
                log.info("%s: writing the Change Lists again", self.collection)
                failing = False
            files = files[1:]

    def _write(self, files: list[tuple[str, bytes]]) -> None:
        for name, data in files:
            write_file(self.directory / name, data, mode=FILE_MODE)


class ChangeListWriter:
    """``--write-changelist DIR``: a :class:`CollectionWriter` per collection (a transport)."""

    name = "changelist"

    def __init__(
        self,
        notification_log: NotificationLog,
        directory: str | Path,
        capability_lists: Mapping[str, str],
        *,
        base: str | None = None,
        max_entries: int = MAX_ENTRIES,
        interval: float = INTERVAL,
    ) -> None:
        self.writers: dict[str, CollectionWriter] = {}
        for collection, capability_list in capability_lists.items():
            if not is_valid_collection_id(collection):  # a file name below: never a path
                raise RsNotifyError(f"--write-changelist: bad collection id {collection!r}")
            changes = ChangeListSet(
                capability_list=capability_list,
                base=base_url(capability_list, collection, base),
                max_entries=max_entries,
            )
            self.writers[collection] = CollectionWriter(
                notification_log,
                collection,
                changes,
                Path(directory) / collection,
                interval=interval,
            )
        self._tasks = TaskGroup()

    async def start(self, tasks: TaskGroup) -> None:
        for collection, writer in self.writers.items():
            self._tasks.spawn(writer.run(), name=f"Change List writer of {collection}")

    async def stop(self) -> None:
        """Stop at once: what was not written yet is read again from the log next time."""
        await self._tasks.cancel()


def advice_lines(
    capability_lists: Mapping[str, str], directory: str, base: str | None, prefix: str
) -> list[str]:
    """What to add to each Capability List to offer the written Change List Index."""
    lines = []
    for collection, capability_list in capability_lists.items():
        index_url = base_url(capability_list, collection, base) + INDEX_NAME
        markup = entry_fragment(Entry(loc=index_url, capability=CHANGELIST)).decode("utf-8")
        element = "".join(line.strip() for line in markup.splitlines())
        lines.append(
            f"{prefix} collection {collection}: Change List Index written to "
            f"{Path(directory) / collection / INDEX_NAME}; advertise {element} in "
            f"{capability_list}"
        )
    return lines
