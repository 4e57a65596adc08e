"""``rsnotify publish`` of a Source that offers only a Resource List (issue 23, item 2).

The Source (:mod:`tests.rlsource`, in list mode, ten virtual minutes between
two snapshots) is files behind ``python -m http.server`` (no ETag,
``Last-Modified`` in whole seconds), as most small repositories are: a
Capability List that offers a Resource List and no Change List.  The real
``rsnotify publish`` runs against it, with the embedded SQLite log and with
Redis, through rounds of creates, updates and deletes, an idle round, and a
restart while the Source changes.  The log (what every transport pushes) must
hold exactly the changes an independent model derives from successive
snapshots (:func:`expected_changes`, written from the rules of Z39.99
section 7 and the issue, not from :mod:`rsnotify.changes.snapshot`):
created / updated / deleted with the right ``loc``, the change time taken
from ``lastmod`` when it falls inside the two snapshots' interval and else
the new snapshot's ``at``, each marked ``derived`` with both snapshots'
``at``, sequenced from 1 without a gap, nothing twice, nothing for an idle
round, whose polls the Source answers ``304``.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rsnotify import framework
from rsnotify.collection import collection_id
from rsnotify.publisher.changelists import INDEX_NAME
from tests.devstack import HttpServer, ManagedProcess, Redis, free_port, wait_for
from tests.rlsource import LIST, ResourceListSource, Snapshot, requests, w3c
from tests.test_changelist_writer import (
    entry_fields,
    expected_from_log,
    resync_fields,
    resync_read,
    written_entries,
)

MINUTE = 60
ROUND = 10 * MINUTE  # virtual seconds between two snapshots' 'at'
DAY = 86_400
TIMEOUT = 30.0


def expected_changes(
    source: ResourceListSource, before: Snapshot, after: Snapshot
) -> list[dict[str, Any]]:
    """What the publisher must log between two snapshots (the issue's rules, written anew)."""
    since, at = before.at, after.at
    out = []
    for name in sorted(before.resources.keys() | after.resources.keys()):
        old, new = before.resources.get(name), after.resources.get(name)
        if new is None:
            change, when = "deleted", at
        elif old is None or old.data != new.data:
            change = "created" if old is None else "updated"
            when = new.lastmod if since < new.lastmod <= at else at
        else:  # unchanged, or only listed in another part
            continue
        out.append({"loc": source.loc(name), "change": change, "datetime": when})
    out.sort(key=lambda c: (c["datetime"], c["change"] == "deleted", c["loc"]))
    derived = {"resourcelist": source.resource_list, "from": w3c(since), "until": w3c(at)}
    return [
        {
            "loc": c["loc"],
            "change": c["change"],
            "datetime": w3c(c["datetime"]),
            "derived": derived,
        }
        for c in out
    ]


# --- where the log is read -----------------------------------------------------------------


class LogReader:
    """The collection's logged envelopes and checkpoint, read outside the publisher."""

    def records(self) -> list[tuple[int, dict[str, Any]]]:
        raise NotImplementedError

    def checkpoint(self) -> str | None:
        raise NotImplementedError

    def maps(self) -> int:
        """How many snapshot maps are stored."""
        raise NotImplementedError


class SQLiteReader(LogReader):
    def __init__(self, state: Path, cid: str) -> None:
        self.path, self.state, self.cid = state / "log.sqlite3", state, cid

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        if not self.path.exists():
            return []
        db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5)
        try:
            return db.execute(sql, (self.cid,)).fetchall()
        except sqlite3.OperationalError:  # the schema is not there yet
            return []
        finally:
            db.close()

    def records(self) -> list[tuple[int, dict[str, Any]]]:
        rows = self._query("SELECT seq, data FROM log WHERE collection = ? ORDER BY seq")
        return [(seq, json.loads(data)) for seq, data in rows]

    def checkpoint(self) -> str | None:
        rows = self._query("SELECT checkpoint FROM meta WHERE collection = ?")
        return rows[0][0] if rows else None

    def maps(self) -> int:
        directory = self.state / "snapshots" / self.cid
        return len(list(directory.iterdir())) if directory.exists() else 0


