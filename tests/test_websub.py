"""Acceptance of the WebSub hub (issue 9) with a Destination written here, not rsnotify's.

``rsnotify simulate`` is the Source and ``rsnotify publish --websub`` the
publisher and hub, both real processes on a real Redis.  The Destination is
a plain aiohttp callback server in this file that speaks WebSub the way any
other implementation would: it subscribes with a form POST, echoes the
``hub.challenge``, checks ``X-Hub-Signature`` (HMAC-SHA256 of the body with
its ``hub.secret``) and the ``Link`` headers, and reads the ResourceSync
Change Notification XML with lxml -- never with :mod:`rsnotify.envelope`.

What the test proves: every notification of a 2,000-change run arrives
exactly once, in sequence order, signed, and equal to its Change List entry;
a callback that is down for 10 s gets what it missed afterwards, in order.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from lxml import etree

from rsnotify import sitemap, w3cdt
from rsnotify.devstack import ManagedProcess, Redis, async_wait_for, free_port
from rsnotify.model import Capability, CapabilityList, ChangeListIndex, Entry

RunRsnotify = Callable[..., ManagedProcess]
SM = "{http://www.sitemaps.org/schemas/sitemap/0.9}"
RS = "{http://www.openarchives.org/rs/terms/}"
RSN = "{urn:x-rsnotify:notification:1}"
CHANGES = 2_000
DOWN_S = 10.0
SECRET = "a-websub-secret"


# --- the Source and the publisher (real processes) -------------------------------------


def http_json(url: str, data: bytes | None = None) -> Any:
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def http_bytes(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body


async def start_simulator(run: RunRsnotify, *options: str) -> str:
    process = run("simulate", "--port", "0", "--quiet", "--paused", *options)
    match = await asyncio.to_thread(
        process.wait_for_line, r"rsnotify simulate: serving (http://\S+/)$", timeout=20
    )
    return match.group(1)


async def start_publisher(process: ManagedProcess) -> dict[str, str]:
    """Start (or restart) ``rsnotify publish``; its collections, id -> Capability List."""
    process.start()
    await asyncio.to_thread(
        process.wait_for_line, r"rsnotify publish: running", timeout=30, stream="stdout"
    )
    lines = process.output("stdout").splitlines()
    return dict(
        line.split()[3:5] for line in lines if line.startswith("rsnotify publish: collection ")
    )


def change_list_entries(capability_list: str) -> list[Entry]:
    capabilities = sitemap.parse(http_bytes(capability_list))
    assert isinstance(capabilities, CapabilityList)
    url = capabilities.capability_url(Capability.CHANGELIST)
    assert url is not None
    document = sitemap.parse(http_bytes(url))
    if not isinstance(document, ChangeListIndex):
        return list(document)
    return [entry for ref in document for entry in sitemap.parse(http_bytes(ref.loc))]


# --- a WebSub subscriber written the plain way -----------------------------------------


@dataclass
class Delivery:
    seq: int
    loc: str
    change: str
    datetime: str
    signature_ok: bool
    links: str


@dataclass
class PlainSubscriber:
    """An aiohttp callback that does WebSub by the book, and records what it gets."""

    port: int
    secret: str = SECRET
    verifications: list[dict[str, str]] = field(default_factory=list)
    denials: list[dict[str, str]] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    other_posts: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    runner: web.AppRunner | None = None

    @property
    def callback(self) -> str:
        return f"http://127.0.0.1:{self.port}/inbox?who=plain"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/inbox", self.verify)
        app.router.add_post("/inbox", self.receive)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def verify(self, request: web.Request) -> web.Response:
        query = dict(request.query)
        assert query.pop("who") == "plain", "the hub dropped the callback's own query"
        if query["hub.mode"] == "denied":
            self.denials.append(query)
            return web.Response(text="ok")
        self.verifications.append(query)
        return web.Response(text=query["hub.challenge"])

    async def receive(self, request: web.Request) -> web.Response:
        body = await request.read()
        expected = "sha256=" + hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
        signature_ok = hmac.compare_digest(request.headers.get("X-Hub-Signature", ""), expected)
        if not request.content_type.endswith("xml"):
            self.other_posts.append((dict(request.headers), body))
            return web.Response(status=204)
        root = etree.fromstring(body, etree.XMLParser(resolve_entities=False, no_network=True))
        assert root.tag == SM + "urlset"
        assert root.find(RS + "md").get("capability") == "changelist-notification"
        (url,) = root.findall(SM + "url")
        md = url.find(RS + "md")
        self.deliveries.append(
            Delivery(
                seq=int(md.get(RSN + "seq")),
                loc=url.findtext(SM + "loc"),
                change=md.get("change"),
                datetime=md.get("datetime") or url.findtext(SM + "lastmod"),
                signature_ok=signature_ok,
                links=request.headers.get("Link", ""),
            )
        )
        return web.Response(status=204)

    def subscribe(self, hub: str, topic: str, lease: int = 600) -> int:
        form = urllib.parse.urlencode(
            {
                "hub.mode": "subscribe",
                "hub.topic": topic,
                "hub.callback": self.callback,
                "hub.lease_seconds": str(lease),
                "hub.secret": self.secret,
            }
        ).encode()
        request = urllib.request.Request(hub, data=form, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            status: int = response.status
            return status


def topic_content(topic: str, hub: str) -> etree._Element:
    with urllib.request.urlopen(topic, timeout=10) as response:
        assert response.headers["Link"] == f'<{topic}>; rel="self", <{hub}>; rel="hub"'
        assert response.headers["Content-Type"] == "application/xml"
        root = etree.fromstring(response.read(), etree.XMLParser(resolve_entities=False))
    assert root.tag == SM + "urlset"
    assert root.find(RS + "md").get("capability") == "changelist-notification"
    return root


async def subscriptions(hub: str, collection: str) -> int:
    topics = await asyncio.to_thread(http_json, hub)
    count: int = topics["topics"][collection]["subscriptions"]
    return count


# --- the test ------------------------------------------------------------------------------


async def test_plain_subscriber_gets_every_notification_in_order_signed_even_after_downtime(
    rsnotify_process: RunRsnotify, redis_server: Redis, tmp_path: Any
) -> None:
    source = await start_simulator(
        rsnotify_process, "--collections", "1", "--rate", "400", "--max-changes", str(CHANGES)
    )
    hub_port = free_port()
    publisher = rsnotify_process(
        "publish",
        source,
        "--redis",
        redis_server.url,
        "--poll",
        "0.05",
        "--websub",
        f"127.0.0.1:{hub_port}",
        "--websub-retry-max",
        "2",
        start=False,
    )
    collections = await start_publisher(publisher)
    ((collection, capability_list),) = collections.items()
    hub = f"http://127.0.0.1:{hub_port}/"
    topic = hub + collection

    # Discovery the WebSub way: the topic answers with Link rel=self and rel=hub,
    # and its content is a Change Notification document (none yet: no <url>).
    before = await asyncio.to_thread(topic_content, topic, hub)
    assert before.findall(SM + "url") == []

    sub = PlainSubscriber(free_port())
    await sub.start()
    try:
        assert await asyncio.to_thread(sub.subscribe, hub, topic) == 202
        await async_wait_for(lambda: subscriptions(hub, collection), 10, interval=0.05)
        (verification,) = sub.verifications
        assert verification["hub.mode"] == "subscribe"
        assert verification["hub.topic"] == topic
        assert verification["hub.lease_seconds"] == "600"

        await asyncio.to_thread(http_json, source + "_simulator/resume", b"")
        await async_wait_for(lambda: len(sub.deliveries) >= CHANGES // 3, 60, interval=0.05)
        await sub.stop()  # the callback is down: connections are refused
        down_at = len(sub.deliveries)
        await asyncio.sleep(DOWN_S)  # scenario duration: the callback stays down 10 s
        await sub.start()
        await async_wait_for(
            lambda: len(sub.deliveries) >= CHANGES or None,
            60,
            interval=0.1,
            message=lambda: f"{len(sub.deliveries)} of {CHANGES} delivered\n{publisher.tail()}",
        )
    finally:
        await sub.stop()

    after = await asyncio.to_thread(topic_content, topic, hub)
    assert after.find(f"{SM}url/{RS}md").get(RSN + "seq") == str(CHANGES), "the latest one"
    seqs = [d.seq for d in sub.deliveries]
    assert seqs == list(range(1, CHANGES + 1)), "not every seq exactly once, in order"
    assert down_at < CHANGES - 100, "the callback was not down while changes were made"
    assert all(d.signature_ok for d in sub.deliveries), "a delivery was not signed right"
    assert all(d.links == f'<{topic}>; rel="self", <{hub}>; rel="hub"' for d in sub.deliveries)
    assert not sub.other_posts and not sub.denials
    entries = await asyncio.to_thread(change_list_entries, capability_list)
    assert len(entries) == CHANGES
    for delivery, entry in zip(sub.deliveries, entries, strict=True):
        assert entry.change is not None and entry.change_time is not None
        assert (delivery.loc, delivery.change) == (entry.loc, entry.change.value)
        assert w3cdt.parse(delivery.datetime) == entry.change_time
