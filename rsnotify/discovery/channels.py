"""The push channels a Capability List advertises, read from it.

Change Notification 1.0.1 section 5 (Example 7) advertises a WebSub channel
as a ``<url>`` whose ``<loc>`` is the topic, with ``rs:md
capability="change-notification"`` and ``rs:ln rel="hub"`` to the hub (the
1.0 draft's ``changelist-notification`` is read too); Framework Notification
1.0.1 does the same with ``capability="framework-notification"`` (its section
5, Example 8).  rsnotify's MQTT and WebSocket channels are document-level
``rs:ln rel="urn:x-rsnotify:channel"`` links (:data:`CHANNEL_REL`), an
extension relation type (RFC 8288 section 2.1.2) that a standard
Destination ignores, since section 5 reserves ``rel="hub"`` for WebSub hubs;
the older top-level ``rel="hub"`` form with an ``mqtt(s)://`` or
``ws(s)://`` URL is still read.  The publisher writes the same forms
(:mod:`rsnotify.publisher.advertisement`).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from ..model import CHANNEL_REL, CapabilityList, Document, Link

__all__ = [
    "CHANNEL_REL",
    "FRAMEWORK_CAPABILITIES",
    "NOTIFICATION_CAPABILITIES",
    "PUSH_SCHEMES",
    "CapabilityListInfo",
    "framework_channels",
    "push_channels",
    "websub_channels",
]

NOTIFICATION_CAPABILITIES = ("change-notification", "changelist-notification")
FRAMEWORK_CAPABILITIES = ("framework-notification",)
PUSH_SCHEMES = ("mqtt", "mqtts", "ws", "wss")


@dataclass(slots=True)
class CapabilityListInfo:
    """A Capability List found, with what a Destination needs from it."""

    url: str
    document: CapabilityList
    capabilities: dict[str, str]
    hubs: list[Link]

    @classmethod
    def from_document(cls, url: str, document: CapabilityList) -> CapabilityListInfo:
        return cls(
            url=url, document=document, capabilities=document.capabilities, hubs=document.hubs
        )

    @property
    def websub(self) -> list[tuple[str, str]]:
        """(topic, hub) of each advertised WebSub channel (Change Notification section 5)."""
        return websub_channels(self.document)

    @property
    def framework(self) -> list[tuple[str, str]]:
        """(topic, hub) of each advertised Framework Notification channel (its section 5)."""
        return framework_channels(self.document)

    @property
    def channels(self) -> list[str]:
        """rsnotify's MQTT and WebSocket channel URLs."""
        return push_channels(self.document)


def websub_channels(
    document: Document, capabilities: tuple[str, ...] = NOTIFICATION_CAPABILITIES
) -> list[tuple[str, str]]:
    """(topic, hub) pairs a Capability List advertises as section 5 and Example 7 show."""
    out = []
    for entry in document.entries:
        if entry.capability in capabilities:
            hubs = [link.href for link in entry.links if link.rel == "hub"]
            if hubs and urlsplit(hubs[0]).scheme in ("http", "https"):
                out.append((entry.loc, hubs[0]))
    return out


def framework_channels(document: Document) -> list[tuple[str, str]]:
    """(topic, hub) of the Framework Notification channels (its section 5, Example 8)."""
    return websub_channels(document, FRAMEWORK_CAPABILITIES)


def push_channels(document: Document) -> list[str]:
    """rsnotify's MQTT/WebSocket channels: ``rel="urn:x-rsnotify:channel"``, then the old form."""
    links = [ln.href for ln in document.links_with(CHANNEL_REL)]
    links += [ln.href for ln in document.links_with("hub") if ln.href not in links]
    return [href for href in links if urlsplit(href).scheme in PUSH_SCHEMES]
