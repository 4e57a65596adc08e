"""``rsnotify audit SOURCE --into DIR``: compare a mirror with the Source's Resource Lists.

Reports every resource missing from the mirror, every file whose length or
SHA-256 differs from the Resource List, and every file the Source does not
list; exits 1 when anything differs, so it fits in cron and CI.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
from pathlib import Path

from .. import discovery, sitemap
from ..errors import RsNotifyError
from ..fetch import Fetcher
from ..model import Capability, Entry
from ..options import Options, flag, option, positional, repeated
from ..subscriber.mirror import TEMP_PREFIX, MirrorError, path_for

NAME = "audit"
HELP = "compare a mirror with the Source's Resource List; exit 1 on differences"


OPTIONS = Options(
    positional("source", metavar="SOURCE"),
    option("--into", required=True, metavar="DIR"),
    repeated("--collection", metavar="URL|ID"),
    flag("--quiet", help="print only the summary"),
)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


async def _resources(fetcher: Fetcher, url: str) -> list[Entry]:
    result = await fetcher.get(url)
    document = sitemap.parse(result.body)
    if not document.is_index:
        return document.entries
    out: list[Entry] = []
    for part in document.entries:
        out.extend(sitemap.parse((await fetcher.get(part.loc)).body).entries)
    return out


async def audit(source: str, into: Path, collections: list[str]) -> list[str]:
    """Differences as human-readable lines (empty: the mirror equals the Source)."""
    differences: list[str] = []
    expected: set[Path] = set()
    async with Fetcher() as fetcher:
        info = await discovery.discover(source, fetcher)
        for cap in info.capability_lists:
            if collections and cap.url not in collections:
                continue
            url = cap.capabilities.get(Capability.RESOURCELIST)
            if url is None:
                differences.append(f"{cap.url}: no Resource List to audit against")
                continue
            for entry in await _resources(fetcher, url):
                try:
                    path = path_for(entry.loc, into)
                except MirrorError as exc:
                    differences.append(f"unsafe  {entry.loc}: {exc}")
                    continue
                expected.add(path)
                if not path.is_file():
                    differences.append(f"missing {entry.loc}")
                    continue
                if entry.length is not None and path.stat().st_size != entry.length:
                    differences.append(
                        f"length  {entry.loc}: {path.stat().st_size} != {entry.length}"
                    )
                    continue
                sha = entry.hashes().get("sha-256")
                if sha is not None and await asyncio.to_thread(_sha256, path) != sha:
                    differences.append(f"hash    {entry.loc}")
    for path in sorted(p for p in into.rglob("*") if p.is_file()):
        if path not in expected and not path.name.startswith(TEMP_PREFIX):
            differences.append(f"extra   {path.relative_to(into)}")
    return differences


def run(args: argparse.Namespace) -> int:
    into = Path(args.into)
    try:
        differences = asyncio.run(audit(args.source, into, args.collection))
    except RsNotifyError as exc:
        print(f"rsnotify audit: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        for line in differences:
            print(line)
    print(f"rsnotify audit: {len(differences)} difference(s)")
    return 1 if differences else 0
