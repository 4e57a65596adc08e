"""ResourceSync Framework Notification 1.0.1 (issue 16 item 7), without processes.

* The specification's Examples 1, 2 (payloads) and 8 (the Capability List
  entry) read and produced by rsnotify, compared by meaning as the Change
  Notification examples are (:func:`tests.test_change_notification_examples.meaning`).
* Each kind of change the publisher finds (a Resource List regenerated, a new
  component of a Resource List Index, a Resource Dump, a Change Dump newly
  advertised, a Change List created and one updated) goes through what the
  hub does with it (the log record, its rendering, a notification of several)
  and is read back by the Destination's decoder.
* The Destination's rule for a fresh baseline, and its framework channel.
* The hub's framework topic: served apart from the change topic, never a
  collection of the log (so MQTT and WebSocket never carry it).

Source of the examples: http://www.openarchives.org/rs/notification/1.0.1/framework_notification
(CC BY-SA 4.0), ``shared/reference/resourcesync-framework-notification-1.0.1.txt``.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rsnotify import envelope, framework, w3cdt
from rsnotify.discovery import framework_channels, websub_channels
from rsnotify.errors import InvalidDocument
from rsnotify.framework import FrameworkChange
from rsnotify.log import LogRecord
from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.model import ChangeType, Entry, Root, make_document
from rsnotify.publisher.frameworkwatch import (
    FrameworkState,
    changelist_changes,
    examine,
    stamp,
)
from rsnotify.simulator.source import Layout, Source
from rsnotify.sitemap import parse, serialize
from rsnotify.subscriber import events as ev
from rsnotify.subscriber.websub import CallbackServer, WebSubChannel
from rsnotify.tracker import ListRef
from rsnotify.transport import websubproto as proto
from rsnotify.transport.websub import WebSubHub
from rsnotify.transport.websubstore import MemoryStore
from tests.test_change_notification_examples import EXAMPLE_7, meaning

EXAMPLE_1 = b"""<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"
        xmlns:rs="http://www.openarchives.org/rs/terms/">
  <rs:ln rel="up"
         href="http://example.com/dataset1/capabilitylist.xml"/>
  <rs:md capability="framework-notification"/>
   <url>
      <loc>http://example.com/resourceset1/resourcelist.xml</loc>
      <rs:md change="created" datetime="2013-01-03T00:07:22Z"
             capability="resourcelist"/>
   </url>
</urlset>
"""

EXAMPLE_2 = b"""<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"
        xmlns:rs="http://www.openarchives.org/rs/terms/">
  <rs:md capability="framework-notification"/>
   <url>
      <loc>http://example.com/dataset1/resourcelist.xml</loc>
      <rs:md change="created"
             capability="resourcelist"/>
      <rs:ln rel="index"
             href="http://example.com/dataset1/resourcelist-index.xml"/>
   </url>
   <url>
      <loc>http://example.com/dataset1/resourcedump.xml</loc>
      <rs:md change="created"
             capability="resourcedump"/>
   </url>
   <url>
      <loc>http://example.com/dataset1/changelist.xml</loc>
      <rs:md change="updated"
             capability="changelist"/>
   </url>
