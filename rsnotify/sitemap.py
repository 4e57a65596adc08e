"""Safe, streaming parse and serialize of every ResourceSync document.

Parsing is built for untrusted input from the open web:

* lxml's pull parser is fed in chunks and entries are handed out one by one,
  each element freed once read, so a 50,000-entry Change List (or a
  million-entry Change List Index set) costs constant memory per entry.
* No entity is ever resolved, no DTD loaded, no network touched.  A document
  carrying a DOCTYPE is refused outright (:class:`ForbiddenDTD`) before its
  content is parsed: ResourceSync documents never need one, and that is where
  XXE, billion-laughs and quadratic-blowup attacks live.
* Size is bounded (50 MB by default, the Sitemap limit) while reading, so a
  200 MB body is dropped after 50 MB rather than after it has filled memory;
  depth is bounded by libxml2's non-huge limit.
* Errors say what is wrong and where (line and element).

The Destination tells ``urlset`` from ``sitemapindex`` by the root element and
the capability from the document-level ``rs:md``, as section 12.2 prescribes.

Serialization lives in :mod:`rsnotify.sitemapwriter` and is re-exported here
(:func:`serialize`, :func:`iter_xml`, :func:`write`, :func:`split`).

Why one module of ~1100 lines: it is one streaming parser, and its parts
share the reader's state and its guarantees.  The chunk feeder, the markup and
preamble bounds, the root and header checks (which rules the entries obey
depends on the capability and root found there), the per-entry conversion and
the order checks all read and move the same :class:`DocumentReader` fields
(the header, the lenient rules and their warnings, the last change time, the
entry count), and each refusal must name the same line and rule whichever
part finds it; split apart, the bounds that make it safe for hostile input
would be spread over several files.  The writing half, which shares none of
that, is :mod:`rsnotify.sitemapwriter`; datetimes are :mod:`rsnotify.w3cdt`,
the document types :mod:`rsnotify.model`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import IO, Any, cast

from lxml import etree

from . import w3cdt
from .errors import (
    DocumentError,
    DocumentTooDeep,
    DocumentTooLarge,
    ForbiddenDTD,
    InvalidDatetime,
    InvalidDocument,
    InvalidValue,
    MalformedXML,
    MissingElement,
    OutOfOrder,
    TooManyEntries,
    WrongNamespace,
)
from .model import (
    CHANGEFREQS,
    KNOWN_CAPABILITIES,
    RS_NS,
    SITEMAP_NS,
    Capability,
    ChangeType,
    Document,
    Entry,
    Link,
    Root,
    is_change_document,
    make_document,
)
from .pullparsers import ParserPool
from .sitemapwriter import MAX_ENTRIES_PER_DOCUMENT as MAX_ENTRIES_PER_DOCUMENT
from .sitemapwriter import iter_xml as iter_xml
from .sitemapwriter import serialize as serialize
from .sitemapwriter import split as split
from .sitemapwriter import write as write

# Any (strict module): lxml elements and parsers (lxml-stubs 0.5 types pull-parser
# events as a union of elements and tuples, and lacks some methods: each value passed
# as Any here is an etree._Element or XMLPullParser), the parser's keyword options and
# the rs:md values (datetimes, ints, strings) of one header.

Source = bytes | bytearray | memoryview | str | os.PathLike[str] | IO[bytes]

MAX_DOCUMENT_BYTES = 50_000_000  # 50 MB, the Sitemap protocol limit
_MAX_PROLOG_BYTES = 1 << 20  # the XML declaration and comments before the root
# No ResourceSync tag or text run comes near these; libxml2 would buffer (and then
# expand into nodes) whatever lies between two '>' however long, and keeps every
# element of an unfinished subtree, so both bound what a hostile document costs.
_MAX_MARKUP_GAP = 1 << 20  # bytes without a '>'
_MAX_OPEN_ELEMENTS = 10_000  # elements inside one unfinished top-level element
_PEEK_SLICE = 2048  # the root parser's feed: the prolog and root tag are nearly always in one
_MAX_PREAMBLE = 1 << 18  # bytes before the first entry: the header (rs:md, rs:ln) is tiny
_UTF8_NAMES = frozenset({"utf8", "usascii", "ascii"})
_DECLARED_ENCODING = re.compile(
    rb"""^(?:\xef\xbb\xbf)?<\?xml\s[^>]*?encoding\s*=\s*["']([^"']*)["']"""
)

_URLSET = f"{{{SITEMAP_NS}}}urlset"
_SITEMAPINDEX = f"{{{SITEMAP_NS}}}sitemapindex"
_URL = f"{{{SITEMAP_NS}}}url"
_SITEMAP = f"{{{SITEMAP_NS}}}sitemap"
_LOC = f"{{{SITEMAP_NS}}}loc"
_LASTMOD = f"{{{SITEMAP_NS}}}lastmod"
_CHANGEFREQ = f"{{{SITEMAP_NS}}}changefreq"
_MD = f"{{{RS_NS}}}md"
_LN = f"{{{RS_NS}}}ln"

_ROOTS = {_URLSET: Root.URLSET, _SITEMAPINDEX: Root.SITEMAPINDEX}
_CHANGES = {c.value: c for c in ChangeType}

# Attributes of rs:md and rs:ln defined by the specification (Table 3, plus
# ResourceSync 1.1's ``datetime``); anything else is kept verbatim in ``extra``.
_MD_TIMES = ("at", "completed", "from", "until", "datetime")
_DOC_TIMES = ("at", "completed", "from", "until")  # a document has no rs:md datetime
_MD_KNOWN = frozenset(
    {"capability", "change", "hash", "length", "type", "path", "encoding", *_MD_TIMES}
)
_LN_KNOWN = frozenset(
    {"rel", "href", "hash", "length", "modified", "path", "type", "pri", "encoding"}
)

_SAFE_PARSER_OPTIONS: dict[str, Any] = {
    "resolve_entities": False,
    "no_network": True,
    "load_dtd": False,
    "dtd_validation": False,
    "huge_tree": False,
    "remove_comments": True,
    "remove_pis": True,
}
# Reused parsers (rsnotify.pullparsers: a fresh one per document is a garbage cycle).
_ENTRY_PARSERS = ParserPool(
    lambda: etree.XMLPullParser(events=("end",), tag=(_URL, _SITEMAP), **_SAFE_PARSER_OPTIONS)
)
_ROOT_PARSERS = ParserPool(lambda: etree.XMLPullParser(events=("start",), **_SAFE_PARSER_OPTIONS))


def _put_back_unfinished(peek: Any) -> None:
    """Close a root parser that stopped at the root's start tag, and pool it.

    Closing an unfinished document is an error to lxml, and resets the
    parser all the same; the events it read past the root are dropped.
    """
    with contextlib.suppress(etree.XMLSyntaxError):
        peek.close()
    _ROOT_PARSERS.give(peek)


# What each refusal enforces (DocumentError.rule), so a message names its rule.
R_STRUCTURE = "Z39.99 section 7"
R_CHANGELIST = "Z39.99 section 12.1"
R_INDEX_ORDER = "Z39.99 section 12.2"
R_MANIFEST_ORDER = "Z39.99 section 13.1.1"
R_TIMES = "Z39.99 Appendix A"
R_DATETIME = "W3C Datetime, Z39.99 section 7"
R_XML = "XML 1.0"
R_SITEMAP = "Sitemap protocol, Z39.99 section 7"
R_SAFETY = "rsnotify safety limit"


class Lenient(StrEnum):
    """A rule of the specification that a reader may relax, by name (``--lenient RULE``).

    Each is a rule real Sources break (see the README's "Sources in the
    wild"); relaxing one never guesses silently: the reader reports what it
    relaxed in :attr:`DocumentReader.warnings`, once per document.
    """

    #: W3C Datetime needs a time zone once a time is given (Z39.99 section 7):
    #: ``2020-06-02T00:00:00`` (or with a space for the ``T``) is read as UTC.
    TIMEZONE = "timezone"
    #: A document without a document-level ``rs:md`` (a plain Sitemap) is read
    #: as a Resource List (``urlset``) or Resource List Index (``sitemapindex``);
    #: never when an entry carries ``rs:md change`` (a Change List without its
    #: header stays refused: reading it as a snapshot would invert deletions).
    PLAIN_SITEMAP = "plain-sitemap"
    #: Entries out of forward chronological order (sections 12.1, 12.2, 13.1.1)
    #: are read in document order with one warning per document.
    ORDER = "order"


LENIENT_HELP = {
    Lenient.TIMEZONE: "datetimes without a time zone read as UTC",
    Lenient.PLAIN_SITEMAP: "a plain Sitemap (no rs:md) read as a Resource List (Index)",
    Lenient.ORDER: "entries out of forward chronological order read in document order",
}


def parse_lenient(text: str | Iterable[str]) -> frozenset[Lenient]:
    """``"timezone,order"`` (or a list of such) as rules; ``all`` and ``none`` too.

    Raises ValueError naming the known rules for anything else.
    """
    items = [text] if isinstance(text, str) else list(text)
    rules: set[Lenient] = set()
    for item in items:
        for name in (part.strip().lower() for part in item.split(",")):
            if name in ("", "none"):
                continue
            if name == "all":
                rules.update(Lenient)
                continue
            try:
                rules.add(Lenient(name))
            except ValueError:
                known = ", ".join([*(rule.value for rule in Lenient), "all", "none"])
                raise ValueError(f"unknown lenient rule {name!r} (known: {known})") from None
    return frozenset(rules)


@dataclass(frozen=True, slots=True)
class Limits:
    """How one document is read: bounds, and the rules relaxed for it.

    ``max_entries`` defaults to no limit because an index *set* may be read
    through one reader; set it to 50,000 to enforce the Sitemap rule strictly.
    ``lenient`` names the specification rules this reader relaxes (none by
    default): the policy travels with the bounds, so every caller that
    passes its :class:`Limits` down passes the operator's choice with them.
    """

    max_bytes: int = MAX_DOCUMENT_BYTES
    max_entries: int | None = None
    chunk_size: int = 1 << 16
    lenient: frozenset[Lenient] = frozenset()


DEFAULT_LIMITS = Limits()


# --- input -------------------------------------------------------------------


def _chunks(source: Source, limits: Limits) -> Iterator[bytes]:
    """Yield the document's bytes in chunks, refusing it past ``max_bytes``.

    Paths and in-memory documents are checked up front so an oversized file is
    refused without reading it; streams are counted as they are read.
    """
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        if len(data) > limits.max_bytes:
            raise DocumentTooLarge(
                f"document is {len(data)} bytes, limit {limits.max_bytes}", rule=R_SITEMAP
            )
        for start in range(0, len(data), limits.chunk_size):
            yield data[start : start + limits.chunk_size]
        return
    if isinstance(source, str | os.PathLike):
        size = os.stat(source).st_size
        if size > limits.max_bytes:
            raise DocumentTooLarge(
                f"{os.fspath(source)} is {size} bytes, limit {limits.max_bytes}", rule=R_SITEMAP
            )
        with open(source, "rb") as handle:
            yield from _read_stream(handle, limits)
        return
    yield from _read_stream(source, limits)


def _guard_markup(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Refuse a run of more than ``_MAX_MARKUP_GAP`` bytes without a ``>``.

    A start tag with millions of attributes or namespace declarations is held
    whole by libxml2 and costs twenty times its size once parsed.
    """
    gap = 0
    for chunk in chunks:
        end = chunk.rfind(b">")
        gap = gap + len(chunk) if end < 0 else len(chunk) - end - 1
        if gap > _MAX_MARKUP_GAP:
            raise DocumentTooLarge(
                f"more than {_MAX_MARKUP_GAP} bytes without a '>': a tag or text far too long",
                rule=R_SAFETY,
            )
        yield chunk


def _read_stream(handle: IO[bytes], limits: Limits) -> Iterator[bytes]:
    total = 0
    while True:
        chunk = handle.read(limits.chunk_size)
        if not chunk:
            return
        total += len(chunk)
        if total > limits.max_bytes:
            raise DocumentTooLarge(
                f"document exceeds the limit of {limits.max_bytes} bytes", rule=R_SITEMAP
            )
        yield chunk


def _local(tag: object) -> str:
    """An element's local name for messages.

    Not ``etree.QName``: it raises ValueError on the ``rs:md`` that lxml
    reports for a prefix the document never declared.
    """
    return tag.rpartition("}")[2] if isinstance(tag, str) else str(tag)


def _syntax_error(exc: etree.XMLSyntaxError) -> DocumentError:
    message = str(exc.msg or exc)
    line = exc.lineno or None
    if line is None:
        # The feed parser stops at a fatal error (an undefined entity, say) but
        # reports it only at close() as "no element found", without a line.
        # The log, which lxml keeps across parsers, ends with the real cause.
        # lxml-stubs 0.5 omits _ErrorLog.filter_from_fatals, which lxml has had since 2.0.
        fatals = exc.error_log.filter_from_fatals()  # type: ignore[attr-defined]
        if fatals:
            message, line = fatals[-1].message, fatals[-1].line or None
    if "depth" in message.lower():
        return DocumentTooDeep(f"element nesting too deep: {message}", line=line, rule=R_SAFETY)
    if "amplification" in message.lower() or ("entity" in message.lower() and "loop" in message):
        return ForbiddenDTD(f"entity expansion refused: {message}", line=line, rule=R_SAFETY)
    return MalformedXML(f"not well-formed XML: {message}", line=line, rule=R_XML)


# --- value conversion (each raises with the entry's place) --------------------


_NAIVE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[T ]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{1,9}))?)?"
)
TimeReader = Callable[[str | None, int | None, str], datetime | None]


