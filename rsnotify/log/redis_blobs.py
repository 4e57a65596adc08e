"""Resource List snapshot maps in Redis, beside the collection's log.

A collection without Change Lists is published by diffing successive
Resource List snapshots (:mod:`rsnotify.changes.snapshotwatch`); the
checkpoint in the log names the maps of the last snapshot by content key,
and the maps themselves live in a blob store.  With the embedded SQLite log
that is a directory next to it; with ``--redis`` it must be Redis too, so a
standby publisher that takes over (``--ha``) finds the maps the checkpoint
names and diffs the next snapshot instead of recording it again (which
would lose every change made in between).

One hash per collection, ``rsn:{c}:snapshots`` (field: map key, value: the
encoded map), under the collection's hash tag like every key of
:mod:`.redis_log`, so a Redis Cluster keeps it in the collection's slot.
A map is written before any checkpoint names it (the watcher's rule), and
Redis replicates in order: an append that waited for replicas (``WAIT``,
``--redis-wait-replicas``) therefore also covers the maps its checkpoint
names.  A 50,000-resource part is about 1.5 MB of map, well inside a hash
value's limit; ``HGET`` reads one map, never the whole hash.
An ``--ha`` leader's writes here are fenced like its appends: ``put`` and
``keep`` run as scripts that refuse a fencing token older than the one in
the collection's ``meta`` hash (and raise it to theirs, as an append does),
so a leader that stalled and lost its lease cannot sweep away the maps its
successor's checkpoint names (its ``keep`` only knows its own snapshots).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.exceptions import RedisClusterException, RedisError, ResponseError

from .. import redisurl
from . import Fenced
from .redis_log import fence_lua, meta_key, unavailable

__all__ = ["RedisBlobs", "snapshots_key"]

T = TypeVar("T")

# Any (strict module): redis-py types replies as any RESP value; HGET's is bytes
# or None, read where it is used.

# KEYS: snapshots, meta.  ARGV: fence ('' = none), then the script's own.
_FENCE = fence_lua(1)
# ARGV[2]: the map's key, ARGV[3]: its bytes (content-addressed: a key already
# there holds these very bytes).
_PUT = _FENCE + "return redis.call('HSETNX', KEYS[1], ARGV[2], ARGV[3])"
# ARGV[2..]: the keys to keep; every other map goes.
_KEEP = (
    _FENCE
    + """
local keep = {}
for i = 2, #ARGV do keep[ARGV[i]] = true end
local gone = 0
for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
  if not keep[name] then
    redis.call('HDEL', KEYS[1], name)
    gone = gone + 1
  end
end
return gone
"""
)


def snapshots_key(collection: str) -> str:
    """The hash of one collection's snapshot maps (hash-tagged as :mod:`.redis_log`'s keys)."""
    return "rsn:{" + collection + "}:snapshots"


class RedisBlobs:
    """One collection's snapshot maps (a ``BlobStore``) in a client the caller owns.

    ``fence``: None without an election; else what returns the leader's
    fencing token now (None while not leading: then nothing is written).
    """

    def __init__(
        self,
        client: redisurl.Client,
        collection: str,
        *,
        url: str = "Redis",
        fence: Callable[[], int | None] | None = None,
    ) -> None:
        self._redis = client
        self.collection = collection
        self.key = snapshots_key(collection)
        self._keys = [self.key, meta_key(collection)]
        self._url = url
        self._fence = fence
        self._put = client.register_script(_PUT)
        self._keep = client.register_script(_KEEP)

    def _token(self) -> str | None:
        """The fence argument; None: not leading, write nothing."""
        if self._fence is None:
            return ""
        token = self._fence()
        return None if token is None else str(token)

    async def _call(self, awaitable: Awaitable[T]) -> T:
        try:
            return await awaitable
        except (OSError, RedisError, RedisClusterException) as exc:
            if isinstance(exc, ResponseError) and "RSN_FENCED" in str(exc):
                raise Fenced(
                    f"{self.collection}: fencing token is stale for its snapshot maps"
                ) from None
            retry = unavailable(exc, self._url)
            if retry is None:
                raise
            raise retry from None

    async def get(self, key: str) -> bytes | None:
        value: Any = await self._call(self._redis.hget(self.key, key))
        return bytes(value) if value is not None else None

    async def put(self, key: str, data: bytes) -> None:
        token = self._token()
        if token is None:
            raise Fenced(f"{self.collection}: not leading; snapshot map {key[:12]} not stored")
        await self._call(self._put(keys=self._keys, args=[token, key, data]))

    async def keep(self, keys: set[str]) -> None:
        """Drop every map but these (the snapshots the checkpoints still name)."""
        token = self._token()
        if token is None:
            return  # not leading: the leader's maps are not this process's to sweep
        await self._call(self._keep(keys=self._keys, args=[token, *sorted(keys)]))
