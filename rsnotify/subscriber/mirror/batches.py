"""Batched writes: small bodies already in memory, and deletes, group-committed by a writer thread.

Why batches: at 1,000 small resources a second, one thread job per file
(each woken, each fsyncing alone) cost more CPU in context switches and
journal commits than the bytes themselves.  Writes and deletes that arrive
together are verified and staged by one job in a writer thread, then go
through the same commit as a streamed write (:func:`.commit.commit`), phase
by phase across the batch.  A delete is a rename's worth of work there (an
unlink, then the directory fsync it shares with the batch); a thread hop of
its own per delete cost more than that.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .commit import commit, open_target, prepare_write, release
from .durability import WRITERS, Durability
from .errors import MirrorError
from .fixity import HASHLIB_NAMES, Written, verify
from .replace import ReplaceStrategy, Staged
from .safedirs import OpenedDirs

__all__ = ["BatchWriter"]


@dataclass(frozen=True, slots=True, eq=False)
class _Write:
    """One queued write (``data``), or (``data`` None) delete, and the future its caller awaits."""

    names: tuple[str, ...]
    path: Path | str
    future: asyncio.Future[Any]
    data: bytes | None = None
    expected_length: int | None = None
    expected: Mapping[str, str] | None = None
    algos: tuple[str, ...] = ()


class BatchWriter:
    """Queues writes and deletes under ``root`` and runs them in batches, at most :data:`WRITERS`.

    A path already in a batch in flight waits for it, so writes of one path
    are never reordered, even across concurrent batches; so does a second
    write of one path within the queue.  Once queued, a write finishes even
    if its caller is cancelled, and :meth:`.Durability.settle` waits for it.
    """

    def __init__(self, root: Path, strategy: ReplaceStrategy, durability: Durability) -> None:
        self.root = root
        self.strategy = strategy
        self.durability = durability
        self._writes: list[_Write] = []  # waiting for a batch
        self._batches = 0  # batches in flight
        self._busy: set[tuple[str, ...]] = set()  # paths in a batch in flight

    async def write(
        self,
        names: tuple[str, ...],
        path: Path | str,
        data: bytes,
        *,
        expected_length: int | None,
        expected: Mapping[str, str],
        algos: list[str],
    ) -> Written:
        """Store ``data`` at ``names`` (see :meth:`.Mirror.write_bytes`)."""
        future = asyncio.get_running_loop().create_future()
        write = _Write(names, path, future, data, expected_length, expected, tuple(algos))
        written: Written = await self._queue(write)
        return written

    async def delete(self, names: tuple[str, ...], path: Path | str) -> bool:
        """Remove the file at ``names``; True if there was one (see :meth:`.Mirror.delete`)."""
        removed: bool = await self._queue(
            _Write(names, path, asyncio.get_running_loop().create_future())
        )
        return removed

    async def delete_many(
        self, targets: list[tuple[tuple[str, ...], Path | str]]
    ) -> list[bool | BaseException]:
        """:meth:`delete` of each of ``targets`` (names, path), queued at once; a result each.

        One future per delete and one wait for all: no coroutine or task per
        delete (see :mod:`..deletions`).  A delete that failed is its
        exception in the list.
        """
        loop = asyncio.get_running_loop()
        writes = [_Write(names, path, loop.create_future()) for names, path in targets]
        for write in writes:
            self._writes.append(write)
            self.durability.track(write.future)
        self._start_batches()
        gathered = asyncio.gather(*(w.future for w in writes), return_exceptions=True)
        results: list[bool | BaseException] = await asyncio.shield(gathered)
        return results

    async def _queue(self, write: _Write) -> Any:
        """Queue ``write`` for the next batch and wait for its result (shielded)."""
        self._writes.append(write)
        self.durability.track(write.future)
        self._start_batches()
        return await asyncio.shield(write.future)

    def _start_batches(self) -> None:
        """Hand queued writes to free writer threads, shared evenly."""
        loop = asyncio.get_running_loop()
        while self._writes and self._batches < WRITERS:
            share = -(-len(self._writes) // (WRITERS - self._batches))  # ceil
            batch: list[_Write] = []
            rest: list[_Write] = []
            taken: set[tuple[str, ...]] = set()
            for write in self._writes:
                names = write.names
                if len(batch) < share and names not in self._busy and names not in taken:
                    batch.append(write)
                else:
                    rest.append(write)
                taken.add(names)  # a later write of this path stays behind this one
            if not batch:
                return
            self._writes = rest
            self._busy |= {write.names for write in batch}
            self._batches += 1
            self.durability.track(loop.create_task(self._write_batch(batch)))

    async def _write_batch(self, batch: list[_Write]) -> None:
        loop = asyncio.get_running_loop()
        # Tracked and shielded like a commit: settle() waits for the thread
        # itself, not only for this task, so no rename outlives it.
        try:
            job = self.durability.run(lambda: self._store(batch), batch=True)
            results = await asyncio.shield(job)
        except BaseException as exc:  # cancelled (loop closing), or closed: fail the batch
            for write in batch:
                if not write.future.done():
                    write.future.set_exception(
                        exc if isinstance(exc, Exception) else MirrorError(str(exc))
                    )
            raise
        else:
            for write, result in zip(batch, results, strict=True):
                if write.future.done():
                    continue
                if isinstance(result, BaseException):
                    write.future.set_exception(result)
                else:
                    write.future.set_result(result)
        finally:
            self._batches -= 1
            self._busy -= {write.names for write in batch}
            if not loop.is_closed():
                self._start_batches()

    def _store(self, batch: list[_Write]) -> list[Written | bool | BaseException]:
        """Verify, stage and commit every write of ``batch`` (worker thread), each durably.

        A batch never holds two writes of one path (see :meth:`_start_batches`).
        """
        results: list[Written | bool | BaseException] = [MirrorError("not stored")] * len(batch)
        staged: list[tuple[int, Staged]] = []
        dirs = OpenedDirs(self.root)  # each directory walked once for the batch
        try:
            for i, write in enumerate(batch):
                try:
                    if write.data is None:
                        item = open_target(
                            self.root, write.names, write.path, create=False, dirs=dirs
                        )
                        if item is None:
                            results[i] = False  # no directory, so no file: gone already
                            continue
                        item.delete = True
                    else:
                        item = self._stage(write, dirs)
                except BaseException as exc:
                    results[i] = exc
                    continue
                staged.append((i, item))
        except BaseException:
            for _, item in staged:
                release(item, self.strategy)
            raise
        finally:
            dirs.close()
        outcomes = commit(
            [item for _, item in staged],
            self.strategy,
            self.durability.dirs,
            self.durability.flushers,
        )
        for (i, item), outcome in zip(staged, outcomes, strict=True):
            data = batch[i].data
            if outcome is True and data is not None:
                results[i] = Written(len(data), item.digests)
            else:
                results[i] = outcome
        return results

    def _stage(self, write: _Write, dirs: OpenedDirs) -> Staged:
        """Verify one write and put its bytes in a temp file beside the target (unsynced)."""
        path, data = write.path, write.data
        assert data is not None
        digests = {a: hashlib.new(HASHLIB_NAMES[a], data).hexdigest() for a in write.algos}
        verify(path, len(data), digests, write.expected_length, write.expected or {})
        item = prepare_write(self.root, write.names, path, self.strategy, reuse=True, dirs=dirs)
        item.digests, item.data = digests, data
        try:
            self.strategy.write(item, data)
        except BaseException:
            release(item, self.strategy)
            raise
        return item