def _naive(value: str) -> datetime | None:
    """A zone-less datetime (``T`` or a space before the time) as UTC, else None."""
    match = _NAIVE.fullmatch(value.strip())
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction = match.groups()
    try:
        return datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second or 0),
            int(((fraction or "") + "000000")[:6]),
            tzinfo=UTC,
        )
    except ValueError:
        return None


def _time(value: str | None, line: int | None, element: str) -> datetime | None:
    """A W3C Datetime, strictly: a time without a time zone is refused, saying so."""
    if value is None:
        return None
    try:
        return w3cdt.parse(value)
    except InvalidDatetime as exc:
        reason = exc.reason
        if _naive(value) is not None:
            reason += (
                ": a time without a time zone (W3C Datetime needs one once a time is given;"
                " --lenient timezone reads it as UTC)"
            )
        raise InvalidDatetime(reason, line=line, element=element, rule=R_DATETIME) from None


def _int(value: str | None, name: str, line: int | None, element: str, low: int = 0) -> int | None:
    if value is None:
        return None
    text = value.strip()
    # isascii: str.isdigit() also accepts "²" and other digits int() refuses.
    if not (text.isascii() and text.isdigit()) or int(text) < low:
        raise InvalidValue(
            f"{name}={value!r} is not an integer >= {low}",
            line=line,
            element=element,
            rule=R_STRUCTURE,
        )
    return int(text)


