"""Honour task cancellations that a library swallowed.

redis-py's asyncio client (seen with redis 8.1, single commands and
pipelines) can absorb the ``CancelledError`` thrown into a command in flight
and return normally.  The task then still counts the request
(``Task.cancelling()`` stays above zero) but runs on, so a loop that awaits
Redis keeps going after ``task.cancel()``: a cancelled leader went on
renewing its lease, and a ``stop()`` that cancels and then awaits such a
loop would wait forever.  Every long-running loop that awaits Redis calls
:func:`raise_if_cancelled` once per turn.
"""

from __future__ import annotations

import asyncio

__all__ = ["raise_if_cancelled"]


def raise_if_cancelled() -> None:
    """Raise ``CancelledError`` if the current task was asked to stop and is still running."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
