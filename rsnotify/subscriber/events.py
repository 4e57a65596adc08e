"""What a push channel hands the sync engine (plain data, no behaviour).

Channels (MQTT, WebSocket) run their network code in their own way, then put
these events on the collection's queue; the engine is the only consumer, so
every decision about one collection is taken by one task, in order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from ..framework import FrameworkNotification


@dataclass(frozen=True, slots=True)
class Message:
    """A notification payload as received, not yet decoded or verified."""

    payload: bytes
    signature: str | None = None
    prev: int | None = None  # WebSocket: the previous seq this client was sent
    received: float = field(default_factory=time.time)
    # Which connection delivered it: after a replay (a new WebSocket connection)
    # messages still queued from the old one are stale and dropped.
    generation: int = 0


@dataclass(frozen=True, slots=True)
class Head:
    """The publisher's head (retained MQTT message, WebSocket hello/heartbeat)."""

    head: int
    earliest: int | None = None
    heartbeat: datetime | None = None


@dataclass(frozen=True, slots=True)
class Connected:
    """The channel's subscription is in place: from ``at`` on, what is published arrives.

    ``session_present``: the broker or hub kept the subscription across the
    break, with what was published meanwhile (MQTT's persistent session, a
    WebSocket replay from the last seq, a WebSub lease still running).
    ``at``: when it was established (``time.monotonic()``), which is not when
    the engine reads the event: a subscription established after a catch-up
    began leaves a window that only another catch-up covers
    (:meth:`.gaps.GapDetector.on_connect`).
    """

    session_present: bool
    at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class Disconnected:
    reason: str


@dataclass(frozen=True, slots=True)
class Unavailable:
    """The channel cannot deliver: the broker ``refused`` it or is ``unreachable``.

    Sent on every failed connection attempt (``retry_in``: seconds until the
    channel tries again by itself) and when the broker refuses a subscription
    (``retry_in`` None: nothing will arrive on it until the next connection).
    ``reason`` is one line that says what to change (bad credentials, a
    protocol the broker refuses, a refused topic, nothing listening...).
    """

    state: Literal["refused", "unreachable"]
    reason: str
    retry_in: float | None = None


@dataclass(frozen=True, slots=True)
class Skipped:
    """The server dropped ``first..resume-1`` because this client was too slow."""

    first: int
    resume: int


@dataclass(frozen=True, slots=True)
class TooOld:
    """The log no longer holds what a replay asked for: poll the Change List Index."""

    since: int
    earliest: int


@dataclass(frozen=True, slots=True)
class Invalid:
    """A frame that could not be read at all (it was *something*: assume a gap)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Overflow:
    """The channel dropped events because the engine's queue was full."""


@dataclass(frozen=True, slots=True)
class Framework:
    """A Framework Notification from the collection's framework channel (decoded, and
    signed by the hub): a capability document of the Source changed.  A hint, like
    every pushed thing: what the engine does with it, it verifies at the Source."""

    notification: FrameworkNotification
    received: float = field(default_factory=time.time)


Event = (
    Message
    | Head
    | Connected
    | Disconnected
    | Unavailable
    | Skipped
    | TooOld
    | Invalid
    | Overflow
    | Framework
)
