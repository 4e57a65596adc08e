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
testable without a network and the async :class:`Discoverer` is a dozen
lines of I/O.  Loops are impossible by construction: no URL is fetched twice,
``up`` chains are capped (``max_hops``) and so is the total number of fetches.
Bodies are parsed only with :mod:`rsnotify.sitemap` (no DTDs, no entities, no
network) and :mod:`html.parser` (no network, stops at ``<body>``).

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
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import TYPE_CHECKING
from urllib.parse import urldefrag, urljoin, urlsplit

from .errors import DiscoveryError, DocumentError, FetchError
from .links import has_rel, parse_link_header
from .model import (
    CapabilityList,
    Document,
    Link,
    SourceDescription,
    SourceDescriptionIndex,
)
from .sitemap import MAX_DOCUMENT_BYTES, DocumentReader, Limits

if TYPE_CHECKING:  # the HTTP client is the caller's; discovery itself needs none
    from .fetch import Fetcher

__all__ = [
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

WELL_KNOWN_PATH = "/.well-known/resourcesync"
#: rsnotify's MQTT/WebSocket channels in a Capability List (an extension relation type).
CHANNEL_REL = "urn:x-rsnotify:channel"
NOTIFICATION_CAPABILITIES = ("change-notification", "changelist-notification")
FRAMEWORK_CAPABILITIES = ("framework-notification",)
PUSH_SCHEMES = ("mqtt", "mqtts", "ws", "wss")
RESOURCESYNC_REL = "resourcesync"
ROBOTS_MAX_BYTES = 512 * 1024  # Google's robots.txt limit is 500 KiB; anything bigger is not one
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})


# --- results ------------------------------------------------------------------


class Via(enum.StrEnum):
    """How a URL came to be fetched; shown in results and error messages."""

    GIVEN = "given URL"
    WELL_KNOWN = "well-known URI"
    ROBOTS = "robots.txt"
    SITEMAP = "robots.txt Sitemap"
    LINK_HEADER = "HTTP Link header"
    HTML_LINK = "HTML link"
    SOURCE_DESCRIPTION = "Source Description Index entry"
    CAPABILITY_LIST = "Source Description entry"
    UP = "up link"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One URL considered during discovery and what came of it."""

    url: str
    via: Via
    outcome: str

    def __str__(self) -> str:
        return f"{self.via} {self.url}: {self.outcome}"


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


@dataclass(slots=True)
class SourceInfo:
    """What discovery found.

    ``source_description_url`` is the Source Description that was read, or,
    when discovery started below it, the ``up`` link of the first Capability
    List (advertised, not fetched); ``None`` if neither exists.  ``attempts``
    is the log of every URL considered, for operators.
    """

    source_description_url: str | None
    capability_lists: list[CapabilityListInfo]
    attempts: list[Attempt] = field(default_factory=list)

    def capability_list(self, url: str) -> CapabilityListInfo | None:
        return next((info for info in self.capability_lists if info.url == url), None)


# --- pure helpers ---------------------------------------------------------------


def well_known_url(url: str) -> str:
    """The Source Description's well-known URI on ``url``'s origin."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{WELL_KNOWN_PATH}"


