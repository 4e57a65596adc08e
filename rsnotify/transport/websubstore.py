"""Where the WebSub hub keeps its subscriptions and delivery cursors.

A small interface with three backends: Redis (when the publisher has
``--redis``: every hub on that Redis shares them), the embedded SQLite file
``websub.sqlite3`` in ``--state-dir``, and memory (unit tests).  Records are
plain JSON, never pickles.

A subscription is written when it is activated or renewed and deleted when
it is unsubscribed, expires or is ended with ``410``.  Cursors move on every
delivery, so the hub writes them in batches (at most every
``CURSOR_FLUSH`` seconds, and on shutdown): after a crash a subscription is
redelivered at most that window's notifications again -- delivery is at
least once, in order; Destinations drop what they already have by seq.
"""

from __future__ import annotations

import abc
import base64
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..log import LogUnavailable
from ..logs import redact_url
from ..sqlitedb import SQLiteWorker, StoreUnavailable
from .websubproto import Subscription

T = TypeVar("T")
CURSOR_FLUSH = 0.5  # seconds between cursor writes while deliveries go on
MAX_CONNECTIONS = 8  # Redis connections of one hub's store, at most


def to_json(sub: Subscription) -> str:
    secret = base64.b64encode(sub.secret).decode() if sub.secret is not None else None
    return json.dumps(
        {
            "collection": sub.collection,
            "topic": sub.topic,
            "callback": sub.callback,
            "secret": secret,
            "lease_seconds": sub.lease_seconds,
            "expires": sub.expires,
            "cursor": sub.cursor,
            "client": sub.client,
        },
        sort_keys=True,
    )


def from_json(text: str | bytes) -> Subscription:
    obj = json.loads(text)
    secret = base64.b64decode(obj["secret"]) if obj.get("secret") is not None else None
    return Subscription(
        collection=obj["collection"],
        topic=obj["topic"],
        callback=obj["callback"],
        secret=secret,
        lease_seconds=int(obj["lease_seconds"]),
        expires=float(obj["expires"]),
        cursor=int(obj["cursor"]),
        client=str(obj.get("client") or ""),
    )


def _field(collection: str, callback: str) -> str:
    return f"{collection}\n{callback}"


class SubscriptionStore(abc.ABC):
    """Persistence of subscriptions (and their cursors) for :class:`~.websub.WebSubHub`."""

    @abc.abstractmethod
    async def load(self) -> list[Subscription]:
        """Every stored subscription (expired ones included: the hub reaps them)."""

    @abc.abstractmethod
    async def save(self, sub: Subscription) -> None:
        """Insert or replace a subscription, cursor included."""

    @abc.abstractmethod
    async def delete(self, collection: str, callback: str) -> None:
        """Forget a subscription (no error if absent)."""

    @abc.abstractmethod
    async def save_cursors(self, cursors: dict[tuple[str, str], int]) -> None:
        """Advance the cursors of existing subscriptions (absent ones are ignored)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections and files."""


