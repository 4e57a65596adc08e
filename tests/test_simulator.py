"""The simulated Source: its pure core, its documents and its HTTP behaviour.

Why one module of ~660 lines: it tests one component, the simulated Source, from its pure
core (``make_source``) to its HTTP server and ``--dir`` copy, the server tests sharing the
``running`` context and its small HTTP helpers (``fetch``, ``body``, ``get_json``); its
resync and CLI tests are already apart.

Most tests run the real aiohttp server in-process on a free loopback port and
talk to it with a real HTTP client; the reference-client and CLI tests are in
``test_simulator_resync.py``.  Changes are driven with
``POST /_simulator/advance`` so nothing depends on the clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from rsnotify import sitemap, w3cdt
from rsnotify.discovery import CHANNEL_REL
from rsnotify.model import ChangeType, Document
from rsnotify.simulator import payload
from rsnotify.simulator.diskwriter import MARKER, SPARE_DIR
from rsnotify.simulator.server import Simulator, SimulatorConfig
from rsnotify.simulator.site import Representation, Site
from rsnotify.simulator.source import Layout, SimulatorError, Source, Weights
from tests.devstack import async_wait_for, free_port
from tests.spares import require_spares

T0 = datetime(2024, 1, 1, 12, 0, 0, tzinfo=UTC)
LAYOUT = Layout("http://example.org/")


def make_source(**options: Any) -> Source:
    options.setdefault("layout", LAYOUT)
    options.setdefault("start", T0)
    options.setdefault("seed", 1)
    return Source(**options)


@contextlib.asynccontextmanager
async def running(**options: Any) -> AsyncIterator[tuple[Simulator, aiohttp.ClientSession]]:
    options.setdefault("rate", 0)
    options.setdefault("seed", 7)
    async with Simulator(SimulatorConfig(**options)) as sim, aiohttp.ClientSession() as session:
        yield sim, session


async def fetch(
    session: aiohttp.ClientSession, url: str, **headers: str
) -> tuple[int, CIMultiDict[str], bytes]:
    """(status, headers with case-insensitive names, body) of a GET."""
    async with session.get(url, headers=headers) as response:
        return response.status, response.headers.copy(), await response.read()


async def body(session: aiohttp.ClientSession, url: str) -> bytes:
    status, _, data = await fetch(session, url)
    assert status == 200, url
    return data


async def post(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.post(url) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as response:
        assert response.status == 200
        return await response.json()


def parse_exact(data: bytes) -> Document:
    """Parse a served document and check it is byte-for-byte the document layer's output."""
    document = sitemap.parse(data)
    assert sitemap.serialize(document) == data
    return document


# --- pure core -----------------------------------------------------------------


def test_change_times_strictly_increase_even_when_the_clock_stands_still() -> None:
    source = make_source(resources=5, changelist_size=7)
    applied = source.apply(50, T0) + source.apply(50, T0 - timedelta(hours=1))
    times = [a.change.datetime for a in applied]
    assert all(b - a == timedelta(microseconds=1) for a, b in itertools.pairwise(times))
    assert times[0] == T0 + timedelta(microseconds=1)  # strictly after the start (= from)


def test_same_seed_same_changes_different_seed_different_changes() -> None:
    def run(seed: int) -> tuple[list[tuple[str, str]], dict[str, object]]:
        source = make_source(resources=20, seed=seed, collections=3)
        applied = source.apply(500, T0 + timedelta(seconds=1))
        return [(a.change.loc, a.change.change.value) for a in applied], source.state()

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_every_kind_of_change_happens_including_recreation_of_deleted_uris() -> None:
    source = make_source(resources=10, resurrect=0.5)
    applied = source.apply(2000, T0 + timedelta(seconds=1))
    kinds = {a.change.change for a in applied}
    assert kinds == set(ChangeType)
    deleted: set[str] = set()
    recreated = 0
    for a in applied:
        if a.change.change is ChangeType.DELETED:
            deleted.add(a.change.loc)
        elif a.change.change is ChangeType.CREATED and a.change.loc in deleted:
            recreated += 1
    assert recreated > 0


def test_updates_and_deletes_fall_back_to_creation_when_nothing_is_live() -> None:
    source = make_source(resources=0, weights=Weights(created=0, updated=1, deleted=1))
    first = source.apply(1, T0 + timedelta(seconds=1))[0]
    assert first.change.change is ChangeType.CREATED


