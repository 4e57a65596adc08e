"""Framework Notification 1.0.1 over WebSub, with real processes (issue 16 item 7).

1. ``rsnotify simulate --hub http://HUB/{id}`` advertises a framework channel
   beside the change channel (section 5, Example 8); ``rsnotify publish
   --websub`` serves it.  A subscriber written here the plain way (WebSub by
   hand, the payload read with lxml, nothing of rsnotify's decoding) finds the
   channel in the Capability List, subscribes, and when the simulator's
   Resource List changes receives framework notifications it checks by the
   text: ``application/xml``, ``Link`` self + hub, a valid ``X-Hub-Signature``,
   a ``<urlset>`` with ``capability="framework-notification"``, ``rs:ln
   rel="up"`` to the Capability List, each ``<url>`` with ``change`` and
   ``capability``; one says ``resourcelist updated`` dated by the new
   Resource List's ``at``, one ``changelist updated`` with ``rs:ln
   rel="index"`` to the Change List Index, and the intervals chain.
2. ``rsnotify subscribe --callback`` follows a directory Source served by
   ``python -m http.server``, subscribed to both topics.  While it is away the
   Source drops its Change List and starts another one later than the
   mirror's position (a hole no walk can fill) and regenerates its Resource
   List.  Back, the Destination catches up with what the Change Lists still
   say, and the framework notification the hub kept for it (``resourcelist
   updated``, newer than its position) is its cue to re-baseline: reported in
   its log and its event table.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from aiohttp import web
from lxml import etree

from rsnotify import sitemap
from rsnotify.model import Capability, ChangeType, Entry, Root, make_document
from tests.devstack import HttpServer, ManagedProcess, async_wait_for, free_port
from tests.helpers import get_json, post_json
from tests.test_websub import PlainSubscriber, http_bytes, start_publisher, start_simulator

RunRsnotify = Callable[..., ManagedProcess]
SM = "{http://www.sitemaps.org/schemas/sitemap/0.9}"
RS = "{http://www.openarchives.org/rs/terms/}"
XML = etree.XMLParser(resolve_entities=False, no_network=True)


def when(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


# --- 1. a plain subscriber at the framework topic --------------------------------------------


@dataclass
class FrameworkNotice:
    start: datetime | None
    end: datetime | None
    up: str | None
    changes: list[tuple[str, str, str, datetime | None, str | None]]  # loc capability change ...


@dataclass
class PlainFrameworkSubscriber(PlainSubscriber):
    """The plain WebSub subscriber of ``test_websub``, reading Framework Notification 1.0.1."""

    framework_notices: list[FrameworkNotice] = field(default_factory=list)

    async def receive(self, request: web.Request) -> web.Response:
        body = await request.read()
        refused = self.refused(request, body)  # X-Hub-Signature and Content-Type, as there
        if refused is not None:
            return refused
        link = request.headers.get("Link", "")
        if f'<{self.topic}>; rel="self"' not in link or f'<{self.hub}>; rel="hub"' not in link:
            return self._problem(f"Link {link} (section 4.3: self and hub)")
        root = etree.fromstring(body, XML)
        md = root.find(RS + "md")
        if root.tag != SM + "urlset" or md is None:
            return self._problem("not a <urlset> with rs:md")
        if md.get("capability") != "framework-notification":
            return self._problem(f"capability {md.get('capability')}")
        up = [ln.get("href") for ln in root.findall(RS + "ln") if ln.get("rel") == "up"]
        changes = []
        for url in root.findall(SM + "url"):
            umd = url.find(RS + "md")
            if umd is None or umd.get("change") not in ("created", "updated", "deleted"):
                return self._problem("a <url> without rs:md change (section 3)")
            if not umd.get("capability"):
                return self._problem("a <url> without rs:md capability (section 3)")
            index = [ln.get("href") for ln in url.findall(RS + "ln") if ln.get("rel") == "index"]
            changes.append(
                (
                    (url.findtext(SM + "loc") or "").strip(),
                    umd.get("capability"),
                    umd.get("change"),
                    when(umd.get("datetime")),
                    index[0] if index else None,
                )
            )
        if not changes:
            return self._problem("a framework notification without <url>")
        start, end = when(md.get("from")), when(md.get("until"))
        self.framework_notices.append(FrameworkNotice(start, end, up[0] if up else None, changes))
        return web.Response(status=204)

    def seen(self, capability: str, change: str) -> list[tuple[str, datetime | None, str | None]]:
        return [
            (loc, dated, index)
            for notice in self.framework_notices
            for loc, cap, kind, dated, index in notice.changes
            if (cap, kind) == (capability, change)
        ]


def framework_channel(capability_list: bytes) -> tuple[str, str, dict[str, str]]:
    """(topic, hub, capability -> URL) from a Capability List (Example 8's entry)."""
    root = etree.fromstring(capability_list, XML)
    found: dict[str, str] = {}
    channel: tuple[str, str] | None = None
    for url in root.findall(SM + "url"):
        capability = url.find(RS + "md").get("capability")
        loc = (url.findtext(SM + "loc") or "").strip()
        if capability == "framework-notification":
            hubs = [ln.get("href") for ln in url.findall(RS + "ln") if ln.get("rel") == "hub"]
            channel = (loc, hubs[0])
        found[capability] = loc
    assert channel is not None, "no framework-notification entry (section 5)"
    return channel[0], channel[1], found


def at_of(resource_list: bytes) -> datetime | None:
    return when(etree.fromstring(resource_list, XML).find(RS + "md").get("at"))


async def test_a_plain_subscriber_is_told_when_the_resource_list_changes(
    rsnotify_process: RunRsnotify, tmp_path: Path
) -> None:
    hub_port = free_port()
    hub = f"http://127.0.0.1:{hub_port}/"
    source = await start_simulator(
        rsnotify_process, "--collections", "1", "--resources", "5", "--hub", hub + "{id}"
    )
    publisher = rsnotify_process(
        "publish", source, "--poll", "0.1", "--websub", f"127.0.0.1:{hub_port}",
        "--websub-allow-callback", "127.0.0.1/32", "--websub-retry-max", "0.5",
        "--framework-interval", "0.2", "--state-dir", tmp_path / "publisher",
        name="publish", start=False,
    )  # fmt: skip
    ((collection, capability_list),) = (await start_publisher(publisher)).items()
    await asyncio.to_thread(publisher.wait_for_line, r"framework: watching", timeout=20)
    topic, advertised_hub, capabilities = framework_channel(
        await asyncio.to_thread(http_bytes, capability_list)
    )
    assert (topic, advertised_hub) == (hub + collection + "/framework", hub)
    sub = PlainFrameworkSubscriber(free_port(), topic, hub, capability_list)
    await sub.start()
    try:
        assert await asyncio.to_thread(sub.subscribe) == 202
        await async_wait_for(lambda: sub.verifications, 10)
        resource_list = capabilities["resourcelist"]
        before = at_of(await asyncio.to_thread(http_bytes, resource_list))
        await asyncio.to_thread(post_json, source + "_simulator/advance?n=5")
        await async_wait_for(
            lambda: sub.seen("resourcelist", "updated") and sub.seen("changelist", "updated"),
            20,
            message=lambda: f"received {sub.framework_notices}, problems {sub.problems}",
        )
        after = at_of(await asyncio.to_thread(http_bytes, resource_list))
    finally:
        await sub.stop()
    assert not sub.problems, sub.problems
    assert before is not None and after is not None and after > before
    assert sub.seen("resourcelist", "updated") == [(resource_list, after, None)]
    ((_, _, index),) = sub.seen("changelist", "updated")
    assert index == capabilities["changelist"]  # the open Change List, under the index
    notices = sub.framework_notices
    assert {n.up for n in notices} == {capability_list}
    for previous, notice in itertools.pairwise(notices):
        assert notice.start == previous.end, "the intervals chain"
    assert all(n.start is not None and n.end is not None and n.start <= n.end for n in notices)


# --- 2. the Destination acts on one ------------------------------------------------------------


class DirectorySource:
    """A Source of static files: Capability List, Resource List, Change List Index and lists."""

    def __init__(self, root: Path, base: str) -> None:
        self.root, self.base = root, base
        self.start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)

    def at(self, minutes: int) -> datetime:
        return self.start + timedelta(minutes=minutes)

    def write(self, name: str, data: bytes) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.tmp")
        temp.write_bytes(data)
        os.replace(temp, path)

    def document(self, name: str, root: Root, capability: str, **fields: object) -> None:
        links = fields.pop("links", [])
        document = make_document(root, capability, **fields)
        document.links = [*links]
        self.write(name, sitemap.serialize(document))

    def resource(self, name: str, body: bytes, **fields: object) -> Entry:
        self.write(f"res/{name}", body)
        digest = hashlib.sha256(body).hexdigest()
        return Entry(
            loc=self.base + f"res/{name}", hash=f"sha-256:{digest}", length=len(body), **fields
        )  # type: ignore[arg-type]

    def resource_list(self, at: datetime, entries: list[Entry]) -> None:
        self.document(
            "resourcelist.xml", Root.URLSET, Capability.RESOURCELIST, at=at, completed=at,
            entries=entries,
        )  # fmt: skip

    def change_lists(self, lists: dict[str, tuple[datetime, list[Entry]]]) -> None:
        for name, (start, entries) in lists.items():
            self.document(name, Root.URLSET, Capability.CHANGELIST, from_=start, entries=entries)
        index = [Entry(loc=self.base + name, from_=start) for name, (start, _) in lists.items()]
        self.document("changelist.xml", Root.SITEMAPINDEX, Capability.CHANGELIST, entries=index)


