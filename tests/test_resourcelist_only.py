"""Issue 23 acceptance: a Destination mirrors a Source that has no Change List.

The Source (:mod:`tests.rlsource`) offers only a Resource List, or a Resource
List Index of three parts, as files behind a stock web server.  A user runs
``rsnotify subscribe <base URL> --into MIRROR --once`` after each of five
rounds of creates, updates and deletes; after every round the command exits 0
and the mirror equals the Source's files by SHA-256.  What it fetched is read
from the web server's own log:

* only the created and updated resources, never a resource that did not
  change (a resource moved to another part of the index is not a change);
* in index mode, only the parts that changed: an unchanged part is asked
  conditionally and answered 304, or not asked at all, never sent again;
* a run after which nothing changed fetches no list and no resource.

Hash-less variants (only ``length`` and ``<lastmod>``, half the updates of
unchanged length) exercise the other fingerprint.  ``python -m http.server``
(``Last-Modified`` only) is the acceptance's server; nginx (strong ETag) runs
one variant too.

The push half runs the real ``rsnotify publish`` on the same Source (it
diffs successive snapshots into notifications marked ``derived``) and a
``rsnotify subscribe --via`` that follows it over WebSocket or a private
Mosquitto, both shapes on both transports, signed and unsigned: after each
of five rounds the mirror equals the Source by SHA-256, and the apply log
shows every change of the round applied from its derived notification (the
subscriber re-reads the list only hourly, and never did).

The smoke tests check the Source itself: every document it writes parses
with :func:`rsnotify.sitemap.parse` and with resync 2.0.1, and a round that
changes one part leaves the other parts' bytes and dates alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from resync import ResourceList as ResyncResourceList
from resync.mapper import Mapper
from resync.sitemap import Sitemap

from rsnotify import sitemap
from rsnotify.collection import collection_id
from rsnotify.model import Root
from tests.devstack import HttpServer, ManagedProcess, Nginx, free_port, wait_for
from tests.helpers import messages, read_apply_log
from tests.rlsource import (
    CAPABILITY_LIST,
    DESCRIPTION,
    INDEX,
    Mode,
    ResourceListSource,
    Round,
    requests,
)
from tests.test_publish_resourcelist_only import SQLiteReader

RunProcess = Callable[..., ManagedProcess]
ROUNDS = 5

VARIANTS = [
    pytest.param("list", True, "http.server", id="list-hashes-http.server"),
    pytest.param("list", False, "nginx", id="list-nohash-nginx"),
    pytest.param("index", True, "http.server", id="index-hashes-http.server"),
    pytest.param("index", False, "http.server", id="index-nohash-http.server"),
]


# --- the Source itself -----------------------------------------------------------------


def _path(loc: str) -> str:
    """A loc's path below the server root, decoded (as :func:`requests` reports it)."""
    return unquote(urlsplit(loc).path).lstrip("/")


def _entries(source: ResourceListSource) -> dict[str, tuple[str | None, int | None]]:
    """loc -> (hash, length) over the Resource List or every part, read by rsnotify."""
    found: dict[str, tuple[str | None, int | None]] = {}
    for part in range(source.parts):
        document = sitemap.parse(source.root / source.part_name(part))
        assert document.root is Root.URLSET and document.capability == "resourcelist"
        assert document.at is not None and document.up == source.capability_list
        for entry in document.entries:
            assert entry.loc not in found, f"{entry.loc} listed twice"
            assert entry.lastmod is not None
            found[entry.loc] = (entry.hash, entry.length)
    return found


