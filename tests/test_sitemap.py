"""The document layer: errors that name problem and place, streaming, resuming, splitting.

Why one module of ~760 lines: it tests one public API, :mod:`rsnotify.sitemap`; the parser's
sections share the hand-written ``urlset``/``change``/``changelist`` documents and a
50,000-entry fixture, and the serialize and split tests check their output by parsing it
back, so writer and reader are held to each other in one file.

Documents are written out by hand (not by ``serialize``) wherever the parser is
under test, so a serializer bug cannot hide a parser bug and vice versa.
"""

from __future__ import annotations

import io
import itertools
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rsnotify.errors import (
    DocumentError,
    DocumentTooLarge,
    InvalidDatetime,
    InvalidDocument,
    InvalidValue,
    MissingElement,
    OutOfOrder,
    TooManyEntries,
    WrongNamespace,
)
from rsnotify.model import (
    RS_NS,
    SITEMAP_NS,
    ChangeList,
    ChangeListIndex,
    ChangeType,
    Entry,
    Link,
    ResourceList,
    ResourceListIndex,
    Root,
    make_document,
)
from rsnotify.sitemap import DocumentReader, Limits, iter_entries, parse, serialize, split, write

T0 = datetime(2013, 1, 3, tzinfo=UTC)
CAPLIST = "http://example.com/dataset1/capabilitylist.xml"


def urlset(capability: str, md: str, *lines: str, root: str = "urlset") -> bytes:
    """A document with one element per line: line N of the body is line N + 4 of the file."""
    head = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<{root} xmlns="{SITEMAP_NS}"',
        f'        xmlns:rs="{RS_NS}">',
        f'<rs:md capability="{capability}" {md}/>',
    ]
    return "\n".join([*head, *lines, f"</{root}>", ""]).encode()


def change(loc: str, when: str | None, kind: str | None = "updated", extra: str = "") -> str:
    lastmod = f"<lastmod>{when}</lastmod>" if when else ""
    md = f'<rs:md change="{kind}"{extra}/>' if kind else (f"<rs:md{extra}/>" if extra else "")
    return f"<url><loc>{loc}</loc>{lastmod}{md}</url>"


def changelist(*lines: str, md: str = 'from="2013-01-03T00:00:00Z"') -> bytes:
    return urlset("changelist", md, *lines)


def body_line(n: int) -> int:
    """File line of the n-th (1-based) body line written by :func:`urlset`."""
    return n + 4


# --- errors name the problem and the place ------------------------------------------

GOOD = change("http://example.com/ok", "2013-01-03T10:00:00Z")

ERRORS = [
    # (body lines, expected class, 1-based body line of the culprit, text in the message)
    ([GOOD, "<url><lastmod>2013-01-03T11:00:00Z</lastmod></url>"], MissingElement, 2, "<loc>"),
    ([GOOD, "<url><loc>   </loc></url>"], MissingElement, 2, "<loc>"),
    (
        [GOOD, change("http://example.com/a", None)],
        MissingElement,
        2,
        "http://example.com/a",
    ),
    (
        [GOOD, change("http://example.com/b", "2013-01-03T11:00:00Z", kind=None)],
        MissingElement,
        2,
        "change",
    ),
    (
        [change("http://example.com/c", "2013-01-03T11:00:00Z", kind="modified")],
        InvalidValue,
        1,
        "modified",
    ),
    (
        [GOOD, GOOD, change("http://example.com/d", "2013-01-03 11:00:00Z")],
        InvalidDatetime,
        3,
        "2013-01-03 11:00:00Z",
    ),
    (
        [
            GOOD,
            '<url><loc>http://example.com/e</loc><rs:md change="created" datetime="13/1/3"/></url>',
        ],
        InvalidDatetime,
        2,
        "13/1/3",
    ),
    (
        [GOOD, change("http://example.com/f", "2013-01-03T09:00:00Z")],
        OutOfOrder,
        2,
        "http://example.com/f",
    ),
    (
        [GOOD, "<sitemap><loc>http://example.com/g</loc></sitemap>"],
        InvalidDocument,
        2,
        "<sitemap>",
    ),
    (
        [GOOD, change("http://example.com/h", "2013-01-03T11:00:00Z", extra=' length="-3"')],
        InvalidValue,
        2,
        "length",
    ),
    (
        [
            "<url><loc>http://example.com/i</loc><lastmod>2013-01-03T11:00:00Z</lastmod>"
            '<rs:md change="created"/><rs:ln rel="duplicate" href="http://m/i" pri="0"/></url>'
        ],
        InvalidValue,
        1,
        "pri",
    ),
    (
        [GOOD, '<rs:ln rel="index" href="http://example.com/index.xml"/>'],
        InvalidDocument,
        2,
        "rs:ln",
    ),
    (  # blank once its whitespace is stripped: no href at all (section 7)
        [
            "<url><loc>http://example.com/k</loc><lastmod>2013-01-03T11:00:00Z</lastmod>"
            '<rs:md change="created"/><rs:ln rel="duplicate" href=" \t"/></url>'
        ],
        MissingElement,
        1,
        "rel and href",
    ),
    ([GOOD, '<rs:md capability="changelist"/>'], InvalidDocument, 2, "rs:md"),
    (
        [GOOD, '<url><loc>http://example.com/j</loc><rs:md change="created"/><rs:md/></url>'],
        InvalidDocument,
        2,
        "rs:md",
    ),
    (
        [GOOD, '<md xmlns="http://www.openarchives.org/rs/terms" capability="changelist"/>'],
        WrongNamespace,
        2,
        RS_NS,
    ),
    (
        [GOOD, "<url><loc>http://example.com/k</loc><changefreq>often</changefreq></url>"],
        InvalidValue,
        2,
        "often",
    ),
]


