"""The recent end of the log, kept in the publisher's memory for its own transports.

In one publisher process the appender and the transports (MQTT, WebSocket,
WebSub) share a log: the appender writes a batch, and each transport reads
the same batch straight back.  During a burst (a Change List of 50,000 entries
appearing at once) those read-backs were a Redis round trip and a decode per
transport per batch, for bytes the process had just written.

:class:`TailCache` wraps any :class:`~rsnotify.log.NotificationLog`.  After a
successful append it keeps the records in a bounded ring per collection, and
a read or wait for records the ring holds is answered from memory.  Anything
else (older records, other collections, records appended by another process)
goes to the wrapped log, so correctness never depends on the cache:

* records are immutable once appended under their sequence numbers, so a
  cached record is what the log holds; what retention trims (by this
  process: the publisher is the one that trims) leaves the ring too;
* the ring is kept dense: an append that does not follow the ring's last
  record (another publisher appended in between, e.g. after an HA failover)
  restarts it;
* a wait at the ring's end listens for this process's next append for at
  most :data:`LOCAL_WAIT`, then asks the log, whose notification covers
  appends by every process (another writer costs that much latency once).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence

from . import LogRecord, NotificationLog, Retention

__all__ = ["DEFAULT_CAPACITY", "DEFAULT_MAX_BYTES", "TailCache"]

DEFAULT_CAPACITY = 100_000  # records per collection (~0.5 KB each)
# Bytes of record data held over all collections.  A Change List of 50,000
# entries appearing at once is logged in ~3 s and pushed over ~8 s: the
# transports must still find the whole burst here (~25 MB), or every read
# behind the ring's edge is a Redis round trip and a decode (~6% of the
# publisher's CPU in bench/publish.py with a 10,000-record ring).
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
LOCAL_WAIT = 1.0  # seconds a caught-up wait listens for this process's appends


class TailCache(NotificationLog):
    """A :class:`NotificationLog` that remembers what this process appended."""

    def __init__(
        self,
        inner: NotificationLog,
        capacity: int = DEFAULT_CAPACITY,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if capacity < 1 or max_bytes < 1:
            raise ValueError("capacity and max_bytes must be at least 1")
        self.inner = inner
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.bytes = 0  # record data held, over every ring
        self._rings: dict[str, deque[LogRecord]] = {}
        self._ring_bytes: dict[str, int] = {}
        self._appended: dict[str, asyncio.Event] = {}
        self.hits = 0  # reads answered from memory (a metric for benchmarks and tests)

    def _cached(self, collection: str, after: int, limit: int) -> list[LogRecord] | None:
        ring = self._rings.get(collection)
        if not ring or limit < 1:
            return None
        first, last = ring[0].seq, ring[-1].seq
        if not first <= after + 1 <= last:
            return None
        start = after + 1 - first
        self.hits += 1
        return [ring[i] for i in range(start, min(start + limit, len(ring)))]

    # -- cached ---------------------------------------------------------------------

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
        if logged_ms is None:
            logged_ms = int(time.time() * 1000)
        head = await self.inner.append(
            collection,
            payloads,
            expected_head=expected_head,
            checkpoint=checkpoint,
            fence=fence,
            max_len=max_len,
            logged_ms=logged_ms,
        )
        if payloads:
            ring = self._rings.get(collection)
            if ring is None:
                ring = self._rings[collection] = deque(maxlen=self.capacity)
            if ring and ring[-1].seq != expected_head:
                self._forget_before(collection, ring[-1].seq + 1)  # keep the ring dense
            first = head - len(payloads) + 1
            keep = payloads[-self.capacity :]  # a batch bigger than the ring: its end
            first += len(payloads) - len(keep)
            # Make room first: a full deque would drop from the left, unaccounted.
            if ring:
                overflow = len(ring) + len(keep) - self.capacity
                self._forget_before(collection, ring[0].seq + max(0, overflow))
            ring.extend(
                LogRecord(seq=first + i, data=data, logged_ms=logged_ms)
                for i, data in enumerate(keep)
            )
            added = sum(len(data) for data in keep)
            self._ring_bytes[collection] = self._ring_bytes.get(collection, 0) + added
            self.bytes += added
            if self.bytes > self.max_bytes:
                self._shed()
        if max_len is not None:
            self._forget_before(collection, head - max_len + 1)
        if payloads:
            appended = self._appended.pop(collection, None)
            if appended is not None:
                appended.set()  # wakes every waiter; the next wait makes a new event
        return head

    def _forget_before(self, collection: str, earliest: int) -> None:
        """Drop records below ``earliest`` (what retention trimmed, or to make room)."""
        ring = self._rings.get(collection)
        dropped = 0
        while ring and ring[0].seq < earliest:
            dropped += len(ring.popleft().data)
        if dropped:
            self._ring_bytes[collection] -= dropped
            self.bytes -= dropped

    def _shed(self) -> None:
        """Over the byte budget: drop the oldest records of the biggest rings.

        The biggest ring is the one a burst is filling; its oldest records are
        the ones its readers have most likely passed already.
        """
        while self.bytes > self.max_bytes:
            collection = max(self._ring_bytes, key=self._ring_bytes.__getitem__)
            ring = self._rings[collection]
            if not ring:
                break
            # A tenth of the ring at a time: shedding is rare, picking is O(rings).
            self._forget_before(collection, ring[0].seq + max(1, len(ring) // 10))

    async def read(self, collection: str, after: int, limit: int = 1000) -> list[LogRecord]:
        cached = self._cached(collection, after, limit)
        return cached if cached is not None else await self.inner.read(collection, after, limit)

    async def wait(
        self, collection: str, after: int, timeout: float, limit: int = 1000
    ) -> list[LogRecord]:
        cached = self._cached(collection, after, limit)
        if cached is not None:
            return cached
        ring = self._rings.get(collection)
        if ring and after == ring[-1].seq and timeout > 0:
            # Caught up with this process's own appends, which in a publisher
            # are all of them: wait for the next one here, briefly.  Another
            # writer (an HA takeover) is seen by the backend's wait after that.
            local = min(timeout, LOCAL_WAIT)
            appended = self._appended.setdefault(collection, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(local):
                    await appended.wait()
            cached = self._cached(collection, after, limit)
            if cached is not None:
                return cached
            timeout -= local
        return await self.inner.wait(collection, after, max(timeout, 0.0), limit)

    # -- delegated ------------------------------------------------------------------

    async def head(self, collection: str) -> int:
        return await self.inner.head(collection)

    async def earliest(self, collection: str) -> int:
        return await self.inner.earliest(collection)

    async def released_head(self, collection: str) -> int:
        return await self.inner.released_head(collection)

    async def checkpoint(self, collection: str) -> str | None:
        return await self.inner.checkpoint(collection)

    async def trim(self, collection: str, retention: Retention, now_ms: int) -> int:
        earliest = await self.inner.trim(collection, retention, now_ms)
        self._forget_before(collection, earliest)
        return earliest

    async def cursor(self, collection: str, name: str) -> int:
        return await self.inner.cursor(collection, name)

    async def settle(self, collection: str, *, patient: bool = True) -> None:
        await self.inner.settle(collection, patient=patient)

    async def set_cursor(self, collection: str, name: str, seq: int) -> None:
        await self.inner.set_cursor(collection, name, seq)

    async def collections(self) -> dict[str, str]:
        return await self.inner.collections()

    async def register(self, collection: str, capability_list: str) -> None:
        await self.inner.register(collection, capability_list)

    async def close(self) -> None:
        self._rings.clear()
        self._ring_bytes.clear()
        self.bytes = 0
        await self.inner.close()
