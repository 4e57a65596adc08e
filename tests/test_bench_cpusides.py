"""``bench.e2e --cpus split``: how the CPUs are shared out, and that a process started inside
:func:`bench.cpusides.on_cpus` really runs on the side it was given (a real child process,
its affinity read back by itself), while the starting thread gets its own back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.cpusides import cpu_sides, on_cpus


def test_shared_is_no_layout_and_split_halves_the_cpus() -> None:
    assert cpu_sides("shared") is None
    two = cpu_sides("split", [0, 1])
    assert two is not None and (two.source, two.destination) == ({0}, {1})
    # An odd count: the Destination (what is measured) gets the extra CPU.
    three = cpu_sides("split", [4, 2, 3])
    assert three is not None and (three.source, three.destination) == ({2}, {3, 4})
    assert three.describe() == "Source on CPU 2, Destination on CPU 3,4"


def test_split_refuses_one_cpu_and_unknown_layouts() -> None:
    with pytest.raises(ValueError, match="at least two CPUs"):
        cpu_sides("split", [0])
    with pytest.raises(ValueError, match="shared or split"):
        cpu_sides("pinned", [0, 1])


def test_a_process_started_inside_runs_on_those_cpus_and_the_thread_gets_its_own_back() -> None:
    before = os.sched_getaffinity(0)
    one = {max(before)}
    probe = "import os; print(','.join(map(str, sorted(os.sched_getaffinity(0)))))"
    with on_cpus(one):
        child = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        )
    assert child.stdout.strip() == str(max(before))
    assert os.sched_getaffinity(0) == before
    with on_cpus(None):  # shared: nothing changes
        assert os.sched_getaffinity(0) == before


async def test_the_handoff_probe_measures_from_inside_a_running_loop_and_leaves_affinity() -> None:
    """``machine_info`` may be called by a bench that already runs an event loop."""
    from bench._common import handoff_probe_us

    before = os.sched_getaffinity(0)
    probe = handoff_probe_us(round_trips=50, rounds=2)
    assert set(probe) == {"one_cpu", "all_cpus"}
    assert all(0 < us < 1_000_000 for us in probe.values()), probe
    assert os.sched_getaffinity(0) == before
