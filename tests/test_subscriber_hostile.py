"""Hostile notifications: forged messages published straight to the subscriber's MQTT topic.

Why one module of ~640 lines: it is one threat, forged notifications on the subscriber's
topic, tested on one rig -- ``following`` (a counting Source, Mosquitto and a live
``Subscriber``), the ``Forger`` and ``Setup``'s apply-log readers -- that every test uses;
split by kind of forgery, each file would import the same rig to check the same promise.

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
import json
import logging
import os
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from aiohttp import web
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from rsnotify import w3cdt
from rsnotify.envelope import SIGNATURE_PROPERTY, sign
from rsnotify.model import Entry
from rsnotify.subscriber import sync as sync_module
from rsnotify.subscriber.mirror import path_for
from rsnotify.subscriber.resources import ApplyRecord
from rsnotify.subscriber.service import Subscriber, SubscriberConfig, default_state_dir
from rsnotify.subscriber.sync import CollectionSync
from tests.devstack import Mosquitto, async_wait_for, free_port
from tests.minisource import Source, differences, fixity, notification, of_entry

SECRET = b"correct horse battery staple"


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
        return differences(self.source, self.mirror)

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
async def following(
    tmp_path: Path, broker: Mosquitto, *, source: Source | None = None, **options: Any
) -> AsyncIterator[Setup]:
    """A Source with three resources and a live subscriber mirroring it over MQTT.

    With ``source``, follow that (running) Source and leave it running: a test
    can stop the subscriber, change the Source, and follow it again.
    """
    owned = source is None
    if source is None:
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
        if owned:
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
            lambda: s.engine.stats.refused + s.engine.stats.applied >= len(forged) + 1,
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
            lambda: s.engine.stats.refused >= len(hostile),
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
            lambda: s.engine.stats.refused >= 1,
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


# --- forgeries that used to freeze a mirror (security finding, issue 22) --------------

FAR_FUTURE = datetime(2099, 1, 1, tzinfo=UTC)
SIGNED = pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "with-secret"])


def _send_genuine(s: Setup, seq: int, entry: Entry, signed: bool) -> None:
    payload = of_entry(s.source, seq, entry)
    s.forger.send(payload, sign(payload, SECRET) if signed else None)


async def _events(s: Setup) -> list[tuple[str, str]]:
    assert s.sub._cursors is not None
    return [(kind, detail) for _, _, kind, detail in await s.sub._cursors.events(1000)]


@SIGNED
async def test_a_far_future_forgery_skips_no_genuine_change(
    signed: bool, tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """The probe's scenario: one forged "created" dated 2099 under the next sequence number.

    Before the fix the subscriber without a secret saved 2099 as its Change
    List position: the next 20 genuine changes were skipped without a word and
    a restart caught up nothing.  Now the forgery is refused and reported, every
    genuine change is applied, the position never passes the Source's own
    newest change, and a restart catches up what changed while it was down.
    """
    options: dict[str, Any] = {"secrets": {"k1": SECRET}} if signed else {}
    source = Source()
    await source.start({"a.txt": b"alpha\n", "b.txt": b"bravo\n", "c.txt": b"charlie\n"})
    try:
        async with following(tmp_path, mosquitto, source=source, **options) as s:
            forged = notification(
                source, 1, source.url("r/does-not-exist.txt"), "created", FAR_FUTURE
            )
            s.forger.send(json.dumps(forged).encode())  # seq 1 = head + 1
            entries = []
            for i in range(20):  # creates, updates and deletes of other resources
                name = ("a.txt", "b.txt", f"new{i % 5}.txt", "c.txt")[i % 4]
                delete = i % 7 == 6 and name in source.files
                entries.append(source.change(name, None if delete else f"v{i}\n".encode()))
                _send_genuine(s, i + 1, entries[-1], signed)
            await async_wait_for(
                lambda: not s.differences(),
                timeout=30,
                message=lambda: f"genuine changes skipped: {s.differences()}, {s.engine.stats}",
            )
            events = await async_wait_for(
                lambda: _forgery_reported(s, signed), timeout=20, message="forgery not reported"
            )
            assert events
            newest = entries[-1].datetime
            assert newest is not None
            position = s.engine.applied.last_time
            assert position is None or position <= newest, f"position moved to {position}"
            assert not path_for(source.url("r/does-not-exist.txt"), s.mirror).exists()
        # Changes while the subscriber is down, announced by nobody: the restart
        # catches them up (before the fix it caught up nothing).
        for i in range(5):
            source.change(f"offline{i}.txt", f"made while away {i}\n".encode())
        source.change("a.txt", b"alpha, changed while away\n")
        async with following(tmp_path, mosquitto, source=source, **options) as s:
            assert s.differences() == []  # the start-up catch-up found all of them
    finally:
        await source.stop()


async def _forgery_reported(s: Setup, signed: bool) -> list[tuple[str, str]]:
    if signed:  # unsigned on a channel that requires signatures: refused, then a catch-up
        wanted = [e for e in await _events(s) if "notification is not signed" in e[1]]
    else:  # dated beyond the clock-skew bound: refused and reported as such
        wanted = [e for e in await _events(s) if e[0] == "refused" and "2099" in e[1]]
    return wanted


@SIGNED
async def test_a_forged_deletion_removes_nothing_the_source_still_serves(
    signed: bool, tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """A deletion pushed without (a valid) signature is confirmed at the Source first."""
    options: dict[str, Any] = {"secrets": {"k1": SECRET}} if signed else {}
    async with following(tmp_path, mosquitto, **options) as s:
        loc = s.source.url("r/a.txt")
        when = w3cdt.now()
        s.forger.send(json.dumps(notification(s.source, 1, loc, "deleted", when)).encode())
        if signed:
            await async_wait_for(
                lambda: _forgery_reported_unsigned(s), timeout=20, message="forgery not refused"
            )
        else:
            records = await s.outcomes(loc, when)
            assert [r.outcome for r in records] == ["unconfirmed"]
            # Counted just after the row is written: wait for it, don't race it.
            await async_wait_for(lambda: s.engine.stats.refused >= 1, timeout=10)
        assert path_for(loc, s.mirror).exists(), "a forged deletion removed a file"
        # A genuine deletion still goes through: the Source answers 404 (or it is signed).
        gone = s.source.change("b.txt", None)
        _send_genuine(s, 1, gone, signed)
        await async_wait_for(lambda: not s.differences(), timeout=20, message=s.differences)
        assert gone.datetime is not None
        rows = await s.outcomes(gone.loc, gone.datetime)
    assert [r.outcome for r in rows][-1] == "deleted"


async def _forgery_reported_unsigned(s: Setup) -> bool:
    return any("notification is not signed" in detail for _, detail in await _events(s))


async def test_a_forged_sequence_number_does_not_hide_the_genuine_notification(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """On an unsigned channel a forgery can take the next number, or jump far ahead.

    The genuine notifications that come with those numbers afterwards are
    still applied from push (not dropped as "duplicates"), and the collision
    is reported.
    """
    async with following(tmp_path, mosquitto) as s:
        a = s.source.url("r/a.txt")
        s.forger.send(json.dumps(notification(s.source, 1, a, "updated", w3cdt.now())).encode())
        first = s.source.change("c.txt", b"charlie, second\n")
        _send_genuine(s, 1, first, signed=False)  # the number the forgery took
        s.forger.send(json.dumps(notification(s.source, 1000, a, "updated", w3cdt.now())).encode())
        later = [s.source.change(n, f"{n} {i}\n".encode()) for i, n in ((2, "b.txt"), (3, "d.txt"))]
        for seq, entry in zip((2, 3), later, strict=True):
            _send_genuine(s, seq, entry, signed=False)
        await async_wait_for(lambda: not s.differences(), timeout=20, message=s.differences)
        rows = [await s.outcomes(e.loc, e.datetime) for e in (first, *later) if e.datetime]
        events = await _events(s)
    # Applied from their notifications (with their seqs), not only by a later catch-up.
    assert [(found[0].outcome, found[0].seq) for found in rows] == [
        ("applied", 1),
        ("applied", 2),
        ("applied", 3),
    ]
    assert any(kind == "conflict" and "seq 1 came with two different" in d for kind, d in events)


async def test_a_flood_of_garbage_costs_the_source_one_walk_per_interval(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """Unreadable payloads on an unsigned channel are doubts, settled by rate-limited walks."""
    async with following(tmp_path, mosquitto) as s:
        walks = s.source.hits["/changelist.xml"]
        catchups, doubts = s.engine.stats.catchups, s.engine.stats.doubts
        for _ in range(50):
            s.forger.send(b"\x00 not a notification")
        await async_wait_for(
            lambda: (
                s.engine.stats.doubts - doubts == 50
                and s.engine._doubts.reason is None
                and s.engine.stats.catchups > catchups
                and s.engine.stats.state == "live"
            ),
            timeout=30,
            message="the doubts were not settled",
        )
        extra = s.engine.stats.catchups - catchups
        reads = s.source.hits["/changelist.xml"] - walks
        reported = [e for e in await _events(s) if e[0] == "invalid"]
    assert 1 <= extra <= 3, f"{extra} catch-ups for 50 garbage payloads"
    assert reads <= 3 * extra, f"{reads} Change List reads"
    assert 1 <= len(reported) <= extra, "one report per walk, not one per payload"


@SIGNED
async def test_the_start_up_says_whether_push_is_trusted(
    signed: bool, tmp_path: Path, mosquitto: Mosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    options: dict[str, Any] = {"secrets": {"k1": SECRET}} if signed else {}
    with caplog.at_level(logging.WARNING, logger="rsnotify.subscribe"):
        async with following(tmp_path, mosquitto, **options):
            pass
    warned = [r for r in caplog.records if "not signed" in r.getMessage()]
    if signed:
        assert warned == []
    else:
        assert len(warned) == 1
        assert "anonymous" in warned[0].getMessage()


async def test_a_quiet_walk_follows_push_and_moves_the_position_without_reapplying(
    tmp_path: Path, mosquitto: Mosquitto, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Push never moves the position (a forgery could), so a walk follows it.

    Without it a restart re-read everything push applied since the last walk
    (thousands of entries after a long live run); the walk settles what push
    already applied without any work and confirms provisional states.
    """
    monkeypatch.setattr(sync_module, "CONFIRM_AFTER_CHANGES", 10)
    async with following(tmp_path, mosquitto) as s:
        entries = [s.source.change(f"n{i}.txt", f"new {i}\n".encode()) for i in range(12)]
        for seq, entry in enumerate(entries, start=1):
            _send_genuine(s, seq, entry, signed=False)
        await async_wait_for(lambda: not s.differences(), timeout=20, message=s.differences)
        await async_wait_for(
            lambda: (
                s.engine.stats.confirm_walks >= 1
                and s.engine.applied.last_time is not None
                and s.engine.applied.last_time >= entries[9].datetime
            ),  # type: ignore[operator]
            timeout=20,
            message=lambda: f"the position did not follow push: {s.engine.applied}",
        )
        records = await s.apply_log()
    applied = Counter(r.loc for r in records if r.outcome == "applied")
    assert all(applied[e.loc] == 1 for e in entries), "the walk applied again what push did"
    confirmed = {r.loc for r in records if r.outcome == "confirmed"}
    assert {e.loc for e in entries[:10]} <= confirmed, "provisional states were confirmed"


