"""Durability: the threads that make writes durable, and directory fsyncs shared between renames.

A replaced file is durable once its bytes are fsynced, it is renamed into
place, and an fsync of its directory *that began after the rename* has
returned.  :class:`DirSyncer` lets every rename waiting on one directory
share such an fsync (a group commit); :class:`Durability` owns it with the
worker threads that run commits, and the jobs in flight, until :meth:`close`.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["FLUSHERS", "FSYNC_THREADS", "WRITERS", "DirSyncer", "Durability"]

T = TypeVar("T")

FSYNC_THREADS = 16  # streamed writes committing at once
WRITERS = 1  # write_bytes batches in flight at once (see Durability)
FLUSHERS = 16  # a batch's temp files fsynced at once (see .commit)


class DirSyncer:
    """Group commit for directory fsyncs: one ``fsync`` covers every rename before it.

    A rename is durable once an fsync of its directory *that started after the
    rename* has returned.  At 1,000 changes/s nearly every change renames into
    the same directory, and one fsync each cost a journal commit each.  Here a
    caller whose rename is done waits for the next fsync of that directory to
    start and finish (running it itself when none is under way), so renames
    that arrive while an fsync runs share the next one.  Nobody returns before
    an fsync that began after its rename has completed: the guarantee is the
    same as one fsync per rename.  Directories are keyed by (device, inode),
    so any descriptor of the directory serves.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._dirs: dict[tuple[int, int], _DirState] = {}

    def sync(self, dir_fd: int, key: tuple[int, int] | None = None) -> None:
        """Return once an fsync of ``dir_fd``'s directory begun after this call has succeeded.

        ``key``: the directory's (device, inode), when the caller has it already.
        """
        if key is None:
            info = os.fstat(dir_fd)
            key = (info.st_dev, info.st_ino)
        cond = self._cond
        with cond:
            state = self._dirs.get(key)
            if state is None:
                state = self._dirs[key] = _DirState()
            need = state.started + 1  # the next fsync to start is the first sure to cover us
            while state.finished < need:
                if state.running:
                    cond.wait()
                    continue
                state.started += 1
                number = state.started
                state.running = True
                cond.release()
                try:
                    os.fsync(dir_fd)
                except OSError as exc:
                    state.failed = (number, exc)
                finally:
                    cond.acquire()
                    state.finished = number
                    state.running = False
                    cond.notify_all()
            if state.failed is not None and state.failed[0] >= need:
                # An fsync that should have covered this rename failed (a later
                # success proves nothing after a failed fsync): not durable.
                raise state.failed[1]
            idle = not state.running and state.started == state.finished
            if idle and state.failed is None and self._dirs.get(key) is state:
                del self._dirs[key]  # forget it (directories come and go)


class _DirState:
    """One directory's fsyncs: how many began and ended, and the last failure."""

    __slots__ = ("failed", "finished", "running", "started")

    def __init__(self) -> None:
        self.started = 0  # fsyncs begun
        self.finished = 0  # the number of the last fsync that returned
        self.running = False
        self.failed: tuple[int, OSError] | None = None


class Durability:
    """The worker threads and group commit of one mirror; :meth:`close` releases them.

    Two pools, made on first use.  *Streamed* commits (a body written as it
    arrived, then fsync, rename, directory fsync) get :data:`FSYNC_THREADS`
    threads: at 1,000 changes/s each commit waits on the disk, and the
    loop's default executor (cpu+4 threads, shared with anything else)
    capped the rate; the threads mostly sleep in the kernel, so more of them
    cost little.  *Batches* of in-memory writes get :data:`WRITERS` thread,
    which runs whole batches, each of everything queued when it starts: one
    thread per file spent more CPU switching threads than writing.  Four
    writers were used for a while (a few batches in flight, to keep a
    filesystem without a journal busy, where every fsync is its own cache
    flush), but each writer runs Python between its syscalls, and every
    syscall's return waited for the interpreter lock another writer held.
    One writer, measured: a catch-up's write phase through the writer alone
    (``bench.mirror_writes``, three runs each) 1.13-1.32 s against 1.91-2.31
    s on the disk without a journal, 0.73-0.89 s against 1.35-1.49 s on a
    journaled ext4; ``bench.e2e`` at 1,000 changes/s, push p50 18.7 s against
    28.0 s (disk) and 16.3 against 17.2 s (journaled), both behind the
    Source on this two-core machine, fewer misses (313 / 103 against 616 /
    221).

    The writer hands its batch's fsyncs to :data:`FLUSHERS` more threads
    (:attr:`flushers`), which only wait on the disk (see :mod:`.commit`).

    Jobs are tracked until they finish: they are shielded from cancellation
    (a rename half done is worse than one done), and :meth:`settle` waits
    for them.
    """

    def __init__(self) -> None:
        self.dirs = DirSyncer()
        self._streams: ThreadPoolExecutor | None = None
        self._batches: ThreadPoolExecutor | None = None
        self._flushers: ThreadPoolExecutor | None = None
        self._flushers_made = threading.Lock()
        self._inflight: set[asyncio.Future[object]] = set()
        self._closed = False

    def _pool(self, batch: bool) -> ThreadPoolExecutor:
        if self._closed:
            raise RuntimeError("the mirror is closed")
        if batch:
            if self._batches is None:
                self._batches = ThreadPoolExecutor(WRITERS, thread_name_prefix="rsnotify-writer")
            return self._batches
        if self._streams is None:
            self._streams = ThreadPoolExecutor(FSYNC_THREADS, thread_name_prefix="rsnotify-fsync")
        return self._streams

    @property
    def flushers(self) -> tuple[ThreadPoolExecutor, int] | None:
        """The threads a batch fsyncs its temp files in, and how many; None once closed.

        Made on first use, from the writer thread (hence the lock).
        """
        with self._flushers_made:
            if self._closed:
                return None
            if self._flushers is None:
                self._flushers = ThreadPoolExecutor(FLUSHERS, thread_name_prefix="rsnotify-flush")
            return self._flushers, FLUSHERS

    def run(self, job: Callable[[], T], *, batch: bool) -> asyncio.Future[T]:
        """Run ``job`` in a worker thread; the future is tracked (see :meth:`settle`)."""
        future = asyncio.get_running_loop().run_in_executor(self._pool(batch), job)
        return self.track(future)

    def track(self, job: asyncio.Future[T]) -> asyncio.Future[T]:
        """Count ``job`` as under way until it is done."""
        self._inflight.add(job)  # type: ignore[arg-type]
        job.add_done_callback(self._finished)  # type: ignore[arg-type]
        return job

    def _finished(self, job: asyncio.Future[object]) -> None:
        self._inflight.discard(job)
        if not job.cancelled():
            job.exception()  # retrieved: a caller cancelled meanwhile is not told

    async def settle(self) -> None:
        """Wait until every job already under way has finished."""
        while self._inflight:
            await asyncio.wait(list(self._inflight))

    def close(self) -> None:
        """Stop the worker threads once their jobs are done (call :meth:`settle` first)."""
        with self._flushers_made:
            self._closed = True
        for pool in (self._streams, self._batches, self._flushers):
            if pool is not None:
                pool.shutdown(wait=True)
        self._streams = self._batches = self._flushers = None
