"""Replace files atomically without allocating a new inode for every version (opt-in).

(~510 lines, one mechanism: the pool and the three Linux calls it rests on
-- ``renameat2``, write leases, in-place fill -- whose rules only make sense
read together.  Used by the mirror's ``--spare-inodes`` strategy
(:mod:`rsnotify.subscriber.mirror.replace`) and the simulator's ``--dir``
writer, so it lives beside both rather than inside either.)

Off by default: its CPU saving is on ext4 without a journal (below; at
1,000 changes/s it also made a Destination less sensitive to other load on a
journaled ext4, bench/README.md), and files it replaces inherit the pool
directory's SELinux label, default ACL and setgid group instead of their own
directory's.

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
import time
from collections import deque
from pathlib import Path
from typing import Any

from .errors import SpareUnusable

__all__ = ["SparePool", "SpareUnusable", "exchange", "fill", "unshared"]

log = logging.getLogger(__name__)

AT_FDCWD = -100
RENAME_EXCHANGE = 2
SLOT_PREFIX = "%spare."  # never a name the mirror gives a resource (see subscriber.mirror.paths)
DEFAULT_CAPACITY = 1024
FILE_MODE = 0o644  # of new files, before the umask
MIN_AGE = 1.0  # seconds a retired inode rests before it is rewritten
MAX_SPARE_BYTES = 64 << 10  # larger retired inodes are not kept (bounded disk use)
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


_UNUSABLE = frozenset({errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP})


class SparePool:
    """Retired inodes kept in one private directory for the next replace (thread-safe).

    ``directory`` is created (mode 0700) if missing; it must be on the same
    filesystem as every target, or :attr:`enabled` ends up false (probed
    once here by swapping a file with one in ``probe_dir``).  Regular files
    already in it from an earlier run are adopted as spares: whatever a
    crash left, a spare is vetted again before every reuse.

    Spares are reused oldest first and only after :data:`MIN_AGE` seconds,
    so an ``open()`` of the target that began before a swap has long
    completed (and so is seen by the lease check) when its old inode is
    rewritten.  Only inodes up to :data:`MAX_SPARE_BYTES` are kept, at most
    ``capacity`` slots; a retired inode the pool cannot keep is unlinked, as
    a plain rename would have freed it.

    A retired inode still named by a directory whose fsync has not returned
    must not be rewritten: on a filesystem without a journal a crash would
    leave that directory naming the rewritten inode.  Pass ``settle=False``
    to :meth:`install` / :meth:`retire` and call :meth:`settle` (or
    :meth:`forget`, when the fsync failed) with the slot afterwards.
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
        self._ready: deque[tuple[float, str]] = deque()  # (retired at, slot), oldest first
        self._unsettled: set[str] = set()  # retired, their directory not yet fsynced
        self._empty: list[str] = []  # slot names holding nothing
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
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._probe(Path(probe_dir))
            self._adopt()
        except OSError as exc:
            self.reason = f"{self.directory}: {exc.strerror or exc}"
            self.close()
            return
        self.enabled = True

    def _adopt(self) -> None:
        for name in sorted(os.listdir(self.dir_fd)):
            if not name.startswith(SLOT_PREFIX) or self._slots >= self.capacity:
                continue
            info = os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                # Only an interrupted swap-back could leave a directory here.
                log.error("%s is not a file rsnotify made; left alone", self.directory / name)
                continue
            self._ready.append((0.0, name))
            self._slots += 1

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

    def _take_ready(self) -> str | None:
        """The oldest spare, if it has rested :data:`MIN_AGE` seconds."""
        with self._lock:
            if self._ready and time.monotonic() - self._ready[0][0] >= MIN_AGE:
                return self._ready.popleft()[1]
            return None

    def _take_empty(self) -> str | None:
        """A slot holding nothing (a new name while under capacity), or None."""
        with self._lock:
            if self._empty:
                return self._empty.pop()
            if self._slots < self.capacity:
                self._slots += 1
                return f"{SLOT_PREFIX}{secrets.token_hex(6)}"
            return None

    def _give_back(self, slot: str) -> None:
        """The slot holds nothing (any more)."""
        with self._lock:
            self._unsettled.discard(slot)
            self._empty.append(slot)

    def _rest(self, slot: str) -> None:
        """The slot holds a retired inode that may be reused after :data:`MIN_AGE`."""
        with self._lock:
            self._unsettled.discard(slot)
            self._ready.append((time.monotonic(), slot))

    def _drop(self, slot: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(slot, dir_fd=self.dir_fd)
        self._give_back(slot)

    def settle(self, slot: str) -> None:
        """The directory that named the slot's inode is durable: the inode may be reused."""
        self._rest(slot)

    def forget(self, slot: str) -> None:
        """That directory's fsync failed: never reuse the inode (unlink it, as rename would)."""
        self._drop(slot)

    def _hold(self, slot: str, settle: bool) -> str | None:
        if settle:
            self._rest(slot)
            return None
        with self._lock:
            self._unsettled.add(slot)
        return slot

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
        slot = self._take_ready()
        if slot is not None:
            fd = self._reopen(slot)  # unlinks the spare when it cannot be reused
            if fd is not None:
                self.reused += 1
                return slot, fd
        else:
            slot = self._take_empty()
            if slot is None:
                return None
        try:
            fd = os.open(slot, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         FILE_MODE, dir_fd=self.dir_fd)  # fmt: skip
        except OSError as exc:
            log.debug("spare slot %s unusable: %s", slot, exc)
            self._drop(slot)
            return None
        self.allocated += 1
        return slot, fd

    def _vetted(self, slot: str) -> int | None:
        """The slot's inode open for writing if nobody else sees it and it is like a new file.

        Ours and with the mode a new file would get: a spare is a retired
        mirror file, which a user may have chmod'ed or chown'ed, and the
        next resource must not inherit that.  ``O_NONBLOCK``: an open must
        not wait out somebody else's lease (Samba, knfsd) on an old inode.
        """
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(slot, flags, dir_fd=self.dir_fd)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if (
                info.st_uid == os.geteuid()
                and stat.S_IMODE(info.st_mode) == self._mode
                and info.st_size <= MAX_SPARE_BYTES
                and unshared(fd)
            ):
                os.set_blocking(fd, True)
                return fd
        except OSError:
            pass
        os.close(fd)
        return None

    def _reopen(self, slot: str) -> int | None:
        """Open a spare for rewriting (:meth:`_vetted`); else unlink it and return None."""
        fd = self._vetted(slot)
        if fd is None:
            with contextlib.suppress(OSError):
                os.unlink(slot, dir_fd=self.dir_fd)
        return fd

    def release(self, slot: str) -> None:
        """Hand back a slot from :meth:`open` that was not installed (its file stays a spare)."""
        try:
            info = os.stat(slot, dir_fd=self.dir_fd, follow_symlinks=False)
        except OSError:
            self._give_back(slot)
            return
        if stat.S_ISREG(info.st_mode):
            self._rest(slot)  # never visible anywhere: no directory to wait for
        else:
            self._drop(slot)

    def install(
        self, slot: str, dir_fd: int | None, name: str, *, settle: bool = True
    ) -> str | None:
        """Put the filled ``slot`` at ``name`` atomically; the old inode becomes the slot's spare.

        Returns the slot to :meth:`settle` or :meth:`forget` once the
        target's directory is fsynced, when ``settle`` is false and an old
        inode was kept; else None.

        Raises :class:`IsADirectoryError` (nothing changed) when ``name`` is a
        directory, :class:`SpareUnusable` when no swap is possible between the
        two directories, OSError for anything else; the slot is handed back
        in each case.  A symlink at ``name`` is replaced, never followed, as
        :func:`os.replace` does.  ``settle``: see the class.
        """
        try:
            exchange(self.dir_fd, slot, dir_fd, name)
        except FileNotFoundError:  # a new file: nothing to swap with
            try:
                os.rename(slot, name, src_dir_fd=self.dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                self.release(slot)
                raise
            self._give_back(slot)
            return None
        except OSError as exc:
            self.release(slot)
            if exc.errno in _UNUSABLE:
                raise SpareUnusable(exc.errno, f"{name}: no swap here ({exc.strerror})") from exc
            raise
        except BaseException:
            self.release(slot)
            raise
        return self._after_swap(slot, dir_fd, name, settle)

    def _after_swap(self, slot: str, dir_fd: int | None, name: str, settle: bool) -> str | None:
        """Keep a small regular file as the slot's spare; put back a directory; drop the rest."""
        try:
            info = os.stat(slot, dir_fd=self.dir_fd, follow_symlinks=False)
        except OSError:
            self._give_back(slot)
            return None
        if stat.S_ISDIR(info.st_mode):
            # A directory appeared at the target after the caller checked (a
            # concurrent write below it): swap it straight back.
            try:
                exchange(self.dir_fd, slot, dir_fd, name)
            except OSError as exc:
                log.error(
                    "a directory swapped out of %s is at %s; move it back (%s)",
                    name, self.directory / slot, exc,
                )  # fmt: skip
                with self._lock:
                    self._unsettled.discard(slot)  # the slot is lost, the directory is not
                raise
            self.release(slot)
            raise IsADirectoryError(errno.EISDIR, f"{name} is a directory")
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SPARE_BYTES:
            self._drop(slot)  # a symlink that stood at the target, or too big to keep
            return None
        return self._hold(slot, settle)

    def retire(self, dir_fd: int | None, name: str, *, settle: bool = True) -> str | bool | None:
        """Delete the regular file ``name``, keeping its inode (emptied) as a spare.

        Returns the slot now holding it when ``settle`` is false (to
        :meth:`settle` or :meth:`forget`), True when it was deleted (and,
        settled or not kept, there is nothing left to do); False when there is
        no such file;
        None when the caller should unlink it
        itself (pool off or full, not a small regular file: a directory must
        stay, a symlink is simply unlinked).  The file is linked into the
        slot, then unlinked, so a directory can never be moved.  Its bytes
        are cut when nobody else has it open: deleted content does not
        linger in the pool.
        """
        if not self.enabled:
            return None
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SPARE_BYTES:
            return None
        slot = self._take_empty()
        if slot is None:
            return None
        try:
            os.link(name, slot, src_dir_fd=dir_fd, dst_dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            self._give_back(slot)
            return False
        except OSError:
            self._give_back(slot)
            return None
        try:
            os.unlink(name, dir_fd=dir_fd)
        except OSError:
            self._drop(slot)
            return None
        fd = self._vetted(slot)
        if fd is None:
            self._drop(slot)  # somebody still reads it, or it is not like a new file
            return True
        try:
            os.ftruncate(fd, 0)
        except OSError:
            os.close(fd)
            self._drop(slot)
            return True
        os.close(fd)
        held = self._hold(slot, settle)
        return held if held is not None else True
