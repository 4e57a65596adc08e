"""Streamed writes: a body of any size stored as it arrives, hashed on the way.

The chunks go to a fresh temp file from the event loop (writes to the page
cache are quick); the fixity checks run before anything is renamed; only the
commit (fsyncs and rename, :func:`.commit.commit`) goes to a worker thread.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterable, Mapping
from pathlib import Path

from .commit import commit, prepare_write, release
from .durability import Durability
from .errors import FixityMismatch, MirrorError
from .fixity import HASHLIB_NAMES, Written, verify
from .replace import ReplaceStrategy, write_all

__all__ = ["StreamWriter"]


class StreamWriter:
    """Stores streamed bodies under ``root``, each committed on its own."""

    def __init__(self, root: Path, strategy: ReplaceStrategy, durability: Durability) -> None:
        self.root = root
        self.strategy = strategy
        self.durability = durability

    async def write(
        self,
        names: tuple[str, ...],
        path: Path | str,
        chunks: AsyncIterable[bytes],
        *,
        expected_length: int | None,
        expected: Mapping[str, str],
        algos: list[str],
    ) -> Written:
        """Store ``chunks`` at ``names`` (see :meth:`.Mirror.write_atomic`)."""
        hashers = {algo: hashlib.new(HASHLIB_NAMES[algo]) for algo in algos}
        strategy = self.strategy
        try:
            item = prepare_write(self.root, names, path, strategy, reuse=False)
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
                write_all(item.fd, chunk)
            digests = {algo: hasher.hexdigest() for algo, hasher in hashers.items()}
            verify(path, length, digests, expected_length, expected)
            dirs = self.durability.dirs
            job = self.durability.run(lambda: commit([item], strategy, dirs), batch=False)
            handed_off = True
            # Shielded: once the rename is under way it finishes (and closes its
            # descriptors) even if the caller is cancelled.
            (outcome,) = await asyncio.shield(job)
            if isinstance(outcome, BaseException):
                raise outcome
        except OSError as exc:
            if not handed_off:
                release(item, strategy)
            raise MirrorError(f"{path}: {exc.strerror or exc}", path=path) from None
        except BaseException:
            if not handed_off:
                release(item, strategy)
            raise
        return Written(length, digests)