@pytest.mark.parametrize("mode", ["list", "index"])
@pytest.mark.parametrize("hashes", [True, False], ids=["hashes", "nohash"])
def test_the_source_documents_parse_in_rsnotify_and_resync(
    tmp_path: Path, mode: Mode, hashes: bool
) -> None:
    source = ResourceListSource(tmp_path, "http://127.0.0.1:9/", mode=mode, hashes=hashes)
    rng = random.Random(23)
    source.publish(rng)
    ats = []
    for _ in range(4):  # one-part, move, one-part, spread in index mode
        source.round(rng)
        top = sitemap.parse(source.root / (INDEX if mode == "index" else source.part_name(0)))
        assert top.root is (Root.SITEMAPINDEX if mode == "index" else Root.URLSET)
        assert top.capability == "resourcelist" and top.at is not None
        ats.append(top.at)
        expected = {
            loc: (
                f"md5:{hashlib.md5(data).hexdigest()} sha-256:{sha}" if hashes else None,
                len(data),
            )
            for loc, sha, data in _contents(source)
        }
        assert _entries(source) == expected
    assert ats == sorted(set(ats)), "each round's at is strictly later than the last"

    description = sitemap.parse(source.root / DESCRIPTION)
    assert [(e.loc, e.capability) for e in description] == [
        (source.capability_list, "capabilitylist")
    ]
    capabilities = sitemap.parse(source.root / CAPABILITY_LIST)
    assert [(e.loc, e.capability) for e in capabilities] == [(source.resource_list, "resourcelist")]
    if mode == "index":
        index = sitemap.parse(source.root / INDEX)
        assert [e.loc for e in index] == [source.url(source.part_name(p)) for p in range(3)]
        newest = index.at
        assert newest is not None
        assert all(e.at is not None and e.at <= newest for e in index.entries)

    # resync 2.0.1 reads the same: the Resource List (Index, parts mapped to the files).
    read = ResyncResourceList(mapper=Mapper([f"{source.base.rstrip('/')}={source.root}"]))
    read.read(uri=str(source.root / (INDEX if mode == "index" else source.part_name(0))))
    theirs = {r.uri: (f"md5:{r.md5} sha-256:{r.sha256}" if r.md5 else None, r.length) for r in read}
    assert theirs == _entries(source)
    assert all(r.lastmod is not None for r in read)
    for name, capability in ((DESCRIPTION, "description"), (CAPABILITY_LIST, "capabilitylist")):
        with open(source.root / name, "rb") as handle:
            listed = Sitemap().parse_xml(fh=handle, sitemapindex=False)
        assert listed.md["capability"] == capability


def _contents(source: ResourceListSource) -> list[tuple[str, str, bytes]]:
    """(loc, SHA-256, bytes) of every resource file, read from the served directory."""
    out = []
    for loc, sha in source.expected_tree().items():
        data = (source.root / _path(loc)).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha, loc
        out.append((loc, sha, data))
    return out


def test_a_one_part_round_leaves_the_other_parts_alone(tmp_path: Path) -> None:
    source = ResourceListSource(tmp_path, "http://127.0.0.1:9/", mode="index")
    rng = random.Random(7)
    source.publish(rng)
    files = [source.root / source.part_name(p) for p in range(3)]
    before = {f.name: (f.read_bytes(), os.stat(f).st_mtime_ns) for f in files}
    index_mtime = os.stat(source.root / INDEX).st_mtime_ns
    done = source.round(rng)
    assert done.kind == "one-part"
    assert len(done.rewritten - {INDEX}) == 1 and INDEX in done.rewritten
    for f in files:
        same = (f.read_bytes(), os.stat(f).st_mtime_ns) == before[f.name]
        assert same == (f.name not in done.rewritten), f.name
    assert os.stat(source.root / INDEX).st_mtime_ns > index_mtime
    moved = source.round(rng)
    assert moved.kind == "move" and len(moved.moved) == 2
    assert len(moved.rewritten - {INDEX}) == 2


# --- the Destination, as a user runs it --------------------------------------------------


def _settled(server: HttpServer | Nginx) -> list[tuple[str, int]]:
    """The server's log once every request answered so far is in it.

    nginx logs a request after answering it: a request of our own, sent after
    the subscriber exited, marks the point up to which the log is complete.
    """
    mark = f"probe-{uuid.uuid4().hex}"
    try:
        urllib.request.urlopen(f"{server.url}/{mark}", timeout=10).close()
    except urllib.error.HTTPError as exc:  # 404, as intended
        exc.close()

    def logged() -> bool:
        return any(path == mark for path, _ in requests(server))

    wait_for(logged, 10, interval=0.02, message="the server never logged the probe")
    return requests(server)


def _check_fetches(
    source: ResourceListSource, seen: list[tuple[str, int]], done: Round | None
) -> None:
    """What one ``--once`` run fetched, against what the round changed (None: nothing)."""
    full = {path for path, status in seen if status == 200}
    resources = {path for path in full if path.startswith("res/")}
    expected = {_path(loc) for loc in done.fetched} if done else set()
    assert resources == expected, (
        f"fetched resources that did not change: {sorted(resources - expected)}; "
        f"never fetched changed ones: {sorted(expected - resources)}"
    )
    lists = {source.part_name(p) for p in range(source.parts)}
    if source.mode == "index":
        lists.add(INDEX)
    sent_again = full & lists
    changed = done.rewritten if done else set()
    assert sent_again == changed, (
        f"{done.kind if done else 'no change'}: lists sent whole {sorted(sent_again)}, "
        f"changed {sorted(changed)} (unchanged ones must be 304 or not asked)\n{seen}"
    )


