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
  do (at most ``HELD_BODIES`` of the two together).  A change waiting out a
  retry backoff holds no slot.
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

Every outcome lands in the apply log.  Local failures (disk full, unwritable
mirror, broken resource store) are not outcomes: they raise
:class:`~.mirror.MirrorError` / :class:`~.resources.ResourceStoreError`, since
retrying the next resource cannot help.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import logging
from collections import deque
from collections.abc import AsyncIterable, Callable, Collection, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from ..backoff import Backoff
from ..errors import FetchError, RsNotifyError
from ..fetch import Fetcher, OriginNotAllowed, ResponseTooLarge, check_origin, origin_of
from ..model import ChangeType, parse_hashes
from .mirror import FixityMismatch, Mirror, PathConflict, UnsafePath, Written
from .resources import APPLY, CONFIRM, KEEP, ResourceState, ResourceStore
from .trust import DEFAULT_MAX_SKEW, beyond_skew

__all__ = ["Applier", "Hooks", "InvalidChange", "Outcome"]

log = logging.getLogger("rsnotify.subscribe")

DEFAULT_MAX_RESOURCE_BYTES = 1 << 30
RECORD_BATCH = 2_000  # metadata-only changes recorded per transaction
# Bodies of declared length up to this are read whole and handed to the
# mirror's batched writer (Mirror.write_bytes); larger or unsized ones stream
# to disk.  At most HELD_BODIES such bodies wait in memory for the disk.
IN_MEMORY_BYTES = 256 << 10
HELD_BODIES = 256
_RETRYABLE_STATUS = frozenset({408, 425, 429})
_OUTDATED_DELETE = "the Source still serves it: a newer change than this deletion was applied"
_OUTDATED_BYTES = "the Source serves what the mirror already holds from a newer change"
_NOT_SERVED = "the Source does not serve this older change now"
_SAME_BYTES = "older, and the mirror already holds its bytes"
_GONE_STATUS = frozenset({404, 410})


class InvalidChange(RsNotifyError):
    """An object handed to the applier lacks a usable loc, change or datetime."""


class Outcome(StrEnum):
    """What became of one change; the value is what the apply log records."""

    APPLIED = "applied"  # created/updated: fetched, verified, written
    DELETED = "deleted"  # deleted: file removed (or already absent)
    RECORDED = "recorded"  # metadata_only: state recorded, nothing fetched
    SKIPPED_ALREADY_APPLIED = "skipped_already_applied"
    CONFIRMED = "confirmed"  # the Change List lists the change a provisional state holds
    OUTDATED = "outdated"  # older than what the mirror holds, and the Source agrees with that
    HELD = "held"  # a baseline's resource the mirror already held, byte for byte
    SUPERSEDED = "superseded"  # failed, but a newer change of the loc is queued
    REFUSED_ORIGIN = "refused_origin"
    UNSAFE_PATH = "unsafe_path"
    PATH_CONFLICT = "path_conflict"
    HASH_MISMATCH = "hash_mismatch"
    LENGTH_MISMATCH = "length_mismatch"
    NOT_FOUND = "not_found"
    FETCH_FAILED = "fetch_failed"
    UNCONFIRMED = "unconfirmed"  # an unsigned deletion the Source does not confirm

    @property
    def done(self) -> bool:
        """True when nothing is left to do for this change (a cursor may pass it)."""
        return self in _DONE


_DONE = frozenset(
    {
        Outcome.APPLIED,
        Outcome.DELETED,
        Outcome.RECORDED,
        Outcome.SKIPPED_ALREADY_APPLIED,
        Outcome.CONFIRMED,
        Outcome.OUTDATED,
        Outcome.HELD,
        Outcome.SUPERSEDED,
    }
)
# What a back-dated change's fetch says when the Source has moved past it.
_NOT_CURRENT = frozenset({Outcome.NOT_FOUND, Outcome.HASH_MISMATCH, Outcome.LENGTH_MISMATCH})