@pytest.mark.parametrize(("lines", "cls", "line", "text"), ERRORS)
def test_errors_name_the_problem_and_the_line(
    lines: list[str], cls: type[DocumentError], line: int, text: str
) -> None:
    data = changelist(*lines)
    with pytest.raises(cls) as caught:
        parse(data)
    assert type(caught.value) is cls
    assert caught.value.line == body_line(line)
    assert text in str(caught.value)
    assert f"line {body_line(line)}" in str(caught.value)
    # The streaming reader refuses at the same place, after the good entries.
    seen: list[str] = []
    with pytest.raises(cls) as again:
        for entry in iter_entries(data):
            seen.append(entry.loc)
    assert again.value.line == caught.value.line
    assert len(seen) < len(lines)


def test_wrong_namespace_of_the_root_is_refused_with_its_line() -> None:
    data = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n'
        b'<urlset xmlns="http://www.google.com/schemas/sitemap/0.84">\n'
        b"<url><loc>http://example.com/a</loc></url>\n"
        b"</urlset>\n"
    )
    with pytest.raises(WrongNamespace) as caught:
        parse(data)
    assert caught.value.line == 2
    assert caught.value.element == "urlset"
    assert SITEMAP_NS in str(caught.value)


def test_undeclared_resourcesync_namespace_is_named_in_the_error() -> None:
    data = (
        f'<urlset xmlns="{SITEMAP_NS}"><url><loc>http://example.com/a</loc></url></urlset>'
    ).encode()
    with pytest.raises(MissingElement, match="rs:md") as caught:
        parse(data)
    assert RS_NS in str(caught.value)


def test_document_level_from_must_be_a_w3c_datetime() -> None:
    with pytest.raises(InvalidDatetime) as caught:
        parse(changelist(GOOD, md='from="yesterday"'))
    assert caught.value.line == 4 and caught.value.element == "rs:md"


def test_capability_is_mandatory() -> None:
    with pytest.raises(MissingElement, match="capability"):
        parse(urlset("changelist", "", GOOD).replace(b'capability="changelist"', b""))


def test_out_of_order_is_accepted_with_a_warning_when_allowed() -> None:
    data = changelist(
        change("http://example.com/a", "2013-01-03T10:00:00Z"),
        change("http://example.com/b", "2013-01-03T09:00:00Z"),
        change("http://example.com/c", "2013-01-03T11:00:00Z"),
    )
    with pytest.raises(OutOfOrder):
        parse(data)
    reader = DocumentReader(data, allow_unordered=True)
    assert [e.loc for e in reader] == [
        "http://example.com/a",
        "http://example.com/b",
        "http://example.com/c",
    ]
    (warning,) = reader.warnings
    assert "http://example.com/b" in warning and "line 6" in warning
    document = parse(data, allow_unordered=True)
    assert len(document) == 3


