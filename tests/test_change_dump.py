"""Change Dump (Z39.99 section 13): the simulator's packages, and catching up from them.

The simulator's ``--change-dump`` packages each closed Change List; a
Destination that missed many changes takes their bitstreams from those
packages instead of one GET per resource.  Every member is checked against
its manifest and the Change List, member names are never paths, and a
hostile package is refused or falls back to fetching.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import zipfile
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from rsnotify import sitemap, w3cdt
from rsnotify.model import Capability, ChangeType, Entry, parse_hashes
from rsnotify.subscriber.applier import Outcome
from rsnotify.subscriber.changedump import Packaged, bodies_from_change_dump, extract, key_of
from tests.devstack import ManagedProcess
from tests.groundtruth import mirror_differences
from tests.helpers import get_json as get_json_sync
from tests.helpers import post_json, read_apply_log
from tests.test_applier import Env, Source, _zip, at, env, fixity, source  # noqa: F401  (fixtures)
from tests.test_simulator import body, get_json, post, running


async def test_the_simulator_packages_every_closed_change_list_with_its_manifest() -> None:
    async with running(change_dump=True, resources=5, changelist_size=10) as (sim, session):
        base = sim.url
        capabilities = sitemap.parse(await body(session, f"{base}c1/capabilitylist.xml"))
        found = {e.capability: e.loc for e in capabilities}
        assert found[Capability.CHANGEDUMP] == f"{base}c1/changedump.xml"
        await post(session, f"{base}_simulator/advance?n=35")
        dump = sitemap.parse(await body(session, found[Capability.CHANGEDUMP]))
        assert dump.capability == Capability.CHANGEDUMP and dump.from_ is not None
        assert dump.up == f"{base}c1/capabilitylist.xml"
        index = sitemap.parse(await body(session, found[Capability.CHANGELIST]))
        closed = [e for e in index.entries if e.until is not None]
        assert len(closed) == 3 and len(dump.entries) == 3  # the open list has no package
        for package, listed in zip(dump.entries, closed, strict=True):
            assert (package.from_, package.until) == (listed.from_, listed.until)
            data = await body(session, package.loc)
            assert package.type == "application/zip" and package.length == len(data)
            assert parse_hashes(package.hash)["sha-256"] == hashlib.sha256(data).hexdigest()
            changelist = sitemap.parse(await body(session, listed.loc))
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                manifest = sitemap.parse(archive.read("manifest.xml"))
                assert manifest.capability == Capability.CHANGEDUMP_MANIFEST
                assert (manifest.from_, manifest.until) == (changelist.from_, changelist.until)
                assert len(manifest.entries) == len(changelist.entries) == 10
                for member, change in zip(manifest.entries, changelist.entries, strict=True):
                    assert (member.loc, member.change, member.change_time) == (
                        change.loc, change.change, change.change_time,
                    )  # fmt: skip
                    assert (member.hash, member.length) == (change.hash, change.length)
                    if change.change is ChangeType.DELETED:
                        assert member.path is None
                        continue
                    assert member.path is not None and member.path.startswith("/")
                    bits = archive.read(member.path[1:])
                    assert len(bits) == member.length
                    assert parse_hashes(member.hash)["md5"] == hashlib.md5(bits).hexdigest()
        stats = await get_json(session, f"{base}_simulator/stats")
        assert stats["package_gets"] == 3 and stats["resource_gets"] == 0


async def test_without_the_option_there_is_no_change_dump() -> None:
    async with running(resources=2, changelist_size=2) as (sim, session):
        await post(session, f"{sim.url}_simulator/advance?n=5")
        capabilities = sitemap.parse(await body(session, f"{sim.url}c1/capabilitylist.xml"))
        assert Capability.CHANGEDUMP not in {e.capability for e in capabilities}
        async with session.get(f"{sim.url}c1/changedump.xml") as response:
            assert response.status == 404


# --- a Destination catching up from the Change Dump -------------------------------------


def test_a_destination_away_for_many_changes_catches_up_from_the_packages(
    rsnotify_process: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    """The mirror equals the Source, and the packages replace nearly every resource GET."""
    changes, per_list = 1200, 100
    simulator = rsnotify_process(
        "simulate", "--port", "0", "--rate", "0", "--resources", "300", "--seed", "3",
        "--changelist-size", str(per_list), "--change-dump", "--quiet",
    )  # fmt: skip
    base = simulator.wait_for_line(r"serving (http://\S+)", timeout=60).group(1)
    argv = ("subscribe", base, "--into", str(tmp_path / "mirror"),
            "--state", str(tmp_path / "state"), "--once", "--log-format", "text")  # fmt: skip
    first = rsnotify_process(*argv, name="baseline")
    assert first.wait(timeout=120) == 0, first.tail()
    before_at = datetime.now(UTC)  # every change of the walk is later
    post_json(f"{base}_simulator/advance?n={changes + per_list // 2}")  # the last list open
    before = get_json_sync(f"{base}_simulator/stats")
    catching = rsnotify_process(*argv, name="catch-up")
    assert catching.wait(timeout=120) == 0, catching.tail()
    after = get_json_sync(f"{base}_simulator/stats")
    truth = get_json_sync(f"{base}_simulator/state")
    assert mirror_differences(truth, tmp_path / "mirror") == []
    gets = after["resource_gets"] - before["resource_gets"]
    assert after["package_gets"] - before["package_gets"] == changes // per_list, catching.output()
    # Only the open list's changes (at most per_list // 2 resources) are fetched one by one.
    assert gets <= per_list // 2, catching.tail()
    output = catching.output()
    assert "Change Dump package(s)" in output
    # Changes a later one of the walk supersedes are recorded at once, never fetched.
    assert "superseded by newer ones of the same walk" in output
    assert not list((tmp_path / "state").rglob("*.zip"))  # packages removed once read
    # Deletions too: a deletion the walk lists a later change of is not carried out
    # (that change writes or deletes the file), and the mirror still equals the Source.
    records = asyncio.run(read_apply_log(tmp_path / "mirror", tmp_path / "state"))
    baseline_end = max(r.id for r in records if r.datetime <= before_at)
    walk = [r for r in records if r.id > baseline_end]
    later: dict[str, datetime] = {}
    for record in walk:
        later[record.loc] = max(later.get(record.loc, record.datetime), record.datetime)
    deletions = [r for r in walk if r.change is ChangeType.DELETED]
    superseded = [r for r in deletions if r.outcome == Outcome.SUPERSEDED.value]
    carried_out = [r for r in deletions if r.outcome == Outcome.DELETED.value]
    assert superseded and carried_out, Counter(r.outcome for r in deletions)
    assert all(later[r.loc] > r.datetime for r in superseded)
    assert all(later[r.loc] == r.datetime for r in carried_out), "a moot deletion ran"


# --- hostile packages: refused, or fetched instead; never outside the mirror ---------------

MANIFEST_HEAD = (
    '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
    'xmlns:rs="http://www.openarchives.org/rs/terms/">'
)


def _change(mirror_env: Env, path: str, body: bytes, when: datetime) -> Entry:
    return Entry(
        loc=mirror_env.source.url(path), change=ChangeType.UPDATED, datetime=when,
        hash=fixity(body), length=len(body),
    )  # fmt: skip


def _manifest_entry(change: Entry, member: str, *, body: bytes | None = None) -> str:
    """The manifest's word for ``change``: its own, or that of ``body`` when it lies."""
    stated = f'length="{change.length}" hash="{change.hash}"'
    if body is not None:
        stated = f'length="{len(body)}" hash="{fixity(body)}"'
    return (
        f"<url><loc>{change.loc}</loc><lastmod>{w3cdt.format(change.change_time)}</lastmod>"
        f'<rs:md change="updated" {stated} path="{member}"/></url>'
    )


