"""Detection for a collection without Change Lists: successive Resource List snapshots.

:class:`SnapshotWatcher` answers what :class:`~.watcher.CollectionWatcher`
answers (the new changes after a checkpoint, with the checkpoint after each),
for a Capability List that offers a Resource List (or Resource List Index)
and no Change List.  The publisher logs and pushes what it finds as
notifications marked *derived* (:class:`~rsnotify.tracker.Snapshots`); a
Destination applies them like Change List entries.  The rules are
:mod:`.snapshot`'s; this module reads the documents and keeps the maps.

What a poll costs
    One conditional GET of the Resource List, or of the index and of each
    of its parts.  A part answering ``304``, or whose bytes hash as before
    (a server without validators), is not parsed: a Source of a million
    resources in 20 parts that changed one part costs one parse of 50,000
    entries and that part's maps in memory, as compressed bytes and a table
    of integers (:func:`.snapshot.compare_part`).  A part is hashed and
    parsed from a file, never held as bytes: a directory Source's own, or
    the HTTP body spooled to a temporary file as it arrives
    (:class:`~.access.HttpAccess`).  ``bench.snapshot_diff``: 45 MB peak RSS
    for that poll, 32 MB of it the interpreter and libraries.  Parsing runs
    in a worker thread, off the loop that serves push.

Where the maps live
    In a :class:`~.snapshotblobs.BlobStore`, by content (:func:`.snapshot.map_key`), written
    before any checkpoint names them; the checkpoint holds only the
    snapshot's ``at``, validators and map keys.  A map the store lost (a
    wiped state directory) is a :class:`~rsnotify.errors.CoverageHole`: a
    Destination re-baselines, a publisher records the current snapshot and
    says what it could not compare.

First read
    Without a snapshot in the checkpoint there is nothing to compare with.
    A publisher records the snapshot and publishes from the next change
    (as it starts at the end of a Change List).  A Destination has just
    taken its baseline from the Resource List (or a Resource Dump): when
    the list's ``at`` is the baseline's, nothing happened in between and
    the snapshot is recorded; otherwise it re-baselines once
    (``CoverageHole``), then records.

Why one module of ~720 lines
    Reading a snapshot, comparing its parts, resuming a half-consumed diff
    and keeping the maps that checkpoints name are one state machine over
    one checkpoint format: split, each piece would need the others'
    invariants (which maps a position names, when a digest may stand for
    bytes).  The pure rules are :mod:`.snapshot`'s, the map storage
    :mod:`.snapshotblobs`'.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import deque
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import IO, cast

from .. import sitemap, w3cdt
from ..errors import CoverageHole, InvalidDocument
from ..model import Capability, Entry
from ..tracker import Checkpoint, Detection, SnapshotPosition, Snapshots
from .access import DocumentAccess, Fetched
from .snapshot import (
    Comparison,
    Diff,
    PartState,
    SnapshotState,
    change_order,
    compare_part,
    iter_map,
    map_key,
    settle,
)
from .snapshotblobs import BlobStore
from .watcher import PollResult

log = logging.getLogger("rsnotify.snapshot")

#: How many times the Source may move on while one diff is half consumed
#: before only a new baseline can tell what the Destination holds (each is one
#: more read of the Source per poll until the diff is consumed).
MAX_BASES = 4

__all__ = ["SnapshotWatcher"]

# Checkpoints committed and not yet saved whose maps a watcher keeps (pin).  A
# Destination submits far fewer diffs than this ahead of its saved cursor.
UNSAVED = 64
# Polls in a row that may find a part dated unlike its index before the index's
# dates are taken as unreliable (see SnapshotWatcher._torn_read).
TORN_POLLS = 3


@dataclass(slots=True)
class _Parsed:
    """A list parsed: its ``at``, and the parts it names (an index) or its new map."""

    at: datetime | None
    parts: list[str] | None
    map: bytes = b""
    count: int = 0
    declared: dict[str, datetime] = field(default_factory=dict)  # an index's parts' 'at'


@dataclass(slots=True)
class _Read:
    """One snapshot read and compared with the one before."""

    state: SnapshotState
    changes: list[Entry]
    also: tuple[str, ...] = ()  # other bases of the diff (SnapshotPosition.also)


class SnapshotWatcher:
    """Finds what changed in one collection's Resource List since its checkpoint."""

    unordered = False  # the interface of CollectionWatcher: a snapshot has no order to relax
    walks = polls = "the Resource List"

    def __init__(
        self,
        *,
        access: DocumentAccess,
        collection: str,
        capability_list: str,
        resourcelist_url: str,
        checkpoint: Checkpoint,
        blobs: BlobStore,
        limits: sitemap.Limits = sitemap.DEFAULT_LIMITS,
        stop_at_holes: bool = False,
    ) -> None:
        self.access = access
        self.collection = collection
        self.capability_list = capability_list
        self.changelist_url = resourcelist_url  # what detections name as their list
        self.resourcelist_url = resourcelist_url
        self.blobs = blobs
        self.limits = limits
        self.stop_at_holes = stop_at_holes
        self.holes = 0
        self.unordered_lists: set[str] = set()
        self.checkpoint = checkpoint
        self._state: SnapshotState | None = None  # latest read, validators included
        self._states_read = 0  # bumped with every new self._state (lists_read)
        self._queue: deque[tuple[Entry, Checkpoint]] = deque()
        self._derived: Snapshots | None = None
        # Checkpoints committed and not yet known durable, oldest first, with their
        # map keys (see pin); only the one before the current until pin is called.
        self._unsaved: deque[tuple[Checkpoint, set[str]]] = deque(maxlen=1)
        self._pinned: set[str] = set()  # map keys of the durable checkpoint (pin)
        self._rebaselined = False  # a Destination re-baselines once before recording
        self._torn = 0  # polls in a row that found a part unlike its index (_torn_read)
        self._index_unreliable = False  # its parts disagreed for TORN_POLLS polls: no check
        self.reset(checkpoint)

    # -- the CollectionWatcher interface ----------------------------------------------

    @property
    def lists_read(self) -> int:
        """Moves with every snapshot read, which may name other parts."""
        return self._states_read

    def list_urls(self) -> list[str]:
        """The Resource List (or Index) and the parts named at the last read."""
        state = self._state
        parts = [url for url in state.parts if url != self.resourcelist_url] if state else []
        return [self.resourcelist_url, *parts]

    def coverage_start(self) -> datetime | None:
        return None

    def hole_at(self, checkpoint: Checkpoint) -> str | None:
        return None

    def commit(self, checkpoint: Checkpoint) -> None:
        """The caller logged (or submitted) everything up to ``checkpoint``.

        The checkpoint it replaces keeps its maps until :meth:`pin` says a
        later one is durable: at most :data:`UNSAVED` of them, the oldest
        dropped beyond that (a cursor saved at one of those costs a
        re-baseline, never a lost change).  A caller that never pins (the
        publisher: its log holds the checkpoint once committed) keeps the
        previous one only.
        """
        old = self.checkpoint
        if old.snapshot is not None and old != checkpoint:
            self._unsaved.append((old, _keys(old.snapshot)))
        self.checkpoint = checkpoint
        if checkpoint.snapshot is not None:
            self._rebaselined = False

    def pin(self, *checkpoints: Checkpoint) -> None:
        """``checkpoints`` are durable (a saved cursor): keep the maps they name.

        A Destination commits when it submits a change and saves its cursor
        when the change is applied, some polls later; a restart goes on from
        the saved cursor, whose maps must not have been swept meanwhile, nor
        those of the checkpoints committed since, which a later save names.
        The checkpoints committed up to the latest one pinned are released:
        the cursor never goes back.
        """
        self._pinned = set()
        for checkpoint in checkpoints:
            if checkpoint.snapshot is not None:
                self._pinned |= _keys(checkpoint.snapshot)
        unsaved = list(self._unsaved)
        pinned = [i for i, (checkpoint, _) in enumerate(unsaved) if checkpoint in checkpoints]
        start = len(unsaved) if self.checkpoint in checkpoints else max(pinned, default=-1) + 1
        # From the first pin on, a caller that saves later: up to UNSAVED are kept.
        self._unsaved = deque(unsaved[start:], maxlen=UNSAVED)

    def reset(self, checkpoint: Checkpoint) -> None:
        """Forget what was read and not committed; go on from ``checkpoint``."""
        self.checkpoint = checkpoint
        self._queue.clear()
        position = checkpoint.snapshot
        self._state = SnapshotState.from_json(position.state) if position is not None else None
        self._states_read += 1

    async def poll(self, limit: int | None = None, *, lists: int | None = None) -> PollResult:
        """The changes after the checkpoint, ``limit`` at a time (``more`` when some wait)."""
        if not self._queue:
            await self.blobs.keep(self._referenced())
            read = await self._read()
            if read is None:
                return PollResult(checkpoint=self.checkpoint)
            if not read.changes:  # only validators or part layout moved: record the snapshot
                self._state = read.state
                self._states_read += 1
                recorded = _at(read.state, SnapshotPosition(read.state.to_json()))
                return PollResult(checkpoint=recorded)
            self._enqueue(read)
        return self._hand_out(limit)

    # -- internals ------------------------------------------------------------------

    def _referenced(self) -> set[str]:
        keys = set(self._pinned)
        for _, unsaved in self._unsaved:
            keys |= unsaved
        if self.checkpoint.snapshot is not None:
            keys |= _keys(self.checkpoint.snapshot)
        if self._state is not None:
            keys |= self._state.keys
        return keys

    def _enqueue(self, read: _Read) -> None:
        position = self.checkpoint.snapshot
        assert position is not None
        base = position.base if position.base is not None else position.state
        since = SnapshotState.from_json(base).at
        text = read.state.to_json()
        changes = read.changes
        skip = position.done if position.base is not None else 0
        pending = SnapshotState.from_json(position.state) if skip else None
        same = pending is not None and _content(read.state) == _content(pending)
        if skip and (not same or skip > len(changes)):
            # The Source changed again while a diff was half consumed: the part
            # consumed before the restart may come again (a repeat is a no-op).
            log.warning(
                "%s: the Resource List changed while its previous changes were being "
                "consumed; up to %d change(s) may be delivered twice",
                self.collection,
                skip,
                extra={"collection": self.collection},
            )
            skip = 0
        last = len(changes) - 1
        also = read.also
        for i in range(skip, len(changes)):
            done = (
                SnapshotPosition(text) if i == last else SnapshotPosition(text, base, i + 1, also)
            )
            self._queue.append((changes[i], _at(read.state, done)))
        self._state = read.state
        self._states_read += 1
        self._derived = Snapshots(self.resourcelist_url, since, read.state.at)

    def _hand_out(self, limit: int | None) -> PollResult:
        taken = len(self._queue) if limit is None else min(limit, len(self._queue))
        found = Detection(changelist=self.resourcelist_url, derived=self._derived)
        for _ in range(taken):
            entry, checkpoint = self._queue.popleft()
            found.entries.append(entry)
            found.checkpoints.append(checkpoint)
        end = found.checkpoints[-1] if found.checkpoints else self.checkpoint
        return PollResult(
            detections=[found] if found.entries else [], checkpoint=end, more=bool(self._queue)
        )

    async def _read(self) -> _Read | None:
        """Read the snapshot, compare the parts that changed; None: nothing to do."""
        position = self.checkpoint.snapshot
        if position is None:
            return await self._first_read()
        if position.base is not None:
            return await self._resume(position)
        assert self._state is not None  # reset() read it from the checkpoint
        return await self._compare(self._state, validators=self._state)

    async def _resume(self, position: SnapshotPosition) -> _Read | None:
        """A half-consumed diff, computed again from its base(s) and skipped into.

        While the Source still lists what the position's ``state`` lists, that
        is the same diff.  If it moved on, the Destination holds, of each
        resource, either its state in a base or in the snapshot that was half
        consumed; so the new diff is the union of the differences from each
        of those to what the Source lists now (a repeat is a no-op, a missed
        deletion is not: a resource created in the consumed part and deleted
        since is in neither the base nor the new snapshot).
        """
        assert position.base is not None
        bases = [position.base, *position.also]
        reads = [await self._diff_from(SnapshotState.from_json(text)) for text in bases]
        pending = SnapshotState.from_json(position.state)
        moved = await self._diff_from(pending)
        now = _content(moved.state)
        if any(_content(read.state) != now for read in reads):
            return None  # the Source changed between the reads: the next poll reads again
        if now == _content(pending):  # the same diff as before the restart
            changes, also = _union(read.changes for read in reads), position.also
        else:
            changes = _union([*(read.changes for read in reads), moved.changes])
            also = (*position.also, position.state)
        if len(also) > MAX_BASES:
            self.holes += 1
            raise CoverageHole(
                f"{self.resourcelist_url}: the Resource List changed {len(also)} times "
                "while one diff was being consumed; only a new baseline can tell what "
                "the Destination holds"
            )
        return _Read(moved.state, changes, also)  # no changes: poll() records the snapshot

    async def _diff_from(self, before: SnapshotState) -> _Read:
        """The differences from ``before`` to what the Source lists now."""
        read = await self._compare(before, validators=before)
        return read if read is not None else _Read(before, [])

    async def _first_read(self) -> _Read | None:
        state = await self._record()
        if state is None:
            return None  # read mid-rewrite (_torn_read): recorded at a later poll
        baseline_at = self.checkpoint.last_time
        if self.stop_at_holes and not self._rebaselined and baseline_at != state.at:
            self._rebaselined = True
            self.holes += 1
            raise CoverageHole(
                f"{self.resourcelist_url}: the Resource List is dated "
                f"{w3cdt.format(state.at)}, the baseline "
                f"{w3cdt.format(baseline_at) if baseline_at else 'unknown'}: what changed "
                "in between can only be found by a new baseline (Z39.99 section 7: a "
                "Resource List reflects the resources as of its 'at')"
            )
        return _Read(state, [])

    async def _record(self) -> SnapshotState | None:
        """Read every part and store its map: the first snapshot of this collection.

        None for a snapshot read while the Source rewrote it (:meth:`_torn_read`):
        recorded half-way, its next comparison would see a moved resource
        created (or deleted) in the part it had not reached yet.
        """
        empty = SnapshotState(url=self.resourcelist_url, at=w3cdt.now())
        read = await self._compare(empty, validators=None, keep_changes=False)
        return None if read is None else read.state

    async def _compare(
        self,
        before: SnapshotState,
        *,
        validators: SnapshotState | None,
        keep_changes: bool = True,
    ) -> _Read | None:
        """Read the snapshot (conditionally, against ``validators``), compare it with ``before``.

        None when its content is ``before``'s (the validators read are kept
        for the next poll), or when it was read mid-rewrite (:meth:`_torn_read`).
        ``keep_changes=False``: only record the maps.
        """
        url = self.resourcelist_url
        top = await self.access.read(
            url,
            etag=validators.etag if validators else None,
            last_modified=validators.last_modified if validators else None,
            stream=True,
        )
        with closing(top):
            return await self._compare_top(top, before, validators, keep_changes)

    async def _compare_top(
        self,
        top: Fetched,
        before: SnapshotState,
        validators: SnapshotState | None,
        keep_changes: bool,
    ) -> _Read | None:
        """:meth:`_compare` once the Resource List (or Index) is read (``top``, open)."""
        url = self.resourcelist_url
        if top.not_modified and (validators is None or not validators.index):
            return None
        # Recording keeps no changes: a first read of a million resources holds one
        # part's map at a time, never a million entries.
        diff = Diff() if keep_changes else None
        state = SnapshotState(url=url, at=before.at, etag=top.etag, last_modified=top.last_modified)
        part_urls: list[str] = []
        declared: dict[str, datetime] = {}  # what the index says each part's 'at' is
        if top.not_modified:  # the index is the same: its parts may not be
            assert validators is not None
            state.index = True
            part_urls = list(validators.parts)
            declared = {
                u: p.declared for u, p in validators.parts.items() if p.declared is not None
            }
            times: list[datetime | None] = [validators.at]
        else:
            digest = await _digest(top)
            same = before.parts.get(url)
            if not before.index and same is not None and same.digest == digest:
                # The bytes of the Resource List compared last time: not parsed.
                state.parts[url] = _unchanged(same, top, digest)
                times = []
            else:
                parsed = _HashedReads(top)
                result = await self._parse(parsed, same, diff, part=False)
                times = [result.at]
                if result.parts is not None:
                    state.index = True
                    part_urls, declared = result.parts, result.declared
                else:
                    state.parts[url] = await self._store(url, parsed, digest, result)
        # The parts before that the snapshot no longer names (an index's parts
        # when it is now a plain list, the list itself when it is now an index).
        named = set(part_urls) if state.index else set(state.parts)
        orphans = [p for u, p in before.parts.items() if u not in named]
        renamed: Comparison | None = None
        if diff is not None and orphans and any(u not in before.parts for u in part_urls):
            # Parts gone and parts new: a re-sharded index (or a list grown into
            # one); the new parts are compared with the gone ones' maps.
            maps = [await self._map(p) for p in orphans]
            renamed = await asyncio.to_thread(Comparison, maps, diff)
        for part_url in part_urls:
            seen = validators.parts.get(part_url) if validators else None
            part = await self._read_part(part_url, seen, before, diff, times, renamed)
            state.parts[part_url] = replace(part, declared=declared.get(part_url))
        if self._torn_read(state):
            return None  # read again at the next poll
        if renamed is not None:  # the gone parts' locs that no new part lists
            await asyncio.to_thread(renamed.finish)
        elif diff is not None:
            for gone in orphans:  # parts the index no longer names
                for loc, fp in iter_map(await self._map(gone)):
                    diff.removed.setdefault(loc, fp)
        if _content(state) == _content(before):
            self._state = state  # same resources: keep the validators just read
            self._states_read += 1
            return None
        dated = [t for t in times if t is not None]
        # A Source that rewrote a part without moving any 'at' still changed it.
        state.at = max([*dated, before.at]) if keep_changes else max(dated, default=w3cdt.now())
        changes = settle(diff, since=before.at, at=state.at) if diff is not None else []
        return _Read(state, changes)

    def _torn_read(self, state: SnapshotState) -> bool:
        """A part is not the one its index describes: read while the Source rewrote its lists?

        Z39.99 section 10.2: each ``<sitemap>`` of a Resource List Index may
        carry the ``at`` of its Resource List.  A Source rewrites its parts,
        then its index; read between the two, a resource moved from one part
        to another is in neither (a deletion now, a creation at the next
        poll) or in both.  So a part whose own ``at`` differs from its
        index's is not compared: the next poll reads the snapshot again.  A
        Source caught mid-rewrite is done by the next poll or so; one whose
        parts still disagree after :data:`TORN_POLLS` polls has an index that
        does not keep its parts' ``at``, and from then on this watcher
        compares its lists as they are (one warning says so).
        """
        if self._index_unreliable:
            return False
        torn = [part for part in state.parts.values() if part.torn]
        if not torn:
            self._torn = 0
            return False
        first = torn[0]
        assert first.at is not None and first.declared is not None
        detail = (
            f"{first.url} is dated {w3cdt.format(first.at)}, its index says "
            f"{w3cdt.format(first.declared)} (Z39.99 section 10.2)"
        )
        if self._torn < TORN_POLLS:
            self._torn += 1
            log.info("%s: %s: read again at the next poll", self.collection, detail,
                     extra={"collection": self.collection})  # fmt: skip
            return True
        self._index_unreliable = True
        log.warning(
            "%s: %s, %d polls in a row: the index does not keep its parts' dates; "
            "comparing the lists as they are from now on",
            self.collection,
            detail,
            TORN_POLLS + 1,
            extra={"collection": self.collection},
        )
        return False

    def _reader(self, fetched: Fetched, *, part: bool = False) -> sitemap.DocumentReader:
        source = fetched.file if fetched.file is not None else fetched.body
        reader = sitemap.DocumentReader(source, limits=self.limits)
        header = reader.header
        what = "a Resource List Index part" if part else "the Resource List"
        if header.capability != Capability.RESOURCELIST:
            raise InvalidDocument(
                f"{fetched.url}: {what} has capability {header.capability!r}, not "
                "'resourcelist' (Z39.99 section 7)"
            )
        if part and header.is_index:
            raise InvalidDocument(
                f"{fetched.url}: a Resource List Index names another index; Z39.99 "
                "section 7 allows one level"
            )
        return reader

    async def _read_part(
        self,
        url: str,
        seen: PartState | None,
        before: SnapshotState,
        diff: Diff | None,
        times: list[datetime | None],
        renamed: Comparison | None = None,
    ) -> PartState:
        """One part of an index: not modified, the same bytes, or parsed and compared
        (a part ``before`` did not name, with the gone parts in ``renamed``).

        The body is hashed before any reader is built: a reader holds its
        body in a reference cycle (the reader and its element generator)
        until the cyclic GC runs, so a reader built for bytes that turn out
        unchanged kept every such body alive (238 MB re-reading a
        million-resource index without validators; ``bench.snapshot_diff``).
        The body goes when this returns, before the next part is read.
        Same bytes, same ``at``: it already counts in ``before.at``.
        """
        fetched = await self.access.read(
            url,
            etag=seen.etag if seen else None,
            last_modified=seen.last_modified if seen else None,
            stream=True,
        )
        with closing(fetched):
            if fetched.not_modified:  # 304: as read last time
                assert seen is not None
                return seen
            digest = await _digest(fetched)
            old = before.parts.get(url)
            if old is not None and old.digest == digest:
                return _unchanged(old, fetched, digest)
            parsed = _HashedReads(fetched)
            result = await self._parse(
                parsed, old, diff, part=True, renamed=renamed if old is None else None
            )
            times.append(result.at)
            return await self._store(url, parsed, digest, result)

    async def _parse(
        self,
        parsed: _HashedReads,
        old: PartState | None,
        diff: Diff | None,
        *,
        part: bool,
        renamed: Comparison | None = None,
    ) -> _Parsed:
        """Parse a list whose bytes changed and compare it with its old map (into ``diff``),
        or with the maps of the parts an index no longer names (``renamed``).

        In a worker thread: 50,000 entries take ~0.5 s, which on the loop
        would hold up push for every collection.  The reader is built and
        drained in that one thread: an lxml parser driven from a thread other
        than the one that made it can crash the process.
        """
        old_map = await self._map(old) if old is not None else b""

        def work() -> _Parsed:
            reader = self._reader(parsed.fetched, part=part)
            header = reader.header
            if header.is_index:  # the top document only (a part that is one is refused)
                parts, declared = [], {}
                for entry in reader:
                    parts.append(entry.loc)
                    if entry.at is not None:
                        declared[entry.loc] = entry.at
                return _Parsed(header.at, parts, declared=declared)
            if renamed is not None:
                data, count = renamed.part(reader)
            else:
                data, count = compare_part(old_map, reader, diff)
            return _Parsed(header.at, None, data, count)

        return await asyncio.to_thread(work)

    async def _store(
        self, url: str, parsed: _HashedReads, digest: str, result: _Parsed
    ) -> PartState:
        """A compared part's new map, stored durably before any checkpoint names it."""
        key = map_key(result.map)
        await self.blobs.put(key, result.map)
        fetched = parsed.source
        part = PartState(
            url, key, digest, fetched.etag, fetched.last_modified, result.count, at=result.at
        )
        return parsed.named(part)

    async def _map(self, part: PartState) -> bytes:
        """A part's stored map (:class:`~.snapshot.MapWriter`), read by :func:`compare_part`."""
        data = await self.blobs.get(part.key)
        if data is None:
            self.holes += 1
            raise CoverageHole(
                f"{part.url}: the map of its previous snapshot is gone from the state "
                "directory; the changes since it cannot be told apart"
            )
        return data


