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

    def ceiling(self) -> float:
        """The longest the next attempt may wait: ``initial * factor**attempts``, capped."""
        return min(self.maximum, self.initial * self.factor**self.attempts)

    def next(self, jitter: float | None = None) -> float:
        """The delay before the next attempt: between half the ceiling and the ceiling.

        Drawn at random, unless ``jitter`` (in [0.5, 1], clamped) says which
        fraction of the ceiling to take: for a pure core that is handed its
        randomness (:class:`rsnotify.transport.websubproto.Delivery`) and for
        tests.
        """
        ceiling = self.ceiling()
        self.attempts += 1
        if jitter is None:
            return (self._rng or _SHARED).uniform(ceiling / 2, ceiling)
        return ceiling * max(0.5, min(1.0, jitter))

    def reset(self) -> None:
        self.attempts = 0
