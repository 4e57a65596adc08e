"""Hostile notifications: forged messages published straight to the subscriber's MQTT topic.

Anyone who can publish to the broker can send the subscriber anything.  A
notification is only ever a hint that the Source changed: the subscriber
must fetch nothing off the Source's origin, write nothing outside its mirror
directory, apply nothing whose bytes do not match, and treat anything it
cannot read or verify as "I may have missed something" -- a gap, closed by
catching up from the Change List Index.

Each test runs a small Source (aiohttp, counting every request per path), a
real Mosquitto and an in-process :class:`Subscriber` following the Source over
MQTT.  There is no publisher: every notification is forged by the test with a
paho client, and changes the test makes at the Source without a notification
reach the mirror only through a catch-up.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from aiohttp import web
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from rsnotify import sitemap, w3cdt
from rsnotify.collection import collection_id
from rsnotify.devstack import Mosquitto, async_wait_for, free_port
from rsnotify.envelope import SIGNATURE_PROPERTY, sign
from rsnotify.model import Capability, ChangeType, Entry, Root, make_document
from rsnotify.subscriber.mirror import TEMP_PREFIX, path_for
from rsnotify.subscriber.resources import ApplyRecord
from rsnotify.subscriber.service import Subscriber, SubscriberConfig, default_state_dir
from rsnotify.subscriber.sync import CollectionSync

SECRET = b"correct horse battery staple"


def fixity(data: bytes) -> str:
    return f"md5:{hashlib.md5(data).hexdigest()} sha-256:{hashlib.sha256(data).hexdigest()}"


class Source:
    """A minimal ResourceSync Source: one Capability List, a Resource List, one Change List."""

    def __init__(self) -> None:
        self.base = ""
        self.files: dict[str, bytes] = {}
        self.changes: list[Entry] = []
        self.hits: Counter[str] = Counter()
        self.initial: dict[str, bytes] = {}  # the Resource List's snapshot at self.at
        self.at = w3cdt.now() - timedelta(minutes=5)
        self._runner: web.AppRunner | None = None

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    @property
    def capability_list(self) -> str:
        return self.url("capabilitylist.xml")

    @property
    def changelist(self) -> str:
        return self.url("changelist.xml")

    @property
    def collection(self) -> str:
        return collection_id(self.capability_list)

    def change(self, name: str, data: bytes | None) -> Entry:
        """Change ``r/<name>`` at the Source (None deletes it) and list it in the Change List."""
        when = max([self.at, *(e.datetime for e in self.changes if e.datetime)])
        when = max(when + timedelta(milliseconds=1), w3cdt.now())
        loc = self.url(f"r/{name}")
        if data is None:
            self.files.pop(name)
            entry = Entry(loc=loc, change=ChangeType.DELETED, datetime=when, lastmod=when)
        else:
            kind = ChangeType.UPDATED if name in self.files else ChangeType.CREATED
            self.files[name] = data
            entry = Entry(
                loc=loc,
                change=kind,
                datetime=when,
                lastmod=when,
                hash=fixity(data),
                length=len(data),
            )
        self.changes.append(entry)
        return entry

    def _documents(self) -> dict[str, bytes]:
        description = make_document(
            Root.URLSET,
            Capability.DESCRIPTION,
            entries=[Entry(loc=self.capability_list, capability=Capability.CAPABILITYLIST)],
        )
        capabilities = make_document(
            Root.URLSET,
            Capability.CAPABILITYLIST,
            entries=[
                Entry(loc=self.url("resourcelist.xml"), capability=Capability.RESOURCELIST),
                Entry(loc=self.changelist, capability=Capability.CHANGELIST),
            ],
        )
        resources = make_document(
            Root.URLSET,
            Capability.RESOURCELIST,
            at=self.at,
            entries=[
                Entry(loc=self.url(f"r/{n}"), hash=fixity(d), length=len(d))
                for n, d in sorted(self.initial.items())
            ],
        )
        changes = make_document(
            Root.URLSET, Capability.CHANGELIST, from_=self.at, entries=list(self.changes)
        )
        return {
            "/.well-known/resourcesync": sitemap.serialize(description),
            "/capabilitylist.xml": sitemap.serialize(capabilities),
            "/resourcelist.xml": sitemap.serialize(resources),
            "/changelist.xml": sitemap.serialize(changes),
        }

    async def _handle(self, request: web.Request) -> web.Response:
        self.hits[request.path] += 1
        document = self._documents().get(request.path)
        if document is not None:
            return web.Response(body=document, content_type="application/xml")
        if request.path.startswith("/r/") and request.path[3:] in self.files:
            return web.Response(body=self.files[request.path[3:]])
        return web.Response(status=404)

    async def start(self, files: dict[str, bytes]) -> str:
        self.files = dict(files)
        self.initial = dict(files)
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.base = f"http://127.0.0.1:{port}/"
        return self.base

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class Forger:
    """A paho client publishing whatever the test wants on the collection's topic."""

    def __init__(self, broker: Mosquitto, collection: str) -> None:
        self.topic = f"resourcesync/{collection}/changes"
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()

    def send(self, payload: bytes, signature: str | None = None) -> None:
        props = None
        if signature is not None:
            props = Properties(PacketTypes.PUBLISH)
            props.UserProperty = [(SIGNATURE_PROPERTY, signature)]
        info = self.client.publish(self.topic, payload, qos=1, properties=props)
        info.wait_for_publish(10)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def notification(
    source: Source, seq: int, loc: str, change: str, when: datetime, **extra: Any
) -> dict[str, Any]:
    return {
        "v": 1,
        "collection": source.collection,
        "seq": seq,
        "capabilitylist": source.capability_list,
        "changelist": source.changelist,
        "loc": loc,
        "change": change,
        "datetime": w3cdt.format(when),
        **extra,
    }


