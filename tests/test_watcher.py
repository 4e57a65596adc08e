"""CollectionWatcher against real files: a long list is detected in chunks, nothing twice."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rsnotify import sitemap
from rsnotify.changes import listparse
from rsnotify.changes.access import DirectoryAccess
from rsnotify.changes.watcher import CollectionWatcher, PollResult
from rsnotify.errors import DocumentError
from rsnotify.model import Capability, ChangeType, Document, Entry, Root
from rsnotify.tracker import Checkpoint

BASE = "http://source.example/c1/"
T0 = datetime(2025, 3, 1, tzinfo=UTC)


def _changelist(root: Path, name: str, first: int, count: int, *, closed: bool) -> None:
    entries = [
        Entry(
            loc=f"http://source.example/r{i % 97}",
            change=ChangeType.UPDATED,
            datetime=T0 + timedelta(seconds=i // 3),  # three entries share each datetime
        )
        for i in range(first, first + count)
    ]
    document = Document(
        root=Root.URLSET,
        capability=Capability.CHANGELIST,
        from_=T0 + timedelta(seconds=first // 3),
        until=T0 + timedelta(seconds=(first + count) // 3) if closed else None,
        entries=entries,
    )
    (root / "c1" / name).write_bytes(sitemap.serialize(document))


def _source(root: Path) -> None:
    (root / "c1").mkdir(parents=True)
    _changelist(root, "cl1.xml", 0, 2_400, closed=True)
    _changelist(root, "cl2.xml", 2_400, 2_600, closed=False)
    _index(root, [0, 800])


def _index(root: Path, starts: list[int]) -> None:
    """The Change List Index of cl1, cl2...: list n from ``starts[n-1]`` s, the last open."""
    ends: list[int | None] = [*starts[1:], None]
    index = Document(
        root=Root.SITEMAPINDEX,
        capability=Capability.CHANGELIST,
        from_=T0,
        entries=[
            Entry(
                loc=f"{BASE}cl{n}.xml",
                from_=T0 + timedelta(seconds=start),
                until=None if end is None else T0 + timedelta(seconds=end),
            )
            for n, (start, end) in enumerate(zip(starts, ends, strict=True), start=1)
        ],
    )
    (root / "c1" / "changelist.xml").write_bytes(sitemap.serialize(index))


def _watcher(root: Path, limits: sitemap.Limits = sitemap.DEFAULT_LIMITS) -> CollectionWatcher:
    return CollectionWatcher(
        access=DirectoryAccess(root),
        collection="c1",
        capability_list=f"{BASE}capabilitylist.xml",
        changelist_url=f"{BASE}changelist.xml",
        checkpoint=Checkpoint(started=True),
        from_beginning=True,
        limits=limits,
    )


async def _poll_to_the_end(watcher: CollectionWatcher, limit: int) -> list[PollResult]:
    """Poll until a pass ends, committing each result as the service does once it is logged."""
    results = []
    while True:
        result = await watcher.poll(limit)
        results.append(result)
        watcher.commit(result.checkpoint)
        if not result.more:
            return results


def _record_parses(
    monkeypatch: pytest.MonkeyPatch, what: Callable[[bytes], int] = len
) -> list[int]:
    """``what`` of each document parsed in this process from now on (the reader patched).

    By default its size; a parse in the worker process does not see the patch.
    """
    parsed: list[int] = []

    class Recording(sitemap.DocumentReader):
        def __init__(self, source: bytes, *args: Any, **kwargs: Any) -> None:
            parsed.append(what(source))
            super().__init__(source, *args, **kwargs)

    monkeypatch.setattr(sitemap, "DocumentReader", Recording)
    return parsed


async def _poll_by_lists(watcher: CollectionWatcher) -> list[PollResult]:
    """Poll a list at a time (``lists=1``, a Destination's walk) until a pass ends."""
    results = []
    while True:
        result = await watcher.poll(lists=1)
        results.append(result)
        watcher.commit(result.checkpoint)
        if not result.more:
            return results


@pytest.mark.parametrize("limit", [1_000, 2_400, 7])
async def test_a_limited_poll_hands_out_every_entry_once_in_order_across_lists(
    tmp_path: Path, limit: int
) -> None:
    _source(tmp_path)
    whole = await _watcher(tmp_path).poll()
    assert not whole.more
    expected = [(d.changelist, e.loc, e.datetime) for d in whole.detections for e in d.entries]
    assert len(expected) == 5_000

    watcher = _watcher(tmp_path)
    results = await _poll_to_the_end(watcher, limit)
    assert all(r.count <= limit for r in results)
    got = [
        (d.changelist, e.loc, e.datetime) for r in results for d in r.detections for e in d.entries
    ]
    assert got == expected
    assert len(results) >= 5_000 // limit
    result = results[-1]
    assert result.checkpoint == whole.checkpoint  # validators included: next poll is a 304
    again = await watcher.poll(limit)
    assert again.count == 0 and not again.more


async def test_a_reset_mid_pass_restarts_from_the_committed_checkpoint(tmp_path: Path) -> None:
    _source(tmp_path)
    watcher = _watcher(tmp_path)
    first = await watcher.poll(1_500)
    assert first.more and first.count == 1_500
    watcher.commit(first.checkpoint)
    await watcher.poll(1_500)  # handed out, never logged (the log was down, say)
    watcher.reset(first.checkpoint)
    results = await _poll_to_the_end(watcher, 1_500)
    rest = [e.loc for r in results for d in r.detections for e in d.entries]
    whole = await _watcher(tmp_path).poll()
    assert rest == [e.loc for d in whole.detections for e in d.entries][1_500:]


async def test_a_poll_by_lists_hands_out_whole_lists_once_in_order(tmp_path: Path) -> None:
    """``lists=1``: a list at a time, each whole (a Destination sorts a list it read whole)."""
    _source(tmp_path)
    whole = await _watcher(tmp_path).poll()
    watcher = _watcher(tmp_path)
    results = await _poll_by_lists(watcher)
    assert [[d.changelist for d in r.detections] for r in results] == [
        [f"{BASE}cl1.xml"],
        [f"{BASE}cl2.xml"],
    ]
    assert [len(r.detections[0]) for r in results] == [2_400, 2_600]
    assert results[0].checkpoint == results[0].detections[0].checkpoints[-1]
    assert results[-1].checkpoint == whole.checkpoint  # validators included: next poll is a 304
    again = await watcher.poll(lists=1)
    assert again.count == 0 and not again.more


async def test_large_lists_and_fragments_are_parsed_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A walk that follows push reads ~1,000 entries at once: parsing them held the loop.

    Lists read whole and appended fragments of 64 KB and up are parsed in a
    worker thread (processes off: see test_listparse for the worker process);
    small fragments in place; a poll with an entry limit
    (the publisher's) parses as it consumes, on the loop, never holding the
    whole list.
    """
    listparse.configure(0)  # parsed in this process, where the reader is patched
    _source(tmp_path)
    threads = _record_parses(monkeypatch, lambda _: threading.get_ident())
    loop_thread = threading.get_ident()
    limited = _watcher(tmp_path)
    assert (await limited.poll(1_000)).count == 1_000
    assert threads[1:] == [loop_thread], "a limited poll parses cl1 as it goes, on the loop"
    threads.clear()
    watcher = _watcher(tmp_path)
    result = await watcher.poll()
    watcher.commit(result.checkpoint)
    assert result.count == 5_000 and result.full_reads == 2
    assert len(threads) == 3 and threads[0] == loop_thread  # the index, then cl1 and cl2
    assert loop_thread not in threads[1:], "a list read whole was parsed on the loop"
    found = []
    for count in (3_200, 3_203):  # cl2 had 2,600: 600 entries appended (~100 KB), then 3
        threads.clear()
        _changelist(tmp_path, "cl2.xml", 2_400, count, closed=False)
        result = await watcher.poll()
        watcher.commit(result.checkpoint)
        assert result.full_reads == 0 and len(threads) == 1  # one ranged read, parsed once
        found.append((result.count, threads[0] == loop_thread))
    assert found == [(600, False), (3, True)], "(new entries, parsed on the loop's thread)"


async def test_a_list_closed_since_the_last_poll_is_parsed_from_its_known_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing adds ``until`` to the header: the list is read whole, but parsed from where it was.

    A walk that follows push meets that at nearly every list end, and parsed
    again the thousand entries it had consumed.
    """
    listparse.configure(0)  # parsed in this process, where the reader is patched
    _source(tmp_path)
    watcher = _watcher(tmp_path)
    watcher.commit((await watcher.poll()).checkpoint)
    parsed = _record_parses(monkeypatch)
    _changelist(tmp_path, "cl2.xml", 2_400, 2_610, closed=True)
    whole = (tmp_path / "c1" / "cl2.xml").stat().st_size
    result = await watcher.poll()
    watcher.commit(result.checkpoint)
    new = [e.loc for d in result.detections for e in d.entries]
    assert new == [f"http://source.example/r{i % 97}" for i in range(5_000, 5_010)]
    assert result.full_reads == 0 and result.bytes_read > whole  # the range, then the whole list
    assert len(parsed) == 1 and parsed[0] < 4_000, f"parsed {parsed} bytes of {whole}"
    assert (await watcher.poll()).count == 0


def _three_lists(root: Path, *, second_broken: bool) -> None:
    """cl1 and cl2 closed, cl3 open; cl2 cut short (not well-formed) if ``second_broken``."""
    (root / "c1").mkdir(parents=True, exist_ok=True)
    _changelist(root, "cl1.xml", 0, 600, closed=True)
    _changelist(root, "cl2.xml", 600, 600, closed=True)
    _changelist(root, "cl3.xml", 1_200, 600, closed=False)
    if second_broken:
        cl2 = root / "c1" / "cl2.xml"
        cl2.write_bytes(cl2.read_bytes()[:-300])
    _index(root, [0, 200, 400])


async def test_lists_read_ahead_of_a_failed_one_are_read_again_whole(tmp_path: Path) -> None:
    """A walk reads lists ahead of the one it detects (READ_AHEAD); a failure drops them.

    cl3 is read ahead (its validators remembered) while cl1 is handed out;
    cl2 then fails.  If cl3's validators survived, the next pass would get
    "not modified" for it and never see its 600 entries.
    """
    _three_lists(tmp_path, second_broken=True)
    watcher = _watcher(tmp_path)
    first = await watcher.poll(lists=1)
    assert first.more and [d.changelist for d in first.detections] == [f"{BASE}cl1.xml"]
    watcher.commit(first.checkpoint)
    with pytest.raises(DocumentError):
        await watcher.poll(lists=1)  # cl2, read ahead, is not well-formed
    _changelist(tmp_path, "cl2.xml", 600, 600, closed=True)  # the Source mends it
    results = await _poll_to_the_end(watcher, 10_000)
    found = [e for r in results for d in r.detections for e in d.entries]
    assert len(found) == 1_200
    assert [e.loc for e in found] == [f"http://source.example/r{i % 97}" for i in range(600, 1_800)]


async def test_a_walk_by_lists_reads_ahead_and_counts_each_read_once(tmp_path: Path) -> None:
    """The bytes and reads of lists read ahead are counted in the poll that hands them out."""
    _three_lists(tmp_path, second_broken=False)
    sizes = [(tmp_path / "c1" / f"cl{n}.xml").stat().st_size for n in (1, 2, 3)]
    watcher = _watcher(tmp_path)
    results = await _poll_by_lists(watcher)
    assert [r.count for r in results] == [600, 600, 600]
    assert [r.full_reads for r in results] == [1, 1, 1]
    assert [r.bytes_read for r in results] == sizes


async def test_a_walk_parsed_in_the_worker_process_detects_what_a_thread_detects(
    tmp_path: Path, parser_process: None
) -> None:
    """Entries and their digests from the worker (lenient order: an unordered checkpoint)."""
    _three_lists(tmp_path, second_broken=False)
    lenient = sitemap.Limits(lenient=frozenset({sitemap.Lenient.ORDER}))
    there = await _poll_by_lists(_watcher(tmp_path, lenient))
    listparse.configure(0)
    here = await _poll_by_lists(_watcher(tmp_path, lenient))
    assert [r.count for r in there] == [600, 600, 600]
    assert [[e for d in r.detections for e in d.entries] for r in there] == [
        [e for d in r.detections for e in d.entries] for r in here
    ]
    assert [r.checkpoint.to_json() for r in there] == [r.checkpoint.to_json() for r in here]


async def test_only_a_pass_over_several_lists_goes_to_the_worker_process(
    tmp_path: Path, parser_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catch-up's lists go to the worker; a walk that follows push stays here.

    The reader is patched in this process only: what it records was parsed
    here, what it misses in the worker.  A pass over two lists (the one that
    just closed and the open one) is a walk that follows push.
    """
    _three_lists(tmp_path, second_broken=False)
    parsed = _record_parses(monkeypatch)
    watcher = _watcher(tmp_path)
    index = (tmp_path / "c1" / "changelist.xml").stat().st_size
    results = await _poll_by_lists(watcher)
    assert [r.count for r in results] == [600, 600, 600]
    assert parsed == [index]  # the index here; cl1, then cl2 and cl3 read ahead, in the worker
    parsed.clear()
    _changelist(tmp_path, "cl3.xml", 1_200, 1_400, closed=False)  # 800 appended, ~96 KB
    again = await watcher.poll(lists=1)
    assert again.count == 800
    assert len(parsed) == 1 and parsed[0] > 64 * 1024  # the appended part, parsed here
    parsed.clear()
    two = _watcher(tmp_path / "two")  # two lists: a walk that follows push
    _source(tmp_path / "two")
    assert [r.count for r in await _poll_by_lists(two)] == [2_400, 2_600]
    assert len(parsed) == 3  # the index and both lists, all here
