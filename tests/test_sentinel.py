"""Redis Sentinel: the URL form, and clients that follow the primary through a failover.

Real ``redis-server`` processes (a primary, a replica, three Sentinels) on
loopback; the primary is ``kill -9``'d and the Sentinels promote the replica.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import RedisError

from rsnotify import argtypes, report
from rsnotify.collection import collection_id
from rsnotify.dashboard.collector import Collector
from rsnotify.dashboard.state import DashboardState
from rsnotify.errors import CursorStoreUnavailable, LogConflict, LogUnavailable
from rsnotify.log.redis_log import RedisLog
from rsnotify.publisher.leader import LeaderElection
from rsnotify.redisurl import SentinelTarget, parse_sentinel
from rsnotify.subscriber.cursor import Cursor
from rsnotify.subscriber.redis_cursor import RedisCursorStore
from rsnotify.tracker import Checkpoint
from rsnotify.transport.topics import Topics
from rsnotify.transport.websubstore import RedisStore
from tests.devstack import (
    ManagedProcess,
    Mosquitto,
    Redis,
    SentinelGroup,
    async_wait_for,
    free_port,
    wait_for,
)
from tests.failover import (
    MqttSeqRecorder,
    WsSeqRecorder,
    change_list,
    check_log_and_witnesses,
    made,
    post,
    start_push_stack,
)
from tests.helpers import freeze_and_converge


@pytest.mark.parametrize(
    ("url", "target"),
    [
        (
            "redis+sentinel://127.0.0.1:26379/rsn",
            SentinelTarget(sentinels=(("127.0.0.1", 26379),), service="rsn"),
        ),
        (
            "redis+sentinel://:s3cret@a:1,b:2,[::1]:3/my%20svc/4?sentinel_password=x",
            SentinelTarget(
                sentinels=(("a", 1), ("b", 2), ("::1", 3)),
                service="my svc",
                db=4,
                password="s3cret",
                sentinel_password="x",
            ),
        ),
        (
            "redis+sentinel://user:pw@a:1/rsn/0",
            SentinelTarget(sentinels=(("a", 1),), service="rsn", username="user", password="pw"),
        ),
    ],
)
def test_sentinel_urls_parse(url: str, target: SentinelTarget) -> None:
    assert parse_sentinel(url) == target
    assert argtypes.redis_url(url) == url


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://a/rsn",  # no port
        "redis+sentinel://a:1,b/rsn",
        "redis+sentinel://a:99999/rsn",
        "redis+sentinel://a:1/",  # no service
        "redis+sentinel://a:1/rsn/x",
        "redis+sentinel://a:1/rsn/0/more",
        "redis+sentinel://a:1/rsn?db=2",  # unknown parameter
    ],
)
def test_bad_sentinel_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        parse_sentinel(url)
    with pytest.raises(argparse.ArgumentTypeError, match="not a Redis Sentinel URL"):
        argtypes.redis_url(url)


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[SentinelGroup]:
    group = SentinelGroup(tmp_path / "sentinel")
    try:
        yield group.start()
    finally:
        group.stop()


async def test_the_log_follows_the_primary_through_a_failover(
    sentinel_group: SentinelGroup,
) -> None:
    log = RedisLog(sentinel_group.url, socket_timeout=1.0)
    try:
        head = await log.append("c", [b"one", b"two"], expected_head=0, checkpoint="1")
        assert head == 2
        old, new = await asyncio.to_thread(sentinel_group.fail_over)
        assert old is not new

        async def append_again() -> bool:
            nonlocal head
            try:
                head = await log.append(
                    "c", [b"three"], expected_head=await log.head("c"), checkpoint="2"
                )
            except (LogUnavailable, LogConflict):
                return False
            return True

        await async_wait_for(append_again, timeout=20, message="no append on the new primary")
        client = new.client()
        try:
            assert client.hget("rsn:{c}:meta", "checkpoint") == b"2"
        finally:
            client.close()
        assert [r.seq for r in await log.read("c", 0)][-1] == head
    finally:
        await log.close()


def _describe(group: SentinelGroup, cid: str, recorder: MqttSeqRecorder) -> str:
    client = group.primary().client()
    try:
        meta = client.hgetall(f"rsn:{{{cid}}}:meta")
        cursors = client.hgetall(f"rsn:{{{cid}}}:cursors")
    finally:
        client.close()
    received = max(recorder.seqs[cid], default=0)
    return f"log meta {meta.get(b'head')}, cursors {cursors}, received up to {received}"


@dataclass
class FailoverRun:
    """What :func:`run_failovers` saw: the witnesses, the pauses, the Change Lists, the log."""

    collection: str
    witnesses: list[MqttSeqRecorder | WsSeqRecorder]
    pauses: list[float]  # the worst pause in pushing per failover (s), as the MQTT witness saw
    expected: list[tuple[str, str, str]]  # the Change Lists' entries, in order
    logged: list[dict[str, Any]]  # the log's envelopes at the end


def run_failovers(
    tmp_path: Path,
    mosquitto: Mosquitto,
    group: SentinelGroup,
    *,
    changes: int,
    failovers: int,
) -> FailoverRun:
    """A publisher and a WebSocket gateway on ``group`` push ``changes`` at 200/s while the
    primary is killed ``failovers`` times.

    Two independent witnesses (an MQTT subscriber, a WebSocket client) record
    seq -> entry; two ``rsnotify subscribe`` mirrors (one per transport,
    cursors in the Sentinel group too) must converge on the Source at the end.
    """
    ws_port = free_port()
    processes: list[ManagedProcess] = []
    witnesses: list[MqttSeqRecorder | WsSeqRecorder] = []

    def run(*args: str, name: str) -> ManagedProcess:
        process = ManagedProcess.rsnotify(*args, workdir=tmp_path, name=name).start()
        processes.append(process)
        return process

    try:
        sim = run(
            "simulate", "--port", "0", "--rate", "200", "--max-changes", str(changes),
            "--changelist-size", "500", "--resources", "50", "--paused", "--seed", "19",
            name="simulate",
        )  # fmt: skip
        base = sim.wait_for_line(r"serving (http://\S+)").group(1)
        cid = collection_id(f"{base}c1/capabilitylist.xml")
        stack = start_push_stack(run, base, group.url, mosquitto, ws_port, tmp_path, collections=1)
        publisher, gateway = stack.publisher, stack.gateway
        mirrors, subscribers = stack.mirrors, stack.subscribers
        mqtt_witness = MqttSeqRecorder(mosquitto, [Topics().changes(cid)], "sentinel-test-sub")
        witnesses += [mqtt_witness, WsSeqRecorder(f"ws://127.0.0.1:{ws_port}/", [cid])]
        post(f"{base}_simulator/resume")
        pauses = []
        spacing = changes // (failovers + 1)
        for k in range(1, failovers + 1):
            # In steady state (the witnesses caught up with the Source), so the
            # pause measured is the failover's, not a backlog's.
            wait_for(
                lambda k=k: (
                    (n := made(base)) >= k * spacing
                    and all(w.count() >= n - 100 for w in witnesses)
                ),
                timeout=60,
                interval=0.05,
            )
            killed = time.monotonic()
            group.fail_over()
            arrived = mqtt_witness.count()
            wait_for(
                lambda arrived=arrived: mqtt_witness.count() >= min(changes, arrived + 50),
                timeout=30,
                message=lambda: (
                    f"no pushes after the failover; {_describe(group, cid, mqtt_witness)}\n"
                    + publisher.tail()
                ),
            )
            pauses.append(mqtt_witness.worst_pause_after(killed))
        for witness in witnesses:
            wait_for(
                lambda w=witness: w.count() >= changes,
                timeout=90,
                message=lambda w=witness: (
                    f"{type(w).__name__} has {w.count()} of {changes}, {w.missing(changes)}\n"
                    + publisher.tail()
                    + gateway.tail()
                ),
            )
        expected = change_list(base)
        client = group.primary().client()
        try:
            rows = client.xrange(f"rsn:{{{cid}}}:log", "-", "+")
        finally:
            client.close()
        logged = [json.loads(fields[b"d"]) for _, fields in rows]
        for name, mirror in mirrors.items():
            freeze_and_converge(base, mirror, converge_timeout=90)
            assert subscribers[name].running, subscribers[name].tail()
        assert publisher.running and gateway.running
        return FailoverRun(cid, witnesses, pauses, expected, logged)
    finally:
        for witness in witnesses:
            witness.close()
        for process in reversed(processes):
            process.terminate()


def test_failover_under_load_never_gives_a_pushed_seq_another_entry(
    tmp_path: Path, mosquitto: Mosquitto, sentinel_group: SentinelGroup
) -> None:
    """Issue 19 acceptance, first bullet, scaled to stay under a minute.

    5,000 changes at 200/s; the primary is ``kill -9``'d three times (each
    time the replica is promoted and the old primary comes back as a
    replica).  An independent MQTT subscriber and an independent WebSocket
    client record seq -> entry: no seq may map to two entries, every seq
    arrives, the log equals the Change Lists entry for entry, and two
    ``rsnotify subscribe`` mirrors (MQTT, WebSocket) converge on the Source.
    Replication before push is on (the default with a Sentinel URL: one
    replica).
    """
    changes = 5000
    run = run_failovers(tmp_path, mosquitto, sentinel_group, changes=changes, failovers=3)
    assert len(run.expected) == changes
    check_log_and_witnesses(run.collection, run.logged, run.expected, list(run.witnesses))
    print(f"worst pause in pushing per failover (s): {[round(p, 2) for p in run.pauses]}")
    assert len(run.pauses) == 3


@pytest.mark.parametrize("wait_replicas", [0, 1])
async def test_without_replication_waiting_a_failover_reuses_pushed_seqs(
    sentinel_group: SentinelGroup, wait_replicas: int
) -> None:
    """Why replication before push exists (marked so: with 0 the problem shows).

    The replica is down while entries 4..6 are appended; the primary then
    stops answering, the replica comes back and is promoted without them,
    and a restarted publisher (nothing in memory) numbers other entries
    4..6.  Without waiting, a reader (any transport) had already seen the
    first 4..6: seq 4 now means two entries.  With waiting, 4..6 were held
    back until a replica had them, which never happened: no reader saw them.
    """
    group = sentinel_group
    primary, replica = group.servers
    sentinels = group.sentinels
    reader = RedisLog(group.url, socket_timeout=1.0)
    log = RedisLog(group.url, socket_timeout=1.0, wait_replicas=wait_replicas, wait_timeout=0.2)
    held: asyncio.Task[int] | None = None
    try:
        await log.append("c", [b"a1", b"a2", b"a3"], expected_head=0, checkpoint="3")
        await async_wait_for(group.replicas_in_sync, message="replica lagging")
        await replica.async_stop()
        held = asyncio.create_task(
            log.append("c", [b"b4", b"b5", b"b6"], expected_head=3, checkpoint="6")
        )
        await async_wait_for(lambda: _meta_head(primary) == 6, message="no append")
        seen = {r.seq: r.data for r in await reader.read("c", 0)}  # what a transport pushes
        assert held.done() == (wait_replicas == 0)
        # The primary stops answering; the replica, back without 4..6, is promoted.
        primary.pause()
        await replica.async_start()
        await async_wait_for(
            lambda: all(s.primary_address() == (replica.host, replica.port) for s in sentinels),
            timeout=30,
            interval=0.1,
            message="the replica was not promoted",
        )
        primary.kill()
        # A restarted publisher appends what the (changed) Change Lists hold now.
        async with RedisLog(group.url, socket_timeout=1.0) as restarted:
            head = await restarted.head("c")
            assert head == 3, "the promoted replica lacks 4..6"
            await restarted.append("c", [b"c4", b"c5", b"c6"], expected_head=3, checkpoint="6'")
        now = {r.seq: r.data for r in await reader.read("c", 0)}
        reused = sorted(seq for seq, data in seen.items() if now.get(seq) != data)
        if wait_replicas:
            assert sorted(seen) == [1, 2, 3] and reused == []
        else:
            assert reused == [4, 5, 6], "the problem replication waiting prevents"
    finally:
        if held is not None:
            held.cancel()
            with contextlib.suppress(asyncio.CancelledError, LogUnavailable):
                await held
        await log.close()
        await reader.close()


def _meta_head(server: Redis) -> int:
    client = server.client(socket_timeout=1.0)
    try:
        return int(client.hget("rsn:{c}:meta", "head") or 0)
    finally:
        client.close()


async def test_every_component_follows_the_primary_through_a_failover(
    sentinel_group: SentinelGroup,
) -> None:
    """Leader leases, subscriber cursors, WebSub subscriptions, dashboard, telemetry."""
    url = sentinel_group.url
    election = LeaderElection(url, group="g", owner="o")
    cursors = RedisCursorStore(url, "dest", socket_timeout=1.0, patience=20.0)
    subscriptions = RedisStore(url, socket_timeout=1.0)
    telemetry = report.connect(url)
    collector = Collector(url, DashboardState(time.time()))
    cursor = Cursor("c", "http://s/c/capabilitylist.xml", 7, Checkpoint(), True)

    async def all_work() -> bool:
        try:
            if not await election.renew():  # the lease lapses during a failover (3 s TTL)
                election.leadership = None
                await election.try_acquire()
            await cursors.put(cursor)
            assert await cursors.get("c") == cursor
            assert await subscriptions.load() == []
            await telemetry.ping()
        except (RedisError, CursorStoreUnavailable, LogUnavailable):
            return False
        await collector.refresh()
        return collector.ok and election.leadership is not None

    try:
        await async_wait_for(all_work, timeout=10, message="not working before the failover")
        await asyncio.to_thread(sentinel_group.fail_over)
        await async_wait_for(all_work, timeout=20, message="not working after the failover")
    finally:
        await election.close()
        await cursors.close()
        await subscriptions.close()
        await telemetry.aclose()
        await collector.stop()