@dataclass(slots=True)
class Hooks:
    """Optional callables run after a successful apply: ``fn(change, path)``.

    Any object with these attribute names works too (or a mapping of them).
    Sync and async callables are both accepted; a hook that raises is logged
    and does not change the outcome.  ``on_failed(change, outcome, detail)``
    runs for every outcome that is not :attr:`Outcome.done`.  Hooks of one
    resource run in the order its changes are applied.  With ``metadata_only``
    the hooks still run (that is how a Destination that fetches elsewhere
    learns of changes); ``path`` is then where the file would be.
    """

    on_created: Any = None
    on_updated: Any = None
    on_deleted: Any = None
    on_failed: Any = None


@dataclass(frozen=True, slots=True)
class _Change:
    """The fields the applier needs, read once from whatever object was given."""

    loc: str
    change: ChangeType
    datetime: datetime
    seq: int | None
    hashes: dict[str, str]
    length: int | None
    duplicates: tuple[str, ...]
    # False: nobody vouched for this change (pushed unsigned, or dated beyond
    # the allowed skew); its state is provisional and a deletion is checked.
    confirmed: bool = True
    collection: str | None = None  # recorded with the state: what a re-baseline compares
    # A baseline's change: the mirror may already hold these bytes (a re-baseline
    # after a coverage hole), so compare the file with the advertised digests first.
    reuse: bool = False
    # Read from a Change List out of forward chronological order (section 12.1):
    # its change time proves nothing about order, so the Source is asked instead.
    unordered: bool = False

    @property
    def identity(self) -> tuple[str, datetime, ChangeType]:
        return (self.loc, self.datetime, self.change)


def _read_change(
    obj: Any,
    *,
    confirmed: bool = True,
    max_skew: float | None = None,
    collection: str | None = None,
    reuse: bool = False,
    unordered: bool = False,
) -> _Change:
    loc = getattr(obj, "loc", None)
    if not isinstance(loc, str) or not loc:
        raise InvalidChange(f"change without a loc: {obj!r:.200}")
    try:
        kind = ChangeType(getattr(obj, "change", None))
    except ValueError:
        raise InvalidChange(f"{loc}: change is not created, updated or deleted") from None
    when = getattr(obj, "change_time", None)  # model.Entry: rs:md datetime, else lastmod
    if when is None:
        when = getattr(obj, "datetime", None)
    if not isinstance(when, datetime) or when.tzinfo is None:
        raise InvalidChange(f"{loc}: change without an aware datetime")
    seq = getattr(obj, "seq", None)
    length = getattr(obj, "length", None)
    if length is not None and (not isinstance(length, int) or length < 0):
        raise InvalidChange(f"{loc}: invalid length {length!r}")
    duplicates: list[tuple[int, str]] = []
    for link in getattr(obj, "links", None) or ():
        if isinstance(link, Mapping):
            rel, href, pri = link.get("rel"), link.get("href"), link.get("pri")
        else:
            rel, href, pri = (getattr(link, n, None) for n in ("rel", "href", "pri"))
        if rel == "duplicate" and isinstance(href, str) and href:
            duplicates.append((pri if isinstance(pri, int) else 999_999, href))
    duplicates.sort(key=lambda item: item[0])  # stable: document order among equals
    if max_skew is not None and beyond_skew(when, datetime.now(UTC), max_skew):
        confirmed = False
    return _Change(
        loc=loc,
        change=kind,
        datetime=when,
        seq=seq if isinstance(seq, int) else None,
        hashes=parse_hashes(getattr(obj, "hash", None)),
        length=length,
        duplicates=tuple(href for _, href in duplicates),
        confirmed=confirmed,
        collection=collection,
        reuse=reuse,
        unordered=unordered,
    )


_Queued = tuple[_Change, Any, "asyncio.Future[Outcome]"]


def _provisional(state: ResourceState, max_skew: float) -> bool:
    """A state whose datetime nobody vouched for (see :mod:`.trust`)."""
    return not state.confirmed or beyond_skew(state.datetime, datetime.now(UTC), max_skew)


def _same_change(state: ResourceState, change: _Change) -> bool:
    return state.datetime == change.datetime and state.change == change.change


def _flips(state: ResourceState, change: _Change) -> bool:
    """``change`` would make the resource exist where it does not, or vanish where it does."""
    return (state.change is ChangeType.DELETED) != (change.change is ChangeType.DELETED)


def _doubtful(state: ResourceState, change: _Change) -> bool:
    """An older change the Source should be asked about (see :func:`_to_recheck`)."""
    if _flips(state, change):
        return True
    if not change.unordered or change.change is ChangeType.DELETED or not change.hashes:
        return False
    digest = change.hashes.get("sha-256")
    return digest is None or state.sha256 is None or digest != state.sha256