class MemoryStore(SubscriptionStore):
    """For tests and throw-away hubs: nothing survives the process."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], str] = {}

    async def load(self) -> list[Subscription]:
        return [from_json(text) for text in self.records.values()]

    async def save(self, sub: Subscription) -> None:
        self.records[sub.key] = to_json(sub)

    async def delete(self, collection: str, callback: str) -> None:
        self.records.pop((collection, callback), None)

    async def save_cursors(self, cursors: dict[tuple[str, str], int]) -> None:
        for key, cursor in cursors.items():
            if key in self.records:
                sub = from_json(self.records[key])
                sub.cursor = max(sub.cursor, cursor)
                self.records[key] = to_json(sub)

    async def close(self) -> None:
        pass


_SCHEMA = """
CREATE TABLE IF NOT EXISTS websub_subscriptions (
  collection TEXT NOT NULL,
  callback TEXT NOT NULL,
  record TEXT NOT NULL,
  cursor INTEGER NOT NULL,
  PRIMARY KEY (collection, callback)
) WITHOUT ROWID;
"""


class SQLiteStore(SubscriptionStore):
    """The embedded store: one SQLite file (WAL), all calls on one worker thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._worker: SQLiteWorker | None = SQLiteWorker(path, _SCHEMA)

    @property
    def _db(self) -> sqlite3.Connection | None:
        return self._worker.db if self._worker is not None else None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._worker is None:
            raise LogUnavailable(f"WebSub store {self.path} is closed")
        try:
            return await self._worker.run(fn, *args)
        except StoreUnavailable as exc:
            raise LogUnavailable(f"WebSub store {exc}") from None

    def _load(self) -> list[Subscription]:
        assert self._db is not None
        rows = self._db.execute("SELECT record, cursor FROM websub_subscriptions").fetchall()
        subs = []
        for record, cursor in rows:
            sub = from_json(record)
            sub.cursor = max(sub.cursor, int(cursor))
            subs.append(sub)
        return subs

    def _save(self, sub: Subscription) -> None:
        assert self._db is not None
        self._db.execute(
            "INSERT OR REPLACE INTO websub_subscriptions VALUES (?, ?, ?, ?)",
            (sub.collection, sub.callback, to_json(sub), sub.cursor),
        )

    def _delete(self, collection: str, callback: str) -> None:
        assert self._db is not None
        self._db.execute(
            "DELETE FROM websub_subscriptions WHERE collection = ? AND callback = ?",
            (collection, callback),
        )

    def _save_cursors(self, cursors: dict[tuple[str, str], int]) -> None:
        assert self._db is not None
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "UPDATE websub_subscriptions SET cursor = max(cursor, ?) "
                "WHERE collection = ? AND callback = ?",
                [(cursor, c, cb) for (c, cb), cursor in cursors.items()],
            )

    async def load(self) -> list[Subscription]:
        return await self._run(self._load)

    async def save(self, sub: Subscription) -> None:
        await self._run(self._save, sub)

    async def delete(self, collection: str, callback: str) -> None:
        await self._run(self._delete, collection, callback)

    async def save_cursors(self, cursors: dict[tuple[str, str], int]) -> None:
        if cursors:
            await self._run(self._save_cursors, cursors)

    async def close(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            await worker.close()


class RedisStore(SubscriptionStore):
    """Two hashes: ``rsn:{websub}:subscriptions`` (JSON records), ``rsn:{websub}:cursors``.

    One hash tag, so a Redis Cluster keeps both in one slot: a subscription and
    its cursor are written together and the advance script reads one and
    writes the other, which a cluster refuses across slots.  Together means a
    script here, not MULTI/EXEC: redis-py's cluster transactions run each
    queued command on an event loop of their own in a thread (redis-py 8.1),
    which breaks a client whose first command that is.  Before
    that tag they were ``rsn:websub:...``; :meth:`load` renames those (only a
    single server or Sentinel can hold them: no write to both ran in a cluster).
    """

    SUBSCRIPTIONS = "rsn:{websub}:subscriptions"
    CURSORS = "rsn:{websub}:cursors"
    BEFORE_TAGS = {"rsn:websub:subscriptions": SUBSCRIPTIONS, "rsn:websub:cursors": CURSORS}

    # Cursors move forward only, and only for subscriptions that still exist.
    _ADVANCE = """
for i = 1, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    local current = tonumber(redis.call('HGET', KEYS[2], ARGV[i]) or '0')
    if tonumber(ARGV[i + 1]) > current then
      redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
    end
  end
end
return 0
"""

    # KEYS: subscriptions, cursors.  ARGV: field, record ('' = delete), cursor.
    _PUT = """
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
end
return 0
"""

    def __init__(
        self, url: str, *, socket_timeout: float = 5.0, max_connections: int = MAX_CONNECTIONS
    ) -> None:
        from .. import redisurl  # redis-py only when a Redis store is used

        self.url = url
        # A bounded pool that waits for a free connection (issue 22.2: a burst of
        # verifications opened connections until Redis said "Too many connections").
        self._redis = redisurl.client(
            url,
            max_connections=max_connections,
            pool_timeout=socket_timeout,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
        )
        self._advance = self._redis.register_script(self._ADVANCE)
        self._put = self._redis.register_script(self._PUT)

    async def _call(self, coro: Any) -> Any:
        from redis.exceptions import RedisClusterException, RedisError

        try:
            return await coro
        except (RedisError, RedisClusterException, OSError) as exc:
            raise LogUnavailable(f"Redis at {redact_url(self.url)} unavailable: {exc}") from None

    async def load(self) -> list[Subscription]:
        for before, now in self.BEFORE_TAGS.items():
            if await self._call(self._redis.exists(before)):
                await self._call(self._redis.renamenx(before, now))
        records = await self._call(self._redis.hgetall(self.SUBSCRIPTIONS))
        cursors = await self._call(self._redis.hgetall(self.CURSORS))
        subs = []
        for name, record in records.items():
            sub = from_json(record)
            sub.cursor = max(sub.cursor, int(cursors.get(name, 0)))
            subs.append(sub)
        return subs

    async def save(self, sub: Subscription) -> None:
        keys = [self.SUBSCRIPTIONS, self.CURSORS]
        await self._call(self._put(keys=keys, args=[_field(*sub.key), to_json(sub), sub.cursor]))

    async def delete(self, collection: str, callback: str) -> None:
        keys = [self.SUBSCRIPTIONS, self.CURSORS]
        await self._call(self._put(keys=keys, args=[_field(collection, callback), "", 0]))

    async def save_cursors(self, cursors: dict[tuple[str, str], int]) -> None:
        if not cursors:
            return
        argv: list[Any] = []
        for key, cursor in cursors.items():
            argv += [_field(*key), cursor]
        await self._call(self._advance(keys=[self.SUBSCRIPTIONS, self.CURSORS], args=argv))

    async def close(self) -> None:
        await self._redis.aclose()


def open_store(redis_url: str | None, state_dir: str | None) -> SubscriptionStore:
    """Redis when the publisher has one, else ``<state_dir>/websub.sqlite3``."""
    if redis_url:
        return RedisStore(redis_url)
    directory = Path(state_dir or ".rsnotify")
    directory.mkdir(parents=True, exist_ok=True)
    return SQLiteStore(directory / "websub.sqlite3")
