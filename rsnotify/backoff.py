"""Exponential backoff with full jitter, for every reconnect and retry loop.

Jitter matters: after a broker or Source restart, hundreds of Destinations
retrying on the same schedule would arrive together and knock it over again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

_SHARED = random.Random()


@dataclass(slots=True)
class Backoff:
    initial: float = 0.2
    maximum: float = 30.0
    factor: float = 2.0
    attempts: int = 0
    # The shared module generator by default: seeding a new Random (from
    # os.urandom) for every Backoff cost ~3% of a subscriber applying 1,000
    # changes/s, each of which makes one in case it must retry.
    _rng: random.Random | None = field(default=None, repr=False)

    def next(self) -> float:
        """The delay before the next attempt (0 < delay <= the current ceiling)."""
        ceiling = min(self.maximum, self.initial * self.factor**self.attempts)
        self.attempts += 1
        return (self._rng or _SHARED).uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempts = 0
