"""The notification log: durable, ordered, per collection.

The log is where a notification becomes real.  The publisher appends a batch
of envelopes *and* its checkpoint in one atomic step (a Lua script in Redis, a
transaction in SQLite), so after a crash either both the entries and the
checkpoint that covers them exist, or neither: re-detecting an entry can never
give it a second sequence number, and no entry is skipped.  Transports (MQTT,
WebSocket, WebSub) then tail the log, each with its own cursor, so a broker
outage only delays pushes.

Sequence numbers are dense from 1 and never reused: the head is kept apart
from the entries, so trimming old entries (retention) never rewinds it.  The
appender passes the head it expects; a mismatch (another publisher got there
first) or a stale fencing token (a deposed leader) fails the append instead of
interleaving two writers.

Backends: :mod:`.redis_log` (Redis Streams, for production and for several
processes) and :mod:`.sqlite_log` (one local file, nothing else to install).
Both pass the same test suite.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import Fenced, LogConflict, LogError, LogUnavailable

__all__ = [
    "Fenced",
    "LogConflict",
    "LogError",
    "LogRecord",
    "LogUnavailable",
    "NotificationLog",
    "Retention",
    "open_log",
]


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One logged notification: its sequence number and envelope bytes (canonical JSON)."""

    seq: int
    data: bytes
    logged_ms: int


@dataclass(frozen=True, slots=True)
class Retention:
    """How much of the log to keep: by count, by age, or both (None: unbounded)."""

    max_len: int | None = 100_000
    max_age_s: float | None = 7 * 24 * 3600.0


class NotificationLog(abc.ABC):
    """What publishers, gateways and dashboards need from a log backend."""

    @abc.abstractmethod
    async def head(self, collection: str) -> int:
        """The last sequence number assigned (0 for a new collection)."""

    async def released_head(self, collection: str) -> int:
        """The last sequence number a reader can read now: what a transport may announce.

        The same as :meth:`head` except while an append is held back until
        replicated (``RedisLog``'s ``wait_replicas``): its seqs are assigned,
        so they count in the head (the next append's ``expected_head``), but
        nobody can read them yet.  A head message, an Atom page window or a
        new reader's starting point built on the head would promise what is
        not there: a subscriber sees a gap that is none, or an archive page
        is served "complete" without them.
        """
        return await self.head(collection)

    @abc.abstractmethod
    async def earliest(self, collection: str) -> int:
        """The first retained sequence number (``head + 1`` when nothing is retained)."""

    @abc.abstractmethod
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
        """Append envelopes for seqs ``expected_head+1...`` and store ``checkpoint``, atomically.

        ``logged_ms`` is the time recorded with the records (default: now); a
        caller that keeps the records itself passes it to know their fields.

        Returns the new head.  Raises LogConflict, Fenced or LogUnavailable.
        An empty ``payloads`` just stores the checkpoint (e.g. a new ETag).
        ``max_len`` trims the oldest entries in the same step (count retention).
        """

    @abc.abstractmethod
    async def checkpoint(self, collection: str) -> str | None:
        """The checkpoint stored with the last append."""

    @abc.abstractmethod
    async def read(self, collection: str, after: int, limit: int = 1000) -> list[LogRecord]:
        """Records with seq > ``after``, oldest first, at most ``limit``."""

    @abc.abstractmethod
    async def wait(
        self, collection: str, after: int, timeout: float, limit: int = 1000
    ) -> list[LogRecord]:
        """Like :meth:`read`, but wait up to ``timeout`` seconds for at least one record."""

    @abc.abstractmethod
    async def trim(self, collection: str, retention: Retention, now_ms: int) -> int:
        """Apply retention; returns the earliest retained sequence number."""

    @abc.abstractmethod
    async def cursor(self, collection: str, name: str) -> int:
        """A named consumer's position (e.g. ``mqtt``: last seq the broker acknowledged)."""

    @abc.abstractmethod
    async def set_cursor(self, collection: str, name: str, seq: int) -> None:
        """Advance a named consumer's position (never moves it backwards)."""

    @abc.abstractmethod
    async def collections(self) -> dict[str, str]:
        """Known collections: id -> Capability List URI."""

    @abc.abstractmethod
    async def register(self, collection: str, capability_list: str) -> None:
        """Record a collection and its Capability List URI."""

    async def settle(  # noqa: B027 - optional: most never hold back
        self, collection: str, *, patient: bool = True
    ) -> None:
        """Make visible what an append left held back (see ``RedisLog``'s ``wait_replicas``).

        ``patient``: wait until replicas hold it; else ask once and leave what
        they do not hold yet for a later call.  A no-op for backends that
        never hold entries back.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections and files."""

    async def __aenter__(self) -> NotificationLog:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def open_log(
    redis_url: str | None,
    state_dir: str | None,
    *,
    wait_replicas: int = 0,
    wait_timeout: float = 1.0,
) -> NotificationLog:
    """Redis when a URL is given, otherwise the embedded SQLite log in ``state_dir``.

    ``wait_replicas``/``wait_timeout``: Redis replicas that must hold an entry
    before any transport may push it (see :mod:`.redis_log`).
    """
    if redis_url:
        from .redis_log import RedisLog

        return RedisLog(redis_url, wait_replicas=wait_replicas, wait_timeout=wait_timeout)
    from pathlib import Path

    from .sqlite_log import SQLiteLog

    directory = Path(state_dir or ".rsnotify")
    directory.mkdir(parents=True, exist_ok=True)
    return SQLiteLog(directory / "log.sqlite3")
