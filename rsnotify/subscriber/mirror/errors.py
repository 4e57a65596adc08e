"""What can go wrong storing a resource in the mirror, one class per kind of fault.

Every class is a :class:`~rsnotify.errors.RsNotifyError`; the applier tells
them apart (a refused URI is skipped for good, a fixity mismatch is retried).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ...errors import LocalError, RemoteInputError

__all__ = ["FixityMismatch", "MirrorError", "PathConflict", "SymlinkInMirror", "UnsafePath"]


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
