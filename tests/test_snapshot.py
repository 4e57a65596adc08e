"""Resource List snapshots and their differences (issue 23): the pure rules and the watcher.

Why one module of ~930 lines: it tests one feature, issue 23's snapshot diff, from its pure
rules (:mod:`rsnotify.changes.snapshot`) to the watcher that applies them; the watcher tests
share ``DirSource`` and ``_watcher``, and several check end to end a rule tested purely
above (moves, renamed parts).

The watcher reads a directory Source (:class:`DirectoryAccess`, no sockets),
counting reads per document, so "only the changed part is parsed" is checked
by what was read, not by timing.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsnotify import sitemap
from rsnotify.changes import snapshotwatch
from rsnotify.changes.access import DirectoryAccess, Fetched
from rsnotify.changes.snapshot import (
    Comparison,
    Diff,
    compare_part,
    derived_time,
    encode_map,
    fingerprint,
    iter_map,
    settle,
)
from rsnotify.changes.snapshotblobs import DirectoryBlobs
from rsnotify.changes.snapshotwatch import SnapshotWatcher
from rsnotify.errors import CoverageHole, InvalidDocument
from rsnotify.model import Capability, ChangeType, Entry, Root, make_document
from rsnotify.sitemapwriter import serialize
from rsnotify.tracker import Checkpoint

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BASE = "http://source.example.org"


def _entry(name: str, body: str = "", lastmod: datetime | None = None, **kw: object) -> Entry:
    return Entry(loc=f"{BASE}/res/{name}", lastmod=lastmod, **kw)  # type: ignore[arg-type]


# -- the pure rules ------------------------------------------------------------------------


def test_fingerprint_prefers_the_strongest_hash_then_length_and_lastmod() -> None:
    sha = "sha-256:" + "a" * 64
    assert fingerprint(_entry("x", hash=f"md5:{'b' * 32} {sha}")) == fingerprint(
        _entry("x", hash=sha)
    )  # adding a weaker hash is no change
    other = "sha-256:" + "c" * 64
    assert fingerprint(_entry("x", hash=sha)) != fingerprint(_entry("x", hash=other))
    assert fingerprint(_entry("x", length=3, lastmod=T0)) != fingerprint(
        _entry("x", length=3, lastmod=T0 + timedelta(seconds=1))
    )
    assert fingerprint(_entry("x", length=3)) != fingerprint(_entry("x", length=4))


def test_maps_round_trip_odd_locs() -> None:
    states = {f"{BASE}/a b&c/é/😀/{i}": fingerprint(_entry(str(i), length=i)) for i in range(50)}
    assert dict(iter_map(encode_map(states))) == states
    assert dict(iter_map(encode_map({}))) == {}


# A map as rsnotify stored it before maps were streamed (the format is unchanged):
# a, b and "c d&é" with lengths 1, 2, 3.  Frozen here so a format change fails.
EARLIER_MAP = base64.b64decode(
    "eJyFy8ENgzAMBdCMwoljYhwiu2zjhE85tAIlqcRKnaOLdQTe/YnNM8AoyaaUS3Z77+cSQjs+tcDjsvf5gj/qM1S0"
    "YG6ySMq6EoSj6HYTsqNNVaI8QJwSk96EMqzj7+v+jMMxMw=="
)


def test_a_map_stored_by_an_earlier_version_is_read_and_keeps_its_key() -> None:
    earlier = {f"{BASE}/res/{n}": fingerprint(_entry(n, length=i + 1)) for i, n in enumerate(
        ["a", "b", "c d&é"]
    )}  # fmt: skip
    assert dict(iter_map(EARLIER_MAP)) == earlier
    assert encode_map(earlier) == EARLIER_MAP  # same map, same bytes: same content key
    diff = Diff()
    new_map, count = compare_part(
        EARLIER_MAP, [_entry("a", length=1), _entry("b", length=5), _entry("e", length=1)], diff
    )
    assert [e.loc for e in diff.changed] == [f"{BASE}/res/b"]
    assert [e.loc for e, _ in diff.added] == [f"{BASE}/res/e"]
    assert diff.removed == {f"{BASE}/res/c d&é": earlier[f"{BASE}/res/c d&é"]}
    assert count == 3 and len(dict(iter_map(new_map))) == 3


_LOCS = st.sampled_from(
    [f"{BASE}/res/{i}" for i in range(40)] + [f"{BASE}/é/ x&{i}" for i in range(3)]
)
_STATES = st.lists(st.tuples(_LOCS, st.integers(0, 3)), max_size=120)


@settings(max_examples=150, deadline=None)
@given(old=_STATES, new=_STATES)
def test_compare_part_agrees_with_plain_dicts(
    old: list[tuple[str, int]], new: list[tuple[str, int]]
) -> None:
    """The table of integer keys (locs listed twice included) decides as dicts of locs do."""
    old_map: dict[str, bytes] = {}
    for loc, length in old:  # stored twice: the last state counts
        old_map[loc] = fingerprint(Entry(loc=loc, length=length))
    stored = b"".join(  # a map holding each loc as often as the old part listed it
        b"%s\0%s\0" % (fingerprint(Entry(loc=loc, length=n)).hex().encode(), loc.encode())
        for loc, n in old
    )
    import zlib

    entries = [Entry(loc=loc, length=length) for loc, length in new]
    diff = Diff()
    data, count = compare_part(zlib.compress(stored), entries, diff)
    model: dict[str, bytes] = {}
    last: dict[str, Entry] = {}
    for entry in entries:  # listed twice: the last listing counts
        model[entry.loc] = fingerprint(entry)
        last[entry.loc] = entry
    changed = {loc: e for loc, e in last.items() if old_map.get(loc, model[loc]) != model[loc]}
    added = {loc: (e, model[loc]) for loc, e in last.items() if loc not in old_map}
    assert {e.loc: e for e in diff.changed} == changed and len(diff.changed) == len(changed)
    assert {e.loc: (e, fp) for e, fp in diff.added} == added and len(diff.added) == len(added)
    assert diff.removed == {loc: fp for loc, fp in old_map.items() if loc not in model}
    assert dict(iter_map(data)) == model and count == len(model)
    assert compare_part(b"", entries, None) == (data, count)


def test_derived_time_believes_lastmod_only_inside_the_interval() -> None:
    since, at = T0, T0 + timedelta(hours=1)
    inside = T0 + timedelta(minutes=5)
    assert derived_time(inside, since, at) == inside
    assert derived_time(T0 - timedelta(days=1), since, at) == at  # before the old snapshot
    assert derived_time(at + timedelta(days=1), since, at) == at  # after the new one
    assert derived_time(since, since, at) == at  # the old snapshot already reflected it
    assert derived_time(None, since, at) == at


def test_created_updated_deleted_and_a_move_between_parts() -> None:
    since, at = T0, T0 + timedelta(hours=1)
    a, b, c, d = (_entry(n, length=1) for n in "abcd")
    part1 = encode_map({e.loc: fingerprint(e) for e in (a, b)})
    part2 = encode_map({e.loc: fingerprint(e) for e in (c, d)})
    diff = Diff()
    b2 = _entry("b", length=2, lastmod=T0 + timedelta(minutes=1))
    e = _entry("e", length=1)
    # part 1: a moves out (to part 2, unchanged), b changes; part 2: c is deleted, a and e arrive.
    compare_part(part1, [b2], diff)
    compare_part(part2, [d, a, e], diff)
    changes = settle(diff, since=since, at=at)
    assert [(ch.loc.rsplit("/", 1)[1], ch.change, ch.datetime) for ch in changes] == [
        ("b", ChangeType.UPDATED, T0 + timedelta(minutes=1)),
        ("e", ChangeType.CREATED, at),
        ("c", ChangeType.DELETED, at),
    ]


def test_a_moved_resource_that_changed_is_updated() -> None:
    a = _entry("a", length=1)
    diff = Diff()
    compare_part(encode_map({a.loc: fingerprint(a)}), [], diff)
    compare_part(b"", [_entry("a", length=9)], diff)
    (change,) = settle(diff, since=T0, at=T0 + timedelta(hours=1))
    assert change.change is ChangeType.UPDATED and change.length == 9


# A Source's resources before and after, each dealt to a part: (name, length, part).
_DEALT = st.lists(
    st.tuples(st.sampled_from("abcdefghijkl"), st.integers(1, 3), st.integers(0, 3)),
    max_size=12,
    unique_by=lambda t: t[0],
)


@settings(max_examples=150, deadline=None)
@given(old=_DEALT, new=_DEALT)
def test_renamed_parts_compared_as_one_set_keep_only_what_changed(
    old: list[tuple[str, int, int]], new: list[tuple[str, int, int]]
) -> None:
    """Every old part gone, every new part new (a re-sharded index): one Comparison of
    the new parts with the gone parts' maps derives what the resources did, and keeps
    an entry only for a resource created, a string only for one deleted."""
    olds = [
        encode_map({_res(n, k).loc: fingerprint(_res(n, k)) for n, k, p in old if p == part})
        for part in range(4)
    ]
    diff = Diff()
    comparison = Comparison(olds, diff)
    for part in range(4):
        _, count = comparison.part([_res(n, k) for n, k, p in new if p == part])
        assert count == sum(1 for *_, p in new if p == part)
    comparison.finish()
    before = {n: k for n, k, _ in old}
    after = {n: k for n, k, _ in new}
    expected = sorted(
        [(n, ChangeType.CREATED) for n in after if n not in before]
        + [(n, ChangeType.UPDATED) for n in after if n in before and before[n] != after[n]]
        + [(n, ChangeType.DELETED) for n in before if n not in after]
    )
    changes = settle(diff, since=T0, at=T0 + timedelta(hours=1))
    assert sorted((c.loc.rsplit("/", 1)[1], c.change) for c in changes) == expected
    assert len(diff.added) == sum(1 for n in after if n not in before)
    assert set(diff.removed) == {_res(n, 1).loc for n in before if n not in after}


def test_a_loc_listed_by_two_new_parts_counts_in_each() -> None:
    """The table's generations: a loc again in the next part is that part's first listing."""
    a = _res("a", 1)
    comparison = Comparison([encode_map({a.loc: fingerprint(a)})], Diff())
    assert comparison.part([a, a])[1] == 1
    assert comparison.part([a])[1] == 1


# -- the watcher over a directory Source ---------------------------------------------------


def _res(name: str, length: int) -> Entry:
    return Entry(loc=f"{BASE}/res/{name}", length=length)


def test_a_loc_listed_twice_counts_with_its_last_listing() -> None:
    """compare_part: "a loc listed twice in one part counts once, with its last state"."""
    at = T0 + timedelta(hours=1)
    x1, x2 = _res("x", 1), _res("x", 2)
    diff = Diff()  # listed as changed, then as it was: no change (the map says so too)
    _, count = compare_part(encode_map({x1.loc: fingerprint(x1)}), [x2, x1], diff)
    assert count == 1 and settle(diff, since=T0, at=at) == []
    diff = Diff()  # a new loc listed twice: created once, in its last state
    compare_part(b"", [_res("y", 1), _res("y", 2)], diff)
    assert [(c.change, c.length) for c in settle(diff, since=T0, at=at)] == [
        (ChangeType.CREATED, 2)
    ]
    a = _res("a", 1)
    diff = Diff()  # a leaves one part for another that lists it twice, unchanged
    compare_part(encode_map({a.loc: fingerprint(a)}), [], diff)
    compare_part(b"", [a, a], diff)
    assert settle(diff, since=T0, at=at) == []


class CountingAccess(DirectoryAccess):
    """A directory Source that counts the reads that returned bytes, per URL path."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.bodies: dict[str, int] = {}

    async def read(
        self,
        url: str,
        *,
        etag: str | None = None,
        last_modified: str | None = None,
        range_start: int | None = None,
        stream: bool = False,
    ) -> Fetched:
        got = await super().read(url, etag=etag, last_modified=last_modified, stream=stream)
        if not got.not_modified:
            name = url.rsplit("/", 1)[1]
            self.bodies[name] = self.bodies.get(name, 0) + 1
        return got


