"""Opening directories inside the mirror without ever following a symlink.

Every directory from the root down is opened with ``O_NOFOLLOW`` relative to
its parent's descriptor, so a symlink anywhere on the way (placed by accident
or by an attacker) is refused with :class:`SymlinkInMirror` instead of being
followed out of the root, and there is no window between checking and using
a path.  The root itself is resolved once, by the caller.  A symlink *as the
final name* is no concern of this module: renaming over it replaces it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from .errors import MirrorError, PathConflict, SymlinkInMirror

__all__ = ["OpenedDirs", "close_all", "open_dirs", "refuse_directory"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def close_all(fds: Iterable[int]) -> None:
    """Close every descriptor, ignoring the ones already closed."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def open_dirs(
    root: Path, names: tuple[str, ...], *, create: bool, path: Path | str
) -> tuple[int | None, list[int]]:
    """Open the directory ``root/names...`` without following any symlink.

    Returns ``(fd, fds_to_fsync)``; ``fd`` is None when a component is missing
    and ``create`` is false.  ``fds_to_fsync`` are parents that gained a new
    subdirectory (fsync them for the new entry to be durable); the caller owns
    every descriptor returned.  ``path`` names the resource in errors.
    """
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise MirrorError(f"cannot open mirror root {root}: {exc}", path=path) from None
    dirty: list[int] = []
    try:
        for name in names:
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    close_all([fd, *dirty])
                    return None, []
                with contextlib.suppress(FileExistsError):  # a concurrent writer won
                    os.mkdir(name, 0o755, dir_fd=fd)
                child = _open_existing(name, fd, path)
                dirty.append(os.dup(fd))
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                _refuse_non_directory(name, fd, path)
                raise
            os.close(fd)
            fd = child
    except MirrorError:
        close_all([fd, *dirty])
        raise
    except OSError as exc:
        close_all([fd, *dirty])
        raise MirrorError(f"{path}: {exc.strerror or exc}", path=path) from None
    return fd, dirty


class OpenedDirs:
    """Directories a batch has opened already: each later target in one gets a duplicate.

    A batch of a thousand changes to one directory walked the same path from
    the root a thousand times (an ``openat`` and a ``close`` per component);
    here each directory is walked once, safely as :func:`open_dirs` does, and
    every target in it gets its own descriptor (``dup``), which it closes as
    before.  A directory is kept only when it was there already (no parent
    gained it), so a target never inherits another's parents to fsync.
    Used by one thread, for one batch; :meth:`close` at its end.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._fds: dict[tuple[str, ...], int] = {}

    def open(
        self, names: tuple[str, ...], *, create: bool, path: Path | str
    ) -> tuple[int | None, list[int]]:
        """:func:`open_dirs` of ``names`` under the root, walked once per batch."""
        kept = self._fds.get(names)
        if kept is not None:
            return os.dup(kept), []
        fd, dirty = open_dirs(self.root, names, create=create, path=path)
        if fd is not None and not dirty:
            with contextlib.suppress(OSError):  # out of descriptors: walked again next time
                self._fds[names] = os.dup(fd)
        return fd, dirty

    def close(self) -> None:
        close_all(self._fds.values())
        self._fds.clear()


def refuse_directory(dir_fd: int, name: str, path: Path | str) -> None:
    """Raise :class:`PathConflict` if ``name`` is a directory: it holds other resources."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise PathConflict(
                f"{path} is a directory (other resources are stored under it)", path=path
            )


def _open_existing(name: str, parent: int, path: Path | str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            _refuse_non_directory(name, parent, path)
        raise


def _refuse_non_directory(name: str, parent: int, path: Path | str) -> None:
    info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        raise SymlinkInMirror(
            f"{path}: {name!r} on the way is a symlink; symlinks inside the mirror are "
            "never followed",
            path=path,
        )
    raise PathConflict(
        f"{path}: {name!r} on the way is a file, not a directory (a resource named "
        "like a directory of other resources)",
        path=path,
    )
