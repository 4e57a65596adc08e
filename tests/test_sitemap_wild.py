"""The reader against what Sources in the wild write (issue 17, item 5).

Strict where it protects: a second ``<loc>``, ``<lastmod>``, ``<changefreq>`` or
``rs:md`` in one entry is refused where it stands, and an ``rs:md`` after the first
entry is named as such.  Lenient where it helps, by name: ``timezone``,
``plain-sitemap`` and ``order`` (:class:`~rsnotify.sitemap.Lenient`), each reported
once per document.  Every refusal names the rule it enforces.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rsnotify.errors import DocumentError, InvalidDatetime, InvalidDocument, MissingElement
from rsnotify.model import RS_NS, SITEMAP_NS
from rsnotify.sitemap import DocumentReader, Lenient, Limits, parse, parse_lenient

from .test_sitemap import body_line, change, changelist, urlset

T = "2013-01-03T10:00:00Z"


def read(data: bytes, *rules: Lenient) -> tuple[list, list[str], DocumentReader]:
    reader = DocumentReader(data, limits=Limits(lenient=frozenset(rules)))
    entries = list(reader)
    return entries, reader.warnings, reader


@pytest.mark.parametrize(
    ("inner", "element"),
    [
        ("<loc>http://example.com/a</loc><loc>http://example.com/b</loc>", "loc"),
        (f"<loc>http://example.com/a</loc><lastmod>{T}</lastmod><lastmod>{T}</lastmod>", "lastmod"),
        (
            "<loc>http://example.com/a</loc><changefreq>daily</changefreq>"
            "<changefreq>daily</changefreq>",
            "changefreq",
        ),
        ('<loc>http://example.com/a</loc><rs:md length="1"/><rs:md length="2"/>', "rs:md"),
    ],
)
def test_a_repeated_element_in_one_entry_is_refused_where_it_stands(
    inner: str, element: str
) -> None:
    """Keeping the last <loc> would mirror the wrong resource (the old behaviour)."""
    data = urlset("resourcelist", f'at="{T}"', "<url><loc>http://example.com/ok</loc></url>",
                  f"<url>{inner}</url>")  # fmt: skip
    with pytest.raises(InvalidDocument) as caught:
        parse(data)
    assert caught.value.line == body_line(2)
    assert caught.value.element == element
    assert "second" in str(caught.value) and caught.value.rule == "Z39.99 section 7"


def test_rs_md_after_the_first_entry_has_its_own_message_even_far_down() -> None:
    """Not "is the namespace declared?": it is, and the rs:md is there, too late."""
    entries = [f"<url><loc>http://example.com/{i}</loc></url>" for i in range(3000)]
    data = (
        f'<urlset xmlns="{SITEMAP_NS}" xmlns:rs="{RS_NS}">'
        + "".join(entries[:1500])
        + '<rs:md capability="resourcelist"/>'
        + "".join(entries[1500:])
        + "</urlset>"
    ).encode()
    assert len(data) > 2 * Limits().chunk_size  # the rs:md is several chunks past the first url
    with pytest.raises(InvalidDocument) as caught:
        DocumentReader(data).header  # noqa: B018
    message = str(caught.value)
    assert "comes after the first <url>" in message, message
    assert "declared" not in message
    assert caught.value.rule == "Z39.99 section 7"
    # Read as a plain Sitemap, the late rs:md is still refused, with the same words.
    with pytest.raises(InvalidDocument, match="comes after the first <url>"):
        read(data, Lenient.PLAIN_SITEMAP)


@pytest.mark.parametrize(
    ("namespaces", "says"),
    [
        (f'xmlns="{SITEMAP_NS}"', "the ResourceSync namespace"),
        (f'xmlns="{SITEMAP_NS}" xmlns:rs="{RS_NS}"', "no document-level rs:md"),
    ],
)
def test_a_missing_rs_md_says_whether_the_namespace_is_declared(namespaces: str, says: str) -> None:
    data = f"<urlset {namespaces}><url><loc>http://example.com/a</loc></url></urlset>".encode()
    with pytest.raises(MissingElement) as caught:
        parse(data)
    assert says in str(caught.value) and "--lenient plain-sitemap" in str(caught.value)
    entries, warnings, reader = read(data, Lenient.PLAIN_SITEMAP)
    assert reader.header.capability == "resourcelist" and len(entries) == 1
    assert len(warnings) == 1 and "plain Sitemap" in warnings[0]


def test_a_change_list_without_its_header_is_never_read_as_a_resource_list() -> None:
    """Reading it as a snapshot would mirror a deleted resource."""
    data = (
        f'<urlset xmlns="{SITEMAP_NS}" xmlns:rs="{RS_NS}">'
        f'<url><loc>http://example.com/a</loc><lastmod>{T}</lastmod><rs:md change="deleted"/>'
        "</url></urlset>"
    ).encode()
    with pytest.raises(MissingElement) as caught:
        read(data, *Lenient)
    assert "Change List without its header" in str(caught.value)
    assert caught.value.rule == "Z39.99 section 12.1"


def test_unknown_capabilities_are_read_with_one_warning_and_extension_ones_quietly() -> None:
    entries, warnings, _ = read(urlset("notyetdefined", ""))
    assert entries == [] and len(warnings) == 1 and "'notyetdefined'" in warnings[0]
    for known in ("resourcelist-archive", "changelist-archive", "change-notification"):
        assert read(urlset(known, ""))[1] == []
    caplist = urlset(
        "capabilitylist",
        "",
        *(f'<url><loc>http://example.com/{c}</loc><rs:md capability="{c}"/></url>'
          for c in ("resourcelist", "odd-one", "odd-one", "resourcedump-archive")),
    )  # fmt: skip
    entries, warnings, _ = read(caplist)
    assert len(entries) == 4
    assert len(warnings) == 1 and "'odd-one'" in warnings[0], warnings


def test_loc_whitespace_is_collapsed_as_anyuri_says() -> None:
    data = urlset("resourcelist", f'at="{T}"', "<url><loc>\n\t http://example.com/a \n</loc></url>")
    assert [e.loc for e in parse(data)] == ["http://example.com/a"]


@pytest.mark.parametrize(
    "naive", ["2013-01-03T10:00:00", "2013-01-03 10:00:00", "2013-01-03T10:00"]
)
def test_a_time_without_a_zone_is_refused_naming_the_rule_or_read_as_utc(naive: str) -> None:
    data = changelist(
        *(change(f"http://example.com/{i}", naive) for i in range(5)),
        md=f'from="{naive}"',
    )
    with pytest.raises(InvalidDatetime) as caught:
        parse(data)
    assert "--lenient timezone" in str(caught.value) and "W3C Datetime" in str(caught.value)
    entries, warnings, reader = read(data, Lenient.TIMEZONE)
    assert reader.header.from_ == datetime(2013, 1, 3, 10, tzinfo=UTC)
    assert [e.lastmod for e in entries] == [datetime(2013, 1, 3, 10, tzinfo=UTC)] * 5
    assert len(warnings) == 1 and "read as UTC" in warnings[0]


def test_the_timezone_rule_reads_no_other_malformed_time() -> None:
    with pytest.raises(InvalidDatetime):
        read(changelist(change("http://example.com/a", "2013-13-45T10:00:00")), Lenient.TIMEZONE)
    with pytest.raises(InvalidDatetime):
        read(changelist(change("http://example.com/a", "yesterday")), Lenient.TIMEZONE)


def test_out_of_order_entries_give_one_warning_and_a_count() -> None:
    data = changelist(
        change("http://example.com/late", "2013-01-03T12:00:00Z"),
        *(change(f"http://example.com/{i}", f"2013-01-03T10:00:0{i}Z") for i in range(5)),
    )
    entries, warnings, reader = read(data, Lenient.ORDER)
    assert len(entries) == 6
    assert reader.unordered == 5
    assert len(warnings) == 1 and "Z39.99 section 12.1" in warnings[0]
    assert "(line 6" not in warnings[0] and f"line {body_line(2)}" in warnings[0]


def test_parse_lenient_names_rules_and_refuses_unknown_ones() -> None:
    assert parse_lenient("order") == {Lenient.ORDER}
    assert parse_lenient("timezone, order") == {Lenient.TIMEZONE, Lenient.ORDER}
    assert parse_lenient(["order", "plain-sitemap"]) == {Lenient.ORDER, Lenient.PLAIN_SITEMAP}
    assert parse_lenient("all") == set(Lenient)
    assert parse_lenient("none") == parse_lenient("") == frozenset()
    with pytest.raises(ValueError, match="known: timezone, plain-sitemap, order"):
        parse_lenient("ordre")


@pytest.mark.parametrize(
    "data",
    [
        b"not xml",
        b"<urlset/>",
        f'<urlset xmlns="{SITEMAP_NS}"/>'.encode(),
        urlset("changelist", "", "<url><loc>http://example.com/a</loc></url>"),
        urlset("changelist", "", change("http://example.com/a", None)),
        urlset("resourcelist", "", "<url><loc> </loc></url>"),
        urlset("resourcelist", "", "<url><loc>x</loc><changefreq>often</changefreq></url>"),
        urlset("resourcelist", "", '<url><loc>x</loc><rs:md length="-1"/></url>'),
        urlset("resourcelist", "", '<url><loc>x</loc><rs:ln rel="a" href="b" pri="0"/></url>'),
        urlset("resourcelist", 'at="2013"', "<url><loc>x</loc><lastmod>soon</lastmod></url>"),
        urlset("resourcelist", "", '<url><loc>x</loc><rs:md change="moved"/></url>'),
        changelist(change("a", "2013-01-03T12:00:00Z"), change("b", "2013-01-03T10:00:00Z")),
        b'<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY a "b">]><urlset/>',
        b'<?xml version="1.0" encoding="ISO-8859-1"?><urlset/>',
    ],
)
def test_every_refusal_names_the_rule_it_enforces(data: bytes) -> None:
    with pytest.raises(DocumentError) as caught:
        parse(data)
    assert caught.value.rule, str(caught.value)
    assert str(caught.value).endswith(f"[{caught.value.rule}]")
