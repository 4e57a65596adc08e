"""What changed between two Resource List snapshots (pure, no I/O).

Many Sources publish a Resource List (or a Resource List Index, or Resource
Dumps) and never a Change List.  Z39.99 section 7 says what a Resource List
is: the resources of a set, each with its state as of the list's ``at``.  So
two successive snapshots tell what changed between their ``at`` times, with
two limits no reader can lift: several changes of one resource between the
snapshots collapse into one, and a resource created and deleted between them
is never seen.

A resource's state is its **fingerprint**: its strongest hash (``rs:md
hash``, section 7; sha-256 before sha-1 before md5), else its ``length``
and ``lastmod``, else nothing (then only creation and deletion are seen).
A snapshot keeps, per part (the Resource List itself, or each list a
Resource List Index names), a map of loc to an 8-byte digest of that
fingerprint, stored outside the checkpoint (:func:`encode_map`): a
million-resource Source costs about 30 MB of maps on disk and nothing in
memory while it does not change.

Rules, and where they come from:

* a loc absent from the old snapshot: ``created``; present with another
  fingerprint: ``updated``; absent from the new, *complete* snapshot:
  ``deleted`` (a Resource List lists every resource, section 7);
* a loc that leaves one part of an index for another is not deleted:
  the parts that changed are compared as one set;
* the change time is the resource's ``lastmod`` when it falls inside
  (old ``at``, new ``at``], else the new snapshot's ``at``: a ``lastmod``
  outside that interval is not believed, because it would order the change
  before a state the Destination already holds; a deletion has no
  ``lastmod`` and takes the new ``at``;
* the changes come in forward chronological order (Change Notification
  1.0.1 section 3 requires it of a payload), ties by loc, deletions of one
  time after the creations and updates: the order is fixed, so a position
  "*n* changes into this diff" means the same after a restart.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from hashlib import blake2b, sha256

from .. import w3cdt
from ..model import ChangeType, Entry

__all__ = [
    "Diff",
    "PartState",
    "SnapshotState",
    "compare_part",
    "decode_map",
    "derived_time",
    "encode_map",
    "fingerprint",
    "map_key",
    "settle",
]

# Strongest first: the fingerprint is one algorithm's digest, so a Source that
# adds a weaker hash to an entry does not make every resource look updated.
_PREFERRED = ("sha-512", "sha-256", "sha-1", "md5")
_CHANGE_ORDER = {ChangeType.CREATED: 0, ChangeType.UPDATED: 0, ChangeType.DELETED: 1}


def fingerprint(entry: Entry) -> bytes:
    """An 8-byte digest of what identifies ``entry``'s state (module docstring)."""
    text = ""
    if entry.hash:
        hashes = entry.hashes()
        for algo in _PREFERRED:
            if algo in hashes:
                text = f"{algo}:{hashes[algo]}"
                break
        else:
            text = " ".join(f"{a}:{d}" for a, d in sorted(hashes.items()))
    if not text:
        lastmod = w3cdt.format(entry.lastmod) if entry.lastmod is not None else ""
        text = f"{entry.length if entry.length is not None else ''}|{lastmod}"
    return blake2b(text.encode(), digest_size=8).digest()


def encode_map(states: Mapping[str, bytes]) -> bytes:
    """A part's map (loc -> fingerprint) as compressed bytes.

    ``<16 hex digits>\\0<loc>\\0`` per resource: XML 1.0 cannot hold a NUL,
    so no loc read from a Resource List contains the separator.
    """
    body = "".join(f"{fp.hex()}\0{loc}\0" for loc, fp in states.items())
    return zlib.compress(body.encode(), 6)


def decode_map(data: bytes) -> dict[str, bytes]:
    """The inverse of :func:`encode_map`."""
    fields = zlib.decompress(data).decode().split("\0")
    return {fields[i + 1]: bytes.fromhex(fields[i]) for i in range(0, len(fields) - 1, 2)}


def map_key(data: bytes) -> str:
    """The name an encoded map is stored under: its sha-256 (content-addressed)."""
    return sha256(data).hexdigest()


def derived_time(lastmod: datetime | None, since: datetime | None, at: datetime) -> datetime:
    """The change time of a derived change (module docstring)."""
    if lastmod is not None and lastmod <= at and (since is None or lastmod > since):
        return lastmod
    return at


