"""Parsing leaves no garbage cycle, and reused parsers read each document as fresh ones do.

A fresh lxml pull parser per document was a reference cycle per document
(rsnotify.pullparsers): the collector then paused the publisher's event loop
every ~2 s at 200 changes/s.  These tests hold the parse to zero cyclic
garbage and hold the reused parsers to the same results as new ones, after
readers that stopped early, failed on hostile input, interleaved in one
thread or ran in other threads.
"""

from __future__ import annotations

import gc
import io
import threading
from collections.abc import Iterator

import pytest
from lxml import etree

from rsnotify import sitemap
from rsnotify.errors import DocumentError
from rsnotify.pullparsers import ParserPool

HEAD = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
    b'xmlns:rs="http://www.openarchives.org/rs/terms/">\n'
    b'<rs:ln rel="up" href="http://example.com/capabilitylist.xml"/>\n'
)


def change_list(tag: str, n: int) -> bytes:
    entries = b"".join(
        b"<url><loc>http://example.com/%s/%d</loc>"
        b'<rs:md change="updated" datetime="2026-01-01T00:%02d:%02dZ"/></url>\n'
        % (tag.encode(), i, i // 60, i % 60)
        for i in range(n)
    )
    return (
        HEAD + b'<rs:md capability="changelist" from="2026-01-01T00:00:00Z"/>\n' + entries
    ) + b"</urlset>\n"


def index(tag: str, n: int) -> bytes:
    entries = b"".join(
        b"<sitemap><loc>http://example.com/%s/list%d.xml</loc></sitemap>\n" % (tag.encode(), i)
        for i in range(n)
    )
    return (
        b'<?xml version="1.0" encoding="UTF-8"?>\n'
        b'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
        b'xmlns:rs="http://www.openarchives.org/rs/terms/">\n'
        b'<rs:ln rel="up" href="http://example.com/capabilitylist.xml"/>\n'
        b'<rs:md capability="changelist" from="2026-01-01T00:00:00Z"/>\n' + entries
    ) + b"</sitemapindex>\n"


def locs(source: bytes | io.BytesIO) -> list[str]:
    return [entry.loc for entry in sitemap.iter_entries(source)]


def cyclic_garbage(work: Iterator[object] | None = None, *, runs: int = 20) -> int:
    """Objects the cycle collector finds after ``runs`` parses of a few documents."""
    documents = [change_list("a", 50), index("b", 10), change_list("c", 1200)]
    for doc in documents:  # the parsers of this thread are made (once) here
        sitemap.parse(doc)
    gc.collect()
    gc.disable()
    try:
        for _ in range(runs):
            for doc in documents:
                sitemap.parse(doc)
                locs(io.BytesIO(doc))  # streamed in chunks, not from bytes
        return gc.collect()
    finally:
        gc.enable()


def test_parsing_documents_leaves_no_garbage_cycle() -> None:
    # A fresh parser per document left ~440 objects a parse here.
    assert cyclic_garbage() == 0


def test_documents_read_one_after_another_read_as_if_alone() -> None:
    # The root parser stops at the root's start tag with the rest of its first
    # chunk's events unread: the next document must not begin with them.
    docs = [change_list("a", 3), index("b", 2), change_list("c", 1200), index("d", 1)]
    alone = [[entry.loc for entry in sitemap.parse(doc).entries] for doc in docs]
    for _ in range(3):
        assert [[entry.loc for entry in sitemap.parse(doc).entries] for doc in docs] == alone
    assert alone[1] == [f"http://example.com/b/list{i}.xml" for i in range(2)]
    assert type(sitemap.parse(docs[1])).__name__ == "ChangeListIndex"
    assert type(sitemap.parse(docs[0])).__name__ == "ChangeList"


def test_a_reader_stopped_early_or_failed_leaves_the_next_one_unharmed() -> None:
    doc = change_list("a", 2000)
    stopped = sitemap.iter_entries(io.BytesIO(doc))
    assert next(stopped).loc == "http://example.com/a/0"
    stopped.close()  # abandoned half way: its parser is not given back
    broken = HEAD + b'<rs:md capability="changelist"/><url><loc>http://x/1</loc></urlset>'
    with pytest.raises(DocumentError):
        sitemap.parse(broken)
    with pytest.raises(DocumentError):
        sitemap.parse(b'<!DOCTYPE x [<!ENTITY a "b">]>' + change_list("e", 1))
    assert locs(change_list("b", 3)) == [f"http://example.com/b/{i}" for i in range(3)]
    assert locs(doc) == [f"http://example.com/a/{i}" for i in range(2000)]


def test_readers_interleaved_in_one_thread_each_read_their_own_document() -> None:
    first = sitemap.iter_entries(io.BytesIO(change_list("a", 3000)))
    second = sitemap.iter_entries(io.BytesIO(change_list("b", 3000)))
    read: list[tuple[str, str]] = []
    for a, b in zip(first, second, strict=True):
        read.append((a.loc, b.loc))
    assert read == [(f"http://example.com/a/{i}", f"http://example.com/b/{i}") for i in range(3000)]


def test_readers_in_several_threads_each_read_their_own_document() -> None:
    results: dict[int, list[list[str]]] = {}
    failures: list[BaseException] = []

    def work(k: int) -> None:
        try:
            results[k] = [locs(change_list(f"t{k}", 300 + k)) for _ in range(10)]
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures
    for k in range(4):
        want = [f"http://example.com/t{k}/{i}" for i in range(300 + k)]
        assert results[k] == [want] * 10


def test_the_pool_lends_a_parser_to_one_reader_at_a_time_and_keeps_a_few() -> None:
    made: list[object] = []

    def factory() -> object:
        parser = etree.XMLPullParser(events=("end",))
        made.append(parser)
        return parser

    pool = ParserPool(factory, keep=2)
    a, b, c = pool.take(), pool.take(), pool.take()
    assert len({id(a), id(b), id(c)}) == 3  # lent parsers are never lent twice
    for parser in (a, b, c):
        parser.feed(b"<r/>")
        parser.close()
        pool.give(parser)
    assert len(made) == 3
    assert {id(pool.take()), id(pool.take())} <= {id(a), id(b), id(c)}  # kept: 2
    assert len(made) == 3
    pool.take()
    assert len(made) == 4  # only `keep` were kept

    lent: list[object] = []
    elsewhere = threading.Thread(target=lambda: lent.append(pool.take()))
    elsewhere.start()
    elsewhere.join()
    assert lent == [made[-1]] and len(made) == 5  # each thread lends from its own


def test_events_a_document_left_unread_never_reach_the_next_one() -> None:
    pool = ParserPool(lambda: etree.XMLPullParser(events=("start",)))
    parser = pool.take()
    parser.feed(b"<a><b/><c/><d>")
    assert next(iter(parser.read_events()))[1].tag == "a"
    with pytest.raises(etree.XMLSyntaxError):
        parser.close()
    pool.give(parser)
    again = pool.take()
    assert again is parser
    again.feed(b"<x><y/></x>")
    assert [element.tag for _event, element in again.read_events()] == ["x", "y"]