class DirSource:
    """A Resource List (or an index of parts) written into a directory."""

    def __init__(self, root: Path, parts: int = 0, *, declare: bool = False) -> None:
        self.root = root
        self.parts = parts
        self.declare = declare  # the index gives each part's 'at' (section 10.2)
        self.part_at: dict[int, datetime] = {}
        self.at = T0
        self.resources: dict[str, int] = {}  # name -> length (its state)
        self.lastmod: dict[str, datetime] = {}
        self.part_of: dict[str, int] = {}
        self.part_name = "part{}.xml"  # a Source may rename its parts (a re-shard)

    def url(self, name: str) -> str:
        return f"{BASE}/{name}"

    @property
    def list_url(self) -> str:
        return self.url("resourcelist-index.xml" if self.parts else "resourcelist.xml")

    def set(self, name: str, length: int, part: int = 0) -> None:
        if self.resources.get(name) != length:  # changed before the next publish
            self.lastmod[name] = self.at + timedelta(seconds=30)
        self.resources[name] = length
        self.part_of[name] = part

    def delete(self, name: str) -> None:
        del self.resources[name], self.part_of[name], self.lastmod[name]

    def _list(self, names: list[str], at: datetime | None = None) -> bytes:
        entries = [
            Entry(loc=f"{BASE}/res/{n}", length=self.resources[n], lastmod=self.lastmod[n])
            for n in names
        ]
        doc = make_document(Root.URLSET, Capability.RESOURCELIST, at=at or self.at, entries=entries)
        return serialize(doc)

    def _write(self, name: str, data: bytes) -> None:
        path = self.root / name
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)

    def publish(self, *, minutes: int = 1, only: set[int] | None = None) -> None:
        """Write the list(s) dated ``minutes`` later; parts whose content is unchanged stay.

        ``only``: write just these parts, and no index: a Source caught while
        it rewrites its lists (``publish(minutes=0)`` finishes the job).
        """
        self.at += timedelta(minutes=minutes)
        names = sorted(self.resources)
        if not self.parts:
            self._write("resourcelist.xml", self._list(names))
            return
        refs = []
        for p in range(self.parts):
            mine = [n for n in names if self.part_of[n] == p]
            name = self.part_name.format(p)
            path = self.root / name
            old = sitemap.parse(path.read_bytes()) if path.exists() else None
            old_set = {(e.loc, e.length) for e in old.entries} if old else None
            new_set = {(f"{BASE}/res/{n}", self.resources[n]) for n in mine}
            if old_set != new_set and (only is None or p in only):
                self.part_at[p] = self.at
                self._write(name, self._list(mine, self.part_at[p]))
            declared = self.part_at.get(p) if self.declare else None
            refs.append(Entry(loc=self.url(name), at=declared))
        if only is not None:
            return
        index = make_document(Root.SITEMAPINDEX, Capability.RESOURCELIST, at=self.at, entries=refs)
        self._write("resourcelist-index.xml", serialize(index))