def of_entry(source: Source, seq: int, entry: Entry) -> bytes:
    """The genuine notification of a Change List entry, as a publisher would send it."""
    assert entry.change is not None and entry.datetime is not None
    extra: dict[str, Any] = {}
    if entry.hash:
        extra.update(hash=entry.hash, length=entry.length)
    return json.dumps(
        notification(source, seq, entry.loc, entry.change.value, entry.datetime, **extra)
    ).encode()


class Setup:
    def __init__(self, source: Source, sub: Subscriber, forger: Forger, mirror: Path) -> None:
        self.source = source
        self.sub = sub
        self.forger = forger
        self.mirror = mirror

    @property
    def engine(self) -> CollectionSync:
        (engine,) = self.sub.engines.values()
        return engine

    def differences(self) -> list[str]:
        expected = {
            path_for(self.source.url(f"r/{n}"), self.mirror): hashlib.sha256(d).hexdigest()
            for n, d in self.source.files.items()
        }
        found = {
            p for p in self.mirror.rglob("*") if p.is_file() and not p.name.startswith(TEMP_PREFIX)
        }
        out = [f"missing {p}" for p in expected.keys() - found]
        out += [f"extra {p}" for p in found - expected.keys()]
        out += [
            f"differs {p}"
            for p in found & expected.keys()
            if hashlib.sha256(p.read_bytes()).hexdigest() != expected[p]
        ]
        return out

    async def apply_log(self, loc: str | None = None) -> list[ApplyRecord]:
        assert self.sub._resources is not None
        return await self.sub._resources.apply_log(loc)

    async def outcomes(self, loc: str, when: datetime, count: int = 1) -> list[ApplyRecord]:
        """The apply log's rows for one change, once there are ``count`` of them.

        The file is written before its row is committed, so a test that saw the
        file must still wait for the row.
        """

        async def rows() -> list[ApplyRecord]:
            found = [r for r in await self.apply_log(loc) if r.datetime == when]
            return found if len(found) >= count else []

        return await async_wait_for(rows, timeout=20, message=f"no outcome for {loc} at {when}")


@asynccontextmanager
async def following(tmp_path: Path, broker: Mosquitto, **options: Any) -> AsyncIterator[Setup]:
    """A Source with three resources and a live subscriber mirroring it over MQTT."""
    source = Source()
    await source.start({"a.txt": b"alpha\n", "b.txt": b"bravo\n", "c.txt": b"charlie\n"})
    mirror = tmp_path / "mirror"
    options.setdefault("heartbeat_timeout", 3600)  # no publisher, so no heartbeats
    options.setdefault("retries", 2)
    sub = Subscriber(
        SubscriberConfig(source=source.base, into=str(mirror), via=broker.url, **options)
    )
    forger: Forger | None = None
    try:
        await sub.start()
        (engine,) = sub.engines.values()
        started = engine.detector.last_heartbeat
        task = asyncio.create_task(sub.run_forever())
        await async_wait_for(lambda: engine.stats.state == "live", timeout=20)
        # The engine has seen the channel connect (and subscribe) before anything is forged.
        await async_wait_for(lambda: engine.detector.last_heartbeat > started, timeout=20)
        forger = Forger(broker, source.collection)
        setup = Setup(source, sub, forger, mirror)
        assert setup.differences() == []
        yield setup
        sub.stopping.set()
        await task
    finally:
        if forger is not None:
            forger.close()
        await sub.stop()
        await source.stop()


