"""lxml pull parsers lent out and taken back, so a parsed document leaves no garbage cycle.

An lxml ``XMLPullParser`` that has parsed a document is part of a reference
cycle: the document it built refers back to it (document -> parser -> its
parser context -> the tag matcher's cached document, or the events not yet
read -> their elements -> document).  Reference counting never frees such a
parser; only the cyclic garbage collector does, and each collection is a
pause of the thread that triggers it.  The publisher reads the new end of a
Change List at every change, and a subscriber every list of a walk: at 200
changes/s the publisher left ~5,600 objects of that garbage a second, and
the collector ran every ~2 s for 5-14 ms of its event loop (``gc.callbacks``
during ``bench.e2e``; lxml 6.1).

A closed parser parses the next document as a fresh one does (lxml resets
its context at the first ``feed``, and takes the dictionary of the thread
it runs in), once the events its last document left unread are drained:
lxml keeps them, and would hand them out first.  So each
:class:`ParserPool` keeps the parsers given back to it, a few per thread
(threads parse at once: each takes from its own), and lends each to one
reader at a time.  Made once, a pooled parser's cycle never becomes
garbage; the one document it keeps alive until its next parse is the last
one it read (what the reader left of it).  A parser whose reader stopped
early or failed is simply not given back.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

# Any (strict module): lxml parsers (lxml-stubs lacks XMLPullParser's methods).

__all__ = ["ParserPool"]


class ParserPool:
    """Parsers made by ``factory``, at most ``keep`` idle per thread."""

    def __init__(self, factory: Callable[[], Any], *, keep: int = 4) -> None:
        self._factory = factory
        self._keep = keep
        self._local = threading.local()

    def take(self) -> Any:
        """An idle parser of this thread, else a new one; :meth:`give` it back when closed."""
        idle: list[Any] | None = getattr(self._local, "idle", None)
        return idle.pop() if idle else self._factory()

    def give(self, parser: Any) -> None:
        """Keep ``parser``, closed by its user, for this thread's next :meth:`take`."""
        # Events left unread would come first out of the next document's parse.
        deque(parser.read_events(), maxlen=0)
        idle: list[Any] | None = getattr(self._local, "idle", None)
        if idle is None:
            idle = self._local.idle = []
        if len(idle) < self._keep:
            idle.append(parser)