def test_rollover_closes_lists_contiguously() -> None:
    source = make_source(resources=5, changelist_size=10)
    applied = source.apply(35, T0 + timedelta(seconds=1))
    closed = [a.closed for a in applied if a.closed is not None]
    assert [c.number for c in closed] == [1, 2, 3]
    lists = source.collections[0].changelists
    assert [cl.count for cl in lists] == [10, 10, 10, 5]
    for a, b in itertools.pairwise(lists):
        assert a.until is not None and a.until == b.from_
    assert lists[0].from_ == T0 and lists[-1].until is None


def test_payload_is_a_pure_function_and_fixity_describes_it() -> None:
    data = payload.body(9, "http://x/r", 3, 1000)
    assert data == payload.body(9, "http://x/r", 3, 1000)
    assert data != payload.body(9, "http://x/r", 4, 1000)
    assert 500 <= len(data) <= 1500
    fixity = payload.fixity(9, "http://x/r", 3, 1000)
    assert fixity.length == len(data)
    assert fixity.sha256 == hashlib.sha256(data).hexdigest()
    assert fixity.md5 == hashlib.md5(data).hexdigest()
    assert payload.body(9, "http://x/r", 3, 0) == b""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("created=2,updated=1,deleted=0", Weights(2, 1, 0)),
        ("1,1,1", Weights(1, 1, 1)),
        ("deleted=5", Weights(1, 3, 5)),
    ],
)
def test_weights_parse(text: str, expected: Weights) -> None:
    assert Weights.parse(text) == expected


@pytest.mark.parametrize("text", ["", "a=1", "1,2", "created=x", "0,0,0", "created=-1"])
def test_bad_weights_are_refused_clearly(text: str) -> None:
    with pytest.raises(SimulatorError):
        Weights.parse(text)


@pytest.mark.parametrize(
    "options",
    [
        {"collections": 0},
        {"changelist_size": 0},
        {"spec_version": "2.0"},
        {"resources": -1},
        {"payload_bytes": -5},
        {"max_changes": -1},
        {"hubs": ["not a url"]},
    ],
)
def test_bad_source_options_are_refused_clearly(options: dict[str, Any]) -> None:
    with pytest.raises(SimulatorError):
        make_source(**options)


def test_spec_version_decides_datetime_versus_lastmod() -> None:
    for version, has_datetime in (("1.0", False), ("1.1", True)):
        source = make_source(resources=3, spec_version=version)
        site = Site(source)
        site.apply(5, T0 + timedelta(seconds=1))
        collection = source.collections[0]
        document = parse_exact(site.open_changelist(collection).body)
        for entry in document:
            assert entry.lastmod is not None
            assert (entry.datetime is not None) is has_datetime
            assert entry.change_time == entry.lastmod


def test_spliced_change_lists_equal_whole_document_serialization() -> None:
    source = make_source(resources=30, changelist_size=40)
    site = Site(source)
    collection = source.collections[0]
    now = T0 + timedelta(seconds=1)
    for batch in (1, 3, 17, 9):  # grow the open list in uneven steps, rendering each time
        site.apply(batch, now)
        expected = sitemap.serialize(source.changelist(collection, 1))
        assert site.open_changelist(collection).body == expected
    site.apply(40, now)  # closes list 1 (partly rendered) and fills list 2 to 30
    closed = site.closed_changelists()["/c1/changes/000001.xml"]
    document = parse_exact(closed.body)
    assert len(document) == 40 and document.until is not None


def test_last_modified_validates_only_when_its_second_names_one_version() -> None:
    source = make_source(resources=50)
    site = Site(source)
    collection = source.collections[0]
    later = T0 + timedelta(seconds=5)
    site.apply(400, later)  # all within one second: many resources change twice
    twice = once = None
    for record in collection.live_records():
        if record.previous_modified is not None and record.previous_modified >= later:
            twice = record
        elif record.previous_modified == T0:
            once = record
    assert twice is not None and once is not None
    stamp = later.replace(microsecond=0)
    rep_twice = site.resource(collection, twice.name)
    rep_once = site.resource(collection, once.name)
    assert rep_twice is not None and rep_once is not None
    assert not rep_twice.not_modified(None, stamp)  # ambiguous second: send it again
    assert rep_once.not_modified(None, stamp)
    assert rep_once.not_modified(None, stamp + timedelta(seconds=1))
    assert not rep_once.not_modified(None, stamp - timedelta(seconds=1))
    assert rep_once.not_modified(f'"x", W/{rep_once.etag}', None)
    assert not rep_once.not_modified('"x"', stamp)  # If-None-Match wins over the date


