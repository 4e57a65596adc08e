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
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import redisurl
from . import LogUnavailable

__all__ = ["RedisBlobs", "snapshots_key"]

T = TypeVar("T")

# Any (strict module): redis-py types replies as any RESP value; HGET's is bytes
# or None, HKEYS' a list of bytes, read where they are used.


def snapshots_key(collection: str) -> str:
    """The hash of one collection's snapshot maps (hash-tagged as :mod:`.redis_log`'s keys)."""
    return "rsn:{" + collection + "}:snapshots"


class RedisBlobs:
    """One collection's snapshot maps (a ``BlobStore``) in a client the caller owns."""

    def __init__(self, client: redisurl.Client, collection: str, *, url: str = "Redis") -> None:
        self._redis = client
        self.key = snapshots_key(collection)
        self._url = url

    async def _call(self, awaitable: Awaitable[T]) -> T:
        try:
            return await awaitable
        except (RedisConnectionError, RedisTimeoutError, OSError, RedisClusterException) as exc:
            raise LogUnavailable(f"{self._url} unavailable for snapshot maps: {exc}") from None
        except ResponseError as exc:
            if "LOADING" in str(exc) or "MOVED" in str(exc) or "TRYAGAIN" in str(exc):
                raise LogUnavailable(f"{self._url} not ready: {exc}") from None
            raise

    async def get(self, key: str) -> bytes | None:
        value: Any = await self._call(self._redis.hget(self.key, key))
        return bytes(value) if value is not None else None

    async def put(self, key: str, data: bytes) -> None:
        # Content-addressed: a key already there holds these very bytes.
        await self._call(self._redis.hsetnx(self.key, key, data))

    async def keep(self, keys: set[str]) -> None:
        """Drop every map but these (the snapshots the checkpoints still name)."""
        present: Any = await self._call(self._redis.hkeys(self.key))
        names = [k.decode() if isinstance(k, bytes) else str(k) for k in present]
        gone = [name for name in names if name not in keys]
        if gone:
            await self._call(self._redis.hdel(self.key, *gone))
