"""Baseline from a Resource Dump: ZIP packages, each with a Resource Dump Manifest.

A Source that offers a Resource Dump (Z39.99 section 11) lets a new
Destination download its resources in a few large packages instead of one
request per resource.  The dump's ``at`` plays the Resource List's role: the
packages hold every resource as of that time, so the cursor starts there and
the Change Lists since are applied on top.

Each package is streamed to a temporary file next to the subscriber's state
(its advertised length and hashes checked), then every manifest entry is
written into the mirror through the same checks as a fetch
(:meth:`.applier.Applier.apply_content`): origin, safe path, "never older over
newer", length and hashes before an atomic rename.  The ZIP is only a
container: member names are looked up, never used as paths, so a hostile
``path`` cannot escape the mirror, and a member is read no further than the
manifest's ``length`` (or the resource size cap), so a compression bomb costs
nothing.  Entries that cannot be taken from a package (missing member, bad
fixity, a package that fails to download) are fetched from their ``loc``, and
a dump without ``at`` is not used at all (the Resource List is).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import tempfile
import zipfile
import zlib
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .. import sitemap
from ..errors import DocumentError, FetchError, UnusableDump
from ..fetch import Fetcher
from ..model import Capability, Entry, parse_hashes
from .applier import Applier, Outcome

__all__ = [
    "DumpResult",
    "UnusableDump",
    "apply_resource_dump",
    "download_package",
    "read_manifest",
]

log = logging.getLogger("rsnotify.subscribe")

CHUNK = 64 * 1024
MANIFEST_NAME = "manifest.xml"
DEFAULT_MAX_PACKAGE_BYTES = 64 << 30


@dataclass(slots=True)
class DumpResult:
    at: datetime
    applied: list[tuple[Entry, Outcome]] = field(default_factory=list)
    fallback: list[Entry] = field(default_factory=list)  # to fetch from their loc
    packages: int = 0
    package_bytes: int = 0
    incomplete: bool = False  # a package could not be used: complete from the Resource List


async def download_package(
    fetcher: Fetcher,
    package: Entry,
    directory: Path,
    max_bytes: int,
    allowed_origins: Collection[str] | None,
) -> Path:
    """Stream a package to a temp file, checking its advertised length and hashes.

    Shared with the Change Dump catch-up (:mod:`.changedump`); ``package`` is
    the dump's entry for it (``loc``, ``length``, ``hash``).
    """
    expected = parse_hashes(package.hash)
    known = (("md5", "md5"), ("sha-256", "sha256"))
    hashers = {algo: hashlib.new(name) for algo, name in known if algo in expected}
    limit = package.length if package.length is not None else max_bytes
    fd, name = tempfile.mkstemp(prefix="%tmp.dump.", suffix=".zip", dir=directory)
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            async with fetcher.stream(
                package.loc, max_bytes=limit, timeout=60.0, allowed_origins=allowed_origins
            ) as stream:
                async for chunk in stream:
                    size += len(chunk)
                    for hasher in hashers.values():
                        hasher.update(chunk)
                    await asyncio.to_thread(out.write, chunk)
        if package.length is not None and size != package.length:
            raise UnusableDump(f"{package.loc}: {size} bytes, advertised {package.length}")
        for algo, hasher in hashers.items():
            if hasher.hexdigest() != expected[algo].lower():
                raise UnusableDump(f"{package.loc}: {algo} does not match the dump's hash")
        return Path(name)
    except BaseException:
        os.unlink(name)
        raise


def read_manifest(
    archive: zipfile.ZipFile,
    package: str,
    capability: Capability = Capability.RESOURCEDUMP_MANIFEST,
    *,
    only_locs: Collection[str] | None = None,
) -> list[Entry]:
    """The entries of the package's top-level ``manifest.xml`` (sections 11.2 and 13.1.1).

    ``only_locs``: only the entries for these resources (the rest are not
    read: :class:`rsnotify.sitemap.DocumentReader`).
    """
    try:
        info = archive.getinfo(MANIFEST_NAME)
    except KeyError:
        raise UnusableDump(f"{package}: no {MANIFEST_NAME} in the package") from None
    if info.file_size > sitemap.MAX_DOCUMENT_BYTES:
        raise UnusableDump(f"{package}: {MANIFEST_NAME} is larger than the document limit")
    with archive.open(info) as handle:
        body = handle.read(sitemap.MAX_DOCUMENT_BYTES + 1)
    document = sitemap.parse(body, only_locs=only_locs)
    if document.capability != capability:
        raise UnusableDump(f"{package}: {MANIFEST_NAME} is not a {capability} document")
    return list(document.entries)


async def _member_chunks(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int
) -> AsyncIterator[bytes]:
    """A member's bytes, read off the event loop, never more than ``limit`` + 1."""
    with archive.open(info) as handle:
        left = limit + 1  # one byte past the limit is enough for the writer to refuse
        while left > 0:
            chunk = await asyncio.to_thread(handle.read, min(CHUNK, left))
            if not chunk:
                return
            left -= len(chunk)
            yield chunk


