"""``bench.e2e --cpus split``: the Source's processes and the Destination's on CPUs apart.

In production a Source (its web server, its ResourceSync writer, the
publisher, the broker, Redis) and a Destination (the subscriber) run on
different machines.  This machine has two CPUs for all of them, and in the
``shared`` layout the subscriber's event loop waits behind the simulator
and nginx for a core: its latency then says as much about the Source's
load as about the Destination.  ``split`` gives each side CPUs of its own
(on two CPUs, a core each), the nearest this one machine comes to two.

Processes inherit the CPU affinity of the thread that starts them, so a
side is chosen by starting its processes inside :func:`on_cpus`; threads
and processes they start later stay on their side.  Linux only
(``os.sched_setaffinity``), like the rest of the bench.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass

__all__ = ["CPU_LAYOUTS", "CpuSides", "cpu_sides", "on_cpus"]

CPU_LAYOUTS = ("shared", "split")


@dataclass(frozen=True, slots=True)
class CpuSides:
    """The CPUs of the Source's side and of the Destination's (disjoint, neither empty)."""

    source: frozenset[int]
    destination: frozenset[int]

    def describe(self) -> str:
        return f"Source on CPU {_cpus(self.source)}, Destination on CPU {_cpus(self.destination)}"


def cpu_sides(layout: str, available: Collection[int] | None = None) -> CpuSides | None:
    """The sides of ``layout`` over the ``available`` CPUs (default: this process's).

    ``shared``: None, everything everywhere.  ``split``: the lower half for
    the Source's side, the rest for the Destination's (with an odd count the
    Destination gets one more: it is what is measured).
    """
    if layout == "shared":
        return None
    if layout != "split":
        raise ValueError(f"--cpus takes {' or '.join(CPU_LAYOUTS)}, not {layout!r}")
    cpus = sorted(os.sched_getaffinity(0) if available is None else available)
    if len(cpus) < 2:
        raise ValueError(
            f"--cpus split needs at least two CPUs to give each side its own; "
            f"this process may run on {len(cpus)}"
        )
    half = len(cpus) // 2
    return CpuSides(frozenset(cpus[:half]), frozenset(cpus[half:]))


@contextlib.contextmanager
def on_cpus(cpus: Collection[int] | None) -> Iterator[None]:
    """Inside, the calling thread (and every process it starts) runs on ``cpus``.

    ``None`` changes nothing.  The thread's own affinity is restored after,
    so only what was started inside stays on ``cpus``.
    """
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _cpus(cpus: Collection[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))
