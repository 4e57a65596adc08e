"""Acceptance of ``rsnotify publish`` (issue 4): real processes, real faults.

Why one module of ~730 lines: the three tests are one acceptance list (issue 4) on one rig
-- the Source, publisher, broker and log helpers, the comparison with the Change Lists, and
the Destinations written the plain way -- which is half the file; split, each test would be
read away from the rig its claims depend on.

Everything here runs as separate processes: ``rsnotify simulate`` is the
Source, ``rsnotify publish`` the publisher, Mosquitto and Redis come from the
fixtures.  The Destinations are written here with their own code, a plain
paho-mqtt subscriber and a plain ``websockets`` client, so the checks are
against the wire and against the Change Lists (read at the end with
:mod:`rsnotify.sitemap`), never against the publisher's idea of what it sent.

What the tests prove:

* ``test_every_change_reaches_mqtt_and_websocket_once_in_order_with_its_fields``:
  5,000 changes at 200/s over two collections reach both Destinations
  exactly once per sequence number, in order, dense from 1, each carrying the
  fields of its Change List entry and a valid HMAC signature; a WebSocket
  client that comes back with ``since`` 1,500 behind gets exactly the rest
  (replayed from the log, then live).
* ``test_kill_9_restarts_never_reuse_or_lose_a_sequence_number``: ten
  ``kill -9`` of the publisher at seeded random moments (half of them while a
  restarted publisher catches up), each followed by a restart: the log in
  Redis still maps every Change List entry to exactly one seq, the MQTT
  Destination saw every seq, and a redelivered notification carries its
  original seq.
* ``test_a_broker_outage_and_a_redis_restart_lose_nothing_and_keep_order``:
  a Redis restart, then a 10 s broker outage, mid-run: nothing missing from
  the log or either Destination, and the MQTT stream never jumps over a seq
  (only redelivered duplicates go backwards).

Covered in depth elsewhere (same transports, in-process, real Redis and
Mosquitto): WebSocket resume racing appends, ``gap_too_old`` and ``skipped``
in ``tests/test_transport_ws.py``
(``test_resume_from_since_races_appends_without_gap_or_duplicate``,
``test_a_since_older_than_retention_gets_gap_too_old_then_live``,
``test_a_client_that_stops_reading_is_skipped_and_costs_bounded_memory``),
signatures in ``test_signed_xml_notifications_verify_and_parse_into_typed_frames``
and ``tests/test_transport_mqtt.py::test_signed_payloads_verify_and_a_tampered_byte_fails``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import random
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from websockets.sync.client import connect as ws_connect

from rsnotify import sitemap, w3cdt
from rsnotify.envelope import SIGNATURE_PROPERTY
from rsnotify.log.redis_log import RedisLog
from rsnotify.model import Capability, CapabilityList, ChangeListIndex, Entry
from tests.devstack import ManagedProcess, Mosquitto, Redis, wait_for

PREFIX = "resourcesync"
SECRET = b"acceptance-secret"
SOURCE_CAP = 50_000  # --max-changes for runs the test ends by pausing the Source
FIELDS = ("loc", "change", "datetime", "hash", "length", "type")
COLLECTION_LINE = re.compile(r"^rsnotify publish: collection (\S+) (\S+)\n", re.MULTILINE)
RunRsnotify = Callable[..., ManagedProcess]
Identity = tuple[str, datetime, str]


# --- the Source -----------------------------------------------------------------


@dataclass
class Simulator:
    """A ``rsnotify simulate`` child and its control endpoints."""

    process: ManagedProcess
    base: str

    def _call(self, method: str, path: str) -> Any:
        request = urllib.request.Request(self.base + path, method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def resume(self) -> None:
        assert self._call("POST", "_simulator/resume")["paused"] is False

    def pause(self) -> int:
        """Stop the clock-driven changes; how many were made (final from now on)."""
        answer = self._call("POST", "_simulator/pause")
        assert answer["paused"] is True
        changes: int = answer["changes"]
        return changes

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self._call("GET", "_simulator/stats")
        return stats

    def read(self, url: str) -> bytes:
        with urllib.request.urlopen(url, timeout=10) as response:
            body: bytes = response.read()
            return body

    def change_list_entries(self, capability_list: str) -> list[Entry]:
        """Every entry of a collection's Change Lists, in order, found from its Capability List."""
        capabilities = sitemap.parse(self.read(capability_list))
        assert isinstance(capabilities, CapabilityList)
        url = capabilities.capability_url(Capability.CHANGELIST)
        assert url is not None, f"{capability_list} offers no Change List"
        document = sitemap.parse(self.read(url))
        if not isinstance(document, ChangeListIndex):
            return list(document)
        return [entry for ref in document for entry in sitemap.parse(self.read(ref.loc))]


