"""Change Dump (Z39.99 section 13): the simulator's packages, and catching up from them.

The simulator's ``--change-dump`` packages each closed Change List; a
Destination that missed many changes takes their bitstreams from those
packages instead of one GET per resource.  Every member is checked against
its manifest and the Change List, member names are never paths, and a
hostile package is refused or falls back to fetching.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Callable
from pathlib import Path

from rsnotify import sitemap
from rsnotify.model import Capability, ChangeType, parse_hashes
from tests.devstack import ManagedProcess
from tests.groundtruth import mirror_differences
from tests.helpers import get_json as get_json_sync
from tests.helpers import post_json
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
    assert "Change Dump package(s)" in catching.output()
    assert not list((tmp_path / "state").rglob("*.zip"))  # packages removed once read