def test_representation_etags_follow_the_bytes() -> None:
    a = Representation.document(b"<a/>", T0, None)
    b = Representation.document(b"<b/>", T0, a)
    assert a.etag != b.etag and a.etag.startswith('"') and a.etag.endswith('"')
    assert a.second_is_unique and not b.second_is_unique


# --- HTTP: documents ---------------------------------------------------------------


async def test_twenty_thousand_changes_form_a_correct_replayable_history() -> None:
    async with running(resources=300, changelist_size=1000) as (sim, session):
        base = sim.url
        cap = f"{base}c1/capabilitylist.xml"
        initial = parse_exact(await body(session, f"{base}c1/resourcelist.xml"))
        assert initial.at is not None and initial.completed is not None
        assert initial.up == cap
        assert await post(session, f"{base}_simulator/advance?n=20000") == {
            "applied": 20000,
            "changes": 20000,
        }

        index = parse_exact(await body(session, f"{base}c1/changelist.xml"))
        assert index.is_index and index.capability == "changelist" and index.up == cap
        lists = index.entries
        assert len(lists) == 21
        assert all(e.until is not None and e.lastmod == e.until for e in lists[:20])
        assert lists[20].until is None and lists[20].lastmod is None
        assert lists[0].from_ == index.from_
        for a, b in itertools.pairwise(lists):
            assert a.from_ is not None and a.until is not None
            assert a.from_ < a.until == b.from_

        replay = {e.loc: e.hashes()["sha-256"] for e in initial}
        seen: set[tuple[str, datetime]] = set()
        last: datetime | None = None
        for number, item in enumerate(lists):
            document = parse_exact(await body(session, item.loc))
            assert document.capability == "changelist" and not document.is_index
            assert (document.from_, document.until) == (item.from_, item.until)
            assert document.up == cap and document.index == f"{base}c1/changelist.xml"
            assert len(document) == (1000 if number < 20 else 0)
            for entry in document:
                when = entry.change_time
                assert when is not None and entry.datetime == entry.lastmod == when
                assert document.from_ is not None and document.from_ < when
                assert document.until is None or when <= document.until
                assert last is None or when > last
                last = when
                assert (entry.loc, when) not in seen
                seen.add((entry.loc, when))
                if entry.change is ChangeType.DELETED:
                    assert (entry.hash, entry.length, entry.type) == (None, None, None)
                    del replay[entry.loc]  # KeyError: deleting what does not exist
                else:
                    hashes = entry.hashes()
                    assert set(hashes) == {"md5", "sha-256"}
                    assert entry.length is not None and entry.type == "text/plain"
                    assert (entry.loc in replay) is (entry.change is ChangeType.UPDATED)
                    replay[entry.loc] = hashes["sha-256"]
            if document.until is not None:
                assert document.entries[-1].change_time == document.until
        assert initial.at < lists[0].until  # type: ignore[operator]

        state = await get_json(session, f"{base}_simulator/state")
        truth = state["collections"][cap]
        assert replay == truth["resources"]
        assert truth["changes"] == 20000
        assert last is not None and truth["last_change"] == w3cdt.format(last)

        # The resources themselves are what the entries and the ground truth say.
        for loc in sorted(truth["resources"])[:25]:
            status, headers, data = await fetch(session, loc)
            assert status == 200
            assert hashlib.sha256(data).hexdigest() == truth["resources"][loc]
            assert int(headers["Content-Length"]) == len(data)


async def test_discovery_chain_and_links() -> None:
    hubs = ("mqtt://127.0.0.1:1884/rs/{collection}/changes", "ws://127.0.0.1:8765/{collection}")
    async with running(collections=3, resources=4, hubs=hubs) as (sim, session):
        base = sim.url
        description = parse_exact(await body(session, f"{base}.well-known/resourcesync"))
        assert description.capability == "description"
        caps = [e.loc for e in description]
        assert caps == [f"{base}c{i}/capabilitylist.xml" for i in (1, 2, 3)]
        state = await get_json(session, f"{base}_simulator/state")
        assert list(state["collections"]) == caps
        for cap in caps:
            capability_list = parse_exact(await body(session, cap))
            assert capability_list.capability == "capabilitylist"
            assert capability_list.up == f"{base}.well-known/resourcesync"
            name = cap[len(base) :].split("/")[0]
            assert [ln.href for ln in capability_list.links_with(CHANNEL_REL)] == [
                h.replace("{collection}", name) for h in hubs
            ]
            found = {e.capability: e.loc for e in capability_list}
            assert set(found) == {"resourcelist", "changelist"}
            resource_list = parse_exact(await body(session, found["resourcelist"]))
            assert resource_list.capability == "resourcelist" and resource_list.up == cap
            assert resource_list.at == resource_list.completed
            assert len(resource_list) == 4
            changelist_index = parse_exact(await body(session, found["changelist"]))
            assert changelist_index.is_index and changelist_index.up == cap


