"""The publisher's parts on their own: role, task groups, advertisement, console, discovery loop.

The end-to-end behaviour is tested in ``test_publisher.py`` and the
acceptance tests; these pin down the pieces ``rsnotify.publisher.service``
wires together, without a Source, a log or a broker.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rsnotify import discovery
from rsnotify.errors import DiscoveryError, FetchError, RsNotifyError
from rsnotify.model import CapabilityList, Entry, Link, Root
from rsnotify.publisher.advertisement import Advertisement, with_channels
from rsnotify.publisher.config import PublisherConfig, Role, role_of
from rsnotify.publisher.console import running_lines
from rsnotify.publisher.service import LeaderTerm, Publisher
from rsnotify.publisher.tasks import TaskGroup

REDIS = "redis://127.0.0.1:6379/0"

# -- role ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "role"),
    [
        ({}, Role.PUBLISHER),
        ({"ws_only": True, "ws": "127.0.0.1:0", "redis": REDIS}, Role.WS_GATEWAY),
        ({"mqtt_only": True, "redis": REDIS, "mqtt": "mqtt://b"}, Role.MQTT_GATEWAY),
        ({"mqtt_only": True, "redis": REDIS, "mqtt": "mqtt://b", "ha": True}, Role.MQTT_GATEWAY),
        ({"ha": True, "redis": REDIS, "websub": "127.0.0.1:0"}, Role.PUBLISHER),
    ],
)
def test_the_role_follows_the_options(options: dict[str, Any], role: Role) -> None:
    assert role_of(PublisherConfig(source="http://s.test/", **options)) is role


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ha": True}, "--ha elects a leader through Redis"),
        ({"mqtt_only": True, "mqtt": "mqtt://b"}, "--mqtt-only pushes a shared log"),
        ({"mqtt_only": True, "redis": REDIS}, "--mqtt-only pushes a shared log"),
        (
            {"mqtt_only": True, "ws_only": True, "redis": REDIS, "mqtt": "mqtt://b"},
            "--mqtt-only pushes a shared log",
        ),
        ({"ws_only": True, "websub": "127.0.0.1:0"}, "--websub runs one hub per log"),
        (
            {"ws_only": True, "websub": "127.0.0.1:0", "ha": True, "redis": REDIS},
            "--websub runs one hub per log",
        ),
    ],
)
def test_options_that_cannot_work_together_are_refused(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(RsNotifyError, match=message):
        role_of(PublisherConfig(source="http://s.test/", **options))


def test_only_the_publisher_detects_and_only_gateways_of_ws_lead_nothing() -> None:
    assert [r for r in Role if r.detects] == [Role.PUBLISHER]
    assert [r for r in Role if not r.leads] == [Role.WS_GATEWAY]


# -- task groups ----------------------------------------------------------------------


async def test_a_task_group_cancels_every_task_and_waits_for_them() -> None:
    group = TaskGroup()
    ended: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append(name)

    for name in ("a", "b", "c"):
        group.spawn(forever(name), name=name)
    await asyncio.sleep(0)  # let them start
    await group.cancel()
    assert sorted(ended) == ["a", "b", "c"]
    assert len(group) == 0


async def test_a_failing_task_ends_alone_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    group = TaskGroup()
    sibling_running = asyncio.Event()
    failed = asyncio.Event()

    async def fail() -> None:
        failed.set()
        raise ValueError("broken transport")

    async def sibling() -> None:
        sibling_running.set()
        await asyncio.Event().wait()

    with caplog.at_level(logging.ERROR, logger="rsnotify.publish"):
        other = group.spawn(sibling(), name="detection")
        broken = group.spawn(fail(), name="MQTT pusher")
        await asyncio.wait_for(asyncio.gather(failed.wait(), sibling_running.wait()), 5)
        await asyncio.wait([broken], timeout=5)
        await asyncio.sleep(0)  # the done callback runs after the task ends
        assert not other.done(), "the sibling was cancelled with the failing task"
        assert any(
            "MQTT pusher stopped" in r.getMessage() and "broken transport" in r.getMessage()
            for r in caplog.records
        )
    await group.cancel()
    assert other.cancelled()


# -- advertisement ---------------------------------------------------------------------


@dataclass
class _Hub:
    url: str = "http://hub.test/"

    def topic(self, collection: str) -> str:
        return f"{self.url}{collection}"

    def framework_topic(self, collection: str) -> str:
        return f"{self.url}{collection}/framework"


def _capability_list() -> CapabilityList:
    return CapabilityList(
        root=Root.URLSET,
        capability="capabilitylist",
        links=[
            Link(rel="up", href="http://s.test/.well-known/resourcesync"),
            Link(rel="hub", href="mqtt://old.test:1883/x"),  # an earlier version's form
        ],
        entries=[
            Entry(loc="http://s.test/c1/changelist.xml", capability="changelist"),
            Entry(loc="http://old.test/topic", capability="changelist-notification"),
        ],
    )


def test_channels_are_written_in_the_forms_the_specifications_give_and_only_once() -> None:
    config = PublisherConfig(
        source="http://s.test/", mqtt="mqtt://broker.test:1883", websub="127.0.0.1:0"
    )
    advertisement = Advertisement(config, hub=_Hub())
    document = _capability_list()
    hrefs, channels = advertisement.hub_links("c1"), advertisement.channels("c1")
    assert hrefs == ["mqtt://broker.test:1883/resourcesync/c1/changes"]
    assert with_channels(document, hrefs, channels) is True
    assert [(ln.rel, ln.href) for ln in document.links] == [
        ("up", "http://s.test/.well-known/resourcesync"),
        ("urn:x-rsnotify:channel", "mqtt://broker.test:1883/resourcesync/c1/changes"),
    ]
    assert [(e.capability, e.loc, [ln.href for ln in e.links]) for e in document.entries] == [
        ("changelist", "http://s.test/c1/changelist.xml", []),
        ("change-notification", "http://hub.test/c1", ["http://hub.test/"]),
        ("framework-notification", "http://hub.test/c1/framework", ["http://hub.test/"]),
    ]
    assert with_channels(document, hrefs, channels) is False  # nothing left to change


def test_an_ha_follower_prints_where_the_leaders_hub_will_be() -> None:
    config = PublisherConfig(
        source="http://s.test/",
        websub="127.0.0.1:8080",
        ws="127.0.0.1:0",
        ha=True,
        redis=REDIS,
    )
    lines = running_lines(
        Advertisement(config, ws_port=8765, hub=None),
        {"c1": "http://s.test/c1/capabilitylist.xml"},
        metrics_port=9101,
    )
    assert lines == [
        "rsnotify publish: running: 1 collection(s); ws://127.0.0.1:8765/; "
        "metrics http://127.0.0.1:9101/metrics",
        "rsnotify publish: collection c1 http://s.test/c1/capabilitylist.xml",
        'rsnotify publish:   advertise <rs:ln rel="urn:x-rsnotify:channel" '
        'href="ws://127.0.0.1:8765/c1"/>',
        "rsnotify publish:   advertise <url><loc>http://127.0.0.1:8080/c1</loc>"
        '<rs:ln rel="hub" href="http://127.0.0.1:8080/"/>'
        '<rs:md capability="change-notification"/></url>',
        "rsnotify publish:   advertise <url><loc>http://127.0.0.1:8080/c1/framework</loc>"
        '<rs:ln rel="hub" href="http://127.0.0.1:8080/"/>'
        '<rs:md capability="framework-notification"/></url>',
    ]


# -- the one discovery loop -------------------------------------------------------------


async def test_drive_notes_what_a_reader_could_not_read_and_runs_to_the_result() -> None:
    """Any reader drives the machine: here one that can read nothing at all."""

    async def read(request: discovery.Request) -> discovery.Response:
        raise FetchError(request.url, "no such file")

    machine = discovery.DiscoveryMachine("http://localhost/.well-known/resourcesync")
    with pytest.raises(DiscoveryError) as raised:
        await discovery.drive(machine, read)
    assert [(a.via, a.outcome) for a in machine.attempts] == [
        (discovery.Via.GIVEN, "no such file"),  # the reason, without the URL again
        (discovery.Via.WELL_KNOWN, "already visited, not fetched again"),
        (discovery.Via.ROBOTS, "no such file"),
    ]
    assert "no ResourceSync Capability List found" in str(raised.value)


# -- a leadership term's order of stopping ----------------------------------------------


class _Recorder:
    """A transport that notes when it starts, stops and when its loop ends."""

    def __init__(self, name: str, events: list[str]) -> None:
        self.name = name
        self.events = events

    async def start(self, tasks: TaskGroup) -> None:
        self.events.append(f"start {self.name}")

        async def loop() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                self.events.append(f"loop of {self.name} ended")

        tasks.spawn(loop())

    async def stop(self) -> None:
        self.events.append(f"stop {self.name}")


async def _term_with_detection(events: list[str]) -> LeaderTerm:
    term = LeaderTerm()

    async def detect() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            events.append("detection ended")

    term.detection.spawn(detect())
    await term.start(_Recorder("mqtt", events))
    await term.start(_Recorder("websub-hub", events))
    await asyncio.sleep(0)  # let the loops start
    return term


async def test_a_clean_stop_ends_detection_then_stops_transports_in_reverse_then_loops() -> None:
    events: list[str] = []
    term = await _term_with_detection(events)
    await term.stop(drain=True)
    assert events[2:] == [
        "detection ended",
        "stop websub-hub",
        "stop mqtt",
        "loop of mqtt ended",
        "loop of websub-hub ended",
    ]
    assert term.transports == []


async def test_a_deposed_leader_ends_the_loops_before_stopping_the_transports() -> None:
    events: list[str] = []
    term = await _term_with_detection(events)
    await term.stop(drain=False)
    assert events[2:] == [
        "detection ended",
        "loop of mqtt ended",
        "loop of websub-hub ended",
        "stop websub-hub",
        "stop mqtt",
    ]


async def test_a_refused_role_stops_start_before_anything_opens(tmp_path: Path) -> None:
    state = tmp_path / "state"
    publisher = Publisher(
        PublisherConfig(source="http://s.test/", state_dir=str(state), ha=True)  # no --redis
    )
    with pytest.raises(RsNotifyError, match="--ha elects a leader through Redis"):
        await publisher.start()
    assert publisher.log is None and not state.exists(), "the log was opened"
    await publisher.stop()  # what `rsnotify publish` does after a refused start
