"""Redis Streams backend of the notification log.

Keys per collection share the hash tag ``{<collection>}`` so a Redis Cluster
keeps them in one slot (the Lua append touches several of them):

* ``rsn:{c}:log``  stream; entry id ``<seq>-0``, fields ``d`` (envelope), ``t`` (ms)
* ``rsn:{c}:meta`` hash; ``head``, ``checkpoint``, ``fence``, ``capabilitylist``
* ``rsn:{c}:cursors`` hash; named consumer positions
* ``rsn:{c}:pending`` stream; appended entries held back until replicated (below)

Stream ids are the sequence numbers themselves, so ``XRANGE``/``XREAD`` from
``<seq>`` is exact replay and Redis refuses any id that would go backwards.
Run Redis with ``appendonly yes`` (see deploy/redis.conf): the log is only as
durable as the AOF.

Replication before push (``wait_replicas``, issue 19). Redis replication is
asynchronous: a primary that dies can take its last writes with it, and a
promoted replica would then number the next entries from a rolled-back head. A
sequence number some Destination already received would come to mean another
entry. So with ``wait_replicas = N > 0`` an append is *staged*: the Lua script
assigns the seqs and stores the checkpoint as before, but writes the entries
to ``rsn:{c}:pending``, where no reader looks. On the same connection (in a
Redis Cluster: to the primary owning the collection's slot, see
:class:`rsnotify.redisurl.Primaries`) ``WAIT N timeout`` follows (Redis 7.0
has no ``WAITAOF``; that is 7.2); once N replicas acknowledged it, a second
script moves the pending entries to the log stream with the same ids, where
transports and gateways in every process find them. So everything any
transport can push is on N replicas as well, and a promoted replica that has
it is what Sentinel picks (the replica with the largest replication offset),
as does a cluster's automatic failover (replicas with more data ask for votes
first).

When ``WAIT`` times out the entries stay pending: :meth:`append` logs a
warning and waits again (a probe write and ``WAIT``) until enough replicas
acknowledge, or raises :class:`LogUnavailable` if Redis goes away; nothing
that may be lost is ever pushed.  The detection loop is held up meanwhile,
which is the point (back-pressure, not a growing backlog of unsafe entries).
Entries left pending by a publisher that died, or by a release that a
failover lost, are released by :meth:`settle`, which a publisher calls
whenever it (re)loads a collection's head and once a minute beside
retention; a release moves only what its own ``WAIT`` covered (``upto``),
never what another writer staged meanwhile.  The pending entries are
consistent with the head and checkpoint beside them (one script wrote all
three), so releasing them after replication is always right.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AskError,
    ClusterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import redisurl
from ..logs import redact_url
from . import Fenced, LogConflict, LogRecord, LogUnavailable, NotificationLog, Retention

# Any (strict module): redis-py types replies as any RESP value; each reply's shape
# is the command's, read where it is used.

_log = logging.getLogger("rsnotify.log")

COLLECTIONS_KEY = "rsn:collections"
# Replies of a cluster node that does not serve the slot (now): the command did not run.
# (MovedError is an AskError; redis-py strips the word MOVED from the message.)
_MOVING = (AskError, TryAgainError, ClusterDownError)


def fence_lua(arg: int) -> str:
    """Lua refusing a fencing token ``ARGV[arg]`` older than the ``meta`` hash's
    (``KEYS[2]``), else raising that one to it; ``''``: not fenced.  One rule for
    every script a leader writes with (appends here, snapshot maps in
    :mod:`.redis_blobs`)."""
    return f"""
if ARGV[{arg}] ~= '' then
  local current = tonumber(redis.call('HGET', KEYS[2], 'fence') or '0')
  if tonumber(ARGV[{arg}]) < current then
    return redis.error_reply('RSN_FENCED ' .. current)
  end
  redis.call('HSET', KEYS[2], 'fence', ARGV[{arg}])
end
"""


# KEYS: log, meta, pending.  ARGV: expected head, checkpoint, fence ('' = none),
# now ms, max_len ('' = none), stage ('1': to pending, see above; '' = to the log),
# payloads...
_APPEND = (
    """
