"""Issue 16 item 6: ``rsnotify subscribe`` follows a Source and a hub that know nothing of it.

Both are written below from the texts alone (ResourceSync Z39.99 and Change
Notification 1.0.1 sections 3 to 5, W3C WebSub), with aiohttp and string
XML -- nothing on that side imports rsnotify:

* the Source serves a Source Description at the well-known URI, a Capability
  List that advertises its channel as section 5 and Example 7 show (topic in
  ``<loc>``, ``rs:ln rel="hub"``, ``capability="change-notification"``), a
  Resource List, one Change List and the resources, and its topic answers
  GET/HEAD with 200, ``application/xml``, ``Link`` self and hub and
  ``Content-Length: 0`` (section 4.1);
* after every three changes it POSTs one Change Notification to the hub
  (section 4.1): three ``<url>``, ``from`` = the previous ``until``, no
  rsnotify attributes at all;
* the hub verifies intent (WebSub 5.3), signs deliveries with sha256 and
  relays each notification (section 4.3) -- except one, dropped on purpose.

``rsnotify subscribe`` runs as a real process, once told ``--via websub``
and once finding the channel by discovery alone.  It must notice the
dropped notification from the interval chain (the next ``from`` is later
than the last ``until`` it got), catch up from the Change List, and end
with a mirror equal to the Source.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.devstack import ManagedProcess, async_wait_for, free_port
from tests.groundtruth import mirror_differences
from tests.helpers import messages, serve

RunRsnotify = Callable[..., ManagedProcess]
NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"'
# An hour ago, whole seconds: changes dated in the future are refused (subscriber.trust).
START = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
NOTIFICATIONS = 6
PER_NOTIFICATION = 3
DROPPED = 3  # the hub drops this notification (1-based)


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


# --- a Source written from Z39.99 and Change Notification 1.0.1 --------------------------


@dataclass
class SpecSource:
    port: int = field(default_factory=free_port)
    hub: str = ""
    resources: dict[str, bytes] = field(default_factory=dict)
    changes: list[tuple[str, str, datetime, bytes | None]] = field(default_factory=list)
    clock: datetime = START
    runner: web.AppRunner | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def capability_list(self) -> str:
        return self.base + "dataset1/capabilitylist.xml"

    @property
    def topic(self) -> str:
        return self.base + "dataset1/change/"

    def loc(self, name: str) -> str:
        return f"{self.base}dataset1/res/{name}"

    def tick(self) -> datetime:
        self.clock += timedelta(seconds=1)
        return self.clock

    def fixity(self, body: bytes) -> str:
        return f'hash="md5:{hashlib.md5(body).hexdigest()}" length="{len(body)}"'

    async def start(self) -> None:
        for i in range(5):
            self.resources[f"r{i}"] = f"resource {i} v0\n".encode()
        routes = [
            web.get("/.well-known/resourcesync", self.description),
            web.get("/dataset1/capabilitylist.xml", self.capabilities),
            web.get("/dataset1/resourcelist.xml", self.resource_list),
            web.get("/dataset1/changelist.xml", self.change_list),
            web.get("/dataset1/res/{name}", self.resource),
            web.get("/dataset1/change/", self.topic_answer),
        ]
        self.runner = await serve(self.port, routes)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    @staticmethod
    def xml(text: str) -> web.Response:
        return web.Response(text=text, content_type="application/xml")

    async def description(self, request: web.Request) -> web.Response:
        return self.xml(
            f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {NS}>'
            '<rs:md capability="description"/>'
            f'<url><loc>{self.capability_list}</loc><rs:md capability="capabilitylist"/></url>'
            "</urlset>"
        )

    async def capabilities(self, request: web.Request) -> web.Response:
        # Example 7 of Change Notification 1.0.1, for this Source.
        return self.xml(
            f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {NS}>'
            f'<rs:ln rel="up" href="{self.base}.well-known/resourcesync"/>'
            '<rs:md capability="capabilitylist"/>'
            f"<url><loc>{self.base}dataset1/resourcelist.xml</loc>"
            '<rs:md capability="resourcelist"/></url>'
            f"<url><loc>{self.base}dataset1/changelist.xml</loc>"
            '<rs:md capability="changelist"/></url>'
            f'<url><loc>{self.topic}</loc><rs:ln rel="hub" href="{self.hub}"/>'
            '<rs:md capability="change-notification"/></url>'
            "</urlset>"
        )

    async def resource_list(self, request: web.Request) -> web.Response:
        urls = "".join(
            f"<url><loc>{self.loc(name)}</loc><lastmod>{stamp(START)}</lastmod>"
            f"<rs:md {self.fixity(body)}/></url>"
            for name, body in sorted(self.resources.items())
            if name.startswith("r") and body == f"resource {name[1:]} v0\n".encode()
        )
        return self.xml(
            f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {NS}>'
            f'<rs:ln rel="up" href="{self.capability_list}"/>'
            f'<rs:md capability="resourcelist" at="{stamp(START)}" completed="{stamp(START)}"/>'
            f"{urls}</urlset>"
        )

    def url_element(self, loc: str, change: str, when: datetime, body: bytes | None) -> str:
        fixity = f" {self.fixity(body)}" if body is not None else ""
        return (
            f"<url><loc>{loc}</loc><lastmod>{stamp(when)}</lastmod>"
            f'<rs:md change="{change}" datetime="{stamp(when)}"{fixity}/></url>'
        )

    async def change_list(self, request: web.Request) -> web.Response:
        urls = "".join(self.url_element(*c) for c in self.changes)
        return self.xml(
            f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {NS}>'
            f'<rs:ln rel="up" href="{self.capability_list}"/>'
            f'<rs:md capability="changelist" from="{stamp(START)}"/>{urls}</urlset>'
        )

    async def resource(self, request: web.Request) -> web.Response:
        body = self.resources.get(request.match_info["name"])
        if body is None:
            raise web.HTTPNotFound()
        return web.Response(body=body, content_type="text/plain")

    async def topic_answer(self, request: web.Request) -> web.Response:
        # Section 4.1: 200, application/xml, Link self and hub; no content: Content-Length 0.
        headers = {"Link": f'<{self.topic}>; rel="self", <{self.hub}>; rel="hub"'}
        response = web.Response(body=b"", headers=headers, content_type="application/xml")
        return response

    def change(self, n: int) -> tuple[str, str, datetime, bytes | None]:
        """One change: create, update or delete, written to the Change List at once."""
        when = self.tick()
        kind = ("created", "updated", "deleted")[n % 3]
        if kind == "created":
            name = f"new{n}"
            body: bytes | None = f"created {n}\n".encode()
        else:
            name = sorted(self.resources)[n % len(self.resources)]
            body = f"{name} updated at {n}\n".encode() if kind == "updated" else None
        if body is None:
            del self.resources[name]
        else:
            self.resources[name] = body
        entry = (self.loc(name), kind, when, body)
        self.changes.append(entry)
        return entry

    def notification(
        self, changes: list[tuple[str, str, datetime, bytes | None]], start: datetime
    ) -> bytes:
        # Section 3 and Example 1: changes in forward chronological order, from and until.
        urls = "".join(self.url_element(*c) for c in changes)
        return (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {NS}>'
            f'<rs:ln rel="up" href="{self.capability_list}"/>'
            f'<rs:md capability="change-notification" from="{stamp(start)}" '
            f'until="{stamp(changes[-1][2])}"/>{urls}</urlset>'
        ).encode()

    def state(self) -> dict[str, object]:
        """What the mirror must hold (the shape tests.groundtruth.mirror_differences reads)."""
        return {
            "collections": {
                self.capability_list: {
                    "resources": {
                        self.loc(name): hashlib.sha256(body).hexdigest()
                        for name, body in self.resources.items()
                    }
                }
            }
        }


# --- a hub written from W3C WebSub and Change Notification 4.1-4.3 -----------------------


@dataclass
class SpecHub:
    port: int = field(default_factory=free_port)
    subscribers: dict[str, dict[str, bytes | None]] = field(default_factory=dict)
    received: int = 0
    delivered: int = 0
    drop: set[int] = field(default_factory=set)
    runner: web.AppRunner | None = None
    http: aiohttp.ClientSession | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/websub/"

    async def start(self) -> None:
        self.http = aiohttp.ClientSession()
        self.runner = await serve(self.port, [web.post("/websub/", self.endpoint)])

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.runner is not None:
            await self.runner.cleanup()
        if self.http is not None:
            await self.http.close()

    async def endpoint(self, request: web.Request) -> web.Response:
        if request.content_type == "application/xml":  # 4.1: a Source submits a notification
            links = request.headers.get("Link", "")
            if 'rel="self"' not in links or 'rel="hub"' not in links:
                return web.Response(status=400)
            topic = links.split(">", 1)[0].lstrip("<").strip()
            self.received += 1
            if self.received not in self.drop:
                await self.distribute(topic, await request.read(), links)
            return web.Response(status=200)
        form = await request.post()
        mode, topic, callback = (
            form.get("hub.mode"),
            form.get("hub.topic"),
            form.get("hub.callback"),
        )
        if mode not in ("subscribe", "unsubscribe") or not topic or not callback:
            return web.Response(status=400)
        secret = form.get("hub.secret")
        task = asyncio.create_task(
            self.verify(str(mode), str(topic), str(callback), str(secret) if secret else None)
        )
        self.tasks.add(task)
        return web.Response(status=202)

    async def verify(self, mode: str, topic: str, callback: str, secret: str | None) -> None:
        assert self.http is not None
        challenge = secrets.token_hex(16)
        query = {"hub.mode": mode, "hub.topic": topic, "hub.challenge": challenge}
        query["hub.lease_seconds"] = "3600"
        async with self.http.get(callback, params=query) as response:
            if response.status // 100 != 2 or await response.text() != challenge:
                return
        subs = self.subscribers.setdefault(topic, {})
        if mode == "subscribe":
            subs[callback] = secret.encode() if secret else None
        else:
            subs.pop(callback, None)

    async def distribute(self, topic: str, body: bytes, links: str) -> None:
        assert self.http is not None
        for callback, secret in self.subscribers.get(topic, {}).items():
            headers = {"Content-Type": "application/xml", "Link": links}
            if secret is not None:
                digest = hmac.new(secret, body, hashlib.sha256).hexdigest()
                headers["X-Hub-Signature"] = f"sha256={digest}"
            async with self.http.post(callback, data=body, headers=headers) as response:
                if response.status // 100 == 2:
                    self.delivered += 1


# --- the test ------------------------------------------------------------------------------


@pytest.mark.parametrize("via", ["websub", "discovery"])
async def test_rsnotify_follows_a_spec_only_source_and_hub_and_sees_a_dropped_notification(
    rsnotify_process: RunRsnotify, tmp_path: Path, via: str
) -> None:
    hub = SpecHub(drop={DROPPED})
    source = SpecSource(hub=hub.url)
    await hub.start()
    await source.start()
    mirror = tmp_path / "mirror"
    callback_port = free_port()
    options = ["--via", "websub"] if via == "websub" else []
    subscriber = rsnotify_process(
        "subscribe", source.base, "--into", str(mirror), *options,
        "--callback", f"http://127.0.0.1:{callback_port}/cb", "--log-format", "json",
        name="subscribe",
    )  # fmt: skip
    try:
        await async_wait_for(
            lambda: source.topic in hub.subscribers and ": live" in subscriber.output("stdout"),
            30,
            message=lambda: f"not subscribed and live\n{subscriber.tail()}",
        )
        start = START
        for number in range(1, NOTIFICATIONS + 1):
            changes = [source.change(number * 10 + i) for i in range(PER_NOTIFICATION)]
            payload = source.notification(changes, start)
            start = changes[-1][2]
            assert hub.http is not None
            headers = {
                "Content-Type": "application/xml",
                "Link": f'<{source.topic}>; rel="self", <{hub.url}>; rel="hub", '
                f'<{source.capability_list}>; rel="resourcesync"',
            }
            async with hub.http.post(hub.url, data=payload, headers=headers) as response:
                assert response.status == 200  # section 4.1
        last: list[str] = []

        def equal() -> bool:
            last[:] = mirror_differences(source.state(), mirror)
            return not last

        await async_wait_for(
            equal, 30, interval=0.2, message=lambda: f"{last[:5]}\n{subscriber.tail()}"
        )
    finally:
        await source.stop()
        await hub.stop()
    assert hub.delivered == NOTIFICATIONS - 1, "one notification was dropped on purpose"
    broken = messages(subscriber, "interval chain broken")
    assert broken, "the dropped notification was not noticed from the interval chain"
