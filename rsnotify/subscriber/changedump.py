"""Catch-up from a Change Dump: the missed changes' bitstreams in a few ZIP packages.

Z39.99 section 13: "In order to reduce the number of requests required to
obtain resource changes, a Source may provide packaged bitstreams for changed
resources."  A Destination that missed many changes (a walk of the Change
Lists finds at least :data:`MIN_BODIES` to fetch) reads the Source's Change
Dump, downloads the packages whose ``from``/``until`` overlap the missed
changes, and takes each change's bytes from its package instead of a GET.
The Change Lists still decide *what* changed and in which order; a package
only supplies bytes, handed to the applier as a body at hand
(:meth:`.applier.Applier.submit` ``body=``), where they go through exactly the
checks of a fetched body (origin, path, "never older over newer", length and
hashes against the Change List entry, atomic rename).

Only the bytes of the *last* change of each resource in the walk are taken:
the applier supersedes the earlier ones without a fetch (a newer change is
queued), so their bitstreams are never needed.

Every member is checked before it is kept, and anything wrong means "fetch
it as without a dump", never "write it anyway":

* the package: downloaded through the same code as a Resource Dump's
  (:func:`.dump.download_package`: the Source's origins only, its advertised
  length and hashes, a size cap), then opened as a ZIP with a Change Dump
  Manifest at its top (section 13.1.1);
* a manifest entry is used only for the change with the same ``loc``, change
  type and change time as the Change List entry, and only if its ``length``
  and hashes agree with that entry's;
* the member is looked up by the manifest's ``path`` in the ZIP's directory:
  a name is never used as a file-system path (the mirror path comes from the
  Change List's ``loc``), so ``../`` names cannot escape the mirror;
* the member's declared size must equal the manifest's ``length``, it is read
  no further than that length plus one byte (a compression bomb costs one
  byte more than promised), and the bytes read must have that length and the
  manifest's hashes.

Bodies are kept in memory until the applier writes them, so members larger
than :data:`transfer.IN_MEMORY_BYTES` and anything past
:data:`MAX_HELD_BYTES` per walk are fetched instead; each package's file is
removed as soon as its members are read.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import zipfile
import zlib
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .. import sitemap
from ..errors import DocumentError, FetchError, UnusableDump
from ..fetch import Fetcher
from ..model import Capability, ChangeType, Entry, parse_hashes
from .dump import DEFAULT_MAX_PACKAGE_BYTES, download_package, read_manifest
from .mirror.fixity import HASHLIB_NAMES
from .transfer import IN_MEMORY_BYTES

__all__ = [
    "MAX_HELD_BYTES",
    "MIN_BODIES",
    "Key",
    "Packaged",
    "bodies_from_change_dump",
    "extract",
    "key_of",
]

log = logging.getLogger("rsnotify.subscribe")

MIN_BODIES = 100  # fewer bodies to fetch than this: one GET each beats a package
MAX_HELD_BYTES = 256 << 20  # bodies read from packages and held for the applier, per walk
DOWNLOADS_AHEAD = 3  # packages downloading while the one before is read

Key = tuple[str, datetime]  # (loc, change time): how the specification names one change


@dataclass(slots=True)
class Packaged:
    """What the packages supplied: bodies by change, and what they could not."""

    bodies: dict[Key, bytes] = field(default_factory=dict)
    packages: int = 0
    package_bytes: int = 0
    refused: list[str] = field(default_factory=list)  # why members were not used

    @property
    def held_bytes(self) -> int:
        return sum(map(len, self.bodies.values()))


def key_of(entry: Entry) -> Key | None:
    when = entry.change_time
    return None if when is None else (entry.loc, when)


def _agrees(member: Entry, change: Entry) -> str | None:
    """Why a manifest entry cannot stand for a Change List entry (None: it can)."""
    if member.change != change.change:
        return f"manifest says {member.change}, the Change List {change.change}"
    if member.length is not None and change.length is not None and member.length != change.length:
        return f"manifest length {member.length}, Change List length {change.length}"
    listed = parse_hashes(change.hash)
    for algo, digest in parse_hashes(member.hash).items():
        if algo in listed and listed[algo] != digest:
            return f"manifest {algo} differs from the Change List's"
    return None


def _read_member(
    archive: zipfile.ZipFile, member: Entry, change: Entry, budget: int
) -> bytes | str:
    """The member's verified bytes, or why it is not used (then it is fetched)."""
    name = (member.path or "").removeprefix("/")
    try:
        info = archive.getinfo(name)  # a lookup in the ZIP's directory, never a file path
    except KeyError:
        return f"no member {name!r}"
    length = member.length if member.length is not None else change.length
    if length is None:
        return "no length in the manifest or the Change List"
    if info.file_size != length:
        return f"member {name!r} declares {info.file_size} bytes, the manifest {length}"
    if length > min(IN_MEMORY_BYTES, budget):
        return f"{length} bytes: fetched rather than held in memory"
    try:
        with archive.open(info) as handle:
            data = handle.read(length + 1)  # one byte past the promise is enough to refuse
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError) as exc:
        return f"member {name!r} unreadable: {exc}"
    if len(data) != length:
        return f"member {name!r} holds more or fewer than its {length} bytes"
    for algo, digest in parse_hashes(member.hash).items():
        if algo in HASHLIB_NAMES and hashlib.new(HASHLIB_NAMES[algo], data).hexdigest() != digest:
            return f"member {name!r} fails the manifest's {algo}"
    return data


