"""The publisher against the real simulator: every Change List entry logged once, in order."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rsnotify import sitemap, w3cdt
from rsnotify.log import NotificationLog
from rsnotify.log.redis_log import RedisLog
from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.log.tail_cache import TailCache
from rsnotify.publisher import detection
from rsnotify.publisher.service import Publisher, PublisherConfig
from rsnotify.transport.topics import topic_level
from tests.devstack import Redis, async_wait_for
from tests.helpers import running_simulator


def simulator(**options: Any) -> Any:
    """The shared in-process simulator with this module's defaults."""
    return running_simulator(**{**dict(seed=7, resources=20), **options})


@asynccontextmanager
async def publisher(**options: Any) -> AsyncIterator[Publisher]:
    pub = Publisher(PublisherConfig(**options))
    await pub.start()
    try:
        yield pub
    finally:
        await pub.stop()


async def advance(session: aiohttp.ClientSession, base: str, n: int) -> None:
    async with session.post(f"{base}_simulator/advance?n={n}") as response:
        assert response.status == 200, await response.text()


async def change_list_entries(
    session: aiohttp.ClientSession, base: str, c: str, *, advertised: str | None = None
) -> list[tuple[str, str, str]]:
    """Every entry of a collection's Change Lists, in order, read the way a Destination would.

    ``advertised`` is the base URL written into the documents when it is not
    the simulator's own (``--base-url``): links are mapped back onto ``base``.
    """
    async with session.get(f"{base}{c}/changelist.xml") as response:
        index = sitemap.parse(await response.read())
    out = []
    for ref in index.entries:
        url = ref.loc.replace(advertised, base, 1) if advertised else ref.loc
        async with session.get(url) as response:
            for entry in sitemap.parse(await response.read()):
                out.append((entry.loc, w3cdt.format(entry.change_time), entry.change.value))
    return out


async def logged(log: NotificationLog, collection: str) -> list[dict[str, Any]]:
    records = []
    after = 0
    while batch := await log.read(collection, after, 5000):
        records.extend(batch)
        after = batch[-1].seq
    assert [r.seq for r in records] == list(range(1, len(records) + 1)), "seqs not dense from 1"
    return [json.loads(r.data) for r in records]


async def only_collection(pub: Publisher) -> str:
    (cid,) = pub.collections
    return cid


# 7: detection passes end mid-list and mid-burst, and resume across rollovers.
CHUNKS = pytest.mark.parametrize("chunk", [detection.DETECT_CHUNK, 7])


