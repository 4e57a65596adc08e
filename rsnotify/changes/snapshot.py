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
fingerprint, stored outside the checkpoint (:class:`MapWriter`): a
million-resource Source costs about 15 MB of maps on disk and nothing in
memory while it does not change.

Comparing a part holds neither map as strings (issue 23: a million-resource
index set diffed within 50 MB).  The old map is streamed out of its
compressed bytes into a :class:`_LocTable` of integers, each loc as a
128-bit blake2b key (3.8 MB for 50,000 resources, :class:`_LocTable`);
the new map is compressed as the entries stream by; the locs of deletions are
named by streaming the old map once more.  With 128-bit keys two locs of one
comparison share a key with probability about n^2 / 2^129 (1e-27 for a
million locs), far below the 8-byte fingerprint's own chance of hiding an
update (2^-64 per update), so a key stands for its loc.

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
from binascii import hexlify
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from hashlib import blake2b, sha256

from .. import w3cdt
from ..model import ChangeType, Entry

__all__ = [
    "Comparison",
    "Diff",
    "MapWriter",
    "PartState",
    "SnapshotState",
    "change_order",
    "compare_part",
    "derived_time",
    "encode_map",
    "fingerprint",
    "iter_map",
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


class MapWriter:
    """A part's map (loc -> fingerprint) compressed as it is written, one resource at a time.

    ``<16 hex digits>\\0<loc>\\0`` per resource, zlib level 6: XML 1.0
    cannot hold a NUL, so no loc read from a Resource List contains the
    separator.  The format is the one maps were always stored in (deflate's
    output does not depend on how its input was cut), so a map written by an
    earlier version reads as before and an unchanged map keeps its key.  A
    loc written twice is read back with its last fingerprint.
    """

    __slots__ = ("_buffer", "_out", "_size", "_zlib")

    def __init__(self) -> None:
        self._zlib = zlib.compressobj(6)
        self._out: list[bytes] = []
        self._buffer: list[bytes] = []
        self._size = 0

    def add(self, loc: bytes, fp: bytes) -> None:
        record = b"%s\0%s\0" % (hexlify(fp), loc)
        self._buffer.append(record)
        self._size += len(record)
        if self._size >= _BLOCK:
            self._out.append(self._zlib.compress(b"".join(self._buffer)))
            self._buffer.clear()
            self._size = 0

    def finish(self) -> bytes:
        self._out.append(self._zlib.compress(b"".join(self._buffer)))
        self._out.append(self._zlib.flush())
        self._buffer.clear()
        return b"".join(self._out)


def encode_map(states: Mapping[str, bytes]) -> bytes:
    """A whole map at once (tests, small maps): what :class:`MapWriter` writes."""
    writer = MapWriter()
    for loc, fp in states.items():
        writer.add(loc.encode(), fp)
    return writer.finish()


def iter_map(data: bytes) -> Iterator[tuple[str, bytes]]:
    """A stored map's (loc, fingerprint) pairs, decompressed a block at a time."""
    for loc, fp_hex in _records(data):
        yield loc.decode(), bytes.fromhex(fp_hex.decode())


def _records(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(loc, fingerprint in hex) as stored, without ever holding the whole map decompressed."""
    unzip = zlib.decompressobj()
    tail = b""
    fp_hex: bytes | None = None
    for start in range(0, len(data) + 1, _BLOCK):
        if start < len(data):
            block = tail + unzip.decompress(data[start : start + _BLOCK])
        else:
            block = tail + unzip.flush()
        fields = block.split(b"\0")
        tail = fields.pop()
        for value in fields:
            if fp_hex is None:
                fp_hex = value
            else:
                yield value, fp_hex
                fp_hex = None
    if tail or fp_hex is not None or not unzip.eof:
        raise ValueError("a snapshot map ends inside a record")


_BLOCK = 1 << 16
# _LocTable's values: the new part that listed the loc last, above two flags, above
# the ordinal (32 bits), above the fingerprint (64).
_FP_MASK = (1 << 64) - 1
_ORDINAL_MASK = (1 << 32) - 1
_OLD_BIT, _NEW_BIT = 1 << 96, 1 << 97  # listed by the old map, by the new entries
_OLD_MASK = (1 << 97) - 1  # what the old map said: its bit, the ordinal, the fingerprint
_MARK_BITS = ~_OLD_MASK  # what the new parts said: the new bit and which part listed it last
_GENERATION_SHIFT = 98  # above the flags: which new part listed the loc last
# What _LocTable.see answers: the loc was not in the old map, was with the same
# fingerprint, was with another; plus _AGAIN when the new entries listed it already.
_ADDED, _SAME, _CHANGED, _AGAIN = 0, 1, 2, 4


class _LocTable:
    """Loc keys -> what the old map said of them, in one dict of ints.

    A loc's key is its 128-bit blake2b as an int; its value packs the old
    fingerprint (64 bits), the record's ordinal in the old map (32 bits) and
    two flags.  A dict of 50,000 str locs to bytes costs about 10 MB; this
    one about 6 MB, with every lookup in C (a table of flat arrays probed in
    Python saved 2 MB and cost 1.5-2 us per entry).
    """

    __slots__ = ("slots",)

    def __init__(self) -> None:
        self.slots: dict[int, int] = {}

    def load(self, records: Iterable[tuple[bytes, bytes]]) -> None:
        """The old map's records; a loc stored twice keeps its last fingerprint."""
        slots = self.slots
        for n, (loc, fp_hex) in enumerate(records):
            slots[_key(loc)] = _OLD_BIT | n << 64 | int(fp_hex, 16)

    def see(self, loc: bytes, fp: bytes, mark: int = _NEW_BIT | 1 << _GENERATION_SHIFT) -> int:
        """A new entry of the part ``mark`` names (the new bit, and the part's number
        above ``_GENERATION_SHIFT``): what the old map said of its loc (``_ADDED``...
        ``| _AGAIN`` when this part listed it already)."""
        key = _key(loc)
        slots = self.slots
        value = slots.get(key)
        if value is None:
            slots[key] = mark
            return _ADDED
        slots[key] = value & _OLD_MASK | mark
        answer = _AGAIN if value & _MARK_BITS == mark else _ADDED
        if value & _OLD_BIT:
            answer |= _SAME if value & _FP_MASK == int.from_bytes(fp) else _CHANGED
        return answer

    def gone(self) -> set[int]:
        """The ordinals of the old records whose locs no new entry listed."""
        return {(v >> 64) & _ORDINAL_MASK for v in self.slots.values() if not v & _NEW_BIT}


def _key(loc: bytes) -> int:
    return int.from_bytes(blake2b(loc, digest_size=16).digest())


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
    # The part's own rs:md 'at', and the one its index gives it (section 10.2:
    # each <sitemap> of a Resource List Index may carry the part's 'at').
    at: datetime | None = None
    declared: datetime | None = None

    @property
    def torn(self) -> bool:
        """The part is not the one its index describes: read mid-rewrite (or a sloppy index)."""
        return self.at is not None and self.declared is not None and self.at != self.declared

    def to_obj(self) -> dict[str, object]:
        obj: dict[str, object] = {
            "key": self.key,
            "digest": self.digest,
            "etag": self.etag,
            "lm": self.last_modified,
            "n": self.count,
        }
        if self.at is not None:
            obj["at"] = w3cdt.format(self.at)
        if self.declared is not None:
            obj["decl"] = w3cdt.format(self.declared)
        return obj

    @classmethod
    def from_obj(cls, url: str, obj: Mapping[str, object]) -> PartState:
        etag, lm, n = obj.get("etag"), obj.get("lm"), obj.get("n", 0)
        at, declared = obj.get("at"), obj.get("decl")
        return cls(
            url=url,
            key=str(obj["key"]),
            digest=str(obj["digest"]),
            etag=etag if isinstance(etag, str) else None,
            last_modified=lm if isinstance(lm, str) else None,
            count=n if isinstance(n, int) else 0,
            at=w3cdt.parse(at) if isinstance(at, str) else None,
            declared=w3cdt.parse(declared) if isinstance(declared, str) else None,
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


def compare_part(old: bytes, entries: Iterable[Entry], diff: Diff | None) -> tuple[bytes, int]:
    """Compare one part's new entries with its old map (into ``diff``).

    ``old``: the part's stored map (:class:`MapWriter`; ``b""``: none);
    returns the new map, stored the same way, and how many locs it holds.
    Streaming: an entry is kept only when it changed, and neither map is
    held as strings (module docstring), so a part of 50,000 resources with
    ten changes holds a table of integers, the compressed maps and ten
    entries.  A loc listed twice in one part counts once, with its last
    state.  ``diff=None``: only the map is wanted (a first snapshot,
    recorded).
    """
    comparison = Comparison([old] if old else [], diff)
    result = comparison.part(entries)
    comparison.finish()
    return result


class Comparison:
    """New parts compared with old maps through one table: one part with its own map,
    or the parts an index newly names with the maps of those it no longer names.

    A Source that renames its parts (a re-sharded index, parts named by
    date, a Resource List grown into an index at the same URL) moves every
    resource from a part that is gone to one never seen: compared part by
    part, each would be kept as an entry (``Diff.added``) and each old loc
    as a string (``Diff.removed``) only for :func:`settle` to cancel the
    pairs, a million entries in memory for no change.  Loaded with the
    vanished parts' maps, the table tells each new part's entries the same,
    changed or new as it would for one part, and after the last part
    (:meth:`finish`) names only the locs no new part listed.  Memory: the
    table's integers (about 120 bytes a loc) and the old maps' compressed
    bytes, no entry for a resource that did not change: a million resources
    renamed peak at 193 MB, where keeping them as entries took 1.1 GB
    (``bench.snapshot_diff`` row (d)).
    """

    __slots__ = ("_diff", "_olds", "_parts", "_table")

    def __init__(self, olds: list[bytes], diff: Diff | None) -> None:
        self._diff = diff
        self._olds = olds if diff is not None else []
        self._table = _LocTable()
        self._parts = 0
        if self._olds:
            self._table.load(_chain(self._olds) if len(self._olds) > 1 else _records(olds[0]))

    def part(self, entries: Iterable[Entry]) -> tuple[bytes, int]:
        """One new part's entries: its new map and count; what changed goes into the diff."""
        diff, see = self._diff, self._table.see
        self._parts += 1
        mark = _NEW_BIT | self._parts << _GENERATION_SHIFT
        writer = MapWriter()
        count = 0
        # By loc, so that a loc listed again replaces what its earlier listing decided.
        changed: dict[str, Entry] = {}
        added: dict[str, tuple[Entry, bytes]] = {}
        for entry in entries:
            fp = fingerprint(entry)
            loc = entry.loc.encode()
            writer.add(loc, fp)
            answer = see(loc, fp, mark)  # against the OLD maps, for every listing
            if answer & _AGAIN:
                changed.pop(entry.loc, None)
                added.pop(entry.loc, None)
            else:
                count += 1
            if diff is not None:
                if answer & _CHANGED:
                    changed[entry.loc] = entry
                elif not answer & _SAME:
                    added[entry.loc] = (entry, fp)
        if diff is not None:
            diff.changed.extend(changed.values())
            diff.added.extend(added.values())
        return writer.finish(), count

    def finish(self) -> None:
        """The old maps' locs that no new part listed go into the diff as removed."""
        table, self._table = self._table, _LocTable()
        if self._diff is None or not self._olds:
            return  # nothing recorded before: nothing can be gone
        gone = table.gone()
        del table
        if gone:  # only in the old maps: stream them once more
            removed = self._diff.removed
            for n, (loc, fp_hex) in enumerate(_chain(self._olds)):
                if n in gone:
                    removed[loc.decode()] = bytes.fromhex(fp_hex.decode())


def _chain(maps: Iterable[bytes]) -> Iterator[tuple[bytes, bytes]]:
    """The records of several stored maps, one after another (one ordinal sequence)."""
    for data in maps:
        yield from _records(data)


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
    changes.sort(key=change_order)
    return changes


def change_order(entry: Entry) -> tuple[datetime, int, str]:
    """The fixed order of derived changes (module docstring): time, deletions last, loc."""
    assert entry.datetime is not None and entry.change is not None
    return entry.datetime, _CHANGE_ORDER[entry.change], entry.loc


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
