"""``rsnotify publish --write-changelist DIR``: the Change List written from the log (issue 23).

Why one module of ~570 lines: the documents (:class:`ChangeListSet`), the writer with its
log and crashes, and a real ``rsnotify publish`` are checked with the same readers
(``written_entries``, and ``resync_read`` over ``served``) and the same
``notifications``/``entry_fields`` builders, so each layer is judged the same way.

What the tests prove, each against two independent readers (rsnotify's
parser, and resync 2.0.1 reading the lists a Change List Index names over
HTTP from a plain ``http.server``):

* the written Change List holds exactly the logged notifications, in log
  order, with their loc, change, datetime, lastmod, hash, length and type;
* a small ``max_entries`` rolls over into closed lists with contiguous
  ``from``/``until`` and an index resync reads in full;
* a crash after the files but before the cursor, and one between the lists
  and the index, repeat and lose nothing when the writer starts again;
* a change logged out of chronological order is written where a Destination
  that resumes from a datetime still finds it; records trimmed before they
  were written leave a visible hole between two lists;
* a real ``rsnotify publish`` of ``rsnotify simulate`` with
  ``--write-changelist`` writes exactly what it logged.
"""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from resync import ChangeList as ResyncChangeList
from resync.sitemap import Sitemap

from rsnotify import sitemap, w3cdt
from rsnotify.durable import TEMP_SUFFIX
from rsnotify.envelope import Notification, to_json
from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.model import ChangeList, ChangeListIndex, ChangeType, Entry
from rsnotify.publisher.changelists import INDEX_NAME, SEQ, ChangeListSet, list_name
from rsnotify.publisher.changelistwriter import (
    CURSOR,
    ChangeListWriter,
    CollectionWriter,
    advice_lines,
    read_back,
)
from rsnotify.publisher.tasks import TaskGroup
from tests.devstack import HttpServer, ManagedProcess, Redis, async_wait_for, wait_for

CID = "example.com-dataset1-capabilitylist-0123abcd"
CAP = "http://example.com/dataset1/capabilitylist.xml"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MD5 = "1584abdf8ebdc9802ac0c6a7402c03b6"
SHA256 = "854f61290e2e197a11bc91063afce22e43f8ccc655237050ace766adc68dc784"
Fields = tuple[str, str, datetime, str | None, int | None, str | None]


def notifications(count: int, *, first: int = 1) -> list[Notification]:
    """``count`` changes of seqs ``first...``, a quarter second apart, each with its ``from``."""
    changes = []
    kinds = [ChangeType.CREATED, ChangeType.UPDATED, ChangeType.DELETED]
    for seq in range(first, first + count):
        kind = kinds[seq % 3]
        when = T0 + timedelta(seconds=seq / 4)
        changes.append(
            Notification(
                collection=CID,
                seq=seq,
                capabilitylist=CAP,
                changelist="",
                loc=f"http://example.com/res/{seq % 5} & é.txt",
                change=kind,
                datetime=when,
                hash=None if kind is ChangeType.DELETED else f"md5:{MD5} sha-256:{SHA256}",
                length=None if kind is ChangeType.DELETED else seq * 10,
                type=None if kind is ChangeType.DELETED else "text/plain",
                links=[{"rel": "duplicate", "href": f"http://mirror.example.com/{seq}", "pri": 1}]
                if seq % 4 == 0
                else [],
                since=when - timedelta(seconds=0.25) if seq > 1 else None,
            )
        )
    return changes


def fields(change: Notification) -> Fields:
    return (
        change.loc,
        change.change.value,
        change.datetime,
        change.hash,
        change.length,
        change.type,
    )


def entry_fields(entry: Entry) -> Fields:
    assert entry.change is not None and entry.datetime is not None
    return (entry.loc, entry.change.value, entry.datetime, entry.hash, entry.length, entry.type)