def mirrored(mirror: Path, name: str) -> bytes | None:
    found = list(mirror.rglob(name))
    return found[0].read_bytes() if found else None


def events_of(state: Path, kind: str) -> list[str]:
    with sqlite3.connect(state / "cursor.sqlite3") as db:
        rows = db.execute("SELECT detail FROM events WHERE kind=? ORDER BY id", (kind,))
        return [row[0] for row in rows]


async def test_the_destination_takes_a_new_resource_list_after_a_long_absence_as_a_cue(
    rsnotify_process: RunRsnotify, tmp_path: Path
) -> None:
    root = tmp_path / "source"
    root.mkdir()
    server = HttpServer(tmp_path / "http", root).start()
    hub_port, callback_port = free_port(), free_port()
    hub = f"http://127.0.0.1:{hub_port}/"
    src = DirectorySource(root, server.url + "/")
    capability_list = src.base + "capabilitylist.xml"
    src.write(
        ".well-known/resourcesync",
        sitemap.serialize(
            make_document(
                Root.URLSET,
                Capability.DESCRIPTION,
                entries=[Entry(loc=capability_list, capability=Capability.CAPABILITYLIST)],
            )
        ),
    )
    src.document(
        "capabilitylist.xml", Root.URLSET, Capability.CAPABILITYLIST,
        entries=[
            Entry(loc=src.base + "resourcelist.xml", capability=Capability.RESOURCELIST),
            Entry(loc=src.base + "changelist.xml", capability=Capability.CHANGELIST),
        ],
    )  # fmt: skip
    a = src.resource("a.txt", b"a, version 1\n", lastmod=src.at(1))
    b = src.resource("b.txt", b"b\n", lastmod=src.at(0))
    src.resource_list(src.at(0), [a, b])
    updated_a = replace(a, change=ChangeType.UPDATED, datetime=src.at(1))
    src.change_lists({"cl1.xml": (src.at(0), [updated_a])})
    publisher = rsnotify_process(
        "publish", root, "--poll", "0.1", "--websub", f"127.0.0.1:{hub_port}", "--write-hubs",
        "--websub-allow-callback", "127.0.0.1/32", "--websub-retry-max", "0.5",
        "--framework-interval", "0.2", "--state-dir", tmp_path / "publisher",
        name="publish", start=False,
    )  # fmt: skip
    mirror = tmp_path / "mirror"

    def destination() -> ManagedProcess:
        return rsnotify_process(
            "subscribe", capability_list, "--into", mirror,
            "--callback", f"http://127.0.0.1:{callback_port}/cb",
            "--heartbeat-timeout", "30", "--log-format", "text",
            name="subscribe", start=False,
        )  # fmt: skip

    try:
        ((collection, _),) = (await start_publisher(publisher)).items()
        await asyncio.to_thread(publisher.wait_for_line, r"framework: watching", timeout=20)
        first = destination().start()
        await asyncio.to_thread(first.wait_for_line, r": live", timeout=30, stream="stdout")
        topics = await asyncio.to_thread(get_json, hub)

        def subscribed() -> bool:
            listing = get_json(hub)["topics"][collection]
            return bool(listing["subscriptions"] == 1 and listing["framework_subscriptions"] == 1)

        await async_wait_for(lambda: asyncio.to_thread(subscribed), 20, message=lambda: topics)
        assert mirrored(mirror, "b.txt") == b"b\n"
        first.terminate()

        # Away: the Source drops cl1, starts cl2 after the mirror's position, regenerates.
        c = src.resource("c.txt", b"c\n", lastmod=src.at(6))
        created_c = replace(c, change=ChangeType.CREATED, datetime=src.at(6))
        src.change_lists({"cl2.xml": (src.at(5), [created_c])})
        (root / "cl1.xml").unlink()
        src.resource_list(src.at(7), [a, b, c])
        await asyncio.to_thread(
            publisher.wait_for_line,
            r"framework notification \d+: resourcelist updated: \S+ at ",
            timeout=20,
        )

        second = destination().start()
        state = tmp_path / ".mirror.rsnotify"
        # The hole is seen both ways: by the walk at start-up (the Change Lists
        # start after the position) and by the framework notification the hub kept.
        await async_wait_for(lambda: events_of(state, "re-baseline"), 30, message=second.tail)
        (rebaseline, *_) = events_of(state, "re-baseline")
        assert "the Change Lists start at" in rebaseline

        # The hub delivers the kept notifications one by one: wait for both kinds.
        def both_seen() -> bool:
            seen = events_of(state, "framework")
            return any(e.startswith("resourcelist updated") for e in seen) and any(
                e.startswith("changelist created") for e in seen
            )

        await async_wait_for(
            both_seen, 30, message=lambda: f"{events_of(state, 'framework')}\n{second.tail()}"
        )
        # It caught up with what the Change Lists still say meanwhile.
        assert mirrored(mirror, "c.txt") == b"c\n"
        second.terminate()
    finally:
        server.stop()
