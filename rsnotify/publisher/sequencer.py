"""The sequencer: every detected entry gets the next sequence number, in the log.

Order of operations for every new entry (design.md section 3):

1. a watcher detects it, with the checkpoint just after it;
2. the sequencer gives it the next sequence number and appends it to the log
   together with that checkpoint, atomically (a batch at a time);
3. transports (MQTT, WebSocket, WebSub) tail the log and push it.

A crash anywhere re-detects from the last committed checkpoint, which is
exactly after the last logged entry, so an entry gets one sequence number
forever.  Every append names the head it expects and, under ``--ha``, the
leader's fencing token: a publisher that lost the lease, or whose idea of
the head is stale, is refused (``Fenced``, ``LogConflict``) instead of
writing a second sequence number for the same entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from .. import framework
from ..cancellation import raise_if_cancelled
from ..changes.watcher import ChangeWatcher
from ..envelope import Notification, to_json
from ..errors import LogDiverged
from ..framework import FrameworkChange
from ..log import LogUnavailable, NotificationLog, Retention
from ..log.tail_cache import TailCache
from ..metrics import PublisherMetrics
from ..tracker import Checkpoint, Detection
from .frameworkwatch import FrameworkState, FrameworkWatcher
from .pushed import PushedWindow, Refuse, Rewrite
from .tasks import pause

log = logging.getLogger("rsnotify.publish")

RETENTION_INTERVAL = 60.0  # seconds between applications of age retention


@dataclass(slots=True)
class CollectionState:
    """One published collection: its watchers and the heads of its two log streams."""

    id: str
    capability_list: str
    # Its Change Lists, or (a Source that has none) successive Resource List snapshots.
    watcher: ChangeWatcher
    head: int = 0
    trigger: asyncio.Event = field(default_factory=asyncio.Event)  # poll now (a ping, a file)
    framework: FrameworkWatcher | None = None  # with --websub and --framework-interval
    framework_head: int = 0
    framework_trigger: asyncio.Event = field(default_factory=asyncio.Event)
    #: The change time of the last entry this process logged: the ``since`` of the next
    #: (None after a start: the checkpoint's ``last_time`` stands in).
    last_change: datetime | None = None


class Sequencer:
    """Appends what the watchers found to the log, numbered, with its checkpoint."""

    def __init__(
        self,
        log: NotificationLog,
        metrics: PublisherMetrics,
        *,
        batch: int,
        retention: Retention,
    ) -> None:
        self.log = log
        self.metrics = metrics
        self.batch = max(1, batch)
        self.retention = retention
        #: The leader's fencing token (``--ha``); None: no election, or not leading.
        self.fence: int | None = None
        #: What this process appended, per collection, to check the log against (issue 19).
        self.pushed: dict[str, PushedWindow] = {}

    async def reload(self, collection: CollectionState) -> None:
        """Take the head and checkpoint the log holds (another publisher may have moved it on).

        Entries the log still holds back (a publisher died waiting for
        replication, a failover lost their release) are released first.
        """
        await self.log.settle(collection.id)
        await self.reconcile(collection)
        # Head before checkpoint: a deposed leader's late append landing between
        # the two then shows as a conflict at our next append (and a reload),
        # where the other order would have us log its entries a second time.
        head = await self.log.head(collection.id)
        checkpoint = Checkpoint.from_json(await self.log.checkpoint(collection.id))
        collection.head = head
        collection.last_change = None  # what another publisher logged is not known here
        collection.watcher.reset(checkpoint)

    async def reconcile(self, collection: CollectionState) -> None:
        """Check the log still holds what this process pushed; restore it, or raise LogDiverged.

        The rule is :meth:`PushedWindow.reconcile`.  A failover that lost
        pushed entries shows up here: the detection loop reloads after every
        conflict or outage, and a rolled-back head would otherwise number the
        next entries again.
        """
        window = self.pushed.get(collection.id)
        if window is None or window.high == 0:
            return
        # The backend itself: the tail cache would answer from this very memory.
        backend = self.log.inner if isinstance(self.log, TailCache) else self.log
        head = await backend.head(collection.id)
        earliest = await backend.earliest(collection.id)
        logged: dict[int, bytes] = {}
        after, last = max(window.low, earliest) - 1, min(head, window.high)
        while after < last:
            records = await backend.read(collection.id, after, min(1000, last - after))
            if not records:
                break
            logged.update((r.seq, r.data) for r in records if r.seq <= last)
            after = records[-1].seq
        # Retention runs beside this (keep_retention): what it trimmed while we
        # read was trimmed, not lost, and must not read as a divergence.
        earliest = max(earliest, await backend.earliest(collection.id))
        verdict = window.reconcile(head, earliest, logged)
        if isinstance(verdict, Rewrite):
            await self.log.append(
                collection.id,
                list(verdict.payloads),
                expected_head=verdict.after,
                checkpoint=verdict.checkpoint,
                fence=self.fence,
                max_len=self.retention.max_len,
            )
            self.metrics.log_reconciled.labels(collection.id, "rewritten").inc()
            log.warning(
                "%s: the log had lost seqs %d..%d, already pushed; wrote them again from memory",
                collection.id,
                verdict.after + 1,
                window.high,
                extra={"collection": collection.id},
            )
        elif isinstance(verdict, Refuse):
            self.metrics.log_reconciled.labels(collection.id, "refused").inc()
            window.forget()
            raise LogDiverged(f"{collection.id}: {verdict.reason}")

    async def commit_checkpoint(self, collection: CollectionState, checkpoint: Checkpoint) -> None:
        """Move the checkpoint on without entries (the lists were read through)."""
        collection.head = await self.log.append(
            collection.id,
            [],
            expected_head=collection.head,
            checkpoint=checkpoint.to_json(),
            fence=self.fence,
        )
        collection.watcher.commit(checkpoint)

    async def log_detection(
        self,
        collection: CollectionState,
        found: Detection,
        detected: datetime,
        *,
        closing: Checkpoint | None = None,
    ) -> None:
        """Sequence and log one list's new entries, a batch at a time, each with its checkpoint.

        ``closing``: where the poll that found them ended, when nothing was
        found after them (their last checkpoint with the list's validators
        added).  The last batch is logged with it, so the poll needs no
        second append just to record the validators: that was one more
        round trip to the log per detection (12 % of the publisher's CPU at
        200 changes/s, py-spy).
        """
        watcher = collection.watcher
        batch = self.batch
        for start in range(0, len(found.entries), batch):
            entries = found.entries[start : start + batch]
            checkpoint = found.checkpoints[start + len(entries) - 1]
            if closing is not None and start + batch >= len(found.entries):
                checkpoint = closing
            head = collection.head
            # Each change remembers the one logged before it: the start of its
            # Change Notification interval (see rsnotify.envelope).  Not the
            # checkpoint's last_time: a Resource List snapshot's checkpoints
            # carry its ``at`` (later than the changes it still holds), so
            # intervals would not chain across batches.
            previous = collection.last_change or watcher.checkpoint.last_time
            payloads = []
            for i, entry in enumerate(entries, start=1):
                payloads.append(
                    to_json(
                        Notification.from_entry(
                            entry,
                            collection=collection.id,
                            seq=head + i,
                            capabilitylist=collection.capability_list,
                            changelist=found.changelist,
                            detected=detected,
                            since=previous,
                            derived=found.derived,
                        )
                    )
                )
                previous = entry.change_time
            committed = checkpoint.to_json()
            collection.head = await self.log.append(
                collection.id,
                payloads,
                expected_head=head,
                checkpoint=committed,
                fence=self.fence,
                max_len=self.retention.max_len,
            )
            collection.last_change = previous
            window = self.pushed.setdefault(collection.id, PushedWindow())
            window.record(head + 1, payloads, committed)
            watcher.commit(checkpoint)
            if collection.framework is not None and found.derived is None:
                # A "changelist updated" at the next check (derived changes have no Change List).
                collection.framework.note_entries(found.changelist, entries[-1].change_time)
            self.metrics.detected.labels(collection.id).inc(len(entries))
            self.metrics.head.labels(collection.id).set(collection.head)
            now = time.time()
            lag = self.metrics.detection_lag.labels(collection.id)
            for entry in entries:
                if entry.change_time is not None:
                    lag.observe(max(0.0, now - entry.change_time.timestamp()))
            log.debug(
                "logged %d entries of %s up to seq %d",
                len(entries),
                found.changelist,
                collection.head,
                extra={"collection": collection.id, "seq": collection.head},
            )

    async def load_framework(self, collection: CollectionState) -> None:
        """Take the framework state and head the last leader committed."""
        assert collection.framework is not None
        stream = framework.stream(collection.id)
        await self.log.settle(stream)  # what a previous leader left held back (see reload)
        head = await self.log.head(stream)  # before the checkpoint, as in reload
        collection.framework.state = FrameworkState.from_json(await self.log.checkpoint(stream))
        collection.framework_head = head

    async def log_framework(
        self, collection: CollectionState, state: FrameworkState, changes: list[FrameworkChange]
    ) -> None:
        """Append a check's framework changes with the state they were found against."""
        assert collection.framework is not None
        head = collection.framework_head
        records = []
        for i, change in enumerate(changes, start=1):
            change.seq = head + i
            records.append(
                framework.to_record(
                    change, collection=collection.id, capabilitylist=collection.capability_list
                )
            )
        collection.framework_head = await self.log.append(
            framework.stream(collection.id),
            records,
            expected_head=head,
            checkpoint=state.to_json(),
            fence=self.fence,
            max_len=self.retention.max_len,
        )
        collection.framework.commit(state)
        for change in changes:
            log.info(
                "%s: framework notification %d: %s",
                collection.id,
                change.seq,
                change.describe(),
                extra={"collection": collection.id, "seq": change.seq},
            )

    async def keep_retention(
        self, collections: Mapping[str, CollectionState], stopping: asyncio.Event
    ) -> None:
        """Apply age retention and refresh the earliest-seq gauges once a minute.

        And release what the log holds back and nobody else will: entries a
        publisher that stopped while waiting for replicas left behind, or a
        failover's lost release, in a collection (or framework stream) quiet
        enough that no append and no reload comes to release them.  After the
        trim, so entries held back longer than the age limit are not trimmed
        the moment they appear; one probe each (``patient=False``: one
        ``WAIT`` of ``--redis-wait-ms``), so one shard without its replica
        holds up no other collection's retention (the next minute tries
        again).  Not a timeout: cancelling the Redis client mid-command can
        leave its connection broken.
        """
        while not stopping.is_set():
            raise_if_cancelled()  # the log's Redis client may have swallowed a cancellation
            for collection in list(collections.values()):
                streams = [collection.id]
                if collection.framework is not None:
                    streams.append(framework.stream(collection.id))
                for stream in streams:
                    with contextlib.suppress(LogUnavailable):
                        earliest = await self.log.trim(
                            stream, self.retention, int(time.time() * 1000)
                        )
                        if stream == collection.id:
                            self.metrics.earliest.labels(collection.id).set(earliest)
                    with contextlib.suppress(LogUnavailable):
                        await self.log.settle(stream, patient=False)
            await pause(stopping, RETENTION_INTERVAL)
