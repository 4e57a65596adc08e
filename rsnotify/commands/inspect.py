"""``rsnotify inspect FILE|URL``: a quick look at any ResourceSync document.

The ``--json`` form is a stable, line-oriented view for scripts and tests: one
object for the document header, then one per entry, keys omitted when absent.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

from .. import w3cdt
from ..errors import RsNotifyError
from ..model import Document, Entry, Link
from ..sitemap import DEFAULT_LIMITS, DocumentReader, Limits

NAME = "inspect"
HELP = "read a ResourceSync document (file or URL) and describe it"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("location", metavar="FILE|URL", help="a local file or an http(s) URL")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument(
        "--allow-unordered",
        action="store_true",
        help="accept entries out of forward chronological order (reported as warnings)",
    )
    parser.add_argument(
        "--max-bytes",
        type=int,
        default=DEFAULT_LIMITS.max_bytes,
        help="refuse documents larger than this (default: 50 MB, the Sitemap limit)",
    )


def _link_json(link: Link) -> dict[str, Any]:
    out: dict[str, Any] = {"rel": link.rel, "href": link.href}
    for name in ("hash", "length", "path", "type", "pri", "encoding"):
        value = getattr(link, name)
        if value is not None:
            out[name] = value
    if link.modified is not None:
        out["modified"] = w3cdt.format(link.modified)
    out.update(link.extra)
    return out


def header_json(document: Document) -> dict[str, Any]:
    out: dict[str, Any] = {
        "root": document.root.value,
        "capability": document.capability,
        "type": type(document).__name__,
    }
    for name, key in (
        ("at", "at"),
        ("completed", "completed"),
        ("from_", "from"),
        ("until", "until"),
    ):
        value = getattr(document, name)
        if value is not None:
            out[key] = w3cdt.format(value)
    if document.links:
        out["links"] = [_link_json(link) for link in document.links]
    return out


def entry_json(entry: Entry) -> dict[str, Any]:
    out: dict[str, Any] = {"loc": entry.loc}
    if entry.change is not None:
        out["change"] = entry.change.value
    when = entry.change_time
    if when is not None:
        out["datetime"] = w3cdt.format(when)
    for name in ("hash", "length", "type", "capability"):
        value = getattr(entry, name)
        if value is not None:
            out[name] = value
    for name, key in (
        ("at", "at"),
        ("completed", "completed"),
        ("from_", "from"),
        ("until", "until"),
    ):
        value = getattr(entry, name)
        if value is not None:
            out[key] = w3cdt.format(value)
    if entry.links:
        out["links"] = [_link_json(link) for link in entry.links]
    return out


def _open(location: str, limits: Limits) -> Any:
    if location.startswith(("http://", "https://")):
        from ..fetch import Fetcher

        async def get() -> bytes:
            async with Fetcher() as fetcher:
                result = await fetcher.get(location, max_bytes=limits.max_bytes)
                return result.body

        return io.BytesIO(asyncio.run(get()))
    return location


def _describe(document: Document, count: int) -> Iterator[str]:
    yield f"kind:       {document.root.value} ({type(document).__name__})"
    yield f"capability: {document.capability}"
    for name, label in (
        ("at", "at"),
        ("completed", "completed"),
        ("from_", "from"),
        ("until", "until"),
    ):
        value = getattr(document, name)
        if value is not None:
            yield f"{label + ':':<12}{w3cdt.format(value)}"
    for link in document.links:
        yield f"link:       rel={link.rel} href={link.href}"
    yield f"entries:    {count}"


def run(args: argparse.Namespace) -> int:
    limits = Limits(max_bytes=args.max_bytes)
    out = sys.stdout
    try:
        reader = DocumentReader(
            _open(args.location, limits), limits=limits, allow_unordered=args.allow_unordered
        )
        header = reader.header
        if args.json:
            out.write(json.dumps(header_json(header), ensure_ascii=False) + "\n")
            for entry in reader:
                out.write(json.dumps(entry_json(entry), ensure_ascii=False) + "\n")
        else:
            count = sum(1 for _ in reader)
            out.write("\n".join(_describe(header, count)) + "\n")
        for warning in reader.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    except BrokenPipeError:  # `rsnotify inspect --json ... | head` is normal use
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the final flush
        return 0
    except (RsNotifyError, OSError) as exc:
        print(f"rsnotify inspect: {args.location}: {exc}", file=sys.stderr)
        return 1
    return 0
