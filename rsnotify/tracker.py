"""Which Change List entries are new since the checkpoint (pure, no I/O).

(Why one module of ~690 lines: the checkpoint, its in-order and unordered
forms and its snapshot position are one value that every detection and
every cursor reads and writes; splitting it would split its JSON format.)

The Change List is the source of truth, and a Destination locates its place
in it by (change time, loc) (section 12.1).  The publisher does the same: its
checkpoint is the Change List it is reading, the change time of the last
entry it logged, and the identities of the entries it logged *at* that time
(the "boundary"), because several entries can share one datetime and
positions shift when a Source rewrites a list.  Filtering by that key is exact
whether the Source appended to the list, republished it unchanged, closed it
and opened another, dropped old lists from its index, or removed an entry.

The checkpoint is committed atomically with the log entries it covers, so on
restart the tracker resumes exactly after the last logged entry: an entry is
never given two sequence numbers and never skipped.

**Change Lists out of order.**  The time key above assumes what section 12.1
requires: entries in forward chronological order, so a new entry is never
older than one already logged.  resync 2.0.1's ``resync-build`` writes its
Change Lists grouped by change type, dates a deletion with the deleted file's
old modification time, and rewrites the list every time it runs; with the
time key such entries would be dropped for good.  A Source read with the
``order`` rule relaxed (``--lenient order``) gets an *unordered* checkpoint:
the same fields plus :class:`Known`, the identities (change, URI, change time,
as 64-bit digests) of the entries consumed, and an entry is new exactly when
its identity is not known, whatever its time or place.  That holds when the
open list grows by appends (in any order), when the Source rewrites or
regroups it, and when it replaces it with another list.  The memory is the
last :data:`MAX_KNOWN` identities consumed (a full Sitemap's worth, about
0.5 MB in the checkpoint); a Source that lists an entry again after that many
others were consumed gets it published again (never lost).  In-order reading
(the default) keeps no such memory and writes exactly the checkpoint it
always wrote: an in-order list costs nothing more, and old checkpoints load.
Switching a collection to unordered reading seeds the memory from the list
being read (:func:`adopt_unordered`), switching back drops it.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from hashlib import blake2b as _blake2b
from typing import overload

from . import w3cdt
from .model import Entry, sort_chronologically

_MIN = datetime(1, 1, 1, tzinfo=UTC)
MAX_BOUNDARY = 10_000  # identities kept for one shared datetime (a bulk import)
MAX_KNOWN = 50_000  # identities an unordered checkpoint remembers: one full Sitemap
DIGEST_BYTES = 8


def entry_key(entry: Entry) -> str:
    """The identity of a change inside one datetime: change type and URI."""
    # f"{member}" is the value of a StrEnum member, without Enum's slower .value lookup.
    return f"{entry.change if entry.change else '?'} {entry.loc}"


def _time_text(when: datetime | None) -> str:
    """``w3cdt.format(when)``, "" for no time (an entry without one).

    Digests are persisted in checkpoints: the text is what :func:`w3cdt.format`
    writes, byte for byte, through its one implementation.
    """
    return "" if when is None else w3cdt.format(when)


def entry_digest(entry: Entry) -> bytes:
    """The identity of a change (type, URI, change time) in :data:`DIGEST_BYTES` bytes.

    64 bits: among the 50,000 identities an unordered checkpoint holds, the
    chance that a new entry collides with one of them is about 3e-15.
    """
    return _digest(entry_key(entry), entry.change_time)


def _digest(key: str, when: datetime | None) -> bytes:
    """:func:`entry_digest` from the entry's :func:`entry_key` and change time."""
    text = f"{key}\n{_time_text(when)}"
    return _blake2b(text.encode("utf-8", "surrogatepass"), digest_size=DIGEST_BYTES).digest()


class _Store:
    """Append-only digests shared by the successive :class:`Known` of one detection pass."""

    __slots__ = ("first", "index", "order")

    def __init__(self, digests: Iterable[bytes] = ()) -> None:
        self.order: list[bytes] = []
        self.index: dict[bytes, int] = {}  # digest -> absolute position
        self.first = 0  # absolute position of order[0]
        for digest in digests:
            if digest not in self.index:
                self.index[digest] = len(self.order)
                self.order.append(digest)

    @property
    def end(self) -> int:
        return self.first + len(self.order)