def _extra(attrs: dict[str, str], line: int | None, element: str) -> dict[str, str]:
    """Community attributes, refused when their name cannot be written back.

    A namespace URI holding ``{`` or ``}`` (no URI may) makes lxml's ``{ns}local``
    names ambiguous: the serializer would split them in the wrong place.
    """
    for name in attrs:
        if (name.count("{"), name.count("}")) not in ((0, 0), (1, 1)) or (
            "{" in name and not name.startswith("{")
        ):
            raise InvalidValue(
                f"attribute {name[:100]!r} has a namespace URI with braces",
                line=line,
                element=element,
                rule=R_STRUCTURE,
            )
    return attrs


def _link(attrs: dict[str, str], line: int | None, when: TimeReader = _time) -> Link:
    rel = attrs.pop("rel", None)
    href = (attrs.pop("href", None) or "").strip()  # blank is none (it round-trips as "")
    if not rel or not href:
        raise MissingElement(
            "rs:ln needs both rel and href", line=line, element="rs:ln", rule=R_STRUCTURE
        )
    pri = _int(attrs.pop("pri", None), "pri", line, "rs:ln", low=1)
    if pri is not None and pri > 999_999:
        raise InvalidValue(
            f"pri={pri} is above 999999", line=line, element="rs:ln", rule=R_STRUCTURE
        )
    link = Link(
        rel=rel,
        href=href,
        hash=attrs.pop("hash", None),
        length=_int(attrs.pop("length", None), "length", line, "rs:ln"),
        modified=when(attrs.pop("modified", None), line, "rs:ln"),
        path=attrs.pop("path", None),
        type=attrs.pop("type", None),
        pri=pri,
        encoding=attrs.pop("encoding", None),
    )
    if attrs:
        link.extra = _extra(attrs, line, "rs:ln")
    return link


