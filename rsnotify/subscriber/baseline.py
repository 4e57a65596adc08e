"""Baseline sync: copy every resource of the Resource List (Index) into the mirror.

The Resource List's ``at`` says every resource state in it reflects all
changes up to that time (section 7), so after the baseline the cursor starts
at ``at`` and the Change Lists from then on are applied: nothing between the
snapshot and the first notification is missed, whatever the snapshot took.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .. import sitemap, w3cdt
from ..errors import FetchError, InvalidDocument
from ..fetch import Fetcher
from ..model import ChangeType, Entry
from .applier import Applier, Outcome
from .dump import UnusableDump, apply_resource_dump

log = logging.getLogger("rsnotify.subscribe")


@dataclass(slots=True)
class BaselineSummary:
    files: int = 0
    bytes: int = 0
    skipped: int = 0
    failed: int = 0
    seconds: float = 0.0
    at: datetime | None = None
    dump_packages: int = 0  # Resource Dump packages used (0: none offered or usable)
    # Every loc the snapshot listed: a re-baseline deletes what the mirror holds beyond it.
    locs: set[str] = field(default_factory=set)

    def count(self, entry: Entry, outcome: Outcome) -> None:
        if outcome in (Outcome.SKIPPED_ALREADY_APPLIED, Outcome.HELD):
            self.skipped += 1
        elif outcome.done:
            self.files += 1
            self.bytes += entry.length or 0
        else:
            self.failed += 1

    def line(self) -> str:
        dump = f", {self.dump_packages} Resource Dump package(s)" if self.dump_packages else ""
        return (
            f"baseline: {self.files} files, {self.bytes} bytes in {self.seconds:.1f}s"
            f" ({self.skipped} already present, {self.failed} failed{dump})"
        )


class _Progress:
    """A one-line progress bar on a terminal; silent otherwise."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self._last = 0.0

    def update(self, done: int, total: int | None) -> None:
        now = time.monotonic()
        if not self.tty or now - self._last < 0.1:
            return
        self._last = now
        if total:
            width = 30
            filled = int(width * done / total)
            bar = "#" * filled + "-" * (width - filled)
            sys.stderr.write(f"\r{self.label} [{bar}] {done}/{total}")
        else:
            sys.stderr.write(f"\r{self.label} {done}")
        sys.stderr.flush()

    def done(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


async def _finish(
    futures: list[tuple[Entry, asyncio.Future[Outcome]]],
    summary: BaselineSummary,
    progress: _Progress,
) -> None:
    total = len(futures)
    for done, (entry, future) in enumerate(futures, start=1):
        # Shielded: cancelling the baseline must not cancel the one change it
        # happens to wait for while the others go on; its owner abandons them
        # all or none.
        summary.count(entry, await asyncio.shield(future))
        progress.update(done, total)
    progress.done()


def _as_created(entry: Entry, at: datetime) -> Entry:
    """A Resource List entry as the creation of its state at the snapshot time."""
    return Entry(
        loc=entry.loc,
        change=ChangeType.CREATED,
        datetime=at,
        hash=entry.hash,
        length=entry.length,
        type=entry.type,
        links=entry.links,
    )


async def baseline(
    fetcher: Fetcher,
    applier: Applier,
    resourcelist_url: str | None,
    *,
    collection: str,
    max_bytes: int = sitemap.MAX_DOCUMENT_BYTES,
    resourcedump_url: str | None = None,
    workdir: Path | None = None,
    limits: sitemap.Limits | None = None,
) -> BaselineSummary:
    """Apply every resource of the Resource Dump, else of the Resource List (Index).

    With a usable Resource Dump (packages with manifests, and an ``at``)
    the resources come from its packages; entries a package cannot supply are
    fetched.  If a package cannot be used at all, the Resource List completes
    the baseline and the cursor starts at the earlier of the two ``at`` times,
    so no change between them is missed.
    """
    started = time.monotonic()
    summary = BaselineSummary()
    limits = limits if limits is not None else sitemap.Limits(max_bytes=max_bytes)

    def submit(entry: Entry, at: datetime) -> None:
        # reuse: a re-baseline finds most bytes already in the mirror (compared, not fetched).
        summary.locs.add(entry.loc)
        change = _as_created(entry, at)
        futures.append((entry, applier.submit(change, collection=collection, reuse=True)))

    progress = _Progress(f"{collection}: baseline")
    futures: list[tuple[Entry, asyncio.Future[Outcome]]] = []
    dump_at: datetime | None = None
    if resourcedump_url is not None and not applier.metadata_only:
        try:
            dumped = await apply_resource_dump(
                fetcher,
                applier,
                resourcedump_url,
                as_created=_as_created,
                workdir=workdir or Path(tempfile.gettempdir()),
                collection=collection,
            )
        except (UnusableDump, FetchError) as exc:
            log.warning("%s: Resource Dump not used (%s); using the Resource List", collection, exc)
        else:
            dump_at = dumped.at
            summary.dump_packages = dumped.packages
            for entry, outcome in dumped.applied:
                summary.locs.add(entry.loc)
                summary.count(entry, outcome)
            for entry in dumped.fallback:
                submit(entry, dumped.at)
            if not dumped.incomplete:
                summary.at = dumped.at
                resourcelist_url = None  # the dump was the whole baseline
    if resourcelist_url is None:
        await _finish(futures, summary, progress)
        summary.seconds = time.monotonic() - started
        log.info("%s: %s", collection, summary.line(), extra={"collection": collection})
        return summary
    result = await fetcher.get(resourcelist_url, max_bytes=max_bytes)
    reader = sitemap.DocumentReader(result.body, limits=limits)
    header = reader.header
    at = header.at or w3cdt.now()
    summary.at = min(at, dump_at) if dump_at is not None else at

    def submit_all(entries: list[Entry]) -> None:
        for entry in entries:
            submit(entry, at)

    if header.is_index:
        for url in [entry.loc for entry in reader]:
            part = await fetcher.get(url, max_bytes=max_bytes)
            document = sitemap.parse(part.body, limits=limits)
            if document.capability != header.capability:
                raise InvalidDocument(f"{url}: not a Resource List")
            submit_all(document.entries)
    else:
        submit_all(list(reader))
    await _finish(futures, summary, progress)
    summary.seconds = time.monotonic() - started
    log.info("%s: %s", collection, summary.line(), extra={"collection": collection})
    return summary