def test_change_list_index_must_be_in_forward_chronological_order() -> None:
    data = urlset(
        "changelist",
        'from="2013-01-01T00:00:00Z"',
        "<sitemap><loc>http://example.com/2.xml</loc>"
        '<rs:md from="2013-01-02T00:00:00Z"/></sitemap>',
        "<sitemap><loc>http://example.com/1.xml</loc>"
        '<rs:md from="2013-01-01T00:00:00Z"/></sitemap>',
        root="sitemapindex",
    )
    with pytest.raises(OutOfOrder) as caught:
        parse(data)
    assert caught.value.line == body_line(2)
    assert isinstance(parse(data, allow_unordered=True), ChangeListIndex)


def test_entries_sharing_a_time_are_in_order() -> None:
    same = "2013-01-03T10:00:00Z"
    data = changelist(change("http://example.com/a", same), change("http://example.com/b", same))
    assert [e.loc for e in parse(data)] == ["http://example.com/a", "http://example.com/b"]


def test_missing_mandatory_from_and_at_are_warnings_not_errors() -> None:
    """Appendix A makes them mandatory, but Sources omit them; refusing helps nobody."""
    reader = DocumentReader(changelist(GOOD, md=""))
    list(reader)
    assert any("from" in w for w in reader.warnings)
    reader = DocumentReader(
        urlset("resourcelist", "", "<url><loc>http://example.com/a</loc></url>")
    )
    list(reader)
    assert any("at" in w for w in reader.warnings)


def test_too_many_entries() -> None:
    data = changelist(
        *(change(f"http://example.com/{i}", "2013-01-03T10:00:00Z") for i in range(4))
    )
    assert len(parse(data, limits=Limits(max_entries=4))) == 4
    with pytest.raises(TooManyEntries) as caught:
        parse(data, limits=Limits(max_entries=3))
    assert caught.value.line == body_line(4)


def test_only_locs_reads_the_entries_asked_for_and_frees_the_rest_unread() -> None:
    """For a Change Dump manifest, of which a catch-up wants a few members."""
    wanted = {"http://example.com/b", "http://example.com/d"}
    data = changelist(
        change("http://example.com/a", "2013-01-03T10:00:00Z"),
        change(" http://example.com/b\n", "2013-01-03T11:00:00Z"),  # anyURI: whitespace
        change("http://example.com/c", "not a datetime"),  # not read, so not refused
        change("http://example.com/d", "2013-01-03T12:00:00Z", "deleted"),
    )
    found = parse(data, only_locs=wanted)
    assert [(e.loc, e.change) for e in found] == [
        ("http://example.com/b", ChangeType.UPDATED),
        ("http://example.com/d", ChangeType.DELETED),
    ]
    with pytest.raises(InvalidDatetime):
        parse(data)  # the same document read whole
    # What would break the document's structure is refused whether wanted or not.
    nested = changelist(
        change("http://example.com/a", "2013-01-03T10:00:00Z"),
        "<url><loc>http://example.com/b<url><loc>http://example.com/x</loc></url></loc></url>",
    )
    with pytest.raises(InvalidDocument):
        parse(nested, only_locs={"http://example.com/a"})


# --- sources and limits ---------------------------------------------------------------


def sample() -> bytes:
    return changelist(
        change("http://example.com/a", "2013-01-03T10:00:00Z", "created"),
        change("http://example.com/b", "2013-01-03T11:00:00+01:00", "deleted"),
    )


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "str", "path", "file"])
def test_every_kind_of_source_gives_the_same_document(kind: str, tmp_path: Path) -> None:
    data = sample()
    file = tmp_path / "changelist.xml"
    file.write_bytes(data)
    source = {
        "bytes": data,
        "bytearray": bytearray(data),
        "memoryview": memoryview(data),
        "str": str(file),
        "path": file,
        "file": io.BytesIO(data),
    }[kind]
    document = parse(source)
    assert isinstance(document, ChangeList)
    assert [(e.loc, e.change, e.change_time) for e in document] == [
        ("http://example.com/a", ChangeType.CREATED, T0 + timedelta(hours=10)),
        ("http://example.com/b", ChangeType.DELETED, T0 + timedelta(hours=10)),
    ]


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 1 << 16])
def test_chunk_boundaries_do_not_matter(chunk_size: int) -> None:
    data = (Path(__file__).parent / "data" / "spec" / "example-24-changelist.xml").read_bytes()
    assert parse(data, limits=Limits(chunk_size=chunk_size)) == parse(data)