async def test_large_resource_list_becomes_an_index_with_parts() -> None:
    async with running(resources=25, resourcelist_size=10) as (sim, session):
        base = sim.url
        await post(session, f"{base}_simulator/advance?n=30")
        index = parse_exact(await body(session, f"{base}c1/resourcelist.xml"))
        assert index.is_index and index.capability == "resourcelist" and index.at is not None
        locs: list[str] = []
        for item in index:
            part = parse_exact(await body(session, item.loc))
            assert not part.is_index and part.at == index.at
            assert part.index == f"{base}c1/resourcelist.xml"
            assert part.up == f"{base}c1/capabilitylist.xml"
            assert len(part) <= 10
            locs.extend(e.loc for e in part)
        state = await get_json(session, f"{base}_simulator/state")
        truth = state["collections"][f"{base}c1/capabilitylist.xml"]["resources"]
        assert sorted(locs) == sorted(truth)


# --- HTTP: protocol -----------------------------------------------------------------


async def test_conditional_get_etag_and_last_modified() -> None:
    async with running(resources=5, changelist_size=3) as (sim, session):
        base = sim.url
        await post(session, f"{base}_simulator/advance?n=1")
        url = f"{base}c1/changes/000001.xml"
        status, headers, data = await fetch(session, url)
        assert status == 200 and headers["Content-Type"] == "application/xml"
        assert int(headers["Content-Length"]) == len(data)
        etag = headers["ETag"]
        status, again, data304 = await fetch(session, url, **{"If-None-Match": etag})
        assert (status, data304, again["ETag"]) == (304, b"", etag)
        assert (await fetch(session, url, **{"If-None-Match": "*"}))[0] == 304
        assert (await fetch(session, url, **{"If-None-Match": '"other"'}))[0] == 200

        await post(session, f"{base}_simulator/advance?n=1")
        status, changed, _ = await fetch(session, url, **{"If-None-Match": etag})
        assert status == 200 and changed["ETag"] != etag

        await post(session, f"{base}_simulator/advance?n=1")  # closes list 1: until added
        status, closed, data = await fetch(session, url, **{"If-None-Match": changed["ETag"]})
        assert status == 200 and parse_exact(data).until is not None
        status, _, _ = await fetch(session, url, **{"If-None-Match": closed["ETag"]})
        assert status == 304

        # The Source Description has a single version: its Last-Modified validates.
        sd = f"{base}.well-known/resourcesync"
        _, headers, _ = await fetch(session, sd)
        status, _, _ = await fetch(session, sd, **{"If-Modified-Since": headers["Last-Modified"]})
        assert status == 304


async def test_head_resources_link_header_and_not_found() -> None:
    async with running(resources=3) as (sim, session):
        base = sim.url
        loc = f"{base}c1/resources/r000001.txt"
        status, headers, data = await fetch(session, loc)
        assert status == 200
        assert headers["Link"] == f'<{base}c1/capabilitylist.xml>; rel="resourcesync"'
        assert headers["Content-Type"] == "text/plain"
        assert headers["ETag"] and headers["Last-Modified"]
        async with session.head(loc) as response:
            assert response.status == 200
            assert int(response.headers["Content-Length"]) == len(data)
            assert await response.read() == b""
        status, headers, _ = await fetch(session, f"{base}.well-known/resourcesync")
        assert "Link" not in headers
        for missing in ("c1/resources/nope.txt", "c9/changelist.xml", "c1/changes/000002.xml", "x"):
            assert (await fetch(session, base + missing))[0] == 404


async def test_deleted_resources_disappear() -> None:
    async with running(resources=20, weights=Weights(0, 0, 1)) as (sim, session):
        base = sim.url
        await post(session, f"{base}_simulator/advance?n=5")
        document = parse_exact(await body(session, f"{base}c1/changes/000001.xml"))
        assert [e.change for e in document] == [ChangeType.DELETED] * 5
        for entry in document:
            assert (await fetch(session, entry.loc))[0] == 404


