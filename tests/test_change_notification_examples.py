"""ResourceSync Change Notification 1.0.1, Examples 1, 2, 5, 6 and 7, both ways.

Each example of the specification is kept below as printed (Example 1's
payload whole; the HTTP examples' headers, with Example 1 as the body the
text elides).  Every test reads the example with rsnotify and produces the
same thing with rsnotify, then parses both with lxml into what they *mean*
-- elements, attributes in the ResourceSync namespaces, datetimes as
instants, Link relations as sets -- and compares.  rsnotify's own extension
attributes (``urn:x-rsnotify:notification:1``) are outside that meaning by
design: the schema allows ``##other`` attributes and a standard reader
ignores them.

Source: http://www.openarchives.org/rs/notification/1.0.1/notification
(CC BY-SA 4.0), ``shared/reference/resourcesync-change-notification-1.0.1.txt``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from lxml import etree

from rsnotify import envelope, w3cdt
from rsnotify.discovery import CapabilityListInfo, websub_channels
from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.simulator.source import Layout, Source
from rsnotify.sitemap import parse, serialize
from rsnotify.subscriber.websub import CallbackServer, WebSubChannel, websub_target
from rsnotify.tracker import Snapshots
from rsnotify.transport import websubproto as proto
from rsnotify.transport.websub import WebSubHub
from rsnotify.transport.websubpush import HubPusher
from rsnotify.transport.websubstore import MemoryStore
from tests.devstack import async_wait_for, free_port
from tests.helpers import serve

SM = "http://www.sitemaps.org/schemas/sitemap/0.9"
RS = "http://www.openarchives.org/rs/terms/"

EXAMPLE_1 = b"""<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"
        xmlns:rs="http://www.openarchives.org/rs/terms/">
  <rs:ln rel="up"
         href="http://example.com/dataset1/capabilitylist.xml"/>
  <rs:md capability="change-notification"
         from="2013-01-03T00:00:00Z"
         until="2013-01-03T00:10:00Z"/>
  <url>
      <loc>http://example.com/res1</loc>
      <lastmod>2013-01-01T13:03:00Z</lastmod>
      <rs:md change="created"
             datetime="2013-01-03T00:07:22Z"
             hash="md5:1584abdf8ebdc9802ac0c6a7402c03b6"
             length="8876"
             type="application/pdf"/>
   </url>
   <url>
      <loc>http://example.com/res2</loc>
      <rs:md change="updated"
             datetime="2013-01-03T00:08:52Z"
             hash="md5:1e0d5cb8ef6ba40c99b14c0237be735e
             sha-256:854f61290e2e197a11bc91063afce22e43f8ccc655237050ace766adc68dc784"
             length="14599"
             type="text/html"/>
   </url>
</urlset>
"""

EXAMPLE_2_HEADERS = {
    "Content-Type": "application/xml",
    "Link": '<http://example.com/dataset1/change/> ; rel="self",\n'
    ' <http://hub.example.org/websub/> ; rel="hub",\n'
    ' <http://www.example.com/dataset1/capabilitylist.xml> ; rel="resourcesync"',
}
EXAMPLE_4_QUERY = {
    "hub.mode": "subscribe",
    "hub.topic": "http://Aexample.com/dataset1/change/",
    "hub.challenge": "c0cc4630-5116-11e3-8f96-0800200c9a66",
    "hub.lease_seconds": "2400",
}
EXAMPLE_5 = {
    "status": 200,
    "Content-Type": "text/plain; charset=UTF-8",
    "body": b"c0cc4630-5116-11e3-8f96-0800200c9a66",
}
EXAMPLE_6_HEADERS = EXAMPLE_2_HEADERS  # the hub relays with the same headers
EXAMPLE_7 = b"""<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"
        xmlns:rs="http://www.openarchives.org/rs/terms/">
   <rs:ln rel="describedby"
          href="http://example.com/info_about_set1_of_resources.xml"/>
   <rs:ln rel="up"
          href="http://example.com/source_description.xml"/>
   <rs:md capability="capabilitylist"/>
   <url>
       <loc>http://example.com/dataset1/resourcelist.xml</loc>
       <rs:md capability="resourcelist"/>
   </url>
   <url>
       <loc>http://example.com/dataset1/resourcedump.xml</loc>
       <rs:md capability="resourcedump"/>
   </url>
   <url>
       <loc>http://example.com/dataset1/changelist.xml</loc>
       <rs:md capability="changelist"/>
   </url>
   <url>
       <loc>http://example.com/dataset1/changedump.xml</loc>
       <rs:md capability="changedump"/>
   </url>
   <url>
      <loc>http://example.com/dataset1/change/</loc>
      <rs:ln rel="hub" href="http://hub.example.org/websub/"/>
      <rs:md capability="change-notification"/>
   </url>