def outside(tmp_path: Path, *skip: Path) -> dict[str, bytes]:
    """Every file under the test's directory except those under ``skip``."""
    return {
        str(p): p.read_bytes()
        for p in tmp_path.rglob("*")
        if p.is_file() and not any(d in p.parents for d in skip)
    }


# --- off the Source's origin --------------------------------------------------------


@pytest.fixture
async def evil_server() -> AsyncIterator[tuple[str, list[str]]]:
    hits: list[str] = []

    async def record(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(body=b"evil")

    app = web.Application()
    app.router.add_get("/{tail:.*}", record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", hits
    finally:
        await runner.cleanup()


async def test_notifications_pointing_off_the_origin_are_not_fetched(
    tmp_path: Path, mosquitto: Mosquitto, evil_server: tuple[str, list[str]]
) -> None:
    """Off-origin locs (plain, user-info trick, other scheme) and duplicates are refused."""
    evil, evil_hits = evil_server
    async with following(tmp_path, mosquitto) as s:
        source_host = s.source.base.split("//")[1].rstrip("/")
        later = w3cdt.now() + timedelta(seconds=1)
        forged = [
            f"{evil}/steal",
            f"http://{source_host}@{evil.split('//')[1]}/steal",  # the host is evil's
            f"https://{source_host}/r/a.txt",  # another scheme is another origin
        ]
        for seq, loc in enumerate(forged, start=1):
            s.forger.send(json.dumps(notification(s.source, seq, loc, "created", later)).encode())
        # A genuine loc whose forged duplicate points off the origin: the loc is used.
        s.source.files["a.txt"] = b"alpha, second version\n"
        genuine = notification(
            s.source,
            len(forged) + 1,
            s.source.url("r/a.txt"),
            "updated",
            later,
            hash=fixity(s.source.files["a.txt"]),
            links=[{"rel": "duplicate", "href": f"{evil}/a.txt", "pri": 1}],
        )
        s.forger.send(json.dumps(genuine).encode())
        await async_wait_for(
            lambda: s.engine.stats.failed + s.engine.stats.applied >= len(forged) + 1,
            timeout=20,
            message=lambda: f"forgeries not handled: {s.engine.stats}",
        )
        for loc in [*forged, s.source.url("r/a.txt")]:
            await s.outcomes(loc, later)
        outcomes = {r.loc: r.outcome for r in await s.apply_log() if r.datetime == later}
        assert s.differences() == []
    assert evil_hits == [], "the subscriber fetched from a foreign origin"
    assert [outcomes[loc] for loc in forged] == ["refused_origin"] * len(forged)
    assert outcomes[s.source.url("r/a.txt")] == "applied"


# --- out of the mirror directory ---------------------------------------------------


async def test_locs_that_would_escape_the_mirror_are_refused(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    async with following(tmp_path, mosquitto) as s:
        # The mirror, its state and the broker's log may change; nothing else may.
        skip = (s.mirror, default_state_dir(str(s.mirror)), mosquitto.directory)
        before = outside(tmp_path, *skip)
        mirrored = {p: p.read_bytes() for p in s.mirror.rglob("*") if p.is_file()}
        requests = sum(s.source.hits.values())
        base = s.source.base
        hostile = [
            f"{base}../../escaped",
            f"{base}r/../../../escaped",
            f"{base}%2e%2e/%2e%2e/escaped",
            f"{base}r/%2E%2E/%2E%2E/%2E%2E/escaped",
            f"{base}r/..%5C..%5Cescaped",  # backslashes
            f"{base}/{tmp_path}/escaped",  # an absolute path after the host
            f"{base}r/%00escaped",
        ]
        when = w3cdt.now() + timedelta(seconds=1)
        for seq, loc in enumerate(hostile, start=1):
            payload = notification(s.source, seq, loc, "created", when, hash=fixity(b"x"))
            s.forger.send(json.dumps(payload).encode())
        await async_wait_for(
            lambda: s.engine.stats.failed >= len(hostile),
            timeout=20,
            message=lambda: f"not all refused: {s.engine.stats}",
        )
        records = [(await s.outcomes(loc, when))[0] for loc in hostile]
        assert {r.outcome for r in records} == {"unsafe_path"}
        assert sum(s.source.hits.values()) == requests, "refused locs were still requested"
        assert outside(tmp_path, *skip) == before
        assert {p: p.read_bytes() for p in s.mirror.rglob("*") if p.is_file()} == mirrored
    assert not [p for p in tmp_path.parent.rglob("escaped*")]


# --- bytes that do not match ---------------------------------------------------------


async def test_a_hash_mismatch_is_retried_reported_and_not_applied(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    async with following(tmp_path, mosquitto, retries=2) as s:
        loc = s.source.url("r/b.txt")
        path = path_for(loc, s.mirror)
        original = path.read_bytes()
        s.source.files["b.txt"] = b"what the Source really serves\n"
        hits = s.source.hits["/r/b.txt"]
        when = w3cdt.now() + timedelta(seconds=1)
        lie = fixity(b"what the notification claims\n")
        s.forger.send(
            json.dumps(notification(s.source, 1, loc, "updated", when, hash=lie)).encode()
        )
        await async_wait_for(
            lambda: s.engine.stats.failed >= 1,
            timeout=20,
            message=lambda: f"mismatch not reported: {s.engine.stats}",
        )
        records = await s.outcomes(loc, when)
        attempts = s.source.hits["/r/b.txt"] - hits
        assert path.read_bytes() == original, "unverified bytes replaced the file"
    assert attempts == 1 + 2, "one attempt plus --retries 2"
    assert [r.outcome for r in records] == ["hash_mismatch"]
    assert records[0].detail and "sha-256" in records[0].detail


# --- unreadable payloads -------------------------------------------------------------


def _oversized(source: Source, entry: Entry) -> bytes:
    genuine = json.loads(of_entry(source, 1, entry))
    return json.dumps({**genuine, "padding": "x" * (65 * 1024)}).encode()


PAYLOADS = {
    "binary garbage": lambda source, entry: os.urandom(512),
    "not json": lambda source, entry: b"{this is not json",
    "json array": lambda source, entry: b"[1, 2, 3]",
    "missing fields": lambda source, entry: json.dumps({"v": 1, "seq": 1}).encode(),
    "wrong types": lambda source, entry: json.dumps(
        {**json.loads(of_entry(source, 1, entry)), "seq": "one"}
    ).encode(),
    "xml with a DTD": lambda source, entry: (
        b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><urlset>&a;</urlset>'
    ),
    "oversized (65 KiB padding on a genuine notification)": _oversized,
}


@pytest.mark.parametrize("kind", list(PAYLOADS))
async def test_unreadable_payloads_are_dropped_and_trigger_a_catch_up(
    kind: str, tmp_path: Path, mosquitto: Mosquitto
) -> None:
    async with following(tmp_path, mosquitto) as s:
        # A change at the Source that no notification announces: only a catch-up finds it.
        entry = s.source.change("c.txt", b"charlie, second version\n")
        gaps, catchups = s.engine.stats.gaps, s.engine.stats.catchups
        s.forger.send(PAYLOADS[kind](s.source, entry))
        await async_wait_for(
            lambda: not s.differences(),
            timeout=20,
            message=lambda: f"no convergence after {kind}: {s.differences()}, {s.engine.stats}",
        )
        assert s.engine.stats.gaps > gaps and s.engine.stats.catchups > catchups
        assert s.engine.stats.last_gap["reason"].startswith("invalid payload")
        assert entry.datetime is not None
        records = await s.outcomes(entry.loc, entry.datetime)
    assert [(r.outcome, r.seq) for r in records] == [("applied", None)], "from the Change List"


# --- signatures ----------------------------------------------------------------------


async def test_a_subscriber_with_a_secret_refuses_unsigned_notifications_and_polls(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    async with following(tmp_path, mosquitto, secrets={"k1": SECRET}) as s:
        unsigned = s.source.change("a.txt", b"alpha, changed\n")
        s.forger.send(of_entry(s.source, 101, unsigned))
        await async_wait_for(lambda: not s.differences(), timeout=20, message=s.differences)
        assert s.engine.stats.last_gap["reason"] == "invalid payload: notification is not signed"

        badly_signed = s.source.change("b.txt", b"bravo, changed\n")
        payload = of_entry(s.source, 102, badly_signed)
        s.forger.send(payload, sign(payload, b"not the secret"))
        await async_wait_for(lambda: not s.differences(), timeout=20, message=s.differences)
        assert "signature does not match" in s.engine.stats.last_gap["reason"]
        catchups = s.engine.stats.catchups

        # A correctly signed notification is applied from the notification itself.
        signed = s.source.change("c.txt", b"charlie, changed\n")
        payload = of_entry(s.source, 103, signed)
        s.forger.send(payload, sign(payload, SECRET))
        await async_wait_for(lambda: not s.differences(), timeout=20, message=s.differences)
        assert s.engine.stats.catchups == catchups
        rows = [await s.outcomes(e.loc, e.datetime) for e in (unsigned, badly_signed, signed)]
    assert [[(r.outcome, r.seq) for r in found] for found in rows] == [
        [("applied", None)],  # the unsigned change came from polling
        [("applied", None)],  # the badly signed change came from polling
        [("applied", 103)],  # the signed change came from its notification
    ]
