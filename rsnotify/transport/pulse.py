"""A broadcast wake-up for asyncio tasks that wait on shared state.

The MQTT pusher's lanes, heartbeat and drain all wait for "something
changed" (an ack freed a slot, a connection came or went, a stop was
asked) and then look at the state themselves.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["Pulse"]


class Pulse:
    """Wake every waiter on any state change.

    Usable from plain callbacks, unlike ``asyncio.Condition.notify_all``.
    """

    __slots__ = ("_event", "_scheduled")

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._scheduled = False

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def fire_soon(self) -> None:
        """Fire once this loop turn is over: a burst of calls wakes the waiters once."""
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._fire_scheduled)

    def _fire_scheduled(self) -> None:
        self._scheduled = False
        self.fire()

    async def wait(self, timeout: float | None = None) -> None:
        """Until the next fire, or ``timeout`` seconds (no error either way)."""
        event = self._event
        if timeout is None:
            await event.wait()
            return
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
        # cancellation that races with the event being set.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(timeout, 0.0)):
                await event.wait()
