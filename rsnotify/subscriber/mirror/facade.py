"""The :class:`Mirror` the applier uses: one object in front of the mirror package's parts.

It maps paths (:mod:`.paths`), picks the fixity checks (:mod:`.fixity`) and
hands each write to the streamed or the batched writer, which share one
replace strategy (:mod:`.replace`) and one commit path (:mod:`.commit`) run
by threads that :class:`.durability.Durability` owns until :meth:`Mirror.close`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterable, Iterable, Mapping
from pathlib import Path

from ...spare import SparePool
from .batches import BatchWriter
from .durability import Durability
from .errors import MirrorError, UnsafePath
from .fixity import (
    DEFAULT_ALGORITHMS,
    HASHLIB_NAMES,
    Written,
    checkable,
    digest_if_equal,
    known_algorithms,
)
from .paths import loc_for, path_for, relative_names
from .replace import ReplaceStrategy, make_replace, remove_stale_temps
from .streamed import StreamWriter

__all__ = ["Mirror"]


class Mirror:
    """The mirror directory: safe atomic writes and deletes under ``root``.

    ``root`` is created if missing and resolved once, so a symlinked root
    directory is fine; below it, no symlink is ever followed.  Files are
    replaced by rename (:class:`.replace.RenameReplace`); given
    ``spare_dir`` (outside the root, on its filesystem: ``--spare-inodes``)
    small in-memory writes swap in retired inodes kept there instead
    (:class:`.replace.SpareSwapReplace`), where the system allows.
    :meth:`close` releases the worker threads and the spare directory.
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
        self.replace_strategy: ReplaceStrategy = make_replace(self.root, spare_dir)
        self.durability = Durability()
        self._streams = StreamWriter(self.root, self.replace_strategy, self.durability)
        self._batches = BatchWriter(self.root, self.replace_strategy, self.durability)
        self._unverifiable: dict[tuple[str, str, str], None] = {}  # reported once each

    @property
    def spares(self) -> SparePool | None:
        """The spare inode pool in use, or None when files are replaced by rename."""
        return self.replace_strategy.spares

    async def settle(self) -> None:
        """Wait until every rename and unlink already under way has finished.

        They are shielded from cancellation (a rename half done is worse than
        one done), so a caller that cancelled its writers waits here before
        letting anyone else write the same paths.
        """
        await self.durability.settle()

    def close(self) -> None:
        """Release the worker threads and the spare directory (:meth:`settle` first)."""
        self.durability.close()
        self.replace_strategy.close()

    def path_for(self, loc: str) -> Path:
        """:func:`.paths.path_for` under this mirror's root."""
        return path_for(loc, self.root)

    def loc_for(self, path: Path | str) -> str:
        """:func:`.paths.loc_for` under this mirror's root."""
        return loc_for(path, self.root)

    def _relative(self, path: Path | str) -> tuple[str, ...]:
        return relative_names(path if isinstance(path, Path) else Path(path), self.root)

    def _checks(
        self,
        path: Path | str,
        expected_hashes: Mapping[str, str] | None,
        algorithms: Iterable[str],
    ) -> tuple[dict[str, str], list[str]]:
        """The advertised digests to verify, and every algorithm to compute."""
        expected = checkable(expected_hashes, path, self._unverifiable)
        return expected, known_algorithms(algorithms, expected, path)

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
        *before* the rename: on a mismatch :class:`.FixityMismatch` is raised and
        the current file is untouched.  A body longer than ``expected_length`` is
        refused as soon as it overruns, without reading the rest.  Hash
        algorithms rsnotify does not know are ignored (logged), since they cannot
        be verified.  Returns the length and the digests of ``algorithms`` plus
        every verified one.
        """
        names = self._relative(path)
        expected, algos = self._checks(path, expected_hashes, algorithms)
        return await self._streams.write(
            names, path, chunks, expected_length=expected_length, expected=expected, algos=algos
        )

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
        :class:`.FixityMismatch` and leaves the current file alone), then temp
        file, write, fsync, rename, directory fsync; this returns only after
        all of them.  Writes that arrive together are done in one batch
        (:mod:`.batches`).  Once queued, a write finishes even if the caller
        is cancelled (as the commit of :meth:`write_atomic` does), and
        :meth:`settle` waits for it.
        """
        names = self._relative(path)
        expected, algos = self._checks(path, expected_hashes, algorithms)
        try:
            return await self._batches.write(
                names, path, data, expected_length=expected_length, expected=expected, algos=algos
            )
        except OSError as exc:
            raise MirrorError(f"{path}: {exc.strerror or exc}", path=path) from None

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
            for algo, digest in checkable(hashes, path, self._unverifiable).items()
            if algo in HASHLIB_NAMES
        }
        if not expected:
            return None
        return await asyncio.to_thread(digest_if_equal, Path(path), length, expected)

    async def delete(self, path: Path | str) -> bool:
        """Remove the file at ``path``; True if there was one.

        A missing file (or missing directory on the way) is not an error: the
        resource is gone either way.  A directory at ``path`` is left alone and
        reported as False, since it holds other resources.
        """
        return await self._batches.delete(self._relative(path), path)

    async def delete_many(self, paths: list[Path]) -> list[bool | BaseException]:
        """:meth:`delete` of each path, queued together; per path, its result or its error.

        The error is what :meth:`delete` would raise (:class:`.UnsafePath`,
        :class:`.PathConflict`, :class:`.MirrorError`), returned, not raised:
        one path's failure is that path's alone.
        """
        results: list[bool | BaseException] = [False] * len(paths)
        targets: list[tuple[tuple[str, ...], Path | str]] = []
        places: list[int] = []
        for i, path in enumerate(paths):
            try:
                targets.append((self._relative(path), path))
            except UnsafePath as exc:
                results[i] = exc
                continue
            places.append(i)
        for i, result in zip(places, await self._batches.delete_many(targets), strict=True):
            results[i] = result
        return results

    def cleanup_temp(self) -> int:
        """Remove temp files left by an interrupted write; returns how many.

        See :func:`.replace.remove_stale_temps` for what is touched (only the
        mirror's own temp files).  Call it at start-up, before anything
        writes, with the mirror's lock held (:mod:`..ownership`), since a
        live writer's temp file has the same shape.
        """
        return remove_stale_temps(self.root)
