"""The one backoff of every retry loop: exponential ceiling, jitter below it, reset on success."""

from __future__ import annotations

import random

from rsnotify.backoff import Backoff


def test_the_ceiling_doubles_up_to_the_maximum_and_delays_stay_under_it() -> None:
    backoff = Backoff(initial=0.1, maximum=1.0, _rng=random.Random(7))
    ceilings, delays = [], []
    for _ in range(8):
        ceilings.append(backoff.ceiling())
        delays.append(backoff.next())
    assert ceilings == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]
    assert all(c / 2 <= d <= c for c, d in zip(ceilings, delays, strict=True))
    assert backoff.attempts == 8
    backoff.reset()
    assert backoff.attempts == 0 and backoff.ceiling() == 0.1


def test_a_given_jitter_picks_the_fraction_of_the_ceiling() -> None:
    backoff = Backoff(initial=0.2, maximum=1.0)
    assert [backoff.next(jitter=1.0) for _ in range(4)] == [0.2, 0.4, 0.8, 1.0]
    assert backoff.next(jitter=0.5) == 0.5
    assert backoff.next(jitter=0.0) == 0.5  # clamped to [0.5, 1]
    assert backoff.next(jitter=9.0) == 1.0