</urlset>
"""
TOPIC = "http://example.com/dataset1/change/"
HUB = "http://hub.example.org/websub/"
CAPABILITY_LIST = "http://example.com/dataset1/capabilitylist.xml"
TIMES = ("from", "until", "datetime", "at", "completed")


# --- meaning -----------------------------------------------------------------------------


def _attributes(element: Any, *, change: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in element.attrib.items():
        if name.startswith("{"):
            continue  # another namespace: an extension, outside the standard's meaning
        if name in TIMES:
            out[name] = w3cdt.parse(value)
        elif name == "hash":
            out[name] = frozenset(value.split())
        else:
            out[name] = value.strip()
    return out


def meaning(document: bytes) -> dict[str, Any]:
    """What a Change Notification or Capability List says, as comparable values."""
    root = etree.fromstring(document, etree.XMLParser(resolve_entities=False, no_network=True))
    md = root.find(f"{{{RS}}}md")
    entries = []
    for url in root.findall(f"{{{SM}}}url"):
        umd = url.find(f"{{{RS}}}md")
        attrs = _attributes(umd, change=True) if umd is not None else {}
        lastmod = url.findtext(f"{{{SM}}}lastmod")
        # A change's lastmod defaults to its datetime (core spec section 7):
        # writing it out, or leaving it out, says the same.
        moment = w3cdt.parse(lastmod) if lastmod else attrs.get("datetime")
        entries.append(
            {
                "loc": url.findtext(f"{{{SM}}}loc").strip(),
                "lastmod": moment,
                "md": attrs,
                "ln": sorted((ln.get("rel"), ln.get("href")) for ln in url.findall(f"{{{RS}}}ln")),
            }
        )
    return {
        "root": root.tag,
        "md": _attributes(md, change=False),
        "ln": sorted((ln.get("rel"), ln.get("href")) for ln in root.findall(f"{{{RS}}}ln")),
        "urls": entries,
    }


def links(header: str) -> dict[str, set[str]]:
    return {rel: set(hrefs) for rel, hrefs in proto.link_targets(header).items()}


def _records(batch: envelope.ChangeNotification, collection: str) -> list[bytes]:
    """Example 1's changes as the publisher logs them (the first starts at ``from``)."""
    out = []
    previous: datetime | None = batch.from_
    for seq, n in enumerate(batch.changes, start=1):
        n.collection, n.seq, n.since, n.published = collection, seq, previous, None
        n.changelist = "http://example.com/dataset1/changelist.xml"
        out.append(envelope.to_json(n))
        previous = n.datetime
    return out


