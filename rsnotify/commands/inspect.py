"""``rsnotify inspect FILE|URL``: a quick look at any ResourceSync document.

The ``--json`` form is a stable, line-oriented view for scripts and tests: one
object for the document header, then one per entry, keys omitted when absent.
It carries every field the parser keeps (``lastmod`` beside ``datetime``,
``path``, ``encoding``, ``changefreq``, community attributes...).

A refused document writes *nothing* to stdout, in both forms: the listing is
spooled (in memory up to a few megabytes, then in a temporary file) and copied
to stdout only once the whole document has been read, so a script that
ignores the exit status never mistakes the first half of a broken list for
the whole of it.  The refusal is one line on stderr naming the rule it
enforces, and the exit status is 1.  Warnings (rules relaxed with
``--lenient``, mandatory attributes missing) go to stderr as well.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import fields
from datetime import datetime
from enum import Enum
from typing import IO, Any

from .. import w3cdt
from ..commonoptions import lenient_options, lenient_rules
from ..errors import RsNotifyError
from ..model import Document, Entry, Link
from ..options import Options, flag, option, positional
from ..sitemap import DEFAULT_LIMITS, DocumentReader, Lenient, Limits

# Any (strict module): the JSON values printed, read from any document or entry field.

NAME = "inspect"
HELP = "read a ResourceSync document (file or URL) and describe it"
SPOOL_BYTES = 8 << 20  # a --json listing larger than this waits in a temporary file

# JSON key for a model field where the Python name differs (``from`` is a keyword).
_KEYS = {"from_": "from", "md_extra": "extra"}


OPTIONS = Options(
    positional("location", metavar="FILE|URL", help="a local file or an http(s) URL"),
    flag(
        "--json",
        help="one JSON object per line (header, then entries); nothing on stdout if refused",
    ),
    lenient_options(),
    flag("--allow-unordered", help="the same as --lenient order (kept for existing scripts)"),
    option(
        "--max-bytes",
        type=int,
        default=DEFAULT_LIMITS.max_bytes,
        help="refuse documents larger than this (default: 50 MB, the Sitemap limit)",
    ),
)


def _value(value: Any) -> Any:
    if isinstance(value, datetime):
        return w3cdt.format(value)
    if isinstance(value, Enum):
        return value.value
    return value


def _fields_json(obj: Any, skip: frozenset[str]) -> dict[str, Any]:
    """Every dataclass field of ``obj`` that is set, under its JSON key.

    Read from the dataclass itself, so a field the parser learns to keep is
    listed without anyone remembering to add it here.  Community attributes
    (``md_extra``/``extra``, Clark-notation keys) come out as one object.
    """
    out: dict[str, Any] = {}
    for spec in fields(obj):
        name = spec.name
        if name in skip:
            continue
        value = getattr(obj, name)
        if value is None or (isinstance(value, (list, dict)) and not value):
            continue
        if name == "links":
            out["links"] = [link_json(link) for link in value]
        else:
            out[_KEYS.get(name, name)] = value if isinstance(value, dict) else _value(value)
    return out


def link_json(link: Link) -> dict[str, Any]:
    return _fields_json(link, frozenset())


def header_json(document: Document) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(document).__name__}
    out.update(_fields_json(document, frozenset({"entries"})))
    return out


def entry_json(entry: Entry) -> dict[str, Any]:
    """The entry's fields; ``datetime`` is its change time (rs:md datetime, else lastmod).

    ``lastmod`` is the ``<lastmod>`` element as written, beside it: in a 1.1
    Change List the two differ (the resource's time and the change's).
    """
    out = _fields_json(entry, frozenset({"line", "datetime"}))
    when = entry.change_time
    if when is not None:
        out["datetime"] = w3cdt.format(when)
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


def _listing(reader: DocumentReader, spool: IO[str]) -> None:
    spool.write(json.dumps(header_json(reader.header), ensure_ascii=False) + "\n")
    for entry in reader:
        spool.write(json.dumps(entry_json(entry), ensure_ascii=False) + "\n")


def run(args: argparse.Namespace) -> int:
    rules = lenient_rules(args)
    if args.allow_unordered:
        rules |= {Lenient.ORDER}
    limits = Limits(max_bytes=args.max_bytes, lenient=rules)
    try:
        reader = DocumentReader(_open(args.location, limits), limits=limits)
        with tempfile.SpooledTemporaryFile(SPOOL_BYTES, "w+", encoding="utf-8") as spool:
            if args.json:
                _listing(reader, spool)
            else:
                header = reader.header
                count = sum(1 for _ in reader)
                spool.write("\n".join(_describe(header, count)) + "\n")
            for warning in reader.warnings:
                print(f"warning: {warning}", file=sys.stderr)
            # Read to the end without a refusal: only now does stdout get anything.
            spool.seek(0)
            shutil.copyfileobj(spool, sys.stdout)
            sys.stdout.flush()
    except BrokenPipeError:  # `rsnotify inspect --json ... | head` is normal use
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the final flush
        return 0
    except (RsNotifyError, OSError) as exc:
        print(f"rsnotify inspect: {args.location}: {exc}", file=sys.stderr)
        return 1
    return 0
