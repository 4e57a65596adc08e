"""The Destination's local copy of a Source: where each ``loc`` lives, and safe writes there.

Two halves.  :func:`path_for` / :func:`loc_for` are pure: they map a resource URI
to a path strictly inside the mirror root and back, and refuse any URI that
cannot be mapped safely.  :class:`Mirror` is the thin filesystem adapter: atomic,
fsynced writes that hash the bytes as they go, and deletes.

Path mapping (``root/<scheme>/<host>[_<port>]/<segment>/.../<leaf>``)
--------------------------------------------------------------------

The mapping is injective on URIs up to RFC 3986 equivalence (so ``%7E`` and
``~``, ``%C3%BC`` and a raw ``ü``, ``HOST`` and ``host``, ``:80`` and no port
name one file), and every path it produces decodes back to its URI
(:func:`loc_for`).  Two different resources therefore never share a file.

* ``<scheme>`` is ``http`` or ``https``.  It is a directory of its own rather
  than being dropped because ``http://h/x`` and ``https://h/x`` are different
  URIs (and may be different servers); any other scheme is refused.
* ``<host>`` is the lower-case IDNA (punycode) host, IPv6 literals in brackets.
  The port is appended as ``_<port>`` only when it is not the scheme's default.
  ``_`` inside a host is written ``%5F`` so the port separator is unambiguous.
* Each path segment is percent-*decoded* and stored under its real name, so
  spaces, ``&``, combining marks and emoji appear as themselves.  Only these
  are escaped as ``%XX`` (upper-case hex): ``%`` itself, ``/`` (so ``a%2Fb`` is
  one file named ``a%2Fb``, never a directory), ASCII control characters, and
  bytes that are not UTF-8.
* A trailing ``/`` (and the empty path) maps to a leaf named ``%index``; a
  query maps into the leaf name after ``%3F``: ``name?q=1`` -> ``name%3Fq=1``
  (the query is kept as sent, its ``%`` and ``/`` escaped).  A literal ``?`` in
  a segment (``name%3Fq``) stays ``?``, so the two never collide.  Fragments
  are dropped: they are never sent to a server.
* Names that start with ``%`` followed by a non-hex letter (``%index``,
  ``%tmp.``) can never come from a URI, because a real ``%`` is always written
  ``%25``.  The mirror keeps those names for itself.

Refused with :class:`UnsafePath`: schemes other than http(s), URIs without a
host or with user info, hosts with characters no DNS name or IP literal has,
segments that decode to ``.`` or ``..`` (also spelt ``%2e%2e``), empty segments
other than the trailing one (``a//b`` would alias ``a/b`` on disk), NUL,
backslash, raw control characters in the URI, file names over 255 bytes and
paths over 4,095 bytes (Linux limits).

The mirror assumes a case-sensitive filesystem that does not normalise Unicode
(ext4, xfs, btrfs).  On case-insensitive or normalising filesystems (default
macOS and Windows) distinct URIs can share a file.

A resource ``http://h/a`` and a resource under ``http://h/a/`` cannot both
exist on a filesystem (``a`` cannot be a file and a directory); whichever
arrives second is refused with :class:`PathConflict`.  No naming trick avoids
this without making every ordinary path unnatural.

Filesystem safety
-----------------

*No symlinks inside the mirror.*  Every directory from the root down is
opened with ``O_NOFOLLOW`` relative to its parent's descriptor, so a symlink
anywhere on the way (placed by accident or by an attacker) is refused with
:class:`SymlinkInMirror` instead of being followed out of the root, and there is
no window between checking and using a path.  The root itself is resolved once.
A symlink *as the final name* is simply replaced by the new file (rename never
follows it).

*Atomic writes.*  Bytes go to ``%tmp.<random>`` in the final directory; the
file is fsynced, checked (length and hashes), renamed over the final name with
``os.replace`` and the directory is fsynced.  A reader sees the old file or the
new one, never a partial one; a ``kill -9`` mid-write leaves only a temp file,
which :meth:`Mirror.cleanup_temp` removes at the next start.  Bytes that fail
their fixity check never replace anything.  Small bodies already in memory
(:meth:`Mirror.write_bytes`) are written in batches by a few threads, with
the same steps per file; renames into one directory share its fsync (a
group commit: each rename is covered by an fsync that began after it).
Given a ``spare_dir`` (the subscriber uses its state directory), those
batched writes fill an inode an earlier replace or delete retired instead
of a new temp file, and swap it into place (:mod:`rsnotify.spare`): the
same atomicity, without an inode allocation per change, which is most of a
write's CPU on ext4 without a journal.

Empty directories left behind by deletes are kept: removing them would race
with a concurrent write into the same directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hashlib
import logging
import os
import re
import secrets
import stat
import threading
from collections.abc import AsyncIterable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, TypeVar
from urllib.parse import quote, unquote_to_bytes, urlsplit

import yarl

from ..errors import LocalError, RemoteInputError
from ..model import DIGEST_SIZES, normalize_digest
from ..spare import SparePool, SpareUnusable, fill

__all__ = [
    "DEFAULT_ALGORITHMS",
    "INDEX_NAME",
    "TEMP_PREFIX",
    "FixityMismatch",
    "Mirror",
    "MirrorError",
    "PathConflict",
    "SymlinkInMirror",
    "UnsafePath",
    "Written",
    "loc_for",
    "path_for",
]

log = logging.getLogger("rsnotify.subscribe")

INDEX_NAME = "%index"
TEMP_PREFIX = "%tmp."
QUERY_MARK = "%3F"
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4095
DEFAULT_PORTS = {"http": 80, "https": 443}
#: hash attribute names (ResourceSync section 7) -> hashlib constructors.
HASHLIB_NAMES = {"md5": "md5", "sha-1": "sha1", "sha-256": "sha256", "sha-512": "sha512"}
DEFAULT_ALGORITHMS = ("md5", "sha-256")

#: The name of a temp file :meth:`Mirror._new_temp` makes, and the only kind cleaned up.
_TEMP_NAME = re.compile(re.escape(TEMP_PREFIX) + r"[0-9a-f]{16}")
_HOST = re.compile(r"[a-z0-9._-]+")
_IPV6 = re.compile(r"[0-9a-f:.]+")
T = TypeVar("T")
_HEX = frozenset("0123456789ABCDEF")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Characters _escape rewrites (surrogates stand for undecodable bytes).
_ESCAPED = re.compile(r"[%/\x00-\x1f\x7f\udc80-\udcff]")
PATH_CACHE_SIZE = 16_384  # loc -> path answers kept (a catch-up asks once per change)
# Safe in a URI path segment (RFC 3986 pchar minus pct-encoded); quote() adds
# the unreserved set itself.
_PCHAR_SAFE = "!$&'()*+,;=:@"


class MirrorError(LocalError):
    """The mirror could not map or store a resource (``.path`` when one is involved)."""

    def __init__(self, message: str, *, path: Path | str | None = None):
        self.path = path
        super().__init__(message)


class UnsafePath(MirrorError, RemoteInputError):
    """A ``loc`` that cannot be mapped strictly inside the mirror root."""


class SymlinkInMirror(UnsafePath):
    """A symlink on the way to a mirror path; symlinks are never followed."""


class PathConflict(MirrorError):
    """A file stands where a directory is needed, or a directory where a file is."""


class FixityMismatch(MirrorError, RemoteInputError):
    """The bytes received do not have the advertised length or hash; nothing was replaced."""

    def __init__(
        self,
        message: str,
        *,
        path: Path | str | None = None,
        length: int,
        expected_length: int | None,
        mismatched: Mapping[str, tuple[str, str]] | None = None,
    ):
        self.length = length
        self.expected_length = expected_length
        #: algorithm -> (expected hex, actual hex); empty for a pure length mismatch.
        self.mismatched = dict(mismatched or {})
        super().__init__(message, path=path)

    @property
    def length_mismatch(self) -> bool:
        return self.expected_length is not None and self.length != self.expected_length


class Written(NamedTuple):
    """What :meth:`Mirror.write_atomic` stored: byte count and hex digests by algorithm."""

    length: int
    digests: dict[str, str]


# --- pure mapping -----------------------------------------------------------------


def _escape(raw: bytes, *, extra: str = "") -> str:
    """A file name for the bytes ``raw``: UTF-8 text as itself, the rest as ``%XX``."""
    text = raw.decode("utf-8", errors="surrogateescape")
    if not extra and not _ESCAPED.search(text):
        return text  # the common case: nothing to rewrite
    out: list[str] = []
    for char in text:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, smuggled by surrogateescape
            out.append(f"%{code - 0xDC00:02X}")
        elif char in "%/" or char in extra or code < 0x20 or code == 0x7F:
            out.append("".join(f"%{b:02X}" for b in char.encode()))
        else:
            out.append(char)
    return "".join(out)


def _unescape(name: str) -> bytes:
    """Inverse of :func:`_escape`; raises ValueError on names it could not have made."""
    out = bytearray()
    i = 0
    while i < len(name):
        char = name[i]
        if char == "%":
            pair = name[i + 1 : i + 3]
            if len(pair) != 2 or not set(pair) <= _HEX:
                raise ValueError(f"{name!r} is not a mirror file name")
            out.append(int(pair, 16))
            i += 3
        else:
            out += char.encode("utf-8", errors="surrogateescape")
            i += 1
    return bytes(out)


def _host_dir(loc: str, scheme: str) -> str:
    try:
        url = yarl.URL(loc)
        raw_host = (url.raw_host or "").lower()
        port = url.port
        user = url.raw_user
    except (ValueError, TypeError, UnicodeError) as exc:
        raise UnsafePath(f"{loc!r}: invalid host or port ({exc})") from None
    if user is not None:
        raise UnsafePath(f"{loc!r}: user info in a resource URI is not mirrored")
    if ":" in raw_host:
        if not _IPV6.fullmatch(raw_host):
            raise UnsafePath(f"{loc!r}: invalid IPv6 host")
        host = f"[{raw_host}]"
    elif not _HOST.fullmatch(raw_host) or set(raw_host) == {"."}:
        raise UnsafePath(f"{loc!r}: invalid host {raw_host!r}")
    else:
        host = raw_host.replace("_", "%5F")
    if port is not None and port != DEFAULT_PORTS[scheme]:
        host = f"{host}_{port}"
    return host


def _segment_name(segment: str, loc: str) -> str:
    raw = unquote_to_bytes(segment)
    if raw in (b".", b".."):
        raise UnsafePath(f"{loc!r}: a path segment decodes to {raw.decode()!r}")
    if b"\x00" in raw:
        raise UnsafePath(f"{loc!r}: a path segment contains NUL")
    if b"\\" in raw:
        raise UnsafePath(f"{loc!r}: a path segment contains a backslash")
    return _escape(raw)


def _check_name(name: str, loc: str) -> None:
    if len(name.encode("utf-8", errors="surrogateescape")) > MAX_NAME_BYTES:
        raise UnsafePath(f"{loc[:200]!r}: a file name would exceed {MAX_NAME_BYTES} bytes")


def path_for(loc: str, root: Path) -> Path:
    """The mirror path of ``loc`` under ``root`` (see the module docstring for the rules).

    Raises :class:`UnsafePath` for any URI that cannot be mapped safely.  Pure:
    the filesystem is not consulted (symlinks are :class:`Mirror`'s business),
    so answers are memoized: a catch-up maps the same few thousand URIs tens of
    thousands of times.  Refusals are not memoized (they raise).
    """
    if not isinstance(loc, str):
        raise UnsafePath(f"{loc!r}: not a URI")
    return _path_for(loc, root if isinstance(root, Path) else Path(root))


@functools.lru_cache(maxsize=PATH_CACHE_SIZE)
def _path_for(loc: str, root: Path) -> Path:
    if not isinstance(loc, str) or not loc:
        raise UnsafePath(f"{loc!r}: not a URI")
    if _CONTROL.search(loc):
        # urlsplit silently deletes tabs and newlines, which would alias URIs.
        raise UnsafePath(f"{loc[:200]!r}: control characters in a URI")
    try:
        parts = urlsplit(loc)
    except ValueError as exc:
        raise UnsafePath(f"{loc[:200]!r}: not a URI ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise UnsafePath(f"{loc[:200]!r}: only http and https resources are mirrored")
    if not parts.netloc:
        raise UnsafePath(f"{loc[:200]!r}: no host")
    names = [scheme, _host_dir(loc, scheme)]
    path = parts.path or "/"
    if not path.startswith("/"):
        raise UnsafePath(f"{loc[:200]!r}: relative path")
    segments = path[1:].split("/")
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "":
            if not last:
                raise UnsafePath(f"{loc[:200]!r}: empty path segment (would alias)")
            names.append(INDEX_NAME)
        else:
            names.append(_segment_name(segment, loc))
    if parts.query or loc.split("#", 1)[0].endswith("?"):
        names[-1] += QUERY_MARK + _escape(parts.query.encode("utf-8", errors="surrogateescape"))
    for name in names[1:]:
        _check_name(name, loc)
    result = Path(root).joinpath(*names)
    if len(os.fsencode(result)) > MAX_PATH_BYTES:
        raise UnsafePath(f"{loc[:200]!r}: the mirror path would exceed {MAX_PATH_BYTES} bytes")
    return result


@functools.lru_cache(maxsize=PATH_CACHE_SIZE)
def _relative_names(path: Path, root: Path) -> tuple[str, ...]:
    """The names of ``path`` below ``root``, vetted; memoized like :func:`_path_for`.

    Pure (no filesystem), and asked once per write and delete for paths that
    :func:`path_for` handed out, where pathlib's work is most of the cost.
    """
    try:
        names = path.relative_to(root).parts
    except ValueError:
        raise UnsafePath(f"{path} is not inside the mirror root {root}") from None
    if not names or any(n in ("", ".", "..") for n in names):
        raise UnsafePath(f"{path} is not a file path inside the mirror root", path=path)
    return names


def loc_for(path: Path | str, root: Path) -> str:
    """The URI whose mirror path is ``path`` (the inverse of :func:`path_for`).

    The URI comes back in a normal form (percent-encoded UTF-8, upper-case hex,
    default port omitted), so ``path_for(loc_for(p), root) == p``.  Raises
    :class:`MirrorError` for a path the mapping cannot have produced.
    """
    try:
        names = Path(path).relative_to(root).parts
    except ValueError:
        raise MirrorError(f"{path} is not inside the mirror root {root}", path=path) from None
    if len(names) < 3 or names[0] not in DEFAULT_PORTS:
        raise MirrorError(f"{path} is not a mirrored resource path", path=path)
    try:
        scheme, host_dir, *segments = names
        host, sep, port = host_dir.rpartition("_")
        if not sep:
            host, port = host_dir, ""
        elif not port.isdigit():
            raise ValueError(host_dir)
        host = _unescape(host).decode("ascii")
        leaf, mark, query = segments[-1].partition(QUERY_MARK)
        segments[-1] = leaf
        pieces = []
        for i, name in enumerate(segments):
            if name == INDEX_NAME and i == len(segments) - 1:
                pieces.append("")
            elif name.startswith("%") and not set(name[1:3]) <= _HEX:
                raise ValueError(name)
            else:
                pieces.append(quote(_unescape(name), safe=_PCHAR_SAFE))
        uri = f"{scheme}://{host}{':' + port if port else ''}/" + "/".join(pieces)
        if mark:
            uri += "?" + _unescape(query).decode("utf-8", errors="surrogateescape")
    except (ValueError, UnicodeError):
        raise MirrorError(f"{path} is not a mirrored resource path", path=path) from None
    return uri


# --- the filesystem adapter ---------------------------------------------------------

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


FSYNC_THREADS = 16
WRITERS = 4  # write_bytes batches in flight at once
_POOL: ThreadPoolExecutor | None = None
_WRITER: ThreadPoolExecutor | None = None


def _writer_pool() -> ThreadPoolExecutor:
    """Threads for :meth:`Mirror.write_bytes` batches: a few, each running whole batches.

    One thread per file (what :func:`_fsync_pool` does for streamed writes)
    spent more CPU switching threads than writing; one thread for everything
    serialised the fsyncs, and a filesystem without a journal (where every
    fsync is its own cache flush) then capped the rate below 1,000 files/s.
    A few batches in flight keep the device busy at a thread hop per batch.
    """
    global _WRITER
    if _WRITER is None:
        _WRITER = ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="rsnotify-writer")
    return _WRITER


class _Write(NamedTuple):
    """One queued :meth:`Mirror.write_bytes`, or (``data`` None) :meth:`Mirror.delete`."""

    names: tuple[str, ...]
    data: bytes | None
    expected_length: int | None
    expected: Mapping[str, str]
    algos: list[str]
    path: Path | str
    future: asyncio.Future[Any]


class _Staged:
    """A verified write whose bytes sit in an unsynced temp file (descriptors owned).

    ``spare``: the temp file is a slot of the mirror's :class:`SparePool`
    (in its directory, not in ``dir_fd``).
    """

    __slots__ = ("digests", "dir_fd", "dirty", "fd", "name", "retired", "spare", "temp")

    def __init__(
        self,
        fd: int,
        dir_fd: int,
        dirty: list[int],
        temp: str,
        name: str,
        digests: dict[str, str],
        spare: bool = False,
    ) -> None:
        self.fd = fd
        self.dir_fd = dir_fd
        self.dirty = dirty
        self.temp = temp
        self.name = name
        self.digests = digests
        self.spare = spare
        # The pool slot now holding the inode this write or delete retired:
        # reusable only once this directory's fsync has returned.
        self.retired = ""


def _known_algorithms(
    algorithms: Iterable[str], expected: Mapping[str, str], path: Path | str
) -> list[str]:
    """The hash algorithms to compute (asked for or advertised), unknown ones logged and skipped."""
    known = []
    for algo in dict.fromkeys(a.lower() for a in (*algorithms, *expected)):
        if algo in HASHLIB_NAMES:
            known.append(algo)
        else:
            log.warning("cannot verify unknown hash algorithm %r for %s", algo, path)
    return known


_MAX_REPORTED = 4096  # unverifiable digests remembered, so each is reported once


def _checkable(
    expected_hashes: Mapping[str, str] | None,
    path: Path | str,
    reported: dict[tuple[str, str, str], None],
) -> dict[str, str]:
    """The advertised digests that can be verified, as lowercase hex by algorithm.

    Hex and base64 digests both verify (:func:`rsnotify.model.normalize_digest`).
    A digest of a known algorithm in neither form can never match any body:
    comparing it anyway failed every fetch and retried forever.  It is left
    out of the check and reported once per resource and digest, as an error
    naming the rule (section 7: "a hex-encoded digest"); the other digests and
    the length are still verified.  Unknown algorithms pass through, for
    :func:`_known_algorithms` to log and skip.
    """
    out: dict[str, str] = {}
    for algo, digest in (expected_hashes or {}).items():
        algo = algo.lower()
        if algo not in DIGEST_SIZES:
            out[algo] = digest
            continue
        normal = normalize_digest(algo, digest)
        if normal is not None:
            out[algo] = normal
            continue
        key = (str(path), algo, digest)
        if key not in reported:
            if len(reported) >= _MAX_REPORTED:
                reported.pop(next(iter(reported)))
            reported[key] = None
            log.error(
                "%s: advertised %s digest %r is neither hex nor base64 of a %d-byte digest "
                "(Z39.99 section 7: hash values are hex-encoded); not verified by it",
                path,
                algo,
                digest[:200],
                DIGEST_SIZES[algo],
                extra={"path": str(path), "outcome": "unverifiable_digest"},
            )
    return out


def _digest_if_equal(path: Path, length: int | None, expected: Mapping[str, str]) -> str | None:
    """sha-256 of the regular file at ``path`` if its bytes match ``expected`` (hex)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or (length is not None and info.st_size != length):
            return None
        digests = {algo: hashlib.new(HASHLIB_NAMES[algo]) for algo in {*expected, "sha-256"}}
        while chunk := handle.read(1 << 20):
            for digest in digests.values():
                digest.update(chunk)
    if any(digests[algo].hexdigest() != value for algo, value in expected.items()):
        return None
    return digests["sha-256"].hexdigest()


def _fsync_pool() -> ThreadPoolExecutor:
    """Threads for fsync, rename and unlink: their own pool, sized for waiting on disks.

    The loop's default executor has cpu+4 threads (6 here), shared with
    anything else; at 1,000 changes/s each commit (file fsync, rename,
    directory fsync) waits on the disk, and 6 threads capped the rate.  The
    threads mostly sleep in the kernel, so more of them cost little.
    """
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=FSYNC_THREADS, thread_name_prefix="rsnotify-fsync")
    return _POOL


