"""The soak's growth verdict (tests/chaos/soak.py ``trends``): growth after warm-up, not size.

Pure: synthetic samples, one a minute for 30 minutes, as the soak records them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.chaos.soak import WARM_UP_MIN, trends


def run(rss: Callable[[int], float], fds: Callable[[int], int]) -> dict[str, Any]:
    samples = [
        {"t_min": float(t), "p": {"rss_mb": rss(t), "fds": fds(t), "cpu_s": 0.0}} for t in range(31)
    ]
    return trends(samples, ["p"])["p"]


def test_filling_bounded_caches_during_the_warm_up_is_not_growth() -> None:
    full = WARM_UP_MIN - 1  # caches fill, then stay full
    verdict = run(lambda t: 100 + 15 * min(t, full), lambda t: 34)
    assert verdict["growing"] is False


def test_descriptors_swinging_with_fetches_in_flight_are_not_growth() -> None:
    # 34 idle, up to 175 with fetches in flight, bursts of them late in the run.
    verdict = run(lambda t: 200.0, lambda t: 175 if t % 3 == 0 or t == 29 else 34)
    assert verdict["growing"] is False


def test_a_steady_rss_climb_after_the_warm_up_is_growth() -> None:
    verdict = run(lambda t: 200 + 2.0 * t, lambda t: 34)  # 2 MB/min: 44 MB after warm-up
    assert verdict["growing"] is True


def test_descriptors_dipping_during_a_stall_early_in_the_run_are_not_growth() -> None:
    # The 30-minute run: 34 as a rule, 18 twice in the first half (connections closed).
    verdict = run(lambda t: 200.0, lambda t: 18 if t in (8, 18) else 34)
    assert verdict["growing"] is False


def test_a_rising_descriptor_count_is_growth() -> None:
    verdict = run(lambda t: 200.0, lambda t: 34 + t + (100 if t % 2 else 0))  # one leaked a minute
    assert verdict["growing"] is True
