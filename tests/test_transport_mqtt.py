"""The MQTT transport against real brokers, with the real log backends.

Why one module of ~1,130 lines: it tests one component, the MQTT pusher, and 14 of its 17
tests run on the same rig -- a broker fixture (``broker``/``broker_factory`` over Mosquitto
and NATS, or Mosquitto alone), the plain-paho ``subscribers``, ``sqlite_log`` and
``running`` -- which splitting would only move to a helper module.

Subscribers here are plain paho-mqtt clients written the way a Destination
would write one, so the tests check the wire (topics, QoS 1 order, payload
bytes, MQTT 5 properties), not the pusher's own idea of what it sent.

Two brokers: Mosquitto (MQTT 5 and 3.1.1) everywhere, and NATS (MQTT 3.1.1
only, over JetStream, no ``.`` in topics) for the tests that do not depend on
Mosquitto's own features (ACL files, Receive Maximum, queue limits): those
take the ``broker`` or ``broker_factory`` fixture, parametrized over both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from rsnotify import envelope, outbound, w3cdt
from rsnotify.collection import collection_id
from rsnotify.envelope import SIGNATURE_PROPERTY, Notification, SignatureError
from rsnotify.log import LogRecord, NotificationLog, Retention
from rsnotify.log.redis_log import RedisLog
from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.model import ChangeType
from rsnotify.transport import InvalidBrokerURL, TransportError, mqttsig
from rsnotify.transport.mqtt import CURSOR_NAME, MqttPusher
from rsnotify.transport.mqtturl import parse_broker_url
from rsnotify.transport.topics import Topics
from tests.devstack import HOST, Mosquitto, NatsServer, Redis, async_wait_for

C1 = collection_id("https://example.org/c1/capabilitylist.xml")
C2 = collection_id("https://example.org/c2/capabilitylist.xml")
PREFIX = "rs-test"
TOPICS = Topics(PREFIX)
Broker = Mosquitto | NatsServer
FAST = {"reconnect_min": 0.05, "reconnect_max": 0.5, "cursor_interval": 0.02}


# --- helpers ---------------------------------------------------------------------


def envelope_bytes(collection: str, seq: int) -> bytes:
    """A realistic logged envelope (what the publisher appends)."""
    notification = Notification(
        collection=collection,
        seq=seq,
        capabilitylist=f"https://example.org/{collection}/capabilitylist.xml",
        changelist=f"https://example.org/{collection}/changelist.xml",
        loc=f"https://example.org/{collection}/res/{seq}%20a&b.txt",
        change=(ChangeType.CREATED, ChangeType.UPDATED, ChangeType.DELETED)[seq % 3],
        datetime=datetime(2024, 5, 1, tzinfo=UTC) + timedelta(seconds=seq),
        hash=f"md5:{seq:032x}",
        length=seq * 10,
        type="text/plain",
        detected=datetime(2024, 5, 2, tzinfo=UTC),
    )
    return envelope.to_json(notification)


async def append(log: NotificationLog, collection: str, count: int) -> int:
    head = await log.head(collection)
    payloads = [envelope_bytes(collection, s) for s in range(head + 1, head + count + 1)]
    return await log.append(collection, payloads, expected_head=head, checkpoint=f"cp{head}")


async def read_packet(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One MQTT control packet: (fixed header with its remaining-length varint, body)."""
    header = await reader.readexactly(1)
    length, multiplier = 0, 1
    while True:
        byte = await reader.readexactly(1)
        header += byte
        length += (byte[0] & 0x7F) * multiplier
        multiplier *= 128
        if not byte[0] & 0x80:
            return header, await reader.readexactly(length)


async def records(log: NotificationLog, collection: str) -> dict[int, LogRecord]:
    out: dict[int, LogRecord] = {}
    after = 0
    while batch := await log.read(collection, after, 1000):
        out.update((r.seq, r) for r in batch)
        after = batch[-1].seq
    return out


