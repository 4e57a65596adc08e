"""Issue 17 item 3: when the Change Lists no longer cover the cursor, re-baseline.

Z39.99 section 12.1 leaves retention to the Source.  A Destination away for
longer than the Source keeps its Change Lists finds, on its return, a Change
List Index whose earliest ``from`` is later than its cursor: the lists in
between are gone, and with them the only record of some changes.  Before this
rule ``subscribe --once`` applied the one change it still saw, exited 0 and
left a resource changed in a dropped list stale.

The pure part (:func:`rsnotify.tracker.coverage_hole`) is tested first, then
the scenario end to end: a static Source (documents written here, served by
``python -m http.server``), ``rsnotify subscribe --once`` as a real process.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rsnotify import sitemap
from rsnotify.model import Capability, ChangeType, Entry, Root, make_document
from rsnotify.subscriber.mirror import path_for
from rsnotify.tracker import Checkpoint, ListRef, coverage_hole
from tests.devstack import ManagedProcess

T = datetime(2026, 11, 1, tzinfo=UTC)


def at(hours: float) -> datetime:
    return T + timedelta(hours=hours)


# --- the pure rule ------------------------------------------------------------------


def test_lists_that_chain_from_the_cursor_leave_no_hole() -> None:
    refs = [ListRef("l1", at(0), at(10)), ListRef("l2", at(10), None)]
    position = Checkpoint(changelist="l1", last_time=at(5), started=True)
    assert coverage_hole(refs, position) is None
    assert coverage_hole(refs, Checkpoint(changelist="l2", last_time=at(12), started=True)) is None
    assert coverage_hole(refs, Checkpoint()) is None  # nothing consumed yet


def test_a_dropped_list_after_the_cursor_is_a_hole() -> None:
    position = Checkpoint(changelist="l1", last_time=at(5), started=True)
    hole = coverage_hole([ListRef("l3", at(20), None)], position)
    assert hole is not None and "section 12.1" in hole and "2026-11-01T20:00:00Z" in hole


def test_a_list_seen_closed_before_it_was_dropped_covers_up_to_its_until() -> None:
    position = Checkpoint(changelist="l1", last_time=at(5), started=True)
    refs = [ListRef("l2", at(10), None)]
    assert coverage_hole(refs, position) is not None
    assert coverage_hole(refs, position, {"l1": at(10)}) is None


def test_lists_that_do_not_meet_are_a_hole_only_after_the_cursor() -> None:
    refs = [ListRef("l1", at(0), at(10)), ListRef("l2", at(12), at(20)), ListRef("l3", at(20))]
    early = Checkpoint(changelist="l1", last_time=at(5), started=True)
    hole = coverage_hole(refs, early)
    assert hole is not None and "between l1 and l2" in hole
    late = Checkpoint(changelist="l3", last_time=at(21), started=True)
    assert coverage_hole(refs, late) is None


def test_a_list_without_from_proves_nothing() -> None:
    """resync 2.0.1 writes no ``from``: no hole can be seen (and none is invented)."""
    position = Checkpoint(changelist="changelist.xml", last_time=at(5), started=True)
    assert coverage_hole([ListRef("changelist.xml")], position) is None


# --- end to end --------------------------------------------------------------------


class StaticSource:
    """A Source whose documents are files, as most Sources are (written from the spec)."""

    def __init__(self, root: Path, base: str) -> None:
        self.root, self.base = root, base
        self.files: dict[str, bytes] = {}
        self.lists: list[tuple[str, datetime, datetime | None, list[Entry]]] = []

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    def put(self, name: str, data: bytes | None) -> None:
        path = self.root / "r" / name
        if data is None:
            self.files.pop(name)
            path.unlink()
        else:
            self.files[name] = data
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

    def entry(self, name: str, change: ChangeType, when: datetime) -> Entry:
        data = self.files.get(name)
        if data is None:
            return Entry(loc=self.url(f"r/{name}"), change=change, datetime=when, lastmod=when)
        return Entry(
            loc=self.url(f"r/{name}"),
            change=change,
            datetime=when,
            lastmod=when,
            hash=f"sha-256:{hashlib.sha256(data).hexdigest()}",
            length=len(data),
        )

    def write(self, resourcelist_at: datetime) -> None:
        def save(path: str, document: object) -> None:
            (self.root / path).parent.mkdir(parents=True, exist_ok=True)
            (self.root / path).write_bytes(sitemap.serialize(document))  # type: ignore[arg-type]

        save(
            ".well-known/resourcesync",
            make_document(
                Root.URLSET,
                Capability.DESCRIPTION,
                entries=[Entry(loc=self.url("cl.xml"), capability=Capability.CAPABILITYLIST)],
            ),
        )
        save(
            "cl.xml",
            make_document(
                Root.URLSET,
                Capability.CAPABILITYLIST,
                entries=[
                    Entry(loc=self.url("rl.xml"), capability=Capability.RESOURCELIST),
                    Entry(loc=self.url("index.xml"), capability=Capability.CHANGELIST),
                ],
            ),
        )
        save(
            "rl.xml",
            make_document(
                Root.URLSET,
                Capability.RESOURCELIST,
                at=resourcelist_at,
                entries=[
                    Entry(
                        loc=self.url(f"r/{n}"),
                        hash=f"sha-256:{hashlib.sha256(d).hexdigest()}",
                        length=len(d),
                    )
                    for n, d in sorted(self.files.items())
                ],
            ),
        )
        for name, start, end, entries in self.lists:
            save(
                name,
                make_document(
                    Root.URLSET, Capability.CHANGELIST, from_=start, until=end, entries=entries
                ),
            )
        save(
            "index.xml",
            make_document(
                Root.SITEMAPINDEX,
                Capability.CHANGELIST,
                from_=self.lists[0][1],
                entries=[
                    Entry(loc=self.url(name), from_=start, until=end)
                    for name, start, end, _ in self.lists
                ],
            ),
        )

    def differences(self, mirror: Path) -> list[str]:
        expected = {path_for(self.url(f"r/{n}"), mirror): d for n, d in self.files.items()}
        found = {p: p.read_bytes() for p in mirror.rglob("*") if p.is_file()}
        return sorted(
            [f"missing {p}" for p in expected.keys() - found.keys()]
            + [f"extra {p}" for p in found.keys() - expected.keys()]
            + [f"differs {p}" for p in expected.keys() & found.keys() if expected[p] != found[p]]
        )


def test_lists_dropped_while_away_lead_to_a_re_baseline(
    tmp_path: Path,
    process_factory: Callable[..., ManagedProcess],
    rsnotify_process: Callable[..., ManagedProcess],
) -> None:
    www = tmp_path / "www"
    www.mkdir()
    server = process_factory(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "-d", str(www), "0"],
        name="http.server",
    )
    port = server.wait_for_line(r"Serving HTTP on \S+ port (\d+)", timeout=30).group(1)
    source = StaticSource(www, f"http://127.0.0.1:{port}/")
    now = datetime.now(UTC).replace(microsecond=0)
    t0 = now - timedelta(hours=10)
    for i in range(6):
        source.put(f"doc{i}.txt", f"document {i}\n".encode())
    source.put("doc1.txt", b"document 1, changed\n")
    source.lists = [("l1.xml", t0, None, [source.entry("doc1.txt", ChangeType.UPDATED, t0)])]
    source.write(resourcelist_at=t0 + timedelta(minutes=1))
    mirror = tmp_path / "mirror"

    def once() -> ManagedProcess:
        process = rsnotify_process(
            "subscribe", source.base, "--into", str(mirror), "--once", "--log-format", "json"
        )
        process.wait(timeout=60)
        return process

    first = once()
    assert first.returncode == 0, first.tail()
    assert source.differences(mirror) == []

    # Away: l1 gets changes, closes, and is dropped with them; l2 starts later.
    t2 = now - timedelta(hours=2)
    source.put("doc2.txt", b"document 2, changed while away\n")
    source.put("doc3.txt", None)
    source.put("new.txt", b"created while away\n")
    source.put("doc4.txt", b"document 4, in the list that remains\n")
    source.lists = [("l2.xml", t2, None, [source.entry("doc4.txt", ChangeType.UPDATED, t2)])]
    source.write(resourcelist_at=now)  # regenerated, reflecting everything
    requests = server.output("stderr").count("GET /r/")

    second = once()
    assert second.returncode == 0, second.tail()
    assert source.differences(mirror) == [], "stale or missing after the hole"
    said = second.output("both")
    assert "re-baseline" in said and "section 12.1" in said, second.tail()
    # Only what differs is fetched: doc2, new and doc4 (doc0, doc1, doc5 are compared).
    fetched = server.output("stderr").count("GET /r/") - requests
    assert fetched == 3, server.output("stderr")[-2000:]


def test_a_hole_no_baseline_can_close_makes_once_fail(
    tmp_path: Path,
    process_factory: Callable[..., ManagedProcess],
    rsnotify_process: Callable[..., ManagedProcess],
) -> None:
    """A Resource List older than the lists' start: nothing can fill the gap; exit 1."""
    www = tmp_path / "www"
    www.mkdir()
    server = process_factory(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "-d", str(www), "0"],
        name="http.server",
    )
    port = server.wait_for_line(r"Serving HTTP on \S+ port (\d+)", timeout=30).group(1)
    source = StaticSource(www, f"http://127.0.0.1:{port}/")
    now = datetime.now(UTC).replace(microsecond=0)
    source.put("a.txt", b"a\n")
    source.lists = [("l1.xml", now - timedelta(hours=1), None, [])]
    source.write(resourcelist_at=now - timedelta(hours=3))  # 2 hours no list covers
    process = rsnotify_process(
        "subscribe", source.base, "--into", str(tmp_path / "mirror"), "--once",
        "--log-format", "json",
    )  # fmt: skip
    assert process.wait(timeout=60) == 1, process.tail()
    assert "may lack changes" in process.output("both")
