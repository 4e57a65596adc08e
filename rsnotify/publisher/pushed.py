"""What this publisher made pushable, and the rule for a log that may have lost some of it.

Issue 19: a sequence number, once pushed, must always mean the same Change
List entry.  Replication before push (``RedisLog``'s ``wait_replicas``) makes
a failover keep every pushed entry, as long as Sentinel promotes a replica
that acknowledged it.  This is the second line of defence for when it does
not (``--redis-wait-replicas 0``, a replica promoted by hand, a restored
backup): the publisher keeps the last entries it appended (their exact
bytes and the checkpoint committed with them), and whenever it (re)loads a
collection's head, after a conflict, an outage or an election, it compares
the log with them by :func:`reconcile`.  The rule, sans-I/O:

* every seq it holds that the log still retains must be the same bytes in
  the log, else the log now gives a pushed number another meaning: refuse;
* a log whose head is below the highest seq it appended lost pushed entries:
  rewrite them, same seqs, same bytes, with the checkpoint committed with the
  last of them, if it holds every one of them, else refuse;
* a head at or beyond it (another publisher went on) is fine once the
  overlap matches.

"Refuse" means the publisher stops appending to that collection and says
why (one log line, a metric): it never guesses.  The memory is per process
(``capacity`` entries per collection); a publisher that restarts after a
failover has nothing to compare and trusts the log, which replication
before push is there to make right.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_CAPACITY", "PushedWindow", "Refuse", "Rewrite"]

DEFAULT_CAPACITY = 10_000  # entries remembered per collection


@dataclass(frozen=True, slots=True)
class Rewrite:
    """Append ``payloads`` after ``after`` (seqs ``after + 1 ...``) with ``checkpoint``."""

    after: int
    payloads: tuple[bytes, ...]
    checkpoint: str


@dataclass(frozen=True, slots=True)
class Refuse:
    """The log cannot be made to agree with what was pushed; ``reason`` says why."""

    reason: str


class PushedWindow:
    """The last ``capacity`` entries one collection's appends made pushable, dense by seq."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._entries: deque[bytes] = deque(maxlen=capacity)
        self.high = 0  # the highest seq appended (0: none yet)
        self.checkpoint = ""  # committed with ``high``

    @property
    def low(self) -> int:
        """The lowest seq held (``high + 1`` when nothing is)."""
        return self.high - len(self._entries) + 1

    def record(self, first_seq: int, payloads: Sequence[bytes], checkpoint: str) -> None:
        """An append of ``payloads`` as seqs ``first_seq ...`` succeeded, with ``checkpoint``."""
        if not payloads:
            return
        if self._entries and first_seq != self.high + 1:
            self._entries.clear()  # not dense (another writer in between): start again
        self._entries.extend(payloads)
        self.high = first_seq + len(payloads) - 1
        self.checkpoint = checkpoint

    def held(self, seq: int) -> bytes | None:
        if self.low <= seq <= self.high:
            return self._entries[seq - self.low]
        return None

    def reconcile(
        self, head: int, earliest: int, logged: Mapping[int, bytes]
    ) -> Rewrite | Refuse | None:
        """Compare with a log at ``head`` retaining from ``earliest``; None: they agree.

        ``logged``: the log's entries for the seqs from ``max(low, earliest)``
        to ``min(head, high)`` (the caller reads exactly those).
        """
        if self.high == 0:
            return None
        for seq in range(max(self.low, earliest), min(head, self.high) + 1):
            if logged.get(seq) != self.held(seq):
                found = "nothing" if seq not in logged else "another entry"
                return Refuse(f"the log holds {found} at seq {seq}, which was pushed")
        if head >= self.high:
            return None
        if head + 1 < self.low:
            return Refuse(
                f"the log's head is {head} but seqs up to {self.high} were pushed, "
                f"and only {self.low}..{self.high} are still held to rewrite them"
            )
        payloads = tuple(self._entries)[head + 1 - self.low :]
        return Rewrite(after=head, payloads=payloads, checkpoint=self.checkpoint)

    def forget(self) -> None:
        """Drop everything (a refused collection, or another leader's log now)."""
        self._entries.clear()
        self.high = 0
        self.checkpoint = ""
