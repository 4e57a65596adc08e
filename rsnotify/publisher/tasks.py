"""Groups of tasks that start together and stop together, and a stoppable pause.

The publisher's work comes in lifetimes: the whole process (telemetry, the
election, the directory watch), a leadership term (the transports' loops),
and detection inside a term, which must stop first so nothing new is logged
while the transports drain.  Each lifetime is a :class:`TaskGroup`, stopped
as a whole: no task is ever picked out by its coroutine's name.

Not :class:`asyncio.TaskGroup`: there the first failing task cancels its
siblings and the failure leaves an ``async with`` that would have to enclose
the whole process.  Here a task that fails ends alone, as it always has (a
transport that fails leaves detection running: what it finds waits in the
log), and is logged with its traceback: a loop that died is never silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["TaskGroup", "pause"]

log = logging.getLogger("rsnotify.publish")


class TaskGroup:
    """Tasks of one lifetime: spawned one by one, cancelled and awaited all at once."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[Any]] = []

    def spawn(
        self, coro: Coroutine[Any, Any, Any], *, name: str | None = None
    ) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.append(task)
        task.add_done_callback(_report_failure)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    async def cancel(self) -> None:
        """Cancel every task and wait until all have ended (their exceptions are dropped)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _report_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("%s stopped: %r", task.get_name(), exc, exc_info=exc)


async def pause(stopping: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds``, or less if ``stopping`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stopping.wait()