async def _digest(fetched: Fetched) -> str:
    """A part's body digest: an unconditional re-read of the same bytes is no change.

    A file is hashed where it is (off the loop) and rewound for the reader;
    a part parsed is stored with the digest of the bytes parsed
    (:class:`_HashedReads`), which a Source rewriting it in place may change.
    """
    if fetched.file is None:
        return hashlib.sha256(fetched.body).hexdigest()
    file = fetched.file

    def digest() -> str:
        value = hashlib.sha256()
        while chunk := file.read(1 << 18):
            value.update(chunk)
        file.seek(0)
        return value.hexdigest()

    return await asyncio.to_thread(digest)


class _HashedReads:
    """``fetched``'s file, hashed as a reader reads it: the digest of the bytes parsed.

    :func:`_digest` hashes a file before any reader is built (unchanged
    bytes are never parsed); a directory Source may rewrite it in place
    (same inode) before the reader reads it.  A map stored under the digest
    hashed would name other bytes than those parsed: a Source settling back
    on the bytes hashed would look unchanged, and that change never be
    reported.  Bytes in memory are hashed and parsed as one: nothing to do.
    """

    def __init__(self, fetched: Fetched) -> None:
        self.source = fetched
        self._file = fetched.file
        self._hash = hashlib.sha256()
        self.fetched = (
            fetched if self._file is None else replace(fetched, file=cast(IO[bytes], self))
        )

    def read(self, size: int = -1) -> bytes:
        assert self._file is not None
        chunk = self._file.read(size)
        self._hash.update(chunk)
        return chunk

    def named(self, part: PartState) -> PartState:
        """``part``, parsed, with the digest of its bytes (and of any after its end)."""
        if self._file is None:
            return part
        while self.read(1 << 18):
            pass
        return replace(part, digest=self._hash.hexdigest())