def _md_fields(
    attrs: dict[str, str],
    line: int | None,
    element: str,
    names: tuple[str, ...] = _MD_TIMES,
    when: TimeReader = _time,
) -> dict[str, Any]:
    """Convert an rs:md attribute dict into Entry/Document keyword arguments."""
    out: dict[str, Any] = {}
    for name in names:
        value = attrs.pop(name, None)
        if value is not None:
            out["from_" if name == "from" else name] = when(value, line, element)
    return out


@dataclass(slots=True)
class _Header:
    root: Root
    capability: str | None = None
    md: dict[str, Any] = field(default_factory=dict)
    md_extra: dict[str, str] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)
    seen_md: bool = False
    md_line: int | None = None


class DocumentReader:
    """Stream one ResourceSync document: :attr:`header` first, then entries.

    Iterating yields :class:`~rsnotify.model.Entry` objects lazily; only the
    entry being read is in memory.  A reader can be iterated once.  The rules
    named in ``limits.lenient`` (:class:`Lenient`) are relaxed, each reported
    once in :attr:`warnings`; ``allow_unordered`` is the older spelling of
    :attr:`Lenient.ORDER`.  :attr:`unordered` counts the entries read out of
    forward chronological order.

    ``only_locs``: entries whose ``<loc>`` is not in it are freed unread, not
    yielded, checked or counted.  For a Change Dump manifest, of which a
    catch-up wants a few members (2,124 of 50,000 in bench.e2e): converting
    every entry was most of reading a package (50-64 ms of 58-69 ms for 1,250
    entries), the Change Lists' parse done a second time.
    """

    def __init__(
        self,
        source: Source,
        *,
        limits: Limits = DEFAULT_LIMITS,
        allow_unordered: bool = False,
        only_locs: Container[str] | None = None,
    ) -> None:
        if allow_unordered and Lenient.ORDER not in limits.lenient:
            limits = replace(limits, lenient=limits.lenient | {Lenient.ORDER})
        self._source = source
        self._limits = limits
        self._lenient = limits.lenient
        self._allow_unordered = Lenient.ORDER in limits.lenient
        self.warnings: list[str] = []
        self.unordered = 0
        self._warned: set[str] = set()
        self._header: _Header | None = None
        self._pending: Any = None  # first entry element, read while finding the header
        self._elements = self._element_stream()
        self._count = 0
        self._last_time: datetime | None = None
        self._change_doc = False
        self._index_doc = False
        self._order_rule = R_CHANGELIST
        self._plain = False  # read leniently as a Resource List: no rs:md at all
        self._consumed = False
        self._root_kind = Root.URLSET  # set from the real root by _check_root
        self._entry_tag = _URL
        self._entry_name = "url"
        self._partial: _Header | None = None
        self._root: Any = None  # the main parser's root element, once started
        self._when: TimeReader = self._lenient_time if Lenient.TIMEZONE in self._lenient else _time
        self._only_locs = only_locs

    def _warn(self, key: str, message: str) -> None:
        """Add ``message`` to :attr:`warnings` unless a warning of this kind was given."""
        if key not in self._warned:
            self._warned.add(key)
            self.warnings.append(message)

    def _lenient_time(self, value: str | None, line: int | None, element: str) -> datetime | None:
        """:func:`_time`, but a time without a zone is read as UTC (``--lenient timezone``)."""
        try:
            return _time(value, line, element)
        except InvalidDatetime:
            assert value is not None
            moment = _naive(value)
            if moment is None:
                raise
            self._warn(
                "timezone",
                f"line {line}: {value!r} and any other time without a time zone read as UTC "
                f"(lenient timezone; {R_DATETIME} requires a time zone)",
            )
            return moment

    # -- raw element stream ---------------------------------------------------

    def _element_stream(self) -> Iterator[Any]:
        """Yield each entry element (``url``/``sitemap``) as it ends."""
        chunks = _guard_markup(_chunks(self._source, self._limits))
        head = self._read_root(chunks)
        # Only entry end events reach Python: one event per entry.  The root is
        # learned from the first entry's parent; until then the document may
        # only hold its header, so its size is bounded instead (_MAX_PREAMBLE).
        parser = _ENTRY_PARSERS.take()
        root = None
        fed = len(head)
        try:
            parser.feed(head)
            for chunk in chunks:
                for _event, element in parser.read_events():
                    if self._root is None:  # "end" events carry elements (stubs: a union)
                        self._root = cast(etree._Element, element).getparent()
                    yield element
                if self._root is None:
                    fed += len(chunk)
                    if fed > _MAX_PREAMBLE:
                        raise DocumentTooLarge(
                            f"no entry in the first {_MAX_PREAMBLE} bytes: "
                            "a ResourceSync header is never that long",
                            rule=R_SAFETY,
                        )
                else:
                    self._sweep()
                parser.feed(chunk)
            for _event, element in parser.read_events():
                if self._root is None:
                    self._root = cast(etree._Element, element).getparent()
                yield element
            root = parser.close()
        except etree.XMLSyntaxError as exc:
            raise _syntax_error(exc) from None
        for element in self._drain_after(parser, root):
            yield element
        _ENTRY_PARSERS.give(parser)

    def _drain(self, parser: Any) -> Iterator[Any]:
        for _event, element in parser.read_events():
            yield element

    def _sweep(self) -> None:
        """Free what the entry events never reach, so memory stays bounded.

        Every entry read so far has been handed out and removed; what remains
        under the root are document-level ``rs:md``/``rs:ln`` (taken into the
        header, or refused once entries have begun) and foreign elements
        (dropped).  The last child may still be open: it is kept, but refused
        once it holds more elements than any real entry does.
        """
        root = self._root
        if root is None or not len(root):
            return
        last = root[-1]
        self._root_children(root, last)
        for count, _element in enumerate(last.iter()):
            if count > _MAX_OPEN_ELEMENTS:
                name = _local(last.tag)
                raise DocumentTooLarge(
                    f"<{name}> holds more than {_MAX_OPEN_ELEMENTS} elements",
                    line=last.sourceline,
                    element=name,
                    rule=R_SAFETY,
                )

    def _drain_after(self, parser: Any, root: Any) -> Iterator[Any]:
        yield from self._drain(parser)
        # Whatever root-level rs:md / rs:ln came after the last entry (or all of
        # them, in a document without entries).
        self._root_children(root, None)
        if self._header is None:
            self._finish_header(root)

    def _read_root(self, chunks: Iterator[bytes]) -> bytes:
        """Read up to the root's start tag; refuse DOCTYPEs and non-Sitemaps there.

        A throw-away pull parser sees only the prolog and the root start tag,
        so a hostile DTD is refused before a single entity could be used.  It
        is fed :data:`_PEEK_SLICE` bytes at a time: fed a whole chunk, it
        parsed the chunk's entries too (~7 % of the parse of a 1,000-entry
        Change List) only for the entry parser to parse them again.
        """
        peek = _ROOT_PARSERS.take()
        buffered = bytearray()
        try:
            for chunk in chunks:
                buffered += chunk
                for start in range(0, len(chunk), _PEEK_SLICE):
                    peek.feed(chunk[start : start + _PEEK_SLICE])
                    for _event, element in peek.read_events():
                        self._check_root(element)
                        self._check_encoding(bytes(buffered))
                        _put_back_unfinished(peek)
                        return bytes(buffered)
                if len(buffered) > _MAX_PROLOG_BYTES:
                    raise InvalidDocument("no root element in the first 1 MiB", rule=R_SAFETY)
            peek.close()
        except etree.XMLSyntaxError as exc:
            # feed() parses the whole chunk: an error further on (an entity a
            # DOCTYPE declared, say) must not hide what the root tells us.
            for _event, element in peek.read_events():
                self._check_root(element)
                break
            raise _syntax_error(exc) from None
        raise MalformedXML("empty document", rule=R_XML)

    def _check_encoding(self, head: bytes) -> None:
        """Refuse anything but UTF-8: the Sitemap protocol requires it."""
        if head.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in head[:4]:
            raise InvalidDocument(
                "document is UTF-16/32; Sitemaps must be UTF-8", line=1, rule=R_SITEMAP
            )
        declared = _DECLARED_ENCODING.match(head)
        if declared:
            name = declared.group(1).decode("ascii", "replace")
            if name.lower().replace("-", "").replace("_", "") not in _UTF8_NAMES:
                raise InvalidDocument(
                    f"document declares encoding {name!r}; Sitemaps must be UTF-8",
                    line=1,
                    rule=R_SITEMAP,
                )

    def _check_root(self, element: Any) -> None:
        docinfo = element.getroottree().docinfo
        if docinfo.doctype or docinfo.internalDTD is not None or docinfo.system_url:
            raise ForbiddenDTD(
                "DOCTYPE declarations are not allowed in ResourceSync documents",
                line=1,
                rule=R_SAFETY,
            )
        tag = element.tag
        if tag not in _ROOTS:
            local = _local(tag)
            if local in ("urlset", "sitemapindex"):
                raise WrongNamespace(
                    f"<{local}> must be in the Sitemap namespace {SITEMAP_NS}",
                    line=element.sourceline,
                    element=local,
                    rule=R_STRUCTURE,
                )
            raise InvalidDocument(
                f"root element <{local}> is neither <urlset> nor <sitemapindex>",
                line=element.sourceline,
                element=local,
                rule=R_STRUCTURE,
            )
        self._root_kind = _ROOTS[tag]
        self._entry_tag = _URL if self._root_kind is Root.URLSET else _SITEMAP
        self._entry_name = "url" if self._root_kind is Root.URLSET else "sitemap"

    # -- header ----------------------------------------------------------------

    def _root_children(self, root: Any, stop: Any) -> None:
        """Collect root-level rs:md / rs:ln preceding ``stop`` (None: all)."""
        if root is None:
            return
        header = self._header_in_progress()
        for child in list(root):
            if child is stop:
                break
            tag = child.tag
            if tag == _MD:
                if header.seen_md:
                    raise InvalidDocument(
                        "document has more than one document-level rs:md (the first on line "
                        f"{header.md_line})",
                        line=child.sourceline,
                        element="rs:md",
                        rule=R_STRUCTURE,
                    )
                if self._header is not None:
                    raise self._late_md(child.sourceline)
                # items(), not attrib: lxml's attrib cannot look up a name whose
                # namespace URI holds braces (KeyError); _extra refuses those.
                attrs = dict(child.items())
                header.seen_md = True
                header.md_line = child.sourceline
                header.capability = attrs.pop("capability", None)
                # "datetime" is an entry time: at document level it is an extra.
                header.md = _md_fields(attrs, child.sourceline, "rs:md", _DOC_TIMES, self._when)
                header.md_extra = _extra(attrs, child.sourceline, "rs:md")
            elif tag == _LN:
                if self._header is not None:
                    # The header was handed out with the first entry: a link
                    # after it would be silently lost.
                    raise InvalidDocument(
                        "document-level rs:ln must come before the entries",
                        line=child.sourceline,
                        element="rs:ln",
                        rule=R_STRUCTURE,
                    )
                header.links.append(_link(dict(child.items()), child.sourceline, self._when))
            elif isinstance(tag, str) and tag.endswith(("}md", "}ln")) and tag not in (_MD, _LN):
                raise WrongNamespace(
                    f"{tag} is not in the ResourceSync namespace {RS_NS}",
                    line=child.sourceline,
                    element=_local(tag),
                    rule=R_STRUCTURE,
                )
            if stop is not None:
                root.remove(child)

    def _late_md(self, line: int | None) -> InvalidDocument:
        return InvalidDocument(
            f"the document-level rs:md comes after the first <{self._entry_name}>: it must "
            "precede the entries (the reader learns the capability from it before any entry)",
            line=line,
            element="rs:md",
            rule=R_STRUCTURE,
        )

    def _header_in_progress(self) -> _Header:
        if self._partial is None:
            self._partial = _Header(root=self._root_kind)
        return self._partial

    def _missing_md(self, root: Any, drain: bool) -> DocumentError:
        """Why a document has no rs:md before its first entry, told as precisely as we can.

        An rs:md placed after the first entry gets its own message, so the rest
        of the document is read to find it (this is the path to a refusal; the
        size limits still hold).  Otherwise: a plain Sitemap when the
        ResourceSync namespace is not even declared, else a missing rs:md.
        """
        header = self._header_in_progress()
        try:
            for element in self._elements if drain else ():
                element.clear(keep_tail=False)
                if header.seen_md:
                    break
        except DocumentError:
            pass  # a later fault must not hide the first
        if header.seen_md:
            return self._late_md(header.md_line)
        line = root.sourceline if root is not None else None
        declared = root is not None and RS_NS in root.nsmap.values()
        what = (
            "document has no document-level rs:md"
            if declared
            else f"a plain Sitemap: the ResourceSync namespace {RS_NS} is not declared and "
            "there is no rs:md"
        )
        return MissingElement(
            f"{what}; the rs:md with a capability is mandatory in every ResourceSync "
            "document (--lenient plain-sitemap reads a plain Sitemap as a Resource List)",
            line=line,
            element=header.root.value,
            rule=R_STRUCTURE,
        )

    def _finish_header(self, root: Any, *, drain: bool = False) -> None:
        """Check and keep the header; ``drain``: the element stream may be read on."""
        header = self._header_in_progress()
        line = root.sourceline if root is not None else None
        if not header.seen_md:
            if Lenient.PLAIN_SITEMAP not in self._lenient:
                raise self._missing_md(root, drain)
            header.capability = Capability.RESOURCELIST
            self._plain = True
            kind = "Resource List" if header.root is Root.URLSET else "Resource List Index"
            self._warn(
                "plain",
                f"no document-level rs:md: a plain Sitemap, read as a {kind} "
                f"(lenient plain-sitemap; {R_STRUCTURE} makes rs:md capability mandatory)",
            )
        if not header.capability:
            raise MissingElement(
                "the document-level rs:md has no capability (mandatory in every document)",
                line=header.md_line or line,
                element="rs:md",
                rule=R_STRUCTURE,
            )
        if header.capability not in KNOWN_CAPABILITIES:
            self._warn(
                "capability",
                f"unknown capability {header.capability!r} ({R_STRUCTURE} defines "
                f"{', '.join(c.value for c in Capability)}): read as a generic document",
            )
        self._header = header
        self._change_doc = is_change_document(header.capability, header.root)
        self._index_doc = header.root is Root.SITEMAPINDEX and header.capability in (
            Capability.CHANGELIST,
            Capability.CHANGEDUMP,
        )
        if header.capability == Capability.CHANGEDUMP_MANIFEST:
            self._order_rule = R_MANIFEST_ORDER
        elif self._index_doc:
            self._order_rule = R_INDEX_ORDER
        if header.capability == Capability.CHANGELIST and "from_" not in header.md:
            self.warnings.append("Change List without the mandatory 'from' (Appendix A)")
        if (
            header.capability == Capability.RESOURCELIST
            and header.root is Root.URLSET
            and "at" not in header.md
            and not self._plain
        ):
            self.warnings.append("Resource List without the mandatory 'at' (Appendix A)")

    @property
    def header(self) -> Document:
        """The document without its entries (reads ahead to the first entry)."""
        if self._header is None:
            try:
                self._pending = next(self._elements)
            except StopIteration:
                self._pending = None
            if self._header is None:  # first entry seen: header precedes it
                self._root_children(self._pending.getparent(), self._pending)
                self._finish_header(self._pending.getparent(), drain=True)
        header = self._header
        assert header is not None
        return make_document(
            header.root,
            header.capability or "",
            links=list(header.links),
            md_extra=dict(header.md_extra),
            **header.md,
        )

    # -- entries ---------------------------------------------------------------

    def __iter__(self) -> Iterator[Entry]:
        if self._consumed:
            raise RuntimeError("a DocumentReader can be iterated only once")
        self._consumed = True
        self.header  # noqa: B018 - reads ahead to the first entry
        element = self._pending
        self._pending = None
        if element is None:
            return
        entry = self._entry
        only = self._only_locs
        if only is not None:
            for each in itertools.chain((element,), self._elements):
                loc = next((c.text for c in each if c.tag == _LOC), None)
                if loc is not None and loc.strip() in only:
                    yield entry(each)
                else:
                    self._free(each)
            return
        yield entry(element)
        for element in self._elements:  # a plain for loop: the cheapest way through
            yield entry(element)

    def _repeated(self, child: Any, what: str) -> InvalidDocument:
        """A second ``<loc>``, ``<lastmod>``, ``<changefreq>`` or ``rs:md`` in one entry.

        Keeping the last (or the first) would silently pick one of two resources
        or times: the Sitemap schema allows each at most once, and section 7
        says of the entry's rs:md "the element is not repeatable".
        """
        return InvalidDocument(
            f"<{self._entry_name}> has a second {what}: at most one per entry",
            line=child.sourceline,
            element=_local(child.tag) if what != "rs:md" else "rs:md",
            rule=R_STRUCTURE,
        )

    def _free(self, element: Any) -> None:
        """Check an entry element's place and free it: constant memory however long the file."""
        if element.tag != self._entry_tag:
            name = _local(element.tag)
            raise InvalidDocument(
                f"<{name}> does not belong in <{self._root_kind.value}>",
                line=element.sourceline,
                element=name,
                rule=R_STRUCTURE,
            )
        parent = element.getparent()
        if parent.getparent() is not None:
            # An entry inside another element (<loc>, say): its removal below would
            # glue the text after it to its parent's, differently per chunk boundary.
            name = _local(element.tag)
            raise InvalidDocument(
                f"<{name}> nested inside <{_local(parent.tag)}>",
                line=element.sourceline,
                element=name,
                rule=R_STRUCTURE,
            )
        element.clear(keep_tail=False)
        parent.remove(element)

    def _entry(self, element: Any) -> Entry:
        # The hot path of every parse: one pass over the children, one Entry()
        # call, no per-field setattr.  Measured against a bare lxml loop in
        # bench/parse.py.
        line = element.sourceline
        loc = lastmod = changefreq = None
        seen_loc = seen_lastmod = False
        md: dict[str, str] | None = None
        links: list[Link] | None = None
        for child in element:
            tag = child.tag
            if tag == _LOC:
                if seen_loc:
                    raise self._repeated(child, "<loc>")
                seen_loc = True
                loc = child.text
            elif tag == _MD:
                if md is not None:
                    raise self._repeated(child, "rs:md")
                md = dict(child.items())
            elif tag == _LASTMOD:
                if seen_lastmod:
                    raise self._repeated(child, "<lastmod>")
                seen_lastmod = True
                lastmod = child.text
                if lastmod is None:
                    self._warn(
                        "empty-lastmod",
                        f"line {child.sourceline}: an empty <lastmod> read as absent "
                        f"({R_STRUCTURE}: it is a W3C Datetime when present)",
                    )
            elif tag == _LN:
                if links is None:
                    links = []
                links.append(_link(dict(child.items()), child.sourceline, self._when))
            elif tag == _CHANGEFREQ:
                if changefreq is not None:
                    raise self._repeated(child, "<changefreq>")
                changefreq = (child.text or "").strip()
        self._free(element)

        name = self._entry_name
        # anyURI collapses whitespace: <loc> padded with newlines and tabs is the URI inside.
        if not loc or not (loc := loc.strip()):
            raise MissingElement(
                "entry without <loc> (mandatory)", line=line, element=name, rule=R_STRUCTURE
            )
        if changefreq is not None and changefreq not in CHANGEFREQS:
            raise InvalidValue(
                f"unknown changefreq {changefreq!r}", line=line, element=name, rule=R_STRUCTURE
            )
        when = None
        if lastmod is not None:
            try:
                when = w3cdt.parse(lastmod)
            except InvalidDatetime:
                when = self._when(lastmod, line, "lastmod")
        change = digest = media = length = moment = None
        if md:
            # The common Change List attributes first, positionally into Entry();
            # anything else (1.1 datetime, capability, path, intervals, community
            # attributes) is rarer and handled after construction.
            pop = md.pop
            text = pop("change", None)
            if text is not None:
                change = _CHANGES.get(text)
                if change is None:
                    raise InvalidValue(
                        f"unknown change {text!r} (created, updated or deleted)",
                        line=line,
                        element="rs:md",
                        rule=R_STRUCTURE,
                    )
                if self._plain:
                    raise MissingElement(
                        f"entry with rs:md change={text!r} in a document without rs:md: a "
                        "Change List without its header is not read as a Resource List",
                        line=line,
                        element="rs:md",
                        rule=R_CHANGELIST,
                    )
            digest = pop("hash", None)
            media = pop("type", None)
            text = pop("length", None)
            if text is not None:
                length = (
                    int(text)
                    if text.isascii() and text.isdigit()
                    else _int(text, "length", line, "rs:md")
                )
            text = pop("datetime", None)  # on every entry of a 1.1 Change List
            if text is not None:
                # Usually the very text of <lastmod> (the change time, twice): the
                # same reading, so the same value, without parsing it again.
                moment = (
                    when
                    if text == lastmod and when is not None
                    else self._when(text, line, "rs:md")
                )
        entry = Entry(loc, when, changefreq, change, moment, digest, length, media, line=line)
        if md:
            self._rare_md(entry, md, line)
        if links is not None:
            entry.links = links
        self._count += 1
        limit = self._limits.max_entries
        if limit is not None and self._count > limit:
            raise TooManyEntries(
                f"more than {limit} entries", line=line, element=name, rule=R_SITEMAP
            )
        if self._change_doc:
            t = entry.datetime if entry.datetime is not None else when
            last = self._last_time
            if change is None or t is None or (last is not None and t < last):
                self._check_change(entry, name)  # raises, or warns when unordered is allowed
            else:
                self._last_time = t
        elif self._index_doc:
            self._check_order(entry.from_, entry, name, "from")
        return entry

    def _rare_md(self, entry: Entry, md: dict[str, str], line: int | None) -> None:
        """rs:md attributes beyond change/hash/type/length/datetime (intervals, extras)."""
        pop = md.pop
        entry.capability = capability = pop("capability", None)
        entry.path = pop("path", None)
        entry.encoding = pop("encoding", None)
        for key, value in _md_fields(md, line, "rs:md", _MD_TIMES, self._when).items():
            setattr(entry, key, value)
        if md:
            entry.md_extra = _extra(md, line, "rs:md")
        if capability is not None and capability not in KNOWN_CAPABILITIES:
            self._warn(
                f"capability {capability}",
                f"line {line}: unknown capability {capability!r} of {entry.loc} "
                f"({R_STRUCTURE} does not define it)",
            )

    def _check_change(self, entry: Entry, name: str) -> None:
        if entry.change is None:
            raise MissingElement(
                f"Change List entry for {entry.loc} has no rs:md change",
                line=entry.line,
                element=name,
                rule=R_CHANGELIST,
            )
        when = entry.change_time
        if when is None:
            raise MissingElement(
                f"Change List entry for {entry.loc} has no change time "
                "(<lastmod> or rs:md datetime)",
                line=entry.line,
                element=name,
                rule=R_TIMES,
            )
        self._check_order(when, entry, name, "change time")

    def _check_order(self, when: datetime | None, entry: Entry, name: str, what: str) -> None:
        if when is None:
            return
        last = self._last_time
        if last is not None and when < last:
            message = (
                f"entries not in forward chronological order: {what} {w3cdt.format(when)} "
                f"of {entry.loc} precedes {w3cdt.format(last)}"
            )
            if not self._allow_unordered:
                raise OutOfOrder(
                    f"{message} (--lenient order reads them in document order)",
                    line=entry.line,
                    element=name,
                    rule=self._order_rule,
                )
            # One warning per document, however many entries are out of place.
            self.unordered += 1
            self._warn(
                "order",
                f"line {entry.line}: {message} [{self._order_rule}]; read in document order "
                "(lenient order)",
            )
            return
        self._last_time = when


