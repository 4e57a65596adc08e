"""A broker that registers the subscription late loses no change.

The start-up catch-up covers what was published before it began; push covers
what the broker routes to the subscription once it is registered.  The
subscriber therefore waits (``service.FIRST_SUBSCRIPTION_WAIT``) for the
SUBACK before that catch-up, and a subscription registered after the catch-up
began anyway (a broker slower than the wait) is a gap, caught up at once
(``GapDetector.on_connect``).  Before both, a change published between the two
reached nobody until the safety poll, five minutes later by default.

Each collection waits for its own channels only (a collection without push
starts polling at once).  The broker here is a real Mosquitto behind a relay
that passes the client's CONNECT (so the connection is up) and holds its
SUBSCRIBE until the test releases it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import paho.mqtt.client as mqtt
import pytest

from rsnotify import sitemap
from rsnotify.discovery import CHANNEL_REL
from rsnotify.model import Capability, Entry, Link, Root, make_document
from rsnotify.publisher.service import Publisher, PublisherConfig
from rsnotify.subscriber import service
from rsnotify.subscriber.service import Subscriber, SubscriberConfig
from rsnotify.subscriber.sync import CollectionSync
from tests.devstack import Mosquitto, Redis, async_wait_for, wait_for
from tests.minisource import Source, differences
from tests.test_subscriber import _all_started, converged, post, running, simulator
from tests.test_transport_mqtt import PacketRelay

SECRET = b"late subscriptions"
SUBSCRIBE = 8  # MQTT control packet type (MQTT 5.0 section 2.1.2)


class HeldSubscriptions(PacketRelay):
    """A relay to the broker that holds each client's SUBSCRIBE until :meth:`release`.

    The CONNECT goes through, so the client is connected at once; the broker
    registers the subscription only when the test says so.
    """

    def __init__(self, upstream: Mosquitto) -> None:
        super().__init__(upstream)
        self.holding = asyncio.Event()  # a SUBSCRIBE is waiting
        self.released = asyncio.Event()

    def release(self) -> None:
        self.released.set()

    async def hold_client(self, header: bytes) -> None:
        if header[0] >> 4 == SUBSCRIBE and not self.released.is_set():
            self.holding.set()
            await self.released.wait()


@contextlib.contextmanager
def notifications_seen(broker: Mosquitto) -> Iterator[list[str]]:
    """Every change notification the broker routes, as seen by a client of the test's own."""
    topics: list[str] = []
    lock = threading.Lock()
    subscribed = threading.Event()

    def on_message(_c: object, _u: object, message: mqtt.MQTTMessage) -> None:
        if message.topic.endswith("/changes") and not message.retain:
            with lock:
                topics.append(message.topic)

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="late-subscription-witness")
    client.on_message = on_message
    client.on_subscribe = lambda *_args: subscribed.set()
    client.connect(broker.host, broker.port, keepalive=10)
    client.loop_start()
    try:
        client.subscribe("resourcesync/#", 1)
        wait_for(subscribed.is_set, 5, message="the witness got no SUBACK")
        yield topics
    finally:
        client.disconnect()
        client.loop_stop()


@dataclass
class Rig:
    base: str
    http: aiohttp.ClientSession
    held: HeldSubscriptions
    engine: CollectionSync
    mirror: Path

    async def change_unseen(self, broker: Mosquitto, n: int = 20) -> None:
        """Make ``n`` changes and wait until the broker routed them, to all but us."""
        with notifications_seen(broker) as seen:
            await post(self.http, f"{self.base}_simulator/advance?n={n}")
            await async_wait_for(
                lambda: len(seen) >= n, timeout=20, message="the changes were not published"
            )

    async def converged(self, message: str) -> None:
        await async_wait_for(
            lambda: converged(self.http, self.base, self.mirror), timeout=30, message=message
        )


@contextlib.asynccontextmanager
async def held_subscriber(
    tmp_path: Path, mosquitto: Mosquitto, redis_server: Redis
) -> AsyncIterator[Rig]:
    """A paused simulator, its publisher, and a subscriber whose SUBSCRIBE the relay holds.

    Every other way to find missed changes (timers, degraded polling) is out
    of reach, and push is signed (trusted, so no confirmation walk either).
    """
    async with (
        simulator(paused=True, hubs=(f"{mosquitto.url}/resourcesync/{{id}}/changes",)) as (
            _sim,
            base,
        ),
        aiohttp.ClientSession() as http,
        running(
            Publisher,
            PublisherConfig(
                source=base, redis=redis_server.url, mqtt=mosquitto.url, poll=0.05, secret=SECRET
            ),
        ) as pub,
        HeldSubscriptions(mosquitto) as held,
    ):
        await async_wait_for(
            lambda: _all_started(pub), timeout=20, message="publisher did not start"
        )
        mirror = tmp_path / "mirror"
        config = SubscriberConfig(
            source=base,
            into=str(mirror),
            via=held.url,
            heartbeat_timeout=3600,
            safety_poll=3600,
            degraded_after=3600,
            secrets={"k1": SECRET},
        )
        async with running(Subscriber, config) as sub:
            (engine,) = sub.engines.values()
            yield Rig(base, http, held, engine, mirror)