def start_simulator(run: RunRsnotify, *options: str) -> Simulator:
    process = run("simulate", "--port", "0", "--quiet", "--paused", *options)
    match = process.wait_for_line(r"rsnotify simulate: serving (http://\S+/)$", timeout=20)
    return Simulator(process, match.group(1))


def wait_finished(sim: Simulator, total: int, timeout: float) -> None:
    wait_for(
        lambda: sim.stats()["changes"] == total,
        timeout,
        interval=0.2,
        message=lambda: f"the simulator made {sim.stats()['changes']} of {total} changes",
    )


# --- the publisher --------------------------------------------------------------


def publisher_process(
    run: RunRsnotify, sim: Simulator, redis_server: Redis, broker: Mosquitto, *extra: str
) -> ManagedProcess:
    """An unstarted ``rsnotify publish`` (start, kill and start it again at will)."""
    return run(
        "publish",
        sim.base,
        "--redis",
        redis_server.url,
        "--mqtt",
        broker.url,
        "--poll",
        "0.05",
        "--from-beginning",
        *extra,
        start=False,
    )


def start_publisher(process: ManagedProcess, collections: int) -> dict[str, str]:
    """Start (or restart) the publisher; its collections, id -> Capability List URL."""
    process.start()
    process.wait_for_line(r"rsnotify publish: running", timeout=30, stream="stdout")

    def announced() -> dict[str, str] | None:
        found = dict(COLLECTION_LINE.findall(process.output("stdout")))
        if not process.running:
            raise AssertionError(f"the publisher exited\n{process.tail()}")
        return found if len(found) == collections else None

    return wait_for(announced, 10, message=lambda: f"collections not announced\n{process.tail()}")


# --- the broker -----------------------------------------------------------------


def deployed_broker(factory: Callable[..., Mosquitto], **options: Any) -> Mosquitto:
    """A Mosquitto with the queue limits of deploy/mosquitto.conf.

    Mosquitto's default ``max_queued_messages 1000`` drops QoS 1 messages for
    a subscriber that falls 1,000 behind, even while it is connected (it
    logs "Outgoing messages are being dropped"), and a publisher restarting
    from its cursor resends in bursts: no publisher can prevent that loss.
    """
    return factory(max_queued_messages=100_000, max_inflight_messages=100, **options)


def broker_drops(broker: Mosquitto) -> str:
    """The broker's own account of messages it dropped, for failure messages."""
    lines = [line for line in broker.log_text().splitlines() if "dropped" in line]
    return "broker dropped messages:\n" + "\n".join(lines) if lines else "broker dropped nothing"


# --- the log --------------------------------------------------------------------