def _unchanged(part: PartState, fetched: Fetched, digest: str) -> PartState:
    """``part`` read again with the same bytes: its map stands, with the new validators."""
    return replace(part, digest=digest, etag=fetched.etag, last_modified=fetched.last_modified)


def _keys(position: SnapshotPosition) -> set[str]:
    keys = SnapshotState.from_json(position.state).keys
    for base in (position.base, *position.also):
        if base is not None:
            keys |= SnapshotState.from_json(base).keys
    return keys


def _union(diffs: Iterable[list[Entry]]) -> list[Entry]:
    """Several diffs to one snapshot as one, a loc once (the first diff's), in the fixed order.

    One diff is returned as it is: a resumed diff must be the very list it
    was, counted into by position (a loc two parts list can appear twice).
    """
    lists = list(diffs)
    if len(lists) == 1:
        return lists[0]
    merged: dict[str, Entry] = {}
    for changes in lists:
        for entry in changes:
            merged.setdefault(entry.loc, entry)
    return sorted(merged.values(), key=change_order)


def _at(state: SnapshotState, position: SnapshotPosition) -> Checkpoint:
    """The checkpoint of a snapshot position: its ``at`` orders pushed changes against it."""
    return Checkpoint(changelist=state.url, last_time=state.at, started=True, snapshot=position)


def _content(state: SnapshotState) -> dict[str, str]:
    """What a snapshot lists, part by part (validators and dates aside)."""
    return {url: part.key for url, part in state.parts.items()}