async def test_a_subscription_registered_after_the_start_up_catch_up_began_is_a_gap(
    tmp_path: Path, mosquitto: Mosquitto, redis_server: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "FIRST_SUBSCRIPTION_WAIT", 0.2)
    async with held_subscriber(tmp_path, mosquitto, redis_server) as rig:
        await async_wait_for(
            lambda: rig.engine.stats.state == "live" and rig.held.holding.is_set(),
            timeout=20,
            message="the subscriber did not go live with its SUBSCRIBE held",
        )
        assert rig.engine.stats.catchups == 1  # the start-up one, without the subscription
        await rig.change_unseen(mosquitto)
        rig.held.release()
        await rig.converged("changes published before the subscription were never applied")
        assert rig.engine.stats.catchups == 2, "one catch-up for the late subscription"


async def test_the_start_up_catch_up_waits_for_the_subscription(
    tmp_path: Path, mosquitto: Mosquitto, redis_server: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Changes published while the SUBSCRIBE is held are the start-up catch-up's: no second one."""
    monkeypatch.setattr(service, "FIRST_SUBSCRIPTION_WAIT", 60.0)
    async with held_subscriber(tmp_path, mosquitto, redis_server) as rig:
        await async_wait_for(
            lambda: rig.held.holding.is_set() and rig.engine.stats.state == "subscribing",
            timeout=20,
            message="the subscriber did not wait for its SUBACK",
        )
        await rig.change_unseen(mosquitto)
        assert rig.engine.stats.catchups == 0, "the catch-up must wait for the SUBACK"
        rig.held.release()
        await async_wait_for(
            lambda: rig.engine.stats.state == "live", timeout=20, message="never went live"
        )
        await rig.converged("no convergence")
        assert rig.engine.stats.catchups == 1, "the subscription came first: one catch-up"


class TwoCollections(Source):
    """Two Capability Lists (Z39.99 section 7: a Source Description lists each):
    the first advertises an MQTT channel, the second none.

    The second collection has its own, empty, Resource List and Change List.
    """

    def __init__(self, channel: Callable[[str], str]) -> None:
        super().__init__()
        self.channel = channel  # collection id -> the advertised channel URL

    async def start(self, files: dict[str, bytes]) -> str:
        base = await super().start(files)  # the collection id needs the base URL
        self.capability_links = [Link(rel=CHANNEL_REL, href=self.channel(self.collection))]
        return base

    def _documents(self) -> dict[str, bytes]:
        documents = super()._documents()
        second = self.url("quiet/capabilitylist.xml")
        documents["/.well-known/resourcesync"] = sitemap.serialize(
            make_document(
                Root.URLSET,
                Capability.DESCRIPTION,
                entries=[
                    Entry(loc=self.capability_list, capability=Capability.CAPABILITYLIST),
                    Entry(loc=second, capability=Capability.CAPABILITYLIST),
                ],
            )
        )
        documents["/quiet/capabilitylist.xml"] = sitemap.serialize(
            make_document(
                Root.URLSET,
                Capability.CAPABILITYLIST,
                entries=[
                    Entry(
                        loc=self.url("quiet/resourcelist.xml"), capability=Capability.RESOURCELIST
                    ),
                    Entry(loc=self.url("quiet/changelist.xml"), capability=Capability.CHANGELIST),
                ],
            )
        )
        documents["/quiet/resourcelist.xml"] = sitemap.serialize(
            make_document(Root.URLSET, Capability.RESOURCELIST, at=self.at, entries=[])
        )
        documents["/quiet/changelist.xml"] = sitemap.serialize(
            make_document(Root.URLSET, Capability.CHANGELIST, from_=self.at, entries=[])
        )
        return documents


async def test_a_collection_does_not_wait_for_another_collections_subscription(
    tmp_path: Path, mosquitto: Mosquitto, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each engine waits for its own channels: one without push starts polling at once.

    Before, every engine waited for every channel's first subscription (up to
    FIRST_SUBSCRIPTION_WAIT), so a collection without push, or with a
    WebSocket channel, started as late as another collection's slowest broker.
    """
    monkeypatch.setattr(service, "FIRST_SUBSCRIPTION_WAIT", 60.0)
    async with HeldSubscriptions(mosquitto) as held:
        source = TwoCollections(lambda cid: f"{held.url}/resourcesync/{cid}/changes")
        base = await source.start({"a": b"first collection"})
        try:
            config = SubscriberConfig(
                source=base,
                into=str(tmp_path / "mirror"),
                heartbeat_timeout=3600,
                safety_poll=3600,
                degraded_after=3600,
            )
            async with running(Subscriber, config) as sub:
                pushed = sub.engines[source.collection]
                (quiet,) = (e for e in sub.engines.values() if e is not pushed)
                await async_wait_for(
                    lambda: quiet.stats.state == "polling" and held.holding.is_set(),
                    timeout=20,
                    message="the collection without push waited for the other's SUBACK",
                )
                assert pushed.stats.state == "subscribing"
                assert pushed.stats.catchups == 0, "its catch-up must wait for its SUBACK"
                held.release()
                await async_wait_for(
                    lambda: pushed.stats.state == "live",
                    timeout=20,
                    message="the pushed collection never went live",
                )
                assert differences(source, tmp_path / "mirror") == []
        finally:
            await source.stop()