def resync_fields(resource: object) -> Fields:
    """What resync read, as the same tuple (hashes re-joined the way rsnotify writes them)."""
    r: object = resource
    digests = [
        f"{name}:{value}"
        for name, value in (("md5", r.md5), ("sha-256", r.sha256))
        if value is not None
    ]
    when = w3cdt.parse(r.datetime)
    return (
        r.uri,
        r.change,
        when,
        " ".join(digests) or None,
        r.length,
        r.mime_type,
    )


def write_all(directory: Path, files: Sequence[tuple[str, bytes]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files:
        (directory / name).write_bytes(data)


def written_entries(directory: Path) -> list[Entry]:
    """Every entry of the written lists, in the index's order, read with rsnotify."""
    index = sitemap.parse(directory / INDEX_NAME)
    assert isinstance(index, ChangeListIndex)
    out: list[Entry] = []
    for ref in index:
        document = sitemap.parse(directory / ref.loc.rpartition("/")[2])
        assert isinstance(document, ChangeList)
        out += document.entries
    return out


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A directory served by ``python -m http.server``, and its URL (with a slash)."""
    root = tmp_path / "served"
    root.mkdir()
    with HttpServer(tmp_path / "http", root) as server:
        server.start()
        yield root, server.url + "/"


def resync_read(index_url: str) -> list[object]:
    """Every change resync reads, following the index to each list over HTTP.

    resync 2.0.1 cannot read a Change List Index as one (``ChangeList.read``
    hands the index's ``<sitemap>`` entries to ``add``, which refuses them for
    having no change: see tests/test_resync_interop.py), so this does what a
    resync-based Destination does: the index with resync's generic Sitemap
    reader (it must be a ``changelist`` sitemapindex), then each list, in the
    index's order, with ``ChangeList.read``.
    """
    with urllib.request.urlopen(index_url, timeout=10) as response:
        reader = Sitemap()
        refs = reader.parse_xml(fh=io.BytesIO(response.read()), sitemapindex=True)
    assert refs.md["capability"] == "changelist"
    out: list[object] = []
    for ref in refs:
        theirs = ResyncChangeList()
        theirs.read(uri=ref.uri)
        assert theirs.md["capability"] == "changelist" and theirs.index == index_url
        out += list(theirs)
    return out


# --- the documents -----------------------------------------------------------------------


def test_the_written_change_list_holds_the_logged_changes_for_rsnotify_and_resync(
    served: tuple[Path, str],
) -> None:
    root, url = served
    base = url + CID + "/"
    changes = ChangeListSet(capability_list=CAP, base=base)
    logged = notifications(12)
    logged[2].lastmod = logged[2].datetime - timedelta(days=30)  # a resource's own, older time
    files = changes.add(logged[:5], upto=5) + changes.add(logged[5:], upto=12)
    write_all(root / CID, files)

    document = sitemap.parse(root / CID / list_name(1))
    assert isinstance(document, ChangeList) and document.is_open
    assert document.capability == "changelist" and document.up == CAP
    assert document.index == base + INDEX_NAME
    assert document.from_ == logged[0].datetime  # the first change had no "from"
    assert document.md_extra[SEQ] == "12"
    assert [entry_fields(e) for e in document] == [fields(n) for n in logged]
    # <lastmod> is the change time (section 12; what 1.0 readers order by), never
    # the resource's own older one, which would break the list's order.
    assert [e.lastmod for e in document] == [n.datetime for n in logged]
    assert document.entries[3].links[0].href == "http://mirror.example.com/4"

    index = sitemap.parse(root / CID / INDEX_NAME)
    assert isinstance(index, ChangeListIndex)
    assert (index.up, index.from_, index.until) == (CAP, logged[0].datetime, None)
    assert [(e.loc, e.from_, e.until) for e in index] == [
        (base + list_name(1), logged[0].datetime, None)
    ]

    theirs = ResyncChangeList()
    theirs.parse(str_data=(root / CID / list_name(1)).read_text("utf-8"))
    assert theirs.md == {"capability": "changelist", "md_from": w3cdt.format(logged[0].datetime)}
    assert [resync_fields(r) for r in theirs] == [fields(n) for n in logged]
    assert [resync_fields(r) for r in resync_read(base + INDEX_NAME)] == [fields(n) for n in logged]


def test_the_open_list_is_rewritten_from_cached_entries_byte_for_byte() -> None:
    """The fast path (entries serialized once) writes what the serializer writes whole."""
    changes = ChangeListSet(capability_list=CAP, base="http://example.com/cl/")
    logged = notifications(6)
    changes.add(logged[:2], upto=2)
    files = dict(changes.add(logged[2:], upto=6))
    parsed = sitemap.parse(files[list_name(1)])
    assert files[list_name(1)] == sitemap.serialize(parsed)
    assert list(files) == [list_name(1)]  # an append leaves the index alone


def test_rollover_closes_lists_with_contiguous_intervals_and_resync_reads_them_all(
    served: tuple[Path, str],
) -> None:
    root, url = served
    base = url + CID + "/"
    changes = ChangeListSet(capability_list=CAP, base=base, max_entries=3)
    logged = notifications(11)
    files: list[tuple[str, bytes]] = []
    for start, stop in ((0, 2), (2, 9), (9, 10), (10, 11)):
        files += changes.add(logged[start:stop], upto=logged[stop - 1].seq or 0)
    write_all(root / CID, files)

    index = sitemap.parse(root / CID / INDEX_NAME)
    assert isinstance(index, ChangeListIndex)
    assert [e.loc for e in index] == [base + list_name(n) for n in range(1, 5)]
    assert [e.until is None for e in index] == [False, False, False, True]
    for before, after in zip(index.entries, index.entries[1:], strict=False):
        assert before.until == after.from_ and before.lastmod == before.until
    lists = [sitemap.parse(root / CID / list_name(n)) for n in range(1, 5)]
    assert [len(d) for d in lists] == [3, 3, 3, 2]
    assert [(d.from_, d.until) for d in lists] == [(e.from_, e.until) for e in index]
    assert [d.md_extra[SEQ] for d in lists] == ["3", "6", "9", "11"]
    for document in lists[:-1]:  # "includes all changes up until": the next one starts there
        assert document.until == lists[lists.index(document) + 1].entries[0].datetime
    assert [entry_fields(e) for e in written_entries(root / CID)] == [fields(n) for n in logged]
    assert [resync_fields(r) for r in resync_read(base + INDEX_NAME)] == [fields(n) for n in logged]


def test_a_change_logged_out_of_order_is_written_where_a_resuming_destination_finds_it() -> None:
    changes = ChangeListSet(capability_list=CAP, base="http://example.com/cl/")
    logged = notifications(4)
    late = logged[3]
    late.datetime = T0 - timedelta(hours=1)  # e.g. derived from an old lastmod
    late.since = None
    files = dict(changes.add(logged, upto=4))
    document = sitemap.parse(files[list_name(1)])  # refuses entries out of order
    last = document.entries[-1]
    assert last.datetime == logged[2].datetime  # the latest time already written
    assert last.lastmod == last.datetime  # both say when, for 1.0 readers too (section 12)


def test_records_trimmed_before_they_were_written_leave_a_hole_between_lists() -> None:
    changes = ChangeListSet(capability_list=CAP, base="http://example.com/cl/")
    logged = notifications(10)
    changes.add(logged[:3], upto=3)
    files = dict(changes.add(logged[7:], upto=10, gap=True))
    index = sitemap.parse(files[INDEX_NAME])
    first, second = index.entries
    assert first.until == logged[2].datetime  # closed at the last change written
    assert second.from_ == logged[7].datetime  # the hole: seqs 4..7 are not claimed
    assert first.until is not None and second.from_ is not None
    assert first.until < second.from_


def test_the_advice_names_the_index_url_to_put_in_the_capability_list() -> None:
    [line] = advice_lines({CID: CAP}, "/srv/cl", None, "rsnotify publish:")
    url = f"http://example.com/dataset1/{CID}/{INDEX_NAME}"
    assert f'advertise <url><loc>{url}</loc><rs:md capability="changelist"/></url>' in line
    assert f"/srv/cl/{CID}/{INDEX_NAME}" in line
    [line] = advice_lines({CID: CAP}, "/srv/cl", "https://cdn.example.org/cl", "x")
    assert f"<loc>https://cdn.example.org/cl/{CID}/{INDEX_NAME}</loc>" in line


# --- the writer, the log and crashes ---------------------------------------------------------


async def append(log: SQLiteLog, changes: Sequence[Notification]) -> None:
    head = await log.head(CID)
    await log.append(CID, [to_json(n) for n in changes], expected_head=head, checkpoint="{}")


async def run_until_written(
    log: SQLiteLog, directory: Path, seq: int, *, max_entries: int = 50_000
) -> None:
    """Run a fresh writer (a new process, as far as it knows) until ``seq`` is written."""
    changes = ChangeListSet(
        capability_list=CAP, base="http://example.com/cl/", max_entries=max_entries
    )
    writer = CollectionWriter(log, CID, changes, directory, interval=0.0)
    task = asyncio.create_task(writer.run())
    try:
        await async_wait_for(
            lambda: changes.seq >= seq or task.done(),
            timeout=20,
            message=lambda: f"written up to {changes.seq}, not {seq}",
        )

        async def cursor_moved() -> bool:
            return await log.cursor(CID, CURSOR) >= seq

        await async_wait_for(cursor_moved, timeout=5)
        assert not task.done(), task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_crash_after_the_files_before_the_cursor_repeats_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "out" / CID
    log = SQLiteLog(tmp_path / "log.sqlite3")
    try:
        logged = notifications(9)
        await append(log, logged[:5])
        await run_until_written(log, directory, 5, max_entries=4)
        assert await log.cursor(CID, CURSOR) == 5
        # The crash: a writer wrote seqs 6 and 7 durably, and died before set_cursor.
        changes = ChangeListSet(capability_list=CAP, base="http://example.com/cl/", max_entries=4)
        read_back(directory, changes)
        assert changes.seq == 5
        await append(log, logged[5:])
        write_all(directory, changes.add(logged[5:7], upto=7))
        orphan = directory / f".{list_name(3)}.999.dead{TEMP_SUFFIX}"  # a write killed half-way
        orphan.write_bytes(b"<urlset")
        assert await log.cursor(CID, CURSOR) == 5
        await run_until_written(log, directory, 9, max_entries=4)
        assert await log.cursor(CID, CURSOR) == 9
        assert not orphan.exists()
        assert [entry_fields(e) for e in written_entries(directory)] == [fields(n) for n in logged]
    finally:
        await log.close()


async def test_a_log_started_anew_writes_its_changes_into_a_new_list(tmp_path: Path) -> None:
    """DIR kept, the log wiped (or SQLite traded for Redis): seqs restart at 1.

    Trusting the files' ``rsn:seq`` (5) would skip the new log's first five
    records; they are new changes, written after a hole in a list of their own.
    """
    directory = tmp_path / "out" / CID
    first = SQLiteLog(tmp_path / "first.sqlite3")
    try:
        await append(first, notifications(5))
        await run_until_written(first, directory, 5)
    finally:
        await first.close()
    anew = SQLiteLog(tmp_path / "anew.sqlite3")
    try:
        later = notifications(3, first=6)  # later changes, numbered from 1 by the new log
        for seq, change in enumerate(later, start=1):
            change.seq = seq
        await append(anew, later)
        await run_until_written(anew, directory, 3)
        written = written_entries(directory)
        assert [e.loc for e in written] == [n.loc for n in notifications(5) + later]
        index = sitemap.parse(directory / INDEX_NAME)
        assert len(index) == 2  # the first list closed at the hole, the new log's in a second
        second = sitemap.parse(directory / list_name(2))
        assert [e.loc for e in second] == [n.loc for n in later]
        assert second.md_extra[SEQ] == "3"
    finally:
        await anew.close()


async def test_a_crash_between_the_lists_and_the_index_is_repaired(tmp_path: Path) -> None:
    directory = tmp_path / "out" / CID
    log = SQLiteLog(tmp_path / "log.sqlite3")
    try:
        logged = notifications(10)
        await append(log, logged)
        changes = ChangeListSet(capability_list=CAP, base="http://example.com/cl/", max_entries=3)
        first = changes.add(logged[:2], upto=2)
        write_all(directory, first)
        files = changes.add(logged[2:8], upto=8)
        assert [name for name, _ in files] == [list_name(1), list_name(2), list_name(3), INDEX_NAME]
        write_all(directory, files[:2])  # lists 1 (now closed) and 2 (closed); then the crash
        await run_until_written(log, directory, 10, max_entries=3)
        index = sitemap.parse(directory / INDEX_NAME)
        assert [e.loc.rpartition("/")[2] for e in index] == [list_name(n) for n in range(1, 5)]
        assert [e.until is None for e in index] == [False, False, False, True]
        assert [entry_fields(e) for e in written_entries(directory)] == [fields(n) for n in logged]
    finally:
        await log.close()


async def test_the_writer_transport_writes_every_collection_and_stops(tmp_path: Path) -> None:
    log = SQLiteLog(tmp_path / "log.sqlite3")
    try:
        logged = notifications(30)
        await append(log, logged)
        writer = ChangeListWriter(log, tmp_path / "out", {CID: CAP}, interval=0.0)
        tasks = TaskGroup()
        await writer.start(tasks)

        async def written() -> bool:  # the cursor moves once the files are durable
            return await log.cursor(CID, CURSOR) == 30

        await async_wait_for(written, timeout=20)
        await writer.stop()
        await tasks.cancel()
        assert [entry_fields(e) for e in written_entries(tmp_path / "out" / CID)] == [
            fields(n) for n in logged
        ]
    finally:
        await log.close()


# --- a real publisher -----------------------------------------------------------------


def logged_records(state: Path) -> list[dict[str, object]]:
    """The log's envelopes in seq order, read with sqlite3 and json (not rsnotify)."""
    path = state / "log.sqlite3"
    if not path.exists():
        return []
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            rows = db.execute("SELECT data FROM log ORDER BY collection, seq").fetchall()
    except sqlite3.OperationalError:
        return []
    return [json.loads(data) for (data,) in rows]


def expected_from_log(records: list[dict[str, object]]) -> list[tuple[object, ...]]:
    """The fields of each logged envelope, as :func:`entry_fields` gives them."""
    return [
        (
            r["loc"],
            r["change"],
            w3cdt.parse(str(r["datetime"])),
            r.get("hash"),
            r.get("length"),
            r.get("type"),
        )
        for r in records
    ]


def start_publishing(
    run: Callable[..., ManagedProcess], tmp_path: Path, url: str, root: Path, total: int
) -> tuple[ManagedProcess, Path, str]:
    """A simulated Source making ``total`` changes at 40/s and a publisher writing its log.

    Returns the publisher, its state directory and the index URL it advised.
    """
    simulator = run(
        "simulate", "--port", "0", "--quiet", "--resources", "20", "--rate", "40",
        "--max-changes", str(total), "--changelist-size", "25", "--seed", "23",
    )  # fmt: skip
    match = simulator.wait_for_line(r"rsnotify simulate: serving (http://\S+/)$", timeout=20)
    state = tmp_path / "state"
    publisher = run(
        "publish", match.group(1), "--state-dir", str(state), "--poll", "0.1",
        "--from-beginning", "--write-changelist", str(root),
        "--write-changelist-base", url, "--write-changelist-size", "7",
    )  # fmt: skip
    advice = publisher.wait_for_line(
        r"advertise <url><loc>(\S+)</loc><rs:md capability=\"changelist\"/></url>", timeout=20
    )
    assert advice.group(1).startswith(url)
    return publisher, state, advice.group(1)


def wait_all_written(publisher: ManagedProcess, state: Path, directory: Path, total: int) -> None:
    def all_written() -> bool:
        records = logged_records(state)
        if len(records) < total or not (directory / INDEX_NAME).exists():
            return False
        return len(written_entries(directory)) >= len(records)

    wait_for(all_written, timeout=60, interval=0.2, message=publisher.tail)


def test_rsnotify_publish_writes_exactly_what_it_logged(
    tmp_path: Path,
    served: tuple[Path, str],
    rsnotify_process: Callable[..., ManagedProcess],
) -> None:
    total = 60
    root, url = served
    publisher, state, index_url = start_publishing(rsnotify_process, tmp_path, url, root, total)
    directory = root / index_url[len(url) :].partition("/")[0]
    wait_all_written(publisher, state, directory, total)
    records = logged_records(state)
    assert len(records) == total
    expected = expected_from_log(records)
    assert [entry_fields(e) for e in written_entries(directory)] == expected
    assert [resync_fields(r) for r in resync_read(index_url)] == expected
    index = sitemap.parse(directory / INDEX_NAME)
    assert len(index) == -(-total // 7)
    assert publisher.running, publisher.tail()


def test_a_publisher_killed_while_writing_resumes_without_repeating_an_entry(
    tmp_path: Path,
    served: tuple[Path, str],
    rsnotify_process: Callable[..., ManagedProcess],
) -> None:
    total = 160
    root, url = served
    publisher, state, index_url = start_publishing(rsnotify_process, tmp_path, url, root, total)
    directory = root / index_url[len(url) :].partition("/")[0]
    wait_for(
        lambda: (directory / INDEX_NAME).exists() and len(written_entries(directory)) >= 40,
        timeout=30,
        interval=0.05,
        message=publisher.tail,
    )
    publisher.kill()  # SIGKILL: no drain, no goodbye
    killed_at = len(written_entries(directory))
    assert killed_at < total, "the Source must still be changing when the publisher dies"
    publisher.start()
    wait_all_written(publisher, state, directory, total)
    records = logged_records(state)
    assert len(records) == total
    expected = expected_from_log(records)
    assert [entry_fields(e) for e in written_entries(directory)] == expected
    assert [resync_fields(r) for r in resync_read(index_url)] == expected
    assert publisher.running, publisher.tail()


def test_write_changelist_options_that_cannot_work_are_refused(
    rsnotify_process: Callable[..., ManagedProcess],
) -> None:
    source = "https://source.example.org/"
    cases = [
        (["--write-changelist-base", "http://x.example/"], "need --write-changelist DIR"),
        (["--write-changelist", "d", "--write-changelist-size", "50001"], "at most 50000 entries"),
        (["--write-changelist", "d", "--ws-only", "--redis", "redis://127.0.0.1:1/0"], "not with"),
    ]
    for argv, said in cases:
        process = rsnotify_process("publish", source, *argv)
        assert process.wait(timeout=20) == 2, process.tail()
        assert said in process.output(), process.tail()


def test_an_unwritable_dir_stops_every_publisher_at_start_up_not_an_elected_one(
    tmp_path: Path, rsnotify_process: Callable[..., ManagedProcess], redis_server: Redis
) -> None:
    """Checked before any election: an --ha standby must not win a lease it cannot use.

    (Found only once elected, the error ended the election task: the process
    held the lease, detected nothing, and never exited.)
    """
    simulator = rsnotify_process("simulate", "--port", "0", "--quiet", "--rate", "0")
    match = simulator.wait_for_line(r"rsnotify simulate: serving (http://\S+/)$", timeout=20)
    blocker = tmp_path / "a-file"
    blocker.write_text("DIR cannot be made under a file, even by root\n")
    publisher = rsnotify_process(
        "publish", match.group(1), "--state-dir", str(tmp_path / "state"),
        "--write-changelist", str(blocker / "changelists"),
        "--redis", redis_server.url, "--ha", "--lease-ttl", "1",
    )  # fmt: skip
    assert publisher.wait(timeout=30) != 0, publisher.tail()
    assert f"--write-changelist {blocker / 'changelists'}" in publisher.output(), publisher.tail()