@CHUNKS
async def test_every_entry_is_logged_once_in_change_list_order_across_rollovers(
    tmp_path: Path, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(detection, "DETECT_CHUNK", chunk)
    async with (
        simulator(changelist_size=40, paused=True) as (sim, base),
        aiohttp.ClientSession() as http,
    ):
        async with publisher(
            source=base, state_dir=str(tmp_path), poll=0.05, from_beginning=True
        ) as pub:
            cid = await only_collection(pub)
            log = pub.log
            assert log is not None
            for burst in range(1, 6):  # several bursts, each crossing rollovers
                await advance(http, base, 97)
                await async_wait_for(
                    lambda n=burst * 97: _head_is(log, cid, n),
                    timeout=20,
                    message="publisher did not log every entry",
                )
            records = await logged(log, cid)
        expected = await change_list_entries(http, base, "c1")
        assert len(expected) == 485
        assert [(r["loc"], r["datetime"], r["change"]) for r in records] == expected
        assert all(
            r["collection"] == cid and r["capabilitylist"].endswith("/c1/capabilitylist.xml")
            for r in records
        )
        # Growing lists were read incrementally: some 206 (partial content) answers.
        assert sim.stats()["responses"].get("206", 0) > 0


async def _head_is(log: NotificationLog, cid: str, n: int) -> bool:
    head = await log.head(cid)
    assert head <= n, f"more entries logged ({head}) than exist ({n})"
    return head == n


@CHUNKS
async def test_a_restarted_publisher_resumes_without_duplicates_or_loss(
    tmp_path: Path, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(detection, "DETECT_CHUNK", chunk)
    async with (
        simulator(changelist_size=30, paused=True) as (_sim, base),
        aiohttp.ClientSession() as http,
    ):
        async with publisher(
            source=base, state_dir=str(tmp_path), poll=0.05, from_beginning=True
        ) as pub:
            cid = await only_collection(pub)
            await advance(http, base, 100)
            await async_wait_for(lambda: _head_is(pub.log, cid, 100), timeout=20)  # type: ignore[arg-type]
        await advance(http, base, 75)  # while the publisher is down: two rollovers
        async with publisher(source=base, state_dir=str(tmp_path), poll=0.05) as pub:
            await async_wait_for(lambda: _head_is(pub.log, cid, 175), timeout=20)  # type: ignore[arg-type]
            records = await logged(pub.log, cid)  # type: ignore[arg-type]
        assert [
            (r["loc"], r["datetime"], r["change"]) for r in records
        ] == await change_list_entries(http, base, "c1")


async def test_by_default_only_changes_after_the_first_start_are_published(tmp_path: Path) -> None:
    async with (
        simulator(changelist_size=25, paused=True) as (_sim, base),
        aiohttp.ClientSession() as http,
    ):
        await advance(http, base, 60)  # history before the publisher existed
        async with publisher(source=base, state_dir=str(tmp_path), poll=0.05) as pub:
            cid = await only_collection(pub)
            await async_wait_for(lambda: _checkpoint_started(pub.log, cid), timeout=20)  # type: ignore[arg-type]
            await advance(http, base, 10)
            await async_wait_for(lambda: _head_is(pub.log, cid, 10), timeout=20)  # type: ignore[arg-type]
            records = await logged(pub.log, cid)  # type: ignore[arg-type]
        history = await change_list_entries(http, base, "c1")
        assert [(r["loc"], r["datetime"], r["change"]) for r in records] == history[60:]


async def _checkpoint_started(log: NotificationLog, cid: str) -> bool:
    return await log.checkpoint(cid) is not None


async def test_a_watched_directory_source_two_collections_and_redis(
    tmp_path: Path, redis_server: Redis
) -> None:
    site = tmp_path / "site"
    async with (
        simulator(
            changelist_size=20, paused=True, collections=2, dir=site, base_url="http://source.test/"
        ) as (_sim, base),
        aiohttp.ClientSession() as http,
        publisher(
            source=str(site), redis=redis_server.url, poll=30.0, watch=True, from_beginning=True
        ) as pub,
    ):
        assert len(pub.collections) == 2
        await advance(http, base, 150)  # the simulator writes the directory before answering
        log = pub.log
        assert isinstance(log, TailCache) and isinstance(log.inner, RedisLog)

        async def all_logged() -> bool:
            heads = [await log.head(c) for c in pub.collections]
            return sum(heads) == 150

        # poll=30 s: only file-system notifications can make this pass in time.
        await async_wait_for(all_logged, timeout=20, message="watch mode did not detect changes")
        for cid, collection in pub.collections.items():
            c = collection.capability_list.split("/")[-2]
            records = await logged(log, cid)
            assert [(r["loc"], r["datetime"], r["change"]) for r in records] == (
                await change_list_entries(http, base, c, advertised="http://source.test/")
            )


async def test_a_detected_change_costs_one_append_and_no_new_look_at_the_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every list's directory is resolved when the publisher (re)looks at what to
    # watch; once per detection, that grew with the index: 5.5 % of the
    # publisher's CPU at 200 changes/s with only 3 lists.  And a detection's
    # entries carry the poll's final checkpoint (with the list's validators):
    # a second append per detection only for those was 12 % of it.
    looks: list[int] = []
    original = Publisher._watch_lists

    def counted(self: Publisher, collection: Any) -> None:
        looks.append(len(collection.watcher.list_urls()))
        original(self, collection)

    monkeypatch.setattr(Publisher, "_watch_lists", counted)
    site = tmp_path / "site"
    async with (
        simulator(changelist_size=20, paused=True, dir=site, base_url="http://source.test/") as (
            _sim,
            base,
        ),
        aiohttp.ClientSession() as http,
        publisher(source=str(site), poll=30.0, watch=True, state_dir=str(tmp_path)) as pub,
    ):
        cid = await only_collection(pub)
        log = pub.log
        await async_wait_for(lambda: _checkpoint_started(log, cid), timeout=20)  # type: ignore[arg-type]
        appends: list[int] = []
        append = log.append

        async def counted_append(collection: str, payloads: list[Any], **kw: Any) -> int:
            appends.append(len(payloads))
            return await append(collection, payloads, **kw)

        monkeypatch.setattr(log, "append", counted_append)
        for n in range(1, 61):  # one detection each: the next change waits for it
            await advance(http, base, 1)
            await async_wait_for(lambda n=n: _head_is(log, cid, n), timeout=20)  # type: ignore[misc]
        records = await logged(log, cid)
        checkpoint = await log.checkpoint(cid)
        assert checkpoint is not None
        assert checkpoint == pub.collections[cid].watcher.checkpoint.to_json()
        listed = await change_list_entries(http, base, "c1", advertised="http://source.test/")
    assert [(r["loc"], r["datetime"], r["change"]) for r in records] == listed[-60:]
    # Lists of 20: looked at when started, at the first read of the index and at
    # each rollover (the index read anew), each time with one more list; not at
    # each of the 60 detections.
    assert looks == list(range(looks[0], looks[0] + len(looks))), looks
    assert 4 <= len(looks) <= 6, looks
    # One append per change; the few empty ones: a poll that found nothing new
    # but a list's validators moved (the index rewritten at a rollover).
    assert sum(appends) == 60
    assert len(appends) <= 60 + 6, appends


def test_sqlite_log_is_the_default(tmp_path: Path) -> None:
    from rsnotify.log import open_log

    log = open_log(None, str(tmp_path / "state"))
    assert isinstance(log, SQLiteLog)
    asyncio.run(log.close())


async def test_hub_links_are_written_into_a_directory_sources_capability_list(
    tmp_path: Path,
) -> None:
    from rsnotify import sitemap
    from rsnotify.discovery import push_channels
    from rsnotify.model import CapabilityList
    from tests.devstack import free_port

    site = tmp_path / "site"
    port = free_port()
    async with (
        simulator(paused=True, dir=site, base_url="http://source.test/") as _,
        publisher(
            source=str(site), state_dir=str(tmp_path / "state"), ws=f"127.0.0.1:{port}"
        ) as pub,
    ):
        cid = await only_collection(pub)
        assert pub.hub_links(cid) == [f"ws://127.0.0.1:{port}/{cid}"]
        pub.write_hub_links()
        pub.write_hub_links()  # idempotent
        document = sitemap.parse(site / "c1" / "capabilitylist.xml")
        assert isinstance(document, CapabilityList)
        # rsnotify's own channels: an extension rel, since rel="hub" means WebSub (section 5).
        assert push_channels(document) == [f"ws://127.0.0.1:{port}/{cid}"]
        assert document.hubs == []
        assert document.up is not None  # the rest of the document is kept


async def test_a_publisher_whose_mqtt_push_runs_elsewhere_still_advertises_the_broker(
    tmp_path: Path,
) -> None:
    """``--mqtt-hub``: the detecting half of a split deployment names the gateway's broker."""
    from rsnotify import sitemap
    from rsnotify.discovery import push_channels
    from rsnotify.model import CapabilityList

    site = tmp_path / "site"
    async with (
        simulator(paused=True, dir=site, base_url="http://source.test/") as _,
        publisher(
            source=str(site),
            state_dir=str(tmp_path / "state"),
            mqtt_hub="mqtt://broker.example.org:1883",
            topic_prefix="rs",
        ) as pub,
    ):
        cid = await only_collection(pub)
        # The broker-safe topic: the collection id's dots folded away (NATS refuses them).
        assert "." in cid
        href = f"mqtt://broker.example.org:1883/rs/{topic_level(cid)}/changes"
        assert "." not in href.split("1883/", 1)[1]
        assert pub.hub_links(cid) == [href]
        assert "mqtt" not in pub.transports()  # advertised, not pushed
        pub.write_hub_links()
        document = sitemap.parse(site / "c1" / "capabilitylist.xml")
        assert isinstance(document, CapabilityList)
        assert push_channels(document) == [href]


def test_mqtt_hub_with_mqtt_or_a_bad_url_is_a_clear_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    cases = {
        ("--mqtt-hub", "mqtt://b:1883", "--mqtt", "mqtt://b:1883"): "for a publisher without",
        ("--mqtt-hub", "http://b/"): "--mqtt-hub: ",
    }
    for extra, said in cases.items():
        result = subprocess.run(
            [sys.executable, "-m", "rsnotify.cli", "publish", str(tmp_path), *extra],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, result.stdout + result.stderr
        assert said in result.stdout + result.stderr
