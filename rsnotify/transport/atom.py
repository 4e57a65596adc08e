"""Atom feed of a collection's notifications (RFC 4287), paged as RFC 5005 archives (pure).

Served by the WebSub hub at ``<hub>/<collection>/feed.atom``, so feed
readers -- and WebSub's usual subscribers, who follow feeds -- can follow a
Source too.  Paging mirrors the Change List Index: the log's sequence numbers
are cut into fixed pages of :data:`PAGE_SIZE`; page ``k`` holds seqs
``(k-1)*P+1 .. k*P``.

* The **subscription document** (``feed.atom``, RFC 5005 section 2) is the
  open page: the seqs after the last full page, newest first, with
  ``rel="self"``, ``rel="current"``, ``rel="hub"`` (WebSub discovery of this
  hub) and ``rel="prev-archive"`` to the last full page.
* **Archive documents** (``feed.atom?page=k``, RFC 5005 section 4) are the
  full pages; they never change (a seq is never reused), carry
  ``<fh:archive/>``, ``rel="current"``, and ``prev-archive`` /
  ``next-archive`` to their neighbours.  Pages wholly before the log's
  retention are gone (404) and not linked to.

Each entry is one notification: ``id`` ``<Capability List URI>#rsnotify-seq-N``
(stable, unique per collection), ``updated`` the change time, a
``rel="alternate"`` link to the resource, the change type as a category, and
the Change Notification XML itself as ``content type="application/xml"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from lxml import etree

from .. import envelope, w3cdt
from ..log import LogRecord

ATOM_NS = "http://www.w3.org/2005/Atom"
HISTORY_NS = "http://purl.org/syndication/history/1.0"
CHANGE_SCHEME = "http://www.openarchives.org/rs/terms/change"
PAGE_SIZE = 100
_A = f"{{{ATOM_NS}}}"
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)


@dataclass(frozen=True, slots=True)
class Window:
    """Which seqs one feed document holds."""

    page: int
    first: int
    last: int
    current: bool  # the subscription document (open page)
    page_size: int
    head: int


def page_window(head: int, page: int | None, page_size: int = PAGE_SIZE) -> Window | None:
    """The window for ``?page=`` (None: the subscription document); None if no such page."""
    open_page = head // page_size + 1
    if page is None or page == open_page:
        first = (open_page - 1) * page_size + 1
        return Window(open_page, first, head, True, page_size, head)
    if page < 1 or page > open_page:
        return None
    first = (page - 1) * page_size + 1
    return Window(page, first, page * page_size, False, page_size, head)


def _link(parent: etree._Element, rel: str, href: str, media: str | None = None) -> None:
    attrs = {"rel": rel, "href": href}
    if media:
        attrs["type"] = media
    etree.SubElement(parent, _A + "link", attrs)


def _text(parent: etree._Element, name: str, value: str) -> etree._Element:
    element = etree.SubElement(parent, _A + name)
    element.text = value
    return element


def _stamp(ms: int) -> str:
    return w3cdt.format(datetime.fromtimestamp(ms / 1000, UTC))


def _entry(feed: etree._Element, record: LogRecord) -> None:
    notification = envelope.from_json(record.data, max_bytes=max(len(record.data), 1))
    entry = etree.SubElement(feed, _A + "entry")
    _text(entry, "id", f"{notification.capabilitylist}#rsnotify-seq-{record.seq}")
    _text(entry, "title", f"{notification.change.value} {notification.loc}")
    _text(entry, "updated", w3cdt.format(notification.datetime))
    if notification.detected is not None:
        _text(entry, "published", w3cdt.format(notification.detected))
    _link(entry, "alternate", notification.loc, notification.type)
    _link(entry, "via", notification.changelist, "application/xml")
    etree.SubElement(
        entry,
        _A + "category",
        {"term": notification.change.value, "scheme": CHANGE_SCHEME},
    )
    content = etree.SubElement(entry, _A + "content", {"type": "application/xml"})
    content.append(etree.fromstring(envelope.to_xml(notification), _PARSER))


def render_delivery(
    *,
    collection: str,
    capability_list: str,
    records: Sequence[LogRecord],
    feed_url: str,
    hub_url: str,
) -> bytes:
    """What a subscriber of ``feed.atom`` is POSTed: a feed of just the new entries.

    WebSub 7: the hub sends the topic's content in its own content type; for
    a feed that is Atom, holding the entries added since the last delivery.
    """
    first = records[0].seq if records else 1
    last = records[-1].seq if records else 0
    window = Window(0, first, last, True, max(1, last - first + 1), last)
    return render_feed(
        collection=collection,
        capability_list=capability_list,
        records=records,
        window=window,
        earliest=first,
        feed_url=feed_url,
        hub_url=hub_url,
    )


def render_feed(
    *,
    collection: str,
    capability_list: str,
    records: Sequence[LogRecord],
    window: Window,
    earliest: int,
    feed_url: str,
    hub_url: str,
) -> bytes:
    """One feed document: ``records`` are the retained seqs of ``window``, oldest first."""
    # None: the default namespace, as lxml spells it (lxml-stubs allows str keys only).
    feed = etree.Element(_A + "feed", nsmap={None: ATOM_NS, "fh": HISTORY_NS})  # type: ignore[dict-item]
    _text(feed, "id", f"{capability_list}#rsnotify-feed")
    title = f"Changes to {collection}"
    if not window.current:
        title += f" (seqs {window.first} to {window.last})"
    _text(feed, "title", title)
    newest = max((r.logged_ms for r in records), default=None)
    if newest is None:
        updated = w3cdt.now() if window.current else datetime.fromtimestamp(0, UTC)
        _text(feed, "updated", w3cdt.format(updated))
    else:
        _text(feed, "updated", _stamp(newest))
    author = etree.SubElement(feed, _A + "author")
    _text(author, "name", "rsnotify")
    _text(feed, "generator", "rsnotify")
    page_url = feed_url if window.current else f"{feed_url}?page={window.page}"
    _link(feed, "self", page_url, "application/atom+xml")
    _link(feed, "current", feed_url, "application/atom+xml")
    _link(feed, "hub", hub_url)
    _link(feed, "related", capability_list, "application/xml")
    size = window.page_size
    previous = window.page - 1
    if previous >= 1 and previous * size >= earliest:
        _link(feed, "prev-archive", f"{feed_url}?page={previous}", "application/atom+xml")
    if not window.current:
        etree.SubElement(feed, f"{{{HISTORY_NS}}}archive")
        following = window.page + 1
        if following * size <= window.head:
            _link(feed, "next-archive", f"{feed_url}?page={following}", "application/atom+xml")
    for record in sorted(records, key=lambda r: r.seq, reverse=True):
        _entry(feed, record)
    return etree.tostring(feed, xml_declaration=True, encoding="UTF-8")