def read_log(redis_server: Redis, collections: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Every logged envelope per collection, checking the seqs are dense from 1."""

    async def read() -> dict[str, list[dict[str, Any]]]:
        log = RedisLog(redis_server.url)
        out: dict[str, list[dict[str, Any]]] = {}
        try:
            for collection in collections:
                records = []
                after = 0
                while batch := await log.read(collection, after, 5000):
                    records.extend(batch)
                    after = batch[-1].seq
                head = await log.head(collection)
                seqs = [r.seq for r in records]
                assert seqs == list(range(1, head + 1)), f"{collection}: seqs not dense 1..{head}"
                out[collection] = [json.loads(r.data) for r in records]
        finally:
            await log.close()
        return out

    return asyncio.run(read())


def log_heads(redis_server: Redis, collections: list[str]) -> dict[str, int]:
    async def heads() -> dict[str, int]:
        log = RedisLog(redis_server.url)
        try:
            return {c: await log.head(c) for c in collections}
        finally:
            await log.close()

    return asyncio.run(heads())


# --- comparing ------------------------------------------------------------------


def hmac_signature(payload: bytes) -> str:
    """The signature a Destination expects (HMAC-SHA256, written as WebSub does)."""
    return "k7:sha256=" + hmac.new(SECRET, payload, hashlib.sha256).hexdigest()


def entry_fields(entry: Entry) -> dict[str, Any]:
    assert entry.change is not None
    return {
        "loc": entry.loc,
        "change": entry.change.value,
        "datetime": entry.change_time,
        "hash": entry.hash,
        "length": entry.length,
        "type": entry.type,
    }


def payload_fields(payload: dict[str, Any]) -> dict[str, Any]:
    """The compared fields of a notification (optional ones are omitted on the wire)."""
    fields = {name: payload.get(name) for name in FIELDS}
    fields["datetime"] = w3cdt.parse(payload["datetime"])
    return fields


def identity(payload: dict[str, Any]) -> Identity:
    return (payload["loc"], w3cdt.parse(payload["datetime"]), payload["change"])


def entry_identity(entry: Entry) -> Identity:
    assert entry.change is not None and entry.change_time is not None
    return (entry.loc, entry.change_time, entry.change.value)


def expected_entries(sim: Simulator, collections: dict[str, str]) -> dict[str, list[Entry]]:
    expected = {cid: sim.change_list_entries(cap) for cid, cap in collections.items()}
    everything = [e for entries in expected.values() for e in entries]
    # Not vacuous: the fields compared are really there (deletes carry no hash/length).
    assert sum(e.hash is not None for e in everything) > len(everything) // 2
    assert sum(e.length is not None for e in everything) > len(everything) // 2
    assert sum(e.type is not None for e in everything) > len(everything) // 2
    assert {e.change.value for e in everything if e.change} == {"created", "updated", "deleted"}
    return expected


def assert_log_matches_change_lists(
    log: dict[str, list[dict[str, Any]]], expected: dict[str, list[Entry]]
) -> None:
    """One seq per entry: the log is the Change Lists, in order, each identity once."""
    for cid, entries in expected.items():
        logged = [identity(p) for p in log[cid]]
        assert len(set(logged)) == len(logged), f"{cid}: an entry was logged twice"
        assert logged == [entry_identity(e) for e in entries], f"{cid}: log != Change Lists"
        assert [payload_fields(p) for p in log[cid]] == [entry_fields(e) for e in entries]
        assert all(p["collection"] == cid for p in log[cid])


def assert_no_gap(seqs: list[int], what: str) -> int:
    """Each seq is at most one past the highest seen: in order, duplicates allowed.

    Returns how many were redeliveries.  By induction the seqs seen are always
    exactly ``1..max``, so anything not new is a duplicate.
    """
    highest = 0
    again = 0
    for i, seq in enumerate(seqs):
        assert seq <= highest + 1, f"{what}: seq {seq} after {highest} (message {i})"
        if seq <= highest:
            again += 1
        highest = max(highest, seq)
    return again


# --- Destinations written the plain way -----------------------------------------


class MqttDestination:
    """A plain paho-mqtt 2 subscriber at QoS 1 on ``<prefix>/+/changes``.

    ``received`` is ``(connection number, payload)`` in arrival order;
    ``signed`` is ``(payload bytes, signature user property or None)``.  With
    ``persistent`` the broker keeps its session (and queues for it) while it
    is away, e.g. across a broker restart with persistence on.
    """

    def __init__(self, broker: Mosquitto, *, persistent: bool = False) -> None:
        self.received: list[tuple[int, dict[str, Any]]] = []
        self.signed: list[tuple[bytes, str | None]] = []
        self.connections = 0
        self.connected = False
        self.sessions_resumed = 0  # CONNACKs with "session present"
        self.subacks = 0
        self.topic = f"{PREFIX}/+/changes"
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"acceptance-{uuid.uuid4().hex[:10]}",
            protocol=mqtt.MQTTv5,
        )
        self.client.reconnect_delay_set(0.05, 0.5)  # type: ignore[arg-type]
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *_: self._suback()
        self.client.on_message = self._on_message
        self.client.on_disconnect = self._on_disconnect
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 3600 if persistent else 0
        self.client.connect(
            broker.host, broker.port, keepalive=5, clean_start=not persistent, properties=properties
        )
        self.client.loop_start()
        wait_for(lambda: self.subacks >= 1, message="the MQTT subscriber got no SUBACK")

    def _suback(self) -> None:
        self.subacks += 1

    def _on_connect(
        self, client: mqtt.Client, _u: Any, flags: mqtt.ConnectFlags, reason: Any, _p: Any
    ) -> None:
        if not reason.is_failure:
            self.connections += 1
            self.sessions_resumed += bool(flags.session_present)
            self.connected = True
            client.subscribe(self.topic, qos=1)

    def _on_disconnect(self, *_args: Any) -> None:
        self.connected = False

    def _on_message(self, _c: mqtt.Client, _u: Any, message: mqtt.MQTTMessage) -> None:
        user = dict(getattr(message.properties, "UserProperty", None) or [])
        self.signed.append((message.payload, user.get(SIGNATURE_PROPERTY)))
        self.received.append((self.connections, json.loads(message.payload)))

    def payloads(self, collection: str) -> list[dict[str, Any]]:
        return [p for _, p in list(self.received) if p["collection"] == collection]

    def seqs(self, collection: str) -> list[int]:
        return [p["seq"] for p in self.payloads(collection)]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class WebSocketDestination:
    """A plain ``websockets`` (sync API) client in a thread; ``since`` per collection."""

    def __init__(self, url: str, since: dict[str, int]) -> None:
        self.frames: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        collections = list(since)
        subscribe = {"type": "subscribe", "collections": since}
        self._thread = threading.Thread(
            target=self._read, args=(url, json.dumps(subscribe)), daemon=True
        )
        self._thread.start()
        wait_for(
            lambda: len(self.of_type("hello")) == len(collections) or self.error,
            message="no hello frames",
        )
        assert self.error is None, self.error

    def _read(self, url: str, subscribe: str) -> None:
        try:
            with ws_connect(url, max_size=2**20) as ws:
                ws.send(subscribe)
                while not self._stop.is_set():
                    try:
                        message = ws.recv(timeout=0.2)
                    except TimeoutError:
                        continue
                    self.frames.append(json.loads(message))
        except BaseException as exc:
            self.error = exc

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in list(self.frames) if f["type"] == kind]

    def notifications(self, collection: str) -> list[dict[str, Any]]:
        return [f for f in self.of_type("notification") if f["collection"] == collection]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def destinations() -> Iterator[list[MqttDestination | WebSocketDestination]]:
    """Destinations registered here are closed at teardown, pass or fail.

    Tests list the brokers first, then ``rsnotify_process``, then this: teardown
    runs in reverse, so clients and the publisher stop before the brokers do.
    """
    made: list[MqttDestination | WebSocketDestination] = []
    yield made
    for destination in made:
        destination.close()


# --- 1. every change, both transports, exactly once ----------------------------------


def test_every_change_reaches_mqtt_and_websocket_once_in_order_with_its_fields(
    redis_server: Redis,
    mosquitto_factory: Callable[..., Mosquitto],
    rsnotify_process: RunRsnotify,
    destinations: list[Any],
) -> None:
    total = 5000
    mosquitto = deployed_broker(mosquitto_factory)
    sim = start_simulator(
        rsnotify_process,
        *("--rate", "200", "--max-changes", str(total), "--collections", "2"),
        *("--changelist-size", "500", "--seed", "11"),
    )
    signing = ("--secret", SECRET.decode(), "--secret-id", "k7")
    publisher = publisher_process(
        rsnotify_process, sim, redis_server, mosquitto, "--ws", "127.0.0.1:0", *signing
    )
    collections = start_publisher(publisher, 2)
    ws_port = publisher.wait_for_line(r"ws://127\.0\.0\.1:(\d+)/").group(1)
    mqtt_sub = MqttDestination(mosquitto)
    destinations.append(mqtt_sub)
    ws_url = f"ws://127.0.0.1:{ws_port}/"
    ws_client = WebSocketDestination(ws_url, dict.fromkeys(collections, 0))
    destinations.append(ws_client)
    assert {f["head"] for f in ws_client.of_type("hello")} == {0}

    sim.resume()
    wait_finished(sim, total, timeout=60)

    def everything_arrived() -> bool:
        assert ws_client.error is None, ws_client.error
        return (
            sum(len(mqtt_sub.seqs(c)) for c in collections) >= total
            and sum(len(ws_client.notifications(c)) for c in collections) >= total
        )

    wait_for(
        everything_arrived,
        timeout=30,
        interval=0.05,
        message=lambda: (
            f"MQTT got {len(mqtt_sub.received)}, WebSocket got "
            f"{len(ws_client.of_type('notification'))} of {total}; {broker_drops(mosquitto)}\n"
            f"{publisher.tail()}"
        ),
    )

    expected = expected_entries(sim, collections)
    assert sum(len(e) for e in expected.values()) == total
    assert_log_matches_change_lists(read_log(redis_server, list(collections)), expected)
    for cid, entries in expected.items():
        assert len(entries) > 1000  # both collections took part, across list rollovers
        want = [entry_fields(e) for e in entries]
        dense = list(range(1, len(entries) + 1))

        mqtt_payloads = mqtt_sub.payloads(cid)
        assert [p["seq"] for p in mqtt_payloads] == dense, f"MQTT {cid}: not once, in order"
        assert [payload_fields(p) for p in mqtt_payloads] == want

        frames = ws_client.notifications(cid)
        assert [f["seq"] for f in frames] == dense, f"WebSocket {cid}: not once, in order"
        assert [f["prev"] for f in frames] == [0, *dense[:-1]]
        ws_payloads = [json.loads(f["payload"]) for f in frames]
        assert [p["seq"] for p in ws_payloads] == dense
        assert [payload_fields(p) for p in ws_payloads] == want
    assert not ws_client.of_type("skipped") and not ws_client.of_type("gap_too_old")

    # Every payload, on both transports, is signed over its exact bytes.
    assert len(mqtt_sub.signed) == total
    for payload, signature in mqtt_sub.signed:
        assert signature == hmac_signature(payload), "bad MQTT signature"
    frames = ws_client.of_type("notification")
    assert all(f["signature"] == hmac_signature(f["payload"].encode()) for f in frames)

    # A Destination that comes back with the last seq it applied gets the rest,
    # once: 1,500 back is beyond the gateway's in-memory ring (1,000), so this
    # replays from the log in Redis and then hands over to the live ring.
    since = {cid: len(entries) - 1500 for cid, entries in expected.items()}
    resumed = WebSocketDestination(ws_url, since)
    destinations.append(resumed)
    wait_for(
        lambda: all(len(resumed.notifications(c)) >= 1500 for c in since) or resumed.error,
        message=lambda: f"the resumed client got {len(resumed.of_type('notification'))} of 3000",
    )
    for cid, last in since.items():
        frames = resumed.notifications(cid)
        rest = list(range(last + 1, last + 1501))
        assert [(f["prev"], f["seq"]) for f in frames] == [(s - 1, s) for s in rest]
        assert [payload_fields(json.loads(f["payload"])) for f in frames] == [
            entry_fields(e) for e in expected[cid][last:]
        ]
    assert resumed.error is None and not resumed.of_type("skipped")


# --- 2. kill -9 and restart, ten times --------------------------------------------


def test_kill_9_restarts_never_reuse_or_lose_a_sequence_number(
    redis_server: Redis,
    mosquitto_factory: Callable[..., Mosquitto],
    rsnotify_process: RunRsnotify,
    destinations: list[Any],
) -> None:
    kills, slot = 10, 250
    mosquitto = deployed_broker(mosquitto_factory)
    rng = random.Random(20240504)
    # The Source changes at 200/s until the test pauses it after the last
    # restart, so every kill lands mid-run however slowly restarts go.
    sim = start_simulator(
        rsnotify_process,
        *("--rate", "200", "--max-changes", str(SOURCE_CAP), "--collections", "2"),
        *("--changelist-size", "300", "--seed", "5"),
    )
    mqtt_sub = MqttDestination(mosquitto)
    destinations.append(mqtt_sub)
    publisher = publisher_process(rsnotify_process, sim, redis_server, mosquitto)
    collections = start_publisher(publisher, 2)
    ids = list(collections)

    def logged() -> int:
        return sum(log_heads(redis_server, ids).values())

    sim.resume()
    # Two kinds of moments.  "Catching up": within 0.3 s of a restart, while the
    # new publisher reads and logs the backlog the Source built up while it
    # was down (several appends and checkpoints in a row).  "Steady": once the
    # log reaches a random point in the next stretch of 250 changes and this
    # life of the publisher has logged something, plus a random fraction of a
    # second, so the kill lands anywhere in detect -> log -> push -> cursor.
    kinds = ["catching up"] * (kills // 2) + ["steady"] * (kills - kills // 2 - 1)
    rng.shuffle(kinds)
    kinds.insert(0, "steady")  # the first life has no backlog to catch up
    logged_at: list[int] = []  # entries logged at each kill
    for i, kind in enumerate(kinds):
        if kind == "steady":
            threshold = 150 + i * slot + rng.randrange(slot)
            life_start = logged()
            wait_for(
                lambda t=threshold, s=life_start: logged() >= max(t, s + 1),
                timeout=30,
                interval=0.05,
                message=lambda t=threshold: f"the log never reached {t}\n{publisher.tail()}",
            )
        time.sleep(rng.uniform(0.0, 0.3))  # the random moment itself, not synchronisation
        assert publisher.running, publisher.tail()
        publisher.kill()  # SIGKILL to the pid (and session) we started
        assert publisher.returncode == -9
        logged_at.append(logged())
        assert start_publisher(publisher, 2) == collections
    total = sim.pause()

    assert len(logged_at) == kills, logged_at
    # Mid-run: the Source was still changing after the last kill (a run of
    # some 2,500-3,000 changes in all).
    assert logged_at[-1] < total < SOURCE_CAP, (logged_at, total)
    wait_for(
        lambda: logged() >= total,
        timeout=30,
        message=lambda: f"not everything was logged\n{publisher.tail()}",
    )
    heads = log_heads(redis_server, ids)
    wait_for(
        lambda: not missing_seqs(mqtt_sub, heads),
        timeout=30,
        message=lambda: (
            f"MQTT subscriber is missing {missing_seqs(mqtt_sub, heads)} "
            f"(subscriber connections: {mqtt_sub.connections}); {broker_drops(mosquitto)}\n"
            f"{publisher.tail()}"
        ),
    )

    log = read_log(redis_server, ids)
    expected = expected_entries(sim, collections)
    assert_log_matches_change_lists(log, expected)
    redelivered = 0
    for cid in ids:
        by_seq = {p["seq"]: identity(p) for p in log[cid]}
        payloads = mqtt_sub.payloads(cid)
        assert {p["seq"] for p in payloads} == set(by_seq), f"{cid}: MQTT missed a seq"
        for p in payloads:
            assert identity(p) == by_seq[p["seq"]], f"{cid}: seq {p['seq']} changed identity"
        redelivered += assert_no_gap([p["seq"] for p in payloads], f"MQTT {cid}")
    # Pushed-but-not-yet-acknowledged notifications are resent after a kill.
    # Not asserted > 0: a kill can land when every push was acknowledged.
    print(f"kills ({kinds}) at {logged_at} of {total} logged; {redelivered} MQTT redeliveries")


def missing_seqs(destination: MqttDestination, heads: dict[str, int]) -> dict[str, list[int]]:
    """Per collection, the logged seqs the MQTT Destination has not received."""
    missing = {c: sorted(set(range(1, h + 1)) - set(destination.seqs(c))) for c, h in heads.items()}
    return {c: seqs for c, seqs in missing.items() if seqs}


# --- 3. broker outage and Redis restart --------------------------------------------


def test_a_broker_outage_and_a_redis_restart_lose_nothing_and_keep_order(
    redis_server: Redis,
    mosquitto_factory: Callable[..., Mosquitto],
    rsnotify_process: RunRsnotify,
    destinations: list[Any],
) -> None:
    # Persistence, so the subscriber's session outlives the broker restart.
    broker = deployed_broker(mosquitto_factory, persistence=True)
    # The Source changes at 200/s until the test pauses it, after both outages.
    sim = start_simulator(
        rsnotify_process,
        *("--rate", "200", "--max-changes", str(SOURCE_CAP), "--collections", "2"),
        *("--changelist-size", "400", "--seed", "3"),
    )
    mqtt_sub = MqttDestination(broker, persistent=True)
    destinations.append(mqtt_sub)
    publisher = publisher_process(
        rsnotify_process, sim, redis_server, broker, "--ws", "127.0.0.1:0"
    )
    collections = start_publisher(publisher, 2)
    ids = list(collections)
    ws_port = publisher.wait_for_line(r"ws://127\.0\.0\.1:(\d+)/").group(1)
    ws_client = WebSocketDestination(f"ws://127.0.0.1:{ws_port}/", dict.fromkeys(ids, 0))
    destinations.append(ws_client)
    sim.resume()

    def received() -> int:
        return len(mqtt_sub.received)

    def logged() -> int:
        return sum(log_heads(redis_server, ids).values())

    # Redis first (a graceful restart: the AOF keeps every write), early in the run.
    wait_for(lambda: received() >= 300, timeout=20, message="nothing pushed before Redis restart")
    redis_server.restart()
    restarted_at = logged()
    wait_for(
        lambda: received() >= restarted_at + 200,
        timeout=30,
        message=lambda: f"nothing pushed after Redis came back\n{publisher.tail()}",
    )

    # Then the broker: down for 10 s while the Source keeps changing.
    broker.stop()
    wait_for(lambda: not mqtt_sub.connected, message="the subscriber did not notice")
    before, logged_before = received(), logged()
    time.sleep(10)  # the scenario itself: the broker stays down for 10 s
    during, logged_during = received(), logged()
    broker.start()
    assert during == before, "messages arrived while the broker was down"
    assert logged_during > logged_before + 1000, "the publisher stopped logging in the outage"
    wait_for(
        lambda: received() > during,
        timeout=40,  # the publisher's reconnect backoff may have grown to 8-16 s
        message=lambda: f"nothing pushed after the broker came back\n{publisher.tail()}",
    )
    total = sim.pause()

    wait_for(
        lambda: logged() >= total,
        timeout=30,
        message=lambda: f"not everything was logged\n{publisher.tail()}",
    )
    wait_for(
        lambda: (
            all(len(set(mqtt_sub.seqs(c))) == h for c, h in log_heads(redis_server, ids).items())
            and len(ws_client.of_type("notification")) >= total
        ),
        timeout=60,
        interval=0.05,
        message=lambda: (
            f"Destinations are missing notifications; {broker_drops(broker)}\n{publisher.tail()}"
        ),
    )

    log = read_log(redis_server, ids)
    assert_log_matches_change_lists(log, expected_entries(sim, collections))
    assert mqtt_sub.connections >= 2, "the subscriber never saw the broker go away"
    assert mqtt_sub.sessions_resumed >= 1, "the broker restart lost the subscriber's session"
    for cid in ids:
        by_seq = {p["seq"]: identity(p) for p in log[cid]}
        payloads = mqtt_sub.payloads(cid)
        assert {p["seq"] for p in payloads} == set(by_seq), f"{cid}: MQTT missed a seq"
        assert all(identity(p) == by_seq[p["seq"]] for p in payloads)
        # Across both outages each seq is at most one past the highest seen so far:
        # every connection goes on from where the Destination stands, in order.
        assert_no_gap([p["seq"] for p in payloads], f"MQTT {cid}")

        frames = ws_client.notifications(cid)
        dense = sorted(by_seq)
        assert [f["seq"] for f in frames] == dense, f"WebSocket {cid}: not once, in order"
        assert [f["prev"] for f in frames] == [0, *dense[:-1]]
        assert [identity(json.loads(f["payload"])) for f in frames] == [
            by_seq[f["seq"]] for f in frames
        ]
    assert ws_client.error is None and not ws_client.of_type("skipped")
