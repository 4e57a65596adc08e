"""One collection's live feed from the log: read once, render once, a dense ring, wake readers.

The WebSocket gateway (:mod:`.ws`) and the WebSub hub (:mod:`.websub`) serve
many readers of one collection from the notification log.  Both do it the
same way, here:

* one :class:`LogTail` per collection with readers loops on ``log.wait``
  and renders each record once, whatever the number of readers;
* it keeps the last ``capacity`` rendered items in a ring addressed by seq.
  The ring is *dense* (consecutive seqs, ending at :attr:`LogTail.position`):
  if the log trimmed records before the tail read them, the ring restarts
  at the next record it gets, so a reader can tell "in the ring" from "gone"
  by comparing seqs, never by finding a hole;
* fan-out is setting each reader's ``wake`` event (:meth:`LogTail.wake_readers`;
  the WebSocket feed writes shared frames there first): the tail never
  awaits a reader, so one slow reader cannot hold up anything else;
* log trouble is retried with :class:`~rsnotify.backoff.Backoff` and logged
  once per outage (a warning when it starts, a line when it ends): the tail
  must outlive anything the log does;
* the loop ends when the tail has no reader left; its owner forgets it then
  (or cancels it sooner).

What a transport does with the ring (WebSocket frames, WebSub batches,
pacing to the fastest client) stays in the transport.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, Protocol, TypeVar

from ..backoff import Backoff
from ..cancellation import raise_if_cancelled
from ..log import LogRecord, NotificationLog

__all__ = ["BACKOFF_MAX", "BACKOFF_MIN", "WAIT_TIMEOUT", "LogTail", "Reader", "Sequenced"]

logger = logging.getLogger(__name__)

#: Longest ``log.wait``; also how soon an idle tail notices it has no readers.
WAIT_TIMEOUT = 2.0
#: Retry delays after a failed read: 0.1 s doubling up to 5 s (with jitter).
BACKOFF_MIN = 0.1
BACKOFF_MAX = 5.0


class Sequenced(Protocol):
    """A rendered record: whatever the transport made of it, under its seq."""

    @property
    def seq(self) -> int: ...


class Reader(Protocol):
    """Anyone fed by a tail: woken (never awaited) when new items are in the ring."""

    @property
    def wake(self) -> asyncio.Event: ...


ItemT = TypeVar("ItemT", bound=Sequenced)
ReaderT = TypeVar("ReaderT", bound=Reader)


class LogTail(Generic[ItemT, ReaderT]):
    """The live feed of one collection: position in the log, ring of rendered items, readers.

    ``render(record, read_at)`` turns a record into the ring's item
    (``read_at``: the loop time the batch was read).  ``batch`` bounds one
    ``log.wait``.  With ``recheck_head``, a wait that returns nothing is
    followed by a look at the head and a read if it moved (the WebSub hub's
    extra guard against a wait that misses appends).
    """

    def __init__(
        self,
        log: NotificationLog,
        collection: str,
        position: int,
        capacity: int,
        render: Callable[[LogRecord, float], ItemT],
        *,
        batch: int,
        recheck_head: bool = False,
    ) -> None:
        self.log = log
        self.collection = collection
        self.position = position  # last seq read from the log
        self.ring: deque[ItemT] = deque(maxlen=capacity)  # dense seqs, ending at position
        self.readers: set[ReaderT] = set()
        self.healthy = True
        self.task: asyncio.Task[None] | None = None
        self._render = render
        self.batch = batch
        self._recheck_head = recheck_head

    @property
    def window_start(self) -> int:
        """The oldest seq still in memory (``position + 1`` when the ring is empty)."""
        return self.ring[0].seq if self.ring else self.position + 1

    def item(self, seq: int) -> ItemT:
        """The ring's item for ``seq`` (``window_start <= seq <= position``)."""
        return self.ring[seq - self.ring[0].seq]

    async def run(self, pace: Callable[[], Awaitable[None]] | None = None) -> None:
        """Read, render and wake until no reader is left; ``pace`` is awaited before each read."""
        backoff = Backoff(BACKOFF_MIN, BACKOFF_MAX)
        while self.readers:
            raise_if_cancelled()
            if pace is not None:
                await pace()
            try:
                records = await self._read()
            except Exception as exc:  # the tail must outlive any log trouble
                if self.healthy:
                    logger.warning("%s: cannot read the log: %s", self.collection, exc)
                self.healthy = False
                await asyncio.sleep(backoff.next())
                continue
            if not self.healthy:
                logger.info("%s: reading the log again", self.collection)
            self.healthy = True
            backoff.reset()
            if records:
                self.advance(records)
                self.wake_readers()

    async def _read(self) -> list[LogRecord]:
        records = await self.log.wait(
            self.collection, self.position, timeout=WAIT_TIMEOUT, limit=self.batch
        )
        if not records and self._recheck_head:
            head = await self.log.head(self.collection)
            if head > self.position:
                records = await self.log.read(self.collection, self.position, limit=self.batch)
        return records

    def wake_readers(self) -> None:
        """New items are in the ring: wake every reader (a transport may serve some itself)."""
        for reader in self.readers:
            reader.wake.set()

    def advance(self, records: Sequence[LogRecord]) -> None:
        """Render ``records`` into the ring, keeping it dense."""
        now = asyncio.get_running_loop().time()
        for record in records:
            if record.seq <= self.position:
                continue
            if record.seq != self.position + 1:
                self.ring.clear()  # trimmed before we read them: keep the ring dense
            self.ring.append(self._render(record, now))
            self.position = record.seq
