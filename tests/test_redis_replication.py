"""Replication before push (issue 19, item 2): an entry is visible only once replicas hold it.

Real ``redis-server`` processes: a primary and a replica (``replicaof``).
With ``wait_replicas=1`` an append waits (``WAIT``) for the replica; while the
replica is down the entries stay in ``rsn:{c}:pending`` where no reader looks,
and appear in the log, same seqs, once it is back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rsnotify.log.redis_log import RedisLog
from tests.devstack import Redis, async_wait_for, wait_for


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
