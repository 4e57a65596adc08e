"""``rsnotify subscribe --via websub``: convergence under faults, and leases.

Why one module of ~580 lines: it holds the tests of following a Source over WebSub; the
convergence run and its helpers (``Relay``, ``refusals``, ``hub_head``) are half of it,
while the lease and advertising tests run in-process and share only constants with it --
they could stand apart, and are here so the WebSub Destination is read in one file.

The convergence scenario runs the real things broker-less -- ``rsnotify
simulate``, ``rsnotify publish --websub`` on the embedded SQLite log and
store, ``rsnotify subscribe --via http://hub/ --callback ...`` -- with a TCP
relay in front of the subscriber's callback so the test can make the callback
unreachable while the subscriber itself lives on.  Faults, at points chosen by
the Source's progress: the subscriber killed (-9) and restarted three times, the publisher
(and its hub) killed (-9) and restarted, and the callback unreachable for
longer than the log's retention.  At the end the mirror equals
``/_simulator/state`` file for file (SHA-256), and the logs show the hub told
the subscriber ``gap_too_old`` and the subscriber caught up from the Change
List Index.

The lease test uses an in-process hub with a real callback server: a 2 s
lease expires (deliveries stop, the subscription is gone from the store), a
renewal before expiry keeps the subscription and its cursor.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from rsnotify.envelope import Notification, decode_batch, to_json
from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.model import ChangeType
from rsnotify.transport.websub import WebSubHub
from rsnotify.transport.websubproto import LeasePolicy
from rsnotify.transport.websubstore import SQLiteStore
from tests.devstack import ManagedProcess, async_wait_for, free_port, wait_for
from tests.groundtruth import mirror_differences

RunRsnotify = Callable[..., ManagedProcess]
CHANGES = 3_000
RATE = 200
RETAIN = 300
LOOPBACK = ["127.0.0.0/8"]  # the tests' callbacks: allowed explicitly (issue 22.2)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def post(url: str) -> Any:
    request = urllib.request.Request(url, method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def messages(process: ManagedProcess, needle: str) -> list[str]:
    found = []
    for line in process.output("stderr", whole_history=True).splitlines():
        if line.startswith("{") and needle in line:
            try:
                found.append(json.loads(line)["message"])
            except (ValueError, KeyError):
                continue  # a line cut short by kill -9
    return found


def refusals(subscriber: ManagedProcess) -> list[tuple[int, int]]:
    """(first seq missing, earliest the log holds) of every gap_too_old the subscriber logged."""
    found = []
    for message in messages(subscriber, "log no longer holds seq "):
        first, earliest = re.findall(r"\d+", message.split("log no longer holds seq ", 1)[1])[:2]
        found.append((int(first), int(earliest)))
    return found


def outage_refused(subscriber: ManagedProcess, cut_at: int) -> bool:
    """Whether a gap_too_old covered the first seq logged after the cut (cut_at + 1)."""
    return any(first <= cut_at + 1 < earliest for first, earliest in refusals(subscriber))


def hub_head(hub: str, collection: str) -> int:
    """The collection's head as the hub's topic reports it (waiting out a restarting hub)."""

    def head() -> int | None:
        try:
            with urllib.request.urlopen(hub + collection, timeout=10) as response:
                return int(response.headers["X-RsNotify-Head"])
        except OSError:
            return None

    found: int = wait_for(head, timeout=30, interval=0.05, message="the hub is not serving")
    return found


def collection_of(subscriber: ManagedProcess) -> str:
    match = re.search(r"following (\S+) into", subscriber.output("stdout", whole_history=True))
    assert match is not None, subscriber.tail()
    return match.group(1)


class Relay:
    """A TCP relay we can cut: while down, connections are refused and open ones dropped."""

    def __init__(self, port: int, target: int) -> None:
        self.port, self.target = port, target
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        self.writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self.writers -= {writer, up_writer}

    async def _up(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)

    async def _down(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for writer in list(self.writers):
            writer.transport.abort()
        self.writers.clear()

    def up(self) -> None:
        self._call(self._up())

    def down(self) -> None:
        self._call(self._down())

    def close(self) -> None:
        self.down()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.mark.timeout(240)
def test_websub_subscriber_converges_under_faults(
    tmp_path: Path, rsnotify_process: RunRsnotify
) -> None:
    hub_port, relay_port, callback_port = free_port(), free_port(), free_port()
    sim = rsnotify_process(
        "simulate",
        "--port", "0",
        "--collections", "1",
        "--resources", "100",
        "--payload-bytes", "512",
        "--rate", str(RATE),
        "--max-changes", str(CHANGES),
        "--changelist-size", "500",
        "--seed", "20261122",
        "--paused",
        name="simulate",
    )  # fmt: skip
    source = sim.wait_for_line(r"serving (http://\S+)", timeout=30).group(1)
    publisher = rsnotify_process(
        "publish",
        source,
        "--state-dir", str(tmp_path / "publisher"),
        "--websub", f"127.0.0.1:{hub_port}",
        "--websub-allow-callback", "127.0.0.0/8",
        "--websub-retry-max", "1",
        "--retain", str(RETAIN),
        "--poll", "0.1",
        "--log-format", "json",
        name="publish",
    )  # fmt: skip
    publisher.wait_for_line(r"rsnotify publish: running", timeout=30)
    mirror = tmp_path / "mirror"
    subscriber = rsnotify_process(
        "subscribe", source,
        "--into", str(mirror),
        "--via", f"http://127.0.0.1:{hub_port}/",
        "--callback", f"http://127.0.0.1:{relay_port}/websub",
        "--callback-listen", f"127.0.0.1:{callback_port}",
        "--heartbeat-timeout", "10",
        "--log-format", "json",
        name="subscribe",
    )  # fmt: skip
    relay = Relay(relay_port, callback_port)
    relay.up()
    try:
        wait_for(
            lambda: (
                ": live\n" in subscriber.output("stdout") and messages(subscriber, "subscribed at")
            ),
            timeout=60,
            message=lambda: f"the subscriber did not go live\n{subscriber.tail()}",
        )
        post(f"{source}_simulator/resume")
        faults: list[tuple[str, int]] = []

        def at(progress: int, what: str, action: Callable[[], object]) -> None:
            wait_for(
                lambda: get_json(f"{source}_simulator/stats")["changes"] >= progress,
                timeout=60,
                interval=0.05,
                message=f"the Source did not reach {progress} changes",
            )
            action()
            faults.append((what, get_json(f"{source}_simulator/stats")["changes"]))

        at(400, "kill -9 subscriber", subscriber.kill)
        at(600, "restart subscriber", subscriber.start)
        at(900, "kill -9 publisher", publisher.kill)
        at(900, "restart publisher", publisher.start)
        at(1300, "callback unreachable", relay.down)
        cut_at = hub_head(f"http://127.0.0.1:{hub_port}/", collection_of(subscriber))
        # Back once the log has moved 2 x RETAIN past the cut (not the Source's
        # count: a publisher restarted at 900 may still be catching up).
        wait_for(
            lambda: (
                hub_head(f"http://127.0.0.1:{hub_port}/", collection_of(subscriber))
                >= cut_at + 2 * RETAIN
            ),
            timeout=60,
            interval=0.1,
            message="the log did not move past the outage",
        )
        at(1300 + 2 * RETAIN, "callback reachable", relay.up)
        # The hub's gap_too_old for *this* outage must reach a running subscriber
        # before it is killed again (an earlier one, from the first kill, does not count).
        wait_for(
            lambda: outage_refused(subscriber, cut_at),
            timeout=60,
            message=lambda: (
                f"no gap_too_old for the outage after head {cut_at} reached the subscriber: "
                f"{refusals(subscriber)}\n{subscriber.tail()}"
            ),
        )
        # Three subscriber kills in all, as in the other transports' convergence test.
        at(2100, "kill -9 subscriber", subscriber.kill)
        at(2250, "restart subscriber", subscriber.start)
        at(2500, "kill -9 subscriber", subscriber.kill)
        at(2650, "restart subscriber", subscriber.start)
        wait_for(
            lambda: get_json(f"{source}_simulator/stats")["finished"],
            timeout=90,
            interval=0.2,
            message="the simulator did not finish its changes",
        )
        post(f"{source}_simulator/pause")
        state = get_json(f"{source}_simulator/state")
        assert sum(c["changes"] for c in state["collections"].values()) == CHANGES
        started = time.monotonic()
        last: list[str] = []

        def equal() -> bool:
            last[:] = mirror_differences(state, mirror)
            return not last

        wait_for(
            equal,
            timeout=60,
            interval=0.5,
            message=lambda: (
                f"no convergence: {len(last)} differences, e.g. {last[:5]}\n{subscriber.tail()}"
            ),
        )
        converge_s = time.monotonic() - started
    finally:
        relay.close()
    assert subscriber.running, subscriber.tail()
    assert publisher.running, publisher.tail()
    down = next(n for what, n in faults if what == "callback unreachable")
    back = next(n for what, n in faults if what == "callback reachable")
    assert back - down > RETAIN, faults
    # The hub told the subscriber the log no longer held what it missed ...
    assert messages(publisher, "beyond retention"), "the hub never sent gap_too_old"
    # Push did not bridge the outage: the first seq logged after the cut
    # (cut_at + 1, the head being read after it) was refused by a gap_too_old.
    assert outage_refused(subscriber, cut_at), (
        f"the callback's outage did not end in gap_too_old: {refusals(subscriber)}, "
        f"head {cut_at} at the cut"
    )
    # ... and the subscriber caught up from the Change List Index.
    catchups = messages(subscriber, "from the Change List Index in")
    assert catchups, "no catch-up from the Change List Index"
    print(
        "\nwebsub convergence:",
        *(f"{n:>6} {what}" for what, n in faults),
        f"converged {converge_s:.1f}s after the Source froze",
        f"catch-ups: {catchups}",
        sep="\n  ",
    )


# --- leases ---------------------------------------------------------------------------


class Callback:
    """A plain callback that confirms intent and counts deliveries."""

    def __init__(self) -> None:
        self.port = free_port()
        self.seqs: list[int] = []
        self.verified: list[dict[str, str]] = []
        self.runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/cb"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/cb", self._get)
        app.router.add_post("/cb", self._post)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def _get(self, request: web.Request) -> web.Response:
        self.verified.append(dict(request.query))
        return web.Response(text=request.query["hub.challenge"])

    async def _post(self, request: web.Request) -> web.Response:
        batch = decode_batch(await request.read())  # one or more changes per POST
        self.seqs += [n.seq for n in batch.changes if n.seq is not None]
        return web.Response(status=204)


async def _subscribe(hub: WebSubHub, topic: str, callback: str, lease: int) -> int:
    form = urllib.parse.urlencode(
        {
            "hub.mode": "subscribe",
            "hub.topic": topic,
            "hub.callback": callback,
            "hub.lease_seconds": str(lease),
        }
    ).encode()

    def send() -> int:
        request = urllib.request.Request(hub.url, data=form, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            status: int = response.status
            return status

    return await asyncio.to_thread(send)


async def test_short_leases_expire_and_renewals_keep_the_cursor(tmp_path: Path) -> None:
    collection = "source.test-capabilitylist"
    log = SQLiteLog(tmp_path / "log.sqlite3")
    await log.register(collection, "http://source.test/capabilitylist.xml")
    head = 0

    async def append(count: int) -> None:
        nonlocal head
        payloads = [
            to_json(
                Notification(
                    collection=collection,
                    seq=seq,
                    capabilitylist="http://source.test/capabilitylist.xml",
                    changelist="http://source.test/changelist.xml",
                    loc=f"http://source.test/r{seq}",
                    change=ChangeType.CREATED,
                    datetime=datetime_of(seq),
                )
            )
            for seq in range(head + 1, head + count + 1)
        ]
        head = await log.append(collection, payloads, expected_head=head, checkpoint="{}")

    store_path = tmp_path / "websub.sqlite3"
    hub = WebSubHub(
        log,
        SQLiteStore(store_path),
        lease=LeasePolicy(default=2, minimum=1),
        allow_callbacks=LOOPBACK,
    )
    await hub.start()
    renewing, expiring = Callback(), Callback()
    await renewing.start()
    await expiring.start()
    topic = hub.topic(collection)
    try:
        assert await _subscribe(hub, topic, renewing.url, 2) == 202
        assert await _subscribe(hub, topic, expiring.url, 2) == 202
        await async_wait_for(lambda: len(hub.subscriptions()) == 2, 10)
        assert renewing.verified[0]["hub.lease_seconds"] == "2"
        await append(5)
        await async_wait_for(lambda: len(renewing.seqs) == len(expiring.seqs) == 5, 10)
        # Renew one at about half its lease; the other is left to expire.
        await asyncio.sleep(1.0)  # scenario time: half of the 2 s lease passes
        assert await _subscribe(hub, topic, renewing.url, 2) == 202
        await async_wait_for(lambda: len(renewing.verified) == 2, 10)
        await async_wait_for(lambda: [s.callback for s in hub.subscriptions()] == [renewing.url], 5)
        kept = hub.subscriptions()[0]
        assert kept.cursor == 5, "a renewal keeps the delivery cursor"
        await append(3)
        await async_wait_for(lambda: renewing.seqs == list(range(1, 9)), 10)
        # The hub moves the cursor once the callback's answer is back, a moment
        # after the callback saw the POST: wait for that before stopping it.
        await async_wait_for(lambda: [s.cursor for s in hub.subscriptions()] == [8], 10)
        assert expiring.seqs == [1, 2, 3, 4, 5], "an expired subscription got more"
        # The expired subscription is gone from the store too (a restart keeps only the live one).
        await hub.stop()
        reopened = SQLiteStore(store_path)
        stored = await reopened.load()
        await reopened.close()
        assert [(s.callback, s.cursor) for s in stored] == [(renewing.url, 8)]
        # Left alone, the renewed one expires as well.
        hub = WebSubHub(
            log,
            SQLiteStore(store_path),
            lease=LeasePolicy(default=2, minimum=1),
            allow_callbacks=LOOPBACK,
        )
        await hub.start()
        assert [s.callback for s in hub.subscriptions()] == [renewing.url]
        await async_wait_for(lambda: not hub.subscriptions(), 5)
    finally:
        await hub.stop()
        await hub.store.close()
        for callback in (renewing, expiring):
            if callback.runner is not None:
                await callback.runner.cleanup()
        await log.close()


def datetime_of(seq: int) -> Any:
    from datetime import UTC, datetime, timedelta

    return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=seq)


# --- advertising ------------------------------------------------------------------------


async def test_the_capability_list_advertises_topic_and_hub_as_change_notification_says(
    tmp_path: Path,
) -> None:
    """``--write-hubs``: a ``<url>`` with the topic, capability change-notification, rel=hub.

    And a Destination given ``--via websub`` finds hub and topic from that markup alone.
    """
    from rsnotify import sitemap
    from rsnotify.discovery import CapabilityListInfo
    from rsnotify.model import CapabilityList
    from rsnotify.publisher.service import Publisher, PublisherConfig
    from rsnotify.subscriber.websub import websub_target
    from tests.helpers import running_simulator

    site = tmp_path / "site"
    port = free_port()
    async with running_simulator(paused=True, dir=site, base_url="http://source.test/"):
        publisher = Publisher(
            PublisherConfig(
                source=str(site), state_dir=str(tmp_path / "state"), websub=f"127.0.0.1:{port}"
            )
        )
        await publisher.start()
        try:
            (cid,) = publisher.collections
            publisher.write_hub_links()
            publisher.write_hub_links()  # idempotent
        finally:
            await publisher.stop()
    path = site / "c1" / "capabilitylist.xml"
    document = sitemap.parse(path)
    assert isinstance(document, CapabilityList)
    hub, topic = f"http://127.0.0.1:{port}/", f"http://127.0.0.1:{port}/{cid}"
    notification = [e for e in document.entries if e.capability == "change-notification"]
    assert [(e.loc, [(ln.rel, ln.href) for ln in e.links]) for e in notification] == [
        (topic, [("hub", hub)])
    ]
    assert document.capabilities["changelist"], "the rest of the document is kept"
    text = path.read_text()
    assert f'<rs:ln rel="hub" href="{hub}"/>' in text
    info = CapabilityListInfo.from_document("http://source.test/c1/capabilitylist.xml", document)
    assert websub_target(info, cid, "websub") == (hub, topic)
    assert websub_target(info, cid, "http://other.test/hub") == (
        "http://other.test/hub/",
        topic,  # the advertised topic is kept: it need not live on the hub
    )


async def test_the_rsnotify_destination_renews_short_leases_and_lets_them_lapse_when_stopped(
    tmp_path: Path,
) -> None:
    """``--websub-lease 2``: renewed at 2/3 of the lease, so it outlives many leases."""
    from rsnotify.subscriber import events as ev
    from rsnotify.subscriber.websub import CallbackServer, WebSubChannel, load_secret
    from rsnotify.transport.websubstore import MemoryStore

    collection = "source.test-capabilitylist"
    log = SQLiteLog(tmp_path / "log.sqlite3")
    await log.register(collection, "http://source.test/capabilitylist.xml")
    hub = WebSubHub(
        log, MemoryStore(), lease=LeasePolicy(default=600, minimum=1), allow_callbacks=LOOPBACK
    )
    await hub.start()
    events: list[ev.Event] = []
    server = CallbackServer(f"http://127.0.0.1:{free_port()}/cb")
    secret = load_secret(tmp_path)
    assert (
        load_secret(tmp_path) == secret and (tmp_path / "websub-secret").stat().st_mode & 0o77 == 0
    )
    channel = WebSubChannel(
        server,
        hub=hub.url,
        topic=hub.topic(collection),
        collection=collection,
        sink=events.append,
        secret=secret,
        lease_seconds=2,
        heartbeat=0.5,
    )
    channel.start()
    try:
        await async_wait_for(lambda: hub.subscriptions(), 10)
        first = hub.subscriptions()[0].expires
        await asyncio.sleep(5.0)  # scenario time: two and a half leases of 2 s
        (sub,) = hub.subscriptions()
        assert sub.expires > first + 2, "the lease was renewed"
        payload = to_json(
            Notification(
                collection=collection,
                seq=1,
                capabilitylist="http://source.test/capabilitylist.xml",
                changelist="http://source.test/changelist.xml",
                loc="http://source.test/r1",
                change=ChangeType.CREATED,
                datetime=datetime_of(1),
            )
        )
        await log.append(collection, [payload], expected_head=0, checkpoint="{}")
        await async_wait_for(lambda: [e for e in events if isinstance(e, ev.Message)], 10)
        message = next(e for e in events if isinstance(e, ev.Message))
        assert message.prev == 0 and b'capability="change-notification"' in message.payload
        await async_wait_for(  # the topic poll (every 0.5 s) reports the new head
            lambda: [e for e in events if isinstance(e, ev.Head) and e.head == 1], 5
        )
        assert sum(isinstance(e, ev.Connected) for e in events) >= 3, "subscribed, renewed twice"
        assert not [e for e in events if isinstance(e, ev.Invalid)]
        await channel.stop()
        await async_wait_for(lambda: not hub.subscriptions(), 5)  # the lease lapses
    finally:
        await channel.stop()
        await hub.stop()
        await log.close()
