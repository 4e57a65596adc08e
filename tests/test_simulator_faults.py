"""The simulator's fault-injection controls (used by the chaos matrix, tests/chaos/)."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest

from rsnotify.simulator import payload
from tests.helpers import running_simulator


async def _first_resource(session: aiohttp.ClientSession, url: str) -> tuple[str, str]:
    async with session.get(url + "_simulator/state") as response:
        state = await response.json()
    (collection,) = state["collections"].values()
    return next(iter(collection["resources"].items()))


async def _fault(session: aiohttp.ClientSession, url: str, **spec: object) -> int:
    async with session.post(url + "_simulator/faults", json=spec) as response:
        return response.status


async def test_each_fault_mode_misbehaves_then_stops() -> None:
    async with (
        running_simulator(resources=5, payload_bytes=4000) as (_, url),
        aiohttp.ClientSession() as session,
    ):
        loc, sha = await _first_resource(session, url)
        assert await _fault(session, url, mode="500", seconds=30) == 200
        async with session.get(loc) as response:
            assert response.status == 500
        async with session.get(url + "_simulator/stats") as response:  # control: never faulty
            assert (await response.json())["fault"] == {"mode": "500", "hits": 1}

        assert await _fault(session, url, mode="bad-hash", seconds=30, scope="resources") == 200
        async with session.get(loc) as response:
            body = await response.read()
        assert response.status == 200 and hashlib.sha256(body).hexdigest() != sha
        async with session.get(url + "c1/changelist.xml") as response:  # out of scope
            assert response.status == 200 and b"sitemapindex" in await response.read()

        assert await _fault(session, url, mode="truncate", seconds=30) == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async with session.get(loc) as response:
                await response.read()

        assert await _fault(session, url, mode="none", seconds=0) == 200
        async with session.get(loc) as response:
            assert hashlib.sha256(await response.read()).hexdigest() == sha
        assert await _fault(session, url, mode="melt", seconds=1) == 400
        assert await _fault(session, url, mode="500", seconds=-1) == 400


async def test_timeout_holds_the_request_then_drops_the_connection() -> None:
    async with (
        running_simulator(resources=2) as (_, url),
        aiohttp.ClientSession() as session,
    ):
        loc, _ = await _first_resource(session, url)
        assert await _fault(session, url, mode="timeout", seconds=30) == 200
        with pytest.raises(TimeoutError):
            async with session.get(loc, timeout=aiohttp.ClientTimeout(total=0.5)) as response:
                await response.read()
        assert await _fault(session, url, mode="none", seconds=0) == 200  # releases the hold
        async with session.get(loc) as response:
            assert response.status == 200


async def test_clock_skew_moves_change_datetimes() -> None:
    async with running_simulator(resources=2, clock_skew=7200) as (sim, url):
        sim.apply(1)
        ahead = sim.source.clock - datetime.now(UTC)
        assert timedelta(seconds=7100) < ahead < timedelta(seconds=7300)
        async with aiohttp.ClientSession() as session:
            async with session.post(url + "_simulator/clock?skew=-60") as response:
                assert response.status == 200
            async with session.post(url + "_simulator/clock?skew=nan") as response:
                assert response.status == 400
        before = sim.source.clock
        sim.apply(3)
        assert sim.source.clock > before, "change datetimes never go backwards"
        assert sim.skew.total_seconds() == -60


async def test_drop_entry_republishes_the_open_list_without_a_superseded_entry() -> None:
    async with (
        running_simulator(resources=3, changelist_size=1000, seed=4) as (sim, url),
        aiohttp.ClientSession() as session,
    ):
        sim.apply(50)  # 3 resources: plenty of locs that change twice
        open_list = url + "c1/changes/changelist-00001.xml"
        index = await (await session.get(url + "c1/changelist.xml")).text()
        open_list = re.findall(r"<loc>([^<]*changes[^<]*)</loc>", index)[-1]
        before = await (await session.get(open_list)).read()
        state = sim.source.state()
        async with session.post(url + "_simulator/drop-entry") as response:
            (dropped,) = (await response.json())["dropped"]
        after = await (await session.get(open_list)).read()
        assert after.count(b"<url>") == before.count(b"<url>") - 1
        assert after.count(dropped.encode()) == before.count(dropped.encode()) - 1
        assert dropped.encode() in after, "a later entry of the same resource remains"
        assert sim.source.state() == state, "the Source's state is unchanged"
        sim.apply(5)
        grown = await (await session.get(open_list)).read()
        assert grown.count(b"<url>") == after.count(b"<url>") + 5


def test_large_resources_are_large() -> None:
    locs = [f"http://x/c1/resources/r{i:06d}.txt" for i in range(200)]
    large = [loc for loc in locs if payload.is_large(loc, 10)]
    assert 5 <= len(large) <= 40
    assert len(payload.body(1, large[0], 1, 1_000_000)) >= 500_000
