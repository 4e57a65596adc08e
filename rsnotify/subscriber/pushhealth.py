"""Is push working?  When it is not, poll the Change Lists on a timer (pure: time passed in).

The mission is to fall back on the Change List Index; the gap detector
(:mod:`.gaps`) catches up *once* per sign of trouble.  That is right for a
hiccup, wrong for an outage: with a broker down, refusing the protocol, behind
a firewall or named by a wrong URL, the next catch-up used to be the 300 s
safety poll, and the mirror fell minutes behind without an alarm.

:class:`PushHealth` keeps one of three modes per collection:

* ``push``: the channel is connected and alive (a heartbeat, a head or a
  valid notification arrived);
* ``polling``: the channel has been down longer than ``grace`` (not
  connected, refused, unreachable) or silent past the heartbeat timeout;
  the engine walks the Change Lists every ``interval`` seconds (conditional,
  ranged GETs: cheap for the Source) while the channel keeps reconnecting
  with its own backoff;
* (the engine's own ``catching-up`` while a walk runs.)

It returns to ``push`` on the first sign of life of a connected channel,
and asks for one catch-up then, so the switch loses nothing (whatever was
published while it polled and not received is in the Change Lists) and
applies nothing twice (the resource store makes repeats no-ops).

Defaults: ``grace`` 5 s (a broker restart or a WebSocket reconnect usually
takes less), ``interval`` 10 s: an idle Source answers two conditional GETs
(304) per interval, about 17,000 small requests a day, and the mirror stays
within about 15 s of the Source for as long as push is down.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_GRACE = 5.0
DEFAULT_INTERVAL = 10.0


@dataclass(frozen=True, slots=True)
class Transition:
    """A mode change to report: ``mode`` is "push" or "polling", ``reason`` says why."""

    mode: str
    reason: str


class PushHealth:
    """The push-or-poll state machine of one collection (every method a pure transition)."""

    def __init__(
        self,
        *,
        grace: float = DEFAULT_GRACE,
        interval: float = DEFAULT_INTERVAL,
        now: float = 0.0,
        channel: bool = True,
    ) -> None:
        self.grace = grace
        self.interval = interval
        self.connected = False
        self.mode = "push"
        self.reason = "waiting for the push channel" if channel else "no push channel"
        self._down_since: float | None = now
        self._next_poll = now
        self._changed: Transition | None = None
        if not channel:  # nothing will ever be pushed: poll from the start
            self._enter_polling(now, self.reason)

    # -- what the channel says ------------------------------------------------------

    def on_connected(self, now: float) -> None:
        self.connected = True
        self._down_since = None

    def on_alive(self, now: float) -> Transition | None:
        """A heartbeat, head or valid notification: push works (if connected)."""
        if not self.connected:
            self.on_connected(now)
        if self.mode == "polling":
            self.mode = "push"
            self.reason = "push is back"
            return Transition("push", self.reason)
        return None

    def on_down(self, reason: str, now: float, *, at_once: bool = False) -> None:
        """Disconnected, unreachable or refused; ``at_once``: waiting will not fix it."""
        self.connected = False
        self.reason = reason
        if self._down_since is None:
            self._down_since = now
        if at_once and self.mode == "push":
            self._enter_polling(now, reason)

    def on_silent(self, reason: str, now: float) -> None:
        """Connected but nothing alive arrived within the heartbeat timeout."""
        if self.mode == "push":
            self._enter_polling(now, reason)

    # -- time --------------------------------------------------------------------------

    def tick(self, now: float) -> tuple[Transition | None, bool]:
        """(a mode change to report, whether a poll of the Change Lists is due now)."""
        if (
            self.mode == "push"
            and not self.connected
            and self._down_since is not None
            and now - self._down_since >= self.grace
        ):
            self._enter_polling(now, self.reason)
        changed, self._changed = self._changed, None
        if self.mode == "polling" and now >= self._next_poll:
            self._next_poll = now + self.interval
            return changed, True
        return changed, False

    def _enter_polling(self, now: float, reason: str) -> None:
        self.mode = "polling"
        self.reason = reason
        self._next_poll = now  # the first poll at once
        self._changed = Transition("polling", reason)
