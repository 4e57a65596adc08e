"""Replace files atomically without allocating a new inode for every version.

Why this exists: an atomic replace (write a temp file, rename it over the
target) frees the target's old inode and allocates a new one each time.  On
ext4 *without a journal* (this project's CI machines) the allocator skips
every inode freed in the last 60 s, 360 s while its inode-table block is
still dirty, reading the inode table for each one (``recently_deleted`` in
``fs/ext4/ialloc.c``).  Under steady churn, 1,000 replaces/s, a 1 KB
create-and-rename cost ~420 us of CPU against ~100 us for rewriting an
inode that already exists, and the cost grows with the churn of every other
process in the same block groups.  Other filesystems gain less, but an
allocation saved never costs anything.

How: the inode a replace retires is kept under a slot name in a private
*spare* directory.  The next replace overwrites that spare in place
(:func:`fill`: its data blocks are rewritten, not freed and allocated again,
which on a filesystem mounted with ``discard`` is a device round trip each)
and then swaps it with the target in one ``renameat2(RENAME_EXCHANGE)``: a reader
sees the old file or the new one, exactly as with ``rename``, and the old
inode lands under the slot's name, ready for the replace after.  A delete can
retire the file into an empty slot instead of unlinking it.

A spare is rewritten only when nobody else can see it: a regular file with a
single link (a hard link elsewhere, an ``rsync --link-dest`` snapshot say,
would see the rewrite) that no other descriptor or mapping holds open (the
kernel grants a write lease only then, ``F_SETLEASE``).  Otherwise the spare
is unlinked and forgotten, and a fresh inode is used.  Where ``renameat2``,
leases or a rename between the two directories are unavailable (not Linux,
NFS, two filesystems), :meth:`SparePool.open` says so and callers do a plain
create-and-rename.

Durability is the caller's: fsync the filled spare before :meth:`install`
and the target's directory after it, as for a rename.  The spare directory
itself is never fsynced: after a crash its entries may be stale or missing,
which costs at most an inode; slots are vetted before every reuse.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import secrets
import signal
import stat
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["SparePool", "exchange", "fill", "unshared"]

log = logging.getLogger(__name__)

AT_FDCWD = -100
RENAME_EXCHANGE = 2
SLOT_PREFIX = "%spare."  # never a name the mirror gives a resource (see mirror.py)
DEFAULT_CAPACITY = 256
FILE_MODE = 0o644  # of new files, before the umask
# The lease taken to vet a spare lasts two system calls.  Were somebody to open
# the spare in between, the kernel would signal the lease holder, SIGIO by
# default, whose default action ends the process: ask for SIGURG (ignored by
# default) instead.
_F_SETSIG = getattr(fcntl, "F_SETSIG", 10)
_LEASE_SIGNAL = int(signal.SIGURG)


def _load_renameat2() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                         ctypes.c_uint]  # fmt: skip
    function.restype = ctypes.c_int
    return function


_RENAMEAT2 = _load_renameat2()


def exchange(src_dir_fd: int | None, src: str, dst_dir_fd: int | None, dst: str) -> None:
    """Swap two existing names atomically (``renameat2(RENAME_EXCHANGE)``); OSError on failure.

    ``None`` for a directory descriptor means a path relative to the current
    directory (or absolute), as for :func:`os.rename`.  ctypes releases the
    GIL for the call.
    """
    if _RENAMEAT2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    result = _RENAMEAT2(
        AT_FDCWD if src_dir_fd is None else src_dir_fd,
        os.fsencode(src),
        AT_FDCWD if dst_dir_fd is None else dst_dir_fd,
        os.fsencode(dst),
        RENAME_EXCHANGE,
    )
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"renameat2({src!r}, {dst!r}): {os.strerror(code)}")


def unshared(fd: int) -> bool:
    """True when the regular file open at ``fd`` (for writing) is seen by nobody else.

    One link (no other name reaches it) and no other open descriptor or
    mapping anywhere on the machine (a write lease is granted only then).
    False, never an exception, when that cannot be established: leases
    refused (another owner, ``fs.leases-enable=0``) or unsupported (NFS).
    """
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            return False
        fcntl.fcntl(fd, _F_SETSIG, _LEASE_SIGNAL)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    except OSError:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    except OSError:
        return False  # the descriptor is closed by the caller, which drops the lease too
    return True


def fill(fd: int, data: bytes) -> None:
    """Make the file open at ``fd`` (positioned at 0) hold exactly ``data``.

    Overwrites in place and cuts only what is left over: a spare of the same
    size (the usual case) keeps its blocks.
    """
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    if os.fstat(fd).st_size > len(data):
        os.ftruncate(fd, len(data))


class SparePool:
    """Retired inodes kept in one private directory for the next replace (thread-safe).

    ``directory`` is created if missing; it must be on the same filesystem as
    every target, or :attr:`enabled` ends up false (probed once here, by
    renaming a file from it to ``probe_dir`` and back).  Files already in it
    from an earlier run are adopted as spares.  At most ``capacity`` slots
    exist; when all are in use callers fall back to a fresh temp file.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        probe_dir: str | os.PathLike[str],
        *,
        capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        self.directory = Path(directory)
        self.capacity = capacity
        self._lock = threading.Lock()
        self._filled: list[str] = []  # slots holding a spare inode
        self._empty: list[str] = []  # slot names free to use, holding nothing
        self._slots = 0
        self._mode = -1  # what FILE_MODE becomes under the umask (probed)
        self.dir_fd = -1
        self.reused = 0  # fills of an existing spare: an inode allocation saved each
        self.allocated = 0  # fills that had to create a file
        self.enabled = False
        self.reason = ""
        if _RENAMEAT2 is None:
            self.reason = "renameat2 is not available on this system"
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._probe(Path(probe_dir))
        except OSError as exc:
            self.reason = f"{self.directory}: {exc.strerror or exc}"
            self.close()
            return
        for name in sorted(os.listdir(self.dir_fd)):
            if name.startswith(SLOT_PREFIX) and self._slots < capacity:
                self._filled.append(name)
                self._slots += 1
        self.enabled = True

    def _probe(self, probe_dir: Path) -> None:
        """Swap a file here with one in ``probe_dir``, then lease one (OSError if any fails).

        Catches two filesystems (EXDEV), a filesystem without
        ``RENAME_EXCHANGE`` (EINVAL) and one without leases, once, up front.
        """
        name = f"{SLOT_PREFIX}probe.{secrets.token_hex(4)}"
        target = probe_dir / name
        created: list[tuple[int | None, str | Path]] = []
        try:
            for dir_fd, path in ((self.dir_fd, name), (None, target)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE,
                             dir_fd=dir_fd)  # fmt: skip
                created.append((dir_fd, path))
                self._mode = stat.S_IMODE(os.fstat(fd).st_mode)  # FILE_MODE less the umask
                os.close(fd)
            exchange(self.dir_fd, name, None, str(target))
            fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC, dir_fd=self.dir_fd)
            try:
                if not unshared(fd):
                    raise OSError(errno.ENOLCK, "file leases are not available here")
            finally:
                os.close(fd)
        finally:
            for dir_fd, path in created:
                with contextlib.suppress(OSError):
                    os.unlink(path, dir_fd=dir_fd)

    def close(self) -> None:
        if self.dir_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.dir_fd)
        self.dir_fd = -1
        self.enabled = False

    # -- slots ---------------------------------------------------------------------

    def _take(self, *, filled: bool) -> tuple[str, bool] | None:
        """A slot (a spare one first when ``filled``) and whether it holds a spare.

        None when every slot is in use.
        """
        with self._lock:
            if filled and self._filled:
                return self._filled.pop(), True
            if self._empty:
                return self._empty.pop(), False
            if self._slots < self.capacity:
                self._slots += 1
                return f"{SLOT_PREFIX}{secrets.token_hex(6)}", False
            return None

    def _give_back(self, slot: str, *, filled: bool) -> None:
        with self._lock:
            (self._filled if filled else self._empty).append(slot)

    def _drop(self, slot: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(slot, dir_fd=self.dir_fd)
        self._give_back(slot, filled=False)

    # -- replace -------------------------------------------------------------------

    def open(self) -> tuple[str, int] | None:
        """A file to :func:`fill`, as ``(slot, fd)`` (open for writing, at offset 0), or None.

        The file may still hold a retired version's bytes: write it with
        :func:`fill`, which cuts them.  None means: use a fresh temp file
        beside the target instead (pool off, or every slot in use).  The
        caller then either :meth:`install`\\ s the slot or hands it back with
        :meth:`release`.
        """
        if not self.enabled:
            return None
        taken = self._take(filled=True)
        if taken is None:
            return None
        slot, filled = taken
        try:
            if filled:
                fd = self._reopen(slot)
                if fd is not None:
                    self.reused += 1
                    return slot, fd
            fd = os.open(slot, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         FILE_MODE, dir_fd=self.dir_fd)  # fmt: skip
        except OSError as exc:
            log.debug("spare slot %s unusable: %s", slot, exc)
            self._drop(slot)
            return None
        self.allocated += 1
        return slot, fd

    def _reopen(self, slot: str) -> int | None:
        """Open a spare for rewriting if nobody else sees it; else unlink it (None).

        It must also be ours and have the mode a new file would get: a spare
        is a retired mirror file, which a user may have chmod'ed or chown'ed,
        and the next resource must not inherit that.
        """
        try:
            fd = os.open(slot, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                info = os.fstat(fd)
                if (
                    info.st_uid == os.geteuid()
                    and stat.S_IMODE(info.st_mode) == self._mode
                    and unshared(fd)
                ):
                    return fd
            except OSError:
                pass
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(slot, dir_fd=self.dir_fd)
        return None

    def release(self, slot: str) -> None:
        """Hand back a slot from :meth:`open` that was not installed (its file stays a spare)."""
        try:
            info = os.stat(slot, dir_fd=self.dir_fd, follow_symlinks=False)
        except OSError:
            self._give_back(slot, filled=False)
            return
        self._give_back(slot, filled=stat.S_ISREG(info.st_mode))

    def install(self, slot: str, dir_fd: int | None, name: str) -> None:
        """Put the filled ``slot`` at ``name`` atomically; its old inode becomes the slot's spare.

        Raises :class:`IsADirectoryError` (nothing changed, the slot handed
        back) when ``name`` is a directory, OSError for anything else (the
        slot is then handed back too).  A symlink at ``name`` is replaced,
        never followed, as :func:`os.replace` does.
        """
        try:
            exchange(self.dir_fd, slot, dir_fd, name)
        except FileNotFoundError:  # a new file: nothing to swap with
            try:
                os.rename(slot, name, src_dir_fd=self.dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                self.release(slot)
                raise
            self._give_back(slot, filled=False)
            return
        except BaseException:
            self.release(slot)
            raise
        self._keep(slot, dir_fd, name)

    def _keep(self, slot: str, dir_fd: int | None, name: str) -> None:
        """After a swap: keep a regular file as the slot's spare, undo a directory."""
        try:
            info = os.stat(slot, dir_fd=self.dir_fd, follow_symlinks=False)
        except OSError:
            self._give_back(slot, filled=False)
            return
        if stat.S_ISDIR(info.st_mode):
            # A directory appeared at the target after the caller checked: put
            # it back (swap again) rather than move other resources out of view.
            exchange(self.dir_fd, slot, dir_fd, name)
            self.release(slot)
            raise IsADirectoryError(errno.EISDIR, f"{name} is a directory")
        if stat.S_ISREG(info.st_mode):
            self._give_back(slot, filled=True)
        else:  # a symlink or other special file that stood at the target
            self._drop(slot)

    def retire(self, dir_fd: int | None, name: str) -> bool | None:
        """Delete the regular file ``name`` by moving its inode into a slot.

        True when it was moved; False when there is no such file; None when
        the caller should unlink it itself (pool off or full, not a regular
        file: a directory must stay, a symlink is simply unlinked).
        """
        if not self.enabled:
            return None
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode):
            return None
        taken = self._take(filled=False)
        if taken is None:
            return None
        slot, _ = taken
        try:
            os.rename(name, slot, src_dir_fd=dir_fd, dst_dir_fd=self.dir_fd)
        except FileNotFoundError:
            self._give_back(slot, filled=False)
            return False
        except OSError:
            self._give_back(slot, filled=False)
            return None
        try:
            info = os.stat(slot, dir_fd=self.dir_fd, follow_symlinks=False)
        except OSError:
            self._give_back(slot, filled=False)
            return True
        if stat.S_ISDIR(info.st_mode):  # replaced by a directory meanwhile: never lose one
            os.rename(slot, name, src_dir_fd=self.dir_fd, dst_dir_fd=dir_fd)
            self._give_back(slot, filled=False)
            return None
        if stat.S_ISREG(info.st_mode):
            self._give_back(slot, filled=True)
        else:
            self._drop(slot)
        return True
