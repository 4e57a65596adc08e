"""Find a Source's Capability Lists, and their push hubs, from any URL (Z39.99 section 6.3).

A Destination may know only a Source's base URL, a Source Description, a
Capability List, or some resource of the Source.  The specification gives
three ways in, all handled here:

* Source-wide (6.3.2): the Source Description at the well-known URI
  ``/.well-known/resourcesync`` (RFC 5785) enumerates the Capability Lists.
* Resource-specific (6.3.3): a resource links to the Capability List that
  covers it with an HTTP ``Link: <...>; rel="resourcesync"`` header or an HTML
  ``<link rel="resourcesync" href="...">``.
* robots.txt (6.3.4): a ``Sitemap:`` directive names a Resource List; its
  ``up`` link leads to the Capability List, whose ``up`` leads to the Source
  Description.

The order is: read the given URL (it may itself be a ResourceSync document, or
carry a resource-specific link), and only when that yields no Capability List
fall back to the well-known URI of its origin, then to its robots.txt.  What
the given URL says is the most specific answer, so it wins.

The logic is a sans-I/O state machine, :class:`DiscoveryMachine`: it says
which URL to fetch next and is told what came back, so every rule is
testable without a network; :func:`drive` runs it with any reader, and the
async :class:`Discoverer` is the reader over HTTP.  Loops are impossible by
construction: no URL is fetched twice, ``up`` chains are capped
(``max_hops``) and so is the total number of fetches.  Bodies are parsed
only with :mod:`rsnotify.sitemap` (no DTDs, no entities, no network) and
:mod:`html.parser` (no network, stops at ``<body>``).

Every Capability List found is returned with its capabilities and its push
channels:

* WebSub channels as Change Notification 1.0.1 section 5 (Example 7)
  advertises them: a ``<url>`` whose ``<loc>`` is the topic, with ``rs:md
  capability="change-notification"`` and ``rs:ln rel="hub"`` to the hub
  (:func:`websub_channels`; the 1.0 draft's ``changelist-notification`` is
  read too);
* Framework Notification channels the same way (its section 5, Example 8:
  ``capability="framework-notification"``; :func:`framework_channels`): a
  topic of its own, never taken for a change channel;
* rsnotify's MQTT and WebSocket channels as document-level ``rs:ln
  rel="urn:x-rsnotify:channel"`` links (:data:`CHANNEL_REL`): an extension
  relation type (RFC 8288 section 2.1.2), which a Destination following
  the standard ignores, since section 5 reserves ``rel="hub"`` for WebSub
  hubs; the older top-level ``rel="hub"`` form with an ``mqtt(s)://`` or
  ``ws(s)://`` URL is still read (:func:`push_channels`).

The package: :mod:`.machine` (the state machine, its results and the
loop), :mod:`.pages` (what one response says: links, robots.txt, the kind of
document) and :mod:`.channels` (the push channels a Capability List
advertises).  Everything is importable from here.
"""

from .channels import (
    CHANNEL_REL,
    FRAMEWORK_CAPABILITIES,
    NOTIFICATION_CAPABILITIES,
    PUSH_SCHEMES,
    CapabilityListInfo,
    framework_channels,
    push_channels,
    websub_channels,
)
from .machine import (
    Attempt,
    Discoverer,
    DiscoveryMachine,
    Read,
    Request,
    Response,
    SourceInfo,
    Via,
    discover,
    drive,
)
from .pages import (
    RESOURCESYNC_REL,
    ROBOTS_MAX_BYTES,
    WELL_KNOWN_PATH,
    Role,
    classify,
    links_from_headers,
    links_from_html,
    read_document,
    robots_url,
    sitemaps_from_robots,
    well_known_url,
)

__all__ = [
    "CHANNEL_REL",
    "FRAMEWORK_CAPABILITIES",
    "NOTIFICATION_CAPABILITIES",
    "PUSH_SCHEMES",
    "RESOURCESYNC_REL",
    "ROBOTS_MAX_BYTES",
    "WELL_KNOWN_PATH",
    "Attempt",
    "CapabilityListInfo",
    "Discoverer",
    "DiscoveryMachine",
    "Read",
    "Request",
    "Response",
    "Role",
    "SourceInfo",
    "Via",
    "classify",
    "discover",
    "drive",
    "framework_channels",
    "links_from_headers",
    "links_from_html",
    "push_channels",
    "read_document",
    "robots_url",
    "sitemaps_from_robots",
    "websub_channels",
    "well_known_url",
]
