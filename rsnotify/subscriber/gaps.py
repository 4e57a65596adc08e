"""Gap detection for one collection (pure: no I/O, time passed in).

Push is the fast path and is never trusted alone.  The detector watches the
stream of sequence numbers and the publisher's head/heartbeat and says when
the subscriber may have missed something, so the caller catches up from the
log or the Change List Index.  It flags:

* a sequence jump (a broker silently dropped QoS 1 messages, a filter bug);
* a (re)connection without a surviving session established after the last
  catch-up began (what was published between the two reached nobody);
* a head (retained MQTT message, WebSocket hello/heartbeat) ahead of what was
  received, not filled within a grace period;
* no heartbeat for ``heartbeat_timeout`` (publisher or connection dead,
  including half-open TCP connections that never error);
* an undecodable or badly signed payload (it was *something*: assume a gap);
* for notifications without sequence numbers (a Source or hub that knows
  nothing of rsnotify), a break in the Change Notification interval chain:
  a ``from`` later than the last ``until`` received (section 3: consecutive
  notifications cover consecutive, non-overlapping intervals);
* and, on a timer, a safety poll, because push alone is never trusted.

Duplicates (QoS 1 redelivery, replay overlap) are recognised and dropped.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime


class Verdict(enum.Enum):
    APPLY = "apply"  # the next notification in order
    DUPLICATE = "duplicate"  # already received: drop
    GAP = "gap"  # something before it is missing: catch up first


@dataclass(frozen=True, slots=True)
class Gap:
    """Why the subscriber must catch up, and which sequence numbers are known missing."""

    reason: str
    first_missing: int | None = None
    last_missing: int | None = None
    # True: only a walk of the Change Lists settles it (a replay from the log
    # would bring the same untrusted pushes again).
    walk: bool = False

    @property
    def size(self) -> int | None:
        if self.first_missing is None or self.last_missing is None:
            return None
        return self.last_missing - self.first_missing + 1


class GapDetector:
    """Per-collection sequence tracking; every method is a pure state transition.

    ``expected`` is the next sequence number the detector wants, or None when
    it does not know (first connection, after a Change List catch-up): the
    next notification then starts the count.  That is safe only for a
    subscription established before the catch-up began, which the service
    waits for (see subscriber.service); one established later is a gap
    (:meth:`on_connect`, from :attr:`covered_before`).
    """

    def __init__(
        self,
        *,
        last_seq: int | None = None,
        heartbeat_timeout: float = 30.0,
        head_grace: float = 5.0,
        safety_interval: float = 300.0,
        now: float = 0.0,
    ) -> None:
        self.expected: int | None = None if last_seq is None else last_seq + 1
        self.heartbeat_timeout = heartbeat_timeout
        self.head_grace = head_grace
        self.safety_interval = safety_interval
        self.last_heartbeat = now
        self.next_safety_poll = now + safety_interval
        self._head_seen: int | None = None
        self._head_deadline: float | None = None
        self._heartbeat_gap_raised = False
        self.last_until: datetime | None = None  # the interval chain (notifications without seq)
        # When the latest catch-up began (the caller's clock): what was published
        # before it is in what that catch-up read.
        self.covered_before: float | None = None

    # -- notifications ---------------------------------------------------------------

    def on_notification(self, seq: int, prev: int | None = None) -> tuple[Verdict, Gap | None]:
        """Classify one notification; ``prev`` is the WebSocket frame's previous seq, if any."""
        expected = self.expected
        if expected is None:
            self.expected = seq + 1
            self._settle_head()
            return Verdict.APPLY, None
        if seq < expected:
            return Verdict.DUPLICATE, None
        if seq == expected or (prev is not None and prev == expected - 1):
            self.expected = seq + 1
            self._settle_head()
            return Verdict.APPLY, None
        self.expected = seq + 1
        return Verdict.GAP, Gap("sequence jump", expected, seq - 1)

    def rewind(self, seq: int) -> None:
        """Expect ``seq + 1`` next, although a higher number was counted before.

        For unsigned channels only (see rsnotify.subscriber.trust): a number
        below the expected one that was never received means the count was
        pushed ahead by a forged notification, or the publisher started over;
        either way the sequence now arriving is the one to follow.
        """
        self.expected = seq + 1
        self._head_seen = None
        self._head_deadline = None

    def on_interval(
        self, start: datetime | None, end: datetime | None
    ) -> tuple[Verdict, Gap | None]:
        """Classify a notification without sequence numbers by its ``from``/``until``.

        Change Notification 1.0.1 section 3: consecutive notifications cover
        consecutive, non-overlapping intervals, so a ``from`` later than the
        last ``until`` means one never came (or either side restarted).  A
        ``from`` at or before it is in order, or an overlap or a repeat: its
        changes are applied, and applying them is idempotent.  The first
        notification after start-up or a catch-up starts the chain.
        """
        last = self.last_until
        if end is not None:
            self.last_until = end if last is None else max(last, end)
        if last is None or start is None or start <= last:
            return Verdict.APPLY, None
        return Verdict.GAP, Gap(
            f"interval chain broken: from {start.isoformat()} after until {last.isoformat()}"
        )

    def on_invalid(self, reason: str) -> Gap:
        """An undecodable, oversized or badly signed payload."""
        return Gap(f"invalid payload: {reason}")

    def on_skipped(self, first: int, resume: int) -> Gap:
        """The server dropped ``first..resume-1`` for this slow client."""
        return Gap("server skipped a slow client", first, resume - 1)

    # -- connection and head -----------------------------------------------------------

    def on_connect(
        self, *, session_present: bool, now: float, at: float | None = None
    ) -> Gap | None:
        """A subscription established at ``at`` (default ``now``): is anything missing?

        With a surviving session nothing is: the broker kept what came
        meanwhile.  Without one, what was published before ``at`` reached
        nobody by push, so only a catch-up that began *after* ``at`` covers
        it.  Hence a gap when the subscription came after the latest
        catch-up began: at start-up when the broker answered late (the
        start-up catch-up ran first), and on any reconnection.  Before the
        first catch-up (none recorded), a count in progress is what a
        session-less reconnection loses; a fresh one has nothing to lose yet.
        """
        self.last_heartbeat = now
        self._heartbeat_gap_raised = False
        if session_present:
            return None
        at = now if at is None else at
        if self.covered_before is not None:
            if at > self.covered_before:
                return Gap("subscribed without a session after the last catch-up began")
            return None
        if self.expected is not None:
            return Gap("reconnected without a session")
        return None

    def on_head(self, head: int, *, now: float) -> Gap | None:
        """The publisher's head (and heartbeat).  A head ahead must be filled soon."""
        self.last_heartbeat = now
        self._heartbeat_gap_raised = False
        if self.expected is None or head < self.expected:
            self._head_seen = None
            self._head_deadline = None
            return None
        if self._head_seen is None or head > self._head_seen:
            # Start (or extend) the grace period: queued messages may still be arriving.
            if self._head_deadline is None:
                self._head_deadline = now + self.head_grace
            self._head_seen = head
        return None

    def _settle_head(self) -> None:
        if self._head_seen is not None and self.expected is not None:
            if self._head_seen < self.expected:
                self._head_seen = None
                self._head_deadline = None
            else:  # progress: restart the grace period for the rest
                self._head_deadline = None

    # -- time ------------------------------------------------------------------------

    def tick(self, now: float) -> Gap | None:
        """Time passed: a head never filled, a silent publisher, or a safety poll due."""
        if self._head_seen is not None and self.expected is not None:
            if self._head_deadline is None:
                self._head_deadline = now + self.head_grace
            elif now >= self._head_deadline and self._head_seen >= self.expected:
                gap = Gap("head ahead of what was received", self.expected, self._head_seen)
                self._head_seen = None
                self._head_deadline = None
                return gap
        if not self._heartbeat_gap_raised and now - self.last_heartbeat > self.heartbeat_timeout:
            self._heartbeat_gap_raised = True
            return Gap(f"no heartbeat for {self.heartbeat_timeout:g}s")
        if now >= self.next_safety_poll:
            self.next_safety_poll = now + self.safety_interval
            return Gap("safety poll")
        return None

    # -- after catching up ---------------------------------------------------------------

    def catching_up(self, began: float) -> None:
        """A catch-up began at ``began``: everything published before is in what it reads."""
        self.covered_before = began

    def caught_up(self, through_seq: int | None, *, now: float) -> None:
        """Catch-up finished; ``through_seq`` is the last seq it covered, if known."""
        self.expected = None if through_seq is None else through_seq + 1
        self.last_until = None
        self._head_seen = None
        self._head_deadline = None
        self.next_safety_poll = now + self.safety_interval