@pytest.mark.parametrize("kind", ["bytes", "path", "file"])
def test_byte_limit_is_inclusive(kind: str, tmp_path: Path) -> None:
    data = sample()
    file = tmp_path / "changelist.xml"
    file.write_bytes(data)

    def source() -> object:
        return {"bytes": data, "path": file, "file": io.BytesIO(data)}[kind]

    assert len(parse(source(), limits=Limits(max_bytes=len(data)))) == 2
    with pytest.raises(DocumentTooLarge):
        parse(source(), limits=Limits(max_bytes=len(data) - 1, chunk_size=16))


# --- the header and ResourceSync 1.1 --------------------------------------------------


def test_header_comes_first_and_holds_no_entries() -> None:
    data = urlset(
        "changelist",
        'from="2013-01-02T00:00:00Z" until="2013-01-03T00:00:00Z"',
        f'<rs:ln rel="up" href="{CAPLIST}"/>',
        '<rs:ln rel="index" href="http://example.com/index.xml"/>',
        change("http://example.com/a", "2013-01-02T10:00:00Z"),
    )
    reader = DocumentReader(data)
    header = reader.header
    assert isinstance(header, ChangeList)
    assert header.entries == []
    assert (header.from_, header.until) == (T0 - timedelta(days=1), T0)
    assert (header.up, header.index) == (CAPLIST, "http://example.com/index.xml")
    assert not header.is_open
    assert [e.loc for e in reader] == ["http://example.com/a"]
    with pytest.raises(RuntimeError):
        list(reader)


@pytest.mark.parametrize("chunk_size", [16, 1 << 16])
def test_extension_elements_are_skipped_wherever_they_are(chunk_size: int) -> None:
    """Foreign elements around the header and between entries neither count nor stay."""
    junk = '<x:meta xmlns:x="http://example.org/x"><x:a/>text</x:meta>'
    data = urlset(
        "changelist",
        'from="2013-01-03T00:00:00Z"',
        f'<rs:ln rel="up" href="{CAPLIST}"/>',
        junk * 500,
        '<rs:ln rel="index" href="http://example.com/index.xml"/>',
        change("http://example.com/a", "2013-01-03T10:00:00Z"),
        junk * 500,
        change("http://example.com/b", "2013-01-03T11:00:00Z"),
        junk,
    )
    document = parse(data, limits=Limits(chunk_size=chunk_size))
    assert [ln.rel for ln in document.links] == ["up", "index"]
    assert [e.loc for e in document] == ["http://example.com/a", "http://example.com/b"]
    assert document.entries[0].links == [] and document.entries[0].md_extra == {}


def test_header_of_a_document_without_entries() -> None:
    reader = DocumentReader(urlset("resourcelist", 'at="2013-01-03T00:00:00Z"'))
    assert isinstance(reader.header, ResourceList)
    assert reader.header.at == T0
    assert list(reader) == []


def test_resourcesync_1_1_datetime_is_the_change_time() -> None:
    data = changelist(
        "<url><loc>http://example.com/a</loc><lastmod>2012-12-01T00:00:00Z</lastmod>"
        '<rs:md change="updated" datetime="2013-01-03T10:00:00Z"/></url>',
        "<url><loc>http://example.com/b</loc>"
        '<rs:md change="created" datetime="2013-01-03T10:30:00.250000Z"/></url>',
        # The usual 1.1 entry: the same text twice (read once, the same value).
        "<url><loc>http://example.com/c</loc><lastmod>2013-01-03T12:00:00+01:00</lastmod>"
        '<rs:md change="updated" datetime="2013-01-03T12:00:00+01:00"/></url>',
    )
    a, b, c = parse(data)
    assert c.lastmod == c.datetime == T0 + timedelta(hours=11)
    assert a.lastmod == datetime(2012, 12, 1, tzinfo=UTC)  # when the resource last changed
    assert a.datetime == a.change_time == T0 + timedelta(hours=10)
    assert b.lastmod is None
    assert b.change_time == T0 + timedelta(hours=10, minutes=30, microseconds=250000)
    assert a.position == (a.change_time, "http://example.com/a")
    again = parse(serialize(parse(data)))
    assert [(e.lastmod, e.datetime) for e in again] == [
        (a.lastmod, a.datetime),
        (None, b.datetime),
        (c.lastmod, c.datetime),
    ]


