"""The paho bridge on its own: the thread hop, subscribe futures, publish and PUBACKs.

:class:`rsnotify.transport.mqttlink.BrokerLink` is the one way every
rsnotify MQTT client (pusher, subscriber channel, dashboard) talks to paho.
The connection loop itself (fallback, backoff, one-line errors) is held to
real brokers in ``test_mqtt_brokers.py``; here: paho's events reach the
asyncio loop, in order, on the loop's thread; a subscription's future holds
the SUBACK's reason codes; a refused topic reaches the subscriber's engine.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from rsnotify.subscriber import events as ev
from rsnotify.subscriber.channels import MqttChannel
from rsnotify.transport import TransportError
from rsnotify.transport.handoff import Handoff
from rsnotify.transport.mqttlink import BrokerLink
from rsnotify.transport.mqtturl import parse_broker_url
from rsnotify.transport.topics import Topics
from tests.devstack import Mosquitto, async_wait_for
from tests.test_transport_mqtt import C1, C2, PREFIX, PacketRelay

LOG = logging.getLogger("rsnotify.test.bridge")
FAST = {"reconnect_min": 0.05, "reconnect_max": 0.5}


# --- the hand-off ----------------------------------------------------------------------


async def test_calls_from_another_thread_run_on_the_loop_in_order() -> None:
    handoff = Handoff(LOG)
    handoff.bind(asyncio.get_running_loop())
    seen: list[tuple[int, int]] = []
    done = asyncio.Event()

    def producer() -> None:
        for i in range(20_000):
            handoff.post(lambda i=i: seen.append((i, threading.get_ident())))
        handoff.post(done.set)

    thread = threading.Thread(target=producer)
    thread.start()
    async with asyncio.timeout(20):
        await done.wait()
    thread.join()
    assert [i for i, _ in seen] == list(range(20_000))
    assert {ident for _, ident in seen} == {threading.get_ident()}  # the loop's thread


async def test_a_burst_wakes_the_loop_once_and_a_failing_call_strands_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    wakeups: list[object] = []
    original = loop.call_soon_threadsafe

    def counting(*args: Any, **kwargs: Any) -> asyncio.Handle:
        wakeups.append(args[0])
        return original(*args, **kwargs)

    handoff = Handoff(LOG)
    handoff.bind(loop)
    seen: list[int] = []

    def fail() -> None:
        raise RuntimeError("an owner's bug")

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        for i in range(100):
            handoff.post(seen.append, i)
            if i == 50:
                handoff.post(fail)
        await async_wait_for(lambda: len(seen) == 100, timeout=5)
        assert len(wakeups) == 1
        handoff.post(seen.append, 100)  # a later burst wakes it again
        await async_wait_for(lambda: len(seen) == 101, timeout=5)
        assert len(wakeups) == 2
    finally:
        del loop.call_soon_threadsafe
    assert seen == list(range(101))
    assert any("event handler failed" in r.getMessage() for r in caplog.records)


# --- subscribe and publish through a link ---------------------------------------------


def _after_packet_id(body: bytes, v5: bool) -> int:
    """Where a SUBSCRIBE's or SUBACK's payload starts: after the packet id and MQTT 5 properties."""
    at = 2
    if not v5:
        return at
    length, shift = 0, 0
    while True:  # the properties' length, a variable byte integer
        byte = body[at]
        at += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return at + length


class RefusingRelay(PacketRelay):
    """A relay to Mosquitto that refuses, in the SUBACK, every filter containing ``word``.

    Mosquitto grants any subscription and applies its ACL on delivery, so a
    refused subscription (as stricter brokers send) is made here on the wire:
    0x87 "not authorised" on MQTT 5, 0x80 "failure" on 3.1.1.
    """

    def __init__(self, upstream: Mosquitto, word: str) -> None:
        super().__init__(upstream)
        self.word = word.encode()
        self.v5 = False
        self.refuse: dict[int, list[int]] = {}  # SUBSCRIBE packet id -> indexes to refuse

    def from_client(self, header: bytes, body: bytes) -> bytes:
        if header[0] == 0x10:  # CONNECT: protocol name, then the level (5 or 4)
            self.v5 = body[2 + int.from_bytes(body[:2], "big")] == 5
        elif header[0] == 0x82:  # SUBSCRIBE: packet id, [properties], filters
            at = _after_packet_id(body, self.v5)
            refused, index = [], 0
            while at < len(body):
                size = int.from_bytes(body[at : at + 2], "big")
                if self.word in body[at + 2 : at + 2 + size]:
                    refused.append(index)
                at += 2 + size + 1
                index += 1
            self.refuse[int.from_bytes(body[:2], "big")] = refused
        return body

    def from_broker(self, header: bytes, body: bytes) -> bytes:
        if header[0] != 0x90:  # SUBACK: packet id, [properties], one code per filter
            return body
        at = _after_packet_id(body, self.v5)
        codes = bytearray(body[at:])
        for index in self.refuse.pop(int.from_bytes(body[:2], "big"), []):
            codes[index] = 0x87 if self.v5 else 0x80
        return body[:at] + bytes(codes)


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_the_suback_resolves_the_future_and_pubacks_and_messages_reach_the_loop(
    mosquitto_factory: Callable[..., Mosquitto], protocol: str
) -> None:
    loop_thread = threading.get_ident()
    acks: list[tuple[int, int, bool, int]] = []
    received: list[tuple[str, bytes, int]] = []

    def on_message(message: mqtt.MQTTMessage) -> None:  # paho's thread: hand over only
        assert threading.get_ident() != loop_thread
        link.post(lambda: received.append((message.topic, message.payload, threading.get_ident())))

    def on_ack(conn: int, mid: int, reason: Any) -> None:  # on the loop
        acks.append((conn, mid, reason.is_failure, threading.get_ident()))

    async with RefusingRelay(mosquitto_factory(), "closed") as relay:
        link = BrokerLink(
            parse_broker_url(relay.url),
            client_id=f"bridge-{protocol}",
            logger=LOG,
            protocol=protocol,
            on_message=on_message,
            on_ack=on_ack,
            **FAST,
        )
        with pytest.raises(TransportError, match="not connected"):
            await link.subscribe([("rs/open/a", 1)])
        link.start()
        try:
            await async_wait_for(lambda: link.connected, timeout=10, message="no connection")
            assert link.protocol_in_use == protocol
            async with asyncio.timeout(10):
                reasons = await link.subscribe([("rs/open/a", 1), ("rs/closed/a", 1)])
            assert [r.is_failure for r in reasons] == [False, True]
            mids = [link.publish("rs/open/a", f"m{i}".encode()) for i in range(5)]
            assert None not in mids
            await async_wait_for(lambda: len(acks) == 5 and len(received) == 5, timeout=10)
        finally:
            await link.stop()
    assert [(c, m, failed) for c, m, failed, _ in acks] == [(link.conn, m, False) for m in mids]
    assert [(t, p) for t, p, _ in received] == [("rs/open/a", f"m{i}".encode()) for i in range(5)]
    assert {a[-1] for a in acks} | {r[-1] for r in received} == {loop_thread}
    assert link.publish("rs/open/a", b"after") is None  # closed: nothing is taken


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_a_topic_the_broker_refuses_reaches_its_collections_engine(
    mosquitto_factory: Callable[..., Mosquitto], protocol: str
) -> None:
    topics = Topics(PREFIX)
    events: dict[str, list[ev.Event]] = {C1: [], C2: []}
    # The broker refuses C1's changes topic, and only that one.
    async with RefusingRelay(mosquitto_factory(), topics.changes(C1)) as relay:
        channel = MqttChannel(
            relay.url,
            {c: events[c].append for c in events},
            topic_prefix=PREFIX,
            client_id=f"bridge-channel-{protocol.replace('.', '')}",
            protocol=protocol,
            **FAST,
        )
        channel.start()
        try:
            await async_wait_for(channel.subscribed.is_set, timeout=10, message="no SUBACK")
            await async_wait_for(
                lambda: any(isinstance(e, ev.Unavailable) for e in events[C1]), timeout=5
            )
        finally:
            await channel.stop()
    refused = [e for e in events[C1] if isinstance(e, ev.Unavailable)]
    assert len(refused) == 1 and refused[0].state == "refused", refused
    assert topics.changes(C1) in refused[0].reason and refused[0].retry_in is None
    assert isinstance(events[C1][0], ev.Connected)  # in order: connected, then refused
    assert not any(isinstance(e, ev.Unavailable) for e in events[C2])


async def test_received_messages_leave_no_garbage_cycle_in_pahos_topic_matching(
    mosquitto: Mosquitto,
) -> None:
    # paho looks every message up in its (empty) table of per-filter callbacks,
    # and its lookup made a reference cycle each time: ~8 objects of garbage
    # per message, a collector pause every few seconds at 200 messages/s.
    received: list[bytes] = []
    link = BrokerLink(
        parse_broker_url(mosquitto.url),
        client_id="bridge-garbage",
        logger=LOG,
        on_message=lambda message: link.post(received.append, message.payload),
        on_ack=lambda *_: None,
        **FAST,
    )
    link.start()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        await async_wait_for(lambda: link.connected, timeout=10, message="no connection")
        async with asyncio.timeout(10):
            await link.subscribe([("rs/garbage/a", 1)])
        for i in range(50):
            link.publish("rs/garbage/a", b"m%d" % i)
        await async_wait_for(lambda: len(received) == 50, timeout=10)
        gc.collect()
        lookups = [
            o for o in gc.garbage if callable(o) and "iter_match" in getattr(o, "__qualname__", "")
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        await link.stop()
    assert received == [b"m%d" % i for i in range(50)]
    assert lookups == []