def robots_url(url: str) -> str:
    """``/robots.txt`` on ``url``'s origin."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/robots.txt"


def links_from_headers(
    headers: Mapping[str, str], url: str, rel: str = RESOURCESYNC_REL
) -> list[str]:
    """Targets of ``Link`` headers with relation ``rel``, resolved against ``url``.

    ``headers`` maps names to values; repeated ``Link`` headers must be joined
    with commas (as :class:`rsnotify.fetch.FetchResult` does).  Links whose
    ``anchor`` names another resource are about that resource, not this one,
    and are ignored (RFC 8288 section 3.2).
    """
    found: list[str] = []
    base = urldefrag(url).url
    for name, value in headers.items():
        if name.lower() != "link":
            continue
        for target, params in parse_link_header(value):
            if not has_rel(params, rel):
                continue
            anchor = params.get("anchor")
            if anchor is not None and urldefrag(urljoin(url, anchor)).url != base:
                continue
            _add(found, urljoin(url, target))
    return found


class _LinkCollector(HTMLParser):
    """Collects ``<base href>`` and ``<link rel=... href=...>`` up to ``<body>``."""

    def __init__(self, rel: str):
        super().__init__(convert_charrefs=True)
        self.rel = rel.lower()
        self.base: str | None = None
        self.hrefs: list[str] = []
        self.done = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.done:
            return
        if tag == "body":
            self.done = True
            return
        values = {name: value or "" for name, value in attrs}
        if tag == "base" and self.base is None and values.get("href"):
            self.base = values["href"].strip()
        elif tag == "link" and self.rel in values.get("rel", "").lower().split():
            href = values.get("href", "").strip()
            if href:
                self.hrefs.append(href)


def links_from_html(
    body: bytes,
    url: str,
    rel: str = RESOURCESYNC_REL,
    *,
    encoding: str | None = None,
    chunk_size: int = 65536,
) -> list[str]:
    """``<link rel="resourcesync">`` targets of an HTML page, resolved like a browser would.

    Relative hrefs resolve against ``<base href>`` (itself resolved against
    ``url``) when the page has one.  The links belong in ``<head>``, so parsing
    stops at ``<body>``: a large page costs only its head.  Undecodable bytes
    are replaced; URLs are ASCII in practice.
    """
    text = _decode(body, encoding)
    collector = _LinkCollector(rel)
    for start in range(0, len(text), chunk_size):
        collector.feed(text[start : start + chunk_size])
        if collector.done:
            break
    base = urljoin(url, collector.base) if collector.base else url
    found: list[str] = []
    for href in collector.hrefs:
        _add(found, urljoin(base, href))
    return found


def sitemaps_from_robots(body: bytes, url: str) -> list[str]:
    """``Sitemap:`` directives of a robots.txt, in order, without duplicates.

    The directive is case-insensitive and independent of ``User-agent``
    groups; ``#`` starts a comment.  Values should be absolute, but relative
    ones are resolved against ``url`` rather than dropped.
    """
    found: list[str] = []
    for line in _decode(body, None).splitlines():
        content = line.split("#", 1)[0]
        name, sep, value = content.partition(":")
        if sep and name.strip().lower() == "sitemap" and value.strip():
            _add(found, urljoin(url, value.strip()))
    return found


def _decode(body: bytes, encoding: str | None) -> str:
    if encoding:
        try:
            return body.decode(encoding, errors="replace")
        except LookupError:
            pass
    try:
        return body.decode("utf-8-sig")
    except UnicodeDecodeError:
        return body.decode("latin-1")


def _add(found: list[str], url: str) -> None:
    if url not in found:
        found.append(url)


class Role(enum.Enum):
    """Where a document sits in the hierarchy of Figure 4, seen from discovery."""

    SOURCE_DESCRIPTION = "Source Description"
    SOURCE_DESCRIPTION_INDEX = "Source Description Index"
    CAPABILITY_LIST = "Capability List"
    BELOW_CAPABILITY_LIST = "document below a Capability List"


def classify(document: Document) -> Role:
    """What discovery does with a document: descend (Source Description), stop, or go up."""
    if isinstance(document, SourceDescription):
        return Role.SOURCE_DESCRIPTION
    if isinstance(document, SourceDescriptionIndex):
        return Role.SOURCE_DESCRIPTION_INDEX
    if isinstance(document, CapabilityList):
        return Role.CAPABILITY_LIST
    return Role.BELOW_CAPABILITY_LIST


def read_document(body: bytes, *, max_bytes: int = MAX_DOCUMENT_BYTES) -> Document:
    """Parse a ResourceSync document for discovery, or raise a DocumentError.

    Only the header is read for documents below a Capability List (discovery
    needs their ``up`` link, not their possibly 50,000 entries), and order is
    not checked: discovery is not the place to reject a sloppy Change List.
    """
    reader = DocumentReader(bytes(body), limits=Limits(max_bytes=max_bytes), allow_unordered=True)
    document = reader.header
    if classify(document) is not Role.BELOW_CAPABILITY_LIST:
        document.entries = list(reader)
    return document


def _looks_like_html(content_type: str, body: bytes) -> bool:
    if content_type in _HTML_TYPES:
        return True
    if content_type and content_type not in ("text/plain", "application/octet-stream"):
        return False
    head = body[:512].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return head.startswith((b"<!doctype html", b"<html"))


# --- the state machine ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """A URL the machine wants fetched; hand it back with the response."""

    url: str
    via: Via
    hops: int = 0
    max_bytes: int = MAX_DOCUMENT_BYTES


class DiscoveryMachine:
    """Sans-I/O discovery: ``next_request()`` / ``receive()`` or ``fail()``, then ``result()``.

    Requests are handed out one at a time, in the order the rules above give;
    after each, call :meth:`receive` with the final URL, headers (lower-cased
    names, repeated headers comma-joined) and body of a 2xx response, or
    :meth:`fail` with a reason.  When ``next_request()`` returns ``None``,
    :meth:`result` gives the :class:`SourceInfo` or raises DiscoveryError.
    """

    def __init__(
        self,
        url: str,
        *,
        max_hops: int = 4,
        max_fetches: int = 64,
        max_bytes: int = MAX_DOCUMENT_BYTES,
    ):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise DiscoveryError(f"cannot discover from {url!r}: not an absolute http(s) URL")
        self.start_url = url
        self.max_hops = max_hops
        self.max_fetches = max_fetches
        self.max_bytes = max_bytes
        self.attempts: list[Attempt] = []
        self._queue: deque[Request] = deque()
        self._seen: set[str] = set()
        self._fetches = 0
        self._fallbacks: deque[Request] = deque(
            [
                Request(well_known_url(url), Via.WELL_KNOWN, max_bytes=max_bytes),
                Request(robots_url(url), Via.ROBOTS, max_bytes=ROBOTS_MAX_BYTES),
            ]
        )
        self._source_description: str | None = None
        self._advertised_source_description: str | None = None
        self._capability_lists: dict[str, CapabilityListInfo] = {}
        self._enqueue(Request(url, Via.GIVEN, max_bytes=max_bytes))

    # -- driving ---------------------------------------------------------------

    def next_request(self) -> Request | None:
        """The next URL to fetch, or None when discovery is over."""
        while True:
            if self._queue:
                if self._fetches >= self.max_fetches:
                    for request in self._queue:
                        self._note(request, f"not fetched: limit of {self.max_fetches} fetches")
                    self._queue.clear()
                    return None
                self._fetches += 1
                return self._queue.popleft()
            if self._capability_lists or not self._fallbacks:
                return None
            self._enqueue(self._fallbacks.popleft())

    def fail(self, request: Request, reason: str) -> None:
        """The fetch of ``request`` failed (unreachable, HTTP error, too large...)."""
        self._note(request, reason)

    def receive(
        self, request: Request, *, final_url: str, headers: Mapping[str, str], body: bytes
    ) -> None:
        """A 2xx response for ``request``; ``final_url`` is the URL after redirects."""
        if request.via is Via.ROBOTS:
            self._robots(request, final_url, body)
            return
        try:
            document = read_document(body, max_bytes=request.max_bytes)
        except DocumentError as exc:
            if request.via is Via.GIVEN:
                self._resource(request, final_url, headers, body, exc)
            else:
                self._note(request, f"not a ResourceSync document ({exc})")
            return
        self._document(request, final_url, document)

    def result(self) -> SourceInfo:
        """What was found; raises DiscoveryError, listing every attempt, if nothing was."""
        if not self._capability_lists:
            tried = "\n".join(f"  - {attempt}" for attempt in self.attempts)
            raise DiscoveryError(
                f"no ResourceSync Capability List found from {self.start_url}; tried:\n{tried}"
            )
        return SourceInfo(
            source_description_url=self._source_description or self._advertised_source_description,
            capability_lists=list(self._capability_lists.values()),
            attempts=list(self.attempts),
        )

    # -- rules -------------------------------------------------------------------

    def _enqueue(self, request: Request) -> None:
        key = urldefrag(request.url).url
        if key in self._seen:
            loop = " (up-link loop)" if request.via is Via.UP else ""
            self._note(request, f"already visited, not fetched again{loop}")
            return
        self._seen.add(key)
        self._queue.append(request)

    def _note(self, request: Request, outcome: str) -> None:
        self.attempts.append(Attempt(request.url, request.via, outcome))

    def _follow(self, via: Via, hops: int, urls: list[str]) -> None:
        for url in urls:
            self._enqueue(Request(url, via, hops=hops, max_bytes=self.max_bytes))

    def _robots(self, request: Request, final_url: str, body: bytes) -> None:
        sitemaps = sitemaps_from_robots(body, final_url)
        self._note(request, f"{len(sitemaps)} Sitemap directive(s)")
        self._follow(Via.SITEMAP, 0, sitemaps)

    def _resource(
        self,
        request: Request,
        final_url: str,
        headers: Mapping[str, str],
        body: bytes,
        not_a_document: DocumentError,
    ) -> None:
        """The given URL is not a ResourceSync document: look for links to one."""
        from_header = links_from_headers(headers, final_url)
        content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        from_html: list[str] = []
        if _looks_like_html(content_type, body):
            from_html = links_from_html(body, final_url, encoding=_charset(headers))
        if not from_header and not from_html:
            self._note(
                request,
                f'not a ResourceSync document and no rel="resourcesync" link ({not_a_document})',
            )
            return
        self._note(
            request,
            f"{len(from_header)} Link header(s) and {len(from_html)} HTML link(s) "
            'with rel="resourcesync"',
        )
        self._follow(Via.LINK_HEADER, 0, from_header)
        self._follow(Via.HTML_LINK, 0, from_html)

    def _document(self, request: Request, final_url: str, document: Document) -> None:
        role = classify(document)
        if role is Role.SOURCE_DESCRIPTION:
            assert isinstance(document, SourceDescription)
            lists = [urljoin(final_url, loc) for loc in document.capability_lists]
            self._note(request, f"Source Description with {len(lists)} Capability List(s)")
            if self._source_description is None:
                self._source_description = request.url
            self._follow(Via.CAPABILITY_LIST, 0, lists)
        elif role is Role.SOURCE_DESCRIPTION_INDEX:
            descriptions = [urljoin(final_url, entry.loc) for entry in document.entries]
            self._note(request, f"Source Description Index with {len(descriptions)} entries")
            self._follow(Via.SOURCE_DESCRIPTION, request.hops, descriptions)
        elif role is Role.CAPABILITY_LIST:
            assert isinstance(document, CapabilityList)
            info = CapabilityListInfo.from_document(request.url, document)
            self._capability_lists.setdefault(request.url, info)
            self._note(
                request,
                f"Capability List ({', '.join(info.capabilities) or 'no capabilities'}; "
                f"{len(info.channels)} push channel(s), {len(info.websub)} WebSub channel(s))",
            )
            if document.up and self._advertised_source_description is None:
                self._advertised_source_description = urljoin(final_url, document.up)
        else:
            self._up(request, final_url, document)

    def _up(self, request: Request, final_url: str, document: Document) -> None:
        """A document below a Capability List: climb its ``up`` (or ``index``) link."""
        what = f"{document.capability or 'unknown'} ({document.root.value})"
        target = document.up or document.index
        if target is None:
            self._note(request, f"{what} without an up link")
            return
        if request.hops >= self.max_hops:
            self._note(request, f"{what}; up link not followed: more than {self.max_hops} hops")
            return
        relation = "up" if document.up else "index"
        self._note(request, f"{what}, following its {relation} link")
        self._follow(Via.UP, request.hops + 1, [urljoin(final_url, target)])


def _charset(headers: Mapping[str, str]) -> str | None:
    for param in headers.get("content-type", "").split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"') or None
    return None


# --- the I/O adapters ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Response:
    """A 2xx answer to a :class:`Request`: URL after redirects, headers (lower-case), body."""

    final_url: str
    headers: Mapping[str, str]
    body: bytes


#: Reads one :class:`Request`; raises :class:`~rsnotify.errors.FetchError` when it cannot.
Read = Callable[[Request], Awaitable[Response]]


async def drive(machine: DiscoveryMachine, read: Read) -> SourceInfo:
    """Run ``machine`` to its result, reading each request with ``read``.

    The one discovery loop: over HTTP (:class:`Discoverer`) or over any other
    way of reading the Source's documents (the publisher's local directory).
    """
    while (request := machine.next_request()) is not None:
        try:
            response = await read(request)
        except FetchError as exc:
            machine.fail(request, _reason(exc))
            continue
        machine.receive(
            request, final_url=response.final_url, headers=response.headers, body=response.body
        )
    return machine.result()


class Discoverer:
    """Runs a :class:`DiscoveryMachine` over a shared :class:`~rsnotify.fetch.Fetcher`."""

    def __init__(
        self,
        fetcher: Fetcher,
        *,
        max_hops: int = 4,
        max_fetches: int = 64,
        max_bytes: int = MAX_DOCUMENT_BYTES,
        timeout: float = 30.0,
    ):
        self.fetcher = fetcher
        self.max_hops = max_hops
        self.max_fetches = max_fetches
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def discover(self, url: str) -> SourceInfo:
        machine = DiscoveryMachine(
            url, max_hops=self.max_hops, max_fetches=self.max_fetches, max_bytes=self.max_bytes
        )
        return await drive(machine, self._read)

    async def _read(self, request: Request) -> Response:
        response = await self.fetcher.get(
            request.url, max_bytes=request.max_bytes, timeout=self.timeout
        )
        return Response(response.final_url, response.headers, response.body)


async def discover(
    url: str,
    fetcher: Fetcher,
    *,
    max_hops: int = 4,
    max_fetches: int = 64,
    max_bytes: int = MAX_DOCUMENT_BYTES,
    timeout: float = 30.0,
) -> SourceInfo:
    """Discover the Capability Lists reachable from ``url``; see :class:`Discoverer`."""
    discoverer = Discoverer(
        fetcher, max_hops=max_hops, max_fetches=max_fetches, max_bytes=max_bytes, timeout=timeout
    )
    return await discoverer.discover(url)


def _reason(exc: FetchError) -> str:
    """The FetchError message without its leading URL (the Attempt already names it)."""
    text = str(exc)
    prefix = f"{exc.url}: "
    return text[len(prefix) :] if text.startswith(prefix) else text