def parse(
    source: Source,
    *,
    limits: Limits = DEFAULT_LIMITS,
    allow_unordered: bool = False,
    only_locs: Container[str] | None = None,
) -> Document:
    """Read a whole document into a typed :class:`~rsnotify.model.Document`.

    Unlike the streaming reader, this holds every entry, so it enforces the
    Sitemap limit of 50,000 entries per document unless ``limits`` sets its
    own ``max_entries``: 50 MB of tiny hostile entries would otherwise cost
    hundreds of megabytes.  ``only_locs``: see :class:`DocumentReader`.
    """
    if limits.max_entries is None:
        limits = replace(limits, max_entries=MAX_ENTRIES_PER_DOCUMENT)
    reader = DocumentReader(
        source, limits=limits, allow_unordered=allow_unordered, only_locs=only_locs
    )
    document = reader.header
    document.entries = list(reader)
    return document


def iter_entries(
    source: Source,
    *,
    after: tuple[datetime, str] | None = None,
    limits: Limits = DEFAULT_LIMITS,
    allow_unordered: bool = False,
) -> Iterator[Entry]:
    """Yield entries lazily, optionally only those after a (change time, loc) position.

    This is how a Destination resumes a Change List (section 12.1): entries
    earlier than the position's time are skipped; at the same time, entries up
    to and including the position's own entry are skipped.  If the position's
    entry is gone from the list, the entries sharing its time are all
    yielded: applying a change twice is harmless, missing one is not.
    """
    reader = DocumentReader(source, limits=limits, allow_unordered=allow_unordered)
    if after is None:
        yield from reader
        return
    when, loc = after
    same_time: list[Entry] = []
    marker_seen = False
    passed = False
    for entry in reader:
        if passed:
            yield entry
            continue
        t = entry.change_time
        if t is None or t < when:
            continue
        if t == when:
            if marker_seen:
                yield entry
            elif entry.loc == loc:
                marker_seen = True
                same_time.clear()
            else:
                same_time.append(entry)
            continue
        passed = True
        yield from same_time
        yield entry
    if not passed:
        yield from same_time
