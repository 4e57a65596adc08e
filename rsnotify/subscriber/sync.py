"""The sync engine for one collection: baseline, live apply, gaps, catch-up.

Invariants, in the order the engine protects them:

1. **Nothing lost.**  The channel subscribes *before* the engine catches up
   (the service waits for it, briefly), so every notification published
   after the catch-up's read of the Change Lists is received, and everything
   before it is in the Change Lists.  A subscription established later (a
   slow broker, a reconnection without a session) is itself a gap.  Any
   doubt (a sequence jump, a silent publisher, a bad payload, the safety
   timer) triggers a catch-up from the Change List Index, which always works.
2. **Nothing applied twice, nothing stale.**  The cursor is a tracker
   checkpoint (change time plus identities at that time) and advances only
   over changes that were applied, in order; notifications already covered by
   it are dropped; the applier itself refuses a change older than what a file
   already holds.
3. **Push never moves what the Destination trusts** (:mod:`.trust`).  The
   cursor's Change List position advances only over entries read from the
   Source's own Change Lists; a pushed notification is a hint that makes the
   applier fetch from the Source now.  So a forged, buggy or future-dated
   notification costs at most a fetch or a catch-up, and the next walk of the
   Change Lists starts where the Source itself last vouched for.  Unsigned
   notifications are also checked against what was received under their
   sequence number, and every doubt they raise (refused, unconfirmed,
   conflicting) is settled by a walk of the Change Lists, rate-limited.
4. **Durable.**  The cursor is written after the changes it covers are on
   disk, so a crash re-applies a few changes (no-ops) and skips none.

Changes of one resource are applied in order, different resources
concurrently (the applier's per-URI chains); the cursor follows the longest
applied prefix.  At most :data:`MAX_IN_FLIGHT` changes are in that pipeline:
past it the engine stops taking notifications from its queue until the
pipeline drains (back-pressure; a queue that then overflows is a gap).

Why one module of ~1,100 lines: it is one state machine per collection, and
every event (a notification, a head, a reconnect, a timer, a hole in the
Change Lists) reads and moves the same few positions (the trusted Change List
position, the submitted frontier, the sequence count, the push mode).  The
pure decisions it delegates live beside it: :mod:`.gaps` (sequence and
interval gaps), :mod:`.trust` (what push may move), :mod:`.pushhealth` (push
or poll), :mod:`.rules` (what to do with one change), :mod:`.changedump`
(a catch-up's bytes from the Source's Change Dump packages).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import operator
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from .. import envelope, framework
from ..backoff import Backoff
from ..changes.watcher import ChangeWatcher, CoverageHole
from ..envelope import InvalidNotification, Notification
from ..errors import DocumentError, FetchError, RsNotifyError
from ..model import ChangeType, Entry, sort_chronologically
from ..tracker import Checkpoint, Detection, Known
from ..w3cdt import format as format_datetime
from . import changedump
from . import events as ev
from .applier import RECORD_BATCH, SETTLE_SLICE, Applier, Outcome
from .cursor import Cursor, Cursors
from .gaps import Gap, GapDetector, Verdict
from .pushhealth import DEFAULT_GRACE, DEFAULT_INTERVAL, PushHealth, Transition
from .rules import ChangeView
from .trust import DEFAULT_DOUBT_INTERVAL, DEFAULT_MAX_SKEW, DoubtLimiter, SeqMemory, beyond_skew

log = logging.getLogger("rsnotify.subscribe")

# Events waiting for the engine, per collection.  The queue only fills while
# the pipeline is at MAX_IN_FLIGHT, and a queued notification costs about
# 600 bytes: 100,000 let a subscriber behind its Source hold 60 MB more per
# collection (issue 22's soak).  10,000 is 20 s of a 500/s Source; past it
# the engine catches up from the Change Lists, which it must be able to do
# anyway.
QUEUE_SIZE = 10_000
# Changes submitted and not yet passed by the cursor, per collection.  Without
# a cap a subscriber slower than its Source (a loaded host, a slow disk) took
# every notification at once and held it as a task: the 500 changes/s soak
# had 67,000 in flight in its two collections after 4 minutes and its RSS
# never stopped growing (issue 22).  Each costs about 1.2 KB (a task, its coroutine, the
# notification, a pipeline slot), so the cap holds the pipeline near 12 MB;
# 10,000 is still 40 s of a 250/s collection, far more than the fetch
# concurrency can use, so a subscriber that keeps up never meets it.
MAX_IN_FLIGHT = 10_000
_TICK = timedelta(microseconds=1)
CATCH_UP_PASSES = 3  # reads of the Change Lists per catch-up (see _walk_change_lists)
SAVE_INTERVAL = 1.0  # seconds between cursor writes while changes keep coming
COMMIT_SLICE = 100  # pipeline items the cursor passes between two looks at the loop
CATCH_UP_ATTEMPTS = 5  # reads of the Change Lists before a catch-up gives up
# Push never moves the position (see .trust): a quiet walk follows it this often,
# so a restart re-reads at most this much and provisional states get confirmed.
CONFIRM_AFTER_CHANGES = 1_000
CONFIRM_AFTER_SECONDS = 30.0
# A walk runs beside push (see CollectionSync.run) only while the engine keeps up
# with its Source: fewer changes than this in the pipeline.  Behind it (bench.e2e
# at 1,000/s on a loaded machine), a walk beside push found the changes push had
# not reached yet, both submitted them, and the lag grew (p50 6.1-6.4 s -> 9.7-10.3
# s, two alternating runs); inline, push waits and the walk's own changes go first.
BESIDE_PUSH_IN_FLIGHT = 256


@dataclass(slots=True)
class _Pending:
    # None: nothing to apply, only a position; with ``many``, a future of a list of outcomes.
    future: asyncio.Future[Outcome] | asyncio.Future[list[Outcome]] | None
    seq: int | None
    checkpoint: Checkpoint | None  # None: a pushed change (it never moves the position)
    notification: Notification | None = None
    confirmed: bool = True  # False: pushed unsigned (its failure is a doubt)
    many: bool = False  # the future holds a list of outcomes (Applier.submit_many)
    done_at: float | None = None  # when the future finished (a pushed change: see _stamp_done)


def _stamp_done(item: _Pending, _: object) -> None:
    """Note when a pushed change's outcome came: its applied time for the telemetry.

    The outcome is counted later, when the cursor passes the change (in
    pipeline order); stamped then, a change applied at once behind one that
    waited for its Source was reported as late as that one (seconds at
    1,000 changes/s).
    """
    item.done_at = time.time()


@dataclass(slots=True)
class SyncStats:
    applied: int = 0
    skipped: int = 0
    failed: int = 0
    duplicates: int = 0
    gaps: int = 0
    catchups: int = 0
    refused: int = 0  # pushed notifications refused (future-dated) or not confirmed
    rebaselines: int = 0  # new baselines taken because the Change Lists left a hole
    polls: int = 0  # walks of the Change Lists made because push was down (degraded mode)
    confirm_walks: int = 0  # quiet walks behind push, moving the position over what it applied
    mode: str = "push"  # push, or polling while the push channel is down
    mode_reason: str = ""  # why (the channel's last word)
    doubts: int = 0  # untrusted input that disagreed with the Source (each settled by a walk)
    dump_packages: int = 0  # Change Dump packages downloaded by catch-ups
    dump_bodies: int = 0  # changes whose bytes came from them (see .changedump)
    last_gap: dict[str, Any] = field(default_factory=dict)
    state: str = "starting"  # starting, subscribing, baseline, catching-up, live


@dataclass(slots=True)
class _Found:
    """The entries of one Change List read by a walk, and which need no work."""

    changelist: str
    unordered: bool
    entries: list[Entry]
    settled: list[bool]
    superseded: list[bool] = field(default_factory=list)  # by a later entry of the walk
    # The position after each entry, as the watcher computed it from the engine's
    # own position (see same_position); None: the engine works it out entry by entry.
    checkpoints: Sequence[Checkpoint] | None = None
    views: list[ChangeView] = field(default_factory=list)  # each entry read once


def _entry_of(n: Notification) -> Entry:
    return Entry(loc=n.loc, change=n.change, datetime=n.datetime)


def same_position(a: Checkpoint, b: Checkpoint) -> bool:
    """``a`` and ``b`` have consumed the same entries (validators aside).

    The watcher's position at the start of a pass and the engine's submitted
    position: when they agree, the checkpoint the watcher computed after each
    entry it found is the one the engine would compute (the same
    :meth:`Checkpoint.advance` from the same start), so the engine takes it
    instead of digesting every entry again.
    """
    if a is b:
        return True
    return (
        a.changelist == b.changelist
        and a.last_time == b.last_time
        and a.boundary == b.boundary
        and a.position == b.position
        and a.started == b.started
        and (a.known is b.known or a.known == b.known)
        and a.snapshot == b.snapshot
    )


class CollectionSync:
    """Keeps one collection of the mirror in step with the Source."""

    def __init__(
        self,
        *,
        collection: str,
        capability_list: str,
        watcher: ChangeWatcher,
        applier: Applier,
        cursors: Cursors,
        detector: GapDetector,
        keys: Mapping[str, bytes] | None = None,
        replay: Callable[[int | None], Awaitable[int]] | None = None,
        on_applied: Callable[[Notification, float, float], None] | None = None,
        on_event: Callable[[str, str, dict[str, Any]], None] | None = None,
        resourcelist_url: str | None = None,
        resourcedump_url: str | None = None,
        changedump_url: str | None = None,
        workdir: Path | None = None,
        tick: float = 0.5,
        max_skew: float = DEFAULT_MAX_SKEW,
        max_in_flight: int = MAX_IN_FLIGHT,
        queue_size: int = QUEUE_SIZE,
        doubt_interval: float = DEFAULT_DOUBT_INTERVAL,
        degraded_after: float = DEFAULT_GRACE,
        degraded_poll: float = DEFAULT_INTERVAL,
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
        self.max_skew = max_skew
        self.max_in_flight = max_in_flight
        # Signed and verified notifications were read from the Change List by
        # the publisher; anything else is a hint (see .trust).
        self.trusted_push = keys is not None
        self._seqs = SeqMemory()
        self._decoded = False  # the last message was readable
        self._pushed_since_walk = 0  # pushed changes the position has not caught up with
        self._last_walk = time.monotonic()
        self._following: asyncio.Task[None] | None = None  # a quiet walk behind push (see run)
        # Push or poll (see .pushhealth): polls the Change Lists while push is down.
        self.health = PushHealth(grace=degraded_after, interval=degraded_poll, now=time.monotonic())
        self._doubts = DoubtLimiter(doubt_interval)
        self._watcher_synced = False  # the watcher's position is the cursor's (no reset)
        self._baseline: Callable[[], Any] | None = None  # kept for re-baselines
        self.incomplete = False  # a hole no baseline could close: --once exits 1
        # Only collection of its subscriber: states written before collections were
        # recorded are this one's (a re-baseline may delete them).
        self.sole_collection = False
        self.resourcelist_url = resourcelist_url
        self.resourcedump_url = resourcedump_url
        self.changedump_url = changedump_url  # catch-ups take bytes from it (.changedump)
        self.workdir = workdir or Path(tempfile.gettempdir())  # where packages are downloaded
        self.queue: asyncio.Queue[ev.Event] = asyncio.Queue(queue_size)
        self._overflowed = False  # an Overflow is queued: drop events until it is read
        self.stats = SyncStats()
        self._pending: deque[_Pending] = deque()
        self._wake = asyncio.Event()
        self._room = asyncio.Event()  # set when the pipeline is below max_in_flight
        self._committer: asyncio.Task[None] | None = None
        self._buffer: list[Notification] = []
        self._replay_refused = False
        self._generation = 0
        # Durable (applied) frontier, and the frontier of what was submitted.
        self.applied_seq: int | None = None
        self.applied = Checkpoint()
        self._submitted = Checkpoint()
        self._durable = Checkpoint()  # the saved cursor's (a restart goes on from it)
        # Recorded-only changes of a walk not handed to the applier yet, and the
        # position after the last of them (see _hold).
        self._held: tuple[list[ChangeView], list[Entry]] = ([], [])
        self._held_at: Checkpoint | None = None
        self.baseline_done = False
        self.idle = asyncio.Event()
        self.failure: Exception | None = None
        # Framework Notification (rsnotify.framework): where the Change List position
        # stood before the latest walk, and whether a framework notification about
        # the Change Lists should make one (set when no change channel is followed).
        self._away_from: datetime | None = None
        self.framework_polls = False

    # -- channel side ---------------------------------------------------------------

    def offer(self, event: ev.Event) -> None:
        """Called by channels (on the loop thread); never blocks.

        A full queue drops its oldest event for one :class:`~.events.Overflow`
        marker; until the engine reads that marker, whatever finds the queue
        full is dropped.  The catch-up the marker makes reads the Change
        Lists after every dropped event was published, so one marker covers
        them all (a marker per dropped event made a catch-up per event).
        """
        if self._overflowed and self.queue.full():
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            with contextlib.suppress(asyncio.QueueFull):
                self.queue.get_nowait()
                self.queue.put_nowait(ev.Overflow())
                self._overflowed = True

    # -- cursor -----------------------------------------------------------------------

    async def load(self) -> Cursor | None:
        cursor = await self.cursors.get(self.collection)
        self._watcher_synced = False
        if cursor is not None:
            checkpoint = cursor.checkpoint
            when = checkpoint.last_time
            if when is not None and beyond_skew(when, datetime.now(UTC), self.max_skew):
                # Written by a version that let push move the cursor, from a
                # forged or future-dated notification: every later change would
                # look old.  Read every Change List again; the resource states
                # make that cheap, and those dated in the future are provisional.
                log.warning(
                    "%s: the saved Change List position is dated %s, in the future: "
                    "reading every Change List again",
                    self.collection,
                    format_datetime(when),
                    extra={"collection": self.collection},
                )
                checkpoint = Checkpoint(started=True)
            self.applied_seq = cursor.last_seq
            self.applied = self._submitted = self._durable = checkpoint
            self.watcher.pin(checkpoint)
            self.baseline_done = cursor.baseline_done
            self.detector.caught_up(cursor.last_seq, now=time.monotonic())
        return cursor

    async def save(self) -> None:
        applied = self.applied
        # While the write is in flight, a restart may start from either.
        self.watcher.pin(self._durable, applied)
        await self.cursors.put(
            Cursor(
                collection=self.collection,
                capabilitylist=self.capability_list,
                last_seq=self.applied_seq,
                checkpoint=applied,
                baseline_done=self.baseline_done,
            )
        )
        self.watcher.pin(applied)
        self._durable = applied

    # -- the ordered pipeline ------------------------------------------------------------

    def _submit(
        self,
        entry: Entry,
        changelist: str,
        *,
        unordered: bool = False,
        settled: bool = False,
        superseded: bool = False,
        body: bytes | None = None,
        checkpoint: Checkpoint | None = None,
        view: ChangeView | None = None,
    ) -> None:
        """Apply a Change List entry read from the Source, moving the position over it.

        ``unordered``: its list was out of forward chronological order, so the
        applier asks the Source where a change time would otherwise decide.
        ``settled``: the mirror already holds exactly this change (push applied
        it): only the position moves (:meth:`Applier.settle_many`).
        ``superseded``: recorded as such already (:meth:`_supersede`): only
        the position moves, and it counts as applied, as the applier's
        superseded outcome does.  ``body``: its bytes from a Change Dump
        package (:meth:`_packaged`).  ``checkpoint``: the position after
        this entry, computed by the watcher from the engine's own position
        (:func:`same_position`); without it the engine works it out.
        ``view``: the entry already read (:meth:`Applier.read_many`).
        """
        self._release_held()  # in pipeline order
        if checkpoint is None and not self._submitted.is_new(entry):
            self.stats.skipped += 1
            self._pass_over(None)
        else:
            self._submitted = (
                checkpoint if checkpoint is not None else self._submitted.advance(entry, changelist)
            )
            if settled or superseded:
                if superseded:
                    self.stats.applied += 1
                else:
                    self.stats.skipped += 1
                self._pass_over(self._submitted)
            else:
                future = self.applier.submit(
                    entry, collection=self.collection, unordered=unordered, body=body, view=view
                )
                self._pending.append(_Pending(future, None, self._submitted))
        self._wake.set()

    def _pass_over(self, checkpoint: Checkpoint | None) -> None:
        """Queue a position with nothing to apply (an entry settled, superseded or skipped).

        Merged into the previous item when that one has nothing to apply
        either: the cursor passes both at once, with no await in between,
        so one item does what two did (a catch-up that supersedes 48,000
        of 50,000 changes queued an item for each).
        """
        self._release_held()  # in pipeline order
        pending = self._pending
        if pending:
            tail = pending[-1]
            if tail.future is None and tail.seq is None and tail.notification is None:
                if checkpoint is not None:
                    tail.checkpoint = checkpoint
                return
        pending.append(_Pending(None, None, checkpoint))

    def _submit_pushed(self, n: Notification) -> None:
        """Apply a pushed change as a hint: it never moves the Change List position."""
        if not self._submitted.is_new(_entry_of(n)):
            # The Change Lists read from the Source already covered it.
            self.stats.skipped += 1
            self._pending.append(_Pending(None, n.seq, None))
        else:
            self._pushed_since_walk += 1
            future = self.applier.submit(n, confirmed=self.trusted_push, collection=self.collection)
            pending = _Pending(future, n.seq, None, n, self.trusted_push)
            if self.on_applied is not None:
                future.add_done_callback(functools.partial(_stamp_done, pending))
            self._pending.append(pending)
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
            self._room.set()  # and nothing may wait for room it will never make

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
            passed = 0
            while self._pending:
                if moved and time.monotonic() - saved >= SAVE_INTERVAL:
                    await self.save()
                    saved = time.monotonic()
                    moved = False
                passed += 1
                if passed % COMMIT_SLICE == 0:
                    # Awaiting a future already done does not give the loop back:
                    # when a slow change at the head lets the hundreds behind it
                    # through at once, their counting and metrics were one step
                    # of ~20 ms that every notification arriving meanwhile waited for.
                    await asyncio.sleep(0)
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
                    if isinstance(outcome, list):  # item.many
                        self._count_many(outcome, item)
                    else:
                        self._count(outcome, item)
                self._pending.popleft()
                if len(self._pending) < self.max_in_flight:
                    self._room.set()
                if item.seq is not None:
                    # In pipeline order, not max(): after an unsigned channel's
                    # sequence was rewound (a forged jump), the genuine one rules.
                    self.applied_seq = item.seq
                if item.checkpoint is not None:
                    self.applied = item.checkpoint
                moved = True
            if moved:
                await self.save()
            if not self._pending:
                self.idle.set()

    def _count_many(self, outcomes: list[Outcome], item: _Pending) -> None:
        """:meth:`_count` of each of a batch's outcomes (no notification: a walk's).

        A recorded batch is 10,000 ``RECORDED``: counted by ``list.count`` (an
        identity test per item, in C) and added at once; one by one, each
        cost an enum hash for ``done``, 0.15 s of a 50,000-change catch-up.
        """
        recorded = outcomes.count(Outcome.RECORDED)
        self.stats.applied += recorded
        if recorded < len(outcomes):
            for outcome in outcomes:
                if outcome is not Outcome.RECORDED:
                    self._count(outcome, item)

    def _count(self, outcome: Outcome, item: _Pending) -> None:
        notification = item.notification
        if outcome.done:
            if outcome in (Outcome.SKIPPED_ALREADY_APPLIED, Outcome.CONFIRMED):
                self.stats.skipped += 1
            else:
                self.stats.applied += 1
                if notification is not None and self.on_applied is not None:
                    applied = item.done_at if item.done_at is not None else time.time()
                    self.on_applied(notification, notification_received(notification), applied)
        elif notification is not None and not item.confirmed:
            # A hint the Source does not bear out: forged, replayed, or overtaken
            # by a newer change.  Not a failure of the mirror: the walk this
            # triggers applies whatever the Source really holds.
            self.stats.refused += 1
            self._doubt(
                "unconfirmed",
                f"pushed {notification.change.value} of {notification.loc} (seq "
                f"{notification.seq}) not confirmed by the Source ({outcome})",
            )
        else:
            self.stats.failed += 1

    @property
    def in_flight(self) -> int:
        """Changes in the pipeline: submitted, not yet passed by the cursor."""
        return len(self._pending)

    async def _wait_for_room(self) -> None:
        """Back-pressure: return once fewer than ``max_in_flight`` changes are in the pipeline.

        Returns at once when there is room, and when the pipeline has stopped
        (a local failure: the caller raises it).  Nothing reads the channel's
        queue meanwhile, so the publisher's heartbeats wait there: the time
        spent here is not counted as the publisher's silence.
        """
        started = time.monotonic()
        while (
            len(self._pending) >= self.max_in_flight
            and self.failure is None
            and self._committer is not None
            and not self._committer.done()
        ):
            self._room.clear()
            await self._room.wait()
        self.detector.last_heartbeat += time.monotonic() - started

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

    async def _walk_change_lists(self, *, wait: bool = True, passes: int = CATCH_UP_PASSES) -> int:
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
        # Every state in memory if they fit (once per store): a walk reads thousands.
        await self.applier.resources.preload()
        self._pushed_since_walk = 0
        self._last_walk = time.monotonic()
        while True:
            try:
                if not self._watcher_synced:
                    # After a start or a failed read: from the cursor, reading
                    # lists whole.  Otherwise the watcher goes on from the end of
                    # the previous walk with conditional, ranged reads (pushed
                    # changes do not move the position, so walks follow walks).
                    self.watcher.reset(self._submitted)
                    self._watcher_synced = True
                # Recorded-only changes are recorded list by list, each while the
                # next is parsed; fetched ones wait for the whole pass, so that
                # every change a later one supersedes is known before any fetch.
                lists = 1 if self.applier.metadata_only else None
                try:
                    for _ in range(passes):
                        found_any, more = False, True
                        while more:
                            # Before the poll: the watcher's position when it starts reading.
                            aligned = same_position(self.watcher.checkpoint, self._submitted)
                            result = await self.watcher.poll(lists=lists)
                            more = result.more
                            if result.count:
                                found_any = True
                                applied += await self._submit_pass(result.detections, aligned)
                                self.watcher.commit(result.checkpoint)
                            elif (
                                result.checkpoint.snapshot is not None
                                and result.checkpoint != self.watcher.checkpoint
                            ):
                                # Nothing to apply, a new position all the same (a Resource
                                # List snapshot recorded): the cursor passes over it.
                                self._submitted = result.checkpoint
                                self._pass_over(result.checkpoint)
                                self._wake.set()
                                self.watcher.commit(result.checkpoint)
                            if more:
                                await asyncio.sleep(0)  # the recorder takes what was queued
                        self._release_held()  # the pass is read: what is held goes now
                        if not found_any:
                            break
                finally:
                    # Whatever ended the walk, what it held enters the pipeline now:
                    # before anything a retry or a new baseline queues, whose
                    # positions its own must not follow (the cursor would go back).
                    self._release_held()
                if wait:
                    await self.drain()
                return applied
            except CoverageHole as exc:
                self._watcher_synced = False
                await self._rebaseline(str(exc))
            except (FetchError, DocumentError) as exc:
                self._watcher_synced = False
                if backoff.attempts + 1 >= CATCH_UP_ATTEMPTS:
                    # Not forever: ``--once`` must end with the reason, and a live
                    # engine is restarted from its cursor by the service, with a
                    # longer backoff and the error in the log.
                    raise
                delay = backoff.next()
                log.warning(
                    "%s: catch-up from %s failed (%s); retrying in %.1fs",
                    self.collection,
                    self.watcher.walks,
                    exc,
                    delay,
                    extra={"collection": self.collection},
                )
                await asyncio.sleep(delay)

    async def _submit_pass(self, detections: list[Detection], aligned: bool) -> int:
        """Submit what one poll found, in order; returns how many need work.

        ``aligned``: the watcher started from the engine's own position
        (:func:`same_position`), so its checkpoints are the engine's.
        """
        batch: list[_Found] = []
        for found in detections:
            # In change-time order (stable): a list read out of order
            # (--lenient order, the default here) is applied as if the
            # Source had written it in order; the reader warned once.
            unordered = found.changelist in self.watcher.unordered_lists
            entries = sort_chronologically(found.entries)
            in_order = all(map(operator.is_, entries, found.entries))
            # The watcher's positions hold only for the order it read in.
            checkpoints = found.checkpoints if aligned and in_order else None
            aligned = aligned and in_order
            views: list[ChangeView] = []
            for start in range(0, len(entries), SETTLE_SLICE):  # a look at the loop between
                if start:
                    await asyncio.sleep(0)
                views += self.applier.read_many(
                    entries[start : start + SETTLE_SLICE],
                    collection=self.collection,
                    unordered=unordered,
                )
            if len(entries) > SETTLE_SLICE:
                await asyncio.sleep(0)  # the last slice read is not the states' step too
            settled = await self.applier.settle_many(entries, views=views)
            batch.append(
                _Found(found.changelist, unordered, entries, settled,
                       checkpoints=checkpoints, views=views)
            )  # fmt: skip
        if len(self._pending) >= self.max_in_flight:
            # Before the batch, not inside it: all of it is queued
            # before any of it runs (superseding), so a walk may
            # pass the cap by one batch.
            await self._wait_for_room()
        doomed = self._supersede(batch)
        if doomed:
            # Recorded while the packages download and the fetches run, not
            # before they start (48,000 rows of a 50,000-change catch-up took
            # most of a second): the cursor waits for it like for a change, so
            # it never passes an entry whose row is not durable.
            recording = asyncio.ensure_future(self._record_superseded(doomed))
            self._pending.append(_Pending(recording, None, None, many=True))
        bodies = await self._packaged(batch)
        applied = 0
        for item in batch:  # no await: all queued before any runs (superseding)
            applied += self._submit_found(item, bodies)
        return applied

    async def _record_superseded(self, doomed: list[ChangeView]) -> list[Outcome]:
        """:meth:`Applier.supersede_many`, as a pipeline item (no outcome of its own to count)."""
        await self.applier.supersede_many(doomed)
        return []

    def _submit_found(self, item: _Found, bodies: Mapping[changedump.Key, bytes]) -> int:
        """Submit one list's entries of a walk, in order; returns how many need work.

        Recorded-only changes (``--metadata-only``) at the watcher's positions
        go to the applier's batch recorder a chunk at a time, one pipeline item
        per chunk whose position is the one after its last entry: the cursor
        passes a chunk only once all of it is durable, as it would pass its
        entries one by one.
        """
        applied = 0
        entries, checkpoints = item.entries, item.checkpoints
        if checkpoints is not None and self.applier.metadata_only:
            start = 0
            while start < len(entries):
                end = min(start + RECORD_BATCH - len(self._held[0]), len(entries))
                views = item.views[start:end]
                if not all(map(self.applier.recordable, views)):
                    break  # the rest entry by entry (an unconfirmed deletion asks the Source)
                self._submitted = checkpoints[end - 1]
                self._hold(views, entries[start:end], self._submitted)
                applied += end - start
                start = end
            first = start
        else:
            first = 0
        settled, i = item.settled, first
        while i < len(entries):
            if checkpoints is not None and settled[i]:
                # A run of entries push applied (a walk following push is mostly
                # that): the position passes them at once, as it would one by
                # one (_pass_over merges them), without a position made for each.
                end = i + 1
                while end < len(entries) and settled[end]:
                    end += 1
                self._release_held()  # in pipeline order
                self._submitted = checkpoints[end - 1]
                self.stats.skipped += end - i
                self._pass_over(self._submitted)
                i = end
                continue
            entry, done = entries[i], settled[i]
            key = changedump.key_of(entry) if bodies else None
            self._submit(
                entry, item.changelist, unordered=item.unordered, settled=done,
                superseded=item.superseded[i], body=bodies.get(key) if key is not None else None,
                checkpoint=checkpoints[i] if checkpoints is not None else None,
                view=item.views[i] if item.views else None,
            )  # fmt: skip
            applied += 0 if done else 1
            i += 1
        self._wake.set()
        return applied

    def _hold(self, views: list[ChangeView], entries: list[Entry], after: Checkpoint) -> None:
        """Keep recorded-only changes of a walk until :data:`RECORD_BATCH` of them are read.

        Then (or at the end of the pass, or before anything else enters the
        pipeline: :meth:`_release_held`) they go to the batch recorder as one
        group, one transaction, with one pipeline item whose position is
        ``after`` the last of them.  Handed over list by list (1,000 entries
        in a simulator's list), the first transactions were of one list each:
        each transaction rewrites every page its rows touch in the write-ahead
        log (then all over the apply log's index by loc, since dropped: see
        :mod:`.resources`), and 50,000 rows in transactions of 1,000 cost the
        store's thread 0.78 s of CPU, of 10,000 0.50 s.
        """
        held_views, held_entries = self._held
        held_views += views
        held_entries += entries
        self._held_at = after
        if len(held_views) >= RECORD_BATCH:
            self._release_held()

    def _release_held(self) -> None:
        """Hand what :meth:`_hold` keeps to the batch recorder, in pipeline order."""
        views, entries = self._held
        if not views:
            return
        self._held = ([], [])
        future = self.applier.submit_many(views, entries)
        self._pending.append(_Pending(future, None, self._held_at, many=True))
        self._wake.set()

    def _supersede(self, batch: list[_Found]) -> list[ChangeView]:
        """Mark the walk's changes that a later one of the walk supersedes.

        A created/updated change the applier would record as superseded
        anyway (the later change is queued behind it,
        :meth:`Applier._newer_queued`); a deletion too: the later change,
        listed by the Source in the same walk, decides what the mirror holds
        (it writes the file or deletes it), so the unlink before it is wasted
        work (2,544 of the 9,924 deletions of a 50,000-change catch-up in
        bench.e2e).  Recorded in one transaction
        (:meth:`Applier.supersede_many`, by the caller, which gets them back),
        they cost no task.  Only from lists read in order: out of order, a
        later time is not a later change.  Not in metadata-only mode, where
        every change is recorded.
        """
        for item in batch:
            item.superseded = [False] * len(item.entries)
        if self.applier.metadata_only or any(item.unordered for item in batch):
            return []
        latest: dict[str, datetime] = {}  # loc -> its latest change time in the walk
        for item in batch:
            for entry in item.entries:
                when = entry.change_time
                if when is not None and when > latest.get(entry.loc, when - _TICK):
                    latest[entry.loc] = when
        doomed: list[ChangeView] = []
        for item in batch:
            # At the watcher's positions every entry is new; else ask the position.
            check = item.checkpoints is None
            for i, entry in enumerate(item.entries):
                when = entry.change_time
                if (
                    when is not None
                    and when < latest[entry.loc]  # strictly: as Applier._newer_queued
                    and not item.settled[i]
                    and (not check or self._submitted.is_new(entry))
                ):
                    item.superseded[i] = True
                    doomed.append(item.views[i])
        return doomed

    async def _packaged(self, batch: list[_Found]) -> dict[changedump.Key, bytes]:
        """Bytes for the walk's changes from the Source's Change Dump, if it has one.

        Only for the last change of each resource in the walk (the applier
        supersedes the earlier ones without a fetch), from lists read in
        order, and only when there are enough of them (:mod:`.changedump`).
        """
        if self.changedump_url is None or self.applier.metadata_only:
            return {}
        last: dict[str, Entry] = {}
        for item in batch:
            for entry, done, over in zip(item.entries, item.settled, item.superseded, strict=True):
                if done or over:
                    continue
                last.pop(entry.loc, None)  # re-inserted: dict order is change order
                if not item.unordered:
                    last[entry.loc] = entry
        wanted = [e for e in last.values() if e.change is not ChangeType.DELETED]
        packaged = await changedump.bodies_from_change_dump(
            self.applier.fetcher,
            self.changedump_url,
            wanted,
            workdir=self.workdir,
            allowed_origins=self.applier.allowed_origins,
        )
        self.stats.dump_packages += packaged.packages
        self.stats.dump_bodies += len(packaged.bodies)
        if packaged.packages:
            self._event(
                "change-dump",
                f"{len(packaged.bodies)} of {len(wanted)} bodies from {packaged.packages} "
                f"Change Dump package(s), {packaged.package_bytes} bytes",
                {"bodies": len(packaged.bodies), "packages": packaged.packages},
            )
        return packaged.bodies

    def _fresh_checkpoint(self, at: datetime | None) -> Checkpoint:
        """The position right after a baseline taken at ``at``.

        Unordered reading (``--lenient order``, the Destination's default)
        starts with no entry known: every entry of the lists still to read
        goes to the applier, the ones dated before ``at`` included.  A Source
        that back-dates changes (resync 2.0.1 dates a deletion with the file's
        old mtime) lists some the baseline did not reflect, and the applier
        decides each by what the mirror holds, asking the Source when in doubt.
        """
        return Checkpoint(
            last_time=at, started=True, known=Known.of() if self.watcher.unordered else None
        )

    async def _rebaseline(self, reason: str) -> None:
        """The Change Lists no longer cover the cursor: take a new baseline, resume from it.

        Z39.99 section 12.1 leaves retention to the Source; when it dropped
        lists the Destination had not read, only a snapshot can tell what
        changed meanwhile.  Every resource of the Resource List (Index) or
        Resource Dump is applied as a creation at the snapshot's ``at``; the
        applier compares what the mirror already holds and fetches only what
        differs.  What the mirror holds of this collection from before ``at``
        and the snapshot no longer lists was deleted meanwhile, and is deleted.
        Then the walk resumes from ``at``.  A hole that remains after that
        (the snapshot is older than the lists' start), or with no snapshot to
        take, cannot be closed from the documents: the walk reads what there
        is, and the mirror is reported incomplete (``--once`` exits 1).
        """
        if self._baseline is None:
            self._incomplete(reason, "the Source offers no Resource List to re-baseline from")
            return
        self.stats.rebaselines += 1
        self._event("re-baseline", reason, {})
        await self.drain()
        summary = await self._baseline()
        at = getattr(summary, "at", summary)
        listed = getattr(summary, "locs", None)
        if at is not None and listed is not None:
            held = await self.applier.resources.held(
                self.collection, before=at, unknown_too=self.sole_collection
            )
            for loc in held:
                if loc not in listed:  # deleted while the lists that said so were dropped
                    gone = Entry(loc=loc, change=ChangeType.DELETED, datetime=at)
                    future = self.applier.submit(gone, collection=self.collection)
                    self._pending.append(_Pending(future, None, None))
            self._wake.set()
        self.applied = self._submitted = self._fresh_checkpoint(at)
        self._away_from = at  # for framework.rebaseline_cue: this walk starts at the baseline
        await self.drain()
        remaining = self.watcher.hole_at(self._submitted)
        if remaining is not None:
            self._incomplete(remaining, "a new baseline did not close it")

    def _incomplete(self, hole: str, why: str) -> None:
        log.error(
            "%s: %s; %s: the mirror may lack changes from that period",
            self.collection,
            hole,
            why,
            extra={"collection": self.collection},
        )
        self._event("incomplete", f"{hole}; {why}", {})
        self.incomplete = True

    def without_push(self) -> None:
        """No push channel for this collection: poll the Change Lists from the start."""
        self.health = PushHealth(
            grace=self.health.grace, interval=self.health.interval, channel=False
        )

    def _report_mode(self, change: Transition | None) -> None:
        if change is None:
            return
        self.stats.mode, self.stats.mode_reason = change.mode, change.reason
        if change.mode == "polling":
            log.warning(
                "%s: push unavailable (%s): polling %s every %gs",
                self.collection,
                change.reason,
                self.watcher.polls,
                self.health.interval,
                extra={"collection": self.collection},
            )
        self._event(change.mode, change.reason, {})

    def _settled_state(self) -> str:
        """What the engine is after a catch-up: live on push, or polling."""
        return "polling" if self.health.mode == "polling" else "live"

    def _confirm_due(self, now: float) -> bool:
        """Time for a quiet walk behind push (see :data:`CONFIRM_AFTER_CHANGES`)."""
        pushed = self._pushed_since_walk
        return pushed >= CONFIRM_AFTER_CHANGES or (
            pushed > 0 and now - self._last_walk >= CONFIRM_AFTER_SECONDS
        )

    async def poll(self, *, confirm: bool = False) -> None:
        """A walk that is not a gap: degraded mode's timer, or following push (``confirm``).

        Quiet unless it finds something the mirror lacks.  Following push, it
        moves the position over what push applied and confirms provisional
        states, most entries settled without any work
        (:meth:`Applier.settle_many`).
        """
        if confirm:
            self.stats.confirm_walks += 1
        else:
            self.stats.polls += 1
        self.stats.state = "catching-up"
        started = time.monotonic()
        self._doubts.settled(started)
        self._away_from = self._submitted.last_time
        # Following push, one pass: what changed since it read is pushed anyway
        # (two more passes were four more requests to the Source each time).
        passes = 1 if confirm else CATCH_UP_PASSES
        applied = await self._walk_change_lists(wait=False, passes=passes)
        if applied:
            why = "not applied from push" if confirm else "push unavailable"
            self._event(
                "poll",
                f"{applied} change(s) from {self.watcher.walks} in "
                f"{time.monotonic() - started:.2f}s ({why})",
                {},
            )
        self.stats.state = self._settled_state()

    async def catch_up(self, gap: Gap, *, wait: bool = True) -> None:
        """Resolve a gap: replay from the log if the channel can, else walk the Change Lists.

        With ``wait=False`` (a gap found while live) a walk returns as soon as
        what it found is submitted: the pipeline applies it in order while the
        engine goes on consuming notifications, whose newer changes supersede
        the entries the Source has moved past.  Waiting instead would stall
        push for as long as such an entry retries its fixity check.
        """
        started = time.monotonic()
        self.detector.catching_up(started)
        self.stats.gaps += 1
        self.stats.state = "catching-up"
        self._event("gap", gap.reason, {"size": gap.size, "first": gap.first_missing})
        replayable = (
            self.replay is not None
            and not self._replay_refused
            and not gap.walk
            and gap.reason != "safety poll"
            and not gap.reason.startswith("no heartbeat")
        )
        if not replayable:
            self._doubts.settled(started)  # this walk settles every doubt raised so far
        if replayable or wait:
            await self.drain()  # a replay starts after what is applied
        if replayable and self.replay is not None and self.applied_seq is not None:
            # The log may still hold the range: ask for it; the replay arrives as messages.
            self._buffer.clear()
            self.detector.caught_up(self.applied_seq, now=time.monotonic())
            self._generation = await self.replay(self.applied_seq)
            self.stats.state = self._settled_state()
            self._event("replay", f"from seq {self.applied_seq + 1}", {})
            return
        self._away_from = self._submitted.last_time  # for framework.rebaseline_cue
        applied = await self._walk_change_lists(wait=wait)
        self._replay_refused = False
        last_seq: int | None = None
        for n in sorted(self._buffer, key=lambda n: (n.seq or 0, n.datetime)):
            self._submit_pushed(n)
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
        self.stats.state = self._settled_state()
        self._event(
            "catch-up",
            f"{applied} change(s) from {self.watcher.walks} in {duration:.2f}s",
            self.stats.last_gap,
        )

    def _event(self, kind: str, detail: str, data: dict[str, Any]) -> None:
        log.info("%s: %s: %s", self.collection, kind, detail, extra={"collection": self.collection})
        if self.on_event is not None:
            self.on_event(kind, detail, data)

    # -- live ---------------------------------------------------------------------------

    def _doubt(self, kind: str, detail: str) -> None:
        """Untrusted input disagreed with the Source: walk the Change Lists (rate-limited).

        Reported once per walk: a flood of forgeries must not become a flood of
        log lines and event rows either (the walk's gap event counts the rest).
        """
        self.stats.doubts += 1
        if self._doubts.reason is None:
            self._event(kind, detail, {})
        self._doubts.raise_doubt(detail)

    def _on_message(self, message: ev.Message) -> Gap | None:
        if message.generation < self._generation:
            self.stats.duplicates += 1  # from a connection a replay replaced
            return None
        try:
            batch = self._decode_batch(message)
            self._decoded = True  # a readable notification: the channel is alive
        except InvalidNotification as exc:
            if self.trusted_push:
                return self.detector.on_invalid(str(exc))
            # Anyone may write garbage on an unsigned channel: a doubt, rate-limited.
            self._doubt("invalid", f"invalid payload: {exc}")
            return None
        if not batch.sequenced:
            return self._on_interval(batch)
        if not self.trusted_push:
            for n in batch.changes:
                self._on_unsigned(n, message.prev)
            return None
        found: Gap | None = None
        now = datetime.now(UTC)
        for n in batch.changes:
            assert n.seq is not None
            if found is not None:  # after a gap the rest waits for the catch-up
                self._buffer.append(n)
                continue
            verdict, gap = self.detector.on_notification(n.seq, message.prev)
            if beyond_skew(n.datetime, now, self.max_skew):
                # Signed, so its sequence number counts; its date is not believed.
                self._refuse_future(n)
                found = gap if verdict is Verdict.GAP else None
            elif verdict is Verdict.DUPLICATE:
                self.stats.duplicates += 1
            elif verdict is Verdict.GAP:
                self._buffer.append(n)
                found = gap
            else:
                self._submit_pushed(n)
        return found

    def _on_interval(self, batch: envelope.ChangeNotification) -> Gap | None:
        """A Change Notification without sequence numbers: the interval chain decides.

        Signed (or on a channel that needs no signature to be trusted), a
        broken chain is a gap and the changes wait for the catch-up's walk.
        Unsigned, the chain is as forgeable as the rest: the changes are
        hints applied at once and a broken chain is a doubt (see .trust).
        """
        verdict, gap = self.detector.on_interval(batch.from_, batch.until)
        now = datetime.now(UTC)
        trusted = self.trusted_push
        if gap is not None and not trusted:
            self._doubt("gap", gap.reason)
            gap = None
        for n in batch.changes:
            if beyond_skew(n.datetime, now, self.max_skew):
                self._refuse_future(n)
            elif verdict is Verdict.GAP and trusted:
                self._buffer.append(n)  # applied after the catch-up's walk
            else:
                self._submit_pushed(n)
        return gap

    def _decode_batch(self, message: ev.Message) -> envelope.ChangeNotification:
        """Decode a payload of one or more changes (a standard one may name no collection)."""
        batch = envelope.decode_batch(message.payload, collection=self.collection)
        if self.keys is not None:
            envelope.verify(message.payload, message.signature, self.keys)
        for n in batch.changes:
            n.received = message.received
        return batch

    def _on_unsigned(self, n: Notification, prev: int | None) -> None:
        """A notification nobody vouched for: a hint, whatever its sequence number says.

        On a channel anyone may publish to, a sequence number proves nothing
        (see .trust): a forged notification can take the number the genuine
        one will come with, or jump far ahead so that every genuine one looks
        like a duplicate.  So a "duplicate" is dropped only if exactly this
        change came under that number before; otherwise the sequence is
        rewound to it and the change applied (the resource store makes a true
        repeat a no-op).  A number claimed by two different changes, and a
        sequence jump, are doubts: the walk they cause (rate-limited) applies
        whatever the Source really holds, and the notification itself is
        applied at once meanwhile, never held back.
        """
        if beyond_skew(n.datetime, datetime.now(UTC), self.max_skew):
            self._refuse_future(n)  # not counted: its number is as unproven as its date
            return
        seq = cast(int, n.seq)  # a change of a sequenced batch (see _on_message)
        known = self._seqs.seen(seq, n.identity)
        clash = self._seqs.remember(seq, n.identity)
        verdict, gap = self.detector.on_notification(seq, prev)
        if clash is not None:
            self._doubt(
                "conflict",
                f"seq {n.seq} came with two different changes ({clash[2]} {clash[0]} and "
                f"{n.change.value} {n.loc}): one is forged, or the publisher reassigned it",
            )
        elif verdict is Verdict.DUPLICATE:
            if known:
                self.stats.duplicates += 1
                return
            self.detector.rewind(seq)
        elif verdict is Verdict.GAP and gap is not None:
            self._doubt("gap", gap.reason)
        self._submit_pushed(n)

    def _refuse_future(self, n: Notification) -> None:
        self.stats.refused += 1
        self._doubt(
            "refused",
            f"refused notification seq {n.seq} for {n.loc}: its datetime "
            f"{format_datetime(n.datetime)} is more than {self.max_skew:g}s ahead of this "
            "host's clock",
        )

    def _on_event(self, event: ev.Event, now: float) -> Gap | None:
        if isinstance(event, ev.Message):
            self._decoded = False
            gap = self._on_message(event)
            return (self._alive(now) if self._decoded else None) or gap
        if isinstance(event, ev.Head):
            gap = self.detector.on_head(event.head, now=now)
            return self._alive(now) or gap
        if isinstance(event, ev.Connected):
            self._event("connected", f"session present: {event.session_present}", {})
            self.health.on_connected(now)
            return self.detector.on_connect(
                session_present=event.session_present, now=now, at=event.at
            )
        if isinstance(event, ev.Unavailable):
            # Refused (protocol, credentials, topic) will not fix itself by waiting.
            self.health.on_down(event.reason, now, at_once=event.state == "refused")
            return None
        if isinstance(event, ev.Skipped):
            return self.detector.on_skipped(event.first, event.resume)
        if isinstance(event, ev.TooOld):
            self._replay_refused = True  # the next catch-up walks the Change Lists
            return Gap(f"log no longer holds seq {event.since + 1} (earliest {event.earliest})")
        if isinstance(event, ev.Invalid):
            if not self.trusted_push:
                self._doubt("invalid", f"invalid payload: {event.reason}")
                return None
            return self.detector.on_invalid(event.reason)
        if isinstance(event, ev.Overflow):
            self._overflowed = False
            return Gap("event queue overflow")
        if isinstance(event, ev.Disconnected):
            self._event("disconnected", event.reason, {})
            self.health.on_down(event.reason, now)
        if isinstance(event, ev.Framework):
            return self._on_framework(event)
        return None

    def _alive(self, now: float) -> Gap | None:
        """The channel showed a sign of life; back from polling, catch up once."""
        change = self.health.on_alive(now)
        if change is None:
            return None
        self._report_mode(change)
        return Gap("push is back", walk=True)

    def _on_framework(self, event: ev.Framework) -> Gap | None:
        """A Framework Notification: recorded; a cue to re-baseline or to read the Change Lists.

        Each change is an event (``framework``: log, event table, metric).  A
        new Resource List while the mirror's last walk started before the
        Change Lists begin is a cue to re-baseline (:func:`framework.
        rebaseline_cue`); a Change List created or updated makes a walk when
        no change channel is followed (``framework_polls``).  Both only make
        the Destination read the Source: the notification itself moves nothing.
        """
        changes = event.notification.changes
        for change in changes:
            self._event("framework", change.describe(), {"seq": change.seq})
        reason = framework.rebaseline_cue(
            changes, position=self._away_from, coverage_start=self.watcher.coverage_start()
        )
        if reason is not None:
            self._away_from = None  # one cue per walk that started outside the coverage
            # The walk verifies at the Source: it finds the hole in the Change
            # Lists and re-baselines (_rebaseline), or finds none and goes on.
            self._event("rebaseline-hint", reason, {})
            return Gap(f"framework notification: {reason}", walk=True)
        if self.framework_polls and framework.polls_change_lists(changes):
            return Gap("framework notification: the Change Lists changed", walk=True)
        return None

    async def start(self, baseline: Callable[[], Any] | None) -> None:
        """Load the cursor, baseline if this is the first run, catch up, then go live.

        ``baseline()`` returns a :class:`~.baseline.BaselineSummary` (or just
        its ``at``); it is called again when the Change Lists leave a hole.
        """
        self._baseline = baseline
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
                summary = await baseline()
                self.applied = self._submitted = self._fresh_checkpoint(
                    getattr(summary, "at", summary)
                )
            else:
                self.applied = self._submitted = self._fresh_checkpoint(None)
            self.baseline_done = True
            await self.save()
        await self.catch_up(Gap("start-up"))

    async def run(self) -> None:
        """Consume channel events until cancelled.

        The quiet walk that follows push (:meth:`_confirm_due`) runs beside
        this loop, not in it: it reads the Source's Change Lists (a request,
        then a thousand entries to parse and settle), and while the loop
        waited for it, every notification that came meanwhile waited too.
        At 200 changes/s that was one stall of ~0.1 s every 5 s, and the
        changes made during it were the p99 of change-to-applied
        (bench.e2e).  So does the walk of a doubt on an unsigned channel,
        whose notifications are hints applied at once anyway.  Only while the
        engine keeps up (:data:`BESIDE_PUSH_IN_FLIGHT`); behind its Source the
        walk runs inline again.  Every other walk (a gap on a trusted
        channel, whose notifications wait for it; degraded mode's timer)
        waits for the one in progress first: one walk at a time moves the
        watcher.
        """
        try:
            await self._consume()
        finally:
            if self._following is not None:
                self._following.cancel()  # close() waits for it

    async def _consume(self) -> None:
        while True:
            self._followed()
            if len(self._pending) >= self.max_in_flight:
                await self._wait_for_room()
            event: ev.Event | None = None
            if not self.queue.empty():
                event = self.queue.get_nowait()  # busy: no timer per event
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.tick):
                        event = await self.queue.get()
            now = time.monotonic()
            gap = self._on_event(event, now) if event is not None else None
            silent = self.detector.tick(now)
            if silent is not None and silent.reason.startswith("no heartbeat"):
                self.health.on_silent(silent.reason, now)
            gap = gap or silent
            if gap is None:
                doubt = self._doubts.due(now)
                if doubt is not None:
                    gap = Gap(doubt, walk=True)
            change, poll_due = self.health.tick(now)
            self._report_mode(change)
            if self.failure is not None:
                raise self.failure
            beside = len(self._pending) < BESIDE_PUSH_IN_FLIGHT
            if gap is not None and gap.walk and not self.trusted_push and beside:
                # A doubt, or push back after polling: unsigned notifications are
                # applied as hints at once anyway (_on_unsigned), so this walk
                # need not hold them either.
                await self._follow_done()
                self._following = asyncio.create_task(self.catch_up(gap, wait=False))
            elif gap is not None:
                await self._follow_done()
                await self.catch_up(gap, wait=False)
            elif poll_due:
                await self._follow_done()
                await self.poll()
            elif self._following is None and self._confirm_due(now):
                if beside:
                    self._following = asyncio.create_task(self.poll(confirm=True))
                else:  # behind its Source: the walk applies what push has not reached yet
                    await self.poll(confirm=True)

    def _followed(self) -> None:
        """Take the outcome of a finished quiet walk: its failure is the engine's."""
        walk = self._following
        if walk is not None and walk.done():
            self._following = None
            walk.result()  # raises what the walk raised: the service restarts the engine

    async def _follow_done(self) -> None:
        """Wait for the quiet walk in progress, if any, before another walk."""
        walk = self._following
        if walk is not None:
            await asyncio.wait({walk})
            self._followed()

    async def once(self) -> None:
        """Catch up to the Source's current state and stop (``--once``)."""
        await self.catch_up(Gap("once"))

    async def close(self) -> None:
        walk, self._following = self._following, None
        if walk is not None:
            # Stopped or failed mid-walk: the watcher may hold half a pass, so
            # the next start reads from the durable cursor (load() resets it).
            walk.cancel()
            await asyncio.wait({walk})
            self._watcher_synced = False
            if not walk.cancelled() and walk.exception() is not None:
                log.warning("%s: stopping: %s", self.collection, walk.exception(),
                            extra={"collection": self.collection})  # fmt: skip
        try:
            await self.drain()
            drained = True
        except Exception as exc:
            drained = False
            log.warning("%s: stopping: %s", self.collection, exc,
                        extra={"collection": self.collection})  # fmt: skip
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
