"""Redis Cluster (issue 19 item 3): the URL form, every client on a cluster, failover under load.

Real ``redis-server --cluster-enabled yes`` processes on loopback (three
primaries, one replica each, :class:`tests.devstack.RedisCluster`); a primary
is ``kill -9``'d and its replica promoted by the cluster's own failover.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.crc import key_slot
from redis.exceptions import RedisClusterException, RedisError

from rsnotify import argtypes, redisurl, report
from rsnotify.collection import collection_id
from rsnotify.dashboard.collector import Collector
from rsnotify.dashboard.state import DashboardState
from rsnotify.errors import CursorStoreUnavailable, LogConflict, LogUnavailable
from rsnotify.log.redis_blobs import RedisBlobs, snapshots_key
from rsnotify.log.redis_log import RedisLog
from rsnotify.publisher.leader import LeaderElection
from rsnotify.redisurl import ClusterTarget, parse_cluster
from rsnotify.subscriber.cursor import Cursor
from rsnotify.subscriber.redis_cursor import RedisCursorStore
from rsnotify.tracker import Checkpoint
from rsnotify.transport.topics import Topics
from rsnotify.transport.websubproto import Subscription as WebSubSubscription
from rsnotify.transport.websubstore import RedisStore, to_json
from tests.devstack import (
    ManagedProcess,
    Mosquitto,
    Redis,
    RedisCluster,
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
        ("redis+cluster://127.0.0.1:7000", ClusterTarget(nodes=(("127.0.0.1", 7000),))),
        (
            "redis+cluster://u:p%40ss@a:1,b:2,[::1]:3/0",
            ClusterTarget(nodes=(("a", 1), ("b", 2), ("::1", 3)), username="u", password="p@ss"),
        ),
        ("redis+cluster://:pw@a:1/", ClusterTarget(nodes=(("a", 1),), password="pw")),
    ],
)
def test_cluster_urls_parse(url: str, target: ClusterTarget) -> None:
    assert parse_cluster(url) == target
    assert argtypes.redis_url(url) == url


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+cluster://a:1/2", "only database 0"),
        ("redis+cluster://a/", "host:port"),
        ("redis+cluster://a:1,b/", "host:port"),
        ("redis+cluster://a:1/x", "empty, / or /0"),
        ("redis+cluster://a:1/0/more", "empty, / or /0"),
        ("redis+cluster://a:1/?db=0", "unknown parameter"),
    ],
)
def test_bad_cluster_urls_are_refused(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_cluster(url)
    with pytest.raises(argparse.ArgumentTypeError, match="not a Redis Cluster URL"):
        argtypes.redis_url(url)


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    cluster = RedisCluster(tmp_path / "cluster")
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _spread(cluster: RedisCluster, count: int) -> list[str]:
    """``count`` collection names whose logs land on every primary."""
    owners: dict[int, list[str]] = {}
    for i in itertools.count(1):
        name = f"c{i}"
        owners.setdefault(cluster.primary_for(f"rsn:{{{name}}}:log").port, []).append(name)
        if len(owners) == cluster.primary_count and sum(map(len, owners.values())) >= count:
            break
    picked = [names.pop(0) for names in owners.values()]
    rest = [name for names in owners.values() for name in names]
    return (picked + rest)[:count]


async def test_wait_goes_to_the_primary_owning_the_collection(
    redis_cluster: RedisCluster,
) -> None:
    """Replication before push per shard: one shard without its replica holds only its own.

    If ``WAIT`` went to another primary (or to every primary, as redis-py
    routes a keyless command) the held collection would be pushed anyway, or
    the others held too.
    """
    cluster = redis_cluster
    held, free = _spread(cluster, 2)
    owner = cluster.primary_for(f"rsn:{{{held}}}:log")
    assert cluster.primary_for(f"rsn:{{{free}}}:log") is not owner
    replica = cluster.replica_of(owner)
    async with RedisLog(cluster.url, socket_timeout=1.0, wait_replicas=1, wait_timeout=0.1) as log:
        for cid in (held, free):
            assert await log.append(cid, [b"a"], expected_head=0, checkpoint="1") == 1
        await replica.async_stop()
        append = asyncio.create_task(log.append(held, [b"b"], expected_head=1, checkpoint="2"))
        try:
            assert await log.append(free, [b"b"], expected_head=1, checkpoint="2") == 2
            assert [r.data for r in await log.read(free, 0)] == [b"a", b"b"]
            await async_wait_for(lambda: _pending(owner, held) == 1, message="nothing staged")
            assert [r.data for r in await log.read(held, 0)] == [b"a"]  # no transport sees b
            assert not append.done()
            await replica.async_start()
            assert await asyncio.wait_for(append, timeout=30) == 2
            assert [r.data for r in await log.read(held, 0)] == [b"a", b"b"]
        finally:
            append.cancel()


def _pending(node: object, cid: str) -> int:
    client = node.client(socket_timeout=1.0)  # type: ignore[attr-defined]
    try:
        return int(client.xlen(f"rsn:{{{cid}}}:pending"))
    finally:
        client.close()


async def test_the_log_follows_a_failover(redis_cluster: RedisCluster) -> None:
    """The log, and the snapshot maps its checkpoints name, survive a primary's failover.

    A map is written before the append whose checkpoint names it; the append
    waits for a replica, and Redis replicates in order, so the new primary
    holds the map too (rsnotify.log.redis_blobs).
    """
    cluster = redis_cluster
    names = _spread(cluster, 3)
    blob_client = redisurl.client(cluster.url, socket_timeout=1.0)
    maps = {cid: RedisBlobs(blob_client, cid) for cid in names}
    async with RedisLog(cluster.url, socket_timeout=1.0, wait_replicas=1) as log:
        for cid in names:
            await maps[cid].put("old", b"map of " + cid.encode())
            await maps[cid].put("named", b"map named by " + cid.encode())
            assert await log.append(cid, [b"one", b"two"], expected_head=0, checkpoint="1") == 2
            # In the collection's slot, on the primary that holds its log.
            owner = cluster.primary_for(f"rsn:{{{cid}}}:log")
            stored = owner.call("HGET", snapshots_key(cid), "named")
            assert stored == b"map named by " + cid.encode()
        victim = cluster.primary_for(f"rsn:{{{names[0]}}}:log")
        failed = await asyncio.to_thread(cluster.fail_over, victim)
        assert cluster.primary_for(f"rsn:{{{names[0]}}}:log") is failed.new

        async def append_again(cid: str) -> bool:
            try:
                await log.append(cid, [b"three"], expected_head=2, checkpoint="2")
            except (LogUnavailable, LogConflict):
                return False
            return True

        for cid in names:
            await async_wait_for(lambda c=cid: append_again(c), timeout=20, interval=0.1)
            assert [r.data for r in await log.read(cid, 0)] == [b"one", b"two", b"three"]
            assert await log.checkpoint(cid) == "2"
            assert await maps[cid].get("named") == b"map named by " + cid.encode()
            await maps[cid].keep({"named"})
            assert await maps[cid].get("old") is None
            assert await maps[cid].get("named") is not None
    await blob_client.aclose()


async def test_every_component_works_on_a_cluster_through_a_failover(
    redis_cluster: RedisCluster,
) -> None:
    """Leader leases, subscriber cursors, WebSub subscriptions, dashboard, telemetry."""
    url = redis_cluster.url
    election = LeaderElection(url, group="g", owner="o")
    cursors = RedisCursorStore(url, "dest", socket_timeout=1.0, patience=20.0)
    subscriptions = RedisStore(url, socket_timeout=1.0)
    telemetry = report.connect(url)
    collector = Collector(url, DashboardState(time.time()))
    cursor = Cursor("c", "http://s/c/capabilitylist.xml", 7, Checkpoint(), True)
    names = _spread(redis_cluster, 3)
    sub = WebSubSubscription(
        collection="c", topic="http://t/c", callback="http://cb/", secret=None,
        lease_seconds=60, expires=time.time() + 60, cursor=3,
    )  # fmt: skip

    async def all_work() -> bool:
        try:
            if not await election.renew():  # the lease may lapse during a failover
                election.leadership = None
                await election.try_acquire()
            await cursors.put(cursor)
            assert await cursors.get("c") == cursor
            await cursors.event("c", "gap", "test")  # MULTI/EXEC on one slot
            await subscriptions.save(sub)  # MULTI/EXEC over both hashes
            await subscriptions.save_cursors({("c", "http://cb/"): 5})  # the Lua script
            assert [s.cursor for s in await subscriptions.load()] == [5]
            await telemetry.ping()
            # What the dashboard reads: statuses on several slots, logs on several primaries.
            pipe = telemetry.pipeline(transaction=False)
            for i, cid in enumerate(names):
                pipe.set(report.subscriber_key(f"s{i}"), json.dumps({"collection": cid}))
                pipe.zadd(report.SUBSCRIBERS_KEY, {f"s{i}": time.time()})
                pipe.hset("rsn:collections", cid, f"http://s/{cid}/capabilitylist.xml")
            pipe.xadd(report.EVENTS_KEY, {"c": "c", "k": "gap", "a": str(time.time())})
            await pipe.execute()
        except (RedisError, RedisClusterException, CursorStoreUnavailable, LogUnavailable):
            return False
        await collector.refresh()
        return (
            collector.ok
            and election.leadership is not None
            and set(collector.state.subscribers) >= {"s0", "s1", "s2"}
            and set(collector.state.collections) >= set(names)
        )

    try:
        await collector.start()
        await async_wait_for(all_work, timeout=10, message="not working before the failover")
        await async_wait_for(
            lambda: any(e["kind"] == "gap" for e in collector.state.events),
            timeout=10,
            message="the dashboard's event tail read nothing",
        )
        victim = redis_cluster.primary_for("rsn:{websub}:subscriptions")
        await asyncio.to_thread(redis_cluster.fail_over, victim)
        await async_wait_for(all_work, timeout=20, message="not working after the failover")
    finally:
        await election.close()
        await cursors.close()
        await subscriptions.close()
        await telemetry.aclose()
        await collector.stop()


# -- acceptance: 3 primaries, 6 collections, 3,000 changes, a primary killed mid-run ---------

COLLECTIONS = 6
CHANGES = 3000


def _spread_port(cluster: RedisCluster) -> tuple[int, list[str]]:
    """A port for the simulator whose 6 collection ids land on every primary.

    The ids (and so the slots) depend on the Source's URL, port included;
    choosing the port makes the spread part of the set-up, not luck.
    """
    ranges = [
        (int(low), int(high), int(owner[1]))
        for low, high, owner, *_ in cluster.nodes[0].call("CLUSTER", "SLOTS")
    ]
    for _ in range(100):
        port = free_port()
        ids = [
            collection_id(f"http://127.0.0.1:{port}/c{i}/capabilitylist.xml")
            for i in range(1, COLLECTIONS + 1)
        ]
        slots = [key_slot(f"rsn:{{{cid}}}:log".encode()) for cid in ids]
        owners = {p for s in slots for low, high, p in ranges if low <= s <= high}
        if len(owners) == cluster.primary_count:
            return port, ids
    raise AssertionError("no port spreads the collections over every primary")


@pytest.mark.timeout(240)
def test_cluster_failover_under_load_never_gives_a_pushed_seq_another_entry(
    tmp_path: Path, mosquitto: Mosquitto, redis_cluster: RedisCluster
) -> None:
    """Issue 19 acceptance, Cluster bullet.

    Three primaries with a replica each; six collections over the shards;
    3,000 changes; a publisher (MQTT), a WebSocket gateway (``--ws-only``)
    and two ``rsnotify subscribe`` mirrors (one per transport, their cursors
    and telemetry in the cluster too), all on the cluster.  The primary
    owning the most collections is ``kill -9``'d mid-run and its replica
    promoted.  An independent MQTT subscriber and an
    independent WebSocket client record seq -> entry: no seq may map to two
    entries, every entry arrives, each collection's log equals its Change
    Lists entry for entry, and both mirrors converge on the Source.
    """
    cluster = redis_cluster
    port, ids = _spread_port(cluster)
    keys = {cid: f"rsn:{{{cid}}}:log" for cid in ids}
    owners = {cid: cluster.primary_for(key) for cid, key in keys.items()}
    assert len({n.port for n in owners.values()}) >= 2, "collections spread over shards"
    ws_port = free_port()
    processes: list[ManagedProcess] = []
    recorders: list[MqttSeqRecorder | WsSeqRecorder] = []

    def run(*args: str, name: str) -> ManagedProcess:
        process = ManagedProcess.rsnotify(*args, workdir=tmp_path, name=name).start()
        processes.append(process)
        return process

    try:
        sim = run(
            "simulate", "--port", str(port), "--collections", str(COLLECTIONS),
            "--rate", "200", "--max-changes", str(CHANGES), "--changelist-size", "300",
            "--resources", "20", "--paused", "--seed", "19",
            "--hub", f"ws://127.0.0.1:{ws_port}/{{id}}",
            "--hub", f"{mosquitto.url}/resourcesync/{{id}}/changes",
            name="simulate",
        )  # fmt: skip
        base = sim.wait_for_line(r"serving (http://\S+)").group(1)
        assert base == f"http://127.0.0.1:{port}/"
        stack = start_push_stack(
            run, base, cluster.url, mosquitto, ws_port, tmp_path,
            collections=COLLECTIONS, report=True,  # cursors and telemetry on the cluster too
        )  # fmt: skip
        publisher, gateway = stack.publisher, stack.gateway
        mirrors, subscribers = stack.mirrors, stack.subscribers
        mqtt_witness = MqttSeqRecorder(
            mosquitto, [Topics().changes(cid) for cid in ids], "cluster-test-sub"
        )
        ws_witness = WsSeqRecorder(f"ws://127.0.0.1:{ws_port}/", ids)
        recorders += [mqtt_witness, ws_witness]
        post(f"{base}_simulator/resume")

        # Mid-run, in steady state (the witnesses keep up with the Source).
        wait_for(
            lambda: (
                (n := made(base)) >= CHANGES * 2 // 5
                and all(r.count() >= n - 100 for r in recorders)
            ),
            timeout=60,
            interval=0.05,
            message=lambda: f"no steady state: {made(base)}, {[r.count() for r in recorders]}",
        )
        victim = max(set(owners.values()), key=lambda n: list(owners.values()).count(n))
        killed = time.monotonic()
        failover = cluster.fail_over(victim)
        assert cluster.primary_for(keys[next(c for c in ids if owners[c] is victim)]) is (
            failover.new
        )
        for recorder in recorders:
            wait_for(
                lambda r=recorder: r.count() >= CHANGES,
                timeout=90,
                message=lambda r=recorder: (
                    f"{type(r).__name__} has {r.count()} of {CHANGES}\n"
                    + publisher.tail()
                    + gateway.tail()
                ),
            )

        expected = {cid: change_list(base, f"c{i}") for i, cid in enumerate(ids, start=1)}
        assert sum(map(len, expected.values())) == CHANGES
        for cid in ids:
            node = cluster.primary_for(keys[cid])
            client = node.client()
            try:
                rows = client.xrange(keys[cid], "-", "+")
                assert client.exists(f"rsn:{{{cid}}}:pending") == 0
            finally:
                client.close()
            logged = [json.loads(fields[b"d"]) for _, fields in rows]
            check_log_and_witnesses(cid, logged, expected[cid], list(recorders))
        for name, mirror in mirrors.items():
            freeze_and_converge(base, mirror, converge_timeout=90)
            assert subscribers[name].running, subscribers[name].tail()
        # The cursors the subscribers keep in the cluster reach the end of every log.
        wanted = {cid: len(expected[cid]) for cid in ids}
        for name in mirrors:
            wait_for(
                lambda n=name: _cursors(cluster, f"sub-{n}") == wanted,
                timeout=30,
                interval=0.2,
                message=lambda n=name: f"{n}: {_cursors(cluster, f'sub-{n}')} != {wanted}",
            )
        assert publisher.running and gateway.running
        hit = [cid for cid in ids if owners[cid] is victim]
        pauses = [round(r.worst_pause_after(killed, hit), 2) for r in recorders]
        print(
            f"\ncluster failover: promoted in {failover.seconds:.1f} s "
            f"({'forced TAKEOVER' if failover.forced else 'automatic'}); "
            f"worst pause in pushing its {len(hit)} collections "
            f"(MQTT, WebSocket witnesses): {pauses} s; "
            f"WebSocket connections: {ws_witness.connections}"
        )
    finally:
        for recorder in recorders:
            recorder.close()
        for process in reversed(processes):
            process.terminate()


def _cursors(cluster: RedisCluster, destination: str) -> dict[str, int | None]:
    """The last seq of each collection in a subscriber's cursors (``--redis``)."""
    key = f"rsn:dest:{{{destination}}}:cursors"
    client = cluster.primary_for(key).client()
    try:
        return {k.decode(): json.loads(v)["last_seq"] for k, v in client.hgetall(key).items()}
    finally:
        client.close()


async def test_websub_subscriptions_stored_before_the_hash_tag_are_renamed(
    redis_server: Redis,
) -> None:
    """A single server's ``rsn:websub:*`` hashes (before ``{websub}``) load as before."""
    sub = WebSubSubscription(
        collection="c", topic="http://t/c", callback="http://cb/", secret=None,
        lease_seconds=60, expires=time.time() + 60, cursor=3,
    )  # fmt: skip
    client = redis_server.client()
    try:
        field = "c\nhttp://cb/"  # websubstore's field: collection, newline, callback
        client.hset("rsn:websub:subscriptions", field, to_json(sub))
        client.hset("rsn:websub:cursors", field, 9)
        store = RedisStore(redis_server.url)
        try:
            assert [(s.key, s.cursor) for s in await store.load()] == [(sub.key, 9)]
        finally:
            await store.close()
        assert client.exists("rsn:websub:subscriptions", "rsn:websub:cursors") == 0
        assert client.hget(RedisStore.CURSORS, field) == b"9"
    finally:
        client.close()
