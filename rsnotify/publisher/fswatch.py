"""File-system notifications for a directory Source (``rsnotify publish --watch``).

inotify, read on the event loop itself (asyncinotify): no thread hop, and
only the two events that mean "a document changed" are asked for:
``IN_CLOSE_WRITE`` (a writer finished writing a file in place) and
``IN_MOVED_TO`` (an atomic writer renamed a finished temporary file into
place).  Opens and reads (including the publisher's own) are not reported, so
reading a list can never trigger the next poll.  Only the directories that
hold a collection's Change List Index and Change Lists are watched, not the
resources beside them.

inotify is Linux; elsewhere :func:`available` is False and the publisher
polls at ``--poll`` instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("rsnotify.publish")

try:  # pragma: no cover - the import fails only off Linux
    from asyncinotify import Inotify, Mask
except (ImportError, OSError):  # pragma: no cover
    Inotify = None  # type: ignore[assignment, misc]


def available() -> bool:
    return Inotify is not None


class DirectoryWatch:
    """Calls a trigger whenever an ``.xml`` file in one of its directories is written."""

    def __init__(self) -> None:
        if Inotify is None:
            raise RuntimeError("inotify is not available on this system")
        self._inotify = Inotify()
        self._triggers: dict[Path, set[Callable[[], None]]] = {}

    def watch(self, directory: Path, trigger: Callable[[], None]) -> None:
        """Watch ``directory`` (idempotent) and call ``trigger`` on changes in it."""
        directory = directory.resolve()
        triggers = self._triggers.get(directory)
        if triggers is None:
            try:
                self._inotify.add_watch(directory, Mask.CLOSE_WRITE | Mask.MOVED_TO)
            except OSError as exc:
                log.warning("cannot watch %s: %s", directory, exc)
                return
            triggers = self._triggers[directory] = set()
        triggers.add(trigger)

    async def run(self) -> None:
        async for event in self._inotify:
            if event.path is None or event.watch is None or event.path.suffix != ".xml":
                continue
            for trigger in self._triggers.get(Path(event.watch.path), ()):
                trigger()

    def close(self) -> None:
        self._inotify.close()
