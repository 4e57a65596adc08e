"""Where a collection's push channels are, and writing them into its Capability List.

A Destination finds the channels in the Capability List (design.md section
2, Discovery):

* WebSub as Change Notification 1.0.1 section 5 says: a ``<url>`` entry,
  topic in ``<loc>``, ``rs:ln rel="hub"``, ``capability="change-notification"``,
  and the same with ``capability="framework-notification"`` for Framework
  Notification 1.0.1 (its section 5);
* MQTT and WebSocket as ``rs:ln rel="urn:x-rsnotify:channel"`` links (see
  :mod:`rsnotify.discovery`), a relation a standard Destination ignores.

:class:`Advertisement` says what to advertise from what the process knows
now (the options, the bound WebSocket port, the running hub);
:func:`with_channels` puts it into a Capability List (pure) and
:func:`write_capability_lists` rewrites a directory Source's files with it.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from .. import framework, sitemap
from ..changes.access import DirectoryAccess
from ..discovery.channels import CHANNEL_REL, PUSH_SCHEMES
from ..durable import write_file
from ..envelope import FRAMEWORK_CAPABILITY, NOTIFICATION_CAPABILITY, OBSOLETE_CAPABILITY
from ..model import Document, Entry, Link
from .config import PublisherConfig

log = logging.getLogger("rsnotify.publish")

#: (topic, hub) of a WebSub channel.
Channel = tuple[str, str]


class Hub(Protocol):
    """What advertising needs of a running WebSub hub."""

    @property
    def url(self) -> str: ...

    def topic(self, collection: str) -> str: ...

    def framework_topic(self, collection: str) -> str: ...


@dataclass(frozen=True, slots=True)
class Advertisement:
    """The channels of each collection, as this process knows them now."""

    config: PublisherConfig
    ws_port: int | None = None  # the bound WebSocket port (None: no --ws, or not yet)
    hub: Hub | None = None  # the WebSub hub this process runs (None: none, or a follower)

    def hub_links(self, collection: str) -> list[str]:
        """The collection's MQTT and WebSocket channels (``rel="urn:x-rsnotify:channel"``)."""
        hrefs = []
        config = self.config
        broker_url = config.mqtt or config.mqtt_hub
        if broker_url:
            from ..transport.mqtturl import parse_broker_url
            from ..transport.topics import Topics

            broker = parse_broker_url(broker_url)
            host = f"[{broker.host}]" if ":" in broker.host else broker.host
            topic = Topics(config.topic_prefix, legacy=config.legacy_topics).changes(collection)
            hrefs.append(f"{broker.scheme}://{host}:{broker.port}/{topic}")
        if config.ws and self.ws_port is not None:
            host = config.ws.rpartition(":")[0] or "127.0.0.1"
            scheme = "wss" if config.ws_cert else "ws"
            hrefs.append(f"{scheme}://{host}:{self.ws_port}/{collection}")
        return hrefs

    def planned_websub(self, collection: str) -> Channel | None:
        """``--ha`` follower: where the leader's hub will be (the same --websub address)."""
        config = self.config
        if not config.websub:
            return None
        base = config.websub_url or f"http://{config.websub}/"
        base = base if base.endswith("/") else base + "/"
        return base + collection, config.websub_hub or base

    def websub(self, collection: str) -> Channel | None:
        """(topic, hub) of the collection's Change Notification channel (section 5), if any."""
        if self.hub is None:
            return None
        return self.hub.topic(collection), self.config.websub_hub or self.hub.url

    def framework(self, collection: str) -> Channel | None:
        """(topic, hub) of the collection's Framework Notification channel (its section 5).

        Always on this publisher's own hub: the framework stream is not handed
        to a ``--websub-hub`` (see the README).
        """
        if not self.config.framework_enabled():
            return None
        if self.hub is not None:
            return self.hub.framework_topic(collection), self.hub.url
        planned = self.planned_websub(collection)  # --ha follower: the leader's hub
        if planned is None:
            return None
        base = planned[0][: -len(collection)]
        return planned[0] + framework.TOPIC_SUFFIX, base

    def channels(self, collection: str) -> list[tuple[str, Channel | None]]:
        """(capability, channel) of the WebSub-style entries a Capability List gets."""
        return [
            (NOTIFICATION_CAPABILITY, self.websub(collection)),
            (FRAMEWORK_CAPABILITY, self.framework(collection)),
        ]


def with_channels(
    document: Document, hrefs: list[str], channels: list[tuple[str, Channel | None]]
) -> bool:
    """Put the channels into ``document``; False when it already said exactly that.

    Forms written by earlier versions (a ``changelist-notification`` entry,
    ``rel="hub"`` links to ``mqtt://`` or ``ws://``) are replaced.
    """
    links = [
        ln
        for ln in document.links
        if not (ln.rel == "hub" and ln.href.partition(":")[0] in PUSH_SCHEMES)
    ]
    known = {ln.href for ln in links if ln.rel == CHANNEL_REL}
    links += [Link(rel=CHANNEL_REL, href=h) for h in hrefs if h not in known]
    entries = [e for e in document.entries if e.capability != OBSOLETE_CAPABILITY]
    for capability, channel in channels:
        if channel is None:
            continue
        topic, hub = channel
        entries = [e for e in entries if not (e.capability == capability and e.loc == topic)]
        entries.append(Entry(loc=topic, capability=capability, links=[Link(rel="hub", href=hub)]))
    if links == document.links and entries == document.entries:
        return False
    document.links, document.entries = links, entries
    return True


def write_capability_lists(
    advertisement: Advertisement, access: DirectoryAccess, capability_lists: Mapping[str, str]
) -> None:
    """Advertise the channels in each Capability List file of a directory Source (atomically).

    ``capability_lists``: collection id -> Capability List URL.
    """
    for cid, url in capability_lists.items():
        path = access.local_path(url)
        document = sitemap.parse(path)
        if not with_channels(document, advertisement.hub_links(cid), advertisement.channels(cid)):
            continue
        text = io.BytesIO()
        sitemap.write(document, text)
        write_file(path, text.getvalue(), mode=0o666)  # readable as open() makes it (umask)
        log.info("advertised the push channels in %s", path)