@pytest.mark.parametrize(("mode", "hashes", "server_kind"), VARIANTS)
def test_once_mirrors_a_resource_list_only_source_round_after_round(
    tmp_path: Path, rsnotify_process: RunProcess, mode: Mode, hashes: bool, server_kind: str
) -> None:
    root = tmp_path / "www"
    root.mkdir()
    kind = HttpServer if server_kind == "http.server" else Nginx
    server = kind(tmp_path / server_kind, root).start()
    try:
        source = ResourceListSource(root, server.url, mode=mode, hashes=hashes)
        rng = random.Random(2323)
        source.publish(rng)
        mirror = tmp_path / "mirror"

        def once(done: Round | None, label: str) -> None:
            before = len(_settled(server))
            process = rsnotify_process(
                "subscribe", source.base, "--into", str(mirror), "--once",
                "--log-format", "json", name=f"subscribe-{label}",
            )  # fmt: skip
            code = process.wait(timeout=120)
            assert code == 0, f"{label}: exit {code}\n{process.tail()}"
            assert source.differences(mirror) == [], f"{label}\n{process.tail()}"
            if label != "baseline":
                _check_fetches(source, _settled(server)[before:], done)

        once(None, "baseline")
        kinds = []
        for number in range(1, ROUNDS + 1):
            done = source.round(rng)
            kinds.append(done.kind)
            once(done, f"round {number} ({done.kind})")
        once(None, "unchanged")
        if mode == "index":
            assert {"one-part", "move", "spread"} <= set(kinds), kinds
    finally:
        server.stop()


# --- the Destination on push -------------------------------------------------------------

PUSH_VARIANTS = [
    pytest.param("list", "ws", None, id="list-ws-unsigned"),
    pytest.param("list", "mqtt", "k7=push-secret", id="list-mqtt-signed"),
    pytest.param("index", "ws", "k7=push-secret", id="index-ws-signed"),
    pytest.param("index", "mqtt", None, id="index-mqtt-unsigned"),
]
Change = tuple[str, str]  # (loc, created | updated | deleted)


def _wait_mirrored(
    source: ResourceListSource, mirror: Path, label: str, *processes: ManagedProcess
) -> None:
    """Wait until ``mirror`` equals the Source by SHA-256; else fail with the processes' tails."""
    last: list[str] = []

    def equal() -> bool:
        last[:] = source.differences(mirror)
        return not last

    wait_for(
        equal,
        30,
        interval=0.05,
        message=lambda: (
            f"{label}: the mirror differs: {last[:5]}\n"
            + "\n".join(f"-- {p.name} --\n{p.tail()}" for p in processes)
        ),
    )


def _pushed(mirror: Path, log: SQLiteReader, resource_list: str, after: int) -> dict[Change, int]:
    """(loc, change) -> seq of what the subscriber applied from a notification after ``after``.

    A change found by reading the Resource List has no sequence number in the
    apply log; one applied from push has its notification's, which must be a
    notification of the publisher's log, for the same change, derived from
    ``resource_list``'s snapshots.
    """
    notified = dict(log.records())
    found: dict[Change, int] = {}
    for record in asyncio.run(read_apply_log(mirror)):
        if record.seq is None or record.seq <= after:
            continue
        if record.outcome not in ("applied", "deleted"):
            continue
        change = (record.loc, record.change.value)
        notification = notified[record.seq]
        assert (notification["loc"], notification["change"]) == change, (record, notification)
        assert notification["derived"]["resourcelist"] == resource_list, notification
        found[change] = record.seq
    return found


def _wait_pushed(
    mirror: Path, log: SQLiteReader, resource_list: str, want: set[Change], after: int, label: str
) -> int:
    """Wait until every change in ``want`` was applied from push after seq ``after``.

    Returns the newest seq among them.  The apply log's row lands just after
    the file, so the mirror may equal the Source a moment before.
    """
    got: dict[Change, int] = {}

    def arrived() -> bool:
        got.update(_pushed(mirror, log, resource_list, after))
        return want <= got.keys()

    wait_for(
        arrived,
        10,
        interval=0.05,
        message=lambda: f"{label}: not applied from push: {sorted(want - got.keys())[:5]}",
    )
    return max(got[change] for change in want)


