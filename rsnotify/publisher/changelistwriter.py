"""Write the Change List a Source never had, from the notification log (issue 23, item 3).

``rsnotify publish SOURCE --write-changelist DIR`` turns every logged
notification of a collection into an entry of a Change List under
``DIR/<collection id>/``, grouped by a Change List Index (Z39.99 section 12),
so a Source that offers only a Resource List can start offering a Change
List: the operator serves ``DIR`` and adds the ``<url>`` printed at start-up
to the Capability List.  It works for any collection's log, whether the
notifications came from a Change List or were derived from Resource List
snapshots: it reads the log, never the Source.

The documents, their times and sizes are :mod:`.changelists`' business
(pure); this module does the files and the log.

Pace
    Each batch of records rewrites the open list once, and a collection's
    files are written at most once per ``interval``: records logged meanwhile
    join the next batch, so a high rate makes batches larger, not writes
    more frequent.

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

Who writes, and what it costs
    The leader alone (with ``--ha``, the elected one): it is a transport of
    the leader's term, like the MQTT pusher, and owns ``DIR``.  Memory: the
    open list's entries as bytes, about 300 bytes each (some 15 MB per
    collection at 50,000); the closed lists are on disk only.

The log is read through a :class:`~rsnotify.transport.tail.LogTail`
(its retries and outage logging), paced so it never reads ahead of what was
written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import sitemap
from ..backoff import Backoff
from ..cancellation import raise_if_cancelled
from ..collection import is_valid_collection_id
from ..durable import sweep_temporaries, write_file
from ..envelope import InvalidNotification, Notification, entry_fragment, from_json
from ..errors import RsNotifyError
from ..log import LogRecord, LogUnavailable, NotificationLog
from ..model import Entry
from ..transport.tail import LogTail
from .changelists import (
    CHANGELIST,
    INDEX_NAME,
    MAX_ENTRIES,
    ChangeListSet,
    base_url,
    list_name,
    number_of,
)
from .tasks import TaskGroup

__all__ = [
    "CURSOR",
    "ChangeListWriter",
    "CollectionWriter",
    "advice_lines",
    "read_back",
]

log = logging.getLogger("rsnotify.publish")

CURSOR = "changelist-writer"  # the named log cursor
BATCH = 5_000  # records read per batch
INTERVAL = 0.5  # seconds between two rewrites of a collection's open list
FILE_MODE = 0o644  # served by the Source's web server


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
        if (number := number_of(path.name)) is not None
    )
    indexed = {number_of(e.loc): e for e in index.entries} if index is not None else {}
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
        self._restarted = False  # the log was started anew: a new list after a hole

    async def open(self) -> None:
        """Read back what earlier runs wrote, repair the index, find where to resume."""
        self.directory.mkdir(parents=True, exist_ok=True)
        swept = await asyncio.to_thread(sweep_temporaries, self.directory)
        if swept:
            log.info("%s: removed %d file(s) a killed write left", self.collection, swept)
        repair = await asyncio.to_thread(read_back, self.directory, self.changes)
        if repair:
            await asyncio.to_thread(self._write, [(INDEX_NAME, self.changes.render_index())])
            log.info("%s: repaired %s", self.collection, self.directory / INDEX_NAME)
        if not self.changes.lists:  # nothing written yet: start where the cursor says
            cursor = await self._read_log(lambda: self.log.cursor(self.collection, CURSOR))
            self.changes.seq = cursor
            return
        head = await self._read_log(lambda: self.log.head(self.collection))
        if self.changes.seq > head:
            # The files name seqs this log never had: it was started anew (a wiped
            # state directory, SQLite traded for --redis).  Its records are new
            # changes; appended to the open list they would sit under seqs that
            # mean something else, so they start a new list after a hole.
            log.warning(
                "%s: %s was written up to seq %d, but the log's head is %d: the log "
                "was started anew; its changes go into a new Change List after a hole",
                self.collection,
                self.directory,
                self.changes.seq,
                head,
            )
            self.changes.seq = 0
            self._restarted = True

    async def _read_log(self, read: Callable[[], Awaitable[int]]) -> int:
        """``read()`` from the log, waiting out an unavailable one with backoff."""
        backoff = Backoff(initial=0.2, maximum=10.0)
        while True:
            try:
                return await read()
            except LogUnavailable as exc:
                log.warning("%s: cannot read the log: %s", self.collection, exc)
                await asyncio.sleep(backoff.next())

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
        restarted, self._restarted = self._restarted, False
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
            gap=gap or restarted,
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


def prepare_directory(directory: str | Path) -> None:
    """Make ``directory`` (``--write-changelist DIR``) or say why it cannot be written.

    Called at start-up on every publisher that may lead, not only when it is
    elected: an ``--ha`` standby that won the lease and only then found DIR
    unwritable would hold the lease without detecting anything.
    """
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RsNotifyError(f"--write-changelist {directory}: {exc}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise RsNotifyError(f"--write-changelist {directory}: not writable by this user")


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
        self.directory = Path(directory)
        self._tasks = TaskGroup()

    async def start(self, tasks: TaskGroup) -> None:
        """Spawn a writer per collection (in its own group: :meth:`stop` ends them)."""
        prepare_directory(self.directory)
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
