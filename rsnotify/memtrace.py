"""Opt-in memory growth report for a long-running command: ``RSNOTIFY_TRACEMALLOC=PATH``.

A diagnostic, off unless the variable is set: finding what a process keeps
growing over a soak (issue 22) needs to know *what* stayed alive and *which
code* allocated it, which RSS alone cannot say.  With the variable set,
:func:`start_from_env` starts a daemon thread that, every
``RSNOTIFY_TRACEMALLOC_INTERVAL`` seconds (default 60), appends to ``PATH``
the growth since the first interval (after warm-up):

* live objects by type (``gc.get_objects()``: cheap, and names the type
  that piles up: tasks, futures, tuples of a record ...);
* the largest containers alive and what they hold (a growing one is a leak
  of objects the collector does not track: bytes, strings, numbers);
* with ``RSNOTIFY_TRACEMALLOC_FRAMES`` > 0 (default 1), :mod:`tracemalloc`
  allocations by the line (1 frame) or traceback (more) that made them.

``{pid}`` in ``PATH`` is replaced by the process id.  Tracing slows every
allocation (a subscriber under ``FRAMES=6`` could not keep up with 200
changes/s on a loaded machine, and comparing snapshots of a few million
blocks took minutes), so: few frames, for diagnosis, never in production;
``FRAMES=0`` leaves the type counts and containers, which cost nothing
between reports (a report takes about a second).
"""

from __future__ import annotations

import collections
import gc
import os
import threading
import time
import tracemalloc
from pathlib import Path

ENV_PATH = "RSNOTIFY_TRACEMALLOC"
ENV_INTERVAL = "RSNOTIFY_TRACEMALLOC_INTERVAL"
ENV_FRAMES = "RSNOTIFY_TRACEMALLOC_FRAMES"
TOP = 25  # growths per report: the leak, if any, is in the first few

__all__ = ["Baseline", "start_from_env"]


def start_from_env(name: str) -> threading.Thread | None:
    """Start reporting if ``RSNOTIFY_TRACEMALLOC`` is set; the reporting thread, or None."""
    target = os.environ.get(ENV_PATH)
    if not target:
        return None
    path = Path(target.replace("{pid}", str(os.getpid())))
    interval = float(os.environ.get(ENV_INTERVAL, "60"))
    frames = int(os.environ.get(ENV_FRAMES, "1"))
    if frames > 0:
        tracemalloc.start(frames)
    thread = threading.Thread(
        target=_loop, args=(name, path, interval), name="rsnotify-memtrace", daemon=True
    )
    thread.start()
    return thread


def type_counts() -> collections.Counter[str]:
    """Live objects the cyclic collector tracks, by type name (containers, instances)."""
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


def largest_containers(count: int = TOP) -> list[str]:
    """The biggest dicts, lists, sets and deques alive, with a sample of what they hold.

    A leak into one container (bytes keys, ints, strings: objects the
    collector does not track, so :func:`type_counts` cannot see them) shows
    up here as one container whose length keeps growing.
    """
    kinds = (dict, list, set, collections.deque, collections.OrderedDict)
    seen: set[int] = set()
    found = []
    for tracked in gc.get_objects():
        # A dict holding only atomic keys and values is not tracked itself:
        # reach it through what refers to it.
        for o in (tracked, *gc.get_referents(tracked)):
            if type(o) in kinds and len(o) >= 1000 and id(o) not in seen:
                seen.add(id(o))
                found.append(o)
    found.sort(key=len, reverse=True)
    lines = []
    for o in found[:count]:
        first = next(iter(o))
        sample = repr(first)[:60]
        if isinstance(o, dict):
            sample += " -> " + repr(o[first])[:60]
        lines.append(f"{len(o):9d}  {type(o).__name__:11s} {sample}")
    return lines


class Baseline:
    """What was alive at one moment, to report growth against."""

    def __init__(self) -> None:
        self.at = time.monotonic()
        self.types = type_counts()
        self.snapshot = _snapshot()

    def report(self, name: str) -> str:
        """Growth since this baseline: object counts by type, then allocations by site."""
        started = time.monotonic()
        types = type_counts()
        lines = [f"# {name} pid {os.getpid()}: {(started - self.at) / 60:.1f} min after baseline"]
        lines.append("\n## live objects by type (growth, now)")
        grown = sorted(types, key=lambda t: types[t] - self.types.get(t, 0), reverse=True)
        lines += [f"{types[t] - self.types.get(t, 0):+9d} {types[t]:9d}  {t}" for t in grown[:TOP]]
        lines.append("\n## largest containers (length, type, first item)")
        lines += largest_containers()
        now = _snapshot()
        if now is not None and self.snapshot is not None:
            key = "lineno" if tracemalloc.get_traceback_limit() == 1 else "traceback"
            diffs = now.compare_to(self.snapshot, key)
            total = sum(d.size_diff for d in diffs)
            lines.append(f"\n## allocations by {key}: traced growth {total / 2**20:+.2f} MiB")
            for diff in diffs[:TOP]:
                lines.append(
                    f"{diff.size_diff / 2**10:+10.1f} KiB {diff.count_diff:+8d} blocks "
                    f"(now {diff.size / 2**10:.1f} KiB)"
                )
                lines.extend(
                    f"    {line}" for line in diff.traceback.format(most_recent_first=True)
                )
        lines.append(f"\n(report took {time.monotonic() - started:.1f}s)")
        return "\n".join(lines) + "\n"


def _loop(name: str, path: Path, interval: float) -> None:
    time.sleep(interval)  # warm-up: what start-up allocates once is not growth
    baseline = Baseline()
    while True:
        time.sleep(interval)
        text = baseline.report(name)
        with path.open("a") as out:
            out.write(text + "\n")


def _snapshot() -> tracemalloc.Snapshot | None:
    if not tracemalloc.is_tracing():
        return None
    return tracemalloc.take_snapshot().filter_traces(
        (tracemalloc.Filter(False, tracemalloc.__file__),)
    )
