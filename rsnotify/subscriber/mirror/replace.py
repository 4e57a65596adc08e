"""How a file in the mirror is replaced: a temp file renamed over it, or a spare inode swapped in.

:class:`RenameReplace` (the default) is what rsync, git and dpkg do: the new
bytes go to ``%tmp.<random>`` beside the target, which is fsynced and renamed
over the target, then the directory is fsynced (by :mod:`.commit`).  A
reader sees the old file or the new one, never a partial one, and a new
file takes the attributes of its own directory.

:class:`SpareSwapReplace` (``--spare-inodes``) fills an inode an earlier
replace or delete retired instead of a new temp file and swaps it into place
(:mod:`rsnotify.spare`): the same atomicity without an inode allocation per
change.  Its CPU saving is on ext4 *without a journal*, where allocating an
inode freed in the last minutes is most of a small write's CPU; with a
journal (ext4's default) it saves no CPU, though at 1,000 changes/s renames
fell behind on a busy machine where spares kept up (bench/README.md).  Files then carry the spare
directory's inherited attributes (SELinux label, default ACL, setgid group)
rather than their own directory's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ...spare import SparePool, SpareUnusable, fill
from .paths import DEFAULT_PORTS, TEMP_PREFIX

__all__ = [
    "RenameReplace",
    "ReplaceStrategy",
    "SpareSwapReplace",
    "Staged",
    "make_replace",
    "remove_stale_temps",
    "write_all",
]

log = logging.getLogger("rsnotify.subscribe")

#: The name of a temp file :func:`new_temp` makes, and the only kind cleaned up.
_TEMP_NAME = re.compile(re.escape(TEMP_PREFIX) + r"[0-9a-f]{16}")


@dataclass(slots=True, eq=False)
class Staged:
    """One replace or delete under way: the target, and the temp file holding the new bytes.

    The descriptors are owned (:func:`.commit.release` closes them).
    """

    dir_fd: int  # the target's directory, opened without following symlinks
    dirty: list[int]  # parents that gained a subdirectory: fsync them too
    name: str  # the target's name in ``dir_fd``
    path: Path | str  # the target's mirror path, for messages
    delete: bool = False  # remove the target instead of replacing it
    data: bytes | None = None  # the body, when it is in memory (a failed swap rewrites it)
    fd: int = -1  # the temp file, open for writing until fsynced
    temp: str = ""  # its name; "" once renamed (or discarded)
    spare: bool = False  # ``temp`` is a spare pool slot (in the pool's directory)
    digests: dict[str, str] = field(default_factory=dict)
    # The pool slot now holding the inode this replace or delete retired:
    # reusable only once this directory's fsync has returned.
    retired: str = ""


class ReplaceStrategy(Protocol):
    """The steps of a replace that differ between a rename and a spare swap.

    :mod:`.commit` runs them in order: :meth:`open_temp`, :meth:`write`,
    (fsync), :meth:`install` or :meth:`remove`, (directory fsync), then
    :meth:`settle`; :meth:`discard` and :meth:`forget` undo on failure.
    """

    @property
    def spares(self) -> SparePool | None: ...

    def open_temp(self, item: Staged, *, reuse: bool) -> None: ...

    def write(self, item: Staged, data: bytes) -> None: ...

    def install(self, item: Staged) -> None: ...

    def remove(self, item: Staged) -> bool: ...

    def discard(self, item: Staged) -> None: ...

    def settle(self, item: Staged) -> None: ...

    def forget(self, item: Staged) -> None: ...

    def close(self) -> None: ...


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


# Temp names come from a generator seeded once per process (and again in a
# forked child), not from the system's randomness: one syscall fewer per
# write, each of which hands the interpreter lock away and must win it back
# from a busy event loop.  O_EXCL, not the name, is what makes the file fresh.
_NAMES = random.Random()
os.register_at_fork(after_in_child=_NAMES.seed)
_TEMP_ATTEMPTS = 16


def new_temp(dir_fd: int) -> tuple[int, str]:
    """Create a fresh temp file in ``dir_fd``: ``(fd, name)`` (``_TEMP_NAME``'s shape).

    A name already taken (a leftover of an interrupted write) is drawn again.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    attempts = 0
    while True:
        temp = f"{TEMP_PREFIX}{_NAMES.getrandbits(64):016x}"
        try:
            return os.open(temp, flags, 0o644, dir_fd=dir_fd), temp
        except FileExistsError:
            attempts += 1
            if attempts == _TEMP_ATTEMPTS:
                raise


class RenameReplace:
    """Temp file beside the target, renamed over it; deletes unlink."""

    @property
    def spares(self) -> SparePool | None:
        return None

    def open_temp(self, item: Staged, *, reuse: bool) -> None:
        """Give ``item`` a temp file (``reuse``: a recycled one is welcome; not here)."""
        item.fd, item.temp = new_temp(item.dir_fd)

    def write(self, item: Staged, data: bytes) -> None:
        """Put ``data`` in ``item``'s fresh temp file."""
        write_all(item.fd, data)

    def install(self, item: Staged) -> None:
        """Rename the fsynced temp file over the target (a symlink there is replaced)."""
        os.replace(item.temp, item.name, src_dir_fd=item.dir_fd, dst_dir_fd=item.dir_fd)
        item.temp = ""

    def remove(self, item: Staged) -> bool:
        """Delete the target; False when there is no file (missing, or a directory: kept)."""
        dir_fd, name = item.dir_fd, item.name
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return False
        except (IsADirectoryError, PermissionError):
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                return False
            raise
        return True

    def discard(self, item: Staged) -> None:
        """Remove a temp file that will not be renamed."""
        temp, item.temp = item.temp, ""
        if temp:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=item.dir_fd)

    def settle(self, item: Staged) -> None:
        """The target's directory is fsynced: nothing is held back for a rename."""

    def forget(self, item: Staged) -> None:
        """That directory's fsync failed or never ran: nothing is held back for a rename."""

    def close(self) -> None:
        """Nothing to release."""