@dataclass(slots=True)
class PartState:
    """One part of a snapshot as last read: validators, body digest, where its map is."""

    url: str
    key: str  # map_key of the part's encoded map
    digest: str  # sha-256 of the body: an unconditional re-read of the same bytes is no change
    etag: str | None = None
    last_modified: str | None = None
    count: int = 0

    def to_obj(self) -> dict[str, object]:
        return {
            "key": self.key,
            "digest": self.digest,
            "etag": self.etag,
            "lm": self.last_modified,
            "n": self.count,
        }

    @classmethod
    def from_obj(cls, url: str, obj: Mapping[str, object]) -> PartState:
        etag, lm, n = obj.get("etag"), obj.get("lm"), obj.get("n", 0)
        return cls(
            url=url,
            key=str(obj["key"]),
            digest=str(obj["digest"]),
            etag=etag if isinstance(etag, str) else None,
            last_modified=lm if isinstance(lm, str) else None,
            count=n if isinstance(n, int) else 0,
        )


@dataclass(slots=True)
class SnapshotState:
    """A Resource List (Index) snapshot: its ``at``, validators, and its parts in order."""

    url: str  # the Resource List, or the Resource List Index
    at: datetime
    index: bool = False
    etag: str | None = None
    last_modified: str | None = None
    parts: dict[str, PartState] = field(default_factory=dict)

    @property
    def keys(self) -> set[str]:
        return {part.key for part in self.parts.values()}

    @property
    def count(self) -> int:
        return sum(part.count for part in self.parts.values())

    def to_json(self) -> str:
        obj = {
            "url": self.url,
            "at": w3cdt.format(self.at),
            "index": self.index,
            "etag": self.etag,
            "lm": self.last_modified,
            "parts": [[url, part.to_obj()] for url, part in self.parts.items()],
        }
        return json.dumps(obj, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> SnapshotState:
        obj = json.loads(text)
        etag, lm = obj.get("etag"), obj.get("lm")
        return cls(
            url=obj["url"],
            at=w3cdt.parse(obj["at"]),
            index=bool(obj.get("index")),
            etag=etag if isinstance(etag, str) else None,
            last_modified=lm if isinstance(lm, str) else None,
            parts={url: PartState.from_obj(url, part) for url, part in obj["parts"]},
        )


@dataclass(slots=True)
class Diff:
    """What changed in the parts that were compared, before the parts are settled as one set.

    ``changed``: new entries whose loc was in the part before with another
    fingerprint; ``added``: new entries whose loc was not in the part before
    (kept with their fingerprint); ``removed``: loc -> old fingerprint, for
    locs the part no longer lists.
    """

    changed: list[Entry] = field(default_factory=list)
    added: list[tuple[Entry, bytes]] = field(default_factory=list)
    removed: dict[str, bytes] = field(default_factory=dict)


def compare_part(
    old: Mapping[str, bytes], entries: Iterable[Entry], diff: Diff | None
) -> dict[str, bytes]:
    """Compare one part's new entries with its old map (into ``diff``); returns the new map.

    Streaming: an entry is kept only when it changed, so a part of 50,000
    resources with ten changes holds two maps and ten entries.  A loc listed
    twice in one part counts once, with its last state.  ``diff=None``:
    only the map is wanted (a first snapshot, recorded).
    """
    new: dict[str, bytes] = {}
    if diff is None:
        for entry in entries:
            new[entry.loc] = fingerprint(entry)
        return new
    for entry in entries:
        fp = fingerprint(entry)
        loc = entry.loc
        new[loc] = fp
        before = old.get(loc)
        if before is None:
            diff.added.append((entry, fp))
        elif before != fp:
            diff.changed.append(entry)
    for loc, fp in old.items():
        if loc not in new:
            diff.removed[loc] = fp
    return new


def settle(diff: Diff, *, since: datetime | None, at: datetime) -> list[Entry]:
    """The derived changes of one snapshot diff, in their fixed order (module docstring).

    A loc removed from one part and added to another moved: it is updated
    when its fingerprint changed on the way, else nothing happened to it.
    """
    changes: list[Entry] = [_derived(e, ChangeType.UPDATED, since, at) for e in diff.changed]
    removed = diff.removed
    for entry, fp in diff.added:
        before = removed.pop(entry.loc, None)
        if before is None:
            changes.append(_derived(entry, ChangeType.CREATED, since, at))
        elif before != fp:
            changes.append(_derived(entry, ChangeType.UPDATED, since, at))
    changes.extend(Entry(loc=loc, change=ChangeType.DELETED, datetime=at) for loc in removed)
    changes.sort(key=lambda e: (e.datetime, _CHANGE_ORDER[e.change], e.loc))  # type: ignore[index]
    return changes


def _derived(entry: Entry, change: ChangeType, since: datetime | None, at: datetime) -> Entry:
    """A Resource List entry as the change that brought it to its listed state."""
    return Entry(
        loc=entry.loc,
        lastmod=entry.lastmod,
        change=change,
        datetime=derived_time(entry.lastmod, since, at),
        hash=entry.hash,
        length=entry.length,
        type=entry.type,
        links=entry.links,
    )
