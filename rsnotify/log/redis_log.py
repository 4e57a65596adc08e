"""Redis Streams backend of the notification log.

Keys per collection share the hash tag ``{<collection>}`` so a Redis Cluster
keeps them in one slot (the Lua append touches several of them):

* ``rsn:{c}:log``  stream; entry id ``<seq>-0``, fields ``d`` (envelope), ``t`` (ms)
* ``rsn:{c}:meta`` hash; ``head``, ``checkpoint``, ``fence``, ``capabilitylist``
* ``rsn:{c}:cursors`` hash; named consumer positions

Stream ids are the sequence numbers themselves, so ``XRANGE``/``XREAD`` from
``<seq>`` is exact replay and Redis refuses any id that would go backwards.
Run Redis with ``appendonly yes`` (see deploy/redis.conf): the log is only as
durable as the AOF.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import redisurl
from . import Fenced, LogConflict, LogRecord, LogUnavailable, NotificationLog, Retention

# Any (strict module): redis-py types replies as any RESP value; each reply's shape
# is the command's, read where it is used.

COLLECTIONS_KEY = "rsn:collections"

# KEYS: log, meta.  ARGV: expected head, checkpoint, fence ('' = none), now ms,
# max_len ('' = none), payloads...
_APPEND = """
local head = tonumber(redis.call('HGET', KEYS[2], 'head') or '0')
if head ~= tonumber(ARGV[1]) then
  return redis.error_reply('RSN_CONFLICT ' .. head)
end
if ARGV[3] ~= '' then
  local current = tonumber(redis.call('HGET', KEYS[2], 'fence') or '0')
  if tonumber(ARGV[3]) < current then
    return redis.error_reply('RSN_FENCED ' .. current)
  end
  redis.call('HSET', KEYS[2], 'fence', ARGV[3])
end
for i = 6, #ARGV do
  head = head + 1
  redis.call('XADD', KEYS[1], head .. '-0', 'd', ARGV[i], 't', ARGV[4])
end
redis.call('HSET', KEYS[2], 'head', head, 'checkpoint', ARGV[2])
if ARGV[5] ~= '' then
  redis.call('XTRIM', KEYS[1], 'MAXLEN', tonumber(ARGV[5]))
end
return head
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


def _keys(collection: str) -> tuple[str, str, str]:
    tag = "{" + collection + "}"
    return f"rsn:{tag}:log", f"rsn:{tag}:meta", f"rsn:{tag}:cursors"


def _seq(stream_id: bytes | str) -> int:
    text = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
    return int(text.split("-", 1)[0])


def _record(stream_id: Any, fields: dict[bytes, bytes]) -> LogRecord:
    return LogRecord(seq=_seq(stream_id), data=fields[b"d"], logged_ms=int(fields.get(b"t", 0)))


class RedisLog(NotificationLog):
    """The log in Redis Streams; one connection pool per instance, closed explicitly."""

    def __init__(self, url: str, *, socket_timeout: float = 5.0) -> None:
        self.url = url
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
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            retry=retry,
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
        )
        # A separate client for blocking reads, so a long XREAD BLOCK never
        # holds up appends on a shared connection's timeout.
        self._blocking = redisurl.client(url, socket_connect_timeout=socket_timeout)
        self._append = self._redis.register_script(_APPEND)
        self._set_cursor = self._redis.register_script(_SET_CURSOR)

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise LogUnavailable(f"Redis at {self.url} unavailable: {exc}") from None
        except ResponseError as exc:
            if "LOADING" in str(exc) or "BUSY" in str(exc):
                raise LogUnavailable(f"Redis at {self.url} not ready: {exc}") from None
            if isinstance(exc, OutOfMemoryError) or str(exc).startswith("OOM"):
                # maxmemory with noeviction: the append failed whole; retry once
                # an operator raised the limit or retention trimmed the log.
                raise LogUnavailable(f"Redis at {self.url} is out of memory: {exc}") from None
            raise

    async def head(self, collection: str) -> int:
        _, meta, _ = _keys(collection)
        value = await self._call(self._redis.hget(meta, "head"))
        return int(value or 0)

    async def earliest(self, collection: str) -> int:
        log, _, _ = _keys(collection)
        first = await self._call(self._redis.xrange(log, "-", "+", count=1))
        if first:
            return _seq(first[0][0])
        return await self.head(collection) + 1

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
        args: list[Any] = [
            expected_head,
            checkpoint,
            "" if fence is None else fence,
            int(time.time() * 1000) if logged_ms is None else logged_ms,
            "" if max_len is None else max_len,
            *payloads,
        ]
        try:
            return int(await self._call(self._append(keys=[log, meta], args=args)))
        except ResponseError as exc:
            text = str(exc)
            if "RSN_CONFLICT" in text:
                raise LogConflict(
                    f"{collection}: head is {text.split()[-1]}, expected {expected_head}"
                ) from None
            if "RSN_FENCED" in text:
                raise Fenced(f"{collection}: fencing token {fence} is stale") from None
            raise

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
        except (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError) as exc:
            raise LogUnavailable(f"Redis at {self.url} unavailable: {exc}") from None
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
            while True:
                rows = await self._call(self._redis.xrange(log, start, "+", count=500))
                keep = next((r for r in rows if int(r[1].get(b"t", 0)) >= cutoff), None)
                if keep is not None:
                    await self._call(self._redis.xtrim(log, minid=keep[0], approximate=False))
                    break
                if len(rows) < 500:  # everything is older than the cutoff
                    if rows:
                        head = await self.head(collection)
                        await self._call(
                            self._redis.xtrim(log, minid=f"{head + 1}-0", approximate=False)
                        )
                    break
                start = f"({_seq(rows[-1][0])}-0"
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
        await self._redis.aclose()
        await self._blocking.aclose()