def test_unknown_attributes_and_namespaced_extensions_round_trip() -> None:
    data = urlset(
        "changelist",
        'from="2013-01-03T00:00:00Z" xmlns:x="http://example.org/x" x:seq="7"',
        "<url><loc>http://example.com/a</loc><lastmod>2013-01-03T10:00:00Z</lastmod>"
        '<rs:md change="created" xmlns:x="http://example.org/x" x:seq="8"/>'
        '<rs:ln rel="duplicate" href="http://m/a" xmlns:y="http://example.org/y" y:z="1"/></url>',
    )
    document = parse(data)
    assert document.md_extra == {"{http://example.org/x}seq": "7"}
    (entry,) = document
    assert entry.md_extra == {"{http://example.org/x}seq": "8"}
    assert entry.links[0].extra == {"{http://example.org/y}z": "1"}
    assert parse(serialize(document)) == document


# --- serialization ----------------------------------------------------------------------


def test_serialize_writes_the_shape_of_the_specification_examples() -> None:
    document = parse(sample())
    text = serialize(document).decode("utf-8")
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<urlset ')
    assert f'xmlns="{SITEMAP_NS}"' in text and f'xmlns:rs="{RS_NS}"' in text
    assert '<rs:md capability="changelist" from="2013-01-03T00:00:00Z"/>' in text
    # Times in UTC with Z, whatever offset the input used.
    assert "<lastmod>2013-01-03T10:00:00Z</lastmod>" in text and "+01:00" not in text
    assert "rs:change" not in text and "rs:capability" not in text


def test_serialize_escapes_and_keeps_odd_characters() -> None:
    loc = "http://example.com/a b&c<d>'\"/é/😀/e\u0301"
    link = Link(rel="duplicate", href='http://m/?q=1&r="2"\t\n', type='text/plain; x="y"')
    document = make_document(
        Root.URLSET,
        "resourcelist",
        at=T0,
        entries=[Entry(loc=loc, hash="md5:aa", links=[link])],
    )
    again = parse(serialize(document))
    assert again.entries[0].loc == loc
    assert again.entries[0].links[0].type == link.type
    # href is stripped on reading (as loc is); everything else is kept exactly.
    assert again.entries[0].links[0].href == link.href.strip()


def test_serialize_refuses_characters_xml_cannot_carry() -> None:
    document = make_document(
        Root.URLSET, "resourcelist", at=T0, entries=[Entry(loc="http://example.com/\x01")]
    )
    with pytest.raises(ValueError, match="not allowed"):
        serialize(document)


def test_serialize_refuses_naive_datetimes() -> None:
    document = make_document(Root.URLSET, "resourcelist", at=datetime(2013, 1, 3))
    with pytest.raises(ValueError, match="naive"):
        serialize(document)


@pytest.mark.parametrize("batch", [1, 100, 1 << 16])
def test_write_streams_the_same_bytes_as_serialize(batch: int) -> None:
    document = parse(Path(__file__).parent / "data" / "spec" / "example-28-changelist.xml")
    out = io.BytesIO()
    write(document, out, batch=batch)
    assert out.getvalue() == serialize(document)


# --- streaming ----------------------------------------------------------------------------


def big_changelist(count: int, *, step: timedelta = timedelta(seconds=1)) -> bytes:
    """A Change List written directly (no serialize), one entry per line."""
    lines = [
        f"<url><loc>http://example.com/res/{i:06d}</loc>"
        f"<lastmod>{(T0 + i * step).strftime('%Y-%m-%dT%H:%M:%SZ')}</lastmod>"
        f'<rs:md change="{"created" if i % 3 == 0 else "updated"}" '
        f'hash="md5:{i:032x}" length="{i}"/></url>'
        for i in range(count)
    ]
    return changelist(*lines)


@pytest.fixture(scope="module")
def fifty_thousand() -> bytes:
    return big_changelist(50_000)