class Subscriber:
    """A plain paho subscriber at QoS 1, as a Destination would write it.

    MQTT 5 by default, 3.1.1 on NATS (which speaks nothing else).
    ``received`` holds ``(connection number, message)`` in arrival order.
    ``persistent`` keeps a broker session (clean start/session False, long
    expiry) so messages published while it is away are queued for it.
    """

    def __init__(
        self,
        broker: Broker,
        topics: list[str],
        *,
        persistent: bool = False,
        protocol: int | None = None,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        if protocol is None:
            protocol = mqtt.MQTTv311 if isinstance(broker, NatsServer) else mqtt.MQTTv5
        self.received: list[tuple[int, mqtt.MQTTMessage]] = []
        self.connections = 0
        self.subacks = 0
        self.topics = topics
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"test-sub-{uuid.uuid4().hex[:10]}",
            clean_session=None if protocol == mqtt.MQTTv5 else not persistent,
            protocol=protocol,
        )
        self.client.reconnect_delay_set(0.05, 0.2)  # type: ignore[arg-type]
        if credentials is not None:
            self.client.username_pw_set(*credentials)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        properties = None
        if persistent:
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = 3600
        options: dict[str, Any] = {}
        if protocol == mqtt.MQTTv5:
            options = {"clean_start": not persistent, "properties": properties}
        self.client.connect(broker.host, broker.port, keepalive=5, **options)
        self.client.loop_start()

    def _on_connect(self, client: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if not reason.is_failure:
            self.connections += 1
            client.subscribe([(t, 1) for t in self.topics])

    def _on_subscribe(self, *_args: Any) -> None:
        self.subacks += 1

    def _on_message(self, _c: mqtt.Client, _u: Any, message: mqtt.MQTTMessage) -> None:
        self.received.append((self.connections, message))

    async def subscribed(self) -> None:
        await async_wait_for(lambda: self.subacks >= 1, message="no SUBACK")

    def messages(self, suffix: str = "/changes") -> list[mqtt.MQTTMessage]:
        return [m for _, m in list(self.received) if m.topic.endswith(suffix)]

    def seqs(self, collection: str) -> list[int]:
        topic = TOPICS.changes(collection)
        return [json.loads(m.payload)["seq"] for m in self.messages() if m.topic == topic]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def signed_payload(message: mqtt.MQTTMessage) -> tuple[bytes, str | None]:
    """(signed bytes, signature): from the MQTT 5 user property, else the 3.1.1 trailer."""
    properties = getattr(message, "properties", None)
    user = dict(getattr(properties, "UserProperty", None) or ())
    if SIGNATURE_PROPERTY in user:
        return message.payload, user[SIGNATURE_PROPERTY]
    return mqttsig.detach(message.payload)


def is_v5(broker: Broker) -> bool:
    return isinstance(broker, Mosquitto)


@pytest.fixture(params=["mosquitto", "nats"])
def broker_factory(
    request: pytest.FixtureRequest,
    mosquitto_factory: Callable[..., Mosquitto],
    nats_factory: Callable[..., NatsServer],
) -> Callable[..., Broker]:
    """``make(start=True, **mosquitto_options)``: Mosquitto, or NATS (which takes none).

    NATS keeps sessions and queues in JetStream, like Mosquitto with persistence.
    """
    if request.param == "nats":
        return lambda *, start=True, **_mosquitto_only: nats_factory(start=start)
    return mosquitto_factory


@pytest.fixture
def broker(broker_factory: Callable[..., Broker]) -> Broker:
    return broker_factory(max_queued_messages=100_000, max_inflight_messages=100)


@pytest.fixture
def subscribers() -> Iterator[Callable[..., Subscriber]]:
    made: list[Subscriber] = []

    def make(broker: Broker, topics: list[str], **kwargs: Any) -> Subscriber:
        subscriber = Subscriber(broker, topics, **kwargs)
        made.append(subscriber)
        return subscriber

    yield make
    for subscriber in made:
        subscriber.close()


@pytest.fixture
async def sqlite_log(tmp_path: Path) -> AsyncIterator[NotificationLog]:
    log = SQLiteLog(tmp_path / "log.sqlite3")
    yield log
    await log.close()


@contextlib.asynccontextmanager
async def running(pusher: MqttPusher) -> AsyncIterator[asyncio.Task[None]]:
    """Run the pusher in a task; stop it (drain, disconnect) and check it ended cleanly."""
    task = asyncio.create_task(pusher.run())
    try:
        yield task
    finally:
        await pusher.stop()
        await task
        assert not any(pusher.client_id in t.name for t in threading.enumerate()), (
            "paho's network thread outlived the pusher"
        )


def assert_matches_record(message: mqtt.MQTTMessage, record: LogRecord) -> None:
    """The payload is outbound.render(record) apart from the ``published`` stamp."""
    obj = json.loads(message.payload)
    published = w3cdt.parse(obj.pop("published"))
    assert abs((w3cdt.now() - published).total_seconds()) < 60
    expected = json.loads(outbound.render(record).payload)
    del expected["published"]
    assert obj == expected


# --- delivery ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "kind"), [("sqlite", "mosquitto"), ("redis", "mosquitto"), ("sqlite", "nats")]
)
async def test_every_record_is_delivered_once_in_order_and_the_cursor_reaches_the_head(
    backend: str,
    kind: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    subscribers: Callable[..., Subscriber],
) -> None:
    # Mosquitto drops QoS 1 messages for a subscriber with more than
    # max_queued_messages (default 1000) waiting; a 2,000-message burst to a
    # Python subscriber can exceed that, which would be the broker's loss, not ours.
    mosquitto: Broker = request.getfixturevalue(f"{kind}_factory")(
        **({"max_queued_messages": 100_000} if kind == "mosquitto" else {})
    )
    if backend == "redis":
        server: Redis = request.getfixturevalue("redis_server")
        log: NotificationLog = RedisLog(server.url)
    else:
        log = SQLiteLog(tmp_path / "log.sqlite3")
    try:
        subscriber = subscribers(mosquitto, [f"{PREFIX}/+/changes"])
        await subscriber.subscribed()
        for c in (C1, C2):  # half logged before the pusher starts, half while it runs
            await append(log, c, 500)
        published: list[tuple[str, int, int, float]] = []
        pusher = MqttPusher(
            mosquitto.url,
            log,
            topic_prefix=PREFIX,
            on_published=lambda *args: published.append(args),
            **FAST,
        )
        pusher.add_collection(C1)
        started = time.monotonic()
        async with running(pusher):
            pusher.add_collection(C2)  # at runtime too
            for _ in range(10):
                for c in (C1, C2):
                    await append(log, c, 50)
            await async_wait_for(
                lambda: len(subscriber.messages()) >= 2000,
                timeout=20,
                message=lambda: f"received {len(subscriber.messages())} of 2000",
            )
            elapsed = time.monotonic() - started
            for c in (C1, C2):
                await async_wait_for(
                    lambda c=c: _cursor_is(log, c, 1000), message=f"{c} cursor below head"
                )
                assert pusher.acked(c) == 1000
        print(f"\nMQTT push ({backend} log, {kind}): 2000 notifications in {elapsed:.2f} s")

        assert pusher.stats.connections == 1
        assert pusher.protocol_in_use == ("5" if is_v5(mosquitto) else "3.1.1")
        for c in (C1, C2):
            await _received(subscriber, c, list(range(1, 1001)))  # once each, dense, in order
        logged = {c: await records(log, c) for c in (C1, C2)}
        for message in subscriber.messages():
            body = json.loads(message.payload)
            assert message.topic == TOPICS.changes(body["collection"])
            assert message.qos == 1
            if is_v5(mosquitto):
                assert message.properties.ContentType == "application/json"
            assert_matches_record(message, logged[body["collection"]][body["seq"]])
        assert len(published) == 2000
        assert {(c, s) for c, s, _, _ in published} == {
            (c, s) for c in (C1, C2) for s in range(1, 1001)
        }
        assert all(size > 100 and latency >= 0 for _, _, size, latency in published)
    finally:
        await log.close()


