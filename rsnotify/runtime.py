"""Process-wide settings for rsnotify's long-running commands.

Only :mod:`rsnotify.cli` calls :func:`tune_gc`: a library must not change the
interpreter's global state behind its host application's back.
:func:`settle_gc` acts only in a process whose CLI did (the subscriber's
command hands it to its service).  :func:`release_memory` changes no
setting; the publisher hands it to its WebSocket gateway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from typing import Any

# Any (strict module): a ctypes foreign function, untyped by ctypes.

GC_GEN0_THRESHOLD = 10_000
GC_GEN0_THRESHOLD_BATCH = 200_000  # a run with no latency to keep (tune_gc's batch)

__all__ = ["release_memory", "settle_gc", "tune_gc"]

_tuned = False  # tune_gc ran: this process is rsnotify's own program


def tune_gc(*, batch: bool = False) -> None:
    """Make the cyclic garbage collector run less often.

    A catch-up or a burst holds tens of thousands of live objects at once
    (entries, futures, pending notifications).  With CPython's default
    generation-0 threshold (700 allocations) the collector re-scans them
    thousands of times for cycles that rsnotify's objects rarely form: about
    a quarter of the CPU of a 50,000-change catch-up, measured.  Reference
    counting still frees almost everything at once; only cycle collection is
    made less frequent.  Objects alive after start-up (modules, classes) are
    frozen out of every scan.  10,000, not more: a threshold of 50,000 made
    each collection a pause long enough to double the publisher's p99
    (write to MQTT received, 9.3 -> 21-43 ms in bench/publish.py).

    ``batch``: a run that ends when its work is done and has no latency to
    keep (``subscribe --once``), where a pause costs nothing and only the
    total counts: :data:`GC_GEN0_THRESHOLD_BATCH`.  A catch-up keeps each
    Change List's entries, views and checkpoints alive while it works on
    them, so collections every 10,000 allocations kept finding them: 0.33-0.45 s
    of collecting in a 50,000-change ``--once`` catch-up of ~7 s of CPU,
    0.02 s at 200,000 (measured with ``gc.callbacks``).
    """
    global _tuned
    _tuned = True
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    threshold = GC_GEN0_THRESHOLD_BATCH if batch else GC_GEN0_THRESHOLD
    gc.set_threshold(max(gen0, threshold), gen1, gen2)


def settle_gc() -> None:
    """Once a service's start-up work is done, freeze what it built out of every scan.

    A subscriber's baseline leaves thousands of long-lived objects (its
    resource cache's rows, the mirror-path and vetting memos) in the young
    generations, and the first collections after it scanned them all while
    push was already live: at 200 changes/s, a generation-0 collection of
    18 ms and a generation-1 one of 24 ms in the first 20 s, each met a walk
    of the Change Lists and made a tail of 40-60 ms (``gc.callbacks`` and
    per-step timing in ``bench.e2e``).  Collected first, so no garbage is
    frozen for good; frozen objects are still freed when nothing refers to
    them.  A no-op unless :func:`tune_gc` ran (a host embedding rsnotify
    keeps its own collector settings).
    """
    if _tuned:
        gc.collect()
        gc.freeze()


def release_memory() -> None:
    """Collect garbage cycles now and give freed heap memory back to the system.

    For a moment when much was just freed (thousands of WebSocket clients
    gone): each closed asyncio transport leaves a reference cycle that only a
    full collection frees, and with :func:`tune_gc` full collections are rare,
    so without this the memory of 10,000 closed connections stayed held.
    ``malloc_trim`` then returns the C heap's free pages (glibc only; elsewhere
    a no-op).  Memory CPython's own small-object allocator keeps in partly
    used arenas is not returned by anything short of ``PYTHONMALLOC=malloc``
    (figures in ``bench/ws_connections.py``).  The collection is a pause of
    the whole process: call it rarely.
    """
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None
