"""Leader election for publisher high availability: a Redis lease with a fencing token.

Several publishers may watch one Source; exactly one (the leader) appends to
the log and pushes over MQTT.  The leader holds ``rsn:leader:<group>`` with a
TTL and renews it well before it expires.  Each acquisition takes a new,
strictly increasing *fencing token* (``INCR``), and every log append carries
it: the log refuses an append whose token is older than the newest it has
seen (:class:`~rsnotify.log.Fenced`).  So a leader that stalled (a long GC
pause, a frozen VM) and wakes up after its lease passed to another cannot
write a single entry, even before it notices it lost the lease.

Takeover time is bounded by the lease TTL plus one acquisition attempt
interval (defaults: 3 s + 0.5 s, under the 5 s the design asks for).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.exceptions import ClusterDownError, RedisClusterException
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import redisurl
from ..cancellation import raise_if_cancelled

log = logging.getLogger("rsnotify.publish")

# KEYS: lease.  ARGV: owner value, ttl ms.  Renew only if we still hold it.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS: the highest token that ever took office.  ARGV: ours.  1 if ours is not
# older (and now recorded), else 0: a later term was held meanwhile.
_TAKE_OFFICE = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < current then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""

# KEYS: lease.  ARGV: owner value.  Release only our own lease.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass(frozen=True, slots=True)
class Leadership:
    """A held lease: the token to pass to every log append."""

    token: int
    owner: str


class LeaderElection:
    """Campaign for, hold and renew the lease of one publisher group."""

    def __init__(
        self,
        redis_url: str,
        *,
        group: str,
        owner: str,
        ttl: float = 3.0,
        retry: float = 0.5,
    ) -> None:
        if not 0 < retry < ttl:
            raise ValueError("need 0 < retry < ttl")
        self.key = f"rsn:leader:{group}"
        self.token_key = f"rsn:leader:{group}:token"
        self.office_key = f"rsn:leader:{group}:office"  # the newest token that led
        self.owner = owner
        self.ttl = ttl
        self.retry = retry
        self._redis = redisurl.client(redis_url, socket_timeout=ttl / 3)
        self._renew = self._redis.register_script(_RENEW)
        self._release = self._redis.register_script(_RELEASE)
        self._take_office_script = self._redis.register_script(_TAKE_OFFICE)
        self.leadership: Leadership | None = None

    async def try_acquire(self) -> Leadership | None:
        """One attempt: take the lease if it is free."""
        return await self._claim(await self._next_token())

    async def _next_token(self) -> int:
        return int(await self._redis.incr(self.token_key))

    async def _claim(self, token: int) -> Leadership | None:
        """Take the lease with ``token``, unless it is free but ``token`` is already stale.

        The token and the lease are two commands (two keys, which a Redis
        Cluster may keep apart).  A candidate that stalled between them could
        find the lease free after a later leader's term, and lead with an
        older token than the one that leader wrote into the log: every append
        refused as fenced, and its valid lease keeping every standby out.  So
        each term records its token (``office_key``, only ever raised), and a
        lease taken with a token older than a term already held is handed
        back at once; the next attempt draws a fresh one.  Tokens standbys
        draw and never use make nobody's stale.
        """
        value = f"{self.owner}:{token}"
        if not await self._redis.set(self.key, value, nx=True, px=int(self.ttl * 1000)):
            return None
        if not await self._take_office_script(keys=[self.office_key], args=[token]):
            await self._release(keys=[self.key], args=[value])
            log.info("lease taken with the stale fencing token %d; handed back", token)
            return None
        self.leadership = Leadership(token=token, owner=value)
        return self.leadership

    async def renew(self) -> bool:
        """Extend the lease; False if it is no longer ours."""
        if self.leadership is None:
            return False
        renewed = await self._renew(
            keys=[self.key], args=[self.leadership.owner, int(self.ttl * 1000)]
        )
        return bool(renewed)

    async def release(self) -> None:
        if self.leadership is not None:
            with contextlib.suppress(RedisConnectionError, RedisTimeoutError, OSError):
                await self._release(keys=[self.key], args=[self.leadership.owner])
            self.leadership = None

    async def run(
        self,
        on_elected: Callable[[Leadership], Awaitable[None]],
        on_deposed: Callable[[], Awaitable[None]],
        stopping: asyncio.Event,
    ) -> None:
        """Campaign until elected, hold the lease, call back on every change; until stopping."""
        renew_every = self.ttl / 3
        while not stopping.is_set():
            # A cancelled leader that went on renewing would hold the lease forever.
            raise_if_cancelled()
            try:
                if self.leadership is None:
                    held = await self.try_acquire()
                    if held is not None:
                        log.info("elected leader (fencing token %d)", held.token)
                        if await self._take_office(held, on_elected, on_deposed):
                            continue
                    wait = self.retry
                else:
                    if not await self.renew():
                        log.warning("lost the leader lease; standing down")
                        self.leadership = None
                        await on_deposed()
                        continue
                    wait = renew_every
            except (
                RedisConnectionError, RedisTimeoutError, OSError,
                ClusterDownError, RedisClusterException,  # a cluster failing over
            ) as exc:  # fmt: skip
                # Cannot renew: assume the lease is lost before its TTL can pass.
                if self.leadership is not None:
                    log.warning("cannot reach Redis to renew the lease (%s); standing down", exc)
                    self.leadership = None
                    await on_deposed()
                wait = self.retry
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await stopping.wait()
        await self.release()

    async def _take_office(
        self,
        held: Leadership,
        on_elected: Callable[[Leadership], Awaitable[None]],
        on_deposed: Callable[[], Awaitable[None]],
    ) -> bool:
        """``on_elected`` with the lease renewed meanwhile; False if that fails or the lease goes.

        Taking office reloads every collection from the log, which can fail
        (Redis failing over again, a log that diverged): the failure escaped
        this loop and ended the election for good, the process believing it
        led while nothing renewed its lease.  It can also take a while (many
        collections; held-back entries waiting for a replica), and the lease
        was not renewed meanwhile: it could lapse, a standby take over, and
        this process start leading after it.  Now a failure stands down and
        hands the lease back, and a lease lost meanwhile stops taking office.
        """
        office: asyncio.Future[None] = asyncio.ensure_future(on_elected(held))
        keeper = asyncio.create_task(self._keep_lease(), name="rsnotify-lease-keeper")
        lost = False
        try:
            await asyncio.wait({office, keeper}, return_when=asyncio.FIRST_COMPLETED)
            lost = keeper.done()
        finally:
            keeper.cancel()
            if not office.done():  # the lease is gone (or we are cancelled): stop
                office.cancel()
            await asyncio.gather(office, keeper, return_exceptions=True)
        if lost or office.cancelled():
            # (Taking office may even have finished, a cancellation swallowed
            # by the Redis client on the way: without the lease it is void.)
            raise_if_cancelled()  # we were cancelled ourselves
            log.warning("lost the leader lease while taking office; standing down")
        elif (failure := office.exception()) is not None:
            log.error("cannot take office (%s); standing down and campaigning again", failure)
        else:
            return True
        await on_deposed()
        await self.release()
        return False

    async def _keep_lease(self) -> None:
        """Renew the lease every third of its TTL; return once it is no longer ours."""
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                if not await self.renew():
                    return
            except (RedisConnectionError, RedisTimeoutError, OSError, RedisClusterException):
                return  # cannot renew: take the lease as lost, as run() does
            # redis-py can swallow a cancellation that lands mid-command: without
            # this the keeper renewed on, and _take_office waited for it forever.
            raise_if_cancelled()

    async def close(self) -> None:
        await self.release()
        await self._redis.aclose()
