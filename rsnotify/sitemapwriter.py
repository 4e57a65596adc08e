"""Serialize ResourceSync documents: the writing half of :mod:`rsnotify.sitemap`.

Apart from the reader because it shares nothing with it but the namespaces:
the reader is a bounded pull parser for untrusted input, this is plain string
building for documents rsnotify made itself.  Writes the namespaces as the
specification's examples do (default Sitemap namespace, ``rs:`` for
ResourceSync), UTC datetimes, no prefix on ResourceSync attributes, and refuses
characters XML 1.0 cannot carry rather than writing a document no reader
accepts.  :func:`split` turns a list longer than 50,000 entries into parts plus
an index (Sitemap protocol; Z39.99 section 7).

:mod:`rsnotify.sitemap` re-exports :func:`iter_xml`, :func:`serialize`,
:func:`write`, :func:`split` and :data:`MAX_ENTRIES_PER_DOCUMENT`, so callers
keep writing ``sitemap.serialize``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import IO

from . import w3cdt
from .model import (
    RS_NS,
    SITEMAP_NS,
    Document,
    Entry,
    Link,
    Root,
    is_change_document,
    make_document,
)

MAX_ENTRIES_PER_DOCUMENT = 50_000  # Sitemap protocol limit (section 7)
_XML_NS = "http://www.w3.org/XML/1998/namespace"

_ILLEGAL_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_ATTR_ESCAPES = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        '"': "&quot;",
        "\n": "&#10;",
        "\r": "&#13;",
        "\t": "&#9;",
    }
)
_TEXT_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "\r": "&#13;"})


def _check_chars(value: str) -> str:
    if _ILLEGAL_XML.search(value):
        raise ValueError(f"character not allowed in XML 1.0 in {value!r}")
    return value


def _attr(value: str) -> str:
    return _check_chars(value).translate(_ATTR_ESCAPES)


def _text(value: str) -> str:
    return _check_chars(value).translate(_TEXT_ESCAPES)


def _extra_attrs(extra: dict[str, str]) -> str:
    """Community attributes: namespaced ones get a local ``xmlns:nsN`` declaration."""
    if not extra:
        return ""
    parts: list[str] = []
    prefixes: dict[str, str] = {}
    for key, value in extra.items():
        if key.startswith("{"):
            ns, _, local = key[1:].partition("}")
            if ns in (RS_NS, SITEMAP_NS):
                raise ValueError(f"extra attribute {key} may not use the {ns} namespace")
            if ns == _XML_NS:  # xml:lang and friends: the prefix is fixed, never declared
                parts.append(f' xml:{local}="{_attr(value)}"')
                continue
            prefix = prefixes.get(ns)
            if prefix is None:
                prefix = prefixes[ns] = f"ns{len(prefixes)}"
                parts.append(f' xmlns:{prefix}="{_attr(ns)}"')
            parts.append(f' {prefix}:{local}="{_attr(value)}"')
        else:
            parts.append(f' {key}="{_attr(value)}"')
    return "".join(parts)


def _md_attrs(
    *,
    capability: str | None = None,
    change: str | None = None,
    hash: str | None = None,
    length: int | None = None,
    type: str | None = None,
    path: str | None = None,
    encoding: str | None = None,
    at: datetime | None = None,
    completed: datetime | None = None,
    from_: datetime | None = None,
    until: datetime | None = None,
    datetime_: datetime | None = None,
) -> str:
    out = []
    if capability is not None:
        out.append(f' capability="{_attr(str(capability))}"')
    if change is not None:
        out.append(f' change="{_attr(str(change))}"')
    for name, value in (
        ("at", at),
        ("completed", completed),
        ("from", from_),
        ("until", until),
        ("datetime", datetime_),
    ):
        if value is not None:
            out.append(f' {name}="{w3cdt.format(value)}"')
    if hash is not None:
        out.append(f' hash="{_attr(hash)}"')
    if length is not None:
        out.append(f' length="{int(length)}"')
    if type is not None:
        out.append(f' type="{_attr(type)}"')
    if path is not None:
        out.append(f' path="{_attr(path)}"')
    if encoding is not None:
        out.append(f' encoding="{_attr(encoding)}"')
    return "".join(out)


def _ln(link: Link, indent: str) -> str:
    attrs = [f'rel="{_attr(link.rel)}"', f'href="{_attr(link.href)}"']
    if link.modified is not None:
        attrs.append(f'modified="{w3cdt.format(link.modified)}"')
    for name in ("hash", "path", "type", "encoding"):
        value = getattr(link, name)
        if value is not None:
            attrs.append(f'{name}="{_attr(value)}"')
    if link.length is not None:
        attrs.append(f'length="{int(link.length)}"')
    if link.pri is not None:
        attrs.append(f'pri="{int(link.pri)}"')
    return f"{indent}<rs:ln {' '.join(attrs)}{_extra_attrs(link.extra)}/>\n"


def _entry_xml(entry: Entry, tag: str) -> str:
    parts = [f"  <{tag}>\n    <loc>{_text(entry.loc)}</loc>\n"]
    if entry.lastmod is not None:
        parts.append(f"    <lastmod>{w3cdt.format(entry.lastmod)}</lastmod>\n")
    if entry.changefreq is not None:
        parts.append(f"    <changefreq>{_text(entry.changefreq)}</changefreq>\n")
    md = _md_attrs(
        capability=entry.capability,
        change=entry.change,
        hash=entry.hash,
        length=entry.length,
        type=entry.type,
        path=entry.path,
        encoding=entry.encoding,
        at=entry.at,
        completed=entry.completed,
        from_=entry.from_,
        until=entry.until,
        datetime_=entry.datetime,
    ) + _extra_attrs(entry.md_extra)
    if md:
        parts.append(f"    <rs:md{md}/>\n")
    parts.extend(_ln(link, "    ") for link in entry.links)
    parts.append(f"  </{tag}>\n")
    return "".join(parts)


def iter_xml(document: Document) -> Iterator[str]:
    """The document as XML text, piece by piece (for streaming writes)."""
    root = document.root.value
    tag = "url" if document.root is Root.URLSET else "sitemap"
    yield '<?xml version="1.0" encoding="UTF-8"?>\n'
    yield f'<{root} xmlns="{SITEMAP_NS}" xmlns:rs="{RS_NS}">\n'
    md = _md_attrs(
        capability=document.capability,
        at=document.at,
        completed=document.completed,
        from_=document.from_,
        until=document.until,
    ) + _extra_attrs(document.md_extra)
    yield f"  <rs:md{md}/>\n"
    for link in document.links:
        yield _ln(link, "  ")
    for entry in document.entries:
        yield _entry_xml(entry, tag)
    yield f"</{root}>\n"


def serialize(document: Document) -> bytes:
    """The document as UTF-8 XML bytes."""
    return "".join(iter_xml(document)).encode("utf-8")


def write(document: Document, handle: IO[bytes], *, batch: int = 1 << 16) -> None:
    """Stream the document to a binary file in batches of about ``batch`` characters."""
    buffer: list[str] = []
    size = 0
    for piece in iter_xml(document):
        buffer.append(piece)
        size += len(piece)
        if size >= batch:
            handle.write("".join(buffer).encode("utf-8"))
            buffer.clear()
            size = 0
    if buffer:
        handle.write("".join(buffer).encode("utf-8"))


def split(
    document: Document,
    *,
    index_url: str,
    part_url: Callable[[int], str],
    max_entries: int = MAX_ENTRIES_PER_DOCUMENT,
) -> tuple[Document | None, list[tuple[str, Document]]]:
    """Split a list longer than ``max_entries`` into parts plus an index.

    Returns ``(None, [(index_url, document)])`` when it fits in one document.
    Otherwise every part links ``up`` like the original and ``index`` to
    ``index_url``; for change documents each part covers a contiguous interval
    (``until`` of one part is ``from`` of the next) and all but the last are
    closed; for snapshot documents every part carries the original ``at``.
    """
    if document.is_index:
        raise ValueError("split() takes a list, not an index")
    entries = document.entries
    if len(entries) <= max_entries:
        return None, [(index_url, document)]
    chunks = [entries[i : i + max_entries] for i in range(0, len(entries), max_entries)]
    changes = is_change_document(document.capability, document.root)
    up = [ln for ln in document.links if ln.rel == "up"]
    parts: list[tuple[str, Document]] = []
    index_entries: list[Entry] = []
    for number, chunk in enumerate(chunks, start=1):
        url = part_url(number)
        links = [*up, Link(rel="index", href=index_url)]
        if changes:
            start = document.from_ if number == 1 else chunk[0].change_time
            last = number == len(chunks)
            end = document.until if last else chunks[number][0].change_time
            part = make_document(
                document.root,
                document.capability,
                from_=start,
                until=end,
                links=links,
                entries=chunk,
            )
            index_entries.append(Entry(loc=url, lastmod=end, from_=start, until=end))
        else:
            part = make_document(
                document.root,
                document.capability,
                at=document.at,
                completed=document.completed,
                links=links,
                entries=chunk,
            )
            index_entries.append(Entry(loc=url, at=document.at, completed=document.completed))
        parts.append((url, part))
    index = make_document(
        Root.SITEMAPINDEX,
        document.capability,
        at=document.at,
        completed=document.completed,
        from_=document.from_,
        until=document.until,
        links=[ln for ln in document.links if ln.rel != "index"],
        entries=index_entries,
    )
    return index, parts
