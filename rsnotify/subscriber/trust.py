"""What a Destination may believe, and from whom (pure: no I/O, time passed in).

A Destination learns of changes from two kinds of witness:

* **the Source itself**: its Change Lists, Resource Lists and the bytes it
  serves, read over HTTP from the Source's origin.  This is ResourceSync's
  source of truth (Z39.99 section 12.1: a Destination finds its place in the
  Change Lists by change time).
* **push**: notifications from a broker, a WebSocket gateway or a WebSub hub.
  Without ``--secret`` anyone who can publish on the channel can write one
  (an MQTT broker without ACLs accepts anonymous publishers), and even a
  genuine one can carry a datetime from a clock that jumped ahead.

The rule this module supports: **a pushed notification never moves what the
Destination trusts beyond what it verified.**  Concretely (see
:mod:`.sync` and :mod:`.applier`):

1. The Change List position of the cursor advances only over entries read
   from the Source's own Change Lists.  A pushed change is a *hint*: it makes
   the Destination fetch the resource from the Source now, but the next walk
   of the Change Lists still starts from the last position the Source itself
   confirmed.
2. A change whose datetime lies beyond ``now + max_skew`` is refused when
   pushed and never trusted for ordering when read (:func:`beyond_skew`).
3. The per-resource state written by an unsigned push is *provisional*: it
   never makes a later change look "already applied" unless that change has
   exactly the same identity (loc, datetime, change type).  A forged datetime
   can therefore cost a re-fetch, never a skipped change.
4. A deletion pushed without a signature removes a file only after the
   Source answers 404 or 410 for it (or the Change List lists the deletion).
5. Sequence numbers on an unsigned channel are counted for gap detection but
   not believed: a "duplicate" whose identity was not seen under that number
   is applied anyway, and two different notifications claiming one number
   are reported (:class:`SeqMemory`).
6. Every doubt raised by untrusted input (a refused, conflicting or
   unconfirmed notification, a garbage payload) leads to a catch-up from the
   Change List Index, at most one per ``interval`` (:class:`DoubtLimiter`),
   so a flood of forgeries costs the Source one walk per interval, not one
   per message.

With ``--secret`` a notification whose signature verifies counts as
confirmed: its publisher read it from the Change List.  Rule 2 still applies.
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import datetime, timedelta

__all__ = [
    "DEFAULT_DOUBT_INTERVAL",
    "DEFAULT_MAX_SKEW",
    "DoubtLimiter",
    "SeqMemory",
    "beyond_skew",
]

DEFAULT_MAX_SKEW = 300.0  # seconds: the usual bound for clock skew between hosts
DEFAULT_DOUBT_INTERVAL = 5.0  # seconds between catch-ups caused by untrusted input
SEQ_MEMORY = 4096  # recent sequence numbers remembered with their change's identity

Identity = tuple[str, datetime, str]  # (loc, change time, change type)


def beyond_skew(when: datetime, now: datetime, max_skew: float) -> bool:
    """True if ``when`` lies more than ``max_skew`` seconds after ``now``.

    No clock is exact, so a Source a little ahead of the Destination is
    normal; a notification dated a year ahead is a forgery or a broken clock,
    and believing it would make every genuine change before that date look
    old.
    """
    return when - now > timedelta(seconds=max_skew)


class SeqMemory:
    """The identities recently received under each sequence number (bounded).

    On a channel anyone may publish to, a sequence number proves nothing: a
    forged notification can take the number the genuine one will arrive with.
    Remembering which change came with which number tells a true duplicate (a
    QoS 1 redelivery, a replay overlap: same identity) from a collision.
    """

    def __init__(self, size: int = SEQ_MEMORY) -> None:
        self._size = size
        self._seen: OrderedDict[int, Identity] = OrderedDict()

    def remember(self, seq: int, identity: Identity) -> Identity | None:
        """Record ``identity`` under ``seq``; return a *different* identity already there."""
        previous = self._seen.get(seq)
        if previous is not None and previous != identity:
            return previous
        self._seen[seq] = identity
        self._seen.move_to_end(seq)
        if len(self._seen) > self._size:
            self._seen.popitem(last=False)
        return None

    def seen(self, seq: int, identity: Identity) -> bool:
        """True if exactly this change was received under ``seq``."""
        return self._seen.get(seq) == identity

    def clear(self) -> None:
        self._seen.clear()


class DoubtLimiter:
    """Turns doubts raised by untrusted input into at most one catch-up per interval.

    A doubt is never dropped: one raised during the quiet interval waits for
    its end.  Several doubts raised meanwhile share one catch-up (the first
    reason is kept, the rest counted), since one walk of the Change Lists
    settles all of them.
    """

    def __init__(self, interval: float = DEFAULT_DOUBT_INTERVAL) -> None:
        self.interval = interval
        self.reason: str | None = None
        self.count = 0
        self._not_before = float("-inf")

    def raise_doubt(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.count += 1

    def due(self, now: float) -> str | None:
        """The reason to catch up now, or None (nothing doubted, or too soon)."""
        if self.reason is None or now < self._not_before:
            return None
        reason = self.reason
        if self.count > 1:
            reason = f"{reason} (and {self.count - 1} more)"
        self.reason = None
        self.count = 0
        self._not_before = now + self.interval
        return reason

    def settled(self, now: float) -> None:
        """A catch-up happened for another reason: it settles every doubt raised before it."""
        self.reason = None
        self.count = 0
        self._not_before = max(self._not_before, now + self.interval)
