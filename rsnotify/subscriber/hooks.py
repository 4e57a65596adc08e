"""Callbacks a program embedding the subscriber runs per change: created, updated, deleted, failed.

The ``--on-change CMD`` option is one user of them; a Python program passes
its own :class:`Hooks` (or any object or mapping with these names).  A hook
never changes an outcome: one that raises is logged and the next change goes
on.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Any (strict module): a hook is any sync or async callable, and the hooks any object
# or mapping with these names (duck-typed on purpose: see the class docstring).

__all__ = ["Hooks", "call_hook"]

log = logging.getLogger("rsnotify.subscribe")


@dataclass(slots=True)
class Hooks:
    """Optional callables run after a successful apply: ``fn(change, path)``.

    Any object with these attribute names works too (or a mapping of them).
    Sync and async callables are both accepted; a hook that raises is logged
    and does not change the outcome.  ``on_failed(change, outcome, detail)``
    runs for every outcome that is not :attr:`.rules.Outcome.done`.  Hooks of one
    resource run in the order its changes are applied; a change a later one of
    its resource supersedes (queued behind it, or later in the same catch-up
    walk: a deletion too) runs none, the later one's runs.  With ``metadata_only``
    the hooks still run (that is how a Destination that fetches elsewhere
    learns of changes); ``path`` is then where the file would be.
    """

    on_created: Any = None
    on_updated: Any = None
    on_deleted: Any = None
    on_failed: Any = None


async def call_hook(hooks: Any, name: str, *args: Any) -> None:
    """Run ``hooks.<name>(*args)`` if it exists (sync or async); log, never raise, its failure."""
    if hooks is None:
        return
    fn = hooks.get(name) if isinstance(hooks, Mapping) else getattr(hooks, name, None)
    if fn is None:
        return
    try:
        result = fn(*args)
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("%s hook failed", name)
