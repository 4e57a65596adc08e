"""Scaling out on existing engines: bridged Mosquitto brokers, several WebSocket gateways."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import websockets
from paho.mqtt.enums import CallbackAPIVersion

from rsnotify import envelope, w3cdt
from rsnotify.log.redis_log import RedisLog
from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.publisher.service import Publisher, PublisherConfig
from rsnotify.transport import wsproto
from rsnotify.transport.mqtt import CURSOR_NAME, MqttPusher
from rsnotify.transport.topics import Topics
from tests.devstack import Mosquitto, Redis, async_wait_for, free_port

C = "example.org-c1-capabilitylist-5ca1e000"
N = 2000


def payloads(start: int, count: int) -> list[bytes]:
    now = w3cdt.now()
    return [
        envelope.dumps(
            {
                "v": 1,
                "collection": C,
                "seq": seq,
                "capabilitylist": "http://example.org/c1/capabilitylist.xml",
                "changelist": "http://example.org/c1/changes/1.xml",
                "loc": f"http://example.org/r/{seq}",
                "change": "updated",
                "datetime": w3cdt.format(now),
            }
        )
        for seq in range(start, start + count)
    ]


class Collector:
    """A plain paho subscriber recording seqs in arrival order."""

    def __init__(self, broker: Mosquitto, topic: str) -> None:
        self.seqs: list[int] = []
        self.probes = 0
        self._lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, *a: c.subscribe([(topic, 1), ("probe/#", 1)])
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        with self._lock:
            if message.topic.startswith("probe/"):
                self.probes += 1
            else:
                self.seqs.append(json.loads(message.payload)["seq"])

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


async def test_subscribers_on_a_bridged_broker_see_every_notification_in_order(
    tmp_path: Path, mosquitto_factory: Callable[..., Mosquitto]
) -> None:
    near = mosquitto_factory(max_queued_messages=100_000)
    far = mosquitto_factory(
        max_queued_messages=100_000,
        extra_config=[
            "connection to-near",
            f"address 127.0.0.1:{near.port}",
            "topic resourcesync/# in 1",
            "topic probe/# in 1",
            "cleansession false",
            "restart_timeout 1 5",
        ],
    )
    collector = Collector(far, Topics().changes(C))
    # The bridge is up once a probe published on the near broker reaches the far one.
    probe = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    probe.connect(near.host, near.port)
    probe.loop_start()

    def bridged() -> bool:
        probe.publish("probe/x", b"1", qos=1)
        return collector.probes > 0

    try:
        await async_wait_for(lambda: bridged(), timeout=20, interval=0.2, message="no bridge")
        log = SQLiteLog(tmp_path / "log.sqlite3")
        await log.register(C, "http://example.org/c1/capabilitylist.xml")
        await log.append(C, payloads(1, N), expected_head=0, checkpoint="c")
        pusher = MqttPusher(near.url, log, heartbeat=1.0)
        pusher.add_collection(C)
        task = asyncio.create_task(pusher.run())
        await async_wait_for(
            lambda: len(set(collector.seqs)) >= N, timeout=60, message="not everything bridged"
        )
        await pusher.stop()
        await task
        await log.close()
        unique = list(dict.fromkeys(collector.seqs))  # first arrival of each seq
        assert unique == list(range(1, N + 1)), "order kept across the bridge"
    finally:
        probe.loop_stop()
        probe.disconnect()
        collector.close()


async def _collect(port: int, since: int, count: int) -> list[int]:
    seqs: list[int] = []
    async with websockets.connect(f"ws://127.0.0.1:{port}/{C}?since={since}") as ws:
        async for data in ws:
            frame = wsproto.parse_frame(data)
            if isinstance(frame, wsproto.Notification):
                seqs.append(frame.seq)
                if len(seqs) >= count:
                    return seqs
    return seqs


async def test_two_ws_only_gateways_on_one_redis_serve_the_same_ordered_sequence(
    redis_server: Redis,
) -> None:
    log = RedisLog(redis_server.url)
    await log.register(C, "http://example.org/c1/capabilitylist.xml")
    await log.append(C, payloads(1, 500), expected_head=0, checkpoint="c")
    ports = [free_port(), free_port()]
    gateways = [
        Publisher(
            PublisherConfig(
                source="http://unused.invalid/",
                redis=redis_server.url,
                ws=f"127.0.0.1:{port}",
                ws_only=True,
            )
        )
        for port in ports
    ]
    try:
        for gateway in gateways:
            await gateway.start()
        clients = [asyncio.create_task(_collect(p, 0, 1000)) for p in ports]
        # Live appends while both gateways serve: replay and live must join seamlessly.
        await log.append(C, payloads(501, 500), expected_head=500, checkpoint="c")
        results = await asyncio.wait_for(asyncio.gather(*clients), 60)
        assert results[0] == results[1] == list(range(1, 1001))
    finally:
        for gateway in gateways:
            await gateway.stop()
        await log.close()


async def test_an_mqtt_only_gateway_pushes_every_collection_of_the_shared_log_in_order(
    redis_server: Redis,
    mosquitto_factory: Callable[..., Mosquitto],
    monkeypatch: Any,
) -> None:
    """``publish --mqtt-only``: the MQTT half of a publisher split over two processes.

    What the log held before the gateway started and what is appended while
    it runs arrive once, in order; a collection registered later is found by
    the gateway's refresh of the collection list.
    """
    from rsnotify.publisher import transports

    monkeypatch.setattr(transports, "COLLECTION_REFRESH", 0.2)
    broker = mosquitto_factory(max_queued_messages=100_000)
    collector = Collector(broker, "resourcesync/+/changes")
    log = RedisLog(redis_server.url)
    gateway = Publisher(
        PublisherConfig(
            source="http://unused.invalid/",
            redis=redis_server.url,
            mqtt=broker.url,
            mqtt_only=True,
            heartbeat=1.0,
        )
    )
    try:
        await log.register(C, "http://example.org/c1/capabilitylist.xml")
        await log.append(C, payloads(1, 500), expected_head=0, checkpoint="c")
        await gateway.start()
        await log.append(C, payloads(501, 500), expected_head=500, checkpoint="c")
        await async_wait_for(
            lambda: len(collector.seqs) >= 1000, timeout=60, message="not everything pushed"
        )
        assert collector.seqs == list(range(1, 1001))  # once each, in order

        async def cursor_at_head() -> bool:  # the gateway keeps the durable cursor
            return await log.cursor(C, CURSOR_NAME) == 1000

        await async_wait_for(cursor_at_head, timeout=20, message="cursor never reached the head")
        # A collection the detecting publisher registers later.
        later = "example.org-c2-capabilitylist-5ca1e001"
        await log.register(later, "http://example.org/c2/capabilitylist.xml")
        body = json.loads(payloads(1, 1)[0])
        body["collection"] = later
        await log.append(later, [envelope.dumps(body)], expected_head=0, checkpoint="c")
        await async_wait_for(lambda: len(collector.seqs) >= 1001, timeout=20)
        assert collector.seqs[-1] == 1
    finally:
        await gateway.stop()
        await log.close()
        collector.close()


def test_mqtt_only_without_a_shared_log_or_a_broker_is_a_clear_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    for extra in (["--mqtt", "mqtt://127.0.0.1:1"], ["--redis", "redis://127.0.0.1:1/0"]):
        result = subprocess.run(
            [sys.executable, "-m", "rsnotify.cli", "publish", str(tmp_path), "--mqtt-only", *extra],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2
        assert "--mqtt-only pushes a shared log" in result.stdout


async def test_mqtt_only_gateways_elect_a_leader_of_their_own_beside_the_detecting_publishers(
    tmp_path: Path, redis_server: Redis, mosquitto_factory: Callable[..., Mosquitto]
) -> None:
    """``--ha`` on both halves of a split deployment, with one ``--ha-group``.

    Had the gateway campaigned in the detecting publishers' group, one of
    the two would never lead: either detection or the MQTT push would stop.
    """
    from tests.helpers import running_simulator

    broker = mosquitto_factory()
    site = tmp_path / "site"
    common = dict(redis=redis_server.url, ha=True, ha_group="one-source", lease_ttl=1.0)
    async with running_simulator(paused=True, dir=site, base_url="http://source.test/") as _:
        detecting = Publisher(
            PublisherConfig(source=str(site), state_dir=str(tmp_path / "s1"), **common)
        )
        gateway = Publisher(
            PublisherConfig(
                source=str(site),
                state_dir=str(tmp_path / "s2"),
                mqtt=broker.url,
                mqtt_only=True,
                **common,
            )
        )
        try:
            await detecting.start()
            await gateway.start()
            await async_wait_for(
                lambda: detecting.is_leader and gateway.is_leader,
                timeout=20,
                message=lambda: (
                    f"leaders: detecting {detecting.is_leader}, gateway {gateway.is_leader}"
                ),
            )
            assert "mqtt" in gateway.transports() and "mqtt" not in detecting.transports()
        finally:
            await gateway.stop()
            await detecting.stop()