def test_reader_memory_stays_bounded_over_50000_entries(fifty_thousand: bytes) -> None:
    """Streaming 50,000 entries costs less than holding a tenth of them.

    (Holding all 50,000 would cost ten times the 5,000-entry list measured
    here; tracemalloc makes parsing seven times slower, so we spare that.)
    """
    tenth = big_changelist(5_000)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        count = 0
        last = None
        for entry in DocumentReader(fifty_thousand):
            count += 1
            last = entry
        _, streaming_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        document = parse(tenth)
        _, tenth_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 50_000 and len(document) == 5_000
    assert last is not None and last.loc == "http://example.com/res/049999"
    assert tenth_peak > 2_000_000  # 5,000 Entry objects with their strings and datetimes
    assert streaming_peak < 1_000_000
    assert streaming_peak * 2 < tenth_peak


class CountingStream(io.RawIOBase):
    """A binary stream that records how much of it has been read."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)
        self.consumed = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        chunk = self._data.read(size)
        self.consumed += len(chunk)
        return chunk


def test_entries_are_handed_out_before_the_document_is_read(fifty_thousand: bytes) -> None:
    stream = CountingStream(fifty_thousand)
    entries = iter_entries(stream, limits=Limits(chunk_size=4096))
    first = next(entries)
    assert first.loc == "http://example.com/res/000000"
    assert stream.consumed <= 2 * 4096 < len(fifty_thousand)
    assert sum(1 for _ in entries) == 49_999
    assert stream.consumed == len(fifty_thousand)


# --- resuming with iter_entries(after=...) -------------------------------------------------


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


RESUME = changelist(
    change("http://example.com/a", "2013-01-03T01:00:00Z"),
    change("http://example.com/b", "2013-01-03T02:00:00Z"),
    change("http://example.com/c", "2013-01-03T02:00:00Z"),
    change("http://example.com/d", "2013-01-03T02:00:00Z"),
    change("http://example.com/e", "2013-01-03T03:00:00Z"),
)


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (None, "abcde"),
        ((at(0), "http://example.com/z"), "abcde"),
        ((at(1), "http://example.com/a"), "bcde"),
        # Entries sharing the marker's time: only those after the marker itself.
        ((at(2), "http://example.com/b"), "cde"),
        ((at(2), "http://example.com/c"), "de"),
        ((at(2), "http://example.com/d"), "e"),
        # The marker's entry is gone: every entry at its time is replayed.
        ((at(2), "http://example.com/gone"), "bcde"),
        # A time between entries, and times at and after the end.
        ((at(2.5), "http://example.com/gone"), "e"),
        ((at(3), "http://example.com/e"), ""),
        ((at(3), "http://example.com/gone"), "e"),
        ((at(4), "http://example.com/z"), ""),
    ],
)
def test_iter_entries_resumes_after_a_position(
    after: tuple[datetime, str] | None, expected: str
) -> None:
    got = [e.loc.rsplit("/", 1)[1] for e in iter_entries(RESUME, after=after)]
    assert "".join(got) == expected


def test_iter_entries_resumes_on_resourcesync_1_1_datetimes() -> None:
    data = changelist(
        "<url><loc>http://example.com/a</loc>"
        '<rs:md change="created" datetime="2013-01-03T01:00:00Z"/></url>',
        "<url><loc>http://example.com/b</loc><lastmod>2013-01-01T00:00:00Z</lastmod>"
        '<rs:md change="updated" datetime="2013-01-03T02:00:00Z"/></url>',
    )
    assert [e.loc for e in iter_entries(data, after=(at(1), "http://example.com/a"))] == [
        "http://example.com/b"
    ]


def test_iter_entries_resumes_a_large_list_lazily(fifty_thousand: bytes) -> None:
    marker = (T0 + timedelta(seconds=49_990), "http://example.com/res/049990")
    rest = list(iter_entries(fifty_thousand, after=marker))
    assert [e.loc for e in rest] == [
        f"http://example.com/res/{i:06d}" for i in range(49_991, 50_000)
    ]


# --- split ----------------------------------------------------------------------------------


def change_entries(count: int, *, same_time_every: int = 1) -> list[Entry]:
    return [
        Entry(
            loc=f"http://example.com/res/{i}",
            lastmod=T0 + timedelta(seconds=i // same_time_every),
            change=ChangeType.UPDATED if i % 2 else ChangeType.CREATED,
        )
        for i in range(count)
    ]


def part_url(number: int) -> str:
    return f"http://example.com/changelist-part{number}.xml"


INDEX_URL = "http://example.com/changelist-index.xml"


def test_split_at_50000_gives_contiguous_parts_and_an_index() -> None:
    entries = change_entries(50_001)
    document = make_document(
        Root.URLSET,
        "changelist",
        from_=T0,
        links=[Link(rel="up", href=CAPLIST)],
        entries=entries,
    )
    index, parts = split(document, index_url=INDEX_URL, part_url=part_url)
    assert [len(p) for _, p in parts] == [50_000, 1]
    assert [url for url, _ in parts] == [part_url(1), part_url(2)]
    # The index: a Change List Index listing the parts with their intervals.
    assert isinstance(index, ChangeListIndex)
    assert index.root is Root.SITEMAPINDEX and index.from_ == T0 and index.up == CAPLIST
    assert [e.loc for e in index] == [url for url, _ in parts]
    assert [(e.from_, e.until) for e in index] == [(p.from_, p.until) for _, p in parts]
    assert [e.loc for e in index.open_lists] == [part_url(2)]
    # Contiguous intervals: each part ends where the next begins; only the last is open.
    assert parts[0][1].from_ == T0
    for (_, before), (_, after) in itertools.pairwise(parts):
        assert before.until == after.from_ == after.entries[0].change_time
        assert not before.is_open
    assert parts[-1][1].is_open
    for _, part in parts:
        assert isinstance(part, ChangeList)
        assert part.up == CAPLIST and part.index == INDEX_URL
        assert all(part.from_ <= e.change_time for e in part)
        assert part.until is None or all(e.change_time <= part.until for e in part)
    # Written and read back, the parts give every entry, in order.
    back = [e for _, part in parts for e in parse(serialize(part))]
    assert back == entries
    assert parse(serialize(index)) == index


def test_split_keeps_a_closed_list_closed() -> None:
    document = make_document(
        Root.URLSET, "changelist", from_=T0, until=T0 + timedelta(days=1), entries=change_entries(5)
    )
    index, parts = split(document, index_url=INDEX_URL, part_url=part_url, max_entries=2)
    assert [len(p) for _, p in parts] == [2, 2, 1]
    assert parts[-1][1].until == T0 + timedelta(days=1)
    assert index.until == T0 + timedelta(days=1)
    assert index.open_lists == []


def test_split_with_entries_sharing_the_boundary_time() -> None:
    """Two entries per second: a part may end at the time the next one starts."""
    entries = change_entries(7, same_time_every=2)
    document = make_document(Root.URLSET, "changelist", from_=T0, entries=entries)
    index, parts = split(document, index_url=INDEX_URL, part_url=part_url, max_entries=3)
    back = [e for _, part in parts for e in parse(serialize(part))]
    assert back == entries
    for _, part in parts:
        assert part.until is None or all(e.change_time <= part.until for e in part)
    # A Destination resuming from the boundary finds the list that holds it.
    boundary = parts[0][1].until
    assert parts[0][0] in [e.loc for e in index.lists_since(boundary)]


def test_split_of_a_resource_list_carries_the_snapshot_time() -> None:
    entries = [Entry(loc=f"http://example.com/{i}") for i in range(5)]
    completed = T0 + timedelta(minutes=1)
    document = make_document(
        Root.URLSET, "resourcelist", at=T0, completed=completed, entries=entries
    )
    index, parts = split(document, index_url=INDEX_URL, part_url=part_url, max_entries=2)
    assert isinstance(index, ResourceListIndex)
    assert index.at == T0 and index.completed == completed
    assert all(isinstance(p, ResourceList) and p.at == T0 for _, p in parts)
    assert all(e.at == T0 for e in index)
    assert [e for _, p in parts for e in p] == entries


def test_split_of_a_small_list_is_the_list_itself() -> None:
    document = make_document(Root.URLSET, "changelist", from_=T0, entries=change_entries(3))
    index, parts = split(document, index_url=INDEX_URL, part_url=part_url, max_entries=3)
    assert index is None
    assert parts == [(INDEX_URL, document)]


def test_split_refuses_an_index() -> None:
    index = make_document(Root.SITEMAPINDEX, "changelist", from_=T0)
    with pytest.raises(ValueError):
        split(index, index_url=INDEX_URL, part_url=part_url)