def _already_applied(
    state: ResourceState | None, change: _Change, max_skew: float, *, recheck: bool = False
) -> bool:
    """Nothing to do for ``change`` given ``state`` (``recheck``: see :func:`_to_recheck`)."""
    if state is None:
        return False
    if _provisional(state, max_skew):
        # Its datetime may be forged: only the very same change counts as done.
        return _same_change(state, change)
    if state.datetime < change.datetime:
        return False
    if state.datetime > change.datetime:
        return not (recheck and _doubtful(state, change))
    if state.seq is not None and change.seq is not None:
        return state.seq >= change.seq
    return state.change == change.change


def _to_recheck(state: ResourceState | None, change: _Change, max_skew: float) -> str | None:
    """Why ``change``, older than what the mirror holds, must be checked at the Source.

    Two cases where a change time cannot be believed (Z39.99 section 12.1
    makes it the order of changes, but Sources get it wrong and forgers lie):

    * ``provisional``: the state came from a notification nobody vouched for
      (rsnotify.subscriber.trust); it may be forged, so an older change is not
      "already applied" but asked about.
    * ``back-dated``: the change would make the resource exist or vanish
      although the mirror holds a newer state.  resync 2.0.1 dates a deletion
      with the deleted file's old modification time, earlier than the
      baseline that still listed the file, and a file copied with its old
      time (``cp -p``) is a creation dated in the past; skipping either as
      "old" would keep the mirror wrong for ever.  The Source says whether
      the resource exists now (gone, or serving exactly the change's bytes);
      otherwise the change is outdated.  The state keeps the newer time.

    An older update of a resource that exists either way is skipped without
    a request, as before: which *bytes* are newer is what change times order
    (section 12.1), and a Source (or a cache in front of it) serving an old
    copy must not roll the mirror back.  Unless the change was read from a
    list out of order (``unordered``): its time orders nothing, so an older
    creation or update advertising other bytes than the mirror holds is
    applied if the Source serves exactly those bytes now (a ``cp -p`` copy
    dated by its old mtime), and a deletion, older or newer, only once the
    Source answers 404/410.
    """
    if state is None or _same_change(state, change):
        return None
    if _provisional(state, max_skew):
        return "provisional" if change.datetime <= state.datetime else None
    if change.datetime < state.datetime and _doubtful(state, change):
        return "back-dated"
    return None


class _AlreadyHeld(Exception):
    """The Source serves exactly the bytes the mirror holds (see ``unless_sha256``)."""


@dataclass(frozen=True, slots=True)
class _Record:
    """The time to record a change's state at, and the apply log's detail."""

    when: datetime
    detail: str | None = None


@dataclass(slots=True)
class _Failure:
    outcome: Outcome
    retryable: bool
    detail: str


