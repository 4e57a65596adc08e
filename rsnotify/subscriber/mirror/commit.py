"""The one commit path: staged replaces and deletes made durable, in phases (worker thread).

Per file the order is always: bytes in a temp file, fsync, rename (or swap)
over the target, fsync of the target's directory begun after the rename,
fsync of any parent that gained a subdirectory; only then is the write
reported done.  A reader sees the old file or the new one, never a partial
one; a ``kill -9`` mid-write leaves only a temp file
(:func:`.replace.remove_stale_temps` removes it at the next start).

A streamed write commits a list of one; a batch of in-memory writes commits
them together, phase by phase: every temp file is flushed, then fsynced (on
a journalled filesystem the first fsync commits the journal for all), then
renamed, then each directory is fsynced once through the
:class:`.durability.DirSyncer` group commit.  A failure fails its own write
(or, for a directory fsync, the writes renamed into that directory), never
the others.

A batch's temp files are fsynced *concurrently* (:func:`flush_temps`, in the
:class:`.durability.Durability` flusher threads and the writer's own).  Each fsync still covers
its own file, but the ones after the journal commit find nothing left to
commit and only ask the device to flush its cache; one after the other, each
waited for a flush of its own (on a journaled ext4, ~0.5 ms per file at
1,000 changes/s: two thirds of the writer's time), while flushes asked for
together are merged by the block layer into one.  Measured on a journaled
ext4 (loop file): 50 temp files fsynced in 1.78 ms instead of 4.86 ms, 10
in 0.83 ms instead of 1.48 ms; on the disk without a journal 1.58 against
2.46 ms for 50.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import Executor
from pathlib import Path

from .durability import DirSyncer
from .errors import MirrorError, PathConflict
from .replace import ReplaceStrategy, Staged
from .safedirs import OpenedDirs, close_all, open_dirs, refuse_directory

__all__ = [
    "commit",
    "flush_temps",
    "open_target",
    "prepare_write",
    "release",
    "start_writeback",
]

_FADVISE = getattr(os, "posix_fadvise", None)  # absent on macOS
_DONTNEED: int = getattr(os, "POSIX_FADV_DONTNEED", 4)


def start_writeback(fd: int) -> None:
    """Ask the kernel to start writing ``fd``'s dirty pages out now; wait for nothing.

    A hint before a batch's fsyncs (see :func:`commit`).  CPython has no
    ``os.sync_file_range``, so this is ``posix_fadvise(POSIX_FADV_DONTNEED)``,
    which on Linux starts writeback of the range's dirty pages (and drops the
    clean ones from the cache, which a temp file about to be renamed does not
    need) -- the same fallback PostgreSQL uses to start writeback.  Measured
    on a journaled ext4 (loop file, data=ordered), a batch of eight 1 KB
    files: 5.05 ms without the hint (each fsync allocated its own blocks and
    committed its own transaction), 1.87 ms with it.  Elsewhere a no-op.
    """
    if _FADVISE is not None:
        with contextlib.suppress(OSError):  # only a hint: fsync follows
            _FADVISE(fd, 0, 0, _DONTNEED)


def open_target(
    root: Path,
    names: tuple[str, ...],
    path: Path | str,
    *,
    create: bool,
    dirs: OpenedDirs | None = None,
) -> Staged | None:
    """The target's directory opened safely; None when it is missing and not ``create``\\ d.

    ``dirs``: the directories a batch has opened already (:class:`.safedirs.OpenedDirs`).
    """
    if dirs is None:
        dir_fd, dirty = open_dirs(root, names[:-1], create=create, path=path)
    else:
        dir_fd, dirty = dirs.open(names[:-1], create=create, path=path)
    if dir_fd is None:
        return None
    return Staged(dir_fd, dirty, names[-1], path)


def prepare_write(
    root: Path,
    names: tuple[str, ...],
    path: Path | str,
    strategy: ReplaceStrategy,
    *,
    reuse: bool,
    dirs: OpenedDirs | None = None,
) -> Staged:
    """A target with a temp file open beside it (or a spare when ``reuse``), nothing written.

    Refuses a target that is a directory (it holds other resources).  On
    failure every descriptor opened here is closed again.  ``dirs``: as for
    :func:`open_target`.
    """
    item = open_target(root, names, path, create=True, dirs=dirs)
    assert item is not None
    try:
        refuse_directory(item.dir_fd, item.name, path)
        strategy.open_temp(item, reuse=reuse)
    except BaseException:
        release(item, strategy)
        raise
    return item


def release(item: Staged, strategy: ReplaceStrategy) -> None:
    """Close what ``item`` holds; a temp file not renamed is discarded.

    A retired inode still held back is forgotten: its directory was never
    (durably) fsynced.
    """
    if item.fd >= 0:
        with contextlib.suppress(OSError):
            os.close(item.fd)
        item.fd = -1
    strategy.discard(item)
    strategy.forget(item)
    close_all([item.dir_fd, *item.dirty])
    item.dir_fd, item.dirty = -1, []


def commit(
    items: list[Staged],
    strategy: ReplaceStrategy,
    dirs: DirSyncer,
    flushers: tuple[Executor, int] | None = None,
) -> list[bool | BaseException]:
    """Make every staged write and delete durable; one outcome per item, in order.

    True: done.  False: a delete found nothing to delete.  An exception: that
    item failed (a write then left the target untouched, or renamed but not
    durably).  :func:`start_writeback` first starts writeback of every temp file:
    on a journalled filesystem their block allocations then land in the
    transaction the first fsync commits, and the other fsyncs find nothing
    left to commit; without a journal the device at least gets all the data
    at once.  ``flushers`` (threads, and how many): where the temp files are
    fsynced together (:func:`flush_temps`).  Every item is released before
    this returns.
    """
    results: list[bool | BaseException] = [MirrorError("not stored")] * len(items)
    try:
        if len(items) > 1:
            for item in items:
                if item.fd >= 0:
                    start_writeback(item.fd)
        flushed = flush_temps(items, flushers)
        replaced: list[int] = []
        for k, item in enumerate(items):
            if item.delete:
                outcome = _remove(item, strategy)
            else:
                outcome = _install(item, strategy, flushed[k])
            if outcome is True:
                replaced.append(k)
            else:
                results[k] = outcome
        synced: dict[tuple[int, int], BaseException | None] = {}
        for k in replaced:
            item = items[k]
            try:
                info = os.fstat(item.dir_fd)
                key = (info.st_dev, info.st_ino)
                if key not in synced:
                    try:
                        dirs.sync(item.dir_fd, key)
                        synced[key] = None
                    except OSError as exc:
                        synced[key] = exc
                failed = synced[key]
                if failed is not None:
                    raise failed
                strategy.settle(item)
                for parent in item.dirty:
                    os.fsync(parent)
            except BaseException as exc:
                results[k] = exc
                continue
            results[k] = True
    finally:
        for item in items:
            release(item, strategy)
    return results


def _remove(item: Staged, strategy: ReplaceStrategy) -> bool | BaseException:
    try:
        return strategy.remove(item) or False
    except OSError as exc:
        return MirrorError(f"cannot delete {item.path}: {exc.strerror or exc}", path=item.path)


def flush_temps(
    items: list[Staged], flushers: tuple[Executor, int] | None = None
) -> list[BaseException | None]:
    """fsync and close every write's temp file; per item None, or why its fsync failed.

    With ``flushers`` (an executor and its thread count) and more than one
    temp file, the files are dealt round-robin into that many shares, which
    fsync at the same time (see the module's docstring): this thread takes
    the last share itself, since it would only wait meanwhile, and a job
    fewer is a thread wake-up fewer (a batch of two, common at a few hundred
    changes a second, hands one file over instead of two).  Without
    ``flushers``, or with one file, one after the other, here.  Deletes (no
    temp file) get None.
    """
    flushed: list[BaseException | None] = [None] * len(items)
    writes = [k for k, item in enumerate(items) if not item.delete]
    if flushers is None or len(writes) < 2:
        for k in writes:
            flushed[k] = _fsync_close(items[k])
        return flushed
    pool, threads = flushers
    count = min(threads, len(writes))
    shares = [writes[i::count] for i in range(count)]
    here = [shares[-1]]
    jobs = []
    for share in shares[:-1]:
        try:
            jobs.append((share, pool.submit(_fsync_share, [items[k] for k in share])))
        except RuntimeError:  # the pool is shut down: this thread does it
            here.append(share)
    try:
        for share in here:
            try:
                failures = _fsync_share([items[k] for k in share])
            except Exception as exc:  # as a job's below
                failures = [exc] * len(share)
            for k, failure in zip(share, failures, strict=True):
                flushed[k] = failure
    finally:
        for share, job in jobs:  # each waited for: none still touches its items after this
            try:
                failures = job.result()
            except Exception as exc:  # not an OSError (those are per item): its whole share
                failures = [exc] * len(share)
            for k, failure in zip(share, failures, strict=True):
                flushed[k] = failure
    return flushed


def _fsync_share(share: list[Staged]) -> list[BaseException | None]:
    return [_fsync_close(item) for item in share]


def _fsync_close(item: Staged) -> BaseException | None:
    """fsync ``item``'s temp file and close it; the failure, if any, returned (not raised)."""
    try:
        try:
            os.fsync(item.fd)
        finally:
            os.close(item.fd)
            item.fd = -1
    except OSError as exc:
        return exc
    return None


def _install(
    item: Staged, strategy: ReplaceStrategy, flushed: BaseException | None
) -> bool | BaseException:
    """Rename ``item``'s temp file (fsynced and closed: ``flushed`` None) over its target."""
    try:
        if flushed is not None:
            raise flushed
        try:
            strategy.install(item)
        except IsADirectoryError:
            raise PathConflict(
                f"{item.path} is a directory (other resources are stored under it)",
                path=item.path,
            ) from None
    except BaseException as exc:
        strategy.discard(item)
        return exc
    return True