async def _received(subscriber: Subscriber, collection: str, expected: list[int]) -> None:
    """The seqs ``subscriber`` got of ``collection``, once it has as many as ``expected``: equal.

    A PUBACK (what moves the pusher's cursor) says the broker took a message,
    not that it has reached every subscriber yet: wait for the deliveries
    (a deadline, not a sleep), then compare the whole list, order and
    duplicates included.
    """
    await async_wait_for(
        lambda: len(subscriber.seqs(collection)) >= len(expected),
        message=lambda: f"{collection}: {len(subscriber.seqs(collection))} of {len(expected)}",
    )
    assert subscriber.seqs(collection) == expected


async def _cursor_is(log: NotificationLog, collection: str, seq: int) -> bool:
    return await log.cursor(collection, CURSOR_NAME) == seq


async def test_a_broker_outage_delays_pushes_without_losing_any_or_queueing_in_memory(
    sqlite_log: NotificationLog,
    broker_factory: Callable[..., Broker],
    subscribers: Callable[..., Subscriber],
) -> None:
    # Persistence + a persistent subscriber session: what the broker accepted
    # before the stop is still queued for the subscriber after the restart.
    broker = broker_factory(persistence=True, max_queued_messages=100_000)
    subscriber = subscribers(broker, [f"{PREFIX}/+/changes"], persistent=True)
    await subscriber.subscribed()
    window = 20
    pusher = MqttPusher(broker.url, sqlite_log, topic_prefix=PREFIX, window=window, **FAST)
    for c in (C1, C2):
        pusher.add_collection(c)
        await append(sqlite_log, c, 100)

    # Sampled every millisecond throughout: the messages paho holds for the
    # pusher's live client (``Client._out_messages``, paho's internal queue of
    # unacknowledged QoS 1 messages: no public accessor exists) and the
    # pusher's own count awaiting PUBACK.  Both must stay within what the
    # pusher may hand paho (the window on the wire plus as many in paho's
    # queue), including while 600 notifications pile up in the log during the
    # outage and while they are caught up afterwards.
    peaks = {"paho": 0, "window": 0, "paho while disconnected": 0}

    async def sample() -> None:
        while True:
            client = pusher._client
            queued = len(client._out_messages) if client is not None else 0
            peaks["paho"] = max(peaks["paho"], queued)
            peaks["window"] = max(peaks["window"], pusher.in_flight)
            if not pusher.connected:
                key = "paho while disconnected"
                peaks[key] = max(peaks[key], queued)
            await asyncio.sleep(0.001)

    sampler = asyncio.create_task(sample())
    try:
        async with running(pusher) as task:
            await async_wait_for(lambda: len(subscriber.messages()) >= 200, timeout=10)

            await broker.async_stop()
            await async_wait_for(lambda: not pusher.connected, message="outage not noticed")
            published = pusher.stats.published
            attempts = pusher.stats.connect_attempts
            for c in (C1, C2):
                await append(sqlite_log, c, 300)
            await async_wait_for(
                lambda: pusher.stats.connect_attempts >= attempts + 2,
                message="the pusher stopped trying to reconnect",
            )
            # Nothing was handed to paho while the broker was away.
            assert pusher.stats.published == published
            assert not pusher.connected and not task.done()

            await broker.async_start()
            await async_wait_for(lambda: pusher.connected, message="no reconnect")
            for c in (C1, C2):
                await async_wait_for(
                    lambda c=c: set(subscriber.seqs(c)) >= set(range(1, 401)),
                    timeout=15,
                    message=lambda c=c: (
                        f"{c}: missing {set(range(1, 401)) - set(subscriber.seqs(c))}"
                    ),
                )
                await async_wait_for(lambda c=c: _cursor_is(sqlite_log, c, 400))
            assert not task.done()
    finally:
        sampler.cancel()

    assert pusher.stats.connections == 2
    assert 0 < peaks["window"] <= 2 * window
    assert peaks["paho"] <= 2 * window
    assert peaks["paho while disconnected"] == 0
    for c in (C1, C2):
        seqs = subscriber.seqs(c)
        assert set(seqs) == set(range(1, 401))
        # Never a forward jump: each message is the next one, or a resend of an
        # earlier one after a reconnect (duplicates allowed, gaps never).
        highest = 0
        for seq in seqs:
            assert seq <= highest + 1, f"{c}: jumped from {highest} to {seq}"
            highest = max(highest, seq)


