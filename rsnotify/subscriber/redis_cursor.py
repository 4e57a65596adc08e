"""The subscriber's cursors in Redis (``rsnotify subscribe --redis``).

For Destinations that already run Redis and want their position visible to
their own tooling (or kept off a local disk they may lose), the cursors can
live in Redis instead of ``<state>/cursor.sqlite3``.  The semantics are the
SQLite store's: one hash field per collection holding the cursor as JSON,
written only after the changes it covers are applied.

Durability is Redis's: with AOF (``appendfsync everysec``) a crash of Redis
may lose the last second of cursor writes.  That moves a cursor *back*, never
ahead of the mirror, so the next start re-applies a few changes, which the
resource store makes no-ops.  Nothing is skipped.  The per-DIR ``flock`` still
guards the mirror (the resource store stays next to it).

Keys: ``rsn:dest:{<id>}:cursors`` (hash) and ``rsn:dest:{<id>}:events`` (a
list capped at :data:`MAX_EVENTS`), ``<id>`` being ``--name`` or a stable id
derived from the host name and the mirror's absolute path.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import redisurl
from ..backoff import Backoff
from ..cancellation import raise_if_cancelled
from ..errors import CursorStoreUnavailable
from ..logs import redact_url
from ..tracker import Checkpoint
from .cursor import Cursor

__all__ = ["MAX_EVENTS", "CursorStoreUnavailable", "RedisCursorStore", "destination_id"]

MAX_EVENTS = 1_000

log = logging.getLogger("rsnotify.subscribe")


def destination_id(into: str | Path, name: str | None = None) -> str:
    """``name`` if given, else ``<host>-<8 hex of the mirror's absolute path>``."""
    if name:
        return name
    digest = hashlib.sha256(str(Path(into).resolve()).encode()).hexdigest()[:8]
    return f"{socket.gethostname()}-{digest}"


class RedisCursorStore:
    """Same interface as :class:`~.cursor.CursorStore`, backed by Redis."""

    def __init__(
        self, url: str, destination: str, *, socket_timeout: float = 5.0, patience: float = 30.0
    ) -> None:
        self.url = url
        self.where = redact_url(url)  # for messages: no password
        self.patience = patience
        self.destination = destination
        tag = "{" + destination + "}"
        self._cursors_key = f"rsn:dest:{tag}:cursors"
        self._events_key = f"rsn:dest:{tag}:events"
        self._redis = redisurl.client(
            url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout
        )
        self._closing = False  # see begin_close()

    def begin_close(self) -> None:
        """From now on a cursor save gives up after ``patience`` seconds of outage.

        While running, a save retries for as long as Redis is away (changes keep
        being applied; the cursor only lags).  At shutdown that would hold the
        process forever, so the last saves get the same patience as the first
        read.  Giving up loses nothing: the stored cursor stays behind the
        mirror, and the next start re-applies the changes after it as no-ops.
        """
        self._closing = True

    # Any: redis-py types each asyncio command's result as "Awaitable[Any] | Any".
    async def _call(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except (RedisConnectionError, RedisTimeoutError, OSError, RedisClusterException) as exc:
            raise CursorStoreUnavailable(f"Redis at {self.where} unavailable: {exc}") from None
        except RedisError as exc:
            raise CursorStoreUnavailable(f"Redis at {self.where}: {exc}") from None

    async def get(self, collection: str) -> Cursor | None:
        """The stored cursor; waits up to ``patience`` seconds for an unreachable Redis.

        Starting without the cursor would mean a new baseline, so a Redis that
        is restarting is waited for; one that stays away is a clear error.
        """
        backoff = Backoff(initial=0.1, maximum=2.0)
        deadline = time.monotonic() + self.patience
        while True:
            raise_if_cancelled()
            try:
                raw = await self._call(self._redis.hget(self._cursors_key, collection))
                break
            except CursorStoreUnavailable as exc:
                if time.monotonic() >= deadline:
                    raise
                delay = backoff.next()
                log.warning("cannot read the %s cursor (%s); retrying in %.1fs",
                            collection, exc, delay)  # fmt: skip
                await asyncio.sleep(delay)
        if raw is None:
            return None
        try:
            obj = json.loads(raw)
            return Cursor(
                collection=collection,
                capabilitylist=str(obj["capabilitylist"]),
                last_seq=obj["last_seq"] if isinstance(obj["last_seq"], int) else None,
                checkpoint=Checkpoint.from_json(obj["checkpoint"]),
                baseline_done=bool(obj["baseline_done"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CursorStoreUnavailable(
                f"cursor of {collection} in {self._cursors_key} is unreadable: {exc}"
            ) from None

    async def put(self, cursor: Cursor) -> None:
        value = json.dumps(
            {
                "capabilitylist": cursor.capabilitylist,
                "last_seq": cursor.last_seq,
                "checkpoint": cursor.checkpoint.to_json(),
                "baseline_done": cursor.baseline_done,
                "updated": time.time(),
            },
            sort_keys=True,
        )
        backoff = Backoff(initial=0.1, maximum=5.0)
        first_failure: float | None = None
        while True:
            raise_if_cancelled()
            try:
                await self._call(self._redis.hset(self._cursors_key, cursor.collection, value))
                break
            except CursorStoreUnavailable as exc:
                # The cursor only lags while Redis is away (changes keep being
                # applied); giving up would stop the pipeline for nothing.
                now = time.monotonic()
                first_failure = now if first_failure is None else first_failure
                if self._closing and now - first_failure >= self.patience:
                    raise CursorStoreUnavailable(
                        f"the {cursor.collection} cursor was not saved at shutdown ({exc}, "
                        f"for {self.patience:g}s): the next start resumes from the last "
                        "saved cursor and re-applies the changes after it, which are no-ops"
                    ) from None
                delay = backoff.next()
                log.warning("cannot save the %s cursor (%s); retrying in %.1fs",
                            cursor.collection, exc, delay)  # fmt: skip
                await asyncio.sleep(delay)
        if backoff.attempts:
            log.info("saved the %s cursor again", cursor.collection)

    async def event(self, collection: str, kind: str, detail: str) -> None:
        """Record a gap, catch-up, reconnect or refusal for audits and the dashboard."""
        entry = json.dumps([time.time(), collection, kind, detail])
        try:
            # Not MULTI/EXEC: redis-py runs a cluster's transactions on a loop of
            # their own (see transport/websubstore.py); a list capped a moment
            # late is no harm.
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.lpush(self._events_key, entry)
                pipe.ltrim(self._events_key, 0, MAX_EVENTS - 1)
                await self._call(pipe.execute())
        except CursorStoreUnavailable as exc:  # events are advisory: log, don't fail
            log.warning("event of %s not recorded: %s", collection, exc)

    async def events(self, limit: int = 100) -> list[tuple[float, str, str, str]]:
        rows = await self._call(self._redis.lrange(self._events_key, 0, max(limit, 1) - 1))
        out: list[tuple[float, str, str, str]] = []
        for raw in rows:
            try:
                when, collection, kind, detail = json.loads(raw)
            except (ValueError, TypeError):
                continue  # not ours: never let a stray value break the subscriber
            out.append((float(when), str(collection), str(kind), str(detail)))
        return out

    async def close(self) -> None:
        await self._redis.aclose()
