"""The fault matrix, short: every scenario of :mod:`tests.chaos` injected once.

Each case starts the whole stack as real processes (simulator, publisher on
Redis + Mosquitto, an MQTT and a WebSocket subscriber), injects its fault
once with CI timings (:data:`tests.chaos.faults.SHORT`: faults of a few
seconds, a 25 s network partition so MQTT keepalive must notice it), freezes
the Source and requires: nothing missing, no stale overwrite, both mirrors
equal to ``/_simulator/state``, every process alive, recovery within the
deadline.  ``python -m tests.chaos --minutes 10`` is the long version.

The disk-full and network-partition cases need root (tmpfs mounts, ``ip
netns``); elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos import netns
from tests.chaos.faults import SCENARIOS, SHORT, Scenario
from tests.chaos.matrix import run_scenario, table

NEEDS_ROOT = {"disk-full", "network-partition"}


@pytest.mark.timeout(420)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_fault_is_survived(scenario: Scenario, tmp_path: Path) -> None:
    if scenario.name in NEEDS_ROOT and os.geteuid() != 0:
        pytest.skip(f"{scenario.name} needs root (mount, ip netns)")
    if scenario.name == "network-partition" and (why := netns.available()):
        pytest.skip(f"no network namespaces here: {why}")
    row = run_scenario(scenario, tmp_path, budget_s=0, timing=SHORT)
    print("\n" + table([row]), "\nnotes:", row.notes)
    assert row.injected >= 1, row.problems
    assert row.published > 0 and row.applied > 0, "nothing flowed: the run proves nothing"
    assert row.problems == [], table([row])
    assert row.missing == 0 and row.stale_overwrites == 0 and row.mirror_equal, table([row])
    assert row.worst_recovery_s is not None
