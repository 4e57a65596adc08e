"""Process-wide settings for rsnotify's long-running commands.

Only :mod:`rsnotify.cli` calls this: a library must not change the
interpreter's global state behind its host application's back.
"""

from __future__ import annotations

import gc

GC_GEN0_THRESHOLD = 10_000

__all__ = ["tune_gc"]


def tune_gc() -> None:
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
    """
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, GC_GEN0_THRESHOLD), gen1, gen2)