def _index_source(tmp_path: Path, names: str, parts: int, *, declare: bool = False) -> DirSource:
    """A published Resource List Index: one resource per name, dealt round the parts."""
    source = DirSource(tmp_path / "src", parts=parts, declare=declare)
    source.root.mkdir()
    for i, n in enumerate(names):
        source.set(n, 1, part=i % parts)
    source.publish()
    return source


def _watcher(
    source: DirSource, access: DirectoryAccess, blobs: Path, checkpoint: Checkpoint, **kw: object
) -> SnapshotWatcher:
    return SnapshotWatcher(
        access=access,
        collection="c",
        capability_list=source.url("capabilitylist.xml"),
        resourcelist_url=source.list_url,
        checkpoint=checkpoint,
        blobs=DirectoryBlobs(blobs),
        **kw,  # type: ignore[arg-type]
    )


def _recorded(tmp_path: Path) -> tuple[DirSource, DirectoryAccess, SnapshotWatcher]:
    """A Source listing one resource, ``a``, and a watcher that recorded its snapshot."""
    source = DirSource(tmp_path / "src")
    source.root.mkdir()
    source.set("a", 1)
    source.publish()
    access = DirectoryAccess(source.root)
    watcher = _watcher(source, access, tmp_path / "maps", Checkpoint())
    _poll_and_commit(watcher)
    return source, access, watcher


