"""Small files written so that a crash leaves the old bytes or the new, never a mix.

The one recipe (design.md section 3): write a temporary file in the same
directory, fsync it, ``os.replace`` it over the name, then fsync the
directory so the rename itself survives a power cut.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_file"]


def write_file(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` atomically and durably."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
