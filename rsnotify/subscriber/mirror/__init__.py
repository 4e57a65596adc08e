"""The Destination's local copy of a Source: where each ``loc`` lives, and safe writes there.

A package, one job per module:

* :mod:`.paths`: the pure URI <-> path mapping (:func:`path_for`, :func:`loc_for`).
* :mod:`.safedirs`: opening directories below the root without following symlinks.
* :mod:`.fixity`: hashing and checking bytes against the advertised length and hashes.
* :mod:`.replace`: how a file is replaced: rename (default) or spare-inode swap.
* :mod:`.commit`: the one commit path: fsync, rename, group-committed directory fsync.
* :mod:`.durability`: the worker threads and the directory-fsync group commit, with ``close()``.
* :mod:`.streamed` and :mod:`.batches`: the two ways bytes arrive (a stream of any
  size, or small bodies in memory written in batches).
* :mod:`.facade`: :class:`Mirror`, what the rest of rsnotify uses.

The guarantees, whichever path a write takes: *no symlinks inside the mirror*
(every directory is opened with ``O_NOFOLLOW`` relative to its parent); *atomic
writes* (the bytes go to a temp file beside the target, are fsynced and checked,
then renamed over it and the directory is fsynced: a reader sees the old file or
the new one, and bytes that fail their fixity check never replace anything); a
``kill -9`` mid-write leaves only a temp file, removed at the next start
(:meth:`Mirror.cleanup_temp`).  Renames into one directory share its fsync (a
group commit: each rename is covered by an fsync that began after it).

Empty directories left behind by deletes are kept: removing them would race
with a concurrent write into the same directory.
"""

from __future__ import annotations

from .errors import FixityMismatch, MirrorError, PathConflict, SymlinkInMirror, UnsafePath
from .facade import Mirror
from .fixity import DEFAULT_ALGORITHMS, Written
from .paths import INDEX_NAME, TEMP_PREFIX, loc_for, path_for

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
