"""``--change-dump``: the bitstreams of each closed Change List, as a ZIP package.

Z39.99 section 13.1: "a Source may provide packaged bitstreams for changed
resources", so a Destination that fell behind downloads a few packages
instead of one resource per change.  The simulator makes one package per
closed Change List, covering exactly that list's interval (section 13.1 lets
the Source choose: "a fixed number of changes per package"), so a package
never changes once made and its bytes are built once, when the list closes,
before the Source forgets the list's entries.  The open list has no package:
a Destination fetches those changes one by one, as without a dump.

Each package holds ``manifest.xml`` at its top level, a Change Dump Manifest
(section 13.1.1) with ``from``/``until`` of the list, one ``<url>`` per change
in forward chronological order (a resource changed twice appears twice, with
two bitstreams), and a ``path`` for every created/updated change, never for a
deletion.  The Change Dump (``<collection>/changedump.xml``) lists the
packages oldest first, each with ``type``, ``length``, ``hash``, ``from`` and
``until``.  All of it is pure: bytes from the Source's state, no I/O.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass
from datetime import datetime

from .. import sitemap
from ..model import Capability, Document, Entry, Link, Root, make_document
from .source import ChangeListState, Collection, Source

MANIFEST_NAME = "manifest.xml"  # section 13.1.1: "must be named manifest.xml", at the top
ZIP_TYPE = "application/zip"


@dataclass(frozen=True, slots=True)
class Package:
    """One published package, as the Change Dump describes it."""

    number: int  # the Change List it packages
    loc: str
    from_: datetime
    until: datetime
    length: int
    md5: str
    sha256: str
    body: bytes


def member_path(number: int, index: int, name: str) -> str:
    """Where the bitstream of the ``index``-th change of list ``number`` lies in the package.

    The entry's position makes it unique even when one resource changed several
    times in the list (section 13.1.1, Example 23).
    """
    return f"/changes/{number:06d}/{index:06d}-{name}"


def manifest(source: Source, collection: Collection, state: ChangeListState) -> Document:
    """The Change Dump Manifest of the package of closed list ``state``."""
    entries: list[Entry] = []
    for index, change in enumerate(state.changes):
        entry = source.change_entry(change)
        if change.fixity is not None:
            entry.path = member_path(state.number, index, change.loc.rsplit("/", 1)[-1])
        entries.append(entry)
    return make_document(
        Root.URLSET,
        Capability.CHANGEDUMP_MANIFEST,
        from_=state.from_,
        until=state.until,
        links=[Link(rel="up", href=collection.capability_list_url)],
        entries=entries,
    )


def package(source: Source, collection: Collection, state: ChangeListState) -> Package:
    """The ZIP package of closed list ``state``: its manifest and every bitstream."""
    if state.until is None:
        raise ValueError(f"Change List {state.number} of {collection.name} is still open")
    document = manifest(source, collection, state)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr(MANIFEST_NAME, sitemap.serialize(document))
        for entry, change in zip(document.entries, state.changes, strict=True):
            if entry.path is not None:
                zf.writestr(entry.path.lstrip("/"), source.body(change.loc, change.version))
    body = buffer.getvalue()
    return Package(
        number=state.number,
        loc=source.layout.changedump_package(collection.name, state.number),
        from_=state.from_,
        until=state.until,
        length=len(body),
        md5=hashlib.md5(body).hexdigest(),
        sha256=hashlib.sha256(body).hexdigest(),
        body=body,
    )


def change_dump(collection: Collection, packages: list[Package]) -> Document:
    """The Change Dump of ``collection``: its packages, oldest first (section 13.1)."""
    start = collection.changelists[0].from_
    return make_document(
        Root.URLSET,
        Capability.CHANGEDUMP,
        from_=start,
        links=[Link(rel="up", href=collection.capability_list_url)],
        entries=[
            Entry(
                loc=p.loc,
                lastmod=p.until,
                type=ZIP_TYPE,
                length=p.length,
                hash=f"md5:{p.md5} sha-256:{p.sha256}",
                from_=p.from_,
                until=p.until,
            )
            for p in packages
        ],
    )


__all__ = ["MANIFEST_NAME", "ZIP_TYPE", "Package", "change_dump", "manifest", "package"]
