"""Detection for one collection: poll its Change List Index and lists, find new entries.

One :class:`CollectionWatcher` per Capability List.  A poll costs one
conditional GET of the Change List Index (or of the single Change List) and
one conditional, ranged GET of each list that may hold new entries, so an
idle Source answers ``304`` twice per poll and a growing list costs the bytes
that were appended.  The watcher never commits anything itself: it returns
what it found with the checkpoint after each entry, and the service logs the
entries and the checkpoint together, then calls :meth:`commit`.

With the ``order`` rule relaxed (``--lenient order``: a Source whose Change
Lists are not in forward chronological order, like resync-build's), lists are
read in document order and the checkpoint is unordered (it remembers the
identities it consumed, :mod:`rsnotify.tracker`): every entry is published
once, in the order the Source lists it, however the list grows, is regrouped
or replaced.  Each list read out of order is reported once, as a warning.

Why one module of ~560 lines: most of it is one class whose reads and passes
share one per-list state (validators, known tails, the lists a pass read
ahead), and that state's consistency is the point: a list read (ahead or not)
but never handed out must lose its validators, or the next conditional read
hides its entries.  Parsing off the loop is in :mod:`.listparse`, appended
bytes in :mod:`.incremental`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol

from .. import sitemap
from ..errors import CoverageHole, DocumentError, InvalidDocument
from ..model import Capability, Entry, Root
from ..tracker import (
    Checkpoint,
    Detection,
    ListRef,
    adopt_unordered,
    coverage_hole,
    detect,
    index_refs,
    lists_to_read,
    starting_point,
)
from . import listparse
from .access import DocumentAccess, Fetched
from .incremental import TailState, fragment, regrown, scan

log = logging.getLogger("rsnotify.publish")
# A list or appended fragment of this size (about 150 entries) and up is parsed off
# the loop (see _parsed); a whole list beyond the second bound is parsed as it is
# consumed, on the loop, so that its entries are never all held at once.
THREADED_BYTES = 64 * 1024
THREADED_MAX_BYTES = 8 * 1024 * 1024
# Lists a catch-up (a pass over more lists than this, read whole) reads and parses
# ahead of the one it detects: the parse of the next runs in the worker process
# (listparse) while the loop detects and applies this one.  Two, not one: a
# list's parse took a little longer than the loop's work on the one before.  A
# walk that follows push (the open list, and the one that just closed) reads and
# parses as before, in a thread: see listparse.
READ_AHEAD = 2
# Entries a pass without a limit (a Destination's walk) detects between two looks at
# the loop: see _detect_sliced.
DETECT_SLICE = 250
_LINE = re.compile(r"^line \d+: ")


@dataclass(slots=True)
class _ListState:
    etag: str | None = None
    last_modified: str | None = None
    tail: TailState | None = None


@dataclass(slots=True)
class PollResult:
    detections: list[Detection] = field(default_factory=list)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    bytes_read: int = 0
    full_reads: int = 0
    more: bool = False  # the pass stopped at its entry limit: poll again at once

    @property
    def count(self) -> int:
        return sum(len(d) for d in self.detections)


class ChangeWatcher(Protocol):
    """What the publisher and the subscriber need of one collection's detection.

    :class:`CollectionWatcher` reads Change Lists;
    :class:`~.snapshotwatch.SnapshotWatcher` compares Resource List
    snapshots for a Source that has none.  Both hand back what is new after
    a checkpoint, with the checkpoint after each change, and never commit
    anything themselves.
    """

    collection: str
    capability_list: str
    changelist_url: str
    checkpoint: Checkpoint
    holes: int
    unordered: bool
    unordered_lists: set[str]
    walks: str  # what a catch-up reads, for messages ("the Change List Index")
    polls: str  # what a poll reads, for messages ("the Change Lists")

    def list_urls(self) -> list[str]: ...

    @property
    def lists_read(self) -> int:
        """Moves whenever :meth:`list_urls` may have changed (a read of what names the lists)."""
        ...

    def coverage_start(self) -> datetime | None: ...

    def hole_at(self, checkpoint: Checkpoint) -> str | None: ...

    def commit(self, checkpoint: Checkpoint) -> None: ...

    def pin(self, *checkpoints: Checkpoint) -> None: ...

    def reset(self, checkpoint: Checkpoint) -> None: ...

    async def poll(self, limit: int | None = None, *, lists: int | None = None) -> PollResult: ...


# What reading a list gives: its entries, and their tracker.entry_digest in step when
# the parser computed them (a list parsed off the loop, for an unordered checkpoint).
_Listed = tuple[Iterator[Entry], Iterator[bytes] | None]


@dataclass(slots=True)
class _Pass:
    """A detection pass cut short at its entry limit, resumed by the next poll."""

    refs: list[ListRef]  # lists still to read, in order
    current: Checkpoint  # after the last entry handed out
    prefetched: dict[str, Fetched]
    changelist: str | None = None  # the list being read, with the rest of its entries
    entries: Iterator[Entry] | None = None
    digests: Iterator[bytes] | None = None  # of those entries, in step, if the parser made them
    adopt: bool = False  # an in-order checkpoint to turn unordered on the first list read
    offload: bool = False  # read ahead, parsed in the worker process (see poll)
    # Lists of ``refs`` read ahead (READ_AHEAD), by URL, each with its own byte counts.
    ahead: dict[str, tuple[asyncio.Task[_Listed | None], PollResult]] = field(default_factory=dict)


class CollectionWatcher:
    """Finds the Change List entries of one collection that come after its checkpoint."""

    walks = "the Change List Index"
    polls = "the Change Lists"

    def __init__(
        self,
        *,
        access: DocumentAccess,
        collection: str,
        capability_list: str,
        changelist_url: str,
        checkpoint: Checkpoint,
        from_beginning: bool = False,
        limits: sitemap.Limits = sitemap.DEFAULT_LIMITS,
        stop_at_holes: bool = False,
    ) -> None:
        self.access = access
        #: True (a Destination): :class:`CoverageHole` is raised; else logged and counted.
        self.stop_at_holes = stop_at_holes
        self.holes = 0  # coverage holes found (each distinct one counted once)
        self._lists_read = 0  # bumped with every new self._refs
        self._hole: str | None = None  # the last one reported
        self._seen_until: dict[str, datetime] = {}  # lists seen closed, by URL
        #: Lists seen out of forward chronological order (their times order nothing).
        self.unordered_lists: set[str] = set()
        self.collection = collection
        self.capability_list = capability_list
        self.changelist_url = changelist_url
        self.checkpoint = checkpoint
        self.from_beginning = from_beginning
        #: Lists out of order are read as they are, with an unordered checkpoint.
        self.unordered = sitemap.Lenient.ORDER in limits.lenient
        if self.unordered and limits.max_entries is None:
            # The checkpoint remembers tracker.MAX_KNOWN identities: a list must fit.
            limits = replace(limits, max_entries=sitemap.MAX_ENTRIES_PER_DOCUMENT)
        self.limits = limits
        self._warned: set[tuple[str, str]] = set()  # (list, kind of warning) reported
        self._single_list: bool | None = None  # unknown until the first read
        self._index_state = _ListState()
        self._refs: list[ListRef] = []
        self._lists: dict[str, _ListState] = {}
        self._pass: _Pass | None = None

    def list_urls(self) -> list[str]:
        """The Change Lists the index named at the last read."""
        return [ref.url for ref in self._refs]

    @property
    def lists_read(self) -> int:
        """How many times the lists were read anew (an unchanged index does not count)."""
        return self._lists_read

    def list_refs(self) -> list[ListRef]:
        """The Change Lists at the last read, with the intervals the index gives them."""
        return list(self._refs)

    @property
    def index_url(self) -> str | None:
        """The Change List Index read (None: a single Change List, or nothing read yet)."""
        return self.changelist_url if self._single_list is False else None

    def coverage_start(self) -> datetime | None:
        """The earliest ``from`` of the Change Lists at the last read (None: not known).

        Before it the Change Lists say nothing: a Destination whose position
        is older was away longer than they cover.
        """
        starts = [ref.from_ for ref in self._refs if ref.from_ is not None]
        return min(starts) if starts else None

    def commit(self, checkpoint: Checkpoint) -> None:
        """The service logged everything up to ``checkpoint``."""
        self.checkpoint = checkpoint

    def pin(self, *checkpoints: Checkpoint) -> None:
        """Nothing to keep: a Change List position names only documents of the Source."""

    def reset(self, checkpoint: Checkpoint) -> None:
        """Forget cached reads (after a log conflict or a restart of the Source)."""
        if self._pass is not None:
            self._abandon(self._pass)
        self.checkpoint = checkpoint
        self._index_state = _ListState()
        self._lists.clear()
        self._pass = None

    def _abandon(self, work: _Pass) -> None:
        """Drop what ``work`` read ahead and never handed out.

        Reading a list remembers its validators and tail (the next read is
        conditional, ranged): a list read ahead but never detected must be
        read whole again, or a ``304`` would hide its entries.
        """
        for url, (task, _) in work.ahead.items():
            task.cancel()
            self._lists.pop(url, None)
        work.ahead.clear()

    def _read_ahead(self, work: _Pass) -> None:
        """Start reading (and parsing) the next :data:`READ_AHEAD` lists of ``work``."""
        for ref in work.refs[:READ_AHEAD]:
            if ref.url not in work.ahead:
                counts = PollResult()
                task = asyncio.ensure_future(
                    self._read_list(
                        ref.url, counts, work.prefetched.get(ref.url), whole=True, offload=True
                    )
                )
                # Its error, if any, is raised when the list's turn comes (or dropped
                # with the pass): never reported as an exception nobody retrieved.
                task.add_done_callback(_retrieve)
                work.ahead[ref.url] = (task, counts)

    # -- reading -----------------------------------------------------------------

    def _entries(self, body: bytes, url: str) -> Iterator[Entry]:
        reader = sitemap.DocumentReader(body, limits=self.limits)
        yield from reader
        self._report(url, reader.unordered, reader.warnings)

    def _report(self, url: str, unordered: int, warnings: list[str]) -> None:
        """What the reader of ``url`` noticed: order (for the caller), relaxed rules (logged)."""
        if unordered:
            self.unordered_lists.add(url)
        for warning in warnings:
            # Each kind once per list at warning level: an open list is read on every change.
            kind = (url, _LINE.sub("", warning).split(":")[0])
            level = logging.DEBUG if kind in self._warned else logging.WARNING
            self._warned.add(kind)
            log.log(level, "%s: %s: %s", self.collection, url, warning)

    async def _parsed(self, document: bytes, url: str, *, offload: bool = False) -> _Listed:
        """Every entry of ``document``; a large one parsed off the loop.

        A Destination's walk that follows push reads a thousand new entries
        at once (~0.4 MB, 10-20 ms of parsing): on the loop, every
        notification waited for it.  Off the loop (:func:`listparse.parse_whole`:
        in the worker process, else a thread, where the reader is built and
        drained in that one thread: an lxml parser driven from two threads
        crashed, see :mod:`.snapshotwatch`) the loop goes on meanwhile.  The
        usual fragment, a few entries, is parsed in place: the hop would cost
        more than the parse.  ``offload``: one of several lists a pass reads
        (a catch-up), parsed in the worker process if there is one, which
        also digests each entry for an unordered checkpoint's detection.
        """
        if len(document) < THREADED_BYTES:
            return iter(list(self._entries(document, url))), None  # whole: errors now
        parsed = await listparse.parse_whole(
            document, self.limits, digests=offload and self.unordered, process=offload
        )
        self._report(url, parsed.unordered, parsed.warnings)
        digests = None if parsed.digests is None else iter(parsed.digests)
        return iter(parsed.entries), digests

    async def _read_list(
        self,
        url: str,
        result: PollResult,
        prefetched: Fetched | None,
        *,
        whole: bool = False,
        offload: bool = False,
    ) -> _Listed | None:
        """New-looking entries of one list (None: unchanged since the last read).

        ``whole``: the caller consumes every entry of the list at once (no
        entry limit), so a list read whole may be parsed up front, off the
        loop (:meth:`_parsed`), when its size is within
        :data:`THREADED_MAX_BYTES`; ``offload``: in the worker process.
        """
        state = self._lists.setdefault(url, _ListState())
        if prefetched is not None:
            fetched = prefetched
        else:
            fetched = await self.access.read(
                url,
                etag=state.etag,
                last_modified=state.last_modified,
                range_start=state.tail.range_start if state.tail is not None else None,
            )
        if fetched.not_modified:
            return None
        result.bytes_read += len(fetched.body)
        state.etag, state.last_modified = fetched.etag, fetched.last_modified
        if fetched.range_start is not None and state.tail is not None:
            piece = fragment(state.tail, fetched.body, fetched.range_start)
            if piece is None:
                log.info(
                    "%s: %s changed before the known end; reading it whole", self.collection, url
                )
                fetched = await self.access.read(url)
                result.bytes_read += len(fetched.body)
                state.etag, state.last_modified = fetched.etag, fetched.last_modified
                piece = regrown(state.tail, fetched.body)  # closed: only its header changed
            if piece is not None:
                document, tail = piece
                listed = await self._parsed(document, url)  # parse before moving on
                state.tail = tail
                return listed
        result.full_reads += 1
        state.tail = scan(fetched.body)
        if whole and THREADED_BYTES <= len(fetched.body) <= THREADED_MAX_BYTES:
            return await self._parsed(fetched.body, url, offload=offload)
        return self._entries(fetched.body, url), None

    async def _refresh_index(self) -> dict[str, Fetched]:
        """Update the list of Change Lists; returns bodies already read (single-list case)."""
        if self._single_list:
            return {}
        state = self._index_state
        fetched = await self.access.read(
            self.changelist_url, etag=state.etag, last_modified=state.last_modified
        )
        if fetched.not_modified:
            return {}
        reader = sitemap.DocumentReader(fetched.body, limits=self.limits)
        header = reader.header
        if header.capability != Capability.CHANGELIST:
            raise InvalidDocument(
                f"{self.changelist_url} has capability {header.capability!r}, not changelist"
            )
        if header.root is Root.URLSET:  # a single Change List, no index
            self._single_list = True
            self._refs = [ListRef(self.changelist_url, header.from_, header.until)]
            self._lists_read += 1
            return {self.changelist_url: fetched}
        self._single_list = False
        state.etag, state.last_modified = fetched.etag, fetched.last_modified
        self._refs = index_refs(reader)
        self._lists_read += 1
        self._seen_until.update((r.url, r.until) for r in self._refs if r.until is not None)
        return {}

    def hole_at(self, checkpoint: Checkpoint) -> str | None:
        """The hole the lists read last leave after ``checkpoint`` (None: none), quietly.

        For a Destination that just re-baselined: a hole that remains can be
        closed by nothing in the documents.  It is then read through (the
        next poll sees a hole already reported and says nothing).
        """
        hole = coverage_hole(self._refs, checkpoint, self._seen_until)
        self._hole = hole
        return hole

    def _check_coverage(self, checkpoint: Checkpoint) -> None:
        """Raise or report a hole between the checkpoint and the lists still listed.

        Each distinct hole once: after a Destination's re-baseline the same
        hole (the snapshot itself older than the lists) is read through.
        """
        hole = coverage_hole(self._refs, checkpoint, self._seen_until)
        if hole is None:
            self._hole = None
            return
        if hole == self._hole:
            return  # reported (or raised) already: the reader decided what to do
        self.holes += 1
        self._hole = hole
        if self.stop_at_holes:
            raise CoverageHole(hole)
        log.warning("%s: %s", self.collection, hole, extra={"collection": self.collection})

    def _in_mode(self, checkpoint: Checkpoint) -> tuple[Checkpoint, bool]:
        """The checkpoint in this watcher's reading mode, and whether it must adopt a list.

        An in-order checkpoint read unordered cannot know which older entries
        it consumed until it sees the list: :func:`adopt_unordered` then.
        """
        if not self.unordered:
            return checkpoint.ordered(), False
        if checkpoint.unordered:
            return checkpoint, False
        if not checkpoint.started or checkpoint.last_time is None:
            return adopt_unordered(checkpoint, ()), False
        return checkpoint, True

    async def poll(self, limit: int | None = None, *, lists: int | None = None) -> PollResult:
        """One detection pass.  Raises FetchError / DocumentError for the caller's backoff.

        With ``limit``, a pass returns after that many new entries with
        ``more`` set, and the next call carries on where it stopped (from the
        same bytes, not a new read), so the caller can log and push the first
        thousands of entries of a 50,000-entry list before the rest is parsed.
        ``lists`` does the same after that many whole lists were read, for a
        caller that needs each list whole (a Destination sorts a list read
        out of order, which it knows only at the list's end) and wants to
        apply one while the next is parsed.  The caller must log what a pass
        returned before polling again.
        """
        result = PollResult(checkpoint=self.checkpoint)
        work = self._pass
        if work is None:
            prefetched = await self._refresh_index()
            if not self._refs:
                return result
            if not self.checkpoint.started and not self.from_beginning:
                # First run: start at the current end; Destinations baseline from the Resource List.
                newest = self._refs[-1]
                listed = await self._read_list(newest.url, result, prefetched.get(newest.url))
                result.checkpoint = starting_point(
                    listed[0] if listed else (), newest.url, unordered=self.unordered
                )
                return result
            current, adopt = self._in_mode(self.checkpoint)
            self._check_coverage(current)
            refs = lists_to_read(self._refs, current)
            work = _Pass(refs, current, prefetched, adopt=adopt)
            # A catch-up: more lists than a walk that follows push reads (the open
            # one, and the one that just closed), all wanted whole.
            work.offload = limit is None and len(refs) > READ_AHEAD
        self._pass = None  # set again only if this pass stops at its limit
        try:
            return await self._poll(work, result, limit, lists)
        except BaseException:
            self._abandon(work)
            raise

    async def _poll(
        self, work: _Pass, result: PollResult, limit: int | None, lists: int | None
    ) -> PollResult:
        """:meth:`poll`'s pass over the lists of ``work``."""
        budget = limit
        read = 0  # whole lists read by this call
        while True:
            if work.entries is None:
                if not work.refs:
                    break
                ref = work.refs.pop(0)
                ahead = work.ahead.pop(ref.url, None)
                try:
                    if ahead is not None:
                        reading, counts = ahead
                        listed = await reading
                        result.bytes_read += counts.bytes_read
                        result.full_reads += counts.full_reads
                    else:
                        listed = await self._read_list(
                            ref.url,
                            result,
                            work.prefetched.get(ref.url),
                            whole=limit is None,
                            offload=work.offload,
                        )
                except DocumentError:
                    self._lists.pop(ref.url, None)  # read it whole next time
                    raise
                if work.offload:
                    self._read_ahead(work)
                if listed is None:
                    continue
                entries, digests = listed
                if work.adopt:  # seed the memory from the first list actually read
                    held = list(entries)
                    work.current = adopt_unordered(work.current, held)
                    work.adopt, entries = False, iter(held)
                work.changelist, work.entries, work.digests = ref.url, entries, digests
            assert work.changelist is not None
            try:
                if budget is None:
                    found = await _detect_sliced(
                        work.entries, work.changelist, work.current, work.digests
                    )
                else:
                    found = detect(
                        work.entries,
                        work.changelist,
                        work.current,
                        limit=budget,
                        digests=work.digests,
                    )
            except DocumentError:
                self._lists.pop(work.changelist, None)
                raise
            if found.entries:
                result.detections.append(found)
                work.current = found.checkpoints[-1]
            if budget is not None:
                budget -= len(found)
                if budget <= 0:
                    self._pass = work
                    result.more = True
                    result.checkpoint = work.current
                    return result
            work.entries = work.digests = None
            read += 1
            if lists is not None and read >= lists and work.refs:
                self._pass = work
                result.more = True
                result.checkpoint = work.current
                return result
        current = work.current
        state = self._lists.get(current.changelist or "")
        if state is not None:
            current = current.with_validators(state.etag, state.last_modified)
        result.checkpoint = current
        return result


def _retrieve(task: asyncio.Task[_Listed | None]) -> None:
    """Take an abandoned read's outcome, so that its error is not reported as lost."""
    if not task.cancelled():
        task.exception()


async def _detect_sliced(
    entries: Iterator[Entry],
    changelist: str,
    start: Checkpoint,
    digests: Iterator[bytes] | None = None,
) -> Detection:
    """:func:`detect` of what ``entries`` holds, :data:`DETECT_SLICE` entries at a time.

    A Destination's walk detects whole lists: at 200 changes/s, a walk
    following push met 1,000 entries and detected them in one step of 5-7 ms
    of the event loop, beside the step that read the first of them; push
    notifications waited behind it.  Each slice resumes from the last
    checkpoint found, so the result is the one :func:`detect` gives in one
    call (a property test holds it to that), lists read out of order
    included: the caller still gets one detection per list.
    """
    found = Detection(changelist=changelist)
    current = start
    while True:
        chunk = list(itertools.islice(entries, DETECT_SLICE))
        part = detect(chunk, changelist, current, digests=digests)
        if part.entries:
            found.entries += part.entries
            found.checkpoints.extend(part.checkpoints)
            current = part.checkpoints[-1]
        if len(chunk) < DETECT_SLICE:
            return found
        await asyncio.sleep(0)
