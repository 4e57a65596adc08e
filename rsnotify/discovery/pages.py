"""What one fetched response says about where the Capability Lists are (pure).

The routes of Z39.99 section 6.3: the well-known URI (6.3.2), a resource's
``Link`` header or HTML ``<link rel="resourcesync">`` (6.3.3), robots.txt
``Sitemap:`` directives (6.3.4); and what kind of ResourceSync document a
body is.  Bodies are parsed only with :mod:`rsnotify.sitemap` (no DTDs, no
entities, no network) and :mod:`html.parser` (no network, stops at
``<body>``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from html.parser import HTMLParser
from urllib.parse import urldefrag, urljoin, urlsplit

from ..links import has_rel, parse_link_header
from ..model import CapabilityList, Document, SourceDescription, SourceDescriptionIndex
from ..sitemap import MAX_DOCUMENT_BYTES, DocumentReader, Limits

__all__ = [
    "RESOURCESYNC_REL",
    "ROBOTS_MAX_BYTES",
    "WELL_KNOWN_PATH",
    "Role",
    "charset",
    "classify",
    "links_from_headers",
    "links_from_html",
    "looks_like_html",
    "read_document",
    "robots_url",
    "sitemaps_from_robots",
    "well_known_url",
]

WELL_KNOWN_PATH = "/.well-known/resourcesync"
RESOURCESYNC_REL = "resourcesync"
ROBOTS_MAX_BYTES = 512 * 1024  # Google's robots.txt limit is 500 KiB; anything bigger is not one
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})


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


def looks_like_html(content_type: str, body: bytes) -> bool:
    if content_type in _HTML_TYPES:
        return True
    if content_type and content_type not in ("text/plain", "application/octet-stream"):
        return False
    head = body[:512].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return head.startswith((b"<!doctype html", b"<html"))


def charset(headers: Mapping[str, str]) -> str | None:
    for param in headers.get("content-type", "").split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"') or None
    return None
