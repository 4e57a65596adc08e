"""Which directory a subscriber may mirror into, and holding it while it runs.

A mirror directory is rsnotify's to write, replace and clean up in, so
``rsnotify subscribe --into DIR`` first makes sure DIR is one it may own:

* never ``/``, the user's home directory or a directory containing it (not
  even with ``--adopt``): the probe's ``--into /`` put the state in
  ``/..rsnotify`` and its start-up cleanup walked the whole filesystem;
* a new or empty directory (``lost+found`` aside, so a fresh volume's mount
  point is empty) is claimed: rsnotify puts its **marker** in it;
* a directory holding the marker is rsnotify's (a restart);
* a non-empty directory without the marker is refused -- it holds somebody
  else's files -- unless ``--adopt`` takes it over deliberately, or it is a
  mirror made by an rsnotify older than the marker (below).

**The marker** is an empty directory named ``%rsnotify`` at the mirror's top.
A name starting with ``%`` and a non-hex letter can never be a resource's
(:mod:`.mirror` writes a real ``%`` as ``%25``, and every resource lives
under ``http/`` or ``https/``), and an empty directory is no file: tools that
list or serve a mirror's files see nothing new.  ``mkdir`` makes it
atomically.

**The lock** is an exclusive ``flock`` on the marker, held until the process
exits.  The state directory has its own lock (:class:`.cursor.StateLock`), but
two subscribers given different ``--state`` directories for one mirror both
got theirs and the second deleted the first's in-flight temp file: the
mirror itself is what must be held.

**Mirrors made before the marker** (no marker, files in them) keep working
without ``--adopt``: when the state directory this subscriber uses already
holds a cursor or resource database (``cursor.sqlite3``,
``resources.sqlite3``), an earlier rsnotify kept this mirror's state there,
and the mirror is claimed and marked at once.  (The default state directory
is named after the mirror, ``.<DIR>.rsnotify`` beside it; a custom ``--state``
is the operator's own statement of which state belongs to which mirror.)

The decision is :func:`judge`, pure; :func:`claim` gathers the facts, marks
and locks.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from .cursor import AlreadyRunning
from .mirror import MirrorError

log = logging.getLogger("rsnotify.subscribe")

MARKER = "%rsnotify"
#: Entries that do not make a directory "not empty".
IGNORED = frozenset({"lost+found"})
#: State files an rsnotify without the marker left for the mirror it kept.
LEGACY_STATE = ("cursor.sqlite3", "resources.sqlite3")


class MirrorRefused(MirrorError):
    """``--into`` names a directory rsnotify must not write into (an operator's mistake)."""


class MirrorInUse(AlreadyRunning, MirrorError):
    """Another subscriber holds this mirror's lock (whatever state directory it uses)."""


class How(enum.Enum):
    """Why a subscriber may write into the directory."""

    NEW = "new or empty"
    MARKED = "marked as rsnotify's"
    MIGRATED = "made by an earlier rsnotify (its state is in the state directory)"
    ADOPTED = "adopted (--adopt)"


@dataclass(frozen=True, slots=True)
class Facts:
    """What :func:`judge` needs to know about ``--into`` (gathered by :func:`facts`)."""

    path: str  # as the operator wrote it, for messages
    is_root: bool
    holds_home: bool  # the home directory or one that contains it
    is_dir: bool  # False: missing (it will be created)
    exists: bool
    has_marker: bool
    foreign: tuple[str, ...]  # entries other than the marker and IGNORED, a few for the message
    legacy_state: bool
    adopt: bool


def judge(f: Facts) -> How:
    """May a subscriber write into this directory?  Raises :class:`MirrorRefused` if not."""
    if f.is_root:
        raise MirrorRefused(f"--into {f.path}: refusing to mirror into the root directory")
    if f.holds_home:
        raise MirrorRefused(
            f"--into {f.path}: refusing to mirror into the home directory or a directory "
            "that contains it; give a directory of its own"
        )
    if f.exists and not f.is_dir:
        raise MirrorRefused(f"--into {f.path}: not a directory")
    if f.has_marker:
        return How.MARKED
    if not f.foreign:
        return How.NEW
    if f.legacy_state:
        return How.MIGRATED
    if f.adopt:
        return How.ADOPTED
    shown = ", ".join(repr(n) for n in f.foreign[:3]) + (", ..." if len(f.foreign) > 3 else "")
    raise MirrorRefused(
        f"--into {f.path}: not empty ({shown}) and not a mirror rsnotify made (no {MARKER}); "
        "give a new or empty directory, or --adopt to take this one over"
    )


def facts(into: str | os.PathLike[str], state_dir: Path, *, adopt: bool) -> Facts:
    """Look at ``--into`` (and the state directory) without changing anything."""
    given = os.fspath(into)
    target = Path(given).resolve()
    home = Path.home().resolve()
    exists = os.path.lexists(target)
    is_dir = target.is_dir()
    names: list[str] = []
    if is_dir:
        try:
            names = sorted(os.listdir(target))
        except OSError as exc:
            raise MirrorRefused(f"--into {given}: cannot list it: {exc.strerror}") from None
    legacy = any((state_dir / name).is_file() for name in LEGACY_STATE)
    return Facts(
        path=given,
        is_root=target == Path(target.anchor),
        holds_home=target == home or target in home.parents,
        is_dir=is_dir,
        exists=exists,
        has_marker=MARKER in names and (target / MARKER).is_dir(),
        foreign=tuple(n for n in names if n != MARKER and n not in IGNORED),
        legacy_state=legacy,
        adopt=adopt,
    )


class MirrorLock:
    """The claim on a mirror directory: its marker, locked until :meth:`release`."""

    def __init__(self, root: Path, fd: int, how: How) -> None:
        self.root = root
        self.how = how
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the flock
            self._fd = None


def claim(into: str | os.PathLike[str], state_dir: Path, *, adopt: bool = False) -> MirrorLock:
    """Check ``--into``, create and mark it if needed, and lock it.

    Raises :class:`MirrorRefused` for a directory rsnotify must not own and
    :class:`MirrorInUse` when another subscriber holds it.
    """
    found = facts(into, state_dir, adopt=adopt)
    how = judge(found)
    root = Path(into).resolve()
    try:
        root.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(root / MARKER, 0o755)
        fd = os.open(root / MARKER, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise MirrorRefused(f"--into {found.path}: cannot claim it: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise MirrorInUse(
            f"--into {found.path}: another rsnotify subscribe is mirroring into it "
            f"(it holds the lock on {root / MARKER})"
        ) from None
    if how in (How.MIGRATED, How.ADOPTED):
        log.warning("mirroring into %s: %s; marked with %s", root, how.value, MARKER)
    return MirrorLock(root, fd, how)
