"""The subscriber against the real simulator, publisher, Mosquitto and Redis."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rsnotify import w3cdt
from rsnotify.commands.audit import audit
from rsnotify.publisher.service import Publisher, PublisherConfig
from rsnotify.subscriber.cursor import AlreadyRunning
from rsnotify.subscriber.mirror import TEMP_PREFIX, path_for
from rsnotify.subscriber.resources import ResourceStore
from rsnotify.subscriber.service import Subscriber, SubscriberConfig, default_state_dir
from tests.devstack import Mosquitto, Redis, async_wait_for, free_port
from tests.helpers import running_simulator
from tests.spares import require_spares


def simulator(**options: Any) -> Any:
    """The shared in-process simulator with this module's defaults."""
    return running_simulator(**{**dict(seed=11, resources=30, payload_bytes=256), **options})


@asynccontextmanager
async def running(cls: Any, config: Any) -> AsyncIterator[Any]:
    service = cls(config)
    await service.start()
    task = asyncio.create_task(service.run_forever()) if cls is Subscriber else None
    try:
        yield service
    finally:
        if task is not None:
            service.stopping.set()
            await task
        await service.stop()


async def post(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.post(url) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def ground_truth(http: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with http.get(f"{base}_simulator/state") as response:
        return await response.json()


def differences(state: dict[str, Any], mirror: Path) -> list[str]:
    expected = {
        path_for(loc, mirror): sha
        for collection in state["collections"].values()
        for loc, sha in collection["resources"].items()
    }
    found = {p for p in mirror.rglob("*") if p.is_file() and not p.name.startswith(TEMP_PREFIX)}
    out = [f"missing {p}" for p in expected.keys() - found]
    out += [f"extra {p}" for p in found - expected.keys()]
    out += [f"differs {p}" for p in found & expected.keys() if _sha256(p) != expected[p]]
    return out


def _sha256(path: Path) -> str | None:
    """The file's sha-256, or None if it vanished since it was listed.

    The subscriber applies changes (deletes too) in its own threads while a
    test compares the live mirror: a file deleted by a change that a later
    one re-creates is briefly absent, which is "not converged yet".
    """
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


async def converged(http: aiohttp.ClientSession, base: str, *mirrors: Path) -> bool:
    state = await ground_truth(http, base)
    return all(not differences(state, m) for m in mirrors)


@pytest.mark.parametrize("spare_inodes", [True, False], ids=["spare-inodes", "new-inodes"])
async def test_once_baselines_then_catches_up_from_the_change_list_index(
    tmp_path: Path, spare_inodes: bool
) -> None:
    if spare_inodes:  # --spare-inodes (opt-in); the default replaces by rename
        require_spares(tmp_path)
    mirror = tmp_path / "mirror"
    async with (
        simulator(changelist_size=25, paused=True) as (_sim, base),
        aiohttp.ClientSession() as http,
    ):
        await post(http, f"{base}_simulator/advance?n=60")
        config = SubscriberConfig(
            source=base, into=str(mirror), once=True, spare_inodes=spare_inodes
        )
        sub = Subscriber(config)
        await sub.start()
        assert await sub.run_once() == 0
        await sub.stop()
        assert differences(await ground_truth(http, base), mirror) == []
        assert await audit(base, mirror, []) == []
        # Later changes, across rollovers, applied from the Change Lists alone.
        await post(http, f"{base}_simulator/advance?n=90")
        sub = Subscriber(config)
        await sub.start()
        assert await sub.run_once() == 0
        (engine,) = sub.engines.values()
        assert engine.stats.applied + engine.stats.skipped >= 90
        await sub.stop()
        assert differences(await ground_truth(http, base), mirror) == []
        # Nothing new: a third run applies nothing.
        sub = Subscriber(config)
        await sub.start()
        await sub.run_once()
        (engine,) = sub.engines.values()
        assert engine.stats.applied == 0
        await sub.stop()
    # Updates and deletes retired inodes into <state>/spare (never inside the mirror).
    spare = default_state_dir(str(mirror)) / "spare"
    assert (spare.is_dir() and any(spare.iterdir())) is spare_inodes
    assert not list(mirror.rglob("%spare*"))


async def test_cursors_in_redis_survive_restarts_and_a_redis_outage(
    tmp_path: Path, redis_server: Redis
) -> None:
    """``--redis``: the cursor lives in Redis (not SQLite) and a later run resumes from it."""
    import redis as redis_client

    from rsnotify.subscriber.redis_cursor import destination_id

    mirror = tmp_path / "mirror"
    async with (
        simulator(changelist_size=25, paused=True) as (_sim, base),
        aiohttp.ClientSession() as http,
    ):
        await post(http, f"{base}_simulator/advance?n=60")
        config = SubscriberConfig(
            source=base, into=str(mirror), once=True, redis=redis_server.url, name="dest-1"
        )
        sub = Subscriber(config)
        await sub.start()
        assert await sub.run_once() == 0
        (cid,) = sub.engines
        await sub.stop()
        assert differences(await ground_truth(http, base), mirror) == []
        assert not (default_state_dir(str(mirror)) / "cursor.sqlite3").exists()
        assert destination_id(mirror, "dest-1") == "dest-1"
        raw = redis_client.Redis.from_url(redis_server.url).hget("rsn:dest:{dest-1}:cursors", cid)
        cursor = json.loads(raw)
        assert cursor["baseline_done"] is True and json.loads(cursor["checkpoint"])

        await post(http, f"{base}_simulator/advance?n=40")
        sub = Subscriber(config)
        await sub.start()
        assert await sub.run_once() == 0
        (engine,) = sub.engines.values()
        # Resumed from Redis: the 40 new changes, not a new baseline of everything.
        assert 40 <= engine.stats.applied + engine.stats.skipped < 60
        events = await sub._cursors.events()  # type: ignore[union-attr]
        assert any(kind == "catch-up" for _, _, kind, _ in events)
        await sub.stop()
        assert differences(await ground_truth(http, base), mirror) == []

        # Redis away while the cursor is saved: the save waits, nothing fails.
        await post(http, f"{base}_simulator/advance?n=10")
        sub = Subscriber(config)
        await sub.start()
        redis_server.stop()
        run = asyncio.create_task(sub.run_once())
        await asyncio.sleep(1.0)  # the scenario: Redis down for a second while applying
        redis_server.start()
        assert await asyncio.wait_for(run, 60) == 0
        await sub.stop()
        assert differences(await ground_truth(http, base), mirror) == []


async def test_a_subscriber_stops_while_its_redis_stays_away(
    tmp_path: Path, redis_server: Redis
) -> None:
    """At shutdown a cursor save gives up after ``patience`` s instead of retrying forever.

    Running, a save waits for Redis as long as it takes (previous test); stopping
    with Redis gone, the process must still exit, and the cursor Redis keeps is
    the last one saved, behind the mirror, never ahead of it.
    """
    import redis as redis_client

    mirror = tmp_path / "mirror"
    async with (
        simulator(changelist_size=25, paused=True) as (_sim, base),
        aiohttp.ClientSession() as http,
    ):
        await post(http, f"{base}_simulator/advance?n=30")
        config = SubscriberConfig(
            source=base, into=str(mirror), once=True, redis=redis_server.url, name="dest-2"
        )
        sub = Subscriber(config)
        await sub.start()
        assert await sub.run_once() == 0
        (cid,) = sub.engines
        key = "rsn:dest:{dest-2}:cursors"
        saved = redis_client.Redis.from_url(redis_server.url).hget(key, cid)
        assert sub._cursors is not None
        sub._cursors.patience = 0.5  # type: ignore[union-attr]
        redis_server.stop()
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.wait_for(sub.stop(), 30)  # before: retried every 5 s, forever
        assert loop.time() - began < 20
        redis_server.start()
        assert redis_client.Redis.from_url(redis_server.url).hget(key, cid) == saved


async def test_audit_reports_missing_changed_and_extra_files(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    async with simulator(paused=True) as (_sim, base):
        sub = Subscriber(SubscriberConfig(source=base, into=str(mirror), once=True))
        await sub.start()
        await sub.run_once()
        await sub.stop()
        files = sorted(p for p in mirror.rglob("*") if p.is_file())
        files[0].unlink()
        files[1].write_bytes(b"tampered")
        (files[2].parent / "stray.txt").write_bytes(b"x")
        found = await audit(base, mirror, [])
        kinds = sorted(line.split()[0] for line in found)
        assert kinds == ["extra", "hash", "missing"] or kinds == ["extra", "length", "missing"]


async def test_one_subscriber_per_mirror(tmp_path: Path) -> None:
    async with simulator(paused=True) as (_sim, base):
        config = SubscriberConfig(source=base, into=str(tmp_path / "m"), once=True)
        first = Subscriber(config)
        await first.start()
        second = Subscriber(config)
        with pytest.raises(AlreadyRunning):
            await second.start()
        await first.stop()
        assert default_state_dir(str(tmp_path / "m")) == tmp_path / ".m.rsnotify"


@pytest.mark.parametrize("transport", ["mqtt", "ws"])
async def test_pushed_changes_are_applied_live(
    transport: str, tmp_path: Path, mosquitto: Mosquitto, redis_server: Redis
) -> None:
    """Changes reach the mirror by push: applied with their sequence numbers, no catch-up.

    Signed, so that push is trusted: without a signature a deletion is first
    confirmed at the Source, and the simulator's batches delete and re-create
    resources within milliseconds, which (correctly) costs a catch-up now and
    then (see rsnotify.subscriber.trust and tests/test_subscriber_hostile.py).
    """
    ws_port = free_port()
    mirror = tmp_path / "mirror"
    async with (
        simulator(
            changelist_size=40,
            paused=True,
            collections=2,
            hubs=(
                f"ws://127.0.0.1:{ws_port}/{{id}}",
                f"{mosquitto.url}/resourcesync/{{id}}/changes",
            ),
        ) as (_sim, base),
        aiohttp.ClientSession() as http,
        running(
            Publisher,
            PublisherConfig(
                source=base,
                redis=redis_server.url,
                mqtt=mosquitto.url,
                ws=f"127.0.0.1:{ws_port}",
                poll=0.05,
                secret=b"pushed changes are trusted",
            ),
        ) as pub,
    ):
        # The publisher has taken its starting point before anything changes.
        await async_wait_for(
            lambda: _all_started(pub), timeout=20, message="publisher did not start"
        )
        via = mosquitto.url if transport == "mqtt" else None  # ws: found from the hub links
        config = SubscriberConfig(
            source=base,
            into=str(mirror),
            via=via,
            heartbeat_timeout=60,
            secrets={"k1": b"pushed changes are trusted"},
        )
        async with running(Subscriber, config) as sub:
            await async_wait_for(
                lambda: all(e.stats.state == "live" for e in sub.engines.values()),
                timeout=20,
                message="subscriber did not go live",
            )
            for _ in range(4):
                await post(http, f"{base}_simulator/advance?n=50")
                await async_wait_for(
                    lambda: converged(http, base, mirror), timeout=30, message="no convergence"
                )
            stats = [e.stats for e in sub.engines.values()]
        assert sum(s.applied for s in stats) >= 200
        assert all(s.catchups == 1 for s in stats), f"only the start-up catch-up: {stats}"
        store = ResourceStore(default_state_dir(str(mirror)) / "resources.sqlite3")
        log = await store.apply_log()
        await store.close()
        pushed = [r for r in log if r.seq is not None]
        assert len(pushed) >= 200, "changes were applied from notifications, with their seqs"


async def _all_started(pub: Publisher) -> bool:
    assert pub.log is not None
    return all([await pub.log.checkpoint(c) is not None for c in pub.collections])


async def test_a_forged_off_origin_notification_is_not_fetched(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """A notification pointing off the Source's origin is refused without a request."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    hits: list[str] = []

    async def record(request: aiohttp.web.Request) -> aiohttp.web.Response:
        hits.append(request.path)
        return aiohttp.web.Response(body=b"evil")

    app = aiohttp.web.Application()
    app.router.add_get("/{tail:.*}", record)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    evil_port = free_port()
    await aiohttp.web.TCPSite(runner, "127.0.0.1", evil_port).start()
    mirror = tmp_path / "mirror"
    try:
        async with simulator(paused=True) as (_sim, base):
            config = SubscriberConfig(source=base, into=str(mirror), via=mosquitto.url)
            async with running(Subscriber, config) as sub:
                (cid,) = sub.engines
                engine = sub.engines[cid]
                await async_wait_for(lambda: engine.stats.state == "live", timeout=20)
                forged = {
                    "v": 1,
                    "collection": cid,
                    "seq": 1,
                    "capabilitylist": f"{base}c1/capabilitylist.xml",
                    "changelist": f"{base}c1/changes/000001.xml",
                    "loc": f"http://127.0.0.1:{evil_port}/steal",
                    "change": "created",
                    "datetime": w3cdt.format(w3cdt.now()),
                }
                client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
                client.connect(mosquitto.host, mosquitto.port)
                client.loop_start()
                info = client.publish(f"resourcesync/{cid}/changes", json.dumps(forged), qos=1)
                info.wait_for_publish(10)
                client.disconnect()
                client.loop_stop()
                await async_wait_for(
                    lambda: engine.stats.refused >= 1, timeout=20, message="forgery not refused"
                )
        assert hits == [], "the subscriber fetched from a foreign origin"
        store = ResourceStore(default_state_dir(str(mirror)) / "resources.sqlite3")
        outcomes = [r.outcome for r in await store.apply_log()]
        await store.close()
        assert "refused_origin" in outcomes
    finally:
        await runner.cleanup()
