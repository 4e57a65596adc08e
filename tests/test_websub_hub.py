"""The hub's WebSub behaviours one by one: a real hub on a real SQLite log, real HTTP callbacks.

Bad requests (400), denial of an unknown topic, a callback that does not
echo the challenge, unsubscription, ``410 Gone``, and ``gap_too_old`` when a
callback comes back after the log trimmed what it missed -- with the
delivery going on, in order, from the log's earliest seq.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiohttp import web

from rsnotify.devstack import async_wait_for, free_port
from rsnotify.envelope import Notification, to_json
from rsnotify.log import Retention
from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.model import ChangeType
from rsnotify.transport import websubproto as proto
from rsnotify.transport.websub import WebSubHub
from rsnotify.transport.websubstore import MemoryStore

COLLECTION = "source.test-capabilitylist"
CAPABILITY_LIST = "http://source.test/capabilitylist.xml"
CHANGELIST = "http://source.test/changelist.xml"


class Callback:
    """A callback whose answers the test controls."""

    def __init__(self) -> None:
        self.port = free_port()
        self.gets: list[dict[str, str]] = []
        self.posts: list[tuple[dict[str, str], bytes]] = []
        self.accepted: list[tuple[dict[str, str], bytes]] = []  # the posts answered 2xx
        self.echo = True
        self.status = 204
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

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _get(self, request: web.Request) -> web.Response:
        self.gets.append(dict(request.query))
        challenge = request.query.get("hub.challenge", "")
        return web.Response(text=challenge if self.echo else challenge + "!")

    async def _post(self, request: web.Request) -> web.Response:
        post = (dict(request.headers), await request.read())
        self.posts.append(post)
        if self.status < 300:
            self.accepted.append(post)
        return web.Response(status=self.status)

    def seqs(self) -> list[int]:
        return [int(h[proto.SEQ_HEADER]) for h, _ in self.posts if proto.SEQ_HEADER in h]


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[WebSubHub]:
    log = SQLiteLog(tmp_path / "log.sqlite3")
    await log.register(COLLECTION, CAPABILITY_LIST)
    # A ring of 5: what the hub still holds in memory it delivers even after the log
    # trimmed it; the gap test wants a callback further behind than that.
    hub = WebSubHub(
        log,
        MemoryStore(),
        changelists={COLLECTION: CHANGELIST},
        backoff_max=0.3,
        ring_size=5,
    )
    await hub.start()
    try:
        yield hub
    finally:
        await hub.stop()
        await log.close()


@pytest.fixture
async def callback() -> AsyncIterator[Callback]:
    cb = Callback()
    await cb.start()
    try:
        yield cb
    finally:
        await cb.stop()


async def append(hub: WebSubHub, count: int) -> int:
    head = await hub.log.head(COLLECTION)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    payloads = [
        to_json(
            Notification(
                collection=COLLECTION,
                seq=seq,
                capabilitylist=CAPABILITY_LIST,
                changelist=CHANGELIST,
                loc=f"http://source.test/r{seq}",
                change=ChangeType.UPDATED,
                datetime=start + timedelta(seconds=seq),
            )
        )
        for seq in range(head + 1, head + count + 1)
    ]
    return await hub.log.append(COLLECTION, payloads, expected_head=head, checkpoint="{}")


async def request(hub: WebSubHub, **fields: str) -> tuple[int, str]:
    form = urllib.parse.urlencode({k.replace("_", ".", 1): v for k, v in fields.items()})

    def send() -> tuple[int, str]:
        req = urllib.request.Request(hub.url, data=form.encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    return await asyncio.to_thread(send)


async def subscribe(hub: WebSubHub, cb: Callback, secret: str = "s") -> None:
    status, _ = await request(
        hub,
        hub_mode="subscribe",
        hub_topic=hub.topic(COLLECTION),
        hub_callback=cb.url,
        hub_secret=secret,
    )
    assert status == 202
    await async_wait_for(lambda: any(s.callback == cb.url for s in hub.subscriptions()), 10)


async def test_bad_requests_get_400_with_the_reason(hub: WebSubHub, callback: Callback) -> None:
    topic = hub.topic(COLLECTION)
    status, text = await request(hub, hub_mode="publish", hub_url=topic)
    assert status == 400 and "notification log" in text
    status, text = await request(hub, hub_mode="subscribe", hub_topic=topic)
    assert status == 400 and "hub.callback" in text
    status, text = await request(
        hub, hub_mode="subscribe", hub_topic=topic, hub_callback=callback.url, hub_lease_seconds="x"
    )
    assert status == 400 and "lease" in text
    assert callback.gets == [] and hub.subscriptions() == []


async def test_unknown_topics_are_denied_and_unechoed_challenges_fail(
    hub: WebSubHub, callback: Callback
) -> None:
    unknown = hub.url + "no.such-collection"
    assert (await request(hub, hub_mode="subscribe", hub_topic=unknown, hub_callback=callback.url))[
        0
    ] == 202
    await async_wait_for(lambda: callback.gets, 10)
    assert callback.gets[0]["hub.mode"] == "denied"
    assert callback.gets[0]["hub.topic"] == unknown
    assert callback.gets[0]["hub.reason"] == "unknown topic"

    callback.echo = False
    topic = hub.topic(COLLECTION)
    await request(hub, hub_mode="subscribe", hub_topic=topic, hub_callback=callback.url)
    await async_wait_for(lambda: len(callback.gets) == 2, 10)
    assert callback.gets[1]["hub.mode"] == "subscribe"
    await append(hub, 3)
    # The hub delivers nothing to a subscription that was never confirmed: a
    # confirmed one (below) gets seqs 4.. while this callback never gets 1..3.
    callback.echo = True
    await subscribe(hub, callback)
    await append(hub, 2)
    await async_wait_for(lambda: callback.seqs() == [4, 5], 10)


async def test_unsubscribe_and_410_end_a_subscription(hub: WebSubHub, callback: Callback) -> None:
    await subscribe(hub, callback)
    await append(hub, 2)
    await async_wait_for(lambda: callback.seqs() == [1, 2], 10)
    status, _ = await request(
        hub, hub_mode="unsubscribe", hub_topic=hub.topic(COLLECTION), hub_callback=callback.url
    )
    assert status == 202
    await async_wait_for(lambda: not hub.subscriptions(), 10)
    assert callback.gets[-1]["hub.mode"] == "unsubscribe"
    assert "hub.lease_seconds" not in callback.gets[-1]

    await subscribe(hub, callback)
    callback.status = 410
    await append(hub, 1)
    await async_wait_for(lambda: not hub.subscriptions(), 10)
    assert callback.seqs() == [1, 2, 3]  # seq 3 was answered 410, and that was the end
    await append(hub, 1)
    await asyncio.sleep(0.5)  # scenario time: a removed subscription gets nothing more
    assert callback.seqs() == [1, 2, 3]


async def test_a_callback_back_after_the_retention_gets_gap_too_old_then_the_rest_in_order(
    hub: WebSubHub, callback: Callback
) -> None:
    await subscribe(hub, callback, secret="gap-secret")
    await append(hub, 5)
    await async_wait_for(lambda: callback.seqs() == [1, 2, 3, 4, 5], 10)
    callback.status = 503  # the callback fails from now on
    await append(hub, 45)  # seqs 6..50
    await async_wait_for(lambda: len(callback.posts) > 5, 10)  # it is being retried
    await hub.log.trim(COLLECTION, Retention(max_len=10, max_age_s=None), now_ms=0)
    assert await hub.log.earliest(COLLECTION) == 41
    callback.status = 204
    await async_wait_for(lambda: any(proto.TYPE_HEADER in h for h, _ in callback.accepted), 15)
    ok = [(h, b) for h, b in callback.accepted if h.get(proto.TYPE_HEADER) == "gap_too_old"]
    assert len(ok) == 1, "one gap_too_old, then live"
    assert callback.accepted[5] == ok[0], "seqs 1..5, then the notice"
    headers, body = ok[0]
    assert headers["Content-Type"].startswith("application/json")
    assert proto.verify_signature(body, headers[proto.SIGNATURE_HEADER], b"gap-secret")
    assert json.loads(body) == {
        "type": "gap_too_old",
        "collection": COLLECTION,
        "since": 5,
        "earliest": 41,
        "head": 50,
        "capabilitylist": CAPABILITY_LIST,
        "changelist": CHANGELIST,
    }
    # After the gap notice delivery goes on live, after the head (50), in order.
    await append(hub, 3)
    await async_wait_for(lambda: callback.seqs()[-1:] == [53], 10)
    accepted = callback.accepted[6:]
    assert [int(h[proto.SEQ_HEADER]) for h, _ in accepted] == [51, 52, 53]
    assert accepted[0][0][proto.PREV_HEADER] == "50"
    for h, b in accepted:
        assert proto.verify_signature(b, h[proto.SIGNATURE_HEADER], b"gap-secret")