def _path_failure(exc: UnsafePath | PathConflict) -> _Failure:
    outcome = Outcome.PATH_CONFLICT if isinstance(exc, PathConflict) else Outcome.UNSAFE_PATH
    return _Failure(outcome, False, str(exc))


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
        self.concurrency = concurrency
        self.retries = retries
        self.not_found_retries = not_found_retries
        self.metadata_only = metadata_only
        self.use_duplicates = use_duplicates
        self.hooks = hooks
        self.timeout = timeout
        self.max_resource_bytes = max_resource_bytes
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.max_skew = max_skew
        self._semaphore = asyncio.Semaphore(concurrency)
        self._held = asyncio.Semaphore(max(HELD_BODIES, concurrency))
        self._tails: dict[str, asyncio.Task[Outcome]] = {}
        self._queued: dict[str, list[datetime]] = {}  # loc -> datetimes submitted
        self._pending: set[asyncio.Future[Outcome]] = set()
        # metadata_only: changes waiting to be recorded, by one task, in order.
        self._batch: deque[_Queued] = deque()
        self._batcher: asyncio.Task[None] | None = None

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
    ) -> asyncio.Future[Outcome]:
        """Queue ``change``; it runs after every earlier submitted change of its ``loc``.

        ``confirmed=False`` marks a change nobody vouched for (pushed without a
        signature): see the module docstring.  Raises :class:`InvalidChange` at
        once for an unusable object.  The returned future holds the
        :class:`Outcome` (or a local failure).
        """
        view = _read_change(
            change,
            confirmed=confirmed,
            max_skew=self.max_skew,
            collection=collection,
            reuse=reuse,
            unordered=unordered,
        )
        if self.metadata_only and (view.confirmed or view.change is not ChangeType.DELETED):
            # An unconfirmed deletion takes the per-change path: it asks the Source.
            return self._submit_record(view, change)
        previous = self._tails.get(view.loc)
        self._queued.setdefault(view.loc, []).append(view.datetime)
        task = asyncio.get_running_loop().create_task(self._after(previous, view, change))
        self._tails[view.loc] = task
        self._pending.add(task)
        task.add_done_callback(functools.partial(self._finished, view))
        return task

    async def _after(
        self, previous: asyncio.Task[Outcome] | None, view: _Change, change: Any
    ) -> Outcome:
        if previous is not None and not previous.done():
            # Its result or failure is its submitter's; this change only waits.
            try:
                await previous
            except Exception:
                pass
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this change is cancelled itself
        return await self._apply(view, change, functools.partial(self._newer_queued, view))

    async def settle_many(self, changes: list[Any]) -> list[bool]:
        """Which of ``changes`` (read from the Source's Change Lists) need no work at all.

        A walk of the Change Lists re-reads what push already applied (push
        never moves the Destination's position, see rsnotify.subscriber.trust),
        and a task, a state read and an apply-log row per such entry made every
        walk, and every restart, cost as much as applying them again.  An entry
        exactly equal to its resource's state (same change time and type) is
        done; a provisional state it equals is confirmed here, in one
        transaction for the batch.  Only for resources with nothing queued in
        this applier (an earlier change in flight could still move the state),
        and never for a change dated beyond the clock-skew bound.
        """
        if self.metadata_only or not changes:  # the batch recorder is the cheap path there
            return [False] * len(changes)
        views = [_read_change(change, max_skew=self.max_skew) for change in changes]
        locs = [v.loc for v in views if v.loc not in self._queued]
        states = await self.resources.get_many(locs) if locs else {}
        now = datetime.now(UTC)
        settled: list[bool] = []
        busy: set[str] = set()
        rows: list[tuple[tuple[Any, ...], int]] = []
        for view in views:
            state = states.get(view.loc)
            if (
                view.loc in self._queued
                or view.loc in busy
                or state is None
                or not _same_change(state, view)
                or beyond_skew(view.datetime, now, self.max_skew)
            ):
                busy.add(view.loc)  # a later entry of this loc waits behind this one
                settled.append(False)
                continue
            if not state.confirmed:
                row = self.resources.row(
                    view.loc, view.change, view.datetime, outcome=Outcome.CONFIRMED, seq=view.seq
                )
                rows.append((row, CONFIRM))
            settled.append(True)
        if rows:
            await self.resources.record_rows(rows)
        return settled

    def _submit_record(self, view: _Change, change: Any) -> asyncio.Future[Outcome]:
        """metadata_only: queue for the batch recorder instead of a task per change.

        Nothing is fetched, so there is nothing to run concurrently: one task
        records queued changes in submission order (per-resource order holds
        trivially), a batch per transaction, which is what lets a catch-up of
        tens of thousands of changes finish in seconds.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        self._batch.append((view, change, future))
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        if self._batcher is None or self._batcher.done():
            self._batcher = loop.create_task(self._record_batches())
        return future

    async def _record_batches(self) -> None:
        while self._batch:
            batch = [self._batch.popleft() for _ in range(min(RECORD_BATCH, len(self._batch)))]
            try:
                await self._record_batch(batch)
            except Exception as exc:  # a local failure: the store cannot be written
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
            except BaseException:  # cancelled: nothing left will be recorded
                for _, _, future in [*batch, *self._batch]:
                    future.cancel()
                self._batch.clear()
                raise

    async def _record_batch(self, batch: list[_Queued]) -> None:
        store = self.resources
        vetted = [self._vet(view) for view, _, _ in batch]
        states = await store.get_many(
            [view.loc for (view, _, _), (_, refusal) in zip(batch, vetted, strict=True)
             if refusal is None]
        )  # fmt: skip
        rows: list[tuple[tuple[Any, ...], int]] = []
        plan: list[tuple[Outcome, _Failure | None]] = []
        for (view, _, _), (_, refusal) in zip(batch, vetted, strict=True):
            state = states.get(view.loc)
            if refusal is not None:
                outcome, update = refusal.outcome, KEEP
            elif self._confirms(state, view):
                outcome, update = Outcome.CONFIRMED, CONFIRM
            elif _already_applied(state, view, self.max_skew):
                outcome, update = Outcome.SKIPPED_ALREADY_APPLIED, KEEP
            else:
                outcome, update = Outcome.RECORDED, APPLY
            row = store.row(
                view.loc,
                view.change,
                view.datetime,
                outcome=outcome,
                seq=view.seq,
                sha256=view.hashes.get("sha-256") if update == APPLY else None,
                length=view.length if update == APPLY else None,
                detail=refusal.detail if refusal is not None else None,
                confirmed=view.confirmed,
            )
            rows.append((row, update))
            plan.append((outcome, refusal))
            if update == CONFIRM and state is not None:
                states[view.loc] = replace(state, confirmed=True)
            elif update == APPLY and (
                state is None
                or view.datetime >= state.datetime
                or _provisional(state, self.max_skew)
            ):
                states[view.loc] = ResourceState(
                    loc=view.loc,
                    change=view.change,
                    datetime=view.datetime,
                    seq=view.seq,
                    sha256=None,
                    length=None,
                    applied_at=view.datetime,
                    confirmed=view.confirmed,
                )
        await store.record_rows(rows)
        for (view, change, future), (path, _), (outcome, refusal) in zip(
            batch, vetted, plan, strict=True
        ):
            if refusal is not None:
                await self._reported(view, change, refusal)
            elif outcome is Outcome.RECORDED:
                assert path is not None
                await self._hook(view, change, path)
            if not future.done():
                future.set_result(outcome)

    def _newer_queued(self, view: _Change) -> bool:
        """True when a change of the same loc with a later datetime waits in the queue.

        Submission order is not time order in general (a replay, a walk and
        push can interleave), so "queued after me" is not enough.  Never for a
        change from a list out of order: there a later time is not a later
        change, and the one queued may be the one the Source has moved past.
        """
        if view.unordered:
            return False
        return any(when > view.datetime for when in self._queued.get(view.loc, ()))

    def _finished(self, view: _Change, task: asyncio.Task[Outcome]) -> None:
        self._pending.discard(task)
        queued = self._queued.get(view.loc)
        if queued is not None:
            queued.remove(view.datetime)
            if not queued:
                del self._queued[view.loc]
        if self._tails.get(view.loc) is task:
            del self._tails[view.loc]

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

    async def abandon(self, futures: Collection[asyncio.Future[Outcome]] | None = None) -> None:
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
        kept: deque[_Queued] = deque()
        for item in self._batch:
            if item[2] in doomed:
                item[2].cancel()
            else:
                kept.append(item)
        self._batch = kept
        for future in doomed:
            future.cancel()
        if doomed:
            await asyncio.wait(doomed)
        await self.mirror.settle()

    # -- one change -------------------------------------------------------------

    async def apply(
        self, change: Any, *, confirmed: bool = True, collection: str | None = None
    ) -> Outcome:
        """Apply one change now (no ordering against other calls; see :meth:`submit`)."""
        view = _read_change(
            change, confirmed=confirmed, max_skew=self.max_skew, collection=collection
        )
        return await self._apply(view, change, lambda: False)

    def _confirms(self, state: ResourceState | None, view: _Change) -> bool:
        """``view`` (trusted) is exactly the change a provisional state holds."""
        return (
            view.confirmed
            and state is not None
            and not state.confirmed
            and _same_change(state, view)
        )

    async def _settled(self, view: _Change, state: ResourceState | None) -> Outcome | None:
        """CONFIRMED or SKIPPED_ALREADY_APPLIED (recorded) if nothing is left to do."""
        if self._confirms(state, view):
            await self.resources.record_confirmed(
                view.loc, view.change, view.datetime, seq=view.seq
            )
            return Outcome.CONFIRMED
        if _already_applied(state, view, self.max_skew, recheck=not self.metadata_only):
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

    async def _apply(self, view: _Change, change: Any, superseded: Any) -> Outcome:
        path, refusal = self._vet(view)
        if refusal is not None:
            return await self._report(view, change, refusal)
        assert path is not None
        state = await self.resources.get(view.loc)
        settled = await self._settled(view, state)
        if settled is not None:
            return settled
        recheck = None if self.metadata_only else _to_recheck(state, view, self.max_skew)
        record = _Record(view.datetime)
        if recheck == "back-dated" and state is not None:
            # The Source bears this change out now, but its date says otherwise:
            # the state keeps the newer time, so it never moves back.
            record = _Record(
                state.datetime,
                f"dated {view.datetime.isoformat()}, before the state it replaces "
                f"({state.datetime.isoformat()}): re-checked at the Source",
            )
        if view.change is ChangeType.DELETED and (
            not view.confirmed or recheck or (view.unordered and not self.metadata_only)
        ):
            if superseded():  # whatever the newer change says is what the mirror gets
                return await self._report(
                    view, change, _Failure(Outcome.SUPERSEDED, False, "a newer change is queued")
                )
            doubt = await self._confirm_gone(view, superseded)
            if doubt is not None:
                if doubt.outcome is Outcome.UNCONFIRMED and view.confirmed:
                    # Listed by the Source, and the Source has moved past it.
                    doubt = _Failure(Outcome.OUTDATED, False, _OUTDATED_DELETE)
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
                async with self._held:
                    removed = await self.mirror.delete(path)
            except (UnsafePath, PathConflict) as exc:
                return await self._report(view, change, _path_failure(exc))
            if not removed:
                record = _Record(record.when, record.detail or "no file to remove")
            await self._record(view, Outcome.DELETED, record)
            await self._hook(view, change, path)
            return Outcome.DELETED
        if superseded():
            # A newer change of this resource is queued behind this one: the
            # Source serves only the newest bytes, which that change fetches.
            # Fetching now would at best be overwritten and, after a long
            # outage, usually fail fixity (the resource has moved on).
            return await self._report(
                view, change, _Failure(Outcome.SUPERSEDED, False, "a newer change is queued")
            )
        existing = state is not None and state.change is not ChangeType.DELETED
        if (view.reuse or recheck == "back-dated") and existing:
            held = await self.mirror.holds(path, view.length, view.hashes)
            if held is not None and recheck == "back-dated":  # nothing to roll anywhere
                return await self._report(
                    view, change, _Failure(Outcome.SKIPPED_ALREADY_APPLIED, False, _SAME_BYTES)
                )
            if held is not None:  # a re-baseline: these bytes are already here
                await self._record(view, Outcome.HELD, record, sha256=held, length=view.length)
                return Outcome.HELD
        result = await self._fetch(
            view,
            path,
            superseded,
            unless_sha256=state.sha256 if recheck == "provisional" and state else None,
            only_if_current=recheck == "back-dated",
        )
        if isinstance(result, _Failure):
            return await self._report(view, change, result)
        written, url = result
        if url != view.loc:
            record = _Record(record.when, f"fetched from duplicate {url}")
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
        view: _Change,
        outcome: Outcome,
        record: _Record,
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
            confirmed=view.confirmed,
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
        view = _read_change(change, max_skew=self.max_skew, collection=collection)
        path, refusal = self._vet(view)
        if refusal is not None:
            return await self._report(view, change, refusal)
        assert path is not None
        settled = await self._settled(view, await self.resources.get(view.loc))
        if settled is not None:
            return settled
        try:
            async with self._semaphore:
                written = await self.mirror.write_atomic(
                    path, chunks(), expected_length=view.length, expected_hashes=view.hashes
                )
        except (UnsafePath, PathConflict) as exc:
            return await self._report(view, change, _path_failure(exc))
        except FixityMismatch as exc:
            return self._classify(exc, view).outcome  # the caller fetches loc instead
        record = _Record(view.datetime, f"from {source}")
        await self._record(
            view,
            Outcome.APPLIED,
            record,
            sha256=written.digests.get("sha-256"),
            length=written.length,
        )
        await self._hook(view, change, path)
        return Outcome.APPLIED

    def _vet(self, view: _Change) -> tuple[Path | None, _Failure | None]:
        """Origin first (a forged notification is refused as such), then the path."""
        try:
            check_origin(view.loc, self.allowed_origins)
        except OriginNotAllowed as exc:
            return None, _Failure(Outcome.REFUSED_ORIGIN, False, str(exc))
        except FetchError as exc:
            return None, _Failure(Outcome.UNSAFE_PATH, False, str(exc))
        try:
            return self.mirror.path_for(view.loc), None
        except UnsafePath as exc:
            return None, _Failure(Outcome.UNSAFE_PATH, False, str(exc))

    def _candidates(self, view: _Change) -> list[str]:
        urls: list[str] = []
        if self.use_duplicates:
            for href in view.duplicates:
                try:
                    check_origin(href, self.allowed_origins)
                except FetchError as exc:
                    log.info("not using duplicate %s of %s: %s", href, view.loc, exc)
                    continue
                if href != view.loc and href not in urls:
                    urls.append(href)
        urls.append(view.loc)
        return urls

    async def _fetch(
        self,
        view: _Change,
        path: Path,
        superseded: Any,
        *,
        unless_sha256: str | None = None,
        only_if_current: bool = False,
    ) -> tuple[Written, str] | _Failure:
        """Try duplicates then ``loc``, in rounds with backoff, until one verifies.

        ``unless_sha256``: the digest of what the mirror holds from a newer,
        provisional change; a body with that digest means the Source agrees
        with the mirror, and nothing is written (:attr:`Outcome.OUTDATED`).
        ``only_if_current``: a back-dated change, applied only if the Source
        serves exactly its bytes now; a 404/410 or other bytes mean it is
        outdated (:attr:`Outcome.OUTDATED`, at once), not a failure to retry.
        """
        candidates = self._candidates(view)
        backoff = Backoff(initial=self.backoff_initial, maximum=self.backoff_max)
        rounds = not_found = 0
        while True:
            failure: _Failure | None = None
            for url in list(candidates):
                try:
                    return await self._fetch_one(url, view, path, unless_sha256), url
                except _AlreadyHeld:
                    return _Failure(Outcome.OUTDATED, False, _OUTDATED_BYTES)
                except (UnsafePath, PathConflict) as exc:  # about the path: no URL can help
                    return _path_failure(exc)
                except (FetchError, FixityMismatch) as exc:
                    failure = self._classify(exc, view)
                    if only_if_current and failure.outcome in _NOT_CURRENT and url == view.loc:
                        return _Failure(Outcome.OUTDATED, False, f"{_NOT_SERVED}: {exc}")
                log.info(
                    "fetching %s for %s failed (%s): %s",
                    url,
                    view.loc,
                    failure.outcome,
                    failure.detail,
                    extra={"loc": view.loc, "outcome": str(failure.outcome)},
                )
                if not failure.retryable:
                    if url == view.loc:
                        return failure
                    candidates.remove(url)
            assert failure is not None  # the loop ended with loc failing
            if failure.outcome is Outcome.NOT_FOUND:
                not_found += 1
                if not_found > self.not_found_retries:
                    return self._maybe_superseded(failure, superseded)
            rounds += 1
            if rounds > self.retries:
                return self._maybe_superseded(failure, superseded)
            if superseded():
                return _Failure(Outcome.SUPERSEDED, False, failure.detail)
            await asyncio.sleep(backoff.next())
            if superseded():  # a newer change arrived while this one waited
                return _Failure(Outcome.SUPERSEDED, False, failure.detail)

    async def _confirm_gone(self, view: _Change, superseded: Any) -> _Failure | None:
        """None once the Source answers 404/410 for ``loc``; else why the file stays.

        A deletion nobody vouched for must not remove a file the Source still
        serves (a forged notification on a broker without ACLs, a replayed old
        one): the Source is asked, with the same retries as a fetch.  A
        deletion that is genuine but quickly followed by a re-creation is
        refused too, correctly: the catch-up this causes finds both.
        """
        backoff = Backoff(initial=self.backoff_initial, maximum=self.backoff_max)
        for attempt in range(self.retries + 1):
            try:
                async with (
                    self._semaphore,
                    self.fetcher.stream(
                        view.loc,
                        max_bytes=self.max_resource_bytes,
                        timeout=self.timeout,
                        allowed_origins=self.allowed_origins,
                    ) as stream,
                ):
                    status = stream.result.status
                return _Failure(
                    Outcome.UNCONFIRMED,
                    False,
                    f"the Source still serves it (HTTP {status}): a deletion pushed without a "
                    "signature is applied only once the Source answers 404 or 410",
                )
            except FetchError as exc:
                if exc.status in _GONE_STATUS:
                    return None
                failure = self._classify(exc, view)
                if not failure.retryable or attempt == self.retries:
                    return failure
            if superseded():
                return _Failure(Outcome.SUPERSEDED, False, "a newer change is queued")
            await asyncio.sleep(backoff.next())
        raise AssertionError("unreachable")  # the loop returns on its last attempt

    @staticmethod
    def _maybe_superseded(failure: _Failure, superseded: Any) -> _Failure:
        if superseded():
            return _Failure(Outcome.SUPERSEDED, False, failure.detail)
        return failure

    async def _fetch_one(
        self, url: str, view: _Change, path: Path, unless_sha256: str | None = None
    ) -> Written:
        limit = view.length if view.length is not None else self.max_resource_bytes
        async with self._held:
            # Only transfers hold a slot: a change waiting out a backoff does not.
            async with (
                self._semaphore,
                self.fetcher.stream(
                    url,
                    max_bytes=limit,
                    timeout=self.timeout,
                    allowed_origins=self.allowed_origins,
                ) as stream,
            ):
                declared = stream.length
                if declared is None or declared > IN_MEMORY_BYTES:
                    return await self.mirror.write_atomic(
                        path, stream, expected_length=view.length, expected_hashes=view.hashes
                    )
                data = await stream.read()
            if unless_sha256 is not None and hashlib.sha256(data).hexdigest() == unless_sha256:
                raise _AlreadyHeld
            # Small and of known size (nearly every resource): the transfer is
            # over, so its slot goes to the next fetch while these bytes wait
            # for the mirror's next write batch (verify, write, fsync, rename:
            # one round of fsyncs for every write queued meanwhile).  Holding
            # the slot instead capped the rate at ``concurrency`` writes per
            # round of fsyncs.
            return await self.mirror.write_bytes(
                path, data, expected_length=view.length, expected_hashes=view.hashes
            )

    @staticmethod
    def _classify(exc: FetchError | FixityMismatch, view: _Change) -> _Failure:
        detail = str(exc)
        if isinstance(exc, FixityMismatch):
            outcome = Outcome.LENGTH_MISMATCH if exc.length_mismatch else Outcome.HASH_MISMATCH
            return _Failure(outcome, True, detail)
        if isinstance(exc, OriginNotAllowed):  # a redirect off the allowed origins
            return _Failure(Outcome.REFUSED_ORIGIN, False, detail)
        if isinstance(exc, ResponseTooLarge):
            if view.length is not None:
                return _Failure(Outcome.LENGTH_MISMATCH, True, detail)
            return _Failure(Outcome.FETCH_FAILED, False, detail)
        status = exc.status
        if status in _GONE_STATUS:
            return _Failure(Outcome.NOT_FOUND, True, detail)
        retryable = status is None or status >= 500 or status in _RETRYABLE_STATUS
        return _Failure(Outcome.FETCH_FAILED, retryable, detail)

    # -- reporting --------------------------------------------------------------

    async def _report(self, view: _Change, change: Any, failure: _Failure) -> Outcome:
        await self.resources.record_outcome(
            view.loc,
            view.change,
            view.datetime,
            seq=view.seq,
            outcome=failure.outcome,
            detail=failure.detail,
        )
        return await self._reported(view, change, failure)

    async def _reported(self, view: _Change, change: Any, failure: _Failure) -> Outcome:
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
            await self._call("on_failed", change, failure.outcome, failure.detail)
        return failure.outcome

    async def _hook(self, view: _Change, change: Any, path: Path) -> None:
        await self._call(f"on_{view.change.value}", change, path)

    async def _call(self, name: str, *args: Any) -> None:
        hooks = self.hooks
        if hooks is None:
            return
        fn = hooks.get(name) if isinstance(hooks, Mapping) else getattr(hooks, name, None)
        if fn is None:
            return
        try:
            result = fn(*args)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("%s hook failed", name)
