"""Discovery as a sans-I/O state machine, and the loop that drives it.

:class:`DiscoveryMachine` says which URL to fetch next and is told what came
back, so every rule is testable without a network; :func:`drive` runs it with
any reader (:class:`Discoverer` reads over HTTP, the publisher reads a
directory Source's files).  Loops are impossible by construction: no URL is
fetched twice, ``up`` chains are capped (``max_hops``) and so is the total
number of fetches.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urldefrag, urljoin, urlsplit

from ..errors import DiscoveryError, DocumentError, FetchError
from ..model import CapabilityList, Document, SourceDescription
from ..sitemap import MAX_DOCUMENT_BYTES
from .channels import CapabilityListInfo
from .pages import (
    ROBOTS_MAX_BYTES,
    Role,
    charset,
    classify,
    links_from_headers,
    links_from_html,
    looks_like_html,
    read_document,
    robots_url,
    sitemaps_from_robots,
    well_known_url,
)

if TYPE_CHECKING:  # the HTTP client is the caller's; discovery itself needs none
    from ..fetch import Fetcher

__all__ = [
    "Attempt",
    "Discoverer",
    "DiscoveryMachine",
    "Read",
    "Request",
    "Response",
    "SourceInfo",
    "Via",
    "discover",
    "drive",
]


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
        if looks_like_html(content_type, body):
            from_html = links_from_html(body, final_url, encoding=charset(headers))
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