class Known:
    """The identities an unordered checkpoint has consumed: the last :data:`MAX_KNOWN`.

    Immutable to its users, cheap to extend: every checkpoint of a detection
    pass shares one append-only store and sees only the part of it written
    before it was made (``end``), so :func:`detect` produces a checkpoint per
    entry in O(1) each instead of copying a 50,000-digest set every time.
    """

    __slots__ = ("_end", "_store")

    def __init__(self, store: _Store, end: int) -> None:
        self._store = store
        self._end = end

    @classmethod
    def of(cls, digests: Iterable[bytes] = ()) -> Known:
        store = _Store(digests)
        return cls(store, store.end)

    def _start(self) -> int:
        return max(self._end - MAX_KNOWN, self._store.first)

    def __contains__(self, digest: object) -> bool:
        # `in` takes any object (object.__contains__); a non-bytes one is just absent.
        position = self._store.index.get(digest)  # type: ignore[call-overload]
        return position is not None and self._start() <= position < self._end

    def __len__(self) -> int:
        return self._end - self._start()

    def __iter__(self) -> Iterator[bytes]:
        store = self._store
        return iter(store.order[self._start() - store.first : self._end - store.first])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Known):
            return NotImplemented
        if self._store is other._store and self._end == other._end:
            return True
        return list(self) == list(other)

    def __hash__(self) -> int:
        return hash((len(self), next(iter(self), b"")))

    def __repr__(self) -> str:
        return f"Known({len(self)} identities)"

    def add(self, digest: bytes) -> Known:
        """These identities and ``digest`` (the oldest dropped past :data:`MAX_KNOWN`)."""
        if digest in self:
            return self
        return self._extended(digest)

    def _extended(self, digest: bytes) -> Known:
        """:meth:`add` of a ``digest`` the caller found absent (``digest not in self``)."""
        # store.end spelled out: this runs once per new entry a Destination
        # reads, and the property's call was a third of it.
        store = self._store
        end = store.first + len(store.order)
        if (
            self._end != end  # an older checkpoint branches off: copy its window
            or digest in store.index  # known once, but fell out of the window
            or len(store.order) >= 2 * MAX_KNOWN  # compact what no window sees any more
        ):
            store = _Store(self)
            end = store.first + len(store.order)
        store.index[digest] = end
        store.order.append(digest)
        return Known(store, end + 1)

    def to_text(self) -> str:
        """Base64 of the digests in the order they were consumed (the oldest first)."""
        return base64.b64encode(b"".join(self)).decode("ascii")

    @classmethod
    def from_text(cls, text: str) -> Known:
        try:
            raw = base64.b64decode(text, validate=True)
        except (ValueError, binascii.Error):
            raise ValueError("unreadable 'known' in a checkpoint") from None
        if len(raw) % DIGEST_BYTES:
            raise ValueError("unreadable 'known' in a checkpoint")
        return cls.of(raw[i : i + DIGEST_BYTES] for i in range(0, len(raw), DIGEST_BYTES))


