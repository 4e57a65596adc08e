"""Exponential backoff with full jitter, for every reconnect and retry loop.

Jitter matters: after a broker or Source restart, hundreds of Destinations
retrying on the same schedule would arrive together and knock it over again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    initial: float = 0.2
    maximum: float = 30.0
    factor: float = 2.0
    attempts: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def next(self) -> float:
        """The delay before the next attempt (0 < delay <= the current ceiling)."""
        ceiling = min(self.maximum, self.initial * self.factor**self.attempts)
        self.attempts += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempts = 0
