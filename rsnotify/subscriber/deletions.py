"""Confirmed deletions applied a group at a time: one state read, one mirror batch, one transaction.

A walk of the Change Lists after a long outage holds thousands of
deletions (7,380 of the 9,504 changes left to apply after superseding, in
bench.e2e's 50,000-change catch-up), most of resources created and deleted
while the Destination was away, whose files were never written.  Each
went the per-change way (:meth:`.applier.Applier._apply`): a task, a state
read, a place in the mirror's write queue, a row through the store's group
commit, a hook call, a future resolved, all for an unlink that finds
nothing.  Here the deletions submitted in one turn of the event loop run
as one group: the states read together, the unlinks queued together
(:meth:`.mirror.Mirror.delete_many`: the mirror's batches, a thread hop per
batch), the rows written together (one group commit), then the hooks, per
change, after the rows are durable, as for one deletion, and side by side,
as the per-change tasks ran them (a hook that waits on the network must not
make seven thousand of them wait in turn).

Only *plain* deletions are grouped: the Source's own word (confirmed, from
a list read in order) about a resource the mirror holds nothing newer of
(no state, or an older one).  For those :meth:`~.applier.Applier._apply`
would neither settle nor ask the Source anything: it would unlink and
record.  Whatever else a state makes of a deletion (already applied, a
provisional state to confirm, a back-dated deletion to check with the
Source) and a ``loc`` refused by its origin or path goes the per-change
way, from here, so the group never decides what the applier decides.
The applier keeps the per-``loc`` order: a grouped deletion is its
``loc``'s tail until its group is done, and only a ``loc`` with nothing
queued joins a group.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .mirror import Mirror, PathConflict, UnsafePath
from .resources import APPLY, ResourceStore
from .rules import ChangeView, Failure, Outcome, path_failure

__all__ = ["DeletionGroups"]

NO_FILE = "no file to remove"

# What the group hands back to the applier: the per-change path for one change
# (it records its own outcome), a failure report, and the hooks of a deletion.
Fallback = Callable[[ChangeView, Any], Awaitable[Outcome]]
Report = Callable[[ChangeView, Any, Failure], Awaitable[Outcome]]
Hook = Callable[[ChangeView, Any, Path], Awaitable[None]]
Vet = Callable[[ChangeView], tuple[Path | None, Failure | None]]


@dataclass(slots=True)
class _Item:
    view: ChangeView
    change: Any
    future: asyncio.Future[Outcome]
    path: Path | None = None


class DeletionGroups:
    """Collects deletions submitted in one turn of the loop and applies each group as one.

    :meth:`add` answers a future per deletion at once; the group starts on
    the loop's next turn, so every deletion submitted without an await in
    between (a walk submits a whole pass that way) shares it.
    """

    def __init__(
        self,
        mirror: Mirror,
        resources: ResourceStore,
        *,
        vet: Vet,
        fallback: Fallback,
        report: Report,
        hook: Hook,
        hooks_present: Callable[[], bool],
    ) -> None:
        self.mirror = mirror
        self.resources = resources
        self._vet = vet
        self._fallback = fallback
        self._report = report
        self._hook = hook
        self._hooks_present = hooks_present
        self._open: list[_Item] = []  # the group of this turn of the loop, not started yet
        self._running: dict[asyncio.Future[Outcome], asyncio.Task[None]] = {}

    def add(self, view: ChangeView, change: Any) -> asyncio.Future[Outcome]:
        """Queue a plain deletion (see the module docstring); its future holds the outcome."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        if not self._open:
            loop.call_soon(self._start)
        self._open.append(_Item(view, change, future))
        return future

    def tasks_of(self, futures: Collection[asyncio.Future[Any]]) -> set[asyncio.Task[None]]:
        """The running groups that hold any of ``futures`` (to cancel and wait for)."""
        running = self._running
        return {running[f] for f in futures if f in running}

    def _start(self) -> None:
        items = [item for item in self._open if not item.future.done()]  # not abandoned
        self._open = []
        if not items:
            return
        task = asyncio.get_running_loop().create_task(self._run(items))
        for item in items:
            self._running[item.future] = task
            item.future.add_done_callback(self._forget)

    def _forget(self, future: asyncio.Future[Outcome]) -> None:
        self._running.pop(future, None)

    async def _run(self, items: list[_Item]) -> None:
        """Apply ``items``; every future is answered whatever happens (or cancelled with it)."""
        others: list[asyncio.Future[Outcome]] = []
        try:
            try:
                plain = await self._sort(items, others)
            except Exception as exc:  # the store cannot be read: a local failure of each
                _fail(items, exc)
                return
            if plain:
                try:
                    await self._delete(plain)
                except Exception as exc:  # the store cannot be written: each unanswered fails
                    _fail(plain, exc)
            if others:
                await asyncio.gather(*others, return_exceptions=True)
        except asyncio.CancelledError:  # abandoned (Applier.abandon): so is every change of it
            for item in items:
                item.future.cancel()
            for other in others:
                other.cancel()
            raise

    async def _sort(self, items: list[_Item], others: list[asyncio.Future[Outcome]]) -> list[_Item]:
        """The plain deletions of ``items``; the others are handed to the per-change path."""
        states = await self.resources.get_many([item.view.loc for item in items])
        plain: list[_Item] = []
        for item in items:
            if item.future.done():
                continue
            view = item.view
            path, refusal = self._vet(view)
            state = states.get(view.loc)
            if refusal is None and (state is None or state.datetime < view.datetime):
                item.path = path
                plain.append(item)
            else:
                task = asyncio.ensure_future(self._fallback(view, item.change))
                task.add_done_callback(functools.partial(_copy, target=item.future))
                others.append(task)
        return plain

    async def _delete(self, plain: list[_Item]) -> None:
        """Unlink, record in one transaction, run the hooks, answer each future."""
        paths = [item.path for item in plain]
        assert all(path is not None for path in paths)
        results = await self.mirror.delete_many([p for p in paths if p is not None])
        rows: list[tuple[tuple[Any, ...], int]] = []
        done: list[_Item] = []
        for item, result in zip(plain, results, strict=True):
            view = item.view
            if isinstance(result, (UnsafePath, PathConflict)):
                outcome = await self._report(view, item.change, path_failure(result))
                _answer(item.future, outcome)
            elif isinstance(result, BaseException):  # a local failure: this change's
                if not item.future.done():
                    item.future.set_exception(result)
            else:
                row = self.resources.row(
                    view.loc,
                    view.change,
                    view.datetime,
                    outcome=Outcome.DELETED,
                    seq=view.seq,
                    detail=None if result else NO_FILE,
                    confirmed=view.confirmed,
                    collection=view.collection,
                )
                rows.append((row, APPLY))
                done.append(item)
        if not rows:
            return
        await self.resources.record_rows(rows)
        if self._hooks_present():
            await asyncio.gather(
                *(self._hook(i.view, i.change, i.path) for i in done if i.path is not None)
            )
        for item in done:
            _answer(item.future, Outcome.DELETED)


def _fail(items: list[_Item], exc: Exception) -> None:
    for item in items:
        if not item.future.done():
            item.future.set_exception(exc)


def _answer(future: asyncio.Future[Outcome], outcome: Outcome) -> None:
    if not future.done():
        future.set_result(outcome)


def _copy(source: asyncio.Future[Outcome], *, target: asyncio.Future[Outcome]) -> None:
    """Answer ``target`` as ``source`` ended (the per-change path run for a grouped deletion)."""
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (exc := source.exception()) is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())