class SpareSwapReplace(RenameReplace):
    """Spare inodes swapped into place (``renameat2(RENAME_EXCHANGE)``) where possible.

    Only for bodies in memory (``reuse``): the pool keeps small inodes.  A
    directory on another filesystem than the pool, or one a swap failed in,
    falls back to :class:`RenameReplace`'s steps.
    """

    def __init__(self, pool: SparePool) -> None:
        self.pool = pool
        self._dev = os.fstat(pool.dir_fd).st_dev
        self._no_swaps: set[tuple[int, int]] = set()  # directories a swap failed for

    @property
    def spares(self) -> SparePool | None:
        return self.pool

    def _usable(self, dir_fd: int) -> bool:
        """True if the pool can swap with files in ``dir_fd`` (same filesystem)."""
        if not self.pool.enabled:
            return False
        info = os.fstat(dir_fd)
        return info.st_dev == self._dev and (info.st_dev, info.st_ino) not in self._no_swaps

    def open_temp(self, item: Staged, *, reuse: bool) -> None:
        """A pool slot when ``reuse`` and one is free (``item.spare``), else a new temp file."""
        slot = self.pool.open() if reuse and self._usable(item.dir_fd) else None
        if slot is None:
            super().open_temp(item, reuse=reuse)
            return
        item.temp, item.fd = slot
        item.spare = True

    def write(self, item: Staged, data: bytes) -> None:
        """A spare may hold a retired version: overwrite it and cut the rest."""
        if item.spare:
            fill(item.fd, data)
        else:
            super().write(item, data)

    def install(self, item: Staged) -> None:
        """Swap a filled spare into place; where no swap is possible, write a new file instead.

        A swap fails with EXDEV between directories of one filesystem that
        differ in project quota, or across a bind mount (same device
        number), and with EINVAL where the filesystem lacks
        ``RENAME_EXCHANGE``: the directory is then written to the plain way
        from now on.
        """
        if not item.spare:
            super().install(item)
            return
        assert item.data is not None
        temp, item.temp = item.temp, ""  # the pool has the slot back whatever happens
        try:
            item.retired = self.pool.install(temp, item.dir_fd, item.name, settle=False) or ""
            return
        except SpareUnusable as exc:
            info = os.fstat(item.dir_fd)
            self._no_swaps.add((info.st_dev, info.st_ino))
            log.info("%s: writing new files in this directory (%s)", item.path, exc)
        item.spare = False
        item.fd, item.temp = new_temp(item.dir_fd)
        try:
            write_all(item.fd, item.data)
            os.fsync(item.fd)
        finally:
            os.close(item.fd)
            item.fd = -1
        super().install(item)

    def remove(self, item: Staged) -> bool:
        """Delete the target, its inode kept in the pool when there is room (``item.retired``)."""
        if self._usable(item.dir_fd):
            retired = self.pool.retire(item.dir_fd, item.name, settle=False)
            if isinstance(retired, str):
                item.retired = retired
                return True
            if retired is not None:
                return retired
        return super().remove(item)

    def discard(self, item: Staged) -> None:
        """An unused spare goes back to the pool; a temp file is removed."""
        if item.spare and item.temp:
            temp, item.temp = item.temp, ""
            self.pool.release(temp)
            return
        super().discard(item)

    def settle(self, item: Staged) -> None:
        """The directory naming the retired inode is durable: the pool may reuse it."""
        retired, item.retired = item.retired, ""
        if retired:
            self.pool.settle(retired)

    def forget(self, item: Staged) -> None:
        """Its directory was never durably fsynced: the retired inode is never reused."""
        retired, item.retired = item.retired, ""
        if retired:
            self.pool.forget(retired)

    def close(self) -> None:
        self.pool.close()


def make_replace(root: Path, spare_dir: str | os.PathLike[str] | None) -> ReplaceStrategy:
    """Spare swaps with a pool in ``spare_dir`` when given and usable, else plain renames."""
    if spare_dir is None:
        return RenameReplace()
    pool = SparePool(spare_dir, root)
    if not pool.enabled:
        log.info("mirror writes make a new file each time: %s", pool.reason)
        return RenameReplace()
    return SpareSwapReplace(pool)


def remove_stale_temps(root: Path) -> int:
    """Remove temp files left by an interrupted write under ``root``; returns how many.

    Only what the mirror makes is touched: files named exactly like
    :func:`new_temp`'s (``%tmp.`` and 16 hex digits), under the ``http/`` and
    ``https/`` directories that every resource is mapped into.  Anything
    else -- a user's ``%tmp.precious-user-file``, another program's temp
    files elsewhere in an adopted directory -- is never deleted, and the walk
    never leaves those two trees (the ``--into /`` finding: the old walk
    crossed the whole filesystem).  Symlinked directories are not descended
    into.
    """
    removed = 0
    for scheme in DEFAULT_PORTS:
        top = root / scheme
        if top.is_symlink() or not top.is_dir():
            continue
        for directory, dirnames, filenames in os.walk(top, followlinks=False):
            for name in filenames:
                if _TEMP_NAME.fullmatch(name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(directory, name))
                        removed += 1
            dirnames[:] = [d for d in dirnames if not d.startswith(TEMP_PREFIX)]
    return removed
