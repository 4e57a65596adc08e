"""Deadline-bound waiting: poll a condition until it holds or the deadline passes.

Tests, the demo and the benches synchronise with these instead of sleeping
and hoping: a condition that never comes true fails with a reason at a known
moment rather than hanging or passing by luck.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["DEFAULT_TIMEOUT", "Message", "async_wait_for", "wait_for"]

T = TypeVar("T")
Message = str | Callable[[], str]

DEFAULT_TIMEOUT = 10.0


def _message_text(message: Message) -> str:
    return message() if callable(message) else message


def wait_for(
    predicate: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.01,
    message: Message = "condition not met",
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Raises ``AssertionError(message)`` at the deadline so a test fails with a
    reason instead of hanging.  ``message`` may be a callable, evaluated only on
    failure (handy for including a process log).  Exceptions raised by the
    predicate propagate immediately: a predicate that wants to tolerate errors
    must catch them itself.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"{_message_text(message)} (waited {timeout:g} s)")
        time.sleep(min(interval, remaining))


async def async_wait_for(
    predicate: Callable[[], T | Awaitable[T]],
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.01,
    message: Message = "condition not met",
) -> T:
    """:func:`wait_for` for async tests: yields to the event loop between polls.

    ``predicate`` may be a plain function or return an awaitable (e.g. an
    ``async def``); the awaited value is what is tested and returned.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"{_message_text(message)} (waited {timeout:g} s)")
        await asyncio.sleep(min(interval, remaining))