local head = tonumber(redis.call('HGET', KEYS[2], 'head') or '0')
if head ~= tonumber(ARGV[1]) then
  return redis.error_reply('RSN_CONFLICT ' .. head)
end
"""
    + fence_lua(3)
    + """
local stream = KEYS[1]
if ARGV[6] ~= '' then
  stream = KEYS[3]
end
for i = 7, #ARGV do
  head = head + 1
  redis.call('XADD', stream, head .. '-0', 'd', ARGV[i], 't', ARGV[4])
end
redis.call('HSET', KEYS[2], 'head', head, 'checkpoint', ARGV[2])
if ARGV[5] ~= '' and ARGV[6] == '' then
  redis.call('XTRIM', KEYS[1], 'MAXLEN', tonumber(ARGV[5]))
end
return head
"""
)

# KEYS: log, meta, pending.  ARGV: max_len ('' = none), upto, fence ('' = none).
# Move what is pending up to seq ``upto`` to the log, same ids, skipping any the
# log already holds (a release repeated after a failover).  Only up to what the
# caller saw replicated: entries another writer staged meanwhile (a settle beside
# an append) stay held back until their own WAIT.  And not for a deposed leader
# (the fence): after a failover rolled seqs back, its late release would move
# its successor's different, unreplicated entries under the same seqs.
_RELEASE = (
    fence_lua(3)
    + """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local after = 0
if #last > 0 then
  after = tonumber(string.match(last[1][1], '^(%d+)'))
end
local upto = tonumber(ARGV[2])
local moved = 0
for _, row in ipairs(redis.call('XRANGE', KEYS[3], '-', upto .. '-0')) do
  if tonumber(string.match(row[1], '^(%d+)')) > after then
    redis.call('XADD', KEYS[1], row[1], unpack(row[2]))
    moved = moved + 1
  end
end
redis.call('XTRIM', KEYS[3], 'MINID', (upto + 1) .. '-0')
if redis.call('XLEN', KEYS[3]) == 0 then
  redis.call('DEL', KEYS[3])
end
if ARGV[1] ~= '' then
  redis.call('XTRIM', KEYS[1], 'MAXLEN', tonumber(ARGV[1]))
end
return moved
"""
)

# KEYS: log, pending, meta.  The first seq the log holds, else the first held
# back (they come next), else head + 1.  One script, not three commands: a
# release between reading the log and reading what is held back would make
# entries on their way look trimmed (earliest = head + 1).
_EARLIEST = """
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
if #first == 0 then
  first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
end
if #first > 0 then
  return tonumber(string.match(first[1][1], '^(%d+)'))
end
return tonumber(redis.call('HGET', KEYS[3], 'head') or '0') + 1
"""

# KEYS: pending, meta.  The seq before the first held back, else the head.
_RELEASED_HEAD = """
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
if #first > 0 then
  return tonumber(string.match(first[1][1], '^(%d+)')) - 1
end
return tonumber(redis.call('HGET', KEYS[2], 'head') or '0')
"""

# KEYS: cursors.  ARGV: name, seq.  Cursors only move forward.
_SET_CURSOR = """
local current = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if tonumber(ARGV[2]) > current then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return 0
"""


MAX_CONNECTIONS = 64  # per log client; more callers queue for a connection
WARN_EVERY = 30.0  # seconds between warnings while entries wait for replicas


def unavailable(exc: BaseException, url: str) -> LogUnavailable | None:
    """The :class:`LogUnavailable` a Redis error stands for (retry after a backoff).

    None: an error retrying will not cure (a bug, a refused script), raised as
    it is.  One mapping for every Redis-backed store of the log's family, so a
    failover, a loading replica or ``maxmemory`` are waited out alike.  The
    message names ``url`` without its password: it goes to logs and ``/healthz``.
    """
    url = redact_url(url)
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError, OSError, RedisClusterException)):
        return LogUnavailable(f"Redis at {url} unavailable: {exc}")
    if not isinstance(exc, ResponseError):
        return None
    if isinstance(exc, _MOVING):
        # Nothing ran (MovedError is an AskError; redis-py strips the word MOVED).
        return LogUnavailable(f"Redis at {url} is failing over: {exc}")
    if isinstance(exc, ReadOnlyError):
        return LogUnavailable(f"Redis at {url} is a replica now (failing over): {exc}")
    if "LOADING" in str(exc) or "BUSY" in str(exc):
        return LogUnavailable(f"Redis at {url} not ready: {exc}")
    if isinstance(exc, OutOfMemoryError) or str(exc).startswith("OOM"):
        # maxmemory with noeviction: the write failed whole; retry once an
        # operator raised the limit or retention trimmed the log.
        return LogUnavailable(f"Redis at {url} is out of memory: {exc}")
    return None


def _raise_if_fenced(exc: ResponseError, collection: str, fence: int | None) -> None:
    """A script's ``RSN_FENCED`` refusal (:func:`fence_lua`) as the log's :class:`Fenced`."""
    if "RSN_FENCED" in str(exc):
        raise Fenced(f"{collection}: fencing token {fence} is stale") from None


def meta_key(collection: str) -> str:
    """The collection's ``meta`` hash (head, checkpoint, fence), for stores fenced alike."""
    return _keys(collection)[1]


