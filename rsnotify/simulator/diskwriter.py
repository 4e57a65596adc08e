"""``--dir``: the simulated Source as static files any web server can serve.

The files are the very bytes the live server sends (both come from
:class:`~rsnotify.simulator.site.Site`), laid out by URL path under the
directory, so ``python -m http.server`` or nginx rooted there serves the same
Source (use ``--base-url`` when that server is not the simulator's address,
so the URLs inside the documents point at it).

Writing is batched: changes mark resources dirty, and :meth:`DiskWriter.flush`
(called periodically by the server, and before a pause, an advance or a stop
returns) takes a consistent snapshot of what changed on the event loop, then
writes it from a worker thread so the generator and the HTTP server keep
running.  Each file is written to a temporary name and renamed into place, so
a static server never serves a half-written document; there is no fsync
because a simulator's output is disposable.  With ``--spare-inodes`` the
temporary file is, where the system allows, an inode an earlier replace
retired, kept in ``.rsnotify-spare/`` (see :mod:`rsnotify.spare`): on ext4
without a journal, at 1,000 changes/s, the simulator otherwise spent a
quarter of a core allocating inodes (elsewhere it gains little, so it is
off by default).  A write failure (disk full...)
is logged and reported in ``/_simulator/stats`` as ``dir_error``; the live
server carries on and the copy stops being updated.

The directory must be empty or one this writer made before (it leaves a
``.rsnotify-simulate`` marker); a previous run's collections are removed first
so stale resources cannot linger.  Nothing else in the directory is touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path

from ..spare import SparePool, SpareUnusable, fill
from .site import Site
from .source import Applied, SimulatorError

MARKER = ".rsnotify-simulate"
SPARE_DIR = ".rsnotify-spare"
_log = logging.getLogger(__name__)


def write_files(
    root: Path,
    items: Sequence[tuple[str, bytes | None]],
    made: set[str],
    before_replace: Callable[[str], None] | None = None,
    spares: SparePool | None = None,
) -> None:
    """Write each file to a temporary name, then rename it into place.

    ``before_replace(rel)`` runs just before each rename (benchmarks stamp the
    moment a document becomes visible to a watcher with it).  With
    ``spares`` the temporary file is a spare inode and the rename a swap.
    ``made``: directories known to exist (added to).  Paths are strings, not
    :class:`~pathlib.Path`: at 600 changes/s building and converting them
    was ~13 % of the simulator's samples, as much as the writes they name.
    """
    top = os.fspath(root)
    for rel, body in items:
        path = os.path.join(top, rel)
        if body is None:
            if spares is None or spares.retire(None, path) is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            continue
        parent, name = os.path.split(path)
        if parent not in made:
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        spare = spares.open() if spares is not None else None
        if spare is not None:
            assert spares is not None
            slot, fd = spare
            try:
                try:
                    fill(fd, body)
                finally:
                    os.close(fd)
                if before_replace is not None:
                    before_replace(rel)
            except BaseException:
                spares.release(slot)
                raise
            try:
                spares.install(slot, None, path)
                continue
            except SpareUnusable:  # no swap into this directory: the plain way
                spares = None
        tmp = os.path.join(parent, f".{name}.tmp")
        with open(tmp, "wb") as handle:
            handle.write(body)
        if before_replace is not None:
            before_replace(rel)
        os.replace(tmp, path)


class DiskWriter:
    """Mirrors a :class:`Site` into a directory, incrementally."""

    def __init__(
        self, root: str | os.PathLike[str], site: Site, *, spare_inodes: bool = False
    ) -> None:
        self.root = Path(root)
        self.site = site
        self.spare_inodes = spare_inodes  # reuse retired inodes (rsnotify.spare)
        self._dirty: dict[str, tuple[str, str]] = {}  # loc -> (collection name, resource name)
        self._written_etags: dict[str, str] = {}
        self._closed_written = 0
        self._static_written = False
        self._made: set[str] = set()  # directories written to (write_files)
        self._spares: SparePool | None = None
        self._lock = asyncio.Lock()
        self.files_written = 0
        self.error: str | None = None  # first write failure; writing stops after it

    # -- setup -------------------------------------------------------------------

    def prepare(self) -> None:
        """Check the directory is ours (or empty), clear a previous run, write the marker."""
        try:
            self._prepare()
        except OSError as exc:
            raise SimulatorError(f"--dir {self.root}: {exc.strerror or exc}") from None

    def _prepare(self) -> None:
        root = self.root
        if root.exists() and not root.is_dir():
            raise SimulatorError(f"--dir {root} exists and is not a directory")
        names = [c.name for c in self.site.source.collections]
        if root.exists() and any(root.iterdir()):
            marker = root / MARKER
            if not marker.is_file():
                raise SimulatorError(
                    f"--dir {root} is not empty and was not written by rsnotify simulate "
                    f"(no {MARKER} file); use an empty or new directory"
                )
            try:
                previous = json.loads(marker.read_text()).get("collections", [])
            except (OSError, ValueError, AttributeError):
                previous = []
            for name in {*names, *(p for p in previous if isinstance(p, str))}:
                target = root / name
                if "/" not in name and target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
            (root / ".well-known" / "resourcesync").unlink(missing_ok=True)
        root.mkdir(parents=True, exist_ok=True)
        (root / MARKER).write_text(
            json.dumps({"collections": names, "base_url": self.site.layout.base_url}) + "\n"
        )
        if self.spare_inodes:
            spares = SparePool(root / SPARE_DIR, root)
            if spares.enabled:
                self._spares = spares
            else:
                _log.info(
                    "--dir %s: replacing files by create and rename (%s)", root, spares.reason
                )
        for collection in self.site.source.collections:
            for record in collection.live_records():
                self._dirty[record.loc] = (collection.name, record.name)

    def close(self) -> None:
        """Release the spare directory (the files written stay)."""
        if self._spares is not None:
            self._spares.close()
            self._spares = None

    # -- changes -----------------------------------------------------------------

    def note(self, applied: Iterable[Applied]) -> None:
        """Remember which resources changed since the last flush."""
        dirty = self._dirty
        for item in applied:
            record = item.collection.resources[item.change.loc]
            dirty[item.change.loc] = (item.collection.name, record.name)

    @property
    def pending(self) -> bool:
        return bool(self._dirty) or len(self.site.closed_changelists()) != self._closed_written

    def _relative(self, path: str) -> str:
        prefix = self.site.prefix
        return path[len(prefix) :] if path.startswith(prefix) else path.lstrip("/")

    def snapshot(
        self, now: datetime, resourcelist_max_age: float = 0.0
    ) -> list[tuple[str, bytes | None]]:
        """Everything to write since the last snapshot, as (relative path, bytes or None)."""
        site = self.site
        layout = site.layout
        items: list[tuple[str, bytes | None]] = []
        by_name = site.source.by_name
        for loc, (cname, name) in self._dirty.items():
            rep = site.resource(by_name[cname], name)
            items.append((self._relative(layout.path(loc)), rep.body if rep else None))
        self._dirty = {}
        if not self._static_written:
            for path, rep in site.static_documents().items():
                items.append((self._relative(path), rep.body))
            self._static_written = True
        closed = site.closed_changelists()
        if len(closed) != self._closed_written:
            for path in list(closed)[self._closed_written :]:
                items.append((self._relative(path), closed[path].body))
                self._written_etags.pop(path, None)
            self._closed_written = len(closed)
        live = site.live_documents(now, resourcelist_max_age=resourcelist_max_age)
        for path, rep in live.items():
            if self._written_etags.get(path) != rep.etag:
                items.append((self._relative(path), rep.body))
                self._written_etags[path] = rep.etag
        for path in [p for p in self._written_etags if p not in live]:
            # e.g. a Resource List part that a smaller snapshot no longer has
            del self._written_etags[path]
            items.append((self._relative(path), None))
        return items

    async def flush(self, now: datetime, resourcelist_max_age: float = 0.0) -> int:
        """Write what changed; returns the number of files written or removed.

        Flushes are serialized, so when one returns every change made before
        it was called is on disk.
        """
        async with self._lock:
            if self.error is not None:
                return 0
            items = self.snapshot(now, resourcelist_max_age)
            if items:
                loop = asyncio.get_running_loop()
                try:
                    await loop.run_in_executor(
                        None, write_files, self.root, items, self._made, None, self._spares
                    )
                except OSError as exc:
                    # Disk full, directory removed...: the live server keeps
                    # serving; the copy is abandoned and the error reported.
                    self.error = f"--dir {self.root}: {exc}"
                    _log.error("%s; no longer writing the --dir copy", self.error)
                    return 0
                self.files_written += len(items)
            return len(items)
