"""Acceptance of ``rsnotify publish --websub`` with a WebSub subscriber written here (issue 16).

``rsnotify simulate`` is the Source; two ``rsnotify publish --websub --ha``
processes on one Redis elect the one that runs the hub (the other waits with
the same ``--websub`` address).  The subscriber is a plain aiohttp callback in
this file that speaks WebSub and reads Change Notification 1.0.1 the way any
other implementation would -- with lxml, never with :mod:`rsnotify.envelope`:
it subscribes with a form POST, echoes ``hub.challenge`` and checks every
delivery:

* ``Content-Type: application/xml`` and ``Link: <topic>; rel="self", <hub>;
  rel="hub"`` (section 4.3);
* ``X-Hub-Signature``: sha256 HMAC of the body with its ``hub.secret``;
* a ``<urlset>`` whose root ``rs:md`` has ``capability="change-notification"``
  and ``from``/``until``, its changes in forward chronological order inside
  the interval (section 3);
* the intervals chain: each ``from`` is the previous ``until``.  A hub that
  crashed may deliver again what it delivered just before (WebSub delivery
  is at least once): such a notification starts at or before the last
  ``until``, never after it, and holds only changes already received.

Faults, while changes are made: the leader is killed with ``kill -9`` (the
other publisher is elected, serves the same hub address and delivers from
the stored cursors), the killed one comes back, the new leader is stopped
(a leader change the graceful way) and the callback is down for 3 s.  In the
end every change of the Change Lists arrived exactly once in order (after
dropping the redelivered ones), and the interval chain had no hole.
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
from datetime import datetime
from typing import Any

import redis
from aiohttp import web
from lxml import etree

from rsnotify import sitemap, w3cdt
from rsnotify.model import Capability, CapabilityList, ChangeListIndex, Entry
from tests.devstack import ManagedProcess, Redis, async_wait_for, free_port
from tests.helpers import serve

RunRsnotify = Callable[..., ManagedProcess]
SM = "{http://www.sitemaps.org/schemas/sitemap/0.9}"
RS = "{http://www.openarchives.org/rs/terms/}"
CHANGES = 2_000
RATE = "250"
SECRET = "a-websub-secret"
GROUP = "websub-ha"


# --- the Source and the publishers (real processes) ------------------------------------


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


def leader_pid(r: redis.Redis) -> int | None:
    value = r.get(f"rsn:leader:{GROUP}")
    return None if value is None else int(value.decode().split(":")[-2])


# --- a WebSub subscriber written the plain way -----------------------------------------


@dataclass
class Notice:
    """One delivery, read with lxml."""

    start: datetime
    end: datetime
    changes: list[tuple[str, str, datetime]]  # (loc, change, datetime)


@dataclass
class PlainSubscriber:
    """An aiohttp callback that does WebSub and Change Notification by the book."""

    port: int
    topic: str
    hub: str
    capability_list: str
    secret: str = SECRET
    verifications: list[dict[str, str]] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    runner: web.AppRunner | None = None

    @property
    def callback(self) -> str:
        return f"http://127.0.0.1:{self.port}/inbox?who=plain&x=%2F"

    async def start(self) -> None:
        routes = [web.get("/inbox", self.verify), web.post("/inbox", self.receive)]
        self.runner = await serve(self.port, routes)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def verify(self, request: web.Request) -> web.Response:
        raw = request.rel_url.raw_query_string
        if raw.split("&hub.")[0] != "who=plain&x=%2F":
            self.problems.append(f"callback query not preserved (WebSub 5.3): {raw}")
        self.verifications.append(dict(request.query))
        return web.Response(text=request.query["hub.challenge"])

    def _problem(self, what: str) -> web.Response:
        self.problems.append(what)
        return web.Response(status=204)  # acknowledged, then ignored (WebSub 7)

    def refused(self, request: web.Request, body: bytes) -> web.Response | None:
        """The answer to a delivery that is not signed with our secret or not XML, else None."""
        expected = "sha256=" + hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(request.headers.get("X-Hub-Signature", ""), expected):
            return self._problem("bad or missing X-Hub-Signature")
        if request.headers.get("Content-Type") != "application/xml":
            return self._problem(f"Content-Type {request.headers.get('Content-Type')}")
        return None

    async def receive(self, request: web.Request) -> web.Response:
        body = await request.read()
        refused = self.refused(request, body)
        if refused is not None:
            return refused
        link = (
            f'<{self.topic}>; rel="self", <{self.hub}>; rel="hub", '
            f'<{self.capability_list}>; rel="resourcesync"'
        )
        if request.headers.get("Link") != link:
            return self._problem(f"Link {request.headers.get('Link')}")
        root = etree.fromstring(body, etree.XMLParser(resolve_entities=False, no_network=True))
        md = root.find(RS + "md")
        if root.tag != SM + "urlset" or md is None or md.get("capability") != "change-notification":
            return self._problem("not a change-notification <urlset>")
        start, end = w3cdt.parse(md.get("from")), w3cdt.parse(md.get("until"))
        changes = []
        for url in root.findall(SM + "url"):
            umd = url.find(RS + "md")
            when = w3cdt.parse(umd.get("datetime") or url.findtext(SM + "lastmod"))
            changes.append((url.findtext(SM + "loc"), umd.get("change"), when))
        times = [when for _, _, when in changes]
        if not changes or times != sorted(times) or not start <= times[0] or times[-1] > end:
            return self._problem(f"changes out of order or outside [{start}, {end}]")
        self.notices.append(Notice(start, end, changes))
        return web.Response(status=204)

    def subscribe(self) -> int:
        form = urllib.parse.urlencode(
            {
                "hub.mode": "subscribe",
                "hub.topic": self.topic,
                "hub.callback": self.callback,
                "hub.lease_seconds": "600",
                "hub.secret": self.secret,
            }
        ).encode()
        request = urllib.request.Request(self.hub, data=form, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            status: int = response.status
            return status

    def received(self) -> int:
        return sum(len(n.changes) for n in self.notices)

    def chain(self) -> tuple[list[tuple[str, str, datetime]], int, list[str]]:
        """(every change once, in order; changes received again; holes in the chain)."""
        seen: set[tuple[str, str, datetime]] = set()
        ordered: list[tuple[str, str, datetime]] = []
        repeated = 0
        holes = []
        last: datetime | None = None
        for notice in self.notices:
            if last is not None and notice.start > last:
                holes.append(f"from {notice.start} after until {last}")
            for change in notice.changes:
                if change in seen:
                    repeated += 1
                    continue
                if last is not None and notice.start < last and change[2] <= last:
                    holes.append(f"a redelivery brought a new change {change}")
                seen.add(change)
                ordered.append(change)
            last = notice.end if last is None else max(last, notice.end)
        return ordered, repeated, holes


# --- the test ------------------------------------------------------------------------------


async def test_a_plain_subscriber_gets_every_change_once_in_a_chain_through_failovers(
    rsnotify_process: RunRsnotify, redis_server: Redis
) -> None:
    source = await start_simulator(
        rsnotify_process, "--collections", "1", "--rate", RATE, "--max-changes", str(CHANGES)
    )
    hub_port = free_port()
    hub = f"http://127.0.0.1:{hub_port}/"

    def publisher(name: str) -> ManagedProcess:
        return rsnotify_process(
            "publish", source, "--redis", redis_server.url, "--poll", "0.05",
            "--ha", "--ha-group", GROUP, "--lease-ttl", "1",
            "--websub", f"127.0.0.1:{hub_port}", "--websub-retry-max", "0.5",
            "--websub-allow-callback", "127.0.0.1/32", "--secret", "publisher-secret",
            name=name, start=False,
        )  # fmt: skip

    publishers = {"a": publisher("pub-a"), "b": publisher("pub-b")}
    collections = await start_publisher(publishers["a"])
    await start_publisher(publishers["b"])
    ((collection, capability_list),) = collections.items()
    topic = hub + collection
    r = redis.Redis.from_url(redis_server.url)

    def leader() -> str | None:
        pid = leader_pid(r)
        return next((k for k, p in publishers.items() if p.running and p.pid == pid), None)

    def serving() -> bool:
        try:
            http_bytes(hub)
            return True
        except OSError:
            return False

    await async_wait_for(lambda: leader() and serving(), 20, message="no leader serving WebSub")
    sub = PlainSubscriber(free_port(), topic, hub, capability_list)
    await sub.start()
    events: list[tuple[str, int]] = []

    async def at(changes: int, what: str) -> None:
        """Wait until the Source made ``changes`` changes, then note what happens now."""

        def made() -> bool:
            return bool(http_json(source + "_simulator/stats")["changes"] >= changes)

        await async_wait_for(lambda: asyncio.to_thread(made), 60, interval=0.02)
        events.append((what, sub.received()))

    try:
        assert await asyncio.to_thread(sub.subscribe) == 202
        await async_wait_for(lambda: sub.verifications, 10)
        (verification,) = sub.verifications
        assert (verification["hub.mode"], verification["hub.topic"]) == ("subscribe", topic)
        assert int(verification["hub.lease_seconds"]) == 600
        await asyncio.to_thread(http_json, source + "_simulator/resume", b"")

        await at(300, "kill -9 the leader")
        first = leader()
        assert first is not None
        publishers[first].kill()
        await async_wait_for(lambda: leader() not in (None, first) and serving(), 20)
        await at(700, "restart the killed one")
        await start_publisher(publishers[first])
        await at(1000, "stop the leader (graceful leader change)")
        second = leader()
        assert second is not None and second != first
        publishers[second].terminate()
        await async_wait_for(lambda: leader() == first and serving(), 20)
        await at(1400, "callback down 3 s")
        await sub.stop()
        await asyncio.sleep(3.0)  # scenario duration: the callback is unreachable for 3 s
        await sub.start()
        await async_wait_for(
            lambda: len(sub.chain()[0]) >= CHANGES or None,
            60,
            interval=0.1,
            message=lambda: f"{sub.received()} of {CHANGES} received; events {events}",
        )
        await asyncio.to_thread(publishers[second].start)
    finally:
        await sub.stop()
        r.close()

    assert not sub.problems, sub.problems[:5]
    ordered, repeated, holes = sub.chain()
    assert not holes, f"the interval chain has holes: {holes[:5]}"
    entries = await asyncio.to_thread(change_list_entries, capability_list)
    assert len(entries) == CHANGES
    expected = [(e.loc, e.change.value, e.change_time) for e in entries if e.change]
    assert ordered == expected, "not every change exactly once, in order"
    grouped = sum(len(n.changes) > 1 for n in sub.notices)
    print(
        f"\nwebsub: {len(sub.notices)} notifications, {grouped} of several changes, "
        f"{repeated} change(s) redelivered after the failovers; events {events}"
    )
    assert grouped, "the hub never grouped changes (the callback outage should have)"
    assert repeated <= 3 * 100, "a redelivery is at most one batch per failover"
