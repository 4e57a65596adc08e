"""The batch recorder: ``--metadata-only`` changes recorded a transaction at a time.

Nothing is fetched in metadata-only mode, so there is nothing to run
concurrently: one task records queued changes in submission order
(per-resource order holds trivially), a batch of up to :data:`RECORD_BATCH`
per transaction, which is what lets a catch-up of tens of thousands of
changes finish in seconds.  Each change gets exactly the decision the
applier's one-change path would give it (:meth:`BatchRecorder._decide`
follows the same rules, :mod:`.rules`); the applier owns the futures'
bookkeeping and hands its vetting, reporting and hooks in.

Changes arrive in groups: one change (:meth:`.applier.Applier.submit`,
a future of one :class:`~.rules.Outcome`) or a walk's chunk
(:meth:`.applier.Applier.submit_many`, one future of the list).  A batch
takes whole groups, so a group is never split over two transactions and its
future is answered once all of it is durable.

The applier's other path (a task per change, chained per ``loc``: an
unconfirmed deletion, which asks the Source) keeps one order with this one,
or the two overtook each other: a create recorded here after the deletion
it preceded replaced it (a provisional state gives way to any write), a
deletion confirmed after a newer create recorded here replaced that.  So a
change sent down a chain while groups wait here first waits for all of them
(:meth:`BatchRecorder.barrier`: they may hold its ``loc``); a later change
of a ``loc`` with a chain follows it down the chain instead of coming here;
and once the chain is done, the recorder forgets what it knew of the
``loc`` (:meth:`BatchRecorder.forget`) and reads the state the chain left.
No per-``loc`` bookkeeping here: a catch-up's only added cost is the
applier's look in its (almost always empty) dict of chains.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any  # the changes submitted: any object read_change reads, handed to hooks

from .resources import APPLY, CONFIRM, KEEP, ResourceState, ResourceStore, state_of_row, to_us
from .rules import ChangeView, Failure, Outcome, already_applied

# Metadata-only changes recorded per transaction, at most: a batch takes what is
# queued, so it grows only when the store falls behind (a catch-up: the walk
# parses faster than the store thread, which shares the interpreter with it,
# writes).  Then each commit (an fsync) and each transaction's set-up is paid
# once for more changes: a 50,000-change --once catch-up waited 0.57-0.67 s
# after its last list for the store at 2,000, 0.29-0.40 s at 8,000 to 20,000.
RECORD_BATCH = 10_000

# metadata_only: changes queued for the batch recorder, a group at a time: their
# views, the objects submitted (for hooks), the future the submitter holds, and
# whether that future holds one Outcome (submit) or a list of them (submit_many).
_Queued = tuple[list[ChangeView], list[Any], "asyncio.Future[Any]", bool]

# What the recorder knows of a loc's state: one read from the store (None: none),
# or the row (ResourceStore.row) of the change that became it.
_State = ResourceState | tuple[Any, ...] | None


@dataclass(slots=True, eq=False)
class _Writing:
    """One batch of the recorder: decided, then written (``task``), then answered."""

    batch: list[_Queued]
    views: list[ChangeView]
    changes: list[Any]
    paths: list[Path | None]  # where each change's resource lives (None: refused)
    outcomes: list[Outcome]
    refusals: dict[int, Failure]  # by index into views
    rows: list[tuple[tuple[Any, ...], int]]
    task: asyncio.Future[list[bool]] | None = None


def _fail(batch: list[_Queued], exc: BaseException | None) -> None:
    """Answer a batch's futures with ``exc`` (None: cancel them)."""
    for _, _, future, _ in batch:
        if not future.done():
            if exc is None:
                future.cancel()
            else:
                future.set_exception(exc)