async def test_the_pusher_connects_once_a_broker_that_was_down_at_start_comes_up(
    sqlite_log: NotificationLog,
    broker_factory: Callable[..., Broker],
    subscribers: Callable[..., Subscriber],
) -> None:
    broker = broker_factory(start=False)
    await append(sqlite_log, C1, 30)
    pusher = MqttPusher(broker.url, sqlite_log, topic_prefix=PREFIX, **FAST)
    pusher.add_collection(C1)
    async with running(pusher) as task:
        await async_wait_for(lambda: pusher.stats.connect_attempts >= 3)
        assert not pusher.connected and not task.done()

        await broker.async_start()
        await async_wait_for(lambda: pusher.connected, message="never connected")
        await async_wait_for(lambda: _cursor_is(sqlite_log, C1, 30))
        subscriber = subscribers(broker, [f"{PREFIX}/+/changes", f"{PREFIX}/+/head"])
        await subscriber.subscribed()
        await append(sqlite_log, C1, 5)
        await async_wait_for(lambda: subscriber.seqs(C1) == [31, 32, 33, 34, 35])
        head = json.loads(subscriber.messages("/head")[0].payload)
        assert head["head"] >= 30


@pytest.mark.timeout(60)
async def test_a_collection_added_before_the_first_connection_is_pushed_once_it_connects(
    sqlite_log: NotificationLog,
    mosquitto_factory: Callable[..., Mosquitto],
    subscribers: Callable[..., Subscriber],
) -> None:
    """What ``publish --mqtt-only`` does: the collections arrive after run(), before CONNACK.

    The heartbeat loop used to spin without yielding once a collection asked
    for heads while the pusher was not connected yet, so the loop never ran
    the connection and nothing was ever pushed.
    """
    broker = mosquitto_factory(start=False)
    await append(sqlite_log, C1, 20)
    pusher = MqttPusher(broker.url, sqlite_log, topic_prefix=PREFIX, **FAST)
    async with running(pusher):
        await async_wait_for(lambda: pusher.stats.connect_attempts >= 1, timeout=20)
        pusher.add_collection(C1)  # running, not connected
        ticks = 0

        async def count_ticks() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(count_ticks())
        try:
            await async_wait_for(lambda: pusher.stats.connect_attempts >= 2, timeout=20)
            assert ticks > 0, "the event loop is starved"
        finally:
            ticker.cancel()
        await broker.async_start()
        subscriber = subscribers(broker, [f"{PREFIX}/+/changes"])
        await subscriber.subscribed()
        await async_wait_for(lambda: pusher.connected, timeout=20, message="never connected")
        await async_wait_for(lambda: _cursor_is(sqlite_log, C1, 20), timeout=20)
        await append(sqlite_log, C1, 3)
        await async_wait_for(lambda: subscriber.seqs(C1)[-3:] == [21, 22, 23], timeout=20)


async def test_a_message_the_broker_refuses_holds_the_cursor_until_it_is_accepted(
    sqlite_log: NotificationLog,
    mosquitto_factory: Callable[..., Mosquitto],
    subscribers: Callable[..., Subscriber],
) -> None:
    allow_c2_only = f"user pub\ntopic write {PREFIX}/+/head\ntopic write {TOPICS.changes(C2)}\n"
    broker = mosquitto_factory(
        password_file={"pub": "pub-secret", "sub": "sub-secret"},
        acl=allow_c2_only + f"user sub\ntopic read {PREFIX}/#\n",
    )
    subscriber = subscribers(broker, [f"{PREFIX}/+/changes"], credentials=("sub", "sub-secret"))
    await subscriber.subscribed()
    for c in (C1, C2):
        await append(sqlite_log, c, 5)
    url = f"mqtt://pub:pub-secret@{broker.host}:{broker.port}"  # credentials from the URL
    pusher = MqttPusher(url, sqlite_log, topic_prefix=PREFIX, **FAST)
    pusher.add_collection(C1)
    pusher.add_collection(C2)
    async with running(pusher) as task:
        await async_wait_for(lambda: _cursor_is(sqlite_log, C2, 5))
        await async_wait_for(lambda: pusher.stats.refused >= 2, message="no refusal seen")
        assert await sqlite_log.cursor(C1, CURSOR_NAME) == 0 and pusher.acked(C1) == 0
        assert subscriber.seqs(C1) == [] and not task.done()

        # Allowed at last (Mosquitto rereads its ACL file on SIGHUP): nothing was lost.
        assert broker.acl_path is not None and broker.process is not None
        broker.acl_path.write_text(
            f"user pub\ntopic write {PREFIX}/#\nuser sub\ntopic read {PREFIX}/#\n"
        )
        broker.process.send_signal(signal.SIGHUP)
        await async_wait_for(lambda: _cursor_is(sqlite_log, C1, 5), message="C1 never accepted")
    await _received(subscriber, C1, [1, 2, 3, 4, 5])
    await _received(subscriber, C2, [1, 2, 3, 4, 5])


# --- the retained head ------------------------------------------------------------