async def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    async with running(resources=2) as (sim, _):
        host, port = sim.url.split("//")[1].rstrip("/").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            request = f"GET /c1/capabilitylist.xml HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
            writer.write(request + request)  # pipelined on one connection
            await writer.drain()
            for _ in range(2):
                status = await reader.readline()
                assert status.startswith(b"HTTP/1.1 200")
                length = 0
                while (line := await reader.readline()) != b"\r\n":
                    name, _, value = line.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                    assert name.lower() != "connection" or "close" not in value.lower()
                assert (await reader.readexactly(length)).startswith(b"<?xml")
        finally:
            writer.close()
            await writer.wait_closed()


async def test_concurrent_clients_see_consistent_documents() -> None:
    async with running(resources=10, changelist_size=10_000) as (sim, session):
        base = sim.url
        url = f"{base}c1/changes/000001.xml"

        async def client() -> list[bytes]:
            seen = []
            async with aiohttp.ClientSession() as own:
                for _ in range(10):
                    seen.append(await body(own, url))
            return seen

        async def changer() -> None:
            for _ in range(10):
                await post(session, f"{base}_simulator/advance?n=25")

        results = await asyncio.gather(*(client() for _ in range(20)), changer())
        for bodies in results[:-1]:
            assert bodies is not None
            for data in bodies:
                parse_exact(data)  # never a torn or inconsistent document
        final = parse_exact(await body(session, url))
        assert len(final) == 250


# --- control endpoints --------------------------------------------------------------


async def test_pause_freezes_the_generator_and_resume_restarts_it() -> None:
    async with running(rate=2000, resources=10) as (sim, session):
        base = sim.url

        async def stats() -> dict[str, Any]:
            return await get_json(session, f"{base}_simulator/stats")

        await async_wait_for(lambda: sim.source.total_changes > 50, message="no changes")
        paused = await post(session, f"{base}_simulator/pause")
        frozen = paused["changes"]
        ticks = (await stats())["generator_ticks"]
        await async_wait_for(
            lambda: sim.counters.ticks >= ticks + 10, message="generator not ticking"
        )
        current = await stats()
        assert current["changes"] == frozen and current["paused"] is True
        state = await get_json(session, f"{base}_simulator/state")
        assert state["collections"][f"{base}c1/capabilitylist.xml"]["changes"] == frozen

        await post(session, f"{base}_simulator/resume")
        await async_wait_for(
            lambda: sim.source.total_changes > frozen + 50, message="resume did not restart"
        )


async def test_advance_validates_and_respects_max_changes() -> None:
    async with running(resources=5, max_changes=30) as (sim, session):
        base = sim.url
        for bad in ("abc", "-1", "1e3", str(10**9)):
            async with session.post(f"{base}_simulator/advance?n={bad}") as response:
                assert response.status == 400
                assert "error" in await response.json()
        assert await post(session, f"{base}_simulator/advance?n=100") == {
            "applied": 30,
            "changes": 30,
        }
        assert (await post(session, f"{base}_simulator/advance?n=5"))["applied"] == 0
        stats = await get_json(session, f"{base}_simulator/stats")
        assert stats["finished"] is True and stats["changes"] == 30
        assert sum(stats["by_change"].values()) == 30
        assert (await fetch(session, f"{base}c1/changelist.xml"))[0] == 200  # still serving


async def test_generator_stops_at_max_changes() -> None:
    async with running(rate=5000, resources=5, max_changes=200) as (sim, session):
        await async_wait_for(lambda: sim.finished, message="generator never finished")
        ticks = sim.counters.ticks
        await async_wait_for(lambda: sim.counters.ticks >= ticks + 5)
        stats = await get_json(session, f"{sim.url}_simulator/stats")
        assert stats["changes"] == 200 and stats["responses"] == {}


# --- --dir -----------------------------------------------------------------------------