class _DirSyncer:
    """Group commit for directory fsyncs: one ``fsync`` covers every rename before it.

    A rename is durable once an fsync of its directory *that started after the
    rename* has returned.  At 1,000 changes/s nearly every change renames into
    the same directory, and one fsync each cost a journal commit each.  Here a
    caller whose rename is done waits for the next fsync of that directory to
    start and finish (running it itself when none is under way), so renames
    that arrive while an fsync runs share the next one.  Nobody returns before
    an fsync that began after its rename has completed: the guarantee is the
    same as one fsync per rename.  Directories are keyed by (device, inode),
    so any descriptor of the directory serves.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._dirs: dict[tuple[int, int], _DirState] = {}

    def sync(self, dir_fd: int) -> None:
        """Return once an fsync of ``dir_fd``'s directory begun after this call has succeeded."""
        info = os.fstat(dir_fd)
        key = (info.st_dev, info.st_ino)
        cond = self._cond
        with cond:
            state = self._dirs.get(key)
            if state is None:
                state = self._dirs[key] = _DirState()
            need = state.started + 1  # the next fsync to start is the first sure to cover us
            while state.finished < need:
                if state.running:
                    cond.wait()
                    continue
                state.started += 1
                number = state.started
                state.running = True
                cond.release()
                try:
                    os.fsync(dir_fd)
                except OSError as exc:
                    state.failed = (number, exc)
                finally:
                    cond.acquire()
                    state.finished = number
                    state.running = False
                    cond.notify_all()
            if state.failed is not None and state.failed[0] >= need:
                # An fsync that should have covered this rename failed (a later
                # success proves nothing after a failed fsync): not durable.
                raise state.failed[1]
            idle = not state.running and state.started == state.finished
            if idle and state.failed is None and self._dirs.get(key) is state:
                del self._dirs[key]  # forget it (directories come and go)


