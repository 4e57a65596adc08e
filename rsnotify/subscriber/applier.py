"""Apply changes to the mirror: fetch, verify, write atomically, delete, remember.

The applier is where a notification (or a Change List entry found while
catching up) becomes bytes on the Destination's disk.  Its guarantees:

* **Idempotent, never backwards.**  Before acting it asks the
  :class:`~.resources.ResourceStore` for the newest change of the ``loc``
  already applied.  A change older than that, or the same change again, is
  :attr:`Outcome.SKIPPED_ALREADY_APPLIED`.  "The same" means an equal datetime
  and either an equal-or-lower sequence number (when both are known) or the
  same change type: Sources with one-second clocks do emit
  ``created`` and ``updated`` of one resource with equal datetimes, and the
  second must not be dropped.
* **Per-resource order.**  :meth:`Applier.submit` chains the changes of one
  ``loc`` so they run strictly in submission order; different resources run
  concurrently, at most ``concurrency`` transfers (fetch, or fetch and write
  for a large or unsized resource) at a time.  A small resource's bytes then
  wait, outside the slot, for the mirror's next batched write, as deletes
  do (at most ``transfer.HELD_BODIES`` of the two together).  A change waiting out a
  retry backoff holds no slot.  With ``metadata_only`` changes go to the batch
  recorder, in submission order, but for an unconfirmed deletion (it asks the
  Source): that one is chained after all the recorder holds, and a later change
  of its ``loc`` follows it down the chain (:mod:`.recorder`).  The
  Source's own deletions (confirmed, from lists read in order) of resources
  with nothing queued are applied a group per turn of the loop, each group
  its loc's tail until done (:mod:`.deletions`).
* **Nothing unverified replaces anything.**  Bytes are streamed to a temp file
  and hashed as they arrive; advertised length and hashes are checked before
  the rename (see :mod:`.mirror`).  A mismatch is retried with backoff and
  finally reported, the old file untouched.
* **Pushed changes are hints.**  A change submitted with ``confirmed=False``
  (pushed without a signature) or dated beyond the allowed clock skew writes
  a *provisional* state (:mod:`.trust`): it never makes another change look
  older, so a forged datetime costs at most a re-fetch.  A provisional state
  becomes trusted when the Source's Change List lists exactly that change
  (:attr:`Outcome.CONFIRMED`, nothing fetched).  An unconfirmed deletion
  removes a file only once the Source answers 404/410 for it
  (:attr:`Outcome.UNCONFIRMED` otherwise, and the file stays).
* **No SSRF.**  ``loc`` and every ``rel="duplicate"`` mirror must be on an
  allowed origin; the check happens before any connection and again on every
  redirect hop (:mod:`rsnotify.fetch`).  A refused ``loc`` is reported, never
  retried, and nothing at all is fetched for it.

A change whose resource already has a *newer* change (later datetime) queued
is recorded as :attr:`Outcome.SUPERSEDED` without a fetch: the Source serves
only the newest bytes, and the newer change fetches them.  Likewise when a
fetch keeps failing (hash mismatch, 404) and a newer change arrives meanwhile:
the failure is expected (the Source has moved on), and catching up after a
long outage would otherwise spend most of its time in backoff.  Hooks do not
run for a superseded change; they run for the change that replaces it.

Why one module of ~800 lines: per-resource ordering (the chains), the
decision flow of one change and its reporting share the same state (what is
queued per ``loc``), and splitting them spread one invariant over several
files.  The pure rules are in :mod:`.rules`, the I/O with the Source in
:mod:`.transfer`, the callbacks in :mod:`.hooks`, ``metadata_only``'s
batched recording in :mod:`.recorder`.

Every outcome lands in the apply log.  Local failures (disk full, unwritable
mirror, broken resource store) are not outcomes: they raise
:class:`~.mirror.MirrorError` / :class:`~.resources.ResourceStoreError`, since
retrying the next resource cannot help.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterable, Callable, Collection
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import FetchError
from ..fetch import Fetcher, OriginNotAllowed, check_origin, origin_of
from ..model import ChangeType
from .deletions import NO_FILE, DeletionGroups
from .hooks import Hooks, call_hook
from .mirror import FixityMismatch, Mirror, PathConflict, UnsafePath
from .recorder import RECORD_BATCH, BatchRecorder
from .resources import CONFIRM, KEEP, ResourceState, ResourceStore
from .rules import (
    OUTDATED_DELETE,
    SAME_BYTES,
    ChangeView,
    Failure,
    InvalidChange,
    Outcome,
    Record,
    already_applied,
    classify,
    path_failure,
    read_change,
    read_changes,
    same_change,
    to_recheck,
)
from .transfer import Transfer
from .trust import DEFAULT_MAX_SKEW, beyond_skew

__all__ = ["RECORD_BATCH", "Applier", "Hooks", "InvalidChange", "Outcome"]

log = logging.getLogger("rsnotify.subscribe")

DEFAULT_MAX_RESOURCE_BYTES = 1 << 30
VET_CACHE_SIZE = 50_000  # locs whose vetting is remembered (a few MB)
# Entries a walk reads (read_many) or settles (settle_many) between two looks at
# the loop: ~1-2 ms of CPU, so a notification never waits for a whole list.
SETTLE_SLICE = 200


class Applier:
    """Applies changes to a :class:`~.mirror.Mirror`, remembering them in a ResourceStore.

    ``allowed_origins`` (origins or URLs on them) limits every fetch; ``None``
    means unrestricted and should only be used when the caller has already
    vetted the changes.  ``retries`` bounds the retries after the first
    attempt for fixity failures and transient errors (timeouts, 5xx, 408/429,
    connection failures); a 404/410 is retried ``not_found_retries`` times.
    Each retry round tries the duplicates (lowest ``pri`` first) and then
    ``loc``.
    """

    def __init__(
        self,
        mirror: Mirror,
        resources: ResourceStore,
        fetcher: Fetcher,
        *,
        allowed_origins: Collection[str] | None,
        concurrency: int = 8,
        retries: int = 5,
        metadata_only: bool = False,
        use_duplicates: bool = True,
        hooks: Any = None,
        not_found_retries: int = 2,
        timeout: float = 30.0,
        max_resource_bytes: int = DEFAULT_MAX_RESOURCE_BYTES,
        backoff_initial: float = 0.2,
        backoff_max: float = 10.0,
        max_skew: float = DEFAULT_MAX_SKEW,
    ):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if retries < 0 or not_found_retries < 0:
            raise ValueError("retries must not be negative")
        self.mirror = mirror
        self.resources = resources
        self.fetcher = fetcher
        self.allowed_origins = (
            None if allowed_origins is None else frozenset(origin_of(o) for o in allowed_origins)
        )
        self.metadata_only = metadata_only
        self.hooks = hooks
        self.max_skew = max_skew
        self.transfer = Transfer(
            mirror,
            fetcher,
            allowed_origins=self.allowed_origins,
            concurrency=concurrency,
            retries=retries,
            not_found_retries=not_found_retries,
            use_duplicates=use_duplicates,
            timeout=timeout,
            max_resource_bytes=max_resource_bytes,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
        )
        self._tails: dict[str, asyncio.Future[Outcome]] = {}
        self._queued: dict[str, list[datetime]] = {}  # loc -> datetimes submitted
        self._pending: set[asyncio.Future[Any]] = set()  # of an Outcome, or a list of them
        # metadata_only: changes waiting to be recorded, by one task, in order.
        self._recorder = BatchRecorder(
            resources,
            vet=self._vet,
            confirms=self._confirms,
            reported=self._reported,
            hook=self._hook,
            hooks_present=lambda: self.hooks is not None,
            max_skew=max_skew,
        )
        # Plain confirmed deletions: a group per turn of the loop (.deletions).
        self._deletions = DeletionGroups(
            mirror,
            resources,
            vet=self._vet,
            fallback=lambda view, change: self._apply(
                view, change, functools.partial(self._newer_queued, view)
            ),
            report=self._report,
            hook=self._hook,
            hooks_present=lambda: self.hooks is not None,
        )
        # loc -> what _vet said: it depends on the loc and this applier's settings
        # only, and a catch-up vets the same few thousand locs tens of thousands of times.
        self._vetted: dict[str, tuple[Path | None, Failure | None]] = {}

    # -- ordering ---------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Submitted changes not finished yet (for back-pressure)."""
        return len(self._pending)

    def submit(
        self,
        change: Any,
        *,
        confirmed: bool = True,
        collection: str | None = None,
        reuse: bool = False,
        unordered: bool = False,
        body: bytes | None = None,
        view: ChangeView | None = None,
    ) -> asyncio.Future[Outcome]:
        """Queue ``change``; it runs after every earlier submitted change of its ``loc``.

        ``confirmed=False`` marks a change nobody vouched for (pushed without a
        signature): see the module docstring.  ``body``: the change's bytes at
        hand (a Change Dump package), written instead of a fetch if they verify
        against the change (:meth:`.transfer.Transfer.fetch`).  Raises :class:`InvalidChange` at
        once for an unusable object.  The returned future holds the
        :class:`Outcome` (or a local failure).  ``view``: ``change`` as
        :meth:`read_many` read it (with these ``collection`` and ``unordered``),
        so a walk reads each entry once.
        """
        if view is None:
            view = read_change(
                change,
                confirmed=confirmed,
                max_skew=self.max_skew,
                collection=collection,
                reuse=reuse,
                unordered=unordered,
            )
        if self.recordable(view) and view.loc not in self._tails:
            # An unconfirmed deletion takes the per-change path: it asks the Source.
            # So does a later change of its loc while it is there, to come after it.
            future: asyncio.Future[Outcome] = self._submit_record([view], [change], single=True)
            return future
        if self._groupable(view):
            # Its loc's tail until its group is done, like a task of its own.
            grouped = self._deletions.add(view, change)
            self._track(view, grouped)
            return grouped
        previous: asyncio.Future[Any] | None = self._tails.get(view.loc)
        if previous is None:
            # The batch recorder may hold this loc (metadata_only): after all it holds.
            previous = self._recorder.barrier()
        task = asyncio.get_running_loop().create_task(self._after(previous, view, change, body))
        self._track(view, task)
        return task

    def _groupable(self, view: ChangeView) -> bool:
        """A deletion :mod:`.deletions` may apply in a group: the Source's word, nothing queued.

        Confirmed and from a list read in order, so :meth:`_apply` asks the
        Source nothing unless the state says so (the group looks at the state
        and hands such a deletion back to :meth:`_apply`); nothing of its loc
        in flight, so it is the loc's next change.
        """
        return (
            view.change is ChangeType.DELETED
            and view.confirmed
            and not view.unordered
            and not self.metadata_only
            and view.loc not in self._tails
        )

    def _track(self, view: ChangeView, future: asyncio.Future[Outcome]) -> None:
        """Make ``future`` (``view``'s outcome) its loc's tail until it is done."""
        self._queued.setdefault(view.loc, []).append(view.datetime)
        self._tails[view.loc] = future
        self._pending.add(future)
        future.add_done_callback(functools.partial(self._finished, view))

    async def _after(
        self,
        previous: asyncio.Future[Any] | None,
        view: ChangeView,
        change: Any,
        body: bytes | None = None,
    ) -> Outcome:
        if previous is not None and not previous.done():
            # Its result or failure is its submitter's; this change only waits.
            # Shielded: cancelling this change (abandon()) must not cancel the one
            # it waits for, which may be another engine's, or the recorder's barrier.
            try:
                await asyncio.shield(previous)
            except Exception:
                pass
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this change is cancelled itself
        return await self._apply(view, change, functools.partial(self._newer_queued, view), body)

    def read_many(
        self, changes: list[Any], *, collection: str | None = None, unordered: bool = False
    ) -> list[ChangeView]:
        """``changes`` (confirmed: read from the Source) as :meth:`submit` reads each.

        For a walk of the Change Lists, which hands the same views to
        :meth:`settle_many`, :meth:`supersede_many` and :meth:`submit`: each
        entry read once instead of up to three times.
        """
        # One clock read for the skew check of the whole batch.
        return read_changes(
            changes,
            max_skew=self.max_skew,
            now=datetime.now(UTC),
            collection=collection,
            unordered=unordered,
        )

    async def settle_many(
        self, changes: list[Any], *, views: list[ChangeView] | None = None
    ) -> list[bool]:
        """Which of ``changes`` (read from the Source's Change Lists) need no work at all.

        A walk of the Change Lists re-reads what push already applied (push
        never moves the Destination's position, see rsnotify.subscriber.trust),
        and a task, a state read and an apply-log row per such entry made every
        walk, and every restart, cost as much as applying them again.  An entry
        exactly equal to its resource's state (same change time and type) is
        done; a provisional state it equals is confirmed here, a transaction
        per :data:`SETTLE_SLICE` of them.  So is every earlier entry of a resource
        whose last entry in ``changes`` is done: the mirror already holds a
        newer change the Source lists (a resource changed twice between two
        walks cost a superseded row, a task, a state read and a skipped row
        for what push had applied).  Only for resources with nothing queued
        in this applier (an earlier change in flight could still move the
        state), and never for a change dated beyond the clock-skew bound.
        """
        if self.metadata_only or not changes:  # the batch recorder is the cheap path there
            return [False] * len(changes)
        if views is None:
            views = [read_change(change, max_skew=self.max_skew) for change in changes]
        now = datetime.now(UTC)
        settled = [False] * len(views)
        done: dict[str, bool] = {}  # loc -> its last entry in the batch is done
        rows: list[tuple[tuple[Any, ...], int]] = []
        locs = [v.loc for v in views if v.loc not in self._queued]
        states = await self.resources.get_many(locs) if locs else {}
        if len(views) > SETTLE_SLICE:
            # The states of a thousand locs are a step of their own (made from the
            # cache's rows), not one with the first slice's decisions.
            await asyncio.sleep(0)
        # Decided in slices from the end, the loop given back between them: a
        # walk following push settles a thousand entries, and in one piece every
        # notification waited for it.  A state read before a slice may be older
        # than the store's by then, which costs nothing: an entry equal to a
        # state the resource had was applied; anything else is submitted and
        # decided by the applier on the state of the moment.
        for end in range(len(views), 0, -SETTLE_SLICE):
            start = max(0, end - SETTLE_SLICE)
            if end < len(views):
                await asyncio.sleep(0)
            for i in range(end - 1, start - 1, -1):  # each resource's last entry decides
                view = views[i]
                known = done.get(view.loc)
                if known is not None:
                    settled[i] = known
                    continue
                state = states.get(view.loc)
                if (
                    view.loc in self._queued
                    or state is None
                    or not same_change(state, view)
                    or beyond_skew(view.datetime, now, self.max_skew)
                ):
                    done[view.loc] = False  # every entry of this loc is applied in order
                    continue
                if not state.confirmed:
                    row = self.resources.row(
                        view.loc,
                        view.change,
                        view.datetime,
                        outcome=Outcome.CONFIRMED,
                        seq=view.seq,
                    )
                    rows.append((row, CONFIRM))
                done[view.loc] = settled[i] = True
        rows.reverse()  # in the order of the list
        for start in range(0, len(rows), SETTLE_SLICE):  # the cache's upkeep, sliced too
            await self.resources.record_rows(rows[start : start + SETTLE_SLICE])
        return settled

    async def supersede_many(self, changes: list[Any]) -> None:
        """Record ``changes`` as superseded, in one transaction, with no task or fetch each.

        For a walk of the Change Lists that holds a later change of each of
        these resources, submitted right after: :meth:`_apply` would only find
        that newer change queued and record :attr:`Outcome.SUPERSEDED` (no
        fetch, no hook), one task, state read, log line and transaction per
        change, which after a long outage was most of a catch-up's cost.  A
        deletion is superseded the same way, by the walk only (the later
        change is the Source's own word, and it writes or deletes the file):
        :meth:`_apply` still unlinks a confirmed deletion whatever is queued,
        since a queued pushed change may be forged.  The state is kept; never
        in ``metadata_only`` (every change is recorded there).  ``changes``
        may be views already read (:meth:`read_many`).
        """
        rows: list[tuple[tuple[Any, ...], int]] = []
        now = datetime.now(UTC)  # one stamp: one transaction
        for change in changes:
            view = (
                change
                if isinstance(change, ChangeView)
                else read_change(change, max_skew=self.max_skew)
            )
            if self.metadata_only:
                raise ValueError(f"{view.loc}: every change is recorded in metadata-only mode")
            row = self.resources.row(
                view.loc,
                view.change,
                view.datetime,
                outcome=Outcome.SUPERSEDED,
                seq=view.seq,
                detail="a newer change of the same walk is queued",
                applied_at=now,
            )
            rows.append((row, KEEP))
        if rows:
            await self.resources.record_rows(rows)
            log.info("%d change(s) superseded by newer ones of the same walk", len(rows))

    def recordable(self, view: ChangeView) -> bool:
        """metadata_only: ``view`` is a change the batch recorder records (:meth:`submit_many`)."""
        return self.metadata_only and (view.confirmed or view.change is not ChangeType.DELETED)

    def submit_many(
        self, views: list[ChangeView], changes: list[Any]
    ) -> asyncio.Future[list[Outcome]]:
        """metadata_only: record ``views`` (read from ``changes``) in order, one future for all.

        For a walk of the Change Lists, which submits thousands of changes at
        once: the same decisions and rows as :meth:`submit` per change (see
        :mod:`.recorder`), without a future and a pipeline slot each.
        Every view must be :meth:`recordable`.  The future holds the outcomes
        in the order given, once all of them are durable.  A chunk holding a
        ``loc`` whose unconfirmed deletion is still in flight goes change by
        change (:meth:`submit`), so that its change of the ``loc`` follows the
        deletion.  Rare (push and a walk meeting on one resource within one
        request to the Source); every other chunk stays one group.
        """
        if not all(self.recordable(view) for view in views):
            raise ValueError("submit_many takes only changes the batch recorder records")
        tails = self._tails
        if tails and any(view.loc in tails for view in views):
            # An unconfirmed deletion of one of these locs is in flight (it asks the
            # Source): each change goes where submit sends it, so that one comes after it.
            parts = [self.submit(c, view=v) for v, c in zip(views, changes, strict=True)]
            gathered = asyncio.gather(*parts)
            self._pending.add(gathered)
            gathered.add_done_callback(self._pending.discard)
            return gathered
        return self._submit_record(views, changes, single=False)

    def _submit_record(
        self, views: list[ChangeView], changes: list[Any], *, single: bool
    ) -> asyncio.Future[Any]:
        """metadata_only: queue for the batch recorder (:mod:`.recorder`), not a task per change."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        self._recorder.queue(views, changes, future, single)
        return future

    def _newer_queued(self, view: ChangeView) -> bool:
        """True when a change of the same loc with a later datetime waits in the queue.

        Submission order is not time order in general (a replay, a walk and
        push can interleave), so "queued after me" is not enough.  Never for a
        change from a list out of order: there a later time is not a later
        change, and the one queued may be the one the Source has moved past.
        """
        if view.unordered:
            return False
        return any(when > view.datetime for when in self._queued.get(view.loc, ()))

    def _finished(self, view: ChangeView, task: asyncio.Future[Outcome]) -> None:
        self._pending.discard(task)
        queued = self._queued.get(view.loc)
        if queued is not None:
            queued.remove(view.datetime)
            if not queued:
                del self._queued[view.loc]
        if self._tails.get(view.loc) is task:
            del self._tails[view.loc]
            self._recorder.forget(view.loc)  # it wrote the loc's state: the recorder reads it

    async def drain(self) -> None:
        """Wait until every submitted change has finished.

        Re-raises the first local failure (disk, resource store) among the
        changes it waited for, after all of them have finished.
        """
        first: BaseException | None = None
        while self._pending:
            done, _ = await asyncio.wait(list(self._pending))
            for task in done:
                if not task.cancelled() and task.exception() is not None and first is None:
                    first = task.exception()
        if first is not None:
            raise first

    async def abandon(self, futures: Collection[asyncio.Future[Any]] | None = None) -> None:
        """Cancel submitted changes and wait until none of them is still running.

        Used before an engine restarts from its durable cursor after a local
        failure: the restart resubmits those changes, and a straggler from
        before must not rename older bytes over what the restart wrote.

        ``futures`` limits this to the changes one submitter (an engine)
        holds; ``None`` abandons everything.  The applier is shared by every
        collection of a subscriber, and cancelling another collection's
        changes left that collection's pipeline waiting forever for them
        (the chaos matrix's disk-full scenario).
        """
        doomed = set(self._pending) if futures is None else set(futures) & self._pending
        groups = self._deletions.tasks_of(doomed)  # they would go on unlinking
        for future in doomed | groups:
            future.cancel()  # a walk chunk gathered from single submissions cancels each
        self._recorder.drop()
        if doomed or groups:
            await asyncio.wait(doomed | groups)
        await self.mirror.settle()

    # -- one change -------------------------------------------------------------

    async def apply(
        self, change: Any, *, confirmed: bool = True, collection: str | None = None
    ) -> Outcome:
        """Apply one change now (no ordering against other calls; see :meth:`submit`)."""
        view = read_change(
            change, confirmed=confirmed, max_skew=self.max_skew, collection=collection
        )
        return await self._apply(view, change, lambda: False)

    def _confirms(self, state: ResourceState | None, view: ChangeView) -> bool:
        """``view`` (trusted) is exactly the change a provisional state holds."""
        return (
            view.confirmed
            and state is not None
            and not state.confirmed
            and same_change(state, view)
        )

    async def _settled(self, view: ChangeView, state: ResourceState | None) -> Outcome | None:
        """CONFIRMED or SKIPPED_ALREADY_APPLIED (recorded) if nothing is left to do."""
        if self._confirms(state, view):
            await self.resources.record_confirmed(
                view.loc, view.change, view.datetime, seq=view.seq
            )
            return Outcome.CONFIRMED
        if already_applied(state, view, self.max_skew, recheck=not self.metadata_only):
            await self.resources.record_outcome(
                view.loc,
                view.change,
                view.datetime,
                seq=view.seq,
                outcome=Outcome.SKIPPED_ALREADY_APPLIED,
                confirmed=view.confirmed,
            )
            return Outcome.SKIPPED_ALREADY_APPLIED
        return None

    async def _apply(
        self, view: ChangeView, change: Any, superseded: Any, body: bytes | None = None
    ) -> Outcome:
        path, refusal = self._vet(view)
        if refusal is not None:
            return await self._report(view, change, refusal)
        assert path is not None
        state = await self.resources.get(view.loc)
        settled = await self._settled(view, state)
        if settled is not None:
            return settled
        recheck = None if self.metadata_only else to_recheck(state, view, self.max_skew)
        record = Record(view.datetime)
        if recheck == "provisional" and state is not None:
            # The Source bears this older change out, but the state it replaces
            # may be genuine and newer, or forged: keep the later time (the log
            # never goes back) and stay provisional (a forged time is never
            # promoted to a trusted one).
            record = Record(
                max(view.datetime, state.datetime),
                f"dated {view.datetime.isoformat()}, at or before an unconfirmed state "
                f"({state.datetime.isoformat()}): re-checked at the Source",
                confirmed=False,
            )
        if recheck == "back-dated" and state is not None:
            # The Source bears this change out now, but its date says otherwise:
            # the state keeps the newer time, so it never moves back.
            record = Record(
                state.datetime,
                f"dated {view.datetime.isoformat()}, before the state it replaces "
                f"({state.datetime.isoformat()}): re-checked at the Source",
            )
        if view.change is ChangeType.DELETED and (
            not view.confirmed or recheck or (view.unordered and not self.metadata_only)
        ):
            if superseded():  # whatever the newer change says is what the mirror gets
                return await self._report(
                    view, change, Failure(Outcome.SUPERSEDED, False, "a newer change is queued")
                )
            doubt = await self.transfer.confirm_gone(view, superseded)
            if doubt is not None:
                if doubt.outcome is Outcome.UNCONFIRMED and view.confirmed:
                    # Listed by the Source, and the Source has moved past it.
                    doubt = Failure(Outcome.OUTDATED, False, OUTDATED_DELETE)
                return await self._report(view, change, doubt)
        if self.metadata_only:
            await self._record(view, Outcome.RECORDED, record, sha256=view.hashes.get("sha-256"))
            await self._hook(view, change, path)
            return Outcome.RECORDED
        if view.change is ChangeType.DELETED:
            try:
                # Not a transfer slot: a delete waits for the mirror's next
                # write batch (tens of ms at 1,000 changes/s), and deletes
                # holding transfer slots for that long starved the fetches.
                async with self.transfer.held:
                    removed = await self.mirror.delete(path)
            except (UnsafePath, PathConflict) as exc:
                return await self._report(view, change, path_failure(exc))
            if not removed:
                record = replace(record, detail=record.detail or NO_FILE)
            await self._record(view, Outcome.DELETED, record)
            await self._hook(view, change, path)
            return Outcome.DELETED
        if superseded():
            # A newer change of this resource is queued behind this one: the
            # Source serves only the newest bytes, which that change fetches.
            # Fetching now would at best be overwritten and, after a long
            # outage, usually fail fixity (the resource has moved on).
            return await self._report(
                view, change, Failure(Outcome.SUPERSEDED, False, "a newer change is queued")
            )
        existing = state is not None and state.change is not ChangeType.DELETED
        if (view.reuse or recheck == "back-dated") and existing:
            held = await self.mirror.holds(path, view.length, view.hashes)
            if held is not None and recheck == "back-dated":  # nothing to roll anywhere
                return await self._report(
                    view, change, Failure(Outcome.SKIPPED_ALREADY_APPLIED, False, SAME_BYTES)
                )
            if held is not None:  # a re-baseline: these bytes are already here
                await self._record(view, Outcome.HELD, record, sha256=held, length=view.length)
                return Outcome.HELD
        result = await self.transfer.fetch(
            view,
            path,
            superseded,
            unless_sha256=state.sha256 if recheck == "provisional" and state else None,
            only_if_current=recheck == "back-dated",
            packaged=body,
        )
        if isinstance(result, Failure):
            return await self._report(view, change, result)
        written, url = result
        if url != view.loc:
            record = replace(record, detail=f"fetched from duplicate {url}")
        await self._record(
            view,
            Outcome.APPLIED,
            record,
            sha256=written.digests.get("sha-256"),
            length=written.length,
        )
        await self._hook(view, change, path)
        return Outcome.APPLIED

    async def _record(
        self,
        view: ChangeView,
        outcome: Outcome,
        record: Record,
        *,
        sha256: str | None = None,
        length: int | None = None,
    ) -> None:
        """Make ``view`` the state of its loc (at ``record.when``) and log ``outcome``."""
        await self.resources.record_applied(
            view.loc,
            view.change,
            record.when,
            seq=view.seq,
            sha256=sha256,
            length=length if length is not None else view.length,
            outcome=outcome,
            detail=record.detail,
            confirmed=view.confirmed if record.confirmed is None else record.confirmed,
            collection=view.collection,
        )

    async def apply_content(
        self,
        change: Any,
        chunks: Callable[[], AsyncIterable[bytes]],
        source: str,
        *,
        collection: str | None = None,
    ) -> Outcome:
        """Apply a created/updated change from bytes already at hand (a Resource Dump).

        The same rules as a fetch: origin and path vetted, an older change
        never overwrites a newer one, length and hashes verified before the
        atomic rename.  A failure is returned, not retried: the caller falls
        back to fetching ``loc``.  ``source`` names where the bytes came from
        (the apply log's detail).
        """
        view = read_change(change, max_skew=self.max_skew, collection=collection)
        path, refusal = self._vet(view)
        if refusal is not None:
            return await self._report(view, change, refusal)
        assert path is not None
        settled = await self._settled(view, await self.resources.get(view.loc))
        if settled is not None:
            return settled
        try:
            async with self.transfer.slots:
                written = await self.mirror.write_atomic(
                    path, chunks(), expected_length=view.length, expected_hashes=view.hashes
                )
        except (UnsafePath, PathConflict) as exc:
            return await self._report(view, change, path_failure(exc))
        except FixityMismatch as exc:
            return classify(exc, view).outcome  # the caller fetches loc instead
        record = Record(view.datetime, f"from {source}")
        await self._record(
            view,
            Outcome.APPLIED,
            record,
            sha256=written.digests.get("sha-256"),
            length=written.length,
        )
        await self._hook(view, change, path)
        return Outcome.APPLIED

    def _vet(self, view: ChangeView) -> tuple[Path | None, Failure | None]:
        """Origin first (a forged notification is refused as such), then the path.

        Remembered per loc (up to :data:`VET_CACHE_SIZE` of them, then forgotten
        all at once): the answer depends on nothing else.
        """
        answer = self._vetted.get(view.loc)
        if answer is None:
            answer = self._vet_now(view)
            if len(self._vetted) >= VET_CACHE_SIZE:
                self._vetted.clear()
            self._vetted[view.loc] = answer
        return answer

    def _vet_now(self, view: ChangeView) -> tuple[Path | None, Failure | None]:
        try:
            check_origin(view.loc, self.allowed_origins)
        except OriginNotAllowed as exc:
            return None, Failure(Outcome.REFUSED_ORIGIN, False, str(exc))
        except FetchError as exc:
            return None, Failure(Outcome.UNSAFE_PATH, False, str(exc))
        try:
            return self.mirror.path_for(view.loc), None
        except UnsafePath as exc:
            return None, Failure(Outcome.UNSAFE_PATH, False, str(exc))

    # -- reporting --------------------------------------------------------------

    async def _report(self, view: ChangeView, change: Any, failure: Failure) -> Outcome:
        await self.resources.record_outcome(
            view.loc,
            view.change,
            view.datetime,
            seq=view.seq,
            outcome=failure.outcome,
            detail=failure.detail,
        )
        return await self._reported(view, change, failure)

    async def _reported(self, view: ChangeView, change: Any, failure: Failure) -> Outcome:
        """Log a recorded failure and run ``on_failed`` for those that are not done."""
        if failure.outcome.done:
            log.info("%s %s: %s", view.loc, failure.outcome, failure.detail)
        else:
            log.warning(
                "%s not applied (%s): %s",
                view.loc,
                failure.outcome,
                failure.detail,
                extra={"loc": view.loc, "outcome": str(failure.outcome)},
            )
            await call_hook(self.hooks, "on_failed", change, failure.outcome, failure.detail)
        return failure.outcome

    async def _hook(self, view: ChangeView, change: Any, path: Path) -> None:
        await call_hook(self.hooks, f"on_{view.change.value}", change, path)