def _keys(collection: str) -> tuple[str, str, str]:
    tag = "{" + collection + "}"
    return f"rsn:{tag}:log", f"rsn:{tag}:meta", f"rsn:{tag}:cursors"


def _pending_key(collection: str) -> str:
    return "rsn:{" + collection + "}:pending"


def _seq(stream_id: bytes | str) -> int:
    text = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
    return int(text.split("-", 1)[0])


def _record(stream_id: Any, fields: dict[bytes, bytes]) -> LogRecord:
    return LogRecord(seq=_seq(stream_id), data=fields[b"d"], logged_ms=int(fields.get(b"t", 0)))


class RedisLog(NotificationLog):
    """The log in Redis Streams; one connection pool per instance, closed explicitly."""

    def __init__(
        self,
        url: str,
        *,
        socket_timeout: float = 5.0,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
    ) -> None:
        """``wait_replicas``: replicas that must hold an entry before it is pushed (above)."""
        if wait_replicas < 0 or wait_timeout <= 0:
            raise ValueError("need wait_replicas >= 0 and wait_timeout > 0")
        self.url = url
        self.wait_replicas = wait_replicas
        self.wait_ms = max(1, int(wait_timeout * 1000))
        self._socket_timeout = socket_timeout
        # A few quick retries ride out a dropped connection (a Redis restart);
        # longer outages surface as LogUnavailable for the caller's backoff.
        retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), 3)
        # A blocking pool: a burst of callers (hundreds of WebSocket clients
        # connecting at once, each reading the log) waits for a free connection
        # instead of failing with "Too many connections" past redis-py's default
        # limit of 100, which refused those clients as if Redis were down.
        self._redis = redisurl.client(
            url,
            max_connections=MAX_CONNECTIONS,
            pool_timeout=socket_timeout,
            # WAIT blocks up to wait_timeout on the connection: no socket timeout first.
            socket_timeout=socket_timeout + (wait_timeout if wait_replicas else 0),
            socket_connect_timeout=socket_timeout,
            retry=retry,
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
        )
        # A separate client for blocking reads, so a long XREAD BLOCK never
        # holds up appends on a shared connection's timeout.
        self._blocking = redisurl.client(url, socket_connect_timeout=socket_timeout)
        # Plain clients of the primaries, for WAIT (the client itself outside a cluster).
        self._primaries = redisurl.Primaries(self._redis)
        self._append = self._redis.register_script(_APPEND)
        self._set_cursor = self._redis.register_script(_SET_CURSOR)
        self._release = self._redis.register_script(_RELEASE)
        self._earliest = self._redis.register_script(_EARLIEST)
        self._released_head = self._redis.register_script(_RELEASED_HEAD)

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except (OSError, RedisError, RedisClusterException) as exc:
            retry = unavailable(exc, self.url)
            if retry is None:
                raise
            if not isinstance(exc, ResponseError) or isinstance(exc, _MOVING):
                # A cluster's failover (a lost node, a slot map mid-change), or a
                # plain client of a primary (redisurl.Primaries) that no longer
                # owns the slot: read the topology again.
                self._primaries.topology_changed()
            raise retry from None

    async def head(self, collection: str) -> int:
        _, meta, _ = _keys(collection)
        value = await self._call(self._redis.hget(meta, "head"))
        return int(value or 0)

    async def released_head(self, collection: str) -> int:
        _, meta, _ = _keys(collection)
        return int(await self._call(self._released_head(keys=[_pending_key(collection), meta])))

    async def earliest(self, collection: str) -> int:
        log, meta, _ = _keys(collection)
        keys = [log, _pending_key(collection), meta]
        return int(await self._call(self._earliest(keys=keys)))

    async def append(
        self,
        collection: str,
        payloads: Sequence[bytes],
        *,
        expected_head: int,
        checkpoint: str,
        fence: int | None = None,
        max_len: int | None = None,
        logged_ms: int | None = None,
    ) -> int:
        log, meta, _ = _keys(collection)
        staged = bool(self.wait_replicas and payloads)
        args: list[Any] = [
            expected_head,
            checkpoint,
            "" if fence is None else fence,
            int(time.time() * 1000) if logged_ms is None else logged_ms,
            "" if max_len is None else max_len,
            "1" if staged else "",
            *payloads,
        ]
        keys = [log, meta, _pending_key(collection)]
        try:
            if not staged:
                return int(await self._call(self._append(keys=keys, args=args)))
            # One connection to the slot's primary: WAIT counts the replicas that
            # have this append (redisurl.Primaries says why a cluster needs it).
            primary = await self._call(self._primaries.of(log))
            async with primary.pipeline(transaction=False) as pipe:
                await self._append(keys=keys, args=args, client=pipe)  # queued, not sent
                pipe.execute_command("WAIT", self.wait_replicas, self.wait_ms)
                head, acked = await self._call(pipe.execute())
        except ResponseError as exc:
            text = str(exc)
            if "RSN_CONFLICT" in text:
                raise LogConflict(
                    f"{collection}: head is {text.split()[-1]}, expected {expected_head}"
                ) from None
            _raise_if_fenced(exc, collection, fence)
            raise
        await self._release_when_replicated(collection, int(acked), max_len, int(head), fence)
        return int(head)

    async def _release_when_replicated(
        self,
        collection: str,
        acked: int | None,
        max_len: int | None,
        upto: int,
        fence: int | None = None,
        *,
        patient: bool = True,
    ) -> None:
        """Wait (probe write + WAIT) until enough replicas hold what is pending; release it.

        ``acked``: what the append's own WAIT said (None: nothing asked yet).
        ``upto``: the last seq written before that WAIT (or the probe): what
        is released, and no more.  Not ``patient``: one probe, and nothing
        released if the replicas do not hold it yet.
        """
        log, meta, _ = _keys(collection)
        held_since = next_warning = time.monotonic()
        while acked is None or acked < self.wait_replicas:
            if acked is not None and not patient:
                return  # not replicated yet: a later settle looks again
            if acked is not None and time.monotonic() >= next_warning:
                _log.warning(
                    "%s: only %d of %d replica(s) acknowledged the last append after %.1f s; "
                    "its entries stay unpushed until they do",
                    collection,
                    acked,
                    self.wait_replicas,
                    time.monotonic() - held_since,
                    extra={"collection": collection},
                )
                next_warning += WARN_EVERY
            primary = await self._call(self._primaries.of(log))
            async with primary.pipeline(transaction=False) as pipe:
                # Any later write on the connection: replication is one ordered stream.
                pipe.hset(meta, "replicated_probe", int(time.time() * 1000))
                pipe.execute_command("WAIT", self.wait_replicas, self.wait_ms)
                _, acked = await self._call(pipe.execute())
        try:
            await self._call(
                self._release(
                    keys=[log, meta, _pending_key(collection)],
                    args=["" if max_len is None else max_len, upto, "" if fence is None else fence],
                )
            )
        except ResponseError as exc:
            _raise_if_fenced(exc, collection, fence)
            raise

    async def settle(self, collection: str, *, patient: bool = True) -> None:
        """Release entries left pending (a publisher died, a failover lost a release).

        Also with ``wait_replicas`` 0 (no wait then): entries a run with
        replicas left behind would otherwise stay unpushed for good.
        """
        last = await self._call(self._redis.xrevrange(_pending_key(collection), "+", "-", count=1))
        if not last:
            return
        # What is pending now was written before the probe below: its WAIT covers it.
        upto = _seq(last[0][0])
        await self._release_when_replicated(collection, None, None, upto, patient=patient)

    async def checkpoint(self, collection: str) -> str | None:
        _, meta, _ = _keys(collection)
        value = await self._call(self._redis.hget(meta, "checkpoint"))
        return value.decode() if value is not None else None

    async def read(self, collection: str, after: int, limit: int = 1000) -> list[LogRecord]:
        log, _, _ = _keys(collection)
        rows = await self._call(self._redis.xrange(log, f"({after}-0", "+", count=limit))
        return [_record(stream_id, fields) for stream_id, fields in rows]

    async def wait(
        self, collection: str, after: int, timeout: float, limit: int = 1000
    ) -> list[LogRecord]:
        records = await self.read(collection, after, limit)
        if records or timeout <= 0:
            return records
        log, _, _ = _keys(collection)
        block_ms = max(1, int(timeout * 1000))
        try:
            async with asyncio.timeout(timeout + self._socket_timeout):  # see sqlite_log.wait
                # Any: redis-py types the reply as any RESP value; XREAD's is
                # [[stream, [(id, fields), ...]]] or None.
                reply: Any = await self._blocking.xread(
                    {log: f"{after}-0"}, count=limit, block=block_ms
                )
        except (
            RedisConnectionError, RedisTimeoutError, OSError, TimeoutError, RedisClusterException
        ) as exc:  # fmt: skip
            raise LogUnavailable(f"Redis at {redact_url(self.url)} unavailable: {exc}") from None
        if not reply:
            return []
        return [_record(stream_id, fields) for stream_id, fields in reply[0][1]]

    async def trim(self, collection: str, retention: Retention, now_ms: int) -> int:
        log, _, _ = _keys(collection)
        if retention.max_len is not None:
            await self._call(self._redis.xtrim(log, maxlen=retention.max_len, approximate=False))
        if retention.max_age_s is not None:
            cutoff = now_ms - int(retention.max_age_s * 1000)
            start = "-"
            last = 0  # the last entry scanned, all of them older than the cutoff
            while True:
                rows = await self._call(self._redis.xrange(log, start, "+", count=500))
                keep = next((r for r in rows if int(r[1].get(b"t", 0)) >= cutoff), None)
                if keep is not None:
                    await self._call(self._redis.xtrim(log, minid=keep[0], approximate=False))
                    break
                if rows:
                    last = _seq(rows[-1][0])
                if len(rows) < 500:  # everything scanned is older than the cutoff
                    if last:
                        # Up to the last one scanned, not the head read now: an
                        # append landing since the scan would go unpushed.
                        await self._call(
                            self._redis.xtrim(log, minid=f"{last + 1}-0", approximate=False)
                        )
                    break
                start = f"({last}-0"
        return await self.earliest(collection)

    async def cursor(self, collection: str, name: str) -> int:
        _, _, cursors = _keys(collection)
        value = await self._call(self._redis.hget(cursors, name))
        return int(value or 0)

    async def set_cursor(self, collection: str, name: str, seq: int) -> None:
        _, _, cursors = _keys(collection)
        await self._call(self._set_cursor(keys=[cursors], args=[name, seq]))

    async def collections(self) -> dict[str, str]:
        raw = await self._call(self._redis.hgetall(COLLECTIONS_KEY))
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def register(self, collection: str, capability_list: str) -> None:
        _, meta, _ = _keys(collection)
        await self._call(self._redis.hset(COLLECTIONS_KEY, collection, capability_list))
        await self._call(self._redis.hset(meta, "capabilitylist", capability_list))

    async def close(self) -> None:
        await self._primaries.aclose()
        await self._redis.aclose()
        await self._blocking.aclose()
