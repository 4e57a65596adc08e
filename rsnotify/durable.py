"""Small files written so that a crash leaves the old bytes or the new, never a mix.

The one recipe (design.md section 3): write a temporary file in the same
directory, fsync it, ``os.replace`` it over the name, then fsync the
directory so the rename itself survives a power cut.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["TEMP_SUFFIX", "sweep_temporaries", "write_file"]

#: What every temporary file of :func:`write_file` ends with.
TEMP_SUFFIX = ".tmp"


def temp_name(path: Path) -> Path:
    """A fresh hidden name beside ``path``, unique per write (not only per process:
    a write a cancelled task left running in a thread must not share it)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def write_file(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` atomically and durably (``mode``, less the umask)."""
    temp = temp_name(path)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
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


def sweep_temporaries(directory: Path) -> int:
    """Remove what writes killed half-way left in ``directory``; how many.

    For a directory one process writes (a leader's), called when it starts:
    a temporary file then belongs to no write in progress.
    """
    removed = 0
    for temp in directory.glob(f".*{TEMP_SUFFIX}"):
        try:
            temp.unlink()
            removed += 1
        except FileNotFoundError:
            continue
    return removed
