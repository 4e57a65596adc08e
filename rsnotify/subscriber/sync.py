"""The sync engine for one collection: baseline, live apply, gaps, catch-up.

Invariants, in the order the engine protects them:

1. **Nothing lost.**  The channel subscribes *before* the engine catches up,
   so every notification published after the catch-up's read of the Change
   Lists is received, and everything before it is in the Change Lists.  Any
   doubt (a sequence jump, a reconnect without session, a silent publisher, a
   bad payload, the safety timer) triggers a catch-up from the Change List
   Index, which always works.
2. **Nothing applied twice, nothing stale.**  The cursor is a tracker
   checkpoint (change time plus identities at that time) and advances only
   over changes that were applied, in order; notifications already covered by
   it are dropped; the applier itself refuses a change older than what a file
   already holds.
3. **Durable.**  The cursor is written after the changes it covers are on
   disk, so a crash re-applies a few changes (no-ops) and skips none.

Changes of one resource are applied in order, different resources
concurrently (the applier's per-URI chains); the cursor follows the longest
applied prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import envelope
from ..backoff import Backoff
from ..envelope import InvalidNotification, Notification
from ..errors import DocumentError, FetchError, RsNotifyError
from ..model import Entry
from ..publisher.watcher import CollectionWatcher
from ..tracker import Checkpoint
from . import events as ev
from .applier import Applier, Outcome
from .cursor import Cursor, CursorStore
from .gaps import Gap, GapDetector, Verdict

log = logging.getLogger("rsnotify.subscribe")

QUEUE_SIZE = 100_000
CATCH_UP_PASSES = 3  # reads of the Change Lists per catch-up (see _walk_change_lists)
SAVE_INTERVAL = 1.0  # seconds between cursor writes while changes keep coming
CATCH_UP_ATTEMPTS = 5  # reads of the Change Lists before a catch-up gives up


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[Outcome] | None  # None: nothing to apply, only a position
    seq: int | None
    checkpoint: Checkpoint | None
    notification: Notification | None = None


@dataclass(slots=True)
class SyncStats:
    applied: int = 0
    skipped: int = 0
    failed: int = 0
    duplicates: int = 0
    gaps: int = 0
    catchups: int = 0
    last_gap: dict[str, Any] = field(default_factory=dict)
    state: str = "starting"  # starting, baseline, catching-up, live


def _entry_of(n: Notification) -> Entry:
    return Entry(loc=n.loc, change=n.change, datetime=n.datetime)


class CollectionSync:
    """Keeps one collection of the mirror in step with the Source."""

    def __init__(
        self,
        *,
        collection: str,
        capability_list: str,
        watcher: CollectionWatcher,
        applier: Applier,
        cursors: CursorStore,
        detector: GapDetector,
        keys: Mapping[str, bytes] | None = None,
        replay: Callable[[int | None], Awaitable[int]] | None = None,
        on_applied: Callable[[Notification, float, float], None] | None = None,
        on_event: Callable[[str, str, dict[str, Any]], None] | None = None,
        resourcelist_url: str | None = None,
        resourcedump_url: str | None = None,
        tick: float = 0.5,
    ) -> None:
        self.collection = collection
        self.capability_list = capability_list
        self.watcher = watcher
        self.applier = applier
        self.cursors = cursors
        self.detector = detector
        self.keys = keys
        self.replay = replay  # ask the channel to resend from a seq (WebSocket `since`)
        self.on_applied = on_applied
        self.on_event = on_event
        self.tick = tick
        self.resourcelist_url = resourcelist_url
        self.resourcedump_url = resourcedump_url
        self.queue: asyncio.Queue[ev.Event] = asyncio.Queue(QUEUE_SIZE)
        self.stats = SyncStats()
        self._pending: deque[_Pending] = deque()
        self._wake = asyncio.Event()
        self._committer: asyncio.Task[None] | None = None
        self._buffer: list[Notification] = []
        self._replay_refused = False
        self._generation = 0
        # Durable (applied) frontier, and the frontier of what was submitted.
        self.applied_seq: int | None = None
        self.applied = Checkpoint()
        self._submitted = Checkpoint()
        self.baseline_done = False
        self.idle = asyncio.Event()
        self.failure: Exception | None = None

    # -- channel side ---------------------------------------------------------------

    def offer(self, event: ev.Event) -> None:
        """Called by channels (on the loop thread); never blocks."""
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            with contextlib.suppress(asyncio.QueueFull):
                self.queue.get_nowait()
                self.queue.put_nowait(ev.Overflow())

    # -- cursor -----------------------------------------------------------------------

    async def load(self) -> Cursor | None:
        cursor = await self.cursors.get(self.collection)
        if cursor is not None:
            self.applied_seq = cursor.last_seq
            self.applied = self._submitted = cursor.checkpoint
            self.baseline_done = cursor.baseline_done
            self.detector.caught_up(cursor.last_seq, now=time.monotonic())
        return cursor

    async def save(self) -> None:
        await self.cursors.put(
            Cursor(
                collection=self.collection,
                capabilitylist=self.capability_list,
                last_seq=self.applied_seq,
                checkpoint=self.applied,
                baseline_done=self.baseline_done,
            )
        )

    # -- the ordered pipeline ------------------------------------------------------------

    def _submit(
        self,
        change: Any,
        entry: Entry,
        changelist: str | None,
        seq: int | None,
        notification: Notification | None = None,
    ) -> None:
        """Apply ``change`` unless the submitted frontier already covers it."""
        if not self._submitted.is_new(entry):
            self.stats.skipped += 1
            self._pending.append(_Pending(None, seq, None))
        else:
            self._submitted = self._submitted.advance(entry, changelist or "")
            future = self.applier.submit(change)
            self._pending.append(_Pending(future, seq, self._submitted, notification))
        self._wake.set()

    async def _commit_loop(self) -> None:
        """Run :meth:`_commit_batches`; a cursor that cannot be written stops the pipeline.

        Without this, a failing save (disk full) ended the task silently and
        :meth:`drain` waited for it forever: the engine hung instead of
        restarting from its durable cursor (found by the chaos matrix).
        """
        try:
            await self._commit_batches()
        except Exception as exc:
            self.failure = exc
            log.error("%s: cannot save the cursor: %s", self.collection, exc)
        finally:
            self.idle.set()  # whatever ended this loop, drain() must look again

    async def _commit_batches(self) -> None:
        """Advance the durable cursor over the applied prefix, writing it in batches.

        A batch ends when the pipeline is empty or :data:`SAVE_INTERVAL` has
        passed: under steady load, or during a long catch-up, the pipeline is
        never empty, and a crash would then re-apply everything since the
        process started.
        """
        while True:
            await self._wake.wait()
            self._wake.clear()
            moved = False
            saved = time.monotonic()
            while self._pending:
                if moved and time.monotonic() - saved >= SAVE_INTERVAL:
                    await self.save()
                    saved = time.monotonic()
                    moved = False
                item = self._pending[0]
                if item.future is not None:
                    try:
                        outcome = await item.future
                    except Exception as exc:  # a local failure: disk full, store unusable
                        self.failure = exc
                        self.idle.set()
                        log.error("%s: cannot apply changes: %s", self.collection, exc)
                        return
                    except asyncio.CancelledError:
                        task = asyncio.current_task()
                        if task is not None and task.cancelling():
                            raise  # this loop is being stopped
                        # The change was cancelled under us: nothing will ever
                        # apply it, so the cursor must not pass it.  Stop the
                        # pipeline like a local failure (the engine restarts
                        # from its cursor) rather than end this task silently
                        # and leave drain() waiting for it.
                        self.failure = RsNotifyError(
                            f"{self.collection}: a change was cancelled before it was applied"
                        )
                        self.idle.set()
                        log.error("%s", self.failure)
                        return
                    self._count(outcome, item.notification)
                self._pending.popleft()
                if item.seq is not None:
                    self.applied_seq = max(self.applied_seq or 0, item.seq)
                if item.checkpoint is not None:
                    self.applied = item.checkpoint
                moved = True
            if moved:
                await self.save()
            if not self._pending:
                self.idle.set()

    def _count(self, outcome: Outcome, notification: Notification | None) -> None:
        if outcome.done:
            if outcome is Outcome.SKIPPED_ALREADY_APPLIED:
                self.stats.skipped += 1
            else:
                self.stats.applied += 1
                if notification is not None and self.on_applied is not None:
                    self.on_applied(notification, notification_received(notification), time.time())
        else:
            self.stats.failed += 1

    async def drain(self) -> None:
        """Wait until everything submitted is applied and the cursor written.

        Raises the local failure (disk full, unusable store) that stopped the
        pipeline: the caller restarts the engine from the durable cursor.
        """
        while self._pending and self.failure is None:
            if self._committer is None or self._committer.done():
                # Nothing would ever empty the pipeline: say so, never wait forever.
                raise RsNotifyError(f"{self.collection}: the apply pipeline is not running")
            self.idle.clear()
            self._wake.set()
            await self.idle.wait()
        if self.failure is not None:
            raise self.failure
        await self.save()

    # -- catch-up ---------------------------------------------------------------------

    async def _walk_change_lists(self, *, wait: bool = True) -> int:
        """Apply every Change List entry after the cursor; returns how many were new.

        One pass reads every list to its current end, which is all a catch-up
        owes: changes made while the pass is applied arrive as notifications
        (the channel subscribed before the catch-up began) or are found by the
        next gap or safety poll.  A few more passes shorten what the queue must
        carry, but the walk stops after :data:`CATCH_UP_PASSES`: "until a pass
        finds nothing" never ends under a Source that changes faster than a
        pass takes, and ``--once`` would never return.  Passes are submitted
        back to back and drained once at the end (if ``wait``): a change whose
        resource has moved on fails its fixity check until the newer change is
        queued behind it (then it is superseded at once), so draining between
        passes would make every pass wait out that change's retries.
        """
        backoff = Backoff(maximum=10.0)
        applied = 0
        while True:
            try:
                self.watcher.reset(self._submitted)
                for _ in range(CATCH_UP_PASSES):
                    result = await self.watcher.poll()
                    if not result.count:
                        break
                    for found in result.detections:
                        for entry in found.entries:
                            self._submit(entry, entry, found.changelist, None)
                            applied += 1
                    self.watcher.commit(result.checkpoint)
                if wait:
                    await self.drain()
                return applied
            except (FetchError, DocumentError) as exc:
                if backoff.attempts + 1 >= CATCH_UP_ATTEMPTS:
                    # Not forever: ``--once`` must end with the reason, and a live
                    # engine is restarted from its cursor by the service, with a
                    # longer backoff and the error in the log.
                    raise
                delay = backoff.next()
                log.warning(
                    "%s: catch-up from the Change List Index failed (%s); retrying in %.1fs",
                    self.collection,
                    exc,
                    delay,
                    extra={"collection": self.collection},
                )
                await asyncio.sleep(delay)

    async def catch_up(self, gap: Gap, *, wait: bool = True) -> None:
        """Resolve a gap: replay from the log if the channel can, else walk the Change Lists.

        With ``wait=False`` (a gap found while live) a walk returns as soon as
        what it found is submitted: the pipeline applies it in order while the
        engine goes on consuming notifications, whose newer changes supersede
        the entries the Source has moved past.  Waiting instead would stall
        push for as long as such an entry retries its fixity check.
        """
        started = time.monotonic()
        self.stats.gaps += 1
        self.stats.state = "catching-up"
        self._event("gap", gap.reason, {"size": gap.size, "first": gap.first_missing})
        replayable = (
            self.replay is not None
            and not self._replay_refused
            and gap.reason != "safety poll"
            and not gap.reason.startswith("no heartbeat")
        )
        if replayable or wait:
            await self.drain()  # a replay starts after what is applied
        if replayable and self.replay is not None and self.applied_seq is not None:
            # The log may still hold the range: ask for it; the replay arrives as messages.
            self._buffer.clear()
            self.detector.caught_up(self.applied_seq, now=time.monotonic())
            self._generation = await self.replay(self.applied_seq)
            self.stats.state = "live"
            self._event("replay", f"from seq {self.applied_seq + 1}", {})
            return
        applied = await self._walk_change_lists(wait=wait)
        self._replay_refused = False
        last_seq: int | None = None
        for n in sorted(self._buffer, key=lambda n: (n.seq or 0, n.datetime)):
            self._submit(n, _entry_of(n), n.changelist, n.seq, n)
            last_seq = n.seq if n.seq is not None else last_seq
        self._buffer.clear()
        if wait:
            await self.drain()
        self.detector.caught_up(last_seq, now=time.monotonic())
        self.stats.catchups += 1
        duration = time.monotonic() - started
        self.stats.last_gap = {
            "reason": gap.reason,
            "size": gap.size,
            "applied": applied,
            "duration_s": round(duration, 3),
            "at": time.time(),
        }
        self.stats.state = "live"
        self._event(
            "catch-up",
            f"{applied} change(s) from the Change List Index in {duration:.2f}s",
            self.stats.last_gap,
        )

    def _event(self, kind: str, detail: str, data: dict[str, Any]) -> None:
        log.info("%s: %s: %s", self.collection, kind, detail, extra={"collection": self.collection})
        if self.on_event is not None:
            self.on_event(kind, detail, data)

    # -- live ---------------------------------------------------------------------------

    def _decode(self, message: ev.Message) -> Notification:
        notification = envelope.decode(message.payload)
        if self.keys is not None:
            envelope.verify(message.payload, message.signature, self.keys)
        if notification.collection != self.collection:
            raise InvalidNotification(
                f"notification for {notification.collection!r} on {self.collection!r}'s channel"
            )
        notification.received = message.received
        return notification

    def _on_message(self, message: ev.Message) -> Gap | None:
        if message.generation < self._generation:
            self.stats.duplicates += 1  # from a connection a replay replaced
            return None
        try:
            batch = self._decode_batch(message)
        except InvalidNotification as exc:
            return self.detector.on_invalid(str(exc))
        if not batch.sequenced:
            return self._on_interval(batch)
        found: Gap | None = None
        for n in batch.changes:
            assert n.seq is not None
            if found is not None:  # after a gap the rest waits for the catch-up
                self._buffer.append(n)
                continue
            verdict, gap = self.detector.on_notification(n.seq, message.prev)
            if verdict is Verdict.DUPLICATE:
                self.stats.duplicates += 1
            elif verdict is Verdict.GAP:
                self._buffer.append(n)
                found = gap
            else:
                self._submit(n, _entry_of(n), n.changelist, n.seq, n)
        return found

    def _on_interval(self, batch: envelope.ChangeNotification) -> Gap | None:
        """A Change Notification without sequence numbers: the interval chain decides."""
        verdict, gap = self.detector.on_interval(batch.from_, batch.until)
        for n in batch.changes:
            if verdict is Verdict.GAP:
                self._buffer.append(n)  # applied after the catch-up's walk
            else:
                self._submit(n, _entry_of(n), n.changelist, None, n)
        return gap

    def _decode_batch(self, message: ev.Message) -> envelope.ChangeNotification:
        """Decode a payload of one or more changes (a standard one may name no collection)."""
        batch = envelope.decode_batch(message.payload, collection=self.collection)
        if self.keys is not None:
            envelope.verify(message.payload, message.signature, self.keys)
        for n in batch.changes:
            n.received = message.received
        return batch

    def _on_event(self, event: ev.Event, now: float) -> Gap | None:
        if isinstance(event, ev.Message):
            return self._on_message(event)
        if isinstance(event, ev.Head):
            return self.detector.on_head(event.head, now=now)
        if isinstance(event, ev.Connected):
            self._event("connected", f"session present: {event.session_present}", {})
            return self.detector.on_connect(session_present=event.session_present, now=now)
        if isinstance(event, ev.Skipped):
            return self.detector.on_skipped(event.first, event.resume)
        if isinstance(event, ev.TooOld):
            self._replay_refused = True  # the next catch-up walks the Change Lists
            return Gap(f"log no longer holds seq {event.since + 1} (earliest {event.earliest})")
        if isinstance(event, ev.Invalid):
            return self.detector.on_invalid(event.reason)
        if isinstance(event, ev.Overflow):
            return Gap("event queue overflow")
        if isinstance(event, ev.Disconnected):
            self._event("disconnected", event.reason, {})
        return None

    async def start(self, baseline: Callable[[], Any] | None) -> None:
        """Load the cursor, baseline if this is the first run, catch up, then go live."""
        if self._committer is not None:  # a restart: one committer per engine, never two
            self._committer.cancel()
            await asyncio.wait({self._committer})  # its outcome is moot; ours still propagates
        self._pending.clear()
        self.failure = None
        self._committer = asyncio.create_task(self._commit_loop())
        cursor = await self.load()
        if cursor is None or not cursor.baseline_done:
            if baseline is not None:
                self.stats.state = "baseline"
                at = await baseline()
                self.applied = self._submitted = Checkpoint(last_time=at, started=True)
            else:
                self.applied = self._submitted = Checkpoint(started=True)
            self.baseline_done = True
            await self.save()
        await self.catch_up(Gap("start-up"))

    async def run(self) -> None:
        """Consume channel events until cancelled."""
        while True:
            event: ev.Event | None = None
            if not self.queue.empty():
                event = self.queue.get_nowait()  # busy: no timer per event
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.tick):
                        event = await self.queue.get()
            now = time.monotonic()
            gap = self._on_event(event, now) if event is not None else None
            gap = gap or self.detector.tick(now)
            if self.failure is not None:
                raise self.failure
            if gap is not None:
                await self.catch_up(gap, wait=False)

    async def once(self) -> None:
        """Catch up to the Source's current state and stop (``--once``)."""
        await self.catch_up(Gap("once"))

    async def close(self) -> None:
        try:
            await self.drain()
            drained = True
        except Exception:
            drained = False
        if not drained or self.failure is not None:
            # Stopped by a local failure with changes still in flight: stop
            # them before anyone restarts from the cursor and resubmits them.
            # Only this engine's: the applier is shared by every collection.
            await self.applier.abandon([p.future for p in self._pending if p.future is not None])
        if self._committer is not None:
            self._committer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._committer


def notification_received(n: Notification) -> float:
    return n.received or time.time()