async def test_dir_copy_served_statically_equals_the_live_server(
    tmp_path: Path, process_factory: Any
) -> None:
    out = tmp_path / "site"
    async with running(
        rate=3000,
        collections=2,
        # 80 each: the resource count walks (creations and deletions 1:1, a few
        # hundred per collection before the pause lands); from 30 it once ended
        # at 16 or fewer, a Resource List without index parts, with the pause
        # landing late under load.
        resources=80,
        changelist_size=250,
        resourcelist_size=16,
        dir=out,
        flush_interval=0.05,
    ) as (sim, session):
        base = sim.url
        await async_wait_for(lambda: sim.source.total_changes > 1200, timeout=20)
        await post(session, f"{base}_simulator/pause")  # returns once the copy caught up
        port = free_port()
        static = process_factory(
            [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "-d", out, str(port)],
            name="http.server",
        )
        await asyncio.to_thread(static.wait_for_line, r"Serving HTTP")
        other = f"http://127.0.0.1:{port}/"

        async def both(url: str) -> tuple[tuple[int, bytes], tuple[int, bytes]]:
            assert url.startswith(base)
            live = await fetch(session, url)
            copy = await fetch(session, other + url[len(base) :])
            return (live[0], live[2]), (copy[0], copy[2])

        urls = [f"{base}.well-known/resourcesync"]
        state = await get_json(session, f"{base}_simulator/state")
        deleted: list[str] = []
        for cap, truth in state["collections"].items():
            urls.append(cap)
            capability_list = parse_exact(await body(session, cap))
            for entry in capability_list:
                urls.append(entry.loc)
                document = parse_exact(await body(session, entry.loc))
                if document.is_index:
                    urls.extend(e.loc for e in document)
                    if document.capability == "changelist":
                        for item in document:
                            changes = parse_exact(await body(session, item.loc))
                            deleted.extend(
                                e.loc
                                for e in changes
                                if e.change is ChangeType.DELETED
                                and e.loc not in truth["resources"]
                            )
            urls.extend(truth["resources"])
        assert len([u for u in urls if "/changes/" in u]) >= 6  # closed lists and open ones
        assert len([u for u in urls if "/resourcelist/" in u]) >= 4  # index parts
        assert deleted
        for url in urls:
            live, copy = await both(url)
            assert live[0] == 200 and live == copy, url
        for url in deleted[:20]:
            live, copy = await both(url)
            assert live[0] == copy[0] == 404, url


async def test_dir_copy_writes_a_change_at_once_not_at_the_next_flush_tick(
    tmp_path: Path,
) -> None:
    """The flush interval bounds how often the copy is written, not how late.

    A fixed timer made every change wait for its next tick (half the interval
    on average, inside every latency bench.e2e measured).
    """
    out = tmp_path / "site"
    async with running(rate=20, resources=10, dir=out, flush_interval=60) as (sim, _):

        def listed() -> bool:
            return any(b"<url>" in p.read_bytes() for p in out.rglob("changes/*.xml"))

        assert not listed()
        await async_wait_for(lambda: sim.source.total_changes > 0, timeout=10)
        await async_wait_for(listed, timeout=10, message="the change waited for the next tick")


@pytest.mark.parametrize("spare_inodes", [False, True], ids=["renames", "spare-inodes"])
async def test_dir_copy_reuses_retired_inodes_only_when_asked(
    tmp_path: Path, spare_inodes: bool
) -> None:
    """--spare-inodes is opt-in; either way the copy holds the live server's bytes."""
    if spare_inodes:
        require_spares(tmp_path)
    out = tmp_path / "out"
    async with running(dir=out, resources=5, spare_inodes=spare_inodes) as (sim, session):
        await post(session, f"{sim.url}_simulator/advance?n=40")  # returns once written
        state = await get_json(session, f"{sim.url}_simulator/state")
        (truth,) = state["collections"].values()
        for loc in truth["resources"]:
            live = await body(session, loc)
            assert (out / loc[len(sim.url) :]).read_bytes() == live, loc
    spare = out / SPARE_DIR
    assert (spare.is_dir() and any(spare.iterdir())) is spare_inodes


async def test_dir_refuses_a_foreign_directory_and_reuses_its_own(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    with pytest.raises(SimulatorError, match="not empty"):
        async with running(dir=foreign):
            pass
    assert (foreign / "precious.txt").read_text() == "keep me"

    out = tmp_path / "out"
    async with running(dir=out, resources=40):
        pass
    assert (out / MARKER).is_file() and (out / "c1/resources/r000040.txt").is_file()
    async with running(dir=out, resources=3, seed=99) as (sim, session):
        truth = (await get_json(session, f"{sim.url}_simulator/state"))["collections"]
    files = sorted(p.name for p in (out / "c1/resources").iterdir())
    live = truth[f"{sim.url}c1/capabilitylist.xml"]["resources"]
    assert files == sorted(loc.rsplit("/", 1)[1] for loc in live)
