"""Spare inode pools for tests, skipped (with the reason) where the system cannot swap.

A pool needs ``renameat2(RENAME_EXCHANGE)``, file leases (``F_SETLEASE``;
off in some containers, ``fs.leases-enable=0``, NFS) and one filesystem for
the pool and its targets.  Where any is missing the pool turns itself off
and ``--spare-inodes`` falls back to renames; the tests of the pool itself
have nothing to test there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from rsnotify import spare as spare_module
from rsnotify.spare import SparePool
from rsnotify.subscriber.mirror import Mirror


def usable_pool(
    directory: str | os.PathLike[str], probe_dir: str | os.PathLike[str], **kwargs: int
) -> SparePool:
    """A :class:`SparePool` in ``directory`` for targets in ``probe_dir``, or skip the test."""
    Path(probe_dir).mkdir(parents=True, exist_ok=True)
    pool = SparePool(directory, probe_dir, **kwargs)
    if not pool.enabled:
        pytest.skip(f"spare inodes unavailable here: {pool.reason}")
    return pool


def require_spares(scratch: Path) -> None:
    """Skip unless a pool would work for targets in ``scratch`` (probed, leaving nothing).

    The probe pool lives beside ``scratch``, not in it: ``scratch`` may be a
    mirror root whose contents a test checks.
    """
    directory = Path(tempfile.mkdtemp(prefix=f"{scratch.name}-probe-", dir=scratch.parent))
    try:
        usable_pool(directory, scratch).close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def spare_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Mirror:
    """A mirror at ``tmp_path/m`` with spares in ``tmp_path/spare``, reused at once (MIN_AGE 0)."""
    monkeypatch.setattr(spare_module, "MIN_AGE", 0.0)
    require_spares(tmp_path)
    return Mirror(tmp_path / "m", spare_dir=tmp_path / "spare")