def extract(path: Path, package: str, wanted: dict[Key, Entry], result: Packaged) -> None:
    """Read the members of one package that ``wanted`` changes need (blocking: a thread's job).

    ``wanted`` maps each change to its Change List entry; a change found is
    removed from it (a later package cannot supply it again).
    """
    try:
        with zipfile.ZipFile(path) as archive:
            # Only the members of the resources still wanted are read (a catch-up
            # wants the last change of each resource: a few per package).
            locs = {loc for loc, _ in wanted}
            members = read_manifest(
                archive, package, Capability.CHANGEDUMP_MANIFEST, only_locs=locs
            )
            budget = MAX_HELD_BYTES - result.held_bytes
            for member in members:
                key = key_of(member)
                change = wanted.get(key) if key is not None and member.path else None
                if key is None or change is None:
                    continue
                why = _agrees(member, change)
                data = why if why is not None else _read_member(archive, member, change, budget)
                if isinstance(data, str):
                    result.refused.append(f"{member.loc} in {package}: {data}")
                    continue
                del wanted[key]
                result.bodies[key] = data
                budget -= len(data)
    except (zipfile.BadZipFile, OSError, DocumentError, UnusableDump) as exc:
        result.refused.append(f"{package}: not used ({exc})")


def _overlaps(package: Entry, first: datetime, last: datetime) -> bool:
    """The package's interval meets [first, last]; one without ``from`` cannot be placed."""
    if package.from_ is None or package.from_ > last:
        return False
    return package.until is None or package.until >= first


async def _packages(fetcher: Fetcher, url: str) -> list[Entry]:
    """The package entries of a Change Dump, or of every Change Dump of an index (s13.1)."""
    document = sitemap.parse((await fetcher.get(url)).body)
    if document.capability != Capability.CHANGEDUMP:
        raise UnusableDump(f"{url}: not a Change Dump ({document.capability})")
    if not document.is_index:
        return list(document.entries)
    found: list[Entry] = []
    for part in document.entries:
        found += await _packages(fetcher, part.loc) if part.loc != url else []
    return found


async def _discard(tasks: Iterable[asyncio.Task[Path]]) -> None:
    """Stop downloads no longer needed and remove what they wrote."""
    pending = list(tasks)
    for task in pending:
        task.cancel()  # download_package removes its temp file when cancelled
    for outcome in await asyncio.gather(*pending, return_exceptions=True):
        if isinstance(outcome, Path):  # it had finished: its file is complete
            outcome.unlink(missing_ok=True)


async def bodies_from_change_dump(
    fetcher: Fetcher,
    changedump_url: str,
    changes: Sequence[Entry],
    *,
    workdir: Path,
    allowed_origins: Collection[str] | None,
    max_package_bytes: int = DEFAULT_MAX_PACKAGE_BYTES,
    min_bodies: int = MIN_BODIES,
) -> Packaged:
    """Bodies for ``changes`` (created/updated Change List entries) from the Change Dump.

    Nothing is downloaded for fewer than ``min_bodies`` changes.  Never raises
    for what the Source serves: an unusable dump or package is logged and its
    changes are simply not in the result (they are fetched).
    """
    result = Packaged()
    wanted = {key: c for c in changes if (key := key_of(c)) is not None}
    wanted = {k: c for k, c in wanted.items() if c.change is not ChangeType.DELETED}
    if len(wanted) < min_bodies:
        return result
    first, last = min(k[1] for k in wanted), max(k[1] for k in wanted)
    try:
        packages = await _packages(fetcher, changedump_url)
    except (FetchError, DocumentError, UnusableDump) as exc:
        log.warning("Change Dump %s not used: %s", changedump_url, exc)
        return result
    workdir.mkdir(parents=True, exist_ok=True)
    overlapping = iter([p for p in packages if _overlaps(p, first, last)])
    # Packages are read in order, one at a time (each takes what the ones before
    # left wanted), while the next ones download: a package's transfer no longer
    # waits for the previous one's reading, nor the reading for the transfer.
    downloading: deque[tuple[Entry, asyncio.Task[Path]]] = deque()

    def download_more() -> None:
        while len(downloading) < DOWNLOADS_AHEAD:
            package = next(overlapping, None)
            if package is None:
                return
            task = asyncio.ensure_future(
                download_package(fetcher, package, workdir, max_package_bytes, allowed_origins)
            )
            downloading.append((package, task))

    download_more()
    try:
        while downloading:
            if not wanted or result.held_bytes >= MAX_HELD_BYTES:
                break
            package, task = downloading.popleft()
            try:
                temp = await task
            except (FetchError, UnusableDump, OSError) as exc:
                log.warning("Change Dump package %s not used: %s", package.loc, exc)
                download_more()
                continue
            download_more()
            try:
                result.packages += 1
                result.package_bytes += temp.stat().st_size
                await asyncio.to_thread(extract, temp, package.loc, wanted, result)
            finally:
                temp.unlink(missing_ok=True)
    finally:
        await _discard(task for _, task in downloading)
    for reason in result.refused[:20]:
        log.info("Change Dump: %s; fetching it instead", reason)
    return result
