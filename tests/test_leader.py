"""Publisher leader election on a real Redis: one leader, bounded takeover, fencing."""

from __future__ import annotations

import asyncio
import time

import pytest

from rsnotify.log import Fenced, LogUnavailable
from rsnotify.log.redis_log import RedisLog
from rsnotify.publisher.leader import LeaderElection, Leadership
from tests.devstack import Redis, async_wait_for

C = "example.org-c1-capabilitylist-00000000"


class Candidate:
    def __init__(self, url: str, name: str) -> None:
        self.election = LeaderElection(url, group="g", owner=name, ttl=1.5, retry=0.2)
        self.leading: Leadership | None = None
        self.changes: list[str] = []
        self.stopping = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def elected(self, held: Leadership) -> None:
        self.leading = held
        self.changes.append(f"elected {held.token}")

    async def deposed(self) -> None:
        self.leading = None
        self.changes.append("deposed")

    def start(self) -> None:
        self.task = asyncio.create_task(
            self.election.run(self.elected, self.deposed, self.stopping)
        )

    def crash(self) -> None:
        """Stop renewing without releasing: what kill -9 looks like to Redis."""
        assert self.task is not None
        self.task.cancel()


async def test_one_leader_and_takeover_within_the_lease(redis_server: Redis) -> None:
    a, b = Candidate(redis_server.url, "a"), Candidate(redis_server.url, "b")
    a.start()
    await async_wait_for(lambda: a.leading is not None, timeout=5)
    b.start()
    with pytest.raises(AssertionError):  # b must NOT become leader while a renews
        await async_wait_for(lambda: b.leading is not None, timeout=2.0)
    a.crash()
    crashed = time.monotonic()
    await async_wait_for(lambda: b.leading is not None, timeout=5, message="no takeover")
    takeover = time.monotonic() - crashed
    assert takeover <= 1.5 + 0.2 + 1.0, f"takeover took {takeover:.2f}s"
    assert b.leading is not None and a.leading is not None
    assert b.leading.token > a.leading.token
    b.stopping.set()
    await b.task  # type: ignore[misc]
    for c in (a, b):
        await c.election.close()


async def test_a_stale_leader_cannot_append_after_takeover(redis_server: Redis) -> None:
    log = RedisLog(redis_server.url)
    old = LeaderElection(redis_server.url, group="g2", owner="old", ttl=1.0, retry=0.2)
    new = LeaderElection(redis_server.url, group="g2", owner="new", ttl=1.0, retry=0.2)
    try:
        first = await old.try_acquire()
        assert first is not None
        await log.append(C, [b"a"], expected_head=0, checkpoint="c", fence=first.token)
        assert await new.try_acquire() is None

        async def lease_expired() -> bool:
            return await new.try_acquire() is not None

        await async_wait_for(lease_expired, timeout=5)  # old stalled past its TTL
        assert new.leadership is not None and new.leadership.token > first.token
        await log.append(C, [b"b"], expected_head=1, checkpoint="c", fence=new.leadership.token)
        with pytest.raises(Fenced):  # the old leader wakes up and tries to write
            await log.append(C, [b"stale"], expected_head=2, checkpoint="c", fence=first.token)
        assert not await old.renew()
        assert [r.data for r in await log.read(C, 0)] == [b"a", b"b"]
    finally:
        await old.close()
        await new.close()
        await log.close()


async def test_a_lease_taken_with_a_stale_token_is_handed_back(redis_server: Redis) -> None:
    """A candidate stalls between drawing its token and taking the lease.

    Meanwhile a later leader drew a higher token, wrote with it, and ended.
    The lease is free, but leading with the older token would have every
    append refused (fenced) while its lease kept every standby out.
    """
    stalled = LeaderElection(redis_server.url, group="g3", owner="stalled", ttl=1.0, retry=0.2)
    later = LeaderElection(redis_server.url, group="g3", owner="later", ttl=1.0, retry=0.2)
    try:
        token = await stalled._next_token()  # ... and the process stalls here
        held = await later.try_acquire()
        assert held is not None and held.token > token
        await later.release()  # its term ends
        assert await stalled._claim(token) is None  # free, but not with that token
        assert stalled.leadership is None
        fresh = await stalled.try_acquire()
        assert fresh is not None and fresh.token > held.token
    finally:
        await stalled.close()
        await later.close()


async def test_a_failure_to_take_office_stands_down_and_campaigns_again(
    redis_server: Redis,
) -> None:
    """Taking office reloads every collection from the log, which can fail (a failover).

    The failure used to end the election task for good: no lease renewed,
    the process believing it led.
    """

    class Unlucky(Candidate):
        failures = 1

        async def elected(self, held: Leadership) -> None:
            if self.failures:
                self.failures -= 1
                self.changes.append(f"failed {held.token}")
                raise LogUnavailable("Redis is failing over")
            await super().elected(held)

    a = Unlucky(redis_server.url, "a")
    a.start()
    await async_wait_for(lambda: a.leading is not None, timeout=5, message="never led")
    assert [c.split()[0] for c in a.changes] == ["failed", "deposed", "elected"]
    assert int(a.changes[2].split()[1]) > int(a.changes[0].split()[1])
    a.stopping.set()
    await a.task  # type: ignore[misc]
    await a.election.close()


async def test_the_lease_is_kept_while_taking_office_takes_longer_than_it(
    redis_server: Redis,
) -> None:
    """Taking office (reloading every collection) may outlast the lease's TTL.

    It was not renewed meanwhile: a standby took the lease over, and the
    first then led too once its reload returned (until its next renewal).
    """

    class Slow(Candidate):
        def __init__(self, url: str, name: str) -> None:
            super().__init__(url, name)
            self.may_finish = asyncio.Event()

        async def elected(self, held: Leadership) -> None:
            self.changes.append("taking office")
            await self.may_finish.wait()
            await super().elected(held)

    a, b = Slow(redis_server.url, "a"), Candidate(redis_server.url, "b")
    a.start()
    await async_wait_for(lambda: a.changes == ["taking office"], timeout=5)
    b.start()
    with pytest.raises(AssertionError):  # scenario time: two TTLs of b trying
        await async_wait_for(lambda: b.leading is not None, timeout=2 * 1.5)
    a.may_finish.set()
    await async_wait_for(lambda: a.leading is not None, timeout=5)
    assert b.leading is None and b.changes == []
    for c in (a, b):
        c.stopping.set()
        await c.task  # type: ignore[misc]
        await c.election.close()