def _serve_dump(mirror_env: Env, package: bytes, *, length: int | None = None) -> str:
    served = mirror_env.source
    served.files["/dump/p1.zip"] = package
    served.files["/changedump.xml"] = (
        MANIFEST_HEAD + '<rs:md capability="changedump" from="2024-05-01T00:00:00Z"/>'
        f"<url><loc>{served.url('/dump/p1.zip')}</loc>"
        f'<rs:md type="application/zip" length="{length or len(package)}" '
        'from="2024-05-01T00:00:00Z" until="2024-05-02T00:00:00Z"/></url></urlset>'
    ).encode()
    return served.url("/changedump.xml")


async def _apply_with_dump(
    mirror_env: Env, changes: list[Entry], url: str, workdir: Path
) -> Packaged:
    packaged = await bodies_from_change_dump(
        mirror_env.fetcher, url, changes, workdir=workdir,
        allowed_origins=[mirror_env.source.base],
        min_bodies=1,
    )  # fmt: skip
    applier = mirror_env.applier()
    futures = [applier.submit(c, body=packaged.bodies.get(key_of(c))) for c in changes]  # type: ignore[arg-type]
    assert [await f for f in futures] == [Outcome.APPLIED] * len(changes)
    return packaged


async def test_a_hostile_change_dump_package_is_refused_member_by_member(
    env: Env,  # noqa: F811  (the fixture imported above)
    source: Source,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Traversal names are only looked up; bombs, lies and gaps fall back to a fetch."""
    bodies = {p: f"the true bytes of {p}".encode() for p in
              ("/r/good", "/r/lying", "/r/bomb", "/r/absent", "/r/claims")}  # fmt: skip
    source.files.update(bodies)
    changes = [_change(env, p, b, at(i)) for i, (p, b) in enumerate(bodies.items())]
    good, lying, bomb, absent, claims = changes
    manifest = (
        MANIFEST_HEAD
        + '<rs:md capability="changedump-manifest" from="2024-05-01T00:00:00Z"/>'
        + _manifest_entry(good, "/../../../etc/good")
        + _manifest_entry(lying, "/lying")  # the member's bytes are not what it says
        + _manifest_entry(bomb, "/bomb")  # 50 MB behind a length of a few bytes
        + _manifest_entry(absent, "/absent")  # no such member
        + _manifest_entry(claims, "/claims", body=b"other bytes")  # disagrees with the list
        + "<url><loc>http://elsewhere.example/x</loc><lastmod>2024-05-01T12:00:10Z</lastmod>"
        '<rs:md change="created" length="1" path="/../../x"/></url>'  # no such change
         + "</urlset>"
    )
    package = _zip(
        {
            "../../../etc/good": bodies["/r/good"],
            "lying": b"x" * len(bodies["/r/lying"]),
            "bomb": b"0" * 50_000_000,
            "claims": b"other bytes",
            "../../x": b"x",
        },
        manifest,
    )
    packaged = await _apply_with_dump(env, changes, _serve_dump(env, package), tmp_path / "state")
    assert list(packaged.bodies) == [key_of(good)] and packaged.packages == 1, packaged.refused
    for path, data in bodies.items():
        assert env.path(path).read_bytes() == data
    assert sorted(p for p in source.requests if p.startswith("/r/")) == [
        "/r/absent", "/r/bomb", "/r/claims", "/r/lying",
    ]  # fmt: skip  # the good member came from the package; the others were fetched
    assert len(packaged.refused) == 4, packaged.refused
    assert not (tmp_path / "etc").exists() and not (tmp_path / "x").exists()
    assert all(p.is_relative_to(env.mirror.root) for p in env.mirror.root.rglob("*"))
    assert not list((tmp_path / "state").glob("*.zip"))


async def test_a_member_whose_zip_entry_lies_about_its_size_is_not_used(tmp_path: Path) -> None:
    """A ZIP directory that promises fewer bytes than the member holds (a disguised bomb)."""
    data = b"A" * 4000
    when = datetime(2024, 5, 1, 12, tzinfo=UTC)
    change = Entry(loc="http://s.example/r", change=ChangeType.UPDATED, datetime=when,
                   hash=fixity(data[:10]), length=10)  # fmt: skip
    package = _zip({"m": data}, MANIFEST_HEAD
                   + '<rs:md capability="changedump-manifest" from="2024-05-01T00:00:00Z"/>'
                   + _manifest_entry(change, "/m") + "</urlset>")  # fmt: skip
    # Rewrite the member's declared size (local header and central directory) to 10.
    real = (4000).to_bytes(4, "little")
    package = package.replace(real + real, (10).to_bytes(4, "little") * 2)
    path = tmp_path / "p.zip"
    path.write_bytes(package)
    result = Packaged()
    extract(path, "p.zip", {key_of(change): change}, result)  # type: ignore[dict-item]
    assert result.bodies == {} and len(result.refused) == 1, result.refused


async def test_an_unusable_package_means_every_change_is_fetched(
    env: Env,  # noqa: F811  (the fixture imported above)
    source: Source,  # noqa: F811
    tmp_path: Path,
) -> None:
    source.files["/r/a"] = b"bytes of a"
    change = _change(env, "/r/a", b"bytes of a", at(1))
    url = _serve_dump(env, b"this is not a ZIP file")
    packaged = await _apply_with_dump(env, [change], url, tmp_path / "state")
    assert packaged.bodies == {} and source.requests.count("/r/a") == 1
    # A package whose advertised length disagrees is not even opened.
    package = _zip({"a": b"bytes of a"}, "<urlset/>")
    url = _serve_dump(env, package, length=len(package) + 1)
    later = _change(env, "/r/a", b"bytes of a", at(2))
    packaged = await _apply_with_dump(env, [later], url, tmp_path / "state")
    assert packaged.bodies == {} and packaged.packages == 0
    assert not list((tmp_path / "state").glob("*.zip"))