@pytest.mark.parametrize(("mode", "transport", "secret"), PUSH_VARIANTS)
def test_push_keeps_the_mirror_of_a_resource_list_only_source_round_after_round(
    tmp_path: Path,
    rsnotify_process: RunProcess,
    request: pytest.FixtureRequest,
    mode: Mode,
    transport: str,
    secret: str | None,
) -> None:
    """Issue 23's push half: ``rsnotify publish`` diffs the snapshots, ``subscribe`` follows.

    The subscriber re-reads the Resource List only every hour, and neither a
    heartbeat nor a safety poll makes it walk in this test's time (nor does
    the quiet walk behind push, 30 s after the start-up's: a run takes a few
    seconds), so a mirror that keeps up round after round was kept up by
    push.  Checked round by round in the apply log: every change of the round
    was applied under the sequence number of a derived notification for
    exactly that change, newer than the last round's (a change found by
    reading the list has none); and at the end the subscriber logged no walk
    of the Resource List but its start-up's.

    Unsigned push is a hint (SECURITY.md): each pushed deletion is confirmed
    at the Source (404) before the file goes.  The Source removes a file just
    after the lists stop naming it, far sooner than a poll, a diff and a push
    take, so the confirmation finds it gone.  The signed variants apply what
    they are told.
    """
    with HttpServer(tmp_path / "http.server", tmp_path / "www") as server:
        source = ResourceListSource(tmp_path / "www", server.url, mode=mode)
        rng = random.Random(2325)
        source.publish(rng)
        cid = collection_id(source.capability_list)
        state, mirror = tmp_path / "publisher", tmp_path / "mirror"
        publish: list[str | Path] = [
            "publish", source.capability_list, "--state-dir", state, "--poll", "0.1",
            "--heartbeat", "1",
        ]  # fmt: skip
        if transport == "ws":
            port = free_port()
            publish += ["--ws", f"127.0.0.1:{port}"]
            via = f"ws://127.0.0.1:{port}"
        else:
            via = request.getfixturevalue("mosquitto").url
            publish += ["--mqtt", via]
        signing: list[str] = []
        if secret is not None:
            key_id, key = secret.split("=")
            publish += ["--secret", key, "--secret-id", key_id]
            signing = ["--secret", secret]
        publisher = rsnotify_process(*publish, name="publish")
        log = SQLiteReader(state, cid)
        wait_for(  # its first read records the snapshot the rounds are diffed from
            lambda: '"snapshot"' in (log.checkpoint() or ""),
            30,
            interval=0.05,
            message=lambda: "the publisher never recorded the snapshot\n" + publisher.tail(),
        )
        subscriber = rsnotify_process(
            "subscribe", source.base, "--into", str(mirror), "--via", via,
            "--resourcelist-poll", "3600", "--heartbeat-timeout", "600", "--safety-poll", "600",
            "--log-format", "json", *signing, name="subscribe",
        )  # fmt: skip

        def events() -> list[str]:
            """The engine's events, ``<kind>: <detail>`` (logged as ``<collection>: …``)."""
            prefix = f"{cid}: "
            return [m.removeprefix(prefix) for m in messages(subscriber, prefix)]

        # Its channel connected (an event handled once live): pushes from now on reach it.
        wait_for(
            lambda: any(e.startswith("connected: ") for e in events()) or not subscriber.running,
            60,
            message=lambda: "the subscriber did not go live on push\n" + subscriber.tail(),
        )
        assert subscriber.running, subscriber.tail()
        assert source.differences(mirror) == [], "baseline"

        high = 0  # the newest seq applied from push so far
        for number in range(1, ROUNDS + 1):
            done = source.round(rng)
            label = f"round {number} ({done.kind})"
            _wait_mirrored(source, mirror, label, subscriber, publisher)
            want = {
                (loc, change)
                for change in ("created", "updated", "deleted")
                for loc in getattr(done, change)
            }
            high = _wait_pushed(mirror, log, source.resource_list, want, high, label)

        walks = [e for e in events() if e.split(":")[0] in ("gap", "poll", "polling")]
        assert walks == ["gap: start-up"], walks
        assert publisher.running and subscriber.running