def _changes(result: object) -> list[tuple[str, ChangeType]]:
    detections = result.detections  # type: ignore[attr-defined]
    return [(e.loc.rsplit("/", 1)[1], e.change) for d in detections for e in d.entries]


def _poll_and_commit(watcher: SnapshotWatcher, limit: int | None = None) -> object:
    result = asyncio.run(watcher.poll(limit))
    if result.checkpoint is not watcher.checkpoint:
        watcher.commit(result.checkpoint)
    return result


def test_single_list_first_read_records_then_changes_are_derived(tmp_path: Path) -> None:
    source = DirSource(tmp_path / "src")
    source.root.mkdir()
    for n in "abc":
        source.set(n, 1)
    source.publish()
    access = CountingAccess(source.root)
    watcher = _watcher(source, access, tmp_path / "maps", Checkpoint())
    first = _poll_and_commit(watcher)
    assert _changes(first) == [] and watcher.checkpoint.snapshot is not None
    assert _changes(_poll_and_commit(watcher)) == []  # nothing changed: not parsed again
    assert access.bodies["resourcelist.xml"] == 1
    before = source.at
    source.set("b", 2)
    source.delete("c")
    source.set("d", 1)
    source.publish()
    result = _poll_and_commit(watcher)
    assert _changes(result) == [
        ("b", ChangeType.UPDATED),
        ("d", ChangeType.CREATED),
        ("c", ChangeType.DELETED),
    ]
    (detection,) = result.detections  # type: ignore[attr-defined]
    assert detection.derived is not None
    assert (detection.derived.from_, detection.derived.until) == (before, source.at)
    # The checkpoint survives JSON (a cursor, a log checkpoint) and a new watcher goes on.
    saved = Checkpoint.from_json(watcher.checkpoint.to_json())
    assert saved == watcher.checkpoint
    again = _watcher(source, access, tmp_path / "maps", saved)
    assert _changes(_poll_and_commit(again)) == []


def test_an_index_reads_only_the_part_that_changed_and_sees_moves(tmp_path: Path) -> None:
    source = _index_source(tmp_path, "abcdefghi", parts=3)
    access = CountingAccess(source.root)
    watcher = _watcher(source, access, tmp_path / "maps", Checkpoint())
    _poll_and_commit(watcher)
    assert {access.bodies[f"part{p}.xml"] for p in range(3)} == {1}
    source.set("d", 5, part=0)  # part 0 only
    source.publish()
    assert _changes(_poll_and_commit(watcher)) == [("d", ChangeType.UPDATED)]
    assert [access.bodies[f"part{p}.xml"] for p in range(3)] == [2, 1, 1]
    source.set("b", 1, part=2)  # moves from part 1 to part 2, unchanged
    source.set("e", 7, part=2)  # moves from part 1 to part 2, changed
    source.delete("h")  # part 1
    source.publish()
    assert _changes(_poll_and_commit(watcher)) == [
        ("e", ChangeType.UPDATED),
        ("h", ChangeType.DELETED),
    ]
    assert [access.bodies[f"part{p}.xml"] for p in range(3)] == [2, 2, 2]