class Capture:
    """An HTTP endpoint that records what is POSTed to it (and echoes challenges)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.posts: list[tuple[dict[str, str], bytes]] = []
        self.runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/capture"

    async def start(self) -> None:
        routes = [web.post("/capture", self._post), web.get("/capture", self._get)]
        self.runner = await serve(self.port, routes)

    async def _post(self, request: web.Request) -> web.Response:
        self.posts.append((dict(request.headers), await request.read()))
        return web.Response(status=200)

    async def _get(self, request: web.Request) -> web.Response:
        return web.Response(text=request.query.get("hub.challenge", ""))


@pytest.fixture
async def capture() -> AsyncIterator[Capture]:
    endpoint = Capture()
    await endpoint.start()
    try:
        yield endpoint
    finally:
        assert endpoint.runner is not None
        await endpoint.runner.cleanup()


# --- Example 1: the payload --------------------------------------------------------------


def test_example_1_is_read_and_produced_with_the_same_meaning() -> None:
    batch = envelope.decode_batch(EXAMPLE_1, collection="example.com-dataset1-capabilitylist")
    assert batch.capability == "change-notification" and not batch.sequenced
    assert (batch.from_, batch.until) == (
        w3cdt.parse("2013-01-03T00:00:00Z"),
        w3cdt.parse("2013-01-03T00:10:00Z"),
    )
    assert [(n.loc, n.change.value, n.length) for n in batch.changes] == [
        ("http://example.com/res1", "created", 8876),
        ("http://example.com/res2", "updated", 14599),
    ]
    assert batch.changes[1].hashes().keys() == {"md5", "sha-256"}
    assert batch.changes[0].lastmod == w3cdt.parse("2013-01-01T13:03:00Z")
    produced = envelope.compose(
        [envelope.url_fragment(n) for n in batch.changes],
        capabilitylist=CAPABILITY_LIST,
        from_=batch.from_,
        until=batch.until,
    )
    assert meaning(produced) == meaning(EXAMPLE_1)
    # Produced as a batch from the log, the interval ends at the last change (see the README).
    by_log = envelope.to_xml_batch(batch.changes)
    expected = meaning(EXAMPLE_1)
    expected["md"]["until"] = batch.changes[-1].datetime
    assert meaning(by_log) == expected


def test_example_1_derived_from_snapshots_keeps_its_standard_meaning() -> None:
    """Changes marked as derived from Resource List snapshots (issue 23) are still Example 1.

    The mark is three attributes in rsnotify's namespace on each change's
    ``rs:md`` (``##other``, which the schema allows); a standard reader sees
    the same payload, rsnotify's reads the mark back.
    """
    batch = envelope.decode_batch(EXAMPLE_1, collection="example.com-dataset1-capabilitylist")
    snapshots = Snapshots("http://example.com/dataset1/resourcelist.xml", batch.from_, batch.until)
    for n in batch.changes:
        n.derived = snapshots
    produced = envelope.compose(
        [envelope.url_fragment(n) for n in batch.changes],
        capabilitylist=CAPABILITY_LIST,
        from_=batch.from_,
        until=batch.until,
    )
    assert meaning(produced) == meaning(EXAMPLE_1)
    root = etree.fromstring(produced)
    for md in root.findall(f"{{{SM}}}url/{{{RS}}}md"):
        extension = {k for k in md.attrib if k.startswith(f"{{{envelope.RSNOTIFY_NS}}}")}
        assert {k.split("}")[1] for k in extension} == {
            "derived-resourcelist",
            "derived-from",
            "derived-until",
        }
    again = envelope.decode_batch(produced, collection="example.com-dataset1-capabilitylist")
    assert [n.derived for n in again.changes] == [snapshots, snapshots]


def test_the_obsolete_1_0_form_is_read_and_a_missing_interval_refused() -> None:
    old = EXAMPLE_1.replace(
        b'capability="change-notification"', b'capability="changelist-notification"'
    )
    assert len(envelope.decode_batch(old, collection="c").changes) == 2
    no_interval = EXAMPLE_1.replace(b'from="2013-01-03T00:00:00Z"', b"")
    with pytest.raises(envelope.InvalidNotification, match="section 3"):
        envelope.decode_batch(no_interval, collection="c")


# --- Example 2: Source to hub ------------------------------------------------------------


async def test_example_2_our_source_side_posts_it_and_our_hub_takes_it(
    tmp_path: Path, capture: Capture
) -> None:
    collection = "example.com-dataset1-capabilitylist"
    batch = envelope.decode_batch(EXAMPLE_1, collection=collection)
    log = SQLiteLog(tmp_path / "log.sqlite3")
    await log.register(collection, CAPABILITY_LIST)
    await log.append(collection, _records(batch, collection), expected_head=0, checkpoint="{}")
    pusher = HubPusher(
        log,
        hub_url=capture.url,
        topics=lambda c: TOPIC,
        capability_lists={collection: CAPABILITY_LIST},
    )
    pusher.add_collection(collection)
    task = asyncio.create_task(pusher.run())
    try:
        await async_wait_for(lambda: capture.posts, 10)
        # The hand-over is done when the cursor moves, after the hub answered.
        await async_wait_for(lambda: log.cursor(collection, pusher.cursor_name), 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    (headers, body) = capture.posts[0]
    assert headers["Content-Type"] == EXAMPLE_2_HEADERS["Content-Type"]
    theirs = links(EXAMPLE_2_HEADERS["Link"])
    ours = links(headers["Link"])
    assert ours.keys() == theirs.keys() == {"self", "hub", "resourcesync"}
    assert ours["self"] == {TOPIC} and ours["hub"] == {capture.url}
    assert int(headers["Content-Length"]) == len(body)
    expected = meaning(EXAMPLE_1)
    expected["md"]["until"] = batch.changes[-1].datetime  # see Example 1
    assert meaning(body) == expected
    assert await log.cursor(collection, pusher.cursor_name) == 2, "handed over: cursor moved"

    # Read: our hub takes Example 2 (for a topic it serves) and reads the Change Lists at once.
    told: list[str] = []
    async with WebSubHub(log, MemoryStore(), on_publish=told.append) as hub:
        import aiohttp

        header = EXAMPLE_2_HEADERS["Link"].replace(TOPIC, hub.topic(collection))
        header = header.replace(HUB, hub.url).replace("\n", "")  # unfolded (RFC 7230 3.2.4)
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                hub.url, data=EXAMPLE_1, headers={**EXAMPLE_2_HEADERS, "Link": header}
            ) as response,
        ):
            assert response.status == 200  # section 4.1: "200 OK if the submission was successful"
    assert told == [collection]
    await log.close()


# --- Example 5: the Destination confirms intent -----------------------------------------


def test_example_5_our_destination_answers_example_4_as_the_text_does() -> None:
    server = CallbackServer("http://destination.example.net/callback")
    channel = WebSubChannel(
        server,
        hub=HUB,
        topic=EXAMPLE_4_QUERY["hub.topic"],
        collection="c1",
        sink=lambda event: None,
        secret=b"s",
    )
    channel._intent = "subscribe"
    answer = channel.on_verify(dict(EXAMPLE_4_QUERY))
    assert answer.status == EXAMPLE_5["status"]
    assert answer.body == EXAMPLE_5["body"]
    assert answer.content_type == EXAMPLE_5["Content-Type"].split(";")[0]
    assert answer.charset.upper() == "UTF-8"
    assert channel.granted == 2400
    # Read: a hub (ours) takes Example 5 as a confirmation, and nothing else.
    challenge = EXAMPLE_4_QUERY["hub.challenge"]
    assert proto.challenge_answered(EXAMPLE_5["status"], EXAMPLE_5["body"], challenge)
    assert not proto.challenge_answered(EXAMPLE_5["status"], EXAMPLE_5["body"] + b"\n", challenge)


# --- Example 6: hub to Destination -------------------------------------------------------


async def test_example_6_our_hub_sends_it_and_our_destination_reads_it(
    tmp_path: Path, capture: Capture
) -> None:
    collection = "example.com-dataset1-capabilitylist"
    batch = envelope.decode_batch(EXAMPLE_1, collection=collection)
    log = SQLiteLog(tmp_path / "log.sqlite3")
    await log.register(collection, CAPABILITY_LIST)
    async with WebSubHub(log, MemoryStore(), allow_callbacks=["127.0.0.1"]) as hub:
        import aiohttp

        form = {
            "hub.mode": "subscribe",
            "hub.topic": hub.topic(collection),
            "hub.callback": capture.url,
        }
        async with aiohttp.ClientSession() as http, http.post(hub.url, data=form) as response:
            assert response.status == 202
        await async_wait_for(lambda: hub.subscriptions(), 10)
        await log.append(collection, _records(batch, collection), expected_head=0, checkpoint="{}")
        await async_wait_for(
            lambda: sum(len(envelope.decode_batch(b).changes) for _, b in capture.posts) >= 2, 10
        )
        topic, hub_url = hub.topic(collection), hub.url
    (headers, body), *more = capture.posts
    assert headers["Content-Type"] == EXAMPLE_6_HEADERS["Content-Type"]
    ours, theirs = links(headers["Link"]), links(EXAMPLE_6_HEADERS["Link"])
    assert ours.keys() == theirs.keys()
    assert ours["self"] == {topic} and ours["hub"] == {hub_url}
    assert ours["resourcesync"] == {CAPABILITY_LIST}
    expected = meaning(EXAMPLE_1)
    if not more:  # both changes in one notification, as in the example
        expected["md"]["until"] = batch.changes[-1].datetime
        assert meaning(body) == expected
    # Read: our Destination turns Example 6 (signed by the hub it subscribed at) into a Message.
    events: list[Any] = []
    channel = WebSubChannel(
        CallbackServer("http://destination.example.net/callback"),
        hub=HUB,
        topic=TOPIC,
        collection=collection,
        sink=events.append,
        secret=b"hub-secret",
    )
    signed = {**EXAMPLE_6_HEADERS, "X-Hub-Signature": proto.signature(EXAMPLE_1, b"hub-secret")}
    channel.on_content(EXAMPLE_1, signed)
    (message,) = events
    read = envelope.decode_batch(message.payload, collection=collection)
    assert [n.loc for n in read.changes] == ["http://example.com/res1", "http://example.com/res2"]
    await log.close()


# --- Example 7: the Capability List -----------------------------------------------------


def test_example_7_is_read_and_produced_with_the_same_meaning() -> None:
    document = parse(EXAMPLE_7)
    assert websub_channels(document) == [(TOPIC, HUB)]
    info = CapabilityListInfo.from_document(CAPABILITY_LIST, document)  # type: ignore[arg-type]
    assert websub_target(info, "c1", "websub") == (HUB, TOPIC)
    # Produced: `rsnotify simulate --hub http://hub.example.org/websub/{id}` writes the entry.
    source = Source(
        layout=Layout("http://example.com/"),
        start=w3cdt.parse("2013-01-03T00:00:00Z"),
        hubs=["http://hub.example.org/websub/{id}"],
    )
    produced = serialize(source.capability_list(source.collections[0]))
    (entry,) = [
        u for u in meaning(produced)["urls"] if u["md"]["capability"] == "change-notification"
    ]
    (example,) = [
        u for u in meaning(EXAMPLE_7)["urls"] if u["md"]["capability"] == "change-notification"
    ]
    assert entry["ln"] == example["ln"] == [("hub", HUB)]
    assert entry["md"] == example["md"]
    assert entry["loc"].startswith(HUB)
    # And the publisher's --write-hubs form, for a topic on the Source: the example's own entry.
    mine = websub_channels(parse(produced))
    assert mine == [(entry["loc"], HUB)]
