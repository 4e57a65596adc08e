"""Push-free interoperability: ``rsnotify subscribe --once`` against a ``resync``-built Source.

No publisher, no broker: a plain ``python -m http.server`` serves a directory
whose ResourceSync documents were all written by ``resync-build`` 2.0.1, the
reference tool (Source Description, Capability List, Resource List, Change
Lists).  ``--once`` must baseline from the Resource List, and later runs must
apply the Change Lists ``resync-build --write-changelist`` computes after
files are modified, added and deleted, until the mirror equals the served
files byte for byte.

What ``resync-build`` writes, and how the scenario accommodates it (these are
resync's quirks, found here; rsnotify follows the specification):

* A Change List groups its entries by change type (updated, then deleted,
  then created), not in forward chronological order as section 12 requires.
* A deletion carries the deleted file's *last modification time* from the
  reference Resource List, not the time of the deletion, so it can predate
  changes already applied (and even the Resource List's ``at``), and a
  Destination that locates its place by change time rightly skips it.
* No ``from`` on the Change List, URIs with raw spaces, ``<lastmod>`` as the
  change time even in 1.1 mode.

So each round's file times are set so that resync's grouping is also
chronological (all changes of a round share one time), and a file is deleted
in the round after it was last modified (its deletion then carries that
round's time, which is after the cursor's boundary).  This is also how a
Source that regenerates its Resource List every round would have to drive
resync-build to publish a usable Change List.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from rsnotify import sitemap, w3cdt
from rsnotify.model import ChangeType
from rsnotify.subscriber.mirror import path_for
from tests.devstack import ManagedProcess

from .resync_source import ResyncSource, differences, served_source

RunProcess = Callable[..., ManagedProcess]


def subscribe_once(run: RunProcess, source: ResyncSource, mirror: Path) -> str:
    process = run("subscribe", source.base, "--into", str(mirror), "--once", "--log-format", "json")
    code = process.wait(timeout=60)
    assert code == 0, process.tail()
    return process.output("stdout")


def changes(source: ResyncSource) -> list[tuple[str, ChangeType | None]]:
    document = sitemap.parse((source.root / "changelist.xml").read_bytes(), allow_unordered=True)
    return [(e.loc, e.change) for e in document.entries]


def test_once_mirrors_a_source_built_by_resync(
    tmp_path: Path,
    process_factory: Callable[..., ManagedProcess],
    rsnotify_process: RunProcess,
) -> None:
    source, _ = served_source(tmp_path, process_factory)
    mirror = tmp_path / "mirror"

    # Round 1: the baseline, from a Resource List (the Change List is empty).
    t0 = time.time() - 3600
    source.write("a.txt", b"alpha\n", t0)
    source.write("b.txt", b"bravo\n", t0)
    source.write("sub/c d.txt", b"charlie, with a space in its name\n", t0)
    source.write("sub/x&y.txt", b"x and y\n", t0)
    source.publish_initial()
    out = subscribe_once(rsnotify_process, source, mirror)
    assert "baseline: 4 files" in out, out
    assert differences(source, mirror) == []

    # Round 2: modify two files, add one.  All at one time after the Resource List.
    t2 = time.time() + 1
    source.write("a.txt", b"alpha, second version\n", t2)
    source.write("b.txt", b"bravo, second version\n", t2)
    source.write("e.txt", b"echo, new\n", t2)
    source.write_changelist()
    source.write_resourcelist()  # the reference for the next round's Change List
    assert sorted(changes(source)) == [
        (source.url("res/a.txt"), ChangeType.UPDATED),
        (source.url("res/b.txt"), ChangeType.UPDATED),
        (source.url("res/e.txt"), ChangeType.CREATED),
    ]
    out = subscribe_once(rsnotify_process, source, mirror)
    assert "(3 applied, 0 failed)" in out, out
    assert differences(source, mirror) == []

    # Round 3: delete a file modified last round, add one with an odd name.
    t3 = t2 + 1
    (source.files / "b.txt").unlink()
    source.write("sub/new file ü.txt", b"a late addition\n", t3)
    source.write_changelist()
    assert [change for _, change in changes(source)] == [ChangeType.DELETED, ChangeType.CREATED]
    out = subscribe_once(rsnotify_process, source, mirror)
    assert "(2 applied, 0 failed)" in out, out
    assert differences(source, mirror) == []
    assert not path_for(source.url("res/b.txt"), mirror).exists()

    # Nothing new: a fourth run applies nothing and the mirror stays equal.
    out = subscribe_once(rsnotify_process, source, mirror)
    assert "(0 applied, 0 failed)" in out, out
    assert differences(source, mirror) == []


def test_once_strict_ends_with_a_clear_error_on_a_change_list_out_of_order(
    tmp_path: Path,
    process_factory: Callable[..., ManagedProcess],
    rsnotify_process: RunProcess,
) -> None:
    """resync-build's natural output after an update and a deletion is out of order.

    It lists the update (this round's time) before the deletion (the deleted
    file's old time).  With ``--strict`` the subscriber must not guess, nor
    retry forever: ``--once`` exits non-zero naming the problem and the entry,
    and leaves the mirror as it was.  By default (lenient about order) the
    same list is applied, the back-dated deletion included.
    """
    source, _ = served_source(tmp_path, process_factory)
    mirror = tmp_path / "mirror"
    t0 = time.time() - 3600
    source.write("a.txt", b"alpha\n", t0)
    source.write("b.txt", b"bravo\n", t0)
    source.publish_initial()
    subscribe_once(rsnotify_process, source, mirror)
    before = {p: p.read_bytes() for p in mirror.rglob("*") if p.is_file()}

    source.write("a.txt", b"alpha, second version\n", time.time() + 1)
    (source.files / "b.txt").unlink()
    source.write_changelist()
    assert changes(source) == [
        (source.url("res/a.txt"), ChangeType.UPDATED),
        (source.url("res/b.txt"), ChangeType.DELETED),
    ]
    process = rsnotify_process(
        "subscribe", source.base, "--into", str(mirror), "--once", "--strict"
    )
    assert process.wait(timeout=60) == 1, process.tail()
    said = process.output("stdout")
    assert "not in forward chronological order" in said, said
    assert source.url("res/b.txt") in said, said
    assert {p: p.read_bytes() for p in mirror.rglob("*") if p.is_file()} == before
    subscribe_once(rsnotify_process, source, mirror)  # lenient about order: the default
    assert differences(source, mirror) == []


def test_once_baselines_from_a_resource_dump_built_by_resync(
    tmp_path: Path,
    process_factory: Callable[..., ManagedProcess],
    rsnotify_process: RunProcess,
) -> None:
    """A Resource Dump (ZIP + manifest by ``resync-build --write-resourcedump``) is the
    baseline: the mirror is filled from the package, not one request per resource."""
    source, server = served_source(tmp_path, process_factory)
    www = source.root
    t0 = time.time() - 3600
    for i in range(20):
        source.write(f"d/{i:02d}.txt", f"resource {i}\n".encode() * (i + 1), t0)
    source.write("odd name ü.txt", b"odd\n", t0)
    source.publish_initial()
    (www / "dump").mkdir()
    source.build(
        "--write-resourcedump", "--hash", "md5", "--hash", "sha-256",
        "--outfile", str(www / "dump" / "part.zip"),
        source.mapping(),
    )  # fmt: skip
    (package,) = (www / "dump").glob("*.zip")
    body = package.read_bytes()
    dump_at = w3cdt.format(datetime.fromtimestamp(time.time(), UTC))
    (www / "resourcedump.xml").write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
        'xmlns:rs="http://www.openarchives.org/rs/terms/">'
        f'<rs:ln rel="up" href="{source.url("capabilitylist.xml")}"/>'
        f'<rs:md capability="resourcedump" at="{dump_at}"/>'
        f"<url><loc>{source.url('dump/' + package.name)}</loc>"
        f'<rs:md type="application/zip" length="{len(body)}" '
        f'hash="sha-256:{hashlib.sha256(body).hexdigest()}"/></url></urlset>'
    )
    source.build(
        "--write-capabilitylist",
        f"resourcelist={source.url('resourcelist.xml')},"
        f"resourcedump={source.url('resourcedump.xml')},"
        f"changelist={source.url('changelist.xml')}",
        "--sourcedescription-link", source.url(".well-known/resourcesync"),
        "--outfile", str(www / "capabilitylist.xml"),
    )  # fmt: skip
    mirror = tmp_path / "mirror"
    out = subscribe_once(rsnotify_process, source, mirror)
    assert "baseline: 21 files" in out and "1 Resource Dump package(s)" in out, out
    assert differences(source, mirror) == []
    requests = server.output("stderr")
    assert f"GET /dump/{package.name}" in requests
    assert "GET /res/" not in requests, requests  # nothing fetched one by one

    # Later changes still come from the Change List, on top of the dump's state.
    source.write("d/03.txt", b"changed after the dump\n", time.time() + 1)
    source.write_changelist()
    out = subscribe_once(rsnotify_process, source, mirror)
    assert "(1 applied, 0 failed)" in out, out
    assert differences(source, mirror) == []