class BatchRecorder:
    """Records queued groups of changes in order, a pipelined transaction per batch."""

    def __init__(
        self,
        resources: ResourceStore,
        *,
        vet: Callable[[ChangeView], tuple[Path | None, Failure | None]],
        confirms: Callable[[ResourceState | None, ChangeView], bool],
        reported: Callable[[ChangeView, Any, Failure], Awaitable[Outcome]],
        hook: Callable[[ChangeView, Any, Path], Awaitable[None]],
        hooks_present: Callable[[], bool],
        max_skew: float,
    ) -> None:
        self.resources = resources
        self.max_skew = max_skew
        self._vet = vet
        self._confirms = confirms
        self._reported = reported
        self._hook = hook
        self._hooks_present = hooks_present
        self._batch: deque[_Queued] = deque()
        self._batcher: asyncio.Task[None] | None = None
        # What the batches decided so far leave behind, per loc (see _decide): kept
        # from one batch to the next while the batcher runs.
        self._states: dict[str, _State] = {}

    def queue(
        self, views: list[ChangeView], changes: list[Any], future: asyncio.Future[Any], single: bool
    ) -> None:
        """Record ``views`` after everything queued before; ``future`` gets the outcome(s)."""
        self._batch.append((views, changes, future, single))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.get_running_loop().create_task(self._record_batches())

    def barrier(self) -> asyncio.Future[Any] | None:
        """A future answered once every group queued so far is (None: nothing is queued).

        An empty group, in the queue's order: answered with its batch, after
        every group before it is durable and its hooks have run (or failed
        with them; cancelled if the recorder is).
        """
        if not self._batch and (self._batcher is None or self._batcher.done()):
            return None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.queue([], [], future, False)
        return future

    def forget(self, loc: str) -> None:
        """The state of ``loc`` was written elsewhere: read it again before deciding on it."""
        self._states.pop(loc, None)

    def drop(self) -> None:
        """Forget the queued groups whose futures are cancelled (never recorded)."""
        self._batch = deque(item for item in self._batch if not item[2].cancelled())

    def _next_batch(self) -> list[_Queued]:
        """Whole groups, in order, up to :data:`RECORD_BATCH` changes (a larger group alone)."""
        queue = self._batch
        batch = [queue.popleft()]
        size = len(batch[0][0])
        while queue and size + len(queue[0][0]) <= RECORD_BATCH:
            size += len(queue[0][0])
            batch.append(queue.popleft())
        return batch

    async def _record_batches(self) -> None:
        """Record queued groups a batch (one transaction) at a time, in order, pipelined.

        Batch k+1 is decided while batch k is being written: the decisions
        read the states the earlier batches leave behind (``states``, exactly
        what the store's guard will make of them), as one large batch would,
        so each transaction's wait for the disk overlaps the next one's work
        instead of following it.  Transactions still commit one after the
        other, in submission order, and no future is answered before its
        transaction is durable.  A batch decided on top of one whose write
        failed fails with it (a local failure: the engine restarts from its
        cursor).
        """
        states = self._states = {}  # what the batches decided leave behind
        writing: _Writing | None = None
        prepared: _Writing | None = None
        try:
            while self._batch or writing is not None:
                prepared = None
                if self._batch:
                    batch = self._next_batch()
                    views = [v for group, _, _, _ in batch for v in group]
                    changes = [c for _, group, _, _ in batch for c in group]
                    try:
                        rows, paths, outcomes, refusals = await self._decide(views, states)
                    except Exception as exc:  # the store cannot be read
                        _fail(batch, exc)
                        states.clear()
                    else:
                        prepared = _Writing(batch, views, changes, paths, outcomes, refusals, rows)
                if writing is not None:
                    done, writing = writing, None
                    assert done.task is not None
                    try:
                        await done.task
                    except Exception as exc:  # a local failure: the store cannot be written
                        _fail(done.batch, exc)
                        if prepared is not None:  # decided on top of what was not written
                            _fail(prepared.batch, exc)
                            prepared = None
                        states.clear()
                    else:
                        await self._finish(done)
                if prepared is not None:
                    prepared.task = asyncio.ensure_future(self.resources.record_rows(prepared.rows))
                    writing, prepared = prepared, None
                    await asyncio.sleep(0)  # the write starts now, while the next batch is decided
        except BaseException:  # cancelled: nothing left will be recorded
            for item in (writing, prepared):
                if item is not None:
                    if item.task is not None:
                        item.task.cancel()
                    _fail(item.batch, None)
            _fail(list(self._batch), None)
            self._batch.clear()
            raise

    async def _decide(
        self, views: list[ChangeView], states: dict[str, _State]
    ) -> tuple[list[tuple[tuple[Any, ...], int]], list[Path | None], list[Outcome],
               dict[int, Failure]]:  # fmt: skip
        """The rows, paths, outcomes and refusals (by index) of one batch.

        ``states`` (updated): what the batches decided so far leave behind,
        per loc: a state read from the store, or the row of the change that
        became it (made a :class:`ResourceState` only if a decision needs one,
        as the store's cache does).

        The usual change of a catch-up takes a short way: a change of a loc
        with no state, or whose state is a row dated before it, is recorded
        and its row becomes the state.  That is what the rules below answer
        for it, whatever the state's trust: not a confirmation (that needs
        the same datetime), not already applied (a provisional state counts
        only the very same change, a trusted one only a change at or before
        its time), and the store's guard lets a later change through.  By
        one comparison of the store's microseconds instead of a state, three
        calls and a row built by :meth:`ResourceStore.row` (the same tuple:
        test_recorder holds the short way to the general one).
        """
        store = self.resources
        missing = [view.loc for view in views if view.loc not in states]
        if missing:
            states.update(await store.get_many(missing))
        # One stamp: the batch is committed in one transaction; and one clock for
        # its skew checks, as read_many reads its batch (per change, the clock
        # read was a tenth of deciding).
        now = datetime.now(UTC)
        now_us = to_us(now)
        max_skew, confirms, vet = self.max_skew, self._confirms, self._vet
        recorded = Outcome.RECORDED
        rows: list[tuple[tuple[Any, ...], int]] = []
        paths: list[Path | None] = []
        outcomes: list[Outcome] = []
        refusals: dict[int, Failure] = {}
        for view in views:
            path, refusal = vet(view)
            paths.append(path)
            loc = view.loc
            known = states.get(loc)
            when_us = to_us(view.datetime)
            if refusal is None and (known is None or (type(known) is tuple and when_us > known[2])):
                row: tuple[Any, ...] = (
                    loc, view.change.value, when_us, view.seq, now_us, view.hashes.get("sha-256"),
                    view.length, recorded, None, 1 if view.confirmed else 0, view.collection,
                )  # fmt: skip
                rows.append((row, APPLY))
                outcomes.append(recorded)
                states[loc] = row
                continue
            state = state_of_row(known) if isinstance(known, tuple) else known
            if state is not known:
                states[loc] = state
            if refusal is not None:
                outcome, update = refusal.outcome, KEEP
                refusals[len(outcomes)] = refusal
            elif state is None:
                outcome, update = recorded, APPLY
            elif confirms(state, view):
                outcome, update = Outcome.CONFIRMED, CONFIRM
            elif already_applied(state, view, max_skew, now=now):
                outcome, update = Outcome.SKIPPED_ALREADY_APPLIED, KEEP
            else:
                outcome, update = recorded, APPLY
            row = store.row(
                loc,
                view.change,
                view.datetime,
                outcome=outcome,
                seq=view.seq,
                sha256=view.hashes.get("sha-256") if update == APPLY else None,
                length=view.length if update == APPLY else None,
                detail=refusal.detail if refusal is not None else None,
                confirmed=view.confirmed,
                applied_at=now,
                collection=view.collection,  # a re-baseline of it must find the row (held)
            )
            rows.append((row, update))
            outcomes.append(outcome)
            if update == CONFIRM and state is not None:
                states[loc] = replace(state, confirmed=True)
            elif update == APPLY and (
                # The store's own guard (ResourceStore._record_many), exactly: a
                # later batch decides on what this one really leaves behind.
                state is None or view.datetime >= state.datetime or not state.confirmed
            ):
                states[loc] = row
        return rows, paths, outcomes, refusals

    async def _finish(self, done: _Writing) -> None:
        """A batch is durable: report refusals, run hooks, answer its futures."""
        views, changes, refusals = done.views, done.changes, done.refusals
        if self._hooks_present():
            recorded = Outcome.RECORDED
            for i, (view, change, path, outcome) in enumerate(
                zip(views, changes, done.paths, done.outcomes, strict=True)
            ):
                refusal = refusals.get(i)
                if refusal is not None:
                    await self._reported(view, change, refusal)
                elif outcome is recorded:
                    assert path is not None
                    await self._hook(view, change, path)
        else:  # nothing to call per change but the refusals' reports (in order: by index)
            for i, refusal in refusals.items():
                await self._reported(views[i], changes[i], refusal)
        start = 0
        outcomes = done.outcomes
        for group, _, future, single in done.batch:
            end = start + len(group)
            if not future.done():
                future.set_result(outcomes[start] if single else outcomes[start:end])
            start = end
