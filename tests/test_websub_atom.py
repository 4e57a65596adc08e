"""The hub's Atom feed (RFC 4287) and its RFC 5005 archive pages, validated with RELAX NG.

A real hub on a real SQLite log, read over HTTP.  Every document is checked
against the Atom RELAX NG schema of RFC 4287 Appendix B
(``tests/data/atom.rng``) with lxml, and the archive links are followed from
the subscription document back to the oldest retained page: together the
pages hold every retained notification exactly once, in order.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from lxml import etree

from rsnotify.envelope import Notification, to_json
from rsnotify.log import Retention
from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.model import ChangeType
from rsnotify.transport import atom
from rsnotify.transport.websub import WebSubHub
from rsnotify.transport.websubstore import MemoryStore

SCHEMA = etree.RelaxNG(etree.parse(str(Path(__file__).parent / "data" / "atom.rng")))
A = "{http://www.w3.org/2005/Atom}"
FH = "{http://purl.org/syndication/history/1.0}"
CAPABILITY_LIST = "http://source.test/dataset/capabilitylist.xml"
COLLECTION = "source.test-dataset-capabilitylist"
PARSER = etree.XMLParser(resolve_entities=False, no_network=True)


def payloads(first: int, count: int) -> list[bytes]:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    changes = [ChangeType.CREATED, ChangeType.UPDATED, ChangeType.DELETED]
    return [
        to_json(
            Notification(
                collection=COLLECTION,
                seq=seq,
                capabilitylist=CAPABILITY_LIST,
                changelist="http://source.test/dataset/changelist.xml",
                loc=f"http://source.test/dataset/r{seq % 17}.txt?a=1&b=<2>",
                change=changes[seq % 3],
                datetime=start + timedelta(seconds=seq),
                hash="md5:1B2M2Y8AsgTpgAmY7PhCfg==",
                length=seq,
                type="text/plain",
                detected=start + timedelta(seconds=seq, milliseconds=5),
            )
        )
        for seq in range(first, first + count)
    ]


def fetch(url: str) -> etree._Element:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("application/atom+xml")
        document = etree.fromstring(response.read(), PARSER)
    assert SCHEMA.validate(document), f"{url}: {SCHEMA.error_log}"
    return document


async def get(url: str) -> etree._Element:
    return await asyncio.to_thread(fetch, url)


def link(document: etree._Element, rel: str) -> str | None:
    for element in document.findall(A + "link"):
        if element.get("rel") == rel:
            href: str = element.get("href")
            return href
    return None


def seqs(document: etree._Element) -> list[int]:
    return [int(e.findtext(A + "id").rsplit("-", 1)[1]) for e in document.findall(A + "entry")]


async def test_feed_pages_validate_and_hold_every_retained_notification_once(
    tmp_path: Path,
) -> None:
    log = SQLiteLog(tmp_path / "log.sqlite3")
    await log.register(COLLECTION, CAPABILITY_LIST)
    head = await log.append(COLLECTION, payloads(1, 250), expected_head=0, checkpoint="{}")
    hub = WebSubHub(log, MemoryStore(), feed_page=100)
    await hub.start()
    try:
        feed_url = hub.feed_url(COLLECTION)
        current = await get(feed_url)
        assert seqs(current) == list(range(250, 200, -1)), "the open page, newest first"
        assert link(current, "self") == feed_url
        assert link(current, "current") == feed_url
        assert link(current, "hub") == hub.url
        assert current.find(FH + "archive") is None
        assert link(current, "prev-archive") == f"{feed_url}?page=2"

        page2 = await get(f"{feed_url}?page=2")
        page1 = await get(link(page2, "prev-archive") or "")
        assert seqs(page2) == list(range(200, 100, -1))
        assert seqs(page1) == list(range(100, 0, -1))
        for page in (page1, page2):
            assert page.find(FH + "archive") is not None
            assert link(page, "current") == feed_url
        assert link(page1, "next-archive") == f"{feed_url}?page=2"
        assert link(page2, "next-archive") is None  # page 3 is the open page, not an archive
        assert link(page1, "prev-archive") is None

        entry = page1.find(A + "entry")
        assert entry is not None
        assert entry.find(A + "link[@rel='alternate']").get("href").endswith("?a=1&b=<2>")
        content = entry.find(A + "content")
        assert content.get("type") == "application/xml"
        (urlset,) = list(content)
        assert urlset.tag == "{http://www.sitemaps.org/schemas/sitemap/0.9}urlset"

        # Retention trims the oldest 120: page 1 is gone and no longer linked to.
        await log.trim(COLLECTION, Retention(max_len=130, max_age_s=None), now_ms=0)
        with pytest.raises(urllib.error.HTTPError) as gone:
            await get(f"{feed_url}?page=1")
        assert gone.value.code == 404
        page2 = await get(f"{feed_url}?page=2")
        assert seqs(page2) == list(range(200, 120, -1))
        assert link(page2, "prev-archive") is None

        # A full last page: the subscription document is empty but still valid.
        head = await log.append(COLLECTION, payloads(251, 50), expected_head=head, checkpoint="{}")
        assert head == 300
        current = await get(feed_url)
        assert seqs(current) == []
        assert link(current, "prev-archive") == f"{feed_url}?page=3"
        assert seqs(await get(f"{feed_url}?page=3")) == list(range(300, 200, -1))
        for bad in ("?page=0", "?page=x"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                await get(feed_url + bad)
            assert refused.value.code == 400
        with pytest.raises(urllib.error.HTTPError) as beyond:
            await get(f"{feed_url}?page=5")
        assert beyond.value.code == 404
    finally:
        await hub.stop()
        await log.close()


def test_schema_rejects_what_rfc_4287_forbids() -> None:
    """The transcribed schema is not vacuous: a feed without an id, or a bad date, fails."""
    good = etree.fromstring(
        b'<feed xmlns="http://www.w3.org/2005/Atom"><id>urn:x</id><title>t</title>'
        b"<updated>2026-01-01T00:00:00Z</updated></feed>"
    )
    assert SCHEMA.validate(good)
    no_id = etree.fromstring(
        b'<feed xmlns="http://www.w3.org/2005/Atom"><title>t</title>'
        b"<updated>2026-01-01T00:00:00Z</updated></feed>"
    )
    bad_date = etree.fromstring(
        b'<feed xmlns="http://www.w3.org/2005/Atom"><id>urn:x</id><title>t</title>'
        b"<updated>yesterday</updated></feed>"
    )
    assert not SCHEMA.validate(no_id)
    assert not SCHEMA.validate(bad_date)


def test_page_windows() -> None:
    assert atom.page_window(0, None, 100) == atom.Window(1, 1, 0, True, 100, 0)
    assert atom.page_window(250, None, 100) == atom.Window(3, 201, 250, True, 100, 250)
    assert atom.page_window(250, 3, 100) == atom.page_window(250, None, 100)
    assert atom.page_window(250, 2, 100) == atom.Window(2, 101, 200, False, 100, 250)
    assert atom.page_window(250, 4, 100) is None
    assert atom.page_window(300, None, 100) == atom.Window(4, 301, 300, True, 100, 300)
