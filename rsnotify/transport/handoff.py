"""Calls from another thread run on the asyncio loop, in order, one wake-up per burst.

paho-mqtt runs its network loop in a thread of its own; its callbacks must
not touch state the loop owns.  :class:`~.mqttlink.BrokerLink` hands every
paho event (CONNACK, SUBACK, PUBACK, message, disconnect) to the loop
through one :class:`Handoff`, so its owners see them in the order paho did.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["Handoff"]


class Handoff:
    """Hands calls from paho's thread to the asyncio loop: in order, one wake-up per burst.

    A wake-up per event (``call_soon_threadsafe`` writes the loop's self-pipe
    and schedules a callback) was a visible share of the CPU at thousands of
    PUBACKs or messages a second.  Calls queue here instead, and one drain on
    the loop runs every call queued so far.  The flag is cleared by the drain
    *before* it empties the queue, so a call queued meanwhile either is run by
    that drain or schedules another: none is stranded.  ``deque.append`` and
    ``popleft`` are atomic, so the producing threads need no lock.
    """

    __slots__ = ("_calls", "_log", "_loop", "_scheduled")

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._loop: asyncio.AbstractEventLoop | None = None
        self._calls: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = (
            collections.deque()
        )
        self._scheduled = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def post(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop, after every call posted before it (any thread)."""
        loop = self._loop
        if loop is None:
            return
        self._calls.append((fn, args))
        if not self._scheduled:
            self._scheduled = True
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
                loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        calls = self._calls
        while calls:
            fn, args = calls.popleft()
            try:
                fn(*args)
            except Exception:  # one failing owner callback must not strand the rest
                self._log.exception("MQTT: an event handler failed")