async def test_the_retained_head_tells_a_new_subscriber_where_the_log_stands(
    sqlite_log: NotificationLog,
    broker: Broker,
    subscribers: Callable[..., Subscriber],
) -> None:
    mosquitto = broker
    await append(sqlite_log, C1, 10)
    await sqlite_log.trim(C1, Retention(max_len=4, max_age_s=None), now_ms=0)  # keeps 7..10
    pusher = MqttPusher(mosquitto.url, sqlite_log, topic_prefix=PREFIX, heartbeat=0.2, **FAST)
    pusher.add_collection(C1)
    pusher.add_collection(C2)  # nothing logged yet
    async with running(pusher):
        await async_wait_for(lambda: _cursor_is(sqlite_log, C1, 10))
        assert pusher.stats.skipped == 6  # seqs 1..6 left the log before they could be pushed

        subscriber = subscribers(mosquitto, [f"{PREFIX}/+/head"])

        def heads(collection: str) -> list[dict[str, Any]]:
            bodies = [json.loads(m.payload) for m in subscriber.messages("/head")]
            return [b for b in bodies if b["collection"] == collection]

        await async_wait_for(lambda: heads(C1) and heads(C2), message="no retained heads")
        first = subscriber.messages("/head")[0]
        assert first.retain  # delivered from the broker's retained store
        assert first.topic == TOPICS.head(json.loads(first.payload)["collection"])
        if is_v5(broker):
            assert first.properties.ContentType == "application/json"
        assert {k: v for k, v in heads(C1)[0].items() if k != "heartbeat"} == {
            "type": "head",
            "collection": C1,
            "head": 10,
            "earliest": 7,
            "publisher": pusher.publisher_id,
        }
        # Issue 22: whoever reads the head must not learn the client id (with it,
        # any account could connect as the publisher and push it off the broker).
        assert all(pusher.client_id.encode() not in m.payload for m in subscriber.messages("/head"))
        assert (heads(C2)[0]["head"], heads(C2)[0]["earliest"]) == (0, 1)

        # The heartbeat refreshes, and the head follows the log.
        await async_wait_for(
            lambda: len({h["heartbeat"] for h in heads(C1)}) >= 2, message="no heartbeat"
        )
        stamps = [w3cdt.parse(h["heartbeat"]) for h in heads(C1)]
        assert stamps == sorted(stamps)
        await append(sqlite_log, C2, 3)
        await async_wait_for(lambda: heads(C2)[-1]["head"] == 3)


# --- signing, protocol versions, formats ----------------------------------------


