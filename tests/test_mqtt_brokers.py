"""Every rsnotify MQTT client on any broker (issue 18 items 1, 4 and 5; issue 22 item 8).

The three clients (the publisher's pusher, which is also the ``--mqtt-only``
gateway; the subscriber's channel; the dashboard's head reader) share one
connection loop (:mod:`rsnotify.transport.mqttlink`); these tests hold each of
them to it, against real brokers on loopback:

* on NATS (MQTT 3.1.1 only) each falls back from MQTT 5, says so once,
  remembers it across a broker restart, and still carries and checks
  signatures (the 3.1.1 trailer);
* bad credentials, a refused protocol and an unreachable broker give one line
  on every client that says what to change, then the retry policy, and the
  subscriber turns it into an ``Unavailable`` event for its sync engine;
* a subscription the broker refuses, and the legacy topic names on NATS, are
  reported as such.

The acceptance run (processes, 1,500 changes, a broker kill) is in
``test_nats_acceptance.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from rsnotify import envelope, outbound
from rsnotify.collection import collection_id
from rsnotify.dashboard.collector import MqttHeads
from rsnotify.log import NotificationLog
from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.subscriber import events as ev
from rsnotify.subscriber.channels import MqttChannel
from rsnotify.transport.mqtt import MqttPusher
from rsnotify.transport.mqttlink import BrokerLink
from tests.devstack import Mosquitto, NatsServer, async_wait_for, free_port
from tests.test_transport_mqtt import append

C1 = collection_id("https://source.example.org/c1/capabilitylist.xml")
PREFIX = "rs-test"
KEYS = {"k1": b"s3cret"}
FAST = {"reconnect_min": 0.05, "reconnect_max": 0.5}
KINDS = ("publisher", "subscriber", "dashboard")


@pytest.fixture
async def sqlite_log(tmp_path: Path) -> AsyncIterator[NotificationLog]:
    log = SQLiteLog(tmp_path / "log.sqlite3")
    yield log
    await log.close()


class Client:
    """One of the three MQTT clients, started and stopped the same way."""

    def __init__(self, kind: str, url: str, log: NotificationLog, **options: Any) -> None:
        self.kind = kind
        self.events: list[ev.Event] = []
        self.heads: dict[str, dict[str, Any]] = {}
        self._task: asyncio.Task[None] | None = None
        if kind == "publisher":
            self.pusher = MqttPusher(
                url,
                log,
                topic_prefix=PREFIX,
                signer=outbound.Signer("k1", KEYS["k1"]),
                heartbeat=0.2,
                cursor_interval=0.02,
                **FAST,
                **options,
            )
            self.pusher.add_collection(C1)
            self.link: BrokerLink = self.pusher.link
        elif kind == "subscriber":
            self.channel = MqttChannel(
                url,
                {C1: self.events.append},
                topic_prefix=PREFIX,
                client_id="rsnotify-sub-test",
                **FAST,
                **options,
            )
            self.link = self.channel.link
        else:
            self.reader = MqttHeads(url, PREFIX, self.heads.__setitem__, **options)
            self.link = self.reader.link

    @property
    def option(self) -> str:
        return "--via" if self.kind == "subscriber" else "--mqtt"

    def start(self) -> None:
        if self.kind == "publisher":
            self._task = asyncio.create_task(self.pusher.run())
        elif self.kind == "subscriber":
            self.channel.start()
        else:
            self.reader.start()

    async def stop(self) -> None:
        if self.kind == "publisher":
            await self.pusher.stop()
            assert self._task is not None
            await self._task
        elif self.kind == "subscriber":
            await self.channel.stop()
        else:
            await self.reader.stop()

    def messages(self) -> list[ev.Message]:
        return [e for e in self.events if isinstance(e, ev.Message)]

    def seqs(self) -> list[int]:
        return [json.loads(m.payload)["seq"] for m in self.messages()]


@pytest.fixture
def clients(sqlite_log: NotificationLog) -> Any:
    made: list[Client] = []

    @contextlib.asynccontextmanager
    async def run(kind: str, url: str, **options: Any) -> AsyncIterator[Client]:
        client = Client(kind, url, sqlite_log, **options)
        made.append(client)
        client.start()
        try:
            yield client
        finally:
            await client.stop()

    return run


def lines(caplog: pytest.LogCaptureFixture, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if needle in r.getMessage()]


# --- NATS: MQTT 3.1.1 on every client ---------------------------------------------------


async def test_every_client_falls_back_to_3_1_1_on_nats_once_and_keeps_signatures(
    nats: NatsServer,
    sqlite_log: NotificationLog,
    clients: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    await append(sqlite_log, C1, 3)
    async with contextlib.AsyncExitStack() as stack:
        subscriber = await stack.enter_async_context(clients("subscriber", nats.url))
        dashboard = await stack.enter_async_context(clients("dashboard", nats.url))
        # Publishing before the subscription is acknowledged would lose the messages.
        await async_wait_for(subscriber.channel.subscribed.is_set, timeout=15)
        publisher = await stack.enter_async_context(clients("publisher", nats.url))
        await async_wait_for(lambda: len(subscriber.messages()) >= 3, timeout=15)
        await async_wait_for(lambda: C1 in dashboard.heads, timeout=15)
        for client in (publisher, subscriber, dashboard):
            assert client.link.protocol_in_use == "3.1.1", client.kind

        # A broker restart: each reconnects straight to 3.1.1 (remembered).
        attempts = {c.kind: c.link.stats.connect_attempts for c in (publisher, subscriber)}
        nats.kill()
        await async_wait_for(lambda: not subscriber.link.connected, timeout=10)
        await nats.async_start()
        await async_wait_for(
            lambda: all(c.link.stats.connections == 2 for c in (publisher, subscriber, dashboard)),
            timeout=20,
            message="not every client reconnected",
        )
        await append(sqlite_log, C1, 1)
        await async_wait_for(lambda: 4 in subscriber.seqs(), timeout=15)

    # "refused MQTT 5" once per client, not once per connection.
    assert len(lines(caplog, "refused MQTT 5; using MQTT 3.1.1")) == 3
    for kind in ("publisher", "subscriber"):
        client = {"publisher": publisher, "subscriber": subscriber}[kind]
        # 1 refused MQTT 5 attempt, then only 3.1.1 ones (failures while it was down).
        assert client.link.stats.connect_attempts > attempts[kind]
    events = subscriber.events
    assert [type(e) for e in events if isinstance(e, ev.Connected | ev.Disconnected)] == [
        ev.Connected,
        ev.Disconnected,
        ev.Connected,
    ]
    for message in subscriber.messages():
        envelope.verify(message.payload, message.signature, KEYS)  # the trailer, detached
        assert envelope.SIGNATURE_PROPERTY.encode() not in message.payload
    assert set(subscriber.seqs()) == {1, 2, 3, 4}
    head = dashboard.heads[C1]
    assert head["collection"] == C1 and head["publisher"] == publisher.pusher.publisher_id
    assert publisher.pusher.client_id not in json.dumps(head)


# --- one line per problem, on every client ---------------------------------------------------


def _bad_password(factory: Callable[..., Mosquitto]) -> str:
    broker = factory(password_file={"alice": "right"})
    return f"mqtt://alice:wrong@{broker.host}:{broker.port}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("problem", "state", "says"),
    [
        ("bad credentials", "refused", "refused user 'alice' ({reason}): fix USER:PASSWORD in"),
        ("unreachable", "unreachable", "(connection refused); start the broker, or fix the host"),
        ("refused protocol", "refused", "refused MQTT 5 (Unsupported protocol version)"),
    ],
    ids=["bad-credentials", "unreachable", "refused-protocol"],
)
async def test_each_broker_problem_is_one_line_that_says_what_to_change_on_every_client(
    kind: str,
    problem: str,
    state: str,
    says: str,
    clients: Any,
    mosquitto_factory: Callable[..., Mosquitto],
    nats_factory: Callable[..., NatsServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    options: dict[str, Any] = {}
    if problem == "bad credentials":
        url = _bad_password(mosquitto_factory)
    elif problem == "unreachable":
        url = f"mqtt://127.0.0.1:{free_port()}"  # nothing listens there
    else:
        url, options = nats_factory().url, {"protocol": "5"}  # NATS speaks only 3.1.1
    caplog.set_level(logging.INFO)
    async with clients(kind, url, **options) as client:
        await async_wait_for(lambda: client.link.state.state == state, timeout=10)
        reason = client.link.state.reason
        await async_wait_for(lambda: lines(caplog, reason), timeout=5)
        if kind == "subscriber":
            await async_wait_for(lambda: client.events, timeout=5)
    expected = says.format(reason="Bad user name or password")
    if problem == "bad credentials" and expected not in reason:
        # Mosquitto answers an MQTT 5 client "not authorized" for a wrong password.
        expected = "refused user 'alice' (Not authorized): check USER:PASSWORD in"
    assert expected in reason, reason
    assert client.option in reason or problem == "refused protocol", reason
    if problem == "refused protocol":
        assert "--mqtt-protocol" in reason
    assert "\n" not in reason and "wrong" not in reason  # one line, never the password
    (logged,) = {line for line in lines(caplog, reason)}
    assert "; retrying in " in logged and "until it works" in logged  # the retry policy
    assert client.link.state.retry_in is not None and client.link.state.retry_in > 0
    if kind == "subscriber":
        unavailable = [e for e in client.events if isinstance(e, ev.Unavailable)]
        assert unavailable and unavailable[0] == ev.Unavailable(
            state, reason, unavailable[0].retry_in
        )


# --- refused topics ------------------------------------------------------------------------


async def test_a_subscription_the_broker_refuses_is_reported_to_the_engine(
    nats_factory: Callable[..., NatsServer], clients: Any
) -> None:
    broker = nats_factory(
        extra_config=(
            "authorization { users = [ {user: sub, password: pw, "
            'permissions: {subscribe: {deny: ["rs-test.>"]}}} ] }'
        )
    )
    async with clients("subscriber", f"mqtt://sub:pw@{broker.host}:{broker.port}") as sub:
        await async_wait_for(
            lambda: len([e for e in sub.events if isinstance(e, ev.Unavailable)]) >= 2,
            timeout=10,
        )
    refused = [e for e in sub.events if isinstance(e, ev.Unavailable)]
    topics = sorted(r.reason.split("subscription to '", 1)[1].split("'")[0] for r in refused)
    channel_topics = [t for t, _, legacy in sub.channel.topics.read(C1) if not legacy]
    assert topics == sorted(channel_topics)  # the legacy names' refusal is not reported
    assert all(r.state == "refused" and r.retry_in is None for r in refused)
    assert "allow it to read rs-test/+/changes and rs-test/+/head" in refused[0].reason


async def test_legacy_topics_on_nats_are_refused_with_a_line_that_names_the_cause(
    nats: NatsServer,
    sqlite_log: NotificationLog,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """NATS drops a 3.1.1 client that publishes on a topic with a dot, without a reason code."""
    await append(sqlite_log, C1, 1)
    pusher = MqttPusher(
        nats.url, sqlite_log, topic_prefix=PREFIX, legacy_topics=True, heartbeat=3600, **FAST
    )
    pusher.add_collection(C1)
    task = asyncio.create_task(pusher.run())
    try:
        await async_wait_for(lambda: lines(caplog, "without acknowledging any"), timeout=10)
    finally:
        await pusher.stop()
        await task
    (line, *_) = lines(caplog, "without acknowledging any")
    assert f"'{PREFIX}/{C1}/" in line and "NATS refuses '.'" in line
    assert pusher.stats.acked == 0