def _diffs_settled(monkeypatch: pytest.MonkeyPatch) -> list[Diff]:
    """Every diff the watcher settles from now on (what it held in memory)."""
    diffs: list[Diff] = []
    real = snapshotwatch.settle

    def settling(diff: Diff, **kw: datetime | None) -> list[Entry]:
        diffs.append(diff)
        return real(diff, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(snapshotwatch, "settle", settling)
    return diffs


def test_a_reshard_holds_no_entry_for_a_resource_that_only_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts renamed and resources dealt anew (a re-sharded index, parts named by date):
    no change, and the diff holds nothing, where it held every entry of every part."""
    source = _index_source(tmp_path, "abcdefghi", parts=3)
    watcher = _watcher(source, DirectoryAccess(source.root), tmp_path / "maps", Checkpoint())
    _poll_and_commit(watcher)
    diffs = _diffs_settled(monkeypatch)
    source.parts, source.part_name = 4, "2026-11-29-part{}.xml"
    for i, n in enumerate("abcdefghi"):
        source.part_of[n] = (i * 3) % 4
    source.publish()
    assert _changes(_poll_and_commit(watcher)) == []
    (diff,) = diffs
    assert (diff.changed, diff.added, diff.removed) == ([], [], {})
    # Renamed again, with a resource changed, one deleted, one created on the way.
    source.part_name = "2026-11-30-part{}.xml"
    source.set("c", 9, part=1)
    source.delete("e")
    source.set("z", 1, part=2)
    source.publish()
    assert _changes(_poll_and_commit(watcher)) == [
        ("c", ChangeType.UPDATED),
        ("z", ChangeType.CREATED),
        ("e", ChangeType.DELETED),
    ]
    assert len(diffs[1].added) == 1 and list(diffs[1].removed) == [f"{BASE}/res/e"]


def test_a_list_grown_into_an_index_at_its_url_is_compared_with_the_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Resource List that outgrows the Sitemap limit becomes an index at the same URL
    (Z39.99 section 10.2): its resources moved into the parts, nothing changed."""
    source = DirSource(tmp_path / "src")
    source.root.mkdir()
    for n in "abcd":
        source.set(n, 1)
    source.publish()
    grown = tmp_path / "grown"
    grown.mkdir()
    index = DirSource(grown, parts=2)
    for i, n in enumerate("abcd"):
        index.set(n, 1, part=i % 2)
    index.lastmod = dict(source.lastmod)
    index.publish()
    access = DirectoryAccess(source.root)
    watcher = _watcher(source, access, tmp_path / "maps", Checkpoint())
    _poll_and_commit(watcher)
    for name in ("part0.xml", "part1.xml"):
        (source.root / name).write_bytes((grown / name).read_bytes())
    # The index at the list's own URL.
    (source.root / "resourcelist.xml").write_bytes((grown / "resourcelist-index.xml").read_bytes())
    diffs = _diffs_settled(monkeypatch)
    assert _changes(_poll_and_commit(watcher)) == []
    assert [(d.changed, d.added, d.removed) for d in diffs] == [([], [], {})]


def test_an_index_shrunk_into_a_list_at_its_url_still_finds_deletions(tmp_path: Path) -> None:
    """The other way: an index of two parts becomes one plain Resource List at the same
    URL, one resource gone on the way: the parts' maps still tell the deletion."""
    source = _index_source(tmp_path, "abcd", parts=2)
    index_url = source.list_url
    watcher = _watcher(source, DirectoryAccess(source.root), tmp_path / "maps", Checkpoint())
    _poll_and_commit(watcher)
    source.delete("c")
    source.at += timedelta(minutes=1)
    shrunk = source._list(sorted(source.resources))  # a plain list, written at the index's URL
    (source.root / index_url.rsplit("/", 1)[1]).write_bytes(shrunk)
    assert _changes(_poll_and_commit(watcher)) == [("c", ChangeType.DELETED)]


def test_a_half_consumed_diff_resumes_exactly_after_a_restart(tmp_path: Path) -> None:
    source, access, watcher = _recorded(tmp_path)
    for n in "bcdef":
        source.set(n, 1)
    source.publish()
    first = _poll_and_commit(watcher, limit=2)
    assert _changes(first) == [("b", ChangeType.CREATED), ("c", ChangeType.CREATED)]
    assert first.more  # type: ignore[attr-defined]
    saved = Checkpoint.from_json(watcher.checkpoint.to_json())
    restarted = _watcher(source, access, tmp_path / "maps", saved)
    rest = _poll_and_commit(restarted)
    assert _changes(rest) == [(n, ChangeType.CREATED) for n in "def"]
    assert restarted.checkpoint.snapshot is not None
    assert restarted.checkpoint.snapshot.base is None  # the diff is wholly consumed


def test_a_lost_map_is_a_coverage_hole(tmp_path: Path) -> None:
    source, _, watcher = _recorded(tmp_path)
    for blob in (tmp_path / "maps").iterdir():
        blob.unlink()
    source.set("a", 2)
    source.publish()
    with pytest.raises(CoverageHole, match="map of its previous snapshot is gone"):
        asyncio.run(watcher.poll())


def test_a_destination_rebaselines_once_when_the_list_moved_past_its_baseline(
    tmp_path: Path,
) -> None:
    source = DirSource(tmp_path / "src")
    source.root.mkdir()
    source.set("a", 1)
    source.publish()
    access = DirectoryAccess(source.root)
    baseline_at = source.at
    same = _watcher(
        source, access, tmp_path / "m1", Checkpoint(last_time=baseline_at), stop_at_holes=True
    )
    assert _changes(_poll_and_commit(same)) == [] and same.checkpoint.snapshot is not None
    source.publish()  # a new 'at' since that baseline
    moved = _watcher(
        source, access, tmp_path / "m2", Checkpoint(last_time=baseline_at), stop_at_holes=True
    )
    with pytest.raises(CoverageHole, match="section 7"):
        asyncio.run(moved.poll())
    assert _changes(_poll_and_commit(moved)) == [] and moved.checkpoint.snapshot is not None


def test_a_change_list_where_a_resource_list_belongs_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    doc = make_document(
        Root.URLSET,
        Capability.CHANGELIST,
        from_=T0,
        entries=[Entry(loc=f"{BASE}/x", change=ChangeType.CREATED, datetime=T0)],
    )
    (root / "resourcelist.xml").write_bytes(serialize(doc))
    source = DirSource(root)
    watcher = _watcher(source, DirectoryAccess(root), tmp_path / "maps", Checkpoint())
    with pytest.raises(InvalidDocument, match=r"not 'resourcelist'.*section 7"):
        asyncio.run(watcher.poll())


def test_maps_no_longer_named_are_swept(tmp_path: Path) -> None:
    source, access, watcher = _recorded(tmp_path)
    for length in range(2, 6):
        source.set("a", length)
        source.publish()
        _poll_and_commit(watcher)
    _poll_and_commit(watcher)
    # The committed snapshot's map and the one before it; older ones are gone.
    assert len(list((tmp_path / "maps").iterdir())) == 2
    # What a write killed half-way left is swept by the next process's first poll.
    orphan = tmp_path / "maps" / ".0123abcd.4242.deadbeef.tmp"
    orphan.write_bytes(b"half a map")
    restarted = _watcher(source, access, tmp_path / "maps", watcher.checkpoint)
    _poll_and_commit(restarted)
    assert not orphan.exists()
    assert len(list((tmp_path / "maps").iterdir())) == 1  # the checkpoint's map stays


def _pinned_destination(
    tmp_path: Path,
) -> tuple[DirSource, DirectoryAccess, SnapshotWatcher, Checkpoint]:
    """A Destination's watcher with one resource recorded, its cursor saved there (pinned)."""
    source, access, watcher = _recorded(tmp_path)
    durable = Checkpoint.from_json(watcher.checkpoint.to_json())
    watcher.pin(durable)  # CollectionSync.load
    return source, access, watcher, durable


def _submit(source: DirSource, watcher: SnapshotWatcher, length: int) -> Checkpoint:
    """The Source updates a; the Destination polls and submits the change (a commit)."""
    source.set("a", length)
    source.publish()
    _poll_and_commit(watcher)
    return watcher.checkpoint


def test_the_maps_of_a_pinned_checkpoint_outlive_later_commits(tmp_path: Path) -> None:
    """A Destination commits the watcher when it submits a change, and saves its
    cursor only when the change is applied: until then the maps the durable
    cursor names must stay, or a restart from it finds them swept (a
    re-baseline for nothing)."""
    source, access, watcher, durable = _pinned_destination(tmp_path)
    for length in range(2, 6):  # submitted, never saved
        _submit(source, watcher, length)
    _poll_and_commit(watcher)  # the sweep runs before each read
    source.set("a", 9)
    source.publish()
    restarted = _watcher(source, access, tmp_path / "maps", durable)
    assert _changes(_poll_and_commit(restarted)) == [("a", ChangeType.UPDATED)]


def test_a_cursor_saved_after_later_commits_finds_its_maps(tmp_path: Path) -> None:
    """A change submitted several commits ago is applied, and its checkpoint saved,
    after later polls swept: a restart from that cursor still finds its maps."""
    source, access, watcher, durable = _pinned_destination(tmp_path)
    # Three diffs submitted; the first change's fetch is slow.
    submitted = [_submit(source, watcher, length) for length in (2, 3, 4)]
    _poll_and_commit(watcher)  # the next poll sweeps first
    applied = submitted[0]  # CollectionSync.save of the first submitted checkpoint
    watcher.pin(durable, applied)
    watcher.pin(applied)
    _poll_and_commit(watcher)  # sweeps again: what the saved cursor names stays
    restarted = _watcher(source, access, tmp_path / "maps", Checkpoint.from_json(applied.to_json()))
    try:
        _poll_and_commit(restarted)
    except CoverageHole as exc:  # a re-baseline for nothing
        pytest.fail(f"restart from the saved cursor: {exc}")


def test_a_destination_keeps_the_maps_of_a_bounded_number_of_unsaved_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commits never saved keep their maps up to a bound (beyond it a late save costs a
    re-baseline); a save of the latest releases them all."""
    monkeypatch.setattr(snapshotwatch, "UNSAVED", 2)
    source, _, watcher, _ = _pinned_destination(tmp_path)
    for length in range(2, 7):  # five diffs submitted, none applied
        _submit(source, watcher, length)
    _poll_and_commit(watcher)
    # The pinned map, the two latest unsaved before the current one, the current one.
    assert len(list((tmp_path / "maps").iterdir())) == 4
    watcher.pin(watcher.checkpoint)  # everything applied and saved
    _poll_and_commit(watcher)
    assert len(list((tmp_path / "maps").iterdir())) == 1


class NoValidatorsAccess(DirectoryAccess):
    """A Source that answers every read with the whole body and no validator, as bytes."""

    async def read(self, url: str, **kw: object) -> Fetched:
        got = await super().read(url)
        return Fetched(got.url, body=got.body)


def test_unchanged_bytes_are_hashed_and_never_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without validators every part is read again; only the one whose bytes changed is
    parsed (a reader built for the others held their bodies until the cyclic GC ran)."""
    source = _index_source(tmp_path, "abcdef", parts=3)
    watcher = _watcher(source, NoValidatorsAccess(source.root), tmp_path / "maps", Checkpoint())
    _poll_and_commit(watcher)
    parsed: list[bytes] = []
    real = sitemap.DocumentReader

    def counting(data: bytes, **kw: object) -> sitemap.DocumentReader:
        parsed.append(data)
        return real(data, **kw)  # type: ignore[arg-type]

    source.set("b", 4, part=1)
    source.publish()
    monkeypatch.setattr(sitemap, "DocumentReader", counting)
    assert _changes(_poll_and_commit(watcher)) == [("b", ChangeType.UPDATED)]
    assert len(parsed) == 2  # the index, and part 1 only
    assert b"part1.xml" in parsed[0] and b"/res/b<" in parsed[1]


def test_parts_of_a_directory_source_are_streamed_from_their_files(tmp_path: Path) -> None:
    """A part is hashed and parsed from its open file (never held as bytes), then closed."""
    source = _index_source(tmp_path, "abcd", parts=2)
    reads: list[Fetched] = []

    class Recording(DirectoryAccess):
        async def read(self, url: str, **kw: object) -> Fetched:
            got = await super().read(url, **kw)  # type: ignore[arg-type]
            reads.append(got)
            return got

    watcher = _watcher(source, Recording(source.root), tmp_path / "maps", Checkpoint())
    _poll_and_commit(watcher)
    source.set("c", 3, part=0)
    source.publish()
    assert _changes(_poll_and_commit(watcher)) == [("c", ChangeType.UPDATED)]
    bodies = [r for r in reads if not r.not_modified]
    assert len(bodies) == 5  # index + 2 parts, then index + part 0
    assert all(r.file is not None and r.file.closed and r.body == b"" for r in bodies)


def _one_resource_list(length: int, at_minutes: int) -> bytes:
    entries = [Entry(loc=f"{BASE}/res/a", length=length, lastmod=T0)]
    at = T0 + timedelta(minutes=at_minutes)
    return serialize(make_document(Root.URLSET, Capability.RESOURCELIST, at=at, entries=entries))


def test_digest_and_map_name_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Source rewrites its list in place (same inode) between hashing and parsing:
    the digest stored must name the bytes parsed, or the list settling on the
    hashed bytes would look unchanged and its change would never be reported."""
    root = tmp_path / "src"
    root.mkdir()
    path = root / "resourcelist.xml"
    path.write_bytes(_one_resource_list(1, 1))
    source = DirSource(root)
    watcher = _watcher(source, DirectoryAccess(root), tmp_path / "maps", Checkpoint())
    _poll_and_commit(watcher)
    b_bytes, c_bytes = _one_resource_list(2, 2), _one_resource_list(3, 3)
    real = snapshotwatch._digest
    rewrite = [c_bytes]

    async def racing(fetched: Fetched) -> str:  # the Source rewrites the file while hashed
        digest = await real(fetched)
        if rewrite:
            path.write_bytes(rewrite.pop())  # same inode: the open file sees it
        return digest

    monkeypatch.setattr(snapshotwatch, "_digest", racing)
    path.write_bytes(b_bytes)  # in place, as Path.write_bytes, open(..., 'w') and cp do
    assert _changes(_poll_and_commit(watcher)) == [("a", ChangeType.UPDATED)]  # 1 -> 3 (C)
    path.write_bytes(b_bytes)  # the Source settles on B: a is 2 now
    assert _changes(_poll_and_commit(watcher)) == [("a", ChangeType.UPDATED)]


def test_a_snapshot_watcher_never_loads_the_http_client() -> None:
    """The HTTP client is 11 MB of RSS: a directory watcher does without it."""
    code = (
        "import sys, rsnotify.changes.snapshotwatch, rsnotify.changes.access; "
        "print(sorted(m for m in ('aiohttp', 'yarl', 'rsnotify.fetch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def _half_consumed(tmp_path: Path, new: str, limit: int) -> tuple[DirSource, Checkpoint]:
    """A Source holding ``a``, then ``a`` + ``new``: ``limit`` of that diff consumed."""
    source, _, watcher = _recorded(tmp_path)
    for n in new:
        source.set(n, 1)
    source.publish()
    _poll_and_commit(watcher, limit=limit)
    return source, Checkpoint.from_json(watcher.checkpoint.to_json())


def test_a_resource_created_in_the_consumed_part_then_deleted_is_deleted(tmp_path: Path) -> None:
    """Restart mid-diff after the Source moved on: what was consumed may have to be undone."""
    source, saved = _half_consumed(tmp_path, "bcdef", limit=2)  # b and c applied
    source.delete("b")
    source.set("d", 2)
    source.publish()
    restarted = _watcher(source, DirectoryAccess(source.root), tmp_path / "maps", saved)
    assert sorted(_changes(_poll_and_commit(restarted))) == [
        ("b", ChangeType.DELETED),
        ("c", ChangeType.CREATED),  # again: a repeat is a no-op
        ("d", ChangeType.CREATED),
        ("e", ChangeType.CREATED),
        ("f", ChangeType.CREATED),
    ]
    source.set("g", 1)
    source.publish()
    assert _changes(_poll_and_commit(restarted)) == [("g", ChangeType.CREATED)]


def test_a_source_back_at_the_base_undoes_the_consumed_part(tmp_path: Path) -> None:
    source, saved = _half_consumed(tmp_path, "bc", limit=1)  # b applied
    source.delete("b")
    source.delete("c")
    source.publish()  # what the base listed
    restarted = _watcher(source, DirectoryAccess(source.root), tmp_path / "maps", saved)
    # c was never handed out: its deletion is a no-op, b's is the one that matters.
    assert _changes(_poll_and_commit(restarted)) == [
        ("b", ChangeType.DELETED),
        ("c", ChangeType.DELETED),
    ]
    assert restarted.checkpoint.snapshot is not None
    assert restarted.checkpoint.snapshot.base is None  # consumed: no more reads of the base


def test_a_merged_diff_interrupted_again_resumes_exactly(tmp_path: Path) -> None:
    """The position of a merged diff names its bases, so a second restart skips into it."""
    source, saved = _half_consumed(tmp_path, "bcdef", limit=2)
    source.delete("b")
    source.publish()
    access = DirectoryAccess(source.root)
    once = _watcher(source, access, tmp_path / "maps", saved)
    first = _changes(_poll_and_commit(once, limit=1))
    position = once.checkpoint.snapshot
    assert position is not None and len(position.also) == 1
    again = _watcher(
        source, access, tmp_path / "maps", Checkpoint.from_json(once.checkpoint.to_json())
    )
    rest = _changes(_poll_and_commit(again))
    assert sorted(first + rest) == [
        ("b", ChangeType.DELETED),
        *((n, ChangeType.CREATED) for n in "cdef"),
    ]
    assert len(first + rest) == 5  # nothing twice after the second restart


def test_lists_are_parsed_and_compared_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 50,000-entry part takes ~0.5 s to parse: not on the loop that serves push."""
    import threading

    from rsnotify.changes import snapshotwatch

    threads: list[int] = []
    real = snapshotwatch.compare_part

    def recording(*args: object) -> tuple[bytes, int]:
        threads.append(threading.get_ident())
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(snapshotwatch, "compare_part", recording)
    source = DirSource(tmp_path / "src", parts=2)
    source.root.mkdir()
    for i, n in enumerate("abcd"):
        source.set(n, 1, part=i % 2)
    source.publish()
    watcher = _watcher(source, DirectoryAccess(source.root), tmp_path / "maps", Checkpoint())
    _poll_and_commit(watcher)
    source.set("a", 2, part=0)
    source.publish()
    assert _changes(_poll_and_commit(watcher)) == [("a", ChangeType.UPDATED)]
    assert len(threads) == 3 and threading.get_ident() not in threads


# -- a Source read while it rewrites its index -----------------------------------------------


def _torn_round(tmp_path: Path) -> tuple[DirSource, SnapshotWatcher]:
    """``a`` (part 0) moves to part 1, updated; the watcher reads after part 0 only is written."""
    source = _index_source(tmp_path, "abcd", parts=2, declare=True)
    watcher = _watcher(source, DirectoryAccess(source.root), tmp_path / "maps", Checkpoint())
    _poll_and_commit(watcher)  # the first snapshot, recorded
    source.set("a", 2, part=1)
    source.publish(only={0})
    return source, watcher


def test_a_part_unlike_its_index_is_compared_once_the_source_is_done(tmp_path: Path) -> None:
    """Z39.99 section 10.2: the index gives each part's 'at'; a part that disagrees is mid-rewrite.

    Compared as read, ``a`` is in neither part: a deletion now, a creation at
    the next poll, where the Source made one update.
    """
    source, watcher = _torn_round(tmp_path)
    assert _changes(_poll_and_commit(watcher)) == []
    source.publish(minutes=0)  # part 1, then the index
    assert _changes(_poll_and_commit(watcher)) == [("a", ChangeType.UPDATED)]
    assert _changes(_poll_and_commit(watcher)) == []


def test_an_index_that_never_agrees_with_its_parts_is_compared_as_it_is_after_a_few_polls(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An index that does not keep its parts' dates delays one change, not every one."""
    source, watcher = _torn_round(tmp_path)  # and never finished: the index stays as it was
    for _ in range(snapshotwatch.TORN_POLLS):
        assert _changes(_poll_and_commit(watcher)) == []
    assert _changes(_poll_and_commit(watcher)) == [("a", ChangeType.DELETED)]
    source.set("c", 5, part=0)
    source.publish(only={0})  # again without the index
    assert _changes(_poll_and_commit(watcher)) == [("c", ChangeType.UPDATED)]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "section 10.2" in warnings[0], warnings


def test_a_first_snapshot_read_mid_rewrite_is_recorded_once_the_source_is_done(
    tmp_path: Path,
) -> None:
    """Recorded half-way, ``a`` would be in neither part, and "created" at the next poll."""
    source = _index_source(tmp_path, "abcd", parts=2, declare=True)
    source.set("a", 2, part=1)
    source.publish(only={0})
    watcher = _watcher(source, DirectoryAccess(source.root), tmp_path / "maps", Checkpoint())
    assert _changes(_poll_and_commit(watcher)) == [] and watcher.checkpoint.snapshot is None
    source.publish(minutes=0)
    assert _changes(_poll_and_commit(watcher)) == [] and watcher.checkpoint.snapshot is not None
    assert _changes(_poll_and_commit(watcher)) == []