class RedisReader(LogReader):
    def __init__(self, url: str, cid: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self.tag = "{" + cid + "}"

    def records(self) -> list[tuple[int, dict[str, Any]]]:
        rows = self.client.xrange(f"rsn:{self.tag}:log", "-", "+")
        return [(int(i.decode().split("-")[0]), json.loads(f[b"d"])) for i, f in rows]

    def checkpoint(self) -> str | None:
        value = self.client.hget(f"rsn:{self.tag}:meta", "checkpoint")
        return value.decode() if value is not None else None

    def maps(self) -> int:
        return int(self.client.hlen(f"rsn:{self.tag}:snapshots"))


# --- the scenario ----------------------------------------------------------------------------


class Scenario:
    def __init__(
        self,
        source: ResourceListSource,
        server: HttpServer,
        start_publisher: Callable[[], ManagedProcess],
        reader: LogReader,
    ) -> None:
        self.source, self.server, self.reader = source, server, reader
        self.start_publisher = start_publisher
        self.publisher = start_publisher()
        self.expected: list[dict[str, Any]] = []
        self.snapshot = source.snapshot()
        self.resumed: set[int] = set()  # seqs logged first by a publisher started mid-diff
        self.after_hole: dict[int, str] = {}  # seq -> the re-recorded snapshot's 'at'

    def _tail(self) -> str:
        return self.publisher.tail() + "\n-- http.server --\n" + self.server.log_text()[-2000:]

    def list_requests(self, status: int) -> int:
        """GETs of the Resource List the Source answered with ``status``, so far."""
        return requests(self.server).count((LIST, status))

    def wait_recorded(self) -> None:
        """The first read records the snapshot in the checkpoint, and logs nothing."""
        wait_for(
            lambda: '"snapshot"' in (self.reader.checkpoint() or ""),
            TIMEOUT,
            interval=0.05,
            message=lambda: "the first snapshot was never recorded\n" + self._tail(),
        )
        assert self.reader.records() == []
        self.snapshot = self.source.snapshot()

    def publish_round(self) -> None:
        """The Source publishes a new snapshot; what it changed is expected in the log."""
        self.source.commit()
        after = self.source.snapshot()
        self.expected += expected_changes(self.source, self.snapshot, after)
        self.snapshot = after

    def wait_logged(self) -> None:
        """The log reaches exactly what is expected: dense seqs, the derived changes, marked."""
        want = len(self.expected)
        wait_for(
            lambda: len(self.reader.records()) >= want,
            TIMEOUT,
            interval=0.05,
            message=lambda: f"the log never held {want} derived changes\n" + self._tail(),
        )
        self.check_log()

    def check_log(self) -> None:
        records = self.reader.records()
        assert [seq for seq, _ in records] == list(range(1, len(records) + 1))
        got = [
            {k: obj.get(k) for k in ("loc", "change", "datetime", "derived")} for _, obj in records
        ]
        assert got == self.expected
        assert all(obj["changelist"] == self.source.resource_list for _, obj in records)
        # Change Notification intervals chain: each change's "from" is the datetime
        # of the change logged before it (absent when that is not earlier), across
        # batches and detection passes too.  ``resumed``: the first seq a publisher
        # started mid-diff logged, whose predecessor it cannot know.
        for (_, before), (seq, obj) in itertools.pairwise(records):
            if seq in self.resumed:
                continue
            if seq in self.after_hole:  # what came between was never seen: no chain
                assert obj.get("from") == self.after_hole[seq], (seq, obj)
                continue
            chained = before["datetime"] if before["datetime"] < obj["datetime"] else None
            assert obj.get("from") == chained, (seq, before, obj)

    def wait_polls(self, count: int = 3) -> None:
        """The publisher polled ``count`` more times and the idle Source answered 304."""
        before = self.list_requests(304)
        wait_for(
            lambda: self.list_requests(304) >= before + count,
            TIMEOUT,
            interval=0.05,
            message=lambda: "no conditional GET answered 304 while idle\n" + self._tail(),
        )

    def restart(self, while_down: Callable[[], None]) -> None:
        assert self.publisher.terminate() == 0, self._tail()
        while_down()
        self.publisher = self.start_publisher()


def _changes(source: ResourceListSource, n: int) -> None:
    """Round ``n``: two creates, two updates (lastmod inside, before and after the
    interval), one delete."""
    at = source.at  # the previous snapshot's
    names = sorted(source.resources)
    source.put(f"new{n}a.txt", f"created in round {n}".encode(), lastmod=at + 3 * MINUTE)
    source.put(f"new{n}b.txt", f"created in round {n}, b".encode(), lastmod=at + MINUTE)
    first, second, third = names[0], names[1], names[-1]
    source.put(first, f"{first} updated in round {n}".encode(), lastmod=at + 2 * MINUTE)
    # A Source that does not move lastmod, and one that dates it after the snapshot.
    unmoved = source.resources[second].lastmod
    source.put(second, f"{second} updated in round {n}".encode(), lastmod=unmoved)
    source.put(third, f"{third} updated in round {n}".encode(), lastmod=at + ROUND + DAY)
    source.delete(names[2])


@pytest.fixture
def rl_source(tmp_path: Path) -> Iterator[tuple[ResourceListSource, HttpServer]]:
    root = tmp_path / "docroot"
    root.mkdir()
    server = HttpServer(tmp_path / "http.server", root).start()
    try:
        source = ResourceListSource(root, server.url, step=ROUND)
        for i in range(8):
            source.put(f"r{i}.txt", f"resource {i}".encode(), lastmod=source.clock - DAY)
        source.commit()
        yield source, server
    finally:
        server.stop()


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_a_resource_list_only_source_is_published_as_derived_changes(
    backend: str,
    rl_source: tuple[ResourceListSource, HttpServer],
    rsnotify_process: Callable[..., ManagedProcess],
    redis_factory: Callable[..., Redis],
    tmp_path: Path,
) -> None:
    source, server = rl_source
    state = tmp_path / "state"
    cid = collection_id(source.capability_list)
    args: list[str | Path] = [
        "publish", source.capability_list, "--poll", "0.1", "--state-dir", state,
        "--log-level", "info",
    ]  # fmt: skip
    reader: LogReader
    if backend == "redis":
        redis = redis_factory()
        args += ["--redis", redis.url]
        reader = RedisReader(redis.url, cid)
    else:
        reader = SQLiteReader(state, cid)
        # The framework watch of a collection without Change Lists: the Resource List.
        args += ["--websub", f"127.0.0.1:{free_port()}", "--framework-interval", "0.2"]
        # And the Change List the Source never had, served beside it (item 3).
        args += ["--write-changelist", source.root / "cl"]
        args += ["--write-changelist-base", f"{server.url}/cl/"]
    scenario = Scenario(source, server, lambda: rsnotify_process(*args), reader)
    scenario.wait_recorded()

    for n in (1, 2):  # two rounds of creates, updates and deletes
        _changes(source, n)
        scenario.publish_round()
        scenario.wait_logged()

    # An idle round: the list is written again, the same; then left alone.
    logged = len(reader.records())
    source.rewrite_unchanged()
    scenario.wait_polls()
    assert len(reader.records()) == logged
    scenario.check_log()
    # Polls since: maps no checkpoint names any more were swept (this one and the last).
    assert 0 < reader.maps() <= 2

    # A restart while the Source changes: nothing lost, nothing repeated.
    def third_round() -> None:
        _changes(source, 3)
        scenario.publish_round()

    scenario.restart(third_round)
    scenario.wait_logged()
    scenario.wait_polls()
    scenario.check_log()
    assert len(reader.records()) == 3 * 6  # three rounds of six changes
    if backend == "redis":  # the maps live beside the log, for a standby that takes over
        assert not (state / "snapshots").exists()
    else:  # Framework Notification 1.0.1: "resourcelist updated", nothing of Change Lists
        framework_log = SQLiteReader(state, framework.stream(cid))
        notes = wait_for(
            lambda: [obj for _, obj in framework_log.records()],
            TIMEOUT,
            message=lambda: "no framework notification\n" + scenario.publisher.tail(),
        )
        assert {(n["capability"], n["change"]) for n in notes} == {("resourcelist", "updated")}
        # The derived Change List holds what was logged, for rsnotify and resync 2.0.1 alike.
        logged = expected_from_log([obj for _, obj in reader.records()])
        directory = source.root / "cl" / cid
        wait_for(
            lambda: (
                (directory / INDEX_NAME).exists() and len(written_entries(directory)) >= len(logged)
            ),
            TIMEOUT,
            interval=0.1,
            message=lambda: "the derived Change List was not written\n" + scenario._tail(),
        )
        assert [entry_fields(e) for e in written_entries(directory)] == logged
        index_url = f"{server.url}/cl/{cid}/{INDEX_NAME}"
        assert [resync_fields(r) for r in resync_read(index_url)] == logged


def test_lost_snapshot_maps_make_the_publisher_record_again_not_stop(
    rl_source: tuple[ResourceListSource, HttpServer],
    rsnotify_process: Callable[..., ManagedProcess],
    tmp_path: Path,
) -> None:
    """A wiped map directory is a coverage hole: said, counted, and detection goes on."""
    source, server = rl_source
    state = tmp_path / "state"
    cid = collection_id(source.capability_list)
    reader = SQLiteReader(state, cid)
    args = ["publish", source.capability_list, "--poll", "0.1", "--state-dir", state]
    scenario = Scenario(source, server, lambda: rsnotify_process(*args), reader)
    scenario.wait_recorded()
    _changes(source, 1)
    scenario.publish_round()
    scenario.wait_logged()
    for blob in (state / "snapshots" / cid).iterdir():
        blob.unlink()
    # The changes of this round cannot be told apart: the snapshot is recorded again.
    _changes(source, 2)
    source.commit()
    scenario.snapshot = source.snapshot()
    wait_for(
        lambda: w3c(source.at) in (reader.checkpoint() or ""),
        TIMEOUT,
        interval=0.05,
        message=lambda: "the snapshot was never recorded again\n" + scenario.publisher.tail(),
    )
    assert "map of its previous snapshot is gone" in scenario.publisher.output()
    scenario.after_hole[len(reader.records()) + 1] = w3c(source.at)
    scenario.check_log()  # round 1 alone
    _changes(source, 3)
    scenario.publish_round()
    scenario.wait_logged()
    assert len(reader.records()) == 2 * 6


def test_an_ha_standby_that_takes_over_diffs_from_the_maps_in_redis(
    rl_source: tuple[ResourceListSource, HttpServer],
    rsnotify_process: Callable[..., ManagedProcess],
    redis_server: Redis,
    tmp_path: Path,
) -> None:
    """Two ``--ha`` publishers, each with its own state directory; the leader is killed.

    The standby finds the last snapshot's maps in Redis and logs the changes
    made since, exactly: with the maps only on the dead leader's disk it
    could only record the snapshot again, and those changes would be lost.
    """
    import redis

    source, server = rl_source
    cid = collection_id(source.capability_list)
    group = "rl-ha"
    r = redis.Redis.from_url(redis_server.url)

    def publisher(name: str) -> ManagedProcess:
        return rsnotify_process(
            "publish", source.capability_list, "--poll", "0.1", "--redis", redis_server.url,
            "--ha", "--ha-group", group, "--lease-ttl", "1", "--state-dir", tmp_path / name,
            name=name,
        )  # fmt: skip

    def leader() -> int | None:
        value = r.get(f"rsn:leader:{group}")
        return int(value.decode().split(":")[-2]) if value is not None else None  # host:pid:token

    reader = RedisReader(redis_server.url, cid)
    scenario = Scenario(source, server, lambda: publisher("pub-a"), reader)
    standby = publisher("pub-b")
    scenario.wait_recorded()
    _changes(source, 1)
    scenario.publish_round()
    scenario.wait_logged()
    first = wait_for(leader, TIMEOUT, message="no leader")
    dead, alive = (
        (scenario.publisher, standby)
        if first == scenario.publisher.pid
        else (standby, scenario.publisher)
    )
    dead.kill()  # kill -9: no clean hand-over
    _changes(source, 2)
    scenario.publish_round()
    wait_for(lambda: leader() == alive.pid, TIMEOUT, message=lambda: "no takeover\n" + alive.tail())
    scenario.publisher = alive
    scenario.wait_logged()
    scenario.wait_polls()
    scenario.check_log()
    assert len(reader.records()) == 2 * 6


def test_a_diff_longer_than_a_detection_pass_is_logged_whole_across_a_kill(
    rl_source: tuple[ResourceListSource, HttpServer],
    rsnotify_process: Callable[..., ManagedProcess],
    tmp_path: Path,
) -> None:
    """4,500 creations: three detection passes (``more``), appended 1,000 at a time.

    Ten share each second, so every 1,000th falls on a new second: the
    Change Notification intervals must chain across those batch boundaries.

    The publisher is killed (-9) once the log holds some of them (here,
    every run: after the first 1,000); the one started after it resumes inside
    the same diff (the checkpoint's half-consumed position): every change
    once, in order.
    """
    source, server = rl_source
    state = tmp_path / "state"
    cid = collection_id(source.capability_list)
    reader = SQLiteReader(state, cid)
    args = ["publish", source.capability_list, "--poll", "0.1", "--state-dir", state]
    scenario = Scenario(source, server, lambda: rsnotify_process(*args), reader)
    scenario.wait_recorded()
    at = source.at
    for i in range(4500):
        source.put(f"bulk{i:05}.txt", f"bulk {i}".encode(), lastmod=at + i % 450)
    scenario.publish_round()
    wait_for(lambda: len(reader.records()) >= 1000, TIMEOUT, interval=0.005)
    scenario.publisher.kill()
    partial = len(reader.records())
    scenario.resumed.add(partial + 1)
    scenario.publisher = scenario.start_publisher()
    scenario.wait_logged()
    scenario.wait_polls()
    scenario.check_log()
    assert len(reader.records()) == 4500
    print(f"killed with {partial} of 4500 logged")