@dataclass(frozen=True, slots=True)
class SnapshotPosition:
    """Where a collection without Change Lists stands (:mod:`rsnotify.changes.snapshot`).

    ``state`` is the last Resource List snapshot read (its JSON text, owned
    by that module).  While the differences between two snapshots are being
    logged or applied, ``base`` is the snapshot they start from and ``done``
    how many of them (in their fixed order) are behind this position, so a
    restart resumes the same differences exactly after the last one consumed.
    ``also``: other snapshots the differences start from too, when the Source
    moved on while a diff was half consumed (what was consumed of it may have
    to be undone; :mod:`rsnotify.changes.snapshotwatch`).  The texts are
    shared by every position of one diff, never copied.
    """

    state: str
    base: str | None = None
    done: int = 0
    also: tuple[str, ...] = ()

    def to_obj(self) -> dict[str, object]:
        obj: dict[str, object] = {"state": self.state}
        if self.base is not None:
            obj["base"], obj["done"] = self.base, self.done
            if self.also:
                obj["also"] = list(self.also)
        return obj

    @classmethod
    def from_obj(cls, obj: Mapping[str, object]) -> SnapshotPosition:
        state, base, done = obj.get("state"), obj.get("base"), obj.get("done", 0)
        also = obj.get("also", [])
        if not isinstance(state, str) or not (base is None or isinstance(base, str)):
            raise ValueError("a snapshot position needs its state as text")
        if not isinstance(also, list) or not all(isinstance(t, str) for t in also):
            raise ValueError("a snapshot position's other bases must be texts")
        return cls(state, base, int(done) if isinstance(done, int) else 0, tuple(also))


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where detection stands for one collection.

    ``changelist`` is the list being read (None before the first read),
    ``last_time``/``boundary`` locate the last logged entry, ``position``
    counts entries consumed from ``changelist`` (diagnostic only), and
    ``etag``/``last_modified`` allow conditional GETs of that list.
    ``known`` is None for in-order reading; for unordered reading it holds the
    identities consumed, and ``last_time``/``boundary`` then locate the
    *latest* change time logged (used to choose the lists to read).
    """

    changelist: str | None = None
    last_time: datetime | None = None
    boundary: tuple[str, ...] = ()
    position: int = 0
    etag: str | None = None
    last_modified: str | None = None
    started: bool = False  # False: first run, nothing decided yet
    known: Known | None = None  # unordered reading: the identities consumed
    # A collection without Change Lists: where its Resource List snapshots stand
    # (rsnotify.changes.snapshot); None for a collection read from Change Lists.
    snapshot: SnapshotPosition | None = None

    @property
    def unordered(self) -> bool:
        return self.known is not None

    def to_json(self) -> str:
        obj: dict[str, object] = {
            "v": 1,
            "changelist": self.changelist,
            "last_time": w3cdt.format(self.last_time) if self.last_time else None,
            "boundary": list(self.boundary),
            "position": self.position,
            "etag": self.etag,
            "last_modified": self.last_modified,
            "started": self.started,
        }
        if self.known is not None:  # absent for in-order reading: the format of old
            obj["known"] = self.known.to_text()
        if self.snapshot is not None:  # absent for Change Lists: the format of old
            obj["snapshot"] = self.snapshot.to_obj()
        return json.dumps(obj, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> Checkpoint:
        if not text:
            return cls()
        obj = json.loads(text)
        return cls(
            changelist=obj.get("changelist"),
            last_time=w3cdt.parse(obj["last_time"]) if obj.get("last_time") else None,
            boundary=tuple(obj.get("boundary") or ()),
            position=int(obj.get("position") or 0),
            etag=obj.get("etag"),
            last_modified=obj.get("last_modified"),
            started=bool(obj.get("started", True)),
            known=Known.from_text(obj["known"]) if obj.get("known") is not None else None,
            snapshot=SnapshotPosition.from_obj(obj["snapshot"]) if obj.get("snapshot") else None,
        )

    def ordered(self) -> Checkpoint:
        """The in-order checkpoint at the same place (the memory of identities dropped)."""
        return replace(self, known=None) if self.known is not None else self

    def is_new(self, entry: Entry) -> bool:
        """True if ``entry`` comes after this checkpoint (unordered: was never consumed)."""
        if self.known is not None:
            return entry_digest(entry) not in self.known
        when = entry.change_time
        if self.last_time is None:
            return True
        if when is None or when < self.last_time:
            return False
        if when == self.last_time:
            return entry_key(entry) not in self.boundary
        return True

    def advance(self, entry: Entry, changelist: str, *, digest: bytes | None = None) -> Checkpoint:
        """The checkpoint after logging ``entry`` from ``changelist``.

        ``digest``: ``entry_digest(entry)`` when the caller has it already
        (unordered reading), so it is not computed twice.
        """
        if self.known is not None:
            return self._advance_unordered(entry, changelist, digest)
        when = entry.change_time
        position = self.position + 1 if changelist == self.changelist else 1
        if when is not None and when == self.last_time:
            boundary = (*self.boundary, entry_key(entry))[-MAX_BOUNDARY:]
        else:
            boundary = (entry_key(entry),)
        return Checkpoint(
            changelist=changelist,
            last_time=when if when is not None else self.last_time,
            boundary=boundary,
            position=position,
            etag=None if changelist != self.changelist else self.etag,
            last_modified=None if changelist != self.changelist else self.last_modified,
            started=True,
        )

    def _advance_unordered(
        self, entry: Entry, changelist: str, digest: bytes | None = None
    ) -> Checkpoint:
        """Remember ``entry``; the time key follows the latest change time, never goes back."""
        assert self.known is not None
        when = entry.change_time
        last, boundary = self.last_time, self.boundary
        if when is not None and (last is None or when > last):
            last, boundary = when, (entry_key(entry),)
        elif when is not None and when == last:
            boundary = (*boundary, entry_key(entry))[-MAX_BOUNDARY:]
        same = changelist == self.changelist
        return Checkpoint(
            changelist=changelist,
            last_time=last,
            boundary=boundary,
            position=self.position + 1 if same else 1,
            etag=self.etag if same else None,
            last_modified=self.last_modified if same else None,
            started=True,
            known=self.known.add(entry_digest(entry) if digest is None else digest),
        )

    def with_validators(self, etag: str | None, last_modified: str | None) -> Checkpoint:
        return replace(self, etag=etag, last_modified=last_modified)


def adopt_unordered(checkpoint: Checkpoint, entries: Iterable[Entry]) -> Checkpoint:
    """An in-order checkpoint turned unordered, without publishing anything twice.

    ``entries`` is the list about to be read: those the in-order checkpoint
    has consumed (older than its time, or in its boundary) become known, so
    the unordered reading that follows publishes exactly what the in-order
    reading would have, plus the out-of-order entries it would have dropped.
    """
    if checkpoint.known is not None:
        return checkpoint
    if not checkpoint.started or checkpoint.last_time is None:
        return replace(checkpoint, known=Known.of())
    return replace(
        checkpoint,
        known=Known.of(entry_digest(e) for e in entries if not checkpoint.is_new(e)),
    )


@dataclass(frozen=True, slots=True)
class ListRef:
    """One Change List as the Change List Index describes it."""

    url: str
    from_: datetime | None = None
    until: datetime | None = None

    @property
    def is_open(self) -> bool:
        return self.until is None


def lists_to_read(index: Sequence[ListRef], checkpoint: Checkpoint) -> list[ListRef]:
    """The Change Lists that may hold entries after the checkpoint, in order.

    If the checkpoint's list is still in the index, that list and every list
    after it.  If the Source dropped it, every list that did not end before
    the checkpoint's time (section 12.1's rule for a Destination).
    """
    ordered = sorted(index, key=lambda ref: (ref.from_ is None, ref.from_ or _MIN))
    if checkpoint.changelist is not None:
        for i, ref in enumerate(ordered):
            if ref.url == checkpoint.changelist:
                return ordered[i:]
    if checkpoint.last_time is None:
        return ordered
    return [ref for ref in ordered if ref.until is None or ref.until >= checkpoint.last_time]


def coverage_hole(
    refs: Sequence[ListRef],
    checkpoint: Checkpoint,
    seen_until: Mapping[str, datetime] | None = None,
) -> str | None:
    """Why the Change Lists no longer cover every change since ``checkpoint`` (None: they do).

    Z39.99 section 12.1 leaves retention to the Source: it may drop old Change
    Lists.  A Destination away for longer than the Source keeps them would
    otherwise apply what remains and call itself up to date.  The documents
    show the hole: every list carries ``from`` (and ``until`` once closed),
    and the lists of an index cover consecutive periods.  So there is a hole
    when the first list still to read starts after the checkpoint's time
    (the list it was reading was dropped, or replaced by one starting later),
    or when two consecutive lists after it do not meet (``until`` of one
    before ``from`` of the next).  ``seen_until`` holds the ``until`` of lists
    this reader saw closed before they were dropped: a checkpoint at the end
    of such a list is covered up to its ``until``.  A list without ``from``
    (resync 2.0.1 writes none) proves nothing either way and is not a hole.
    """
    if not checkpoint.started or checkpoint.last_time is None:
        return None  # nothing consumed yet: everything listed is read
    lower = checkpoint.last_time
    changelist = checkpoint.changelist
    if seen_until and changelist is not None and changelist in seen_until:
        lower = max(lower, seen_until[changelist])
    refs = lists_to_read(refs, checkpoint)
    if not refs:
        return None
    first = refs[0]
    if first.from_ is not None and first.from_ > lower:
        if checkpoint.changelist is None:
            was = "the position of a baseline"
        elif checkpoint.changelist not in (r.url for r in refs):
            was = "the list it was reading is gone"
        else:
            was = f"{first.url} now starts later"
        return (
            f"the Change Lists start at {w3cdt.format(first.from_)}, after the position "
            f"{w3cdt.format(lower)} ({was}): changes in between may be lost (Z39.99 section 12.1)"
        )
    for before, after in itertools.pairwise(refs):
        if (
            before.until is not None
            and after.from_ is not None
            and after.from_ > before.until
            and after.from_ > lower
        ):
            return (
                f"no Change List covers {w3cdt.format(before.until)} to "
                f"{w3cdt.format(after.from_)} (between {before.url} and {after.url}): changes "
                "in between may be lost (Z39.99 section 12.1)"
            )
    return None


def index_refs(entries: Iterable[Entry]) -> list[ListRef]:
    """ListRefs from Change List Index entries."""
    return [ListRef(url=e.loc, from_=e.from_, until=e.until) for e in entries]


@dataclass(frozen=True, slots=True)
class Snapshots:
    """The two Resource List snapshots a derived change was found between.

    A Source without Change Lists tells what changed only by publishing a
    new Resource List: rsnotify diffs successive snapshots
    (:mod:`rsnotify.changes.snapshot`), and every change found that way says
    so, with both snapshots' ``at`` (Z39.99 section 7: a Resource List's
    ``at`` is the time its resource states reflect), so a Destination can
    tell it from a Change List entry.  ``until`` is the newer one.
    """

    resourcelist: str  # the Resource List, or Resource List Index, read
    from_: datetime | None
    until: datetime


# What an unordered detection keeps per entry until its checkpoint is read:
# last_time, boundary, position, known (the rest is the Detection's).
_Step = tuple[datetime | None, tuple[str, ...], int, Known]


class Positions(Sequence[Checkpoint]):
    """The checkpoint after each entry of a :class:`Detection`, each made when first read.

    An unordered detection runs for every entry a Destination reads, and its
    callers read a few of the checkpoints (a chunk's last, a list's last): a
    frozen :class:`Checkpoint` per entry was almost a third of detecting.  What
    changes from entry to entry is kept as a :data:`_Step`; the rest
    (``changelist``, the validators) is the same for all of them.  Reads,
    equality and iteration give exactly the checkpoints ``detect`` made before.
    """

    __slots__ = ("_base", "_items")

    def __init__(
        self,
        checkpoints: Iterable[Checkpoint] = (),
        base: tuple[str, str | None, str | None] = ("", None, None),
    ) -> None:
        self._items: list[Checkpoint | _Step] = list(checkpoints)
        self._base = base  # changelist, etag, last_modified of the steps

    def append(self, checkpoint: Checkpoint) -> None:
        self._items.append(checkpoint)

    def extend(self, other: Positions) -> None:
        """Append ``other``'s checkpoints: the next part of the same detection.

        Its steps are kept as steps when it shares this one's base (the same
        list and validators, as a detection resumed from this one's last
        checkpoint does), made into checkpoints otherwise.
        """
        if not self._items:
            self._base = other._base
        if other._base == self._base:
            self._items.extend(other._items)
        else:
            self._items.extend(other)

    def _made(self, i: int) -> Checkpoint:
        item = self._items[i]
        if isinstance(item, Checkpoint):
            return item
        (last, boundary, position, known), (changelist, etag, last_modified) = item, self._base
        made = Checkpoint(changelist, last, boundary, position, etag, last_modified, True, known)
        self._items[i] = made
        return made

    @overload
    def __getitem__(self, index: int) -> Checkpoint: ...
    @overload
    def __getitem__(self, index: slice) -> list[Checkpoint]: ...
    def __getitem__(self, index: int | slice) -> Checkpoint | list[Checkpoint]:
        if isinstance(index, slice):
            return [self._made(i) for i in range(*index.indices(len(self._items)))]
        return self._made(index)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Checkpoint]:
        return (self._made(i) for i in range(len(self._items)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Positions | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as the list it stands for

    def __repr__(self) -> str:
        return f"Positions({list(self)!r})"


@dataclass(slots=True)
class Detection:
    """New entries found in one list, with the checkpoint after each of them.

    ``derived``: the entries were not read from a Change List but found by
    comparing two Resource List snapshots (``changelist`` is then the
    Resource List's URL).
    """

    changelist: str
    entries: list[Entry] = field(default_factory=list)
    checkpoints: Positions = field(default_factory=Positions)
    derived: Snapshots | None = None

    def __len__(self) -> int:
        return len(self.entries)


def detect(
    entries: Iterable[Entry],
    changelist: str,
    checkpoint: Checkpoint,
    *,
    limit: int | None = None,
    digests: Iterator[bytes] | None = None,
) -> Detection:
    """Filter one list's entries down to those after ``checkpoint``.

    Entries are taken in document order (forward chronological by the
    specification), and each new one advances the checkpoint, so a caller can
    log them in batches and commit the matching checkpoint with each batch.
    With ``limit``, stop right after that many new entries: an iterator is
    left just past the last one, so a caller can resume from it and start
    logging the first part of a long list while the rest is still unread.
    ``digests``: :func:`entry_digest` of each entry, in step with ``entries``
    (one taken per entry taken), computed already (in the parser's process,
    :mod:`rsnotify.changes.listparse`); an unordered checkpoint needs them,
    an ordered one ignores them.
    """
    found = Detection(changelist=changelist)
    if checkpoint.known is not None:
        _detect_unordered(entries, changelist, checkpoint, limit, found, digests)
        return found
    current = checkpoint
    for entry in entries:
        if current.is_new(entry):
            current = current.advance(entry, changelist)
        else:
            continue
        found.entries.append(entry)
        found.checkpoints.append(current)
        if limit is not None and len(found.entries) >= limit:
            break
    return found


def _detect_unordered(
    entries: Iterable[Entry],
    changelist: str,
    checkpoint: Checkpoint,
    limit: int | None,
    found: Detection,
    digests: Iterator[bytes] | None = None,
) -> None:
    """:func:`detect` for an unordered checkpoint: ``is_new`` and ``advance`` folded.

    The same decisions and checkpoints as ``checkpoint.is_new(entry)`` then
    ``checkpoint.advance(entry, changelist)`` per entry (a test holds it to
    that), with one key and one digest per entry and no membership test
    repeated: this runs for every entry a Destination reads, and the two
    calls were most of a 50,000-change catch-up's detection.
    """
    known = checkpoint.known
    assert known is not None
    last, boundary = checkpoint.last_time, checkpoint.boundary
    same = changelist == checkpoint.changelist
    position = checkpoint.position if same else 0
    etag = checkpoint.etag if same else None
    last_modified = checkpoint.last_modified if same else None
    positions = found.checkpoints = Positions(base=(changelist, etag, last_modified))
    add_entry, add_step = found.entries.append, positions._items.append
    count = 0
    given = None if digests is None else digests.__next__
    for entry in entries:
        key = entry_key(entry)
        when = entry.change_time
        digest = _digest(key, when) if given is None else given()
        if digest in known:
            continue
        known = known._extended(digest)
        # The time key follows the latest change time, never goes back (_advance_unordered).
        if when is not None:
            if last is None or when > last:
                last, boundary = when, (key,)
            elif when == last:
                boundary = (*boundary, key)[-MAX_BOUNDARY:]
        position += 1
        add_entry(entry)
        add_step((last, boundary, position, known))  # its Checkpoint when read (Positions)
        count += 1
        if limit is not None and count >= limit:
            break


def starting_point(
    entries: Iterable[Entry], changelist: str, *, unordered: bool = False
) -> Checkpoint:
    """A first-run checkpoint at the end of ``changelist`` (publish only what comes next)."""
    checkpoint = Checkpoint(
        changelist=changelist, started=True, known=Known.of() if unordered else None
    )
    for entry in entries:
        checkpoint = checkpoint.advance(entry, changelist)
    return checkpoint


@dataclass(frozen=True, slots=True)
class Chronological:
    """A closed Change List's entries in forward chronological order, and how far off it was."""

    entries: list[Entry]
    moved: int  # entries that were not where forward chronological order puts them
    first: Entry | None  # the first entry out of place in document order (for the warning)


def chronological(entries: Iterable[Entry]) -> Chronological:
    """Order a *closed* Change List by change time, stably (for the Destination).

    Section 12.1 requires forward chronological order; resync-build groups by
    change type.  A closed list will not change again, so a Destination can
    sort it and apply it as if the Source had written it in order: entries
    sharing a change time keep their document order (a resource's create
    stays before its update).  ``first`` names the first entry found earlier
    than one before it, for a single warning per list.  (An *open* list
    grows: sorting one read of it cannot place what is appended later; read it
    in document order with an unordered :class:`Checkpoint` instead.)
    """
    listed = list(entries)
    ordered = sort_chronologically(listed)
    moved = sum(1 for a, b in zip(listed, ordered, strict=True) if a is not b)
    first = None
    latest = None
    for entry in listed:
        when = entry.change_time
        if when is not None and latest is not None and when < latest:
            first = entry
            break
        if when is not None:
            latest = when
    return Chronological(ordered, moved, first)