def assert_signed_by(message: mqtt.MQTTMessage, keys: dict[str, bytes]) -> bytes:
    """Verify the signature (property or trailer); a flipped byte or another key fails.

    Returns the signed bytes (the payload without any 3.1.1 trailer).
    """
    payload, signature = signed_payload(message)
    envelope.verify(payload, signature, keys)
    tampered = bytearray(payload)
    tampered[len(tampered) // 2] ^= 0x01
    with pytest.raises(SignatureError):
        envelope.verify(bytes(tampered), signature, keys)
    with pytest.raises(SignatureError):
        envelope.verify(payload, signature, {"k1": b"another secret"})
    return payload


async def test_signed_payloads_verify_and_a_tampered_byte_fails(
    sqlite_log: NotificationLog,
    broker: Broker,
    subscribers: Callable[..., Subscriber],
) -> None:
    """On MQTT 5 the signature is a user property; on 3.1.1 (NATS) it trails the payload."""
    keys = {"k1": b"s3cret"}
    subscriber = subscribers(broker, [f"{PREFIX}/+/changes", f"{PREFIX}/+/head"])
    await subscriber.subscribed()
    await append(sqlite_log, C1, 5)
    pusher = MqttPusher(
        broker.url,
        sqlite_log,
        topic_prefix=PREFIX,
        signer=outbound.Signer("k1", keys["k1"]),
        **FAST,
    )
    pusher.add_collection(C1)
    async with running(pusher):
        await async_wait_for(lambda: subscriber.seqs(C1) == [1, 2, 3, 4, 5])
        await async_wait_for(lambda: subscriber.messages("/head"))
    assert pusher.protocol_in_use == ("5" if is_v5(broker) else "3.1.1")
    logged = await records(sqlite_log, C1)
    for message in subscriber.messages() + subscriber.messages("/head"):
        properties = dict(getattr(message.properties, "UserProperty", None) or ())
        assert (SIGNATURE_PROPERTY in properties) == is_v5(broker)
        payload = assert_signed_by(message, keys)
        assert (payload == message.payload) == is_v5(broker)
    for message in subscriber.messages():
        # The signed bytes are the rendered notification, trailer or not.
        payload, _ = signed_payload(message)
        body = json.loads(payload)
        assert SIGNATURE_PROPERTY not in body
        assert_matches_record_bytes(payload, logged[body["seq"]])


def assert_matches_record_bytes(payload: bytes, record: LogRecord) -> None:
    obj = json.loads(payload)
    obj.pop("published")
    expected = json.loads(outbound.render(record).payload)
    del expected["published"]
    assert obj == expected


async def test_mqtt_3_1_1_carries_the_signature_at_the_end_of_the_payload(
    sqlite_log: NotificationLog,
    mosquitto: Mosquitto,
    subscribers: Callable[..., Subscriber],
) -> None:
    """A 3.1.1 connection has no properties: the JSON payload gets one more member, last.

    Readers that know nothing of it still parse the notification (unknown
    fields are ignored); the signature covers the bytes before it.
    """
    keys = {"k1": b"s3cret"}
    old = subscribers(mosquitto, [f"{PREFIX}/+/changes"], protocol=mqtt.MQTTv311)
    new = subscribers(mosquitto, [f"{PREFIX}/+/changes"], protocol=mqtt.MQTTv5)
    await old.subscribed()
    await new.subscribed()
    await append(sqlite_log, C1, 3)
    pusher = MqttPusher(
        mosquitto.url,
        sqlite_log,
        topic_prefix=PREFIX,
        protocol="3.1.1",
        signer=outbound.Signer("k1", keys["k1"]),
        **FAST,
    )
    pusher.add_collection(C1)
    async with running(pusher):
        await async_wait_for(lambda: old.seqs(C1) == [1, 2, 3] and new.seqs(C1) == [1, 2, 3])
    assert pusher.protocol_in_use == "3.1.1"
    for message in old.messages() + new.messages():
        assert message.payload.endswith(b'"}')
        body = json.loads(message.payload)  # a plain JSON reader is not disturbed
        assert body[SIGNATURE_PROPERTY].startswith("k1:sha256=")
        assert list(body)[-1] == SIGNATURE_PROPERTY
        assert_signed_by(message, keys)


async def test_mqtt_3_1_1_without_a_signer_delivers_plain_payloads(
    sqlite_log: NotificationLog,
    mosquitto: Mosquitto,
    subscribers: Callable[..., Subscriber],
) -> None:
    subscriber = subscribers(mosquitto, [f"{PREFIX}/+/changes"], protocol=mqtt.MQTTv311)
    await subscriber.subscribed()
    await append(sqlite_log, C1, 3)
    pusher = MqttPusher(mosquitto.url, sqlite_log, topic_prefix=PREFIX, protocol="3.1.1", **FAST)
    pusher.add_collection(C1)
    async with running(pusher):
        await async_wait_for(lambda: subscriber.seqs(C1) == [1, 2, 3])
    assert pusher.protocol_in_use == "3.1.1"
    logged = await records(sqlite_log, C1)
    for message in subscriber.messages():
        assert_matches_record(message, logged[json.loads(message.payload)["seq"]])


class Relay:
    """A TCP relay in front of Mosquitto, to stage what a real broker does rarely.

    ``refuse_mqtt5``: answer an MQTT 5 CONNECT as a 3.1.1-only broker does
    (CONNACK return code 1, "unacceptable protocol version", then close, like
    Mosquitto 1.4); anything else is relayed byte for byte.  :meth:`hold_replies`
    drops what the broker sends back (PUBACKs included) while the client's
    packets still reach it; :meth:`cut` then closes every connection: a network
    failure with messages delivered but not acknowledged.
    """

    def __init__(self, upstream: Mosquitto, *, refuse_mqtt5: bool = False) -> None:
        self.upstream = upstream
        self.refuse_mqtt5 = refuse_mqtt5
        self.refused = 0
        self.relayed = 0
        self.holding = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"mqtt://{HOST}:{self._server.sockets[0].getsockname()[1]}"

    def hold_replies(self) -> None:
        self.holding = True

    def cut(self) -> None:
        self.holding = False
        for writer in list(self._writers):
            writer.close()

    async def __aenter__(self) -> Relay:
        self._server = await asyncio.start_server(self._handle, HOST, 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            header, body = await read_packet(reader)
            level = body[2 + int.from_bytes(body[:2], "big")]  # after the protocol name
            if level == 5 and self.refuse_mqtt5:
                self.refused += 1
                writer.write(b"\x20\x02\x00\x01")
                await writer.drain()
                return
            self.relayed += 1
            up_reader, upstream = await asyncio.open_connection(
                self.upstream.host, self.upstream.port
            )
            self._writers.add(upstream)
            upstream.write(header + body)
            await asyncio.gather(
                self._pipe(reader, upstream), self._pipe(up_reader, writer, holdable=True)
            )
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    w.close()
                    self._writers.discard(w)
            self._handlers.discard(task)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, holdable: bool = False
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                if holdable and self.holding:
                    continue
                writer.write(data)
                await writer.drain()
        writer.close()


async def test_a_cut_connection_resends_unacknowledged_messages_with_the_same_seqs(
    sqlite_log: NotificationLog,
    mosquitto: Mosquitto,
    subscribers: Callable[..., Subscriber],
) -> None:
    subscriber = subscribers(mosquitto, [f"{PREFIX}/+/changes"])
    await subscriber.subscribed()
    async with Relay(mosquitto) as relay:
        # Heads share the window; keep them out of the way (one at connect, then none).
        pusher = MqttPusher(
            relay.url, sqlite_log, topic_prefix=PREFIX, window=20, heartbeat=3600, **FAST
        )
        pusher.add_collection(C1)
        async with running(pusher):
            await append(sqlite_log, C1, 10)
            await async_wait_for(lambda: _cursor_is(sqlite_log, C1, 10))
            await async_wait_for(lambda: pusher.stats.heads == 1)

            # The broker gets 11..30 (the window on the wire) and delivers them,
            # but no PUBACK comes back; 31..40 wait in paho's queue behind them.
            relay.hold_replies()
            await append(sqlite_log, C1, 30)
            await async_wait_for(lambda: subscriber.seqs(C1)[-1:] == [30])
            await async_wait_for(lambda: pusher.in_flight == 30)  # all handed to paho
            assert pusher.acked(C1) == 10 and pusher.stats.published == 40
            assert subscriber.seqs(C1)[-1:] == [30]  # paho kept 31..40 off the wire

            relay.cut()
            await async_wait_for(lambda: subscriber.seqs(C1)[-1:] == [40])
            await async_wait_for(lambda: _cursor_is(sqlite_log, C1, 40))
        assert pusher.stats.connections == 2
        assert pusher.stats.published == 10 + 30 + 30  # 11..40 twice, once unacknowledged
    # The contract: in order per connection, duplicates with the same seq, no gap.
    await _received(subscriber, C1, [*range(1, 31), *range(11, 41)])


async def test_stop_drains_up_to_a_deadline_and_a_new_pusher_resumes_from_the_cursor(
    sqlite_log: NotificationLog,
    mosquitto: Mosquitto,
    subscribers: Callable[..., Subscriber],
) -> None:
    subscriber = subscribers(mosquitto, [f"{PREFIX}/+/changes"])
    await subscriber.subscribed()
    await append(sqlite_log, C1, 5)
    async with Relay(mosquitto) as relay:
        first = MqttPusher(relay.url, sqlite_log, topic_prefix=PREFIX, drain_timeout=0.3, **FAST)
        first.add_collection(C1)
        async with running(first):
            await async_wait_for(lambda: _cursor_is(sqlite_log, C1, 5))
            relay.hold_replies()
            await append(sqlite_log, C1, 5)
            await async_wait_for(lambda: subscriber.seqs(C1)[-1:] == [10])
            stopping = time.monotonic()
        assert time.monotonic() - stopping < 3  # gave up on the PUBACKs at the deadline
        assert await sqlite_log.cursor(C1, CURSOR_NAME) == 5  # 6..10 were never acknowledged

        relay.cut()
        second = MqttPusher(relay.url, sqlite_log, topic_prefix=PREFIX, **FAST)
        second.add_collection(C1)
        async with running(second):
            await async_wait_for(lambda: _cursor_is(sqlite_log, C1, 10))
    assert second.stats.published == 5
    await _received(subscriber, C1, [*range(1, 11), *range(6, 11)])


async def test_auto_falls_back_to_3_1_1_when_the_broker_refuses_mqtt_5(
    sqlite_log: NotificationLog,
    mosquitto: Mosquitto,
    subscribers: Callable[..., Subscriber],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Refused once, remembered: a reconnect goes straight to 3.1.1, logged once, signed."""
    keys = {"k1": b"s3cret"}
    subscriber = subscribers(mosquitto, [f"{PREFIX}/+/changes"])
    await subscriber.subscribed()
    await append(sqlite_log, C1, 3)
    caplog.set_level("INFO", logger="rsnotify.transport.mqtt")
    async with Relay(mosquitto, refuse_mqtt5=True) as old_broker:
        pusher = MqttPusher(
            old_broker.url,
            sqlite_log,
            topic_prefix=PREFIX,
            signer=outbound.Signer("k1", keys["k1"]),
            **FAST,
        )
        pusher.add_collection(C1)
        async with running(pusher):
            await async_wait_for(lambda: subscriber.seqs(C1) == [1, 2, 3])
            old_broker.cut()  # a reconnect: the protocol that worked is remembered
            await async_wait_for(lambda: pusher.stats.connections == 2)
            await append(sqlite_log, C1, 1)
            await async_wait_for(lambda: subscriber.seqs(C1)[-1:] == [4])
        assert pusher.protocol_in_use == "3.1.1"
        assert old_broker.refused == 1 and old_broker.relayed == 2
    fallbacks = [r for r in caplog.records if "refused MQTT 5" in r.getMessage()]
    assert len(fallbacks) == 1, [r.getMessage() for r in fallbacks]
    for message in subscriber.messages():
        assert_signed_by(message, keys)  # nothing unsigned went out on 3.1.1


async def test_xml_payloads_parse_as_change_notifications(
    sqlite_log: NotificationLog,
    broker: Broker,
    subscribers: Callable[..., Subscriber],
) -> None:
    keys = {"k1": b"s3cret"}
    subscriber = subscribers(broker, [f"{PREFIX}/+/changes"])
    await subscriber.subscribed()
    await append(sqlite_log, C1, 4)
    pusher = MqttPusher(
        broker.url,
        sqlite_log,
        topic_prefix=PREFIX,
        fmt="xml",
        signer=outbound.Signer("k1", keys["k1"]),
        **FAST,
    )
    pusher.add_collection(C1)
    async with running(pusher):
        await async_wait_for(lambda: len(subscriber.messages()) == 4)
    logged = await records(sqlite_log, C1)
    # On 3.1.1 the signature is a processing instruction after the root element:
    # the whole payload still parses as XML, and so do the signed bytes.
    decoded = [envelope.from_xml(m.payload) for m in subscriber.messages()]
    assert [n.seq for n in decoded] == [1, 2, 3, 4]
    for message, notification in zip(subscriber.messages(), decoded, strict=True):
        payload = assert_signed_by(message, keys)
        assert envelope.from_xml(payload) == notification
        if is_v5(broker):
            assert message.properties.ContentType == "application/xml"
        else:
            assert (
                message.payload.endswith(b"?>") and b"<?rsnotify-signature k1:" in message.payload
            )
        assert notification.published is not None
        notification.published = None
        assert notification == envelope.from_json(logged[notification.seq].data)


# --- configuration errors ---------------------------------------------------------


def test_broker_urls_parse_with_defaults_and_bad_ones_are_refused() -> None:
    url = parse_broker_url("mqtts://alice:p%40ss@Broker.example:9999")
    assert (url.host, url.port, url.tls, url.username, url.password) == (
        "broker.example",
        9999,
        True,
        "alice",
        "p@ss",
    )
    assert "p@ss" not in url.redacted() and "p%40ss" not in repr(url)
    assert parse_broker_url("mqtt://h").port == 1883
    assert parse_broker_url("mqtts://h").port == 8883
    assert parse_broker_url("mqtt://h:1884/rs/c/changes").topic == "rs/c/changes"
    for bad in ("http://h", "mqtt://", "mqtt://h:99999", "mqtt://h:0", "mqtt://h?x=1"):
        with pytest.raises(InvalidBrokerURL):
            parse_broker_url(bad)


async def test_bad_pusher_options_are_clear_errors(sqlite_log: NotificationLog) -> None:
    with pytest.raises(InvalidBrokerURL):
        MqttPusher("mqtt://h:1883/some/topic", sqlite_log)
    for options in (
        {"fmt": "yaml"},
        {"protocol": "4"},
        {"window": 0},
        {"heartbeat": 0},
        {"topic_prefix": "a/#"},
        {"topic_prefix": "example.org"},  # NATS refuses '.' in topics
        {"topic_prefix": "my prefix"},
        {"topic_prefix": "$SYS"},
        {"topic_prefix": "a//b"},
        {"topic_prefix": "x" * 65},
        {"topic_prefix": "a/b/c/d/e"},
        {"tls_ca": "/nonexistent.pem"},  # TLS options with mqtt://
    ):
        with pytest.raises(TransportError):
            MqttPusher("mqtt://h", sqlite_log, **options)
    with pytest.raises(TransportError, match="TLS"):
        MqttPusher("mqtts://h", sqlite_log, tls_ca="/nonexistent.pem")
    pusher = MqttPusher("mqtt://h", sqlite_log)
    with pytest.raises(TransportError):
        pusher.add_collection("a/b")
    with pytest.raises(TransportError):
        pusher.acked(C1)


class PacketRelay:
    """A TCP relay to a broker that reads MQTT packet framing both ways.

    Subclasses look at (and may rewrite) each packet body in
    :meth:`from_client` and :meth:`from_broker`; the length must not change.
    :meth:`hold_client` may keep a client's packet back (and every one after
    it) until it returns.
    """

    def __init__(self, upstream: Mosquitto) -> None:
        self.upstream = upstream
        self.server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"mqtt://{HOST}:{self.port}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._client, HOST, 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def __aenter__(self) -> PacketRelay:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    def from_client(self, header: bytes, body: bytes) -> bytes:
        return body

    def from_broker(self, header: bytes, body: bytes) -> bytes:
        return body

    async def hold_client(self, header: bytes) -> None:
        """Awaited before a client's packet goes on (``header[0] >> 4`` is its type)."""

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.upstream.host, self.upstream.port)
        await asyncio.gather(
            self._pump(reader, up_writer, self.from_client, self.hold_client),
            self._pump(up_reader, writer, self.from_broker),
            return_exceptions=True,
        )
        for w in (writer, up_writer):
            w.close()

    @staticmethod
    async def _pump(
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        edit: Callable[[bytes, bytes], bytes],
        hold: Callable[[bytes], Awaitable[None]] | None = None,
    ) -> None:
        while True:
            header, body = await read_packet(reader)
            if hold is not None:
                await hold(header)
            writer.write(header + edit(header, body))
            await writer.drain()


class _MqttCounter(PacketRelay):
    """Tracks QoS 1 PUBLISHes awaiting their PUBACK: the wire-level check of Receive Maximum."""

    def __init__(self, upstream: Mosquitto) -> None:
        super().__init__(upstream)
        self.outstanding: set[int] = set()
        self.most = 0
        self.publishes = 0

    def from_client(self, header: bytes, body: bytes) -> bytes:
        first = header[0]
        if first >> 4 == 3 and (first >> 1) & 3 == 1:  # PUBLISH, QoS 1
            topic_len = int.from_bytes(body[:2], "big")
            mid = int.from_bytes(body[2 + topic_len : 4 + topic_len], "big")
            self.outstanding.add(mid)
            self.publishes += 1
            self.most = max(self.most, len(self.outstanding))
        return body

    def from_broker(self, header: bytes, body: bytes) -> bytes:
        if header[0] >> 4 == 4:  # PUBACK
            self.outstanding.discard(int.from_bytes(body[:2], "big"))
        return body


async def test_no_more_publishes_await_a_puback_than_the_brokers_receive_maximum(
    sqlite_log: NotificationLog,
    mosquitto_factory: Callable[..., Mosquitto],
    subscribers: Callable[..., Subscriber],
) -> None:
    # Mosquitto advertises max_inflight_messages as its MQTT 5 Receive Maximum
    # (default 20) without enforcing it on QoS 1; stricter brokers disconnect
    # a client that exceeds it.  Counted on the wire, between pusher and broker.
    mosquitto = mosquitto_factory(
        max_queued_messages=100_000, extra_config="max_inflight_messages 4"
    )
    relay = _MqttCounter(mosquitto)
    await relay.start()
    try:
        subscriber = subscribers(mosquitto, [f"{PREFIX}/+/changes"])
        await subscriber.subscribed()
        await append(sqlite_log, C1, 600)
        pusher = MqttPusher(relay.url, sqlite_log, topic_prefix=PREFIX, **FAST)
        assert pusher.window > 4
        pusher.add_collection(C1)
        async with running(pusher):
            await async_wait_for(
                lambda: len(subscriber.messages()) >= 600,
                timeout=20,
                message=lambda: f"received {len(subscriber.messages())} of 600",
            )
        assert subscriber.seqs(C1) == list(range(1, 601))
        assert pusher.inflight_limit == 4
        assert relay.publishes >= 600
        assert 1 < relay.most <= 4
    finally:
        await relay.close()


def test_properties_packed_once_are_the_bytes_paho_would_pack() -> None:
    from rsnotify.transport.mqttmessage import PackedOnce

    def build(kind: type[Properties]) -> Properties:
        props = kind(PacketTypes.PUBLISH)
        props.ContentType = "application/json"
        props.PayloadFormatIndicator = 1
        props.UserProperty = [(SIGNATURE_PROPERTY, "k1:abc")]
        return props

    once, plain = build(PackedOnce), build(Properties)
    assert once.pack() == plain.pack()
    assert once.pack() is once.pack()  # cached
    once.ContentType = plain.ContentType = "application/xml"  # a change re-packs
    assert once.pack() == plain.pack()
