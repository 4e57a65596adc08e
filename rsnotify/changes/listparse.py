"""Whole Change Lists parsed in a worker process, beside the event loop.

Why a process: a Destination catching up parses every entry of every list it
missed, and the parse is Python work per entry (~9-18 us, lxml hands each
element to Python).  In a worker *thread* that work holds the interpreter lock,
so it runs one step at a time with the event loop's own work on the same
entries (detection, the applier's decisions): a 50,000-change catch-up was the
sum of the two.  In a worker process it runs on another core; what crosses
back is the pickled entries (:meth:`Entry.__reduce__`: 1.9 ms to unpickle a
1,000-entry list that took 19 ms to parse).  The watcher reads two lists ahead
of the one it detects (:mod:`.watcher`), so the worker parses while the loop
works.  Only for a catch-up (a pass over more than two lists): a walk that
follows push reads one list or two, parsed in a thread as before.  In live
push at 200 changes/s on two cores, with those lists sent to the worker too,
p99 was 237-378 ms against 82-121 ms without it (two alternating pairs on
tmpfs); the worker took CPU from the event loop that applies pushed changes.

One worker for the whole process, shared by every watcher, started when
configured (without waiting for it), at a lower priority, with the
``forkserver`` method (a fork of a process running threads, as the
subscriber does, may copy a lock held by one of them); until it has started,
and when processes are off (:func:`configure`, ``rsnotify subscribe
--parse-processes 0``) or the worker died, lists are parsed in a thread as
before: the same function, the same result.  It costs three processes
(the forkserver, multiprocessing's resource tracker, the worker: 29, 13 and
26 MB RSS here, much of it shared).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from .. import sitemap
from ..model import Entry
from ..tracker import entry_digest

log = logging.getLogger("rsnotify.changes")


@dataclass(frozen=True, slots=True)
class ParsedList:
    """Every entry of one document, and what its reader noticed on the way."""

    entries: list[Entry]
    unordered: int  # entries out of forward chronological order (section 12.1)
    warnings: list[str]  # rules relaxed (sitemap.Lenient), each reported once
    # tracker.entry_digest of each entry, if asked: what an unordered checkpoint's
    # detection computes for every entry (5 us each), done beside the loop too.
    digests: list[bytes] | None = None


def parse_list(body: bytes, limits: sitemap.Limits, digests: bool = False) -> ParsedList:
    """Parse ``body`` whole (in whatever thread or process calls it)."""
    reader = sitemap.DocumentReader(body, limits=limits)
    entries = list(reader)
    return ParsedList(
        entries,
        reader.unordered,
        list(reader.warnings),
        [entry_digest(entry) for entry in entries] if digests else None,
    )


def default_processes() -> int:
    """Worker processes by default: one where there is a second core, else none."""
    return 1 if (os.cpu_count() or 1) > 1 else 0


WORKER_NICENESS = 10  # added to the subscriber's: see _worker_started

_lock = threading.Lock()
_processes = 0  # what configure() asked for
_pool: ProcessPoolExecutor | None = None
_ready: Future[None] | None = None  # the worker's first (empty) task: done once it runs


def configure(processes: int) -> None:
    """Parse in ``processes`` worker processes (0: in a thread); for this whole process.

    A different count shuts a running pool down (what it parses is finished
    first).  The pool starts now, in the background: its process imports
    the parser (~0.3-0.6 s of a core), which at the first catch-up of a live
    subscriber would land among pushed changes (started inside the window
    at 200 changes/s on two cores, the first 10 s had push p99 321 ms).
    """
    global _processes
    if processes < 0:
        raise ValueError(f"parse processes must be >= 0, not {processes}")
    with _lock:
        changed, _processes = processes != _processes, processes
    if changed:
        shutdown()
    _ready_pool()


def shutdown() -> None:
    """Stop the worker processes (a later parse starts them again if configured)."""
    global _pool, _ready
    with _lock:
        pool, _pool, _ready = _pool, None, None
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)


def ready() -> bool:
    """Whether parses go to the worker process now (configured, started, not failed)."""
    return _ready_pool() is not None


def _worker_started() -> None:
    """In the worker, once: ignore Ctrl-C, and yield the CPU to the subscriber itself.

    A terminal sends Ctrl-C to the whole process group; the subscriber
    decides what stops (the worker ends with it), and a traceback from the
    worker would only add noise to its shutdown.  The parse is background
    work that must not take a core from the event loop applying pushed
    changes; a catch-up on an otherwise idle machine loses nothing to it.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(WORKER_NICENESS)


def _nothing() -> None:
    """The worker's first task: it has started and imported the parser once this returns."""


def _first_task(pool: ProcessPoolExecutor) -> None:
    """Give ``pool`` its first task (:func:`_nothing`); :func:`_ready_pool` waits for it."""
    global _ready
    try:
        ready = pool.submit(_nothing)
    except (OSError, RuntimeError) as exc:  # could not spawn; or shut down meanwhile
        ready = Future()
        ready.set_exception(exc)
    with _lock:
        if _pool is pool:
            _ready = ready


def _ready_pool() -> ProcessPoolExecutor | None:
    """The pool if it is up; starts it (without waiting) if configured and not started."""
    global _pool, _ready, _processes
    with _lock:
        if _processes == 0:
            return None
        if _pool is None:
            try:
                context = multiprocessing.get_context("forkserver")
                context.set_forkserver_preload([__name__])
                _pool = ProcessPoolExecutor(
                    _processes, mp_context=context, initializer=_worker_started
                )
            except (OSError, ValueError, ImportError) as exc:
                # No semaphores (a container without /dev/shm), no forkserver here...
                _processes = 0
                log.warning("no Change List parser process (%s); parsing in threads", exc)
                return None
            # The first task spawns the worker, which waits for the forkserver to
            # start and import the parser (0.1 s here): not on the caller's thread.
            threading.Thread(
                target=_first_task, args=(_pool,), name="rsnotify-parser-start", daemon=True
            ).start()
            return None
        pool, ready = _pool, _ready
    if ready is None or not ready.done():
        return None
    failure = ready.exception()
    if failure is not None:  # it could not start
        _broken(pool, failure)
        return None
    return pool


def _broken(pool: ProcessPoolExecutor, exc: BaseException) -> None:
    """The worker died (killed, out of memory): parse in threads from now on."""
    global _pool, _ready, _processes
    with _lock:
        if _pool is not pool:
            return  # another parse reported it already
        _pool, _ready, _processes = None, None, 0
    log.warning("the Change List parser process failed (%s); parsing in threads from now on", exc)
    pool.shutdown(wait=False, cancel_futures=True)


async def parse_whole(
    body: bytes, limits: sitemap.Limits, *, digests: bool = False, process: bool = True
) -> ParsedList:
    """:func:`parse_list` off the event loop: in the worker process if it is up, else a thread.

    ``process=False``: in a thread whatever is configured.  A
    :class:`~rsnotify.errors.DocumentError` the worker raises arrives as
    itself (type, message, line, rule).  A worker that dies leaves the list
    to a thread, so no list is ever lost to it.
    """
    pool = _ready_pool() if process else None
    if pool is not None:
        try:
            return await asyncio.get_running_loop().run_in_executor(
                pool, parse_list, body, limits, digests
            )
        except BrokenProcessPool as exc:
            _broken(pool, exc)
        except RuntimeError as exc:  # shut down meanwhile (configure(0), exit)
            if "shutdown" not in str(exc):
                raise
    return await asyncio.to_thread(parse_list, body, limits, digests)