</urlset>
"""

# Example 8 is Example 7 of Change Notification (the core specification's Example 13 with
# a channel added) with the framework channel in place of the change channel.
EXAMPLE_8 = EXAMPLE_7.replace(b"/dataset1/change/", b"/dataset1/framework/").replace(
    b'capability="change-notification"', b'capability="framework-notification"'
)
HUB = "http://hub.example.org/websub/"
FRAMEWORK_TOPIC = "http://example.com/dataset1/framework/"
BASE = "http://example.com/dataset1/"
CAPABILITY_LIST = BASE + "capabilitylist.xml"
COLLECTION = "example.com-dataset1-capabilitylist-1b2c3d4e"
T0 = w3cdt.parse("2013-01-03T00:00:00Z")


def t(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


# --- Examples 1, 2 and 8 ----------------------------------------------------------------


def test_examples_1_and_2_are_read_and_produced_with_the_same_meaning() -> None:
    one = framework.decode(EXAMPLE_1)
    assert one.capabilitylist == CAPABILITY_LIST and (one.from_, one.until) == (None, None)
    ((loc, capability, change, when),) = [
        (c.loc, c.capability, c.change, c.datetime) for c in one.changes
    ]
    assert (loc, capability, change) == (
        "http://example.com/resourceset1/resourcelist.xml",
        "resourcelist",
        ChangeType.CREATED,
    )
    assert when == w3cdt.parse("2013-01-03T00:07:22Z")
    two = framework.decode(EXAMPLE_2)
    assert two.capabilitylist is None
    assert [(c.capability, c.change.value, c.index) for c in two.changes] == [
        ("resourcelist", "created", BASE + "resourcelist-index.xml"),
        ("resourcedump", "created", None),
        ("changelist", "updated", None),
    ]
    for example, read in ((EXAMPLE_1, one), (EXAMPLE_2, two)):
        produced = framework.to_xml(read.changes, capabilitylist=read.capabilitylist)
        assert meaning(produced) == meaning(example)


def test_what_is_not_a_framework_notification_is_refused_with_the_rule() -> None:
    change_notification = EXAMPLE_1.replace(
        b'capability="framework-notification"',
        b'capability="change-notification" from="2013-01-03T00:00:00Z" '
        b'until="2013-01-03T00:10:00Z"',
    )
    with pytest.raises(envelope.InvalidNotification, match=re.escape(framework.SPEC)):
        framework.decode(change_notification)
    no_capability = EXAMPLE_1.replace(b'capability="resourcelist"', b"")
    with pytest.raises(envelope.InvalidNotification, match="change and capability"):
        framework.decode(no_capability)
    # The other way round: a change channel never takes one for changes to apply.
    with pytest.raises(
        envelope.InvalidNotification, match=re.escape("Change Notification 1.0.1 section 3")
    ):
        envelope.decode_batch(EXAMPLE_1, collection=COLLECTION)


def test_example_8_the_framework_channel_is_found_and_never_taken_for_the_change_channel() -> None:
    document = parse(EXAMPLE_8)
    assert framework_channels(document) == [(FRAMEWORK_TOPIC, HUB)]
    assert websub_channels(document) == []
    # Produced: `rsnotify simulate --hub http://hub.example.org/websub/{id}` advertises the
    # framework topic of that hub (`rsnotify publish --websub` serves <topic>/framework).
    source = Source(layout=Layout("http://example.com/"), start=T0, hubs=[HUB + "{id}"])
    produced = serialize(source.capability_list(source.collections[0]))

    def framework_entry(doc: bytes) -> dict[str, Any]:
        (entry,) = [
            u for u in meaning(doc)["urls"] if u["md"]["capability"] == "framework-notification"
        ]
        return entry

    ours, theirs = framework_entry(produced), framework_entry(EXAMPLE_8)
    assert ours["md"] == theirs["md"] and ours["ln"] == theirs["ln"] == [("hub", HUB)]
    assert ours["loc"].startswith(HUB) and ours["loc"].endswith(framework.TOPIC_SUFFIX)
    (change_topic, _), *_ = websub_channels(parse(produced))
    assert framework_channels(parse(produced)) == [(change_topic + framework.TOPIC_SUFFIX, HUB)]


# --- each kind of change, produced by the publisher's rules and read back -------------------


def _document(capability: str, root: Root = Root.URLSET, **fields: Any) -> bytes:
    return serialize(make_document(root, capability, **fields))


def _index(capability: str, parts: list[tuple[str, datetime]]) -> bytes:
    entries = [Entry(loc=loc, at=at) for loc, at in parts]
    return _document(capability, Root.SITEMAPINDEX, at=parts[-1][1], entries=entries)


def test_each_change_kind_is_produced_by_the_publisher_and_read_back() -> None:
    rl, rli, rd, cd = (BASE + n for n in ("rl.xml", "rl-index.xml", "rd.xml", "cd.xml"))
    listing = [Entry(loc=BASE + "res1", lastmod=t(0))]

    def resource_list(at: datetime) -> bytes:
        return _document("resourcelist", at=at, completed=at, entries=listing)

    # The first check records, reports nothing; the same bytes again are no change.
    state, nothing = examine("resourcelist", rl, resource_list(t(0)), None, report=False)
    assert nothing is None
    assert examine("resourcelist", rl, resource_list(t(0)), state, report=True)[1] is None
    # A regenerated Resource List: updated, dated by its `at`.
    _, regenerated = examine("resourcelist", rl, resource_list(t(1)), state, report=True)
    # Under an index: the newest new component, with rel="index" (section 2).
    parts = [(BASE + "rl-1.xml", t(0))]
    index_state, _ = examine("resourcelist", rli, _index("resourcelist", parts), None, report=False)
    parts += [(BASE + "rl-2.xml", t(2)), (BASE + "rl-3.xml", t(3))]
    body = _index("resourcelist", parts)
    _, component = examine("resourcelist", rli, body, index_state, report=True)
    # A Resource Dump is only ever created (Table 2); a Change Dump newly advertised: created.
    dump_state, _ = examine(
        "resourcedump", rd, _document("resourcedump", at=t(0)), None, report=False
    )
    _, dump = examine(
        "resourcedump", rd, _document("resourcedump", at=t(4)), dump_state, report=True
    )
    _, change_dump = examine("changedump", cd, _document("changedump", at=t(5)), None, report=True)
    # Change Lists, as the Change List watcher saw them.
    cli, cl1, cl2 = BASE + "changelist.xml", BASE + "cl1.xml", BASE + "cl2.xml"
    lists = changelist_changes(
        [cl1], [ListRef(cl1, t(0), t(5)), ListRef(cl2, t(5))], cli, {cl1: t(5), cl2: t(6)}
    )
    assert changelist_changes(None, [ListRef(cl1, t(0))], cli, {cl1: t(1)}) == []  # first check
    changes = [regenerated, component, dump, change_dump, *lists]
    assert all(changes)
    expected = [
        (rl, "resourcelist", "updated", t(1), None),
        (BASE + "rl-3.xml", "resourcelist", "created", t(3), rli),
        (rd, "resourcedump", "created", t(4), None),
        (cd, "changedump", "created", t(5), None),
        (cl1, "changelist", "updated", t(5), cli),
        (cl2, "changelist", "created", t(6), cli),
    ]
    described = [
        (c.loc, c.capability, c.change.value, c.datetime, c.index) for c in changes if c is not None
    ]
    assert described == expected
    for kind, allowed in framework.CHANGE_TYPES.items():  # Table 2 is kept
        assert all(c.change in allowed for c in changes if c and c.capability == kind)

    # Logged, rendered and grouped by the hub, read by a Destination.
    detected, before = t(10), t(9)
    assert stamp(changes, detected, before) == detected  # type: ignore[arg-type]
    stream = framework.stream(COLLECTION)
    rendered = []
    for seq, change in enumerate(changes, start=1):
        assert change is not None
        change.seq = seq
        data = framework.to_record(change, collection=COLLECTION, capabilitylist=CAPABILITY_LIST)
        assert framework.from_record(data) == change
        rendered.append(proto.render_record(stream, LogRecord(seq, data, 0)))
    first = proto.compose_batch(
        rendered[:2],
        capabilitylist=CAPABILITY_LIST,
        collection=COLLECTION,
        capability=envelope.FRAMEWORK_CAPABILITY,
    )
    rest = proto.compose_batch(
        rendered[2:],
        capabilitylist=CAPABILITY_LIST,
        collection=COLLECTION,
        capability=envelope.FRAMEWORK_CAPABILITY,
    )
    read = [framework.decode(first), framework.decode(rest)]
    assert [n.capabilitylist for n in read] == [CAPABILITY_LIST] * 2
    assert [n.collection for n in read] == [COLLECTION] * 2
    assert (read[0].from_, read[0].until, read[1].from_) == (before, detected, detected)
    back = [
        (c.loc, c.capability, c.change.value, c.datetime, c.index) for n in read for c in n.changes
    ]
    assert back == expected
    assert [c.seq for n in read for c in n.changes] == list(range(1, 7))


def test_a_document_that_is_not_what_the_capability_list_says_is_refused() -> None:
    with pytest.raises(InvalidDocument, match="advertised as a resourcelist"):
        examine("resourcelist", BASE + "rl.xml", _document("changelist"), None, report=True)


def test_the_publishers_framework_state_survives_a_restart() -> None:
    rl = BASE + "rl-index.xml"
    state = FrameworkState(started=True, capability_etag='"e"', advertised={"resourcelist": rl})
    state.documents["resourcelist"], _ = examine(
        "resourcelist", rl, _index("resourcelist", [(BASE + "p1.xml", t(0))]), None, report=False
    )
    state.changelists, state.last_detected = [BASE + "cl1.xml"], t(3)
    assert FrameworkState.from_json(state.to_json()) == state
    assert FrameworkState.from_json(None) == FrameworkState()


# --- the Destination ---------------------------------------------------------------------


def test_a_newer_resource_list_after_an_outage_longer_than_the_change_lists_is_a_cue() -> None:
    regenerated = FrameworkChange(BASE + "rl.xml", "resourcelist", ChangeType.UPDATED, t(5))
    cue = framework.rebaseline_cue([regenerated], position=t(1), coverage_start=t(3))
    assert cue is not None and "away longer than they cover" in cue
    # The Change Lists reach back to where the mirror stood: a walk of them is enough.
    assert framework.rebaseline_cue([regenerated], position=t(3), coverage_start=t(3)) is None
    # Not newer than the mirror: nothing it does not have.
    assert framework.rebaseline_cue([regenerated], position=t(6), coverage_start=t(7)) is None
    # Other capabilities never are; an undated Resource List is (the cue makes us read it).
    other = FrameworkChange(BASE + "cl2.xml", "changelist", ChangeType.CREATED, t(5))
    assert framework.rebaseline_cue([other], position=t(1), coverage_start=t(3)) is None
    undated = FrameworkChange(BASE + "rl.xml", "resourcelist", ChangeType.CREATED)
    assert framework.rebaseline_cue([undated], position=t(1), coverage_start=t(3)) is not None
    assert framework.rebaseline_cue([regenerated], position=None, coverage_start=t(3)) is None
    # A Change List created or updated is the text's "trigger to poll"; a Resource List is not.
    assert framework.polls_change_lists([regenerated, other])
    assert not framework.polls_change_lists([regenerated, undated])


def test_the_destinations_framework_channel_hands_the_engine_framework_events_only() -> None:
    events: list[Any] = []
    channel = WebSubChannel(
        CallbackServer("http://destination.example.net/callback"),
        hub=HUB,
        topic=FRAMEWORK_TOPIC,
        collection=COLLECTION,
        sink=events.append,
        secret=b"hub-secret",
        framework_topic=True,
    )
    assert channel.callback.endswith(f"/{COLLECTION}{framework.TOPIC_SUFFIX}")

    def post(body: bytes, secret: bytes | None = b"hub-secret") -> None:
        headers = {"Content-Type": "application/xml"}
        if secret is not None:
            headers["X-Hub-Signature"] = proto.signature(body, secret)
        channel.on_content(body, headers)

    post(EXAMPLE_2)
    ((event,),) = [events]
    assert isinstance(event, ev.Framework) and len(event.notification.changes) == 3
    # Unsigned, forged or unreadable: logged and dropped, never a catch-up (no Invalid event).
    post(EXAMPLE_1, secret=None)
    post(EXAMPLE_1, secret=b"forged")
    post(b"<urlset/>")
    assert events == [event]


# --- the hub's framework topic ---------------------------------------------------------------


async def test_the_hub_serves_the_framework_topic_apart_and_never_as_a_collection(
    tmp_path: Path,
) -> None:
    log = SQLiteLog(tmp_path / "log.sqlite3")
    await log.register(COLLECTION, CAPABILITY_LIST)
    stream = framework.stream(COLLECTION)
    told: list[str] = []
    async with (
        WebSubHub(log, MemoryStore(), framework_topics=True, on_publish=told.append) as hub,
        aiohttp.ClientSession() as http,
    ):
        topic = hub.framework_topic(COLLECTION)
        assert topic == hub.topic(COLLECTION) + "/framework"
        async with http.head(topic) as response:  # section 4.1, before the first notification
            assert response.status == 200
            assert response.headers["Content-Type"] == "application/xml"
            assert response.headers["Content-Length"] == "0"
            link = proto.link_targets(response.headers["Link"])
            assert link["self"] == [topic] and link["hub"] == [hub.url]
        change = FrameworkChange(BASE + "rl.xml", "resourcelist", ChangeType.UPDATED, t(1))
        stamp([change], t(2), None)
        change.seq = 1
        record = framework.to_record(change, collection=COLLECTION, capabilitylist=CAPABILITY_LIST)
        await log.append(stream, [record], expected_head=0, checkpoint="{}")
        async with http.get(topic) as response:
            latest = framework.decode(await response.read())
        assert [(c.loc, c.seq) for c in latest.changes] == [(change.loc, 1)]
        async with http.get(hub.url) as response:
            listing = (await response.json())["topics"][COLLECTION]
        assert listing["framework"] == topic
        # Section 4.1 from another Source: its framework notification for our topic is taken
        # as "read my documents now".
        headers = {"Content-Type": "application/xml", "Link": proto.link_header(topic, hub.url)}
        async with http.post(hub.url, data=EXAMPLE_1, headers=headers) as response:
            assert response.status == 200
        assert told == [COLLECTION]
    # The stream is not a collection of the log: the MQTT pusher and the WebSocket gateway
    # (which serve registered collections only) never carry framework notifications.
    assert list(await log.collections()) == [COLLECTION]
    async with (
        WebSubHub(log, MemoryStore()) as hub,
        aiohttp.ClientSession() as http,
        http.head(hub.framework_topic(COLLECTION)) as response,
    ):
        assert response.status == 404  # only a publisher that watches the framework serves it
    await log.close()