class _DirState:
    __slots__ = ("failed", "finished", "running", "started")

    def __init__(self) -> None:
        self.started = 0  # fsyncs begun
        self.finished = 0  # the number of the last fsync that returned
        self.running = False
        self.failed: tuple[int, OSError] | None = None


_DIR_SYNC = _DirSyncer()


class Mirror:
    """The mirror directory: safe atomic writes and deletes under ``root``.

    ``root`` is created if missing and resolved once, so a symlinked root
    directory is fine; below it, no symlink is ever followed.  ``spare_dir``
    (outside the root, on its filesystem) keeps retired inodes for reuse;
    without it, or where the system cannot swap files, every write makes a
    new temp file.
    """

    def __init__(
        self, root: str | os.PathLike[str], *, spare_dir: str | os.PathLike[str] | None = None
    ):
        root_path = Path(root)
        try:
            root_path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise MirrorError(f"cannot create mirror root {root_path}: {exc}") from None
        self.root = root_path.resolve()
        self.spares: SparePool | None = None
        self._spare_dev = -1
        self._no_spares: set[tuple[int, int]] = set()  # directories a swap failed for
        if spare_dir is not None:
            spares = SparePool(spare_dir, self.root)
            if spares.enabled:
                self.spares = spares
                self._spare_dev = os.fstat(spares.dir_fd).st_dev
            else:
                log.info("mirror writes make a new file each time: %s", spares.reason)
        self._inflight: set[asyncio.Future[object]] = set()
        self._writes: list[_Write] = []  # write_bytes/delete calls waiting for a batch
        self._batches = 0  # batches in flight
        self._busy: set[tuple[str, ...]] = set()  # paths in a batch in flight
        self._unverifiable: dict[tuple[str, str, str], None] = {}  # reported once each

    def _track(self, job: asyncio.Future[T]) -> asyncio.Future[T]:
        self._inflight.add(job)  # type: ignore[arg-type]
        job.add_done_callback(self._finished)  # type: ignore[arg-type]
        return job

    def _finished(self, job: asyncio.Future[object]) -> None:
        self._inflight.discard(job)
        if not job.cancelled():
            job.exception()  # retrieved: a caller cancelled meanwhile is not told

    async def settle(self) -> None:
        """Wait until every rename and unlink already under way has finished.

        They are shielded from cancellation (a rename half done is worse than
        one done), so a caller that cancelled its writers waits here before
        letting anyone else write the same paths.
        """
        while self._inflight:
            await asyncio.wait(list(self._inflight))

    def path_for(self, loc: str) -> Path:
        """:func:`path_for` under this mirror's root."""
        return path_for(loc, self.root)

    def loc_for(self, path: Path | str) -> str:
        """:func:`loc_for` under this mirror's root."""
        return loc_for(path, self.root)

    def _relative(self, path: Path | str) -> tuple[str, ...]:
        return _relative_names(path if isinstance(path, Path) else Path(path), self.root)

    def _open_dirs(
        self, names: tuple[str, ...], *, create: bool, path: Path | str
    ) -> tuple[int | None, list[int]]:
        """Open the directory ``root/names...`` without following any symlink.

        Returns ``(fd, fds_to_fsync)``; ``fd`` is None when a component is missing
        and ``create`` is false.  ``fds_to_fsync`` are parents that gained a new
        subdirectory (fsync them for the new entry to be durable); the caller owns
        every descriptor returned.
        """
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise MirrorError(f"cannot open mirror root {self.root}: {exc}", path=path) from None
        dirty: list[int] = []
        try:
            for name in names:
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        _close_all([fd, *dirty])
                        return None, []
                    with contextlib.suppress(FileExistsError):  # a concurrent writer won
                        os.mkdir(name, 0o755, dir_fd=fd)
                    child = self._open_existing(name, fd, path)
                    dirty.append(os.dup(fd))
                except OSError as exc:
                    if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    self._refuse_non_directory(name, fd, path)
                    raise
                os.close(fd)
                fd = child
        except MirrorError:
            _close_all([fd, *dirty])
            raise
        except OSError as exc:
            _close_all([fd, *dirty])
            raise MirrorError(f"{path}: {exc.strerror or exc}", path=path) from None
        return fd, dirty

    def _open_existing(self, name: str, parent: int, path: Path | str) -> int:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                self._refuse_non_directory(name, parent, path)
            raise

    def _refuse_non_directory(self, name: str, parent: int, path: Path | str) -> None:
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

    async def write_atomic(
        self,
        path: Path | str,
        chunks: AsyncIterable[bytes],
        *,
        expected_length: int | None = None,
        expected_hashes: Mapping[str, str] | None = None,
        algorithms: Iterable[str] = DEFAULT_ALGORITHMS,
    ) -> Written:
        """Store ``chunks`` at ``path`` atomically, hashing as they arrive.

        ``expected_length`` and ``expected_hashes`` (``{"md5": hex, "sha-256":
        hex}``, as :func:`rsnotify.model.parse_hashes` returns) are checked
        *before* the rename: on a mismatch :class:`FixityMismatch` is raised and
        the current file is untouched.  A body longer than ``expected_length`` is
        refused as soon as it overruns, without reading the rest.  Hash
        algorithms rsnotify does not know are ignored (logged), since they cannot
        be verified.  Returns the length and the digests of ``algorithms`` plus
        every verified one.
        """
        names = self._relative(path)
        expected = _checkable(expected_hashes, path, self._unverifiable)
        hashers = {
            algo: hashlib.new(HASHLIB_NAMES[algo])
            for algo in _known_algorithms(algorithms, expected, path)
        }
        try:
            fd, dir_fd, dirty, temp, name, _ = self._open_temp(names, path)
        except OSError as exc:
            raise MirrorError(f"{path}: {exc.strerror or exc}", path=path) from None
        handed_off = False
        try:
            length = 0
            async for chunk in chunks:
                length += len(chunk)
                if expected_length is not None and length > expected_length:
                    raise FixityMismatch(
                        f"{path}: body longer than the advertised {expected_length} bytes",
                        path=path,
                        length=length,
                        expected_length=expected_length,
                    )
                for hasher in hashers.values():
                    hasher.update(chunk)
                # Writes to the page cache are quick; only the fsyncs go to a thread.
                _write_all(fd, chunk)
            digests = {algo: hasher.hexdigest() for algo, hasher in hashers.items()}
            self._verify(path, length, digests, expected_length, expected)
            handed_off = True
            commit = self._track(
                asyncio.get_running_loop().run_in_executor(
                    _fsync_pool(), self._commit, fd, dir_fd, dirty, temp, name, str(path)
                )
            )
            # Shielded: once the rename is under way it finishes (and closes its
            # descriptors) even if the caller is cancelled.
            await asyncio.shield(commit)
        except OSError as exc:
            if not handed_off:
                self._abandon(fd, dir_fd, dirty, temp)
            raise MirrorError(f"{path}: {exc.strerror or exc}", path=path) from None
        except BaseException:
            if not handed_off:
                self._abandon(fd, dir_fd, dirty, temp)
            raise
        return Written(length, digests)

    async def write_bytes(
        self,
        path: Path | str,
        data: bytes,
        *,
        expected_length: int | None = None,
        expected_hashes: Mapping[str, str] | None = None,
        algorithms: Iterable[str] = DEFAULT_ALGORITHMS,
    ) -> Written:
        """:meth:`write_atomic` for a body already in memory, group-committed.

        Same checks, same order, same guarantees, per file: hashes and length
        verified before anything touches the directory (a mismatch raises
        :class:`FixityMismatch` and leaves the current file alone), then temp
        file, write, fsync, rename, directory fsync; this returns only after
        all of them.  Why a second entry point: at 1,000 small resources a
        second, one thread job per file (each woken, each fsyncing alone)
        cost more CPU in context switches and journal commits than the bytes
        themselves.  Here writes that arrive together are done by one job in
        a writer thread (see :meth:`_store_batch`): every temp file is
        written and flushed, then fsynced (the first fsync commits the
        journal for all of them), then renamed, then each directory is
        fsynced once.  Once queued, a write finishes even if the caller is
        cancelled (as the commit of :meth:`write_atomic` does), and
        :meth:`settle` waits for it.
        """
        names = self._relative(path)
        expected = _checkable(expected_hashes, path, self._unverifiable)
        algos = _known_algorithms(algorithms, expected, path)
        try:
            written: Written = await self._queue(
                _Write(names, data, expected_length, expected, algos, path, self._future())
            )
        except OSError as exc:
            raise MirrorError(f"{path}: {exc.strerror or exc}", path=path) from None
        return written

    def _future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    async def _queue(self, write: _Write) -> Any:
        """Queue ``write`` for the next batch and wait for its result (shielded)."""
        self._writes.append(write)
        self._track(write.future)
        self._start_batches()
        return await asyncio.shield(write.future)

    def _start_batches(self) -> None:
        """Hand queued writes to free writer threads, shared evenly.

        A path already in a batch in flight waits for it (so writes of one
        path are never reordered, even across concurrent batches); so does a
        second write of one path within the queue.
        """
        loop = asyncio.get_running_loop()
        while self._writes and self._batches < WRITERS:
            share = -(-len(self._writes) // (WRITERS - self._batches))  # ceil
            batch: list[_Write] = []
            rest: list[_Write] = []
            taken: set[tuple[str, ...]] = set()
            for write in self._writes:
                names = write.names
                if len(batch) < share and names not in self._busy and names not in taken:
                    batch.append(write)
                else:
                    rest.append(write)
                taken.add(names)  # a later write of this path stays behind this one
            if not batch:
                return
            self._writes = rest
            self._busy |= {write.names for write in batch}
            self._batches += 1
            self._track(loop.create_task(self._write_batch(batch)))

    async def _write_batch(self, batch: list[_Write]) -> None:
        loop = asyncio.get_running_loop()
        # Tracked and shielded like a commit: settle() waits for the thread
        # itself, not only for this task, so no rename outlives it.
        job = self._track(loop.run_in_executor(_writer_pool(), self._store_batch, batch))
        try:
            results = await asyncio.shield(job)
        except BaseException as exc:  # cancelled (loop closing): fail the batch
            for write in batch:
                if not write.future.done():
                    write.future.set_exception(
                        exc if isinstance(exc, Exception) else MirrorError(str(exc))
                    )
            raise
        else:
            for write, result in zip(batch, results, strict=True):
                if write.future.done():
                    continue
                if isinstance(result, BaseException):
                    write.future.set_exception(result)
                else:
                    write.future.set_result(result)
        finally:
            self._batches -= 1
            self._busy -= {write.names for write in batch}
            if not loop.is_closed():
                self._start_batches()

    def _store_batch(self, batch: list[_Write]) -> list[Written | bool | BaseException]:
        """Verify and store every write of ``batch`` (worker thread), each durably.

        Per write the order is that of :meth:`write_atomic`: verify, temp
        file, fsync, rename, directory fsync; only the phases are interleaved
        across writes.  ``sync_file_range`` first starts writeback of every
        temp file: on a journalled filesystem their block allocations then land
        in the transaction the first fsync commits, and the other fsyncs find
        nothing left to commit; without a journal the device at least gets
        all the data at once.  A failure fails its own write (or, for a
        directory fsync, the writes renamed into that directory), never the
        others.  A batch never holds two writes of one path (see
        :meth:`_start_batches`).
        """
        results: list[Written | bool | BaseException] = [MirrorError("not stored")] * len(batch)
        staged: list[tuple[int, _Staged]] = []
        try:
            for i, write in enumerate(batch):
                try:
                    if write.data is None:
                        dir_fd, _ = self._open_dirs(write.names[:-1], create=False, path=write.path)
                        if dir_fd is None:
                            results[i] = False  # no directory, so no file: gone already
                        else:
                            staged.append((i, _Staged(-1, dir_fd, [], "", write.names[-1], {})))
                    else:
                        staged.append((i, self._stage(write)))
                except BaseException as exc:
                    results[i] = exc
            flush = getattr(os, "sync_file_range", None)
            if flush is not None and len(staged) > 1:
                for _, item in staged:
                    if item.fd >= 0:
                        with contextlib.suppress(OSError):  # only a hint: fsync follows
                            flush(item.fd, 0, 0, os.SYNC_FILE_RANGE_WRITE)
            renamed: list[tuple[int, _Staged]] = []
            for i, item in staged:
                write = batch[i]
                if write.data is None:
                    try:
                        if not self._remove(item):
                            results[i] = False
                            continue
                    except OSError as exc:
                        results[i] = MirrorError(
                            f"cannot delete {write.path}: {exc.strerror or exc}", path=write.path
                        )
                        continue
                    renamed.append((i, item))
                    continue
                try:
                    try:
                        os.fsync(item.fd)
                    finally:
                        os.close(item.fd)
                        item.fd = -1
                    try:
                        if item.spare:
                            self._install(item, write)
                        else:
                            os.replace(item.temp, item.name, src_dir_fd=item.dir_fd,
                                       dst_dir_fd=item.dir_fd)  # fmt: skip
                    except IsADirectoryError:
                        raise PathConflict(
                            f"{write.path} is a directory (other resources are stored under it)",
                            path=write.path,
                        ) from None
                except BaseException as exc:
                    self._discard_temp(item)
                    results[i] = exc
                    continue
                item.temp = ""
                renamed.append((i, item))
            synced: dict[tuple[int, int], BaseException | None] = {}
            for i, item in renamed:
                try:
                    info = os.fstat(item.dir_fd)
                    key = (info.st_dev, info.st_ino)
                    if key not in synced:
                        try:
                            _DIR_SYNC.sync(item.dir_fd)
                            synced[key] = None
                        except OSError as exc:
                            synced[key] = exc
                    failed = synced[key]
                    if failed is not None:
                        raise failed
                    if item.retired:
                        assert self.spares is not None
                        self.spares.settle(item.retired)
                        item.retired = ""
                    for parent in item.dirty:
                        os.fsync(parent)
                except BaseException as exc:
                    results[i] = exc
                    continue
                data = batch[i].data
                results[i] = True if data is None else Written(len(data), item.digests)
        finally:
            for _, item in staged:
                if item.fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(item.fd)
                self._discard_temp(item)
                if item.retired:  # its directory was never (durably) fsynced
                    assert self.spares is not None
                    self.spares.forget(item.retired)
                    item.retired = ""
                _close_all([item.dir_fd, *item.dirty])
        return results

    def _install(self, item: _Staged, write: _Write) -> None:
        """Swap a filled spare into place; where no swap is possible, write a new file instead.

        A swap fails with EXDEV between directories of one filesystem that
        differ in project quota, or across a bind mount (same device
        number), and with EINVAL where the filesystem lacks
        ``RENAME_EXCHANGE``: the directory is then written to the plain way
        from now on.
        """
        assert self.spares is not None and write.data is not None
        temp, item.temp = item.temp, ""  # the pool has the slot back whatever happens
        try:
            item.retired = self.spares.install(temp, item.dir_fd, item.name, settle=False) or ""
            return
        except SpareUnusable as exc:
            info = os.fstat(item.dir_fd)
            self._no_spares.add((info.st_dev, info.st_ino))
            log.info("%s: writing new files in this directory (%s)", write.path, exc)
        item.spare = False
        item.fd, item.temp = self._new_temp(item.dir_fd)
        try:
            _write_all(item.fd, write.data)
            os.fsync(item.fd)
        finally:
            os.close(item.fd)
            item.fd = -1
        os.replace(item.temp, item.name, src_dir_fd=item.dir_fd, dst_dir_fd=item.dir_fd)

    def _discard_temp(self, item: _Staged) -> None:
        """Remove a staged temp file that will not be renamed (a spare goes back to the pool)."""
        temp, item.temp = item.temp, ""
        if not temp:
            return
        if item.spare:
            assert self.spares is not None
            self.spares.release(temp)
            return
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=item.dir_fd)

    def _spares_for(self, dir_fd: int) -> SparePool | None:
        """The spare pool if it can swap with files in ``dir_fd`` (same filesystem)."""
        spares = self.spares
        if spares is None or not spares.enabled:
            return None
        info = os.fstat(dir_fd)
        if info.st_dev != self._spare_dev or (info.st_dev, info.st_ino) in self._no_spares:
            return None
        return spares

    def _remove(self, item: _Staged) -> bool:
        """Delete ``item.name``; False when there is no file (missing, or a directory: kept).

        The file's inode goes to the spare pool when there is room (the next
        write reuses it; ``item.retired`` then names the slot), else it is
        unlinked.
        """
        dir_fd, name = item.dir_fd, item.name
        spares = self._spares_for(dir_fd)
        if spares is not None:
            retired = spares.retire(dir_fd, name, settle=False)
            if isinstance(retired, str):
                item.retired = retired
                return True
            if retired is not None:
                return retired
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

    def _open_temp(
        self, names: tuple[str, ...], path: Path | str, *, spare: bool = False
    ) -> tuple[int, int, list[int], str, str, bool]:
        """Open a temp file for ``names``' target: ``(fd, dir_fd, dirty, temp, name, spare)``.

        With ``spare`` the temp file is a slot of the spare pool when one is
        free (``spare`` in the result then true, ``temp`` the slot), else a
        new file beside the target.  Refuses a target that is a directory (it
        holds other resources).  On failure every descriptor opened here is
        closed again.
        """
        dir_fd, dirty = self._open_dirs(names[:-1], create=True, path=path)
        assert dir_fd is not None
        name = names[-1]
        try:
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    raise PathConflict(
                        f"{path} is a directory (other resources are stored under it)",
                        path=path,
                    )
            spares = self._spares_for(dir_fd) if spare else None
            slot = spares.open() if spares is not None else None
            if slot is not None:
                return slot[1], dir_fd, dirty, slot[0], name, True
            fd, temp = self._new_temp(dir_fd)
        except BaseException:
            _close_all([dir_fd, *dirty])
            raise
        return fd, dir_fd, dirty, temp, name, False

    @staticmethod
    def _new_temp(dir_fd: int) -> tuple[int, str]:
        """Create a fresh temp file in ``dir_fd``: ``(fd, name)`` (``_TEMP_NAME``'s shape)."""
        temp = f"{TEMP_PREFIX}{secrets.token_hex(8)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(temp, flags, 0o644, dir_fd=dir_fd), temp

    def _stage(self, write: _Write) -> _Staged:
        """Verify one write and put its bytes in a temp file beside the target (unsynced)."""
        path = write.path
        data = write.data
        assert data is not None
        digests = {a: hashlib.new(HASHLIB_NAMES[a], data).hexdigest() for a in write.algos}
        self._verify(path, len(data), digests, write.expected_length, write.expected)
        fd, dir_fd, dirty, temp, name, spare = self._open_temp(write.names, path, spare=True)
        staged = _Staged(fd, dir_fd, dirty, temp, name, digests, spare)
        try:
            if spare:
                fill(fd, data)  # a spare may hold a retired version: overwrite, cut the rest
            else:
                _write_all(fd, data)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            self._discard_temp(staged)
            _close_all([dir_fd, *dirty])
            raise
        return staged

    @staticmethod
    def _verify(
        path: Path | str,
        length: int,
        digests: Mapping[str, str],
        expected_length: int | None,
        expected: Mapping[str, str],
    ) -> None:
        mismatched = {
            algo: (want, digests[algo])
            for algo, want in expected.items()
            if algo in digests and digests[algo] != want
        }
        if (expected_length is not None and length != expected_length) or mismatched:
            problems = [f"{a} {got} != advertised {want}" for a, (want, got) in mismatched.items()]
            if expected_length is not None and length != expected_length:
                problems.insert(0, f"length {length} != advertised {expected_length}")
            raise FixityMismatch(
                f"{path}: {'; '.join(problems)}",
                path=path,
                length=length,
                expected_length=expected_length,
                mismatched=mismatched,
            )

    @staticmethod
    def _abandon(fd: int, dir_fd: int, dirty: list[int], temp: str) -> None:
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        _close_all([dir_fd, *dirty])

    @staticmethod
    def _commit(fd: int, dir_fd: int, dirty: list[int], temp: str, name: str, path: str) -> None:
        """fsync the file, rename it into place, fsync the directories (worker thread)."""
        try:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except IsADirectoryError:
                raise PathConflict(
                    f"{path} is a directory (other resources are stored under it)", path=path
                ) from None
            _DIR_SYNC.sync(dir_fd)
            for parent in dirty:
                os.fsync(parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
        finally:
            _close_all([dir_fd, *dirty])

    async def holds(
        self, path: Path | str, length: int | None, hashes: Mapping[str, str] | None
    ) -> str | None:
        """The file's sha-256 if ``path`` already holds the advertised bytes, else None.

        For a re-baseline after a coverage hole: only what differs is fetched.
        "Holds" needs at least one advertised digest that can be checked, and
        every such digest (and the length, if given) must match; a symlink or
        anything but a regular file never matches.
        """
        expected = {
            algo: digest
            for algo, digest in _checkable(hashes, path, self._unverifiable).items()
            if algo in HASHLIB_NAMES
        }
        if not expected:
            return None
        return await asyncio.to_thread(_digest_if_equal, Path(path), length, expected)

    async def delete(self, path: Path | str) -> bool:
        """Remove the file at ``path``; True if there was one.

        A missing file (or missing directory on the way) is not an error: the
        resource is gone either way.  A directory at ``path`` is left alone and
        reported as False, since it holds other resources.
        """
        names = self._relative(path)
        # In the write batches: a delete is a rename's worth of work (unlink,
        # then the directory fsync it shares with the batch), and a thread
        # hop of its own per delete cost more than that.
        removed: bool = await self._queue(_Write(names, None, None, {}, [], path, self._future()))
        return removed

    def cleanup_temp(self) -> int:
        """Remove temp files left by an interrupted write; returns how many.

        Only what this mirror makes is touched: files named exactly like
        :meth:`_new_temp`'s (``%tmp.`` and 16 hex digits), under the
        ``http/`` and ``https/`` directories that :func:`path_for` maps every
        resource into.  Anything else -- a user's ``%tmp.precious-user-file``,
        another program's temp files elsewhere in an adopted directory -- is
        never deleted, and the walk never leaves those two trees (the
        ``--into /`` finding: the old walk crossed the whole filesystem).
        Call it at start-up, before anything writes, with the mirror's lock
        held (:mod:`.ownership`), since a live writer's temp file has the same
        shape.  Symlinked directories are not descended into.
        """
        removed = 0
        for scheme in DEFAULT_PORTS:
            top = self.root / scheme
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