async def apply_resource_dump(
    fetcher: Fetcher,
    applier: Applier,
    dump_url: str,
    *,
    as_created: Callable[[Entry, datetime], Entry],
    workdir: Path,
    max_package_bytes: int = DEFAULT_MAX_PACKAGE_BYTES,
    max_resource_bytes: int = 1 << 30,
    collection: str | None = None,
) -> DumpResult:
    """Write every resource of the dump's packages into the mirror.

    ``as_created(entry, at)`` turns a manifest entry into the change to apply
    (the baseline's own conversion).  Raises :class:`UnusableDump` when the
    dump document itself is unusable.  A package that cannot be used marks
    the result :attr:`DumpResult.incomplete` (its entries are unknown: the
    caller completes the baseline from the Resource List); an entry that
    cannot be taken from its package goes to :attr:`DumpResult.fallback`.
    """
    body = (await fetcher.get(dump_url)).body
    try:
        dump = sitemap.parse(body)
    except DocumentError as exc:
        raise UnusableDump(f"{dump_url}: {exc}") from None
    if dump.capability != Capability.RESOURCEDUMP:
        raise UnusableDump(f"{dump_url}: not a Resource Dump ({dump.capability})")
    if dump.at is None:
        raise UnusableDump(f"{dump_url}: no 'at' time, so no safe starting point")
    result = DumpResult(at=dump.at)
    workdir.mkdir(parents=True, exist_ok=True)
    for package in dump.entries:
        try:
            # Packages come from the Source's origins only, like the resources.
            temp = await download_package(
                fetcher, package, workdir, max_package_bytes, applier.allowed_origins
            )
        except (FetchError, UnusableDump, OSError) as exc:
            log.warning("Resource Dump package %s not used: %s", package.loc, exc)
            result.incomplete = True
            continue
        try:
            result.packages += 1
            result.package_bytes += temp.stat().st_size
            try:
                archive = zipfile.ZipFile(temp)
            except (zipfile.BadZipFile, OSError) as exc:
                log.warning("Resource Dump package %s is not a ZIP file: %s", package.loc, exc)
                result.incomplete = True
                continue
            with archive:
                try:
                    entries = read_manifest(archive, package.loc)
                except (zipfile.BadZipFile, OSError, DocumentError, UnusableDump) as exc:
                    log.warning("Resource Dump package %s not used: %s", package.loc, exc)
                    result.incomplete = True
                    continue
                for entry in entries:
                    change = as_created(entry, dump.at)
                    member = (entry.path or "").lstrip("/")
                    try:
                        info = archive.getinfo(member)
                    except KeyError:
                        log.info("%s: not in package %s; fetching it", entry.loc, package.loc)
                        result.fallback.append(entry)
                        continue
                    limit = entry.length if entry.length is not None else max_resource_bytes
                    try:
                        outcome = await applier.apply_content(
                            change,
                            functools.partial(_member_chunks, archive, info, limit),
                            source=f"{package.loc}#{member}",
                            collection=collection,
                        )
                    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:  # corrupt member
                        log.info("%s: unreadable in %s (%s); fetching it",
                                 entry.loc, package.loc, exc)  # fmt: skip
                        result.fallback.append(entry)
                        continue
                    if outcome.done or outcome in (Outcome.REFUSED_ORIGIN, Outcome.UNSAFE_PATH):
                        result.applied.append((entry, outcome))
                    else:
                        result.fallback.append(entry)
        finally:
            temp.unlink(missing_ok=True)
    return result
