"""Baseline sync: copy every resource of the Resource List (Index) into the mirror.

The Resource List's ``at`` says every resource state in it reflects all
changes up to that time (section 7), so after the baseline the cursor starts
at ``at`` and the Change Lists from then on are applied: nothing between the
snapshot and the first notification is missed, whatever the snapshot took.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from datetime import datetime

from .. import sitemap, w3cdt
from ..errors import InvalidDocument
from ..fetch import Fetcher
from ..model import ChangeType, Entry
from .applier import Applier, Outcome

log = logging.getLogger("rsnotify.subscribe")


@dataclass(slots=True)
class BaselineSummary:
    files: int = 0
    bytes: int = 0
    skipped: int = 0
    failed: int = 0
    seconds: float = 0.0
    at: datetime | None = None

    def line(self) -> str:
        return (
            f"baseline: {self.files} files, {self.bytes} bytes in {self.seconds:.1f}s"
            f" ({self.skipped} already present, {self.failed} failed)"
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
    resourcelist_url: str,
    *,
    collection: str,
    max_bytes: int = sitemap.MAX_DOCUMENT_BYTES,
) -> BaselineSummary:
    """Apply every resource of the Resource List (or of each list in its index)."""
    started = time.monotonic()
    summary = BaselineSummary()
    result = await fetcher.get(resourcelist_url, max_bytes=max_bytes)
    reader = sitemap.DocumentReader(result.body, limits=sitemap.Limits(max_bytes=max_bytes))
    header = reader.header
    at = header.at or w3cdt.now()
    summary.at = at
    progress = _Progress(f"{collection}: baseline")
    futures = []

    def submit_all(entries: list[Entry]) -> None:
        for entry in entries:
            futures.append((entry, applier.submit(_as_created(entry, at))))

    if header.is_index:
        for url in [entry.loc for entry in reader]:
            part = await fetcher.get(url, max_bytes=max_bytes)
            document = sitemap.parse(part.body, limits=sitemap.Limits(max_bytes=max_bytes))
            if document.capability != header.capability:
                raise InvalidDocument(f"{url}: not a Resource List")
            submit_all(document.entries)
    else:
        submit_all(list(reader))
    total = len(futures)
    for done, (entry, future) in enumerate(futures, start=1):
        outcome = await future
        if outcome is Outcome.SKIPPED_ALREADY_APPLIED:
            summary.skipped += 1
        elif outcome.done:
            summary.files += 1
            summary.bytes += entry.length or 0
        else:
            summary.failed += 1
        progress.update(done, total)
    progress.done()
    summary.seconds = time.monotonic() - started
    log.info("%s: %s", collection, summary.line(), extra={"collection": collection})
    return summary
