"""Replication before push (issue 19, item 2): an entry is visible only once replicas hold it.

Real ``redis-server`` processes: a primary and a replica (``replicaof``).
With ``wait_replicas=1`` an append waits (``WAIT``) for the replica; while the
replica is down the entries stay in ``rsn:{c}:pending`` where no reader looks,
and appear in the log, same seqs, once it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

import aiohttp
import pytest
from redis.exceptions import ResponseError
from websockets.asyncio.client import connect

from rsnotify.log.redis_log import RedisLog
from rsnotify.transport.websub import WebSubHub
from rsnotify.transport.websubproto import HEAD_HEADER
from rsnotify.transport.websubstore import MemoryStore
from rsnotify.transport.ws import WebSocketGateway
from tests.devstack import Redis, async_wait_for, wait_for
from tests.test_transport_ws import (
    C1,
    C2,
    CAP1,
    CAP2,
    append,
    assert_dense,
    notifications,
    reached,
    recv,
    recv_until,
    url,
)


def _replica_in_sync(primary: Redis) -> bool:
    client = primary.client(socket_timeout=1.0)
    try:
        info = client.info("replication")
    finally:
        client.close()
    return info.get("connected_slaves") == 1 and info["slave0"]["state"] == "online"


def _pair(redis_factory: Callable[..., Redis]) -> tuple[Redis, Redis]:
    primary = redis_factory()
    replica = redis_factory(extra_config=f"replicaof {primary.host} {primary.port}")
    wait_for(lambda: _replica_in_sync(primary), timeout=20, message="the replica never synced")
    return primary, replica


async def test_an_append_is_visible_once_a_replica_holds_it(
    redis_factory: Callable[..., Redis],
) -> None:
    primary, replica = _pair(redis_factory)
    async with RedisLog(primary.url, wait_replicas=1, wait_timeout=0.2) as log:
        assert await log.append("c", [b"a", b"b"], expected_head=0, checkpoint="1") == 2
        assert [r.data for r in await log.read("c", 0)] == [b"a", b"b"]
        copy = replica.client()
        try:
            assert [f[b"d"] for _, f in copy.xrange("rsn:{c}:log")] == [b"a", b"b"]
            assert copy.hget("rsn:{c}:meta", "head") == b"2"
        finally:
            copy.close()


async def test_without_a_replica_entries_stay_unpushed_until_one_acknowledges(
    redis_factory: Callable[..., Redis],
) -> None:
    primary, replica = _pair(redis_factory)
    async with RedisLog(primary.url, wait_replicas=1, wait_timeout=0.1) as log:
        await log.append("c", [b"a"], expected_head=0, checkpoint="1")
        await replica.async_stop()
        append = asyncio.create_task(log.append("c", [b"b"], expected_head=1, checkpoint="2"))
        client = primary.client()
        try:
            await async_wait_for(
                lambda: client.xlen("rsn:{c}:pending") == 1, message="nothing staged"
            )
            # Sequenced and checkpointed, but no reader (no transport, no gateway) sees it.
            assert client.hget("rsn:{c}:meta", "head") == b"2"
            assert [r.data for r in await log.read("c", 0)] == [b"a"]
            assert await log.wait("c", 1, timeout=0.2) == []
            assert not append.done()
            await replica.async_start()
            assert await asyncio.wait_for(append, timeout=30) == 2
            assert [(r.seq, r.data) for r in await log.read("c", 0)] == [(1, b"a"), (2, b"b")]
            assert client.exists("rsn:{c}:pending") == 0
        finally:
            append.cancel()
            client.close()


async def test_settle_releases_what_a_dead_publisher_left_pending(
    redis_factory: Callable[..., Redis],
) -> None:
    primary, replica = _pair(redis_factory)
    await replica.async_stop()
    async with RedisLog(primary.url, wait_replicas=1, wait_timeout=0.1) as dying:
        append = asyncio.create_task(dying.append("c", [b"a"], expected_head=0, checkpoint="1"))
        client = primary.client()
        try:
            await async_wait_for(lambda: client.xlen("rsn:{c}:pending") == 1, message="no stage")
        finally:
            client.close()
        append.cancel()  # the publisher died waiting for the replica
    await replica.async_start()
    async with RedisLog(primary.url, wait_replicas=1, wait_timeout=0.5) as log:
        assert await log.read("c", 0) == []
        assert await log.earliest("c") == 1  # held back, not trimmed away
        await log.settle("c")
        assert [(r.seq, r.data) for r in await log.read("c", 0)] == [(1, b"a")]
        assert await log.append("c", [b"b"], expected_head=1, checkpoint="2") == 2


async def test_with_no_replicas_asked_for_nothing_changes(redis_server: Redis) -> None:
    async with RedisLog(redis_server.url) as log:
        assert await log.append("c", [b"a"], expected_head=0, checkpoint="1") == 1
        await log.settle("c")
        assert [r.data for r in await log.read("c", 0)] == [b"a"]
        client = redis_server.client()
        try:
            assert client.exists("rsn:{c}:pending") == 0
        finally:
            client.close()


async def test_a_replay_waits_for_seqs_a_failover_left_held_back_and_never_skips_them(
    redis_server: Redis,
) -> None:
    """A Destination that saw seqs 6..7 before a failover resumes with since=7.

    The gateway's tailer read 1..10 from the old primary; the promoted
    replica holds 6..10 back (the release that made them visible was lost
    with the old primary: set up here by hand, as that replica would hold
    them), so the log ends at 5.  The ring keeps only 9..10, so 8 must come
    from the log.  ``skipped`` would tell the client 8..10 are gone for
    good; they are not, and arrive once the publisher settles the
    collection.  The same connection follows a second collection, which goes
    on meanwhile (with its heartbeats: a client's other collections must not
    wait with it).
    """
    async with RedisLog(redis_server.url) as log:
        await log.register(C1, CAP1)
        await log.register(C2, CAP2)
        gateway = WebSocketGateway(log, heartbeat=0.5, queue_size=2)
        await gateway.start()
        try:
            async with connect(url(gateway, f"/{C1}")) as first:
                assert (await recv(first))["type"] == "hello"
                await append(log, C1, 10)
                await recv_until(first, reached(C1, 10))
                # The first client stays: the tailer that read 1..10 must stay too.
                client = redis_server.client()
                try:  # the promoted replica: 1..5 in the log, 6..10 held back, same ids and entries
                    key, pending = f"rsn:{{{C1}}}:log", f"rsn:{{{C1}}}:pending"
                    rows = client.xrange(key)
                    client.delete(key)  # a stream remembers its last id: rebuild it
                    for seq_id, fields in rows:
                        seq = int(seq_id.split(b"-")[0])
                        client.xadd(key if seq <= 5 else pending, fields, id=seq_id)
                finally:
                    client.close()
                assert [r.seq for r in await log.read(C1, 0)] == [1, 2, 3, 4, 5]
                async with connect(url(gateway)) as ws:
                    await ws.send(json.dumps({"type": "subscribe", "collections": {C1: 7, C2: 0}}))
                    assert {(await recv(ws))["type"], (await recv(ws))["type"]} == {"hello"}

                    async def waiting() -> bool:
                        return gateway.replay_waits > 0

                    await async_wait_for(waiting, message="the replay never found the log behind")
                    await append(log, C2, 3)
                    other = await recv_until(
                        ws,
                        lambda fs: (
                            len(notifications(fs, C2)) == 3
                            and any(f["type"] == "heartbeat" and f["collection"] == C2 for f in fs)
                        ),
                        timeout=10,
                    )
                    assert gateway.replay_waits > 1, "C1 stopped looking"
                    await log.settle(C1)  # what a publisher does when it reloads the head
                    frames = other + await recv_until(ws, reached(C1, 10))
        finally:
            await gateway.stop()
    assert {f["type"] for f in frames} == {"notification", "heartbeat"}, frames
    assert_dense(notifications(frames, C1), 7, 10)
    assert_dense(notifications(frames, C2), 0, 3)


async def test_earliest_never_passes_entries_on_their_way_from_held_back_to_the_log(
    redis_factory: Callable[..., Redis],
) -> None:
    """``earliest`` reads the log, then what is held back, then the head.

    Read as three commands, a release landing between the first two made a
    collection whose first entries were just released look trimmed
    (earliest = head + 1), and a WebSocket client subscribing with since=0
    got ``gap_too_old`` for seqs the log holds (test_sentinel's witness lost
    seqs 1..4 that way).  Each collection's first append is one chance of
    that race; a reader polls ``earliest`` throughout.
    """
    primary, _ = _pair(redis_factory)
    collections = [f"c{i}" for i in range(150)]
    async with (
        RedisLog(primary.url, wait_replicas=1, wait_timeout=1.0) as writer,
        RedisLog(primary.url) as reader,
    ):
        wrong: list[tuple[str, int]] = []
        polls = 0
        for collection in collections:
            appending = asyncio.create_task(
                writer.append(collection, [b"a", b"b"], expected_head=0, checkpoint="2")
            )
            while True:
                done = appending.done()
                earliest = await reader.earliest(collection)
                polls += 1
                if earliest != 1:
                    wrong.append((collection, earliest))
                if done:
                    break
            assert await appending == 2
        assert wrong == [], f"{len(wrong)} wrong of {polls} reads: {wrong[:5]}"
        assert polls >= 2 * len(collections)


async def test_settle_releases_leftovers_without_replicas_and_a_release_stops_at_its_own_wait(
    redis_server: Redis,
) -> None:
    """Two rules of the release (rsnotify.log.redis_log).

    A run with ``--redis-wait-replicas 1`` that stopped while waiting leaves
    entries held back; a later run with 0 must still release them (it used
    to skip ``settle`` altogether).  And a release moves only up to the seq
    its WAIT covered: what another writer staged after stays held back
    (a deposed leader's late release must not push its successor's
    unreplicated entries).
    """
    async with RedisLog(redis_server.url, wait_replicas=1, wait_timeout=0.1) as dying:
        stuck = asyncio.create_task(
            dying.append("c", [b"a", b"b"], expected_head=0, checkpoint="2")
        )

        async def staged() -> bool:
            return await dying.head("c") == 2

        await async_wait_for(staged, message="nothing staged")  # no replica ever acks
        stuck.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stuck
        # Not patient (the retention task's once a minute): one probe, no replica, nothing moved.
        await dying.settle("c", patient=False)
        assert await dying.read("c", 0) == []
    async with RedisLog(redis_server.url) as log:
        assert await log.read("c", 0) == []
        await log.settle("c")
        assert [r.data for r in await log.read("c", 0)] == [b"a", b"b"]
        # Entries 3..4 staged by one writer, 5..6 by another after the first's WAIT.
        client = redis_server.client()
        try:
            for seq in range(3, 7):
                client.xadd("rsn:{c}:pending", {"d": b"x%d" % seq, "t": 0}, id=f"{seq}-0")
            keys = ["rsn:{c}:log", "rsn:{c}:meta", "rsn:{c}:pending"]
            await log._release(keys=keys, args=["", 4, ""])
            assert [r.seq for r in await log.read("c", 0)] == [1, 2, 3, 4]
            assert [int(i.split(b"-")[0]) for i, _ in client.xrange("rsn:{c}:pending")] == [5, 6]
            # A deposed leader's late release (its token older than the log's) moves nothing.
            client.hset("rsn:{c}:meta", "fence", 9)
            with pytest.raises(ResponseError, match="RSN_FENCED"):
                await log._release(keys=keys, args=["", 6, 8])
            assert [r.seq for r in await log.read("c", 0)] == [1, 2, 3, 4]
            await log._release(keys=keys, args=["", 6, 9])
            assert [r.seq for r in await log.read("c", 0)] == [1, 2, 3, 4, 5, 6]
            assert client.exists("rsn:{c}:pending") == 0
        finally:
            client.close()


async def test_what_is_held_back_is_announced_by_no_transport(redis_server: Redis) -> None:
    """Seqs 4..5 are assigned (the head is 5) but held back for a replica that never acks.

    A reader can read up to 3, so that is the head every transport gives:
    the WebSocket hello, the WebSub topic's head header (its body is entry
    3), and the Atom feed, whose page of five is still open: served as an
    archive (RFC 5005: "will not change") it would lack 4..5 for good.
    """
    async with (
        RedisLog(redis_server.url) as log,
        RedisLog(redis_server.url, wait_replicas=1, wait_timeout=0.1) as waiting,
    ):
        await log.register(C1, CAP1)
        await append(log, C1, 3)
        stuck = asyncio.create_task(append(waiting, C1, 2))

        async def staged() -> bool:
            return await log.head(C1) == 5

        await async_wait_for(staged, message="nothing staged")
        assert await log.released_head(C1) == 3
        gateway = WebSocketGateway(log)
        hub = WebSubHub(log, MemoryStore(), feed_page=5)
        await gateway.start()
        await hub.start()
        try:
            async with connect(url(gateway, f"/{C1}")) as ws:
                hello = await recv(ws)
                assert (hello["type"], hello["head"]) == ("hello", 3)
            async with aiohttp.ClientSession() as http:
                async with http.get(hub.topic(C1)) as topic:
                    assert topic.headers[HEAD_HEADER] == "3"
                    assert b"http://example.com/res/3" in await topic.read()
                async with http.get(hub.feed_url(C1), params={"page": "1"}) as page:
                    assert page.status == 200
                    feed = await page.read()
            assert b"http://example.com/res/3" in feed
            assert b"fh:archive/>" not in feed, "an open page served as an archive"
        finally:
            stuck.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stuck
            await hub.stop()
            await gateway.stop()
