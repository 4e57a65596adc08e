"""Which Change List entries are new since the checkpoint (pure, no I/O).

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
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from . import w3cdt
from .model import Entry

_MIN = datetime(1, 1, 1, tzinfo=UTC)
MAX_BOUNDARY = 10_000  # identities kept for one shared datetime (a bulk import)


def entry_key(entry: Entry) -> str:
    """The identity of a change inside one datetime: change type and URI."""
    return f"{entry.change.value if entry.change else '?'} {entry.loc}"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where detection stands for one collection.

    ``changelist`` is the list being read (None before the first read),
    ``last_time``/``boundary`` locate the last logged entry, ``position``
    counts entries consumed from ``changelist`` (diagnostic only), and
    ``etag``/``last_modified`` allow conditional GETs of that list.
    """

    changelist: str | None = None
    last_time: datetime | None = None
    boundary: tuple[str, ...] = ()
    position: int = 0
    etag: str | None = None
    last_modified: str | None = None
    started: bool = False  # False: first run, nothing decided yet

    def to_json(self) -> str:
        return json.dumps(
            {
                "v": 1,
                "changelist": self.changelist,
                "last_time": w3cdt.format(self.last_time) if self.last_time else None,
                "boundary": list(self.boundary),
                "position": self.position,
                "etag": self.etag,
                "last_modified": self.last_modified,
                "started": self.started,
            },
            sort_keys=True,
            separators=(",", ":"),
        )

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
        )

    def is_new(self, entry: Entry) -> bool:
        """True if ``entry`` comes after this checkpoint."""
        when = entry.change_time
        if self.last_time is None:
            return True
        if when is None or when < self.last_time:
            return False
        if when == self.last_time:
            return entry_key(entry) not in self.boundary
        return True

    def advance(self, entry: Entry, changelist: str) -> Checkpoint:
        """The checkpoint after logging ``entry`` from ``changelist``."""
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

    def with_validators(self, etag: str | None, last_modified: str | None) -> Checkpoint:
        return replace(self, etag=etag, last_modified=last_modified)


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


def index_refs(entries: Iterable[Entry]) -> list[ListRef]:
    """ListRefs from Change List Index entries."""
    return [ListRef(url=e.loc, from_=e.from_, until=e.until) for e in entries]


@dataclass(slots=True)
class Detection:
    """New entries found in one list, with the checkpoint after each of them."""

    changelist: str
    entries: list[Entry] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.entries)


def detect(
    entries: Iterable[Entry], changelist: str, checkpoint: Checkpoint, *, limit: int | None = None
) -> Detection:
    """Filter one list's entries down to those after ``checkpoint``.

    Entries are taken in document order (forward chronological by the
    specification), and each new one advances the checkpoint, so a caller can
    log them in batches and commit the matching checkpoint with each batch.
    With ``limit``, stop right after that many new entries: an iterator is
    left just past the last one, so a caller can resume from it and start
    logging the first part of a long list while the rest is still unread.
    """
    found = Detection(changelist=changelist)
    current = checkpoint
    for entry in entries:
        if current.is_new(entry):
            current = current.advance(entry, changelist)
            found.entries.append(entry)
            found.checkpoints.append(current)
            if limit is not None and len(found.entries) >= limit:
                break
    return found


def starting_point(entries: Iterable[Entry], changelist: str) -> Checkpoint:
    """A first-run checkpoint at the end of ``changelist`` (publish only what comes next)."""
    checkpoint = Checkpoint(changelist=changelist, started=True)
    for entry in entries:
        checkpoint = checkpoint.advance(entry, changelist)
    return checkpoint