@pytest.mark.parametrize("cause", ["following push", "a doubt"])
async def test_push_is_applied_while_a_walk_waits_for_the_source(
    cause: str, tmp_path: Path, mosquitto: Mosquitto, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unsigned, a walk runs beside push: a slow Change List holds no notification.

    Both the walk that follows every thousand pushed changes and the walk a
    doubt makes (here an unreadable payload): while the engine waited for
    them, every notification that came meanwhile waited too (the p99 of
    change-to-applied in bench.e2e).  Unsigned notifications are hints
    applied at once anyway, so the walk need not hold them.
    """
    monkeypatch.setattr(sync_module, "CONFIRM_AFTER_CHANGES", 3)
    async with following(tmp_path, mosquitto) as s:
        gate = s.source.gates["/changelist.xml"] = asyncio.Event()
        reads = s.source.hits["/changelist.xml"]
        seq = 1
        try:
            if cause == "a doubt":
                s.forger.send(b"\x00 not a notification")
            else:
                for i in range(3):
                    entry = s.source.change(f"n{i}.txt", f"new {i}\n".encode())
                    _send_genuine(s, seq, entry, signed=False)
                    seq += 1
            await async_wait_for(
                lambda: s.source.hits["/changelist.xml"] > reads,
                timeout=20,
                message=f"no walk began after {cause}",
            )
            later = s.source.change("later.txt", b"pushed while the walk waits\n")
            _send_genuine(s, seq, later, signed=False)
            await async_wait_for(
                lambda: not s.differences(),
                timeout=20,
                message=lambda: f"push waited for the walk: {s.differences()}",
            )
            assert not gate.is_set() and s.engine._following is not None
        finally:
            gate.set()
        await async_wait_for(
            lambda: (
                s.engine._following is None
                and s.engine.applied.last_time is not None
                and s.engine.applied.last_time >= later.datetime
            ),  # type: ignore[operator]
            timeout=20,
            message=lambda: f"the walk did not end or move the position: {s.engine.applied}",
        )
        found = await s.outcomes(later.loc, later.datetime)  # type: ignore[arg-type]
        passes = s.source.hits["/changelist.xml"] - reads
        walks = (s.engine.stats.confirm_walks, s.engine.stats.catchups)
    assert found[0].outcome == "applied" and found[0].seq == seq, "applied from push"
    if cause == "a doubt":
        assert walks == (0, 2)  # the start-up's, then the doubt's
    else:
        assert walks == (1, 1)
        assert passes == 1, f"{passes} reads of the Change List: what came since is pushed anyway"
