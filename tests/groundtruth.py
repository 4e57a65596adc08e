"""How a mirror differs from the simulator's ground truth, file for file.

The simulator serves its own state (``<source>_simulator/state``: every
resource's SHA-256 per collection); a mirror is right when it holds exactly
those files with exactly those digests, and nothing else but the mirror's
own temporary files.  :func:`tree_differences` compares a mirror with any
``{loc: SHA-256}`` (e.g. :mod:`tests.rlsource`'s).  Used by ``make demo``
(:mod:`tests.demo`), the convergence tests, the chaos runs and ``bench/e2e.py``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rsnotify.subscriber.mirror import TEMP_PREFIX, path_for

__all__ = ["mirror_differences", "tree_differences"]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def mirror_differences(state: dict[str, Any], mirror: Path) -> list[str]:
    """How a mirror differs from the simulator's ground truth (empty: equal)."""
    return tree_differences(
        {
            loc: sha
            for collection in state["collections"].values()
            for loc, sha in collection["resources"].items()
        },
        mirror,
    )


def tree_differences(resources: Mapping[str, str], mirror: Path) -> list[str]:
    """How a mirror differs from ``resources`` (loc -> SHA-256 hex; empty: equal)."""
    expected = {path_for(loc, mirror): sha for loc, sha in resources.items()}
    found = {p for p in mirror.rglob("*") if p.is_file() and not p.name.startswith(TEMP_PREFIX)}
    out = [f"missing {p}" for p in expected if p not in found]
    out += [f"extra {p}" for p in found if p not in expected]
    out += [f"differs {p}" for p in found if p in expected and _sha256(p) != expected[p]]
    return out
