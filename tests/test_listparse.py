"""Change Lists parsed in a worker process: the same entries, the same errors, no list lost."""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rsnotify import sitemap
from rsnotify.changes import listparse
from rsnotify.errors import DocumentError, MalformedXML
from rsnotify.model import Capability, ChangeType, Document, Entry, Link, Root
from rsnotify.tracker import entry_digest

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _document(count: int = 300) -> bytes:
    entries = [
        Entry(
            loc=f"http://source.example/r/{i}",
            change=ChangeType.UPDATED if i % 3 else ChangeType.CREATED,
            datetime=T0 + timedelta(seconds=i),
            hash="md5:" + f"{i:032x}",
            length=i,
            type="text/plain",
            links=[Link(rel="duplicate", href=f"http://mirror.example/r/{i}", pri=1)]
            if i % 7 == 0
            else [],
        )
        for i in range(count)
    ]
    # One entry out of order: the reader counts it (read leniently) and warns.
    entries[10], entries[11] = entries[11], entries[10]
    document = Document(
        root=Root.URLSET, capability=Capability.CHANGELIST, from_=T0, entries=entries
    )
    return sitemap.serialize(document)


LENIENT = sitemap.Limits(lenient=frozenset({sitemap.Lenient.ORDER}))


def test_an_entry_pickles_as_itself_every_field_included() -> None:
    """Entry.__reduce__ lists the fields positionally: one out of place would move a value."""
    values: dict[str, Any] = {
        "loc": "http://s/a", "lastmod": T0, "changefreq": "daily",
        "change": ChangeType.DELETED, "datetime": T0 + timedelta(seconds=1), "hash": "md5:ab",
        "length": 7, "type": "text/plain", "path": "/a", "encoding": "gzip",
        "capability": "resourcelist", "at": T0 + timedelta(seconds=2),
        "completed": T0 + timedelta(seconds=3), "from_": T0 + timedelta(seconds=4),
        "until": T0 + timedelta(seconds=5), "links": [Link(rel="alternate", href="http://m/a")],
        "md_extra": {"x": "y"}, "line": 42,
    }  # fmt: skip
    assert set(values) == {f.name for f in fields(Entry)}
    entry = Entry(**values)
    copy = pickle.loads(pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL))
    assert copy == entry
    assert {name: getattr(copy, name) for name in values} == values  # line too (not compared)


async def test_the_worker_parses_what_a_thread_parses(
    parser_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = _document()
    expected = listparse.parse_list(body, LENIENT)
    assert expected.unordered and expected.warnings  # the document tests both
    here: list[int] = []

    class Recording(sitemap.DocumentReader):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            here.append(os.getpid())
            super().__init__(*args, **kwargs)

    # Patched in this process only: a parse in the worker does not see it.
    monkeypatch.setattr(sitemap, "DocumentReader", Recording)
    parsed = await listparse.parse_whole(body, LENIENT, digests=True)
    assert here == [], "parsed in this process, not in the worker"
    assert parsed.digests == [entry_digest(e) for e in expected.entries]
    assert replace(parsed, digests=None) == expected
    assert [e.line for e in parsed.entries] == [e.line for e in expected.entries]


async def test_a_refused_document_raises_the_same_error_from_the_worker(
    parser_process: None,
) -> None:
    body = _document()[:-200]  # truncated: not well-formed
    with pytest.raises(MalformedXML) as here:
        listparse.parse_list(body, LENIENT)
    with pytest.raises(MalformedXML) as there:
        await listparse.parse_whole(body, LENIENT)
    assert listparse.ready()  # an error in a document is not a failed worker
    mine, theirs = here.value, there.value
    assert isinstance(theirs, DocumentError)
    assert str(theirs) == str(mine)
    assert (theirs.reason, theirs.line, theirs.element, theirs.rule) == (
        mine.reason, mine.line, mine.element, mine.rule,
    )  # fmt: skip


async def test_a_dead_worker_leaves_the_list_to_a_thread(
    parser_process: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Killed (out of memory, say): the list is parsed in a thread, and the next ones too."""
    pool = listparse._pool
    assert pool is not None
    with pytest.raises(Exception):  # noqa: B017 -- BrokenProcessPool or the exit itself
        await asyncio.wrap_future(pool.submit(os._exit, 1))
    body = _document()
    with caplog.at_level(logging.WARNING, logger="rsnotify.changes"):
        parsed = await listparse.parse_whole(body, LENIENT)
    assert parsed == listparse.parse_list(body, LENIENT)
    assert "parser process failed" in caplog.text
    assert not listparse.ready()
    again = await listparse.parse_whole(body, LENIENT)  # threads from now on
    assert again == parsed


async def test_processes_off_parses_in_a_thread() -> None:
    listparse.configure(0)
    assert not listparse.ready()
    body = _document()
    assert await listparse.parse_whole(body, LENIENT) == listparse.parse_list(body, LENIENT)
    with pytest.raises(ValueError):
        listparse.configure(-1)
