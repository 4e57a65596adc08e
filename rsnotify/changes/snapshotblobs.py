"""Where snapshot maps are kept: a directory, or (``--redis``) Redis beside the log.

A map (:func:`.snapshot.map_key`) is stored by content key before any
checkpoint names it, and swept when no checkpoint a watcher keeps names it
(:meth:`BlobStore.keep`).  :class:`DirectoryBlobs` is the directory store;
:class:`~rsnotify.log.redis_blobs.RedisBlobs` the Redis one.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Protocol

from ..durable import sweep_temporaries, write_file

__all__ = ["BlobStore", "DirectoryBlobs"]

_KEY = re.compile(r"[0-9a-f]{64}")


class BlobStore(Protocol):
    """Where snapshot maps are kept, by content key."""

    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, data: bytes) -> None: ...

    async def keep(self, keys: set[str]) -> None:
        """Drop every map but these."""


class DirectoryBlobs:
    """Snapshot maps as files in one directory, each written atomically and durably."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        # The first sweep also removes what a write killed half-way left (the
        # directory is its watcher's alone, and no write of this one runs yet).
        self._orphans_swept = False

    def _path(self, key: str) -> Path:
        if not _KEY.fullmatch(key):
            raise ValueError(f"not a snapshot map key: {key!r:.80}")
        return self.root / key

    async def get(self, key: str) -> bytes | None:
        try:
            return await asyncio.to_thread(self._path(key).read_bytes)
        except FileNotFoundError:
            return None

    async def put(self, key: str, data: bytes) -> None:
        path = self._path(key)

        def write() -> None:
            self.root.mkdir(parents=True, exist_ok=True)
            if not path.exists():  # content-addressed: the same key is the same bytes
                write_file(path, data)

        await asyncio.to_thread(write)

    async def keep(self, keys: set[str]) -> None:
        def sweep() -> None:
            try:
                names = os.listdir(self.root)
            except FileNotFoundError:
                return
            for name in names:
                if _KEY.fullmatch(name) and name not in keys:
                    (self.root / name).unlink(missing_ok=True)
            if not self._orphans_swept:
                sweep_temporaries(self.root)
                self._orphans_swept = True

        await asyncio.to_thread(sweep)
