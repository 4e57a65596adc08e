"""Every XML example of ANSI/NISO Z39.99-2014 read, checked and round-tripped.

Why one module of ~980 lines: about 570 of them are ``EXPECTED``, every example's document
transcribed in full, and the rest are the checks run against that table and the fixtures;
the table stays with the tests that read it, so an expectation and its check are reviewed
together.

The fixtures in ``tests/data/spec`` are extracted from the specification text
by ``tests/data/spec/extract.py``.  The expectations below were transcribed by
reading the specification (each example's markup and the prose around it),
not by printing what the parser returns: a parser bug must not be able to
write its own expected values.

Each expected document is spelled out in full with the model's dataclasses,
so a test also fails when the parser invents a value the example does not
carry.  Separate tests then check the claims the prose makes about each
example ("four changes: one creation, two updates, one deletion"...).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rsnotify import sitemap
from rsnotify.errors import DocumentError, MissingElement, WrongNamespace
from rsnotify.model import (
    CapabilityList,
    ChangeDump,
    ChangeDumpManifest,
    ChangeList,
    ChangeListIndex,
    ChangeType,
    Document,
    Entry,
    Link,
    ResourceDump,
    ResourceDumpManifest,
    ResourceList,
    ResourceListIndex,
    Root,
    SourceDescription,
)

SPEC = Path(__file__).parent / "data" / "spec"

CREATED, UPDATED, DELETED = ChangeType.CREATED, ChangeType.UPDATED, ChangeType.DELETED
U, IX = Root.URLSET, Root.SITEMAPINDEX

# Values that recur across the examples, copied from the specification text.
MD5_RES1 = "md5:1584abdf8ebdc9802ac0c6a7402c03b6"
MD5_RES2 = "md5:1e0d5cb8ef6ba40c99b14c0237be735e"
SHA256_RES2 = "sha-256:854f61290e2e197a11bc91063afce22e43f8ccc655237050ace766adc68dc784"
CAPLIST = "http://example.com/dataset1/capabilitylist.xml"
UP = Link(rel="up", href=CAPLIST)
PATCH = "http://www.openarchives.org/rs/terms/patch"
XML = "application/xml"


def t(day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    """All example datetimes fall in January 2013 and are written in UTC."""
    return datetime(2013, 1, day, hour, minute, second, tzinfo=UTC)


def ex(name: str) -> str:
    return f"http://example.com/{name}"


def doc(cls: type[Document], root: Root, capability: str, *entries: Entry, **kw) -> Document:
    return cls(root=root, capability=capability, entries=list(entries), **kw)


# --- the examples, as the specification writes them ---------------------------------

EXPECTED: dict[int, Document] = {
    # 1: a Resource List at 2013-01-03T09:00:00Z with the URIs of two resources.
    1: doc(
        ResourceList, U, "resourcelist", Entry(loc=ex("res1")), Entry(loc=ex("res2")), at=t(3, 9)
    ),
    # 2: the same list with <lastmod>, md5 hashes and a mirror link for res2.
    2: doc(
        ResourceList,
        U,
        "resourcelist",
        Entry(loc=ex("res1"), lastmod=t(2, 13), hash=MD5_RES1),
        Entry(
            loc=ex("res2"),
            lastmod=t(2, 14),
            hash=MD5_RES2,
            links=[Link(rel="duplicate", href="http://mirror.example.com/res2")],
        ),
        at=t(3, 9),
    ),
    # 3: a closed Change List (from/until) with one update and one deletion.
    3: doc(
        ChangeList,
        U,
        "changelist",
        Entry(loc=ex("res2.pdf"), lastmod=t(2, 13), change=UPDATED),
        Entry(loc=ex("res3.tiff"), lastmod=t(2, 18), change=DELETED),
        from_=t(2),
        until=t(3),
    ),
    # 4: a Resource Dump pointing at a single ZIP package.
    4: doc(
        ResourceDump,
        U,
        "resourcedump",
        Entry(loc=ex("resourcedump.zip"), lastmod=t(3, 9)),
        at=t(3, 9),
    ),
    # 5: the package's manifest: two bitstreams, with their paths in the ZIP.
    5: doc(
        ResourceDumpManifest,
        U,
        "resourcedump-manifest",
        Entry(loc=ex("res1"), lastmod=t(3, 3), hash=MD5_RES1, path="/resources/res1"),
        Entry(loc=ex("res2"), lastmod=t(3, 4), hash=MD5_RES2, path="/resources/res2"),
        at=t(3, 9),
    ),
    # 6: a Capability List: Resource List, Resource Dump and Change List.
    6: doc(
        CapabilityList,
        U,
        "capabilitylist",
        Entry(loc=ex("dataset1/resourcelist.xml"), capability="resourcelist"),
        Entry(loc=ex("dataset1/resourcedump.xml"), capability="resourcedump"),
        Entry(loc=ex("dataset1/changelist.xml"), capability="changelist"),
        links=[
            Link(rel="describedby", href=ex("info_about_set1_of_resources.xml")),
            Link(rel="up", href=ex("resourcesync_description.xml")),
        ],
    ),
    # 7: a Source Description with one Capability List.
    7: doc(
        SourceDescription,
        U,
        "description",
        Entry(
            loc=ex("dataset1/capabilitylist.xml"),
            capability="capabilitylist",
            links=[Link(rel="describedby", href=ex("info_about_set1_of_resources.xml"))],
        ),
        links=[Link(rel="describedby", href=ex("info-about-source.xml"))],
    ),
    # 8: a Resource List Index pointing at two Resource Lists.
    8: doc(
        ResourceListIndex,
        IX,
        "resourcelist",
        Entry(loc=ex("resourcelist-part1.xml")),
        Entry(loc=ex("resourcelist-part2.xml")),
        at=t(3, 9),
    ),
    # (9, 10 and 11 are an HTML link, an HTTP Link header and robots.txt.)
    # 12: a Source Description with three Capability Lists.
    12: doc(
        SourceDescription,
        U,
        "description",
        *(
            Entry(
                loc=ex(f"capabilitylist{n}.xml"),
                capability="capabilitylist",
                links=[Link(rel="describedby", href=ex(f"info_about_set{n}_of_resources.xml"))],
            )
            for n in (1, 2, 3)
        ),
        links=[Link(rel="describedby", href=ex("info_about_source.xml"))],
    ),
    # 13: a Capability List with four capabilities.
    13: doc(
        CapabilityList,
        U,
        "capabilitylist",
        Entry(loc=ex("dataset1/resourcelist.xml"), capability="resourcelist"),
        Entry(loc=ex("dataset1/resourcedump.xml"), capability="resourcedump"),
        Entry(loc=ex("dataset1/changelist.xml"), capability="changelist"),
        Entry(loc=ex("dataset1/changedump.xml"), capability="changedump"),
        links=[
            Link(rel="describedby", href=ex("info_about_set1_of_resources.xml")),
            Link(rel="up", href=ex("resourcesync_description.xml")),
        ],
    ),
    # 14: a Resource List with two resources, at/completed, hashes, lengths, types.
    14: doc(
        ResourceList,
        U,
        "resourcelist",
        Entry(loc=ex("res1"), lastmod=t(2, 13), hash=MD5_RES1, length=8876, type="text/html"),
        Entry(
            loc=ex("res2"),
            lastmod=t(2, 14),
            hash=f"{MD5_RES2} {SHA256_RES2}",
            length=14599,
            type="application/pdf",
        ),
        at=t(3, 9),
        completed=t(3, 9, 1),
        links=[UP],
    ),
    # 15: a Resource List Index of three lists, each with its own snapshot time.
    15: doc(
        ResourceListIndex,
        IX,
        "resourcelist",
        Entry(loc=ex("resourcelist1.xml"), at=t(3, 9)),
        Entry(loc=ex("resourcelist2.xml"), at=t(3, 9, 3)),
        Entry(loc=ex("resourcelist3.xml"), at=t(3, 9, 7)),
        at=t(3, 9),
        completed=t(3, 9, 10),
        links=[UP],
    ),
    # 16: a Resource List inside that index: an extra rel="index" link.
    16: doc(
        ResourceList,
        U,
        "resourcelist",
        Entry(
            loc=ex("res3"),
            lastmod=t(2, 13),
            hash="md5:1584abdf8ebdc9802ac0c6a7402c8753",
            length=4385,
            type="application/pdf",
        ),
        Entry(
            loc=ex("res4"),
            lastmod=t(2, 14),
            hash="md5:4556abdf8ebdc9802ac0c6a7402c9881",
            length=883,
            type="image/png",
        ),
        at=t(3, 9),
        links=[UP, Link(rel="index", href=ex("dataset1/resourcelist-index.xml"))],
    ),
    # 17: a Resource Dump of three ZIP files, each linking to its manifest.
    17: doc(
        ResourceDump,
        U,
        "resourcedump",
        *(
            Entry(
                loc=ex(f"resourcedump-part{n}.zip"),
                type="application/zip",
                length=length,
                at=at,
                completed=completed,
                links=[
                    Link(rel="contents", href=ex(f"resourcedump_manifest-part{n}.xml"), type=XML)
                ],
            )
            for n, length, at, completed in (
                (1, 4765, t(3, 9), t(3, 9, 2)),
                (2, 9875, t(3, 9, 1), t(3, 9, 3)),
                (3, 2298, t(3, 9, 3), t(3, 9, 4)),
            )
        ),
        at=t(3, 9),
        completed=t(3, 9, 4),
        links=[UP],
    ),
    # 18: a Resource Dump Manifest of two bitstreams.
    18: doc(
        ResourceDumpManifest,
        U,
        "resourcedump-manifest",
        Entry(
            loc=ex("res1"),
            lastmod=t(2, 13),
            hash=MD5_RES1,
            length=8876,
            type="text/html",
            path="/resources/res1",
        ),
        Entry(
            loc=ex("res2"),
            lastmod=t(2, 14),
            hash=f"{MD5_RES2} {SHA256_RES2}",
            length=14599,
            type="application/pdf",
            path="/resources/res2",
        ),
        at=t(3, 9),
        completed=t(3, 9, 2),
        links=[UP],
    ),
    # 19: an open Change List: four changes since 2013-01-03T00:00:00Z.
    19: doc(
        ChangeList,
        U,
        "changelist",
        Entry(loc=ex("res1.html"), lastmod=t(3, 11), change=CREATED),
        Entry(loc=ex("res2.pdf"), lastmod=t(3, 13), change=UPDATED),
        Entry(loc=ex("res3.tiff"), lastmod=t(3, 18), change=DELETED),
        Entry(loc=ex("res2.pdf"), lastmod=t(3, 21), change=UPDATED),
        from_=t(3),
        links=[UP],
    ),
    # 20: a Change List Index of three Change Lists, two closed and one open.
    20: doc(
        ChangeListIndex,
        IX,
        "changelist",
        Entry(loc=ex("20130101-changelist.xml"), from_=t(1), until=t(2)),
        Entry(loc=ex("20130102-changelist.xml"), from_=t(2), until=t(3)),
        Entry(loc=ex("20130103-changelist.xml"), from_=t(3)),
        from_=t(1),
        links=[UP],
    ),
    # 21: the closed list 20130102-changelist.xml of that index.
    21: doc(
        ChangeList,
        U,
        "changelist",
        Entry(loc=ex("res7.html"), lastmod=t(2, 12), change=CREATED),
        Entry(loc=ex("res9.pdf"), lastmod=t(2, 13), change=UPDATED),
        Entry(loc=ex("res5.tiff"), lastmod=t(2, 19), change=DELETED),
        Entry(loc=ex("res7.html"), lastmod=t(2, 20), change=UPDATED),
        from_=t(2),
        until=t(3),
        links=[UP, Link(rel="index", href=ex("dataset1/changelist.xml"))],
    ),
    # 22: an open Change Dump of three daily packages with manifest links.
    22: doc(
        ChangeDump,
        U,
        "changedump",
        *(
            Entry(
                loc=ex(f"2013010{day}-changedump.zip"),
                lastmod=t(day, 23, 59, 59),
                type="application/zip",
                length=length,
                from_=t(day),
                until=t(day + 1),
                links=[
                    Link(rel="contents", href=ex(f"2013010{day}-changedump-manifest.xml"), type=XML)
                ],
            )
            for day, length in ((1, 3109), (2, 6629), (3, 8124))
        ),
        from_=t(1),
        links=[UP],
    ),
    # 23: the manifest of the second Change Dump package (same changes as 21).
    23: doc(
        ChangeDumpManifest,
        U,
        "changedump-manifest",
        Entry(
            loc=ex("res7.html"),
            lastmod=t(2, 12),
            change=CREATED,
            hash="md5:1c1b0e264fa9b7e1e9aa6f9db8d6362b",
            length=4339,
            type="text/html",
            path="/changes/res7.html",
        ),
        Entry(
            loc=ex("res9.pdf"),
            lastmod=t(2, 13),
            change=UPDATED,
            hash="md5:f906610c3d4aa745cb2b986f25b37c5a",
            length=38297,
            type="application/pdf",
            path="/changes/res9.pdf",
        ),
        Entry(loc=ex("res5.tiff"), lastmod=t(2, 19), change=DELETED),
        Entry(
            loc=ex("res7.html"),
            lastmod=t(2, 20),
            change=UPDATED,
            hash="md5:0988647082c8bc51778894a48ec3b576",
            length=5426,
            type="text/html",
            path="/changes/res7-v2.html",
        ),
        from_=t(2),
        until=t(3),
        links=[UP],
    ),
    # 24: three prioritised mirrors, the last one not over HTTP.
    24: doc(
        ChangeList,
        U,
        "changelist",
        Entry(
            loc=ex("res1"),
            lastmod=t(3, 18),
            change=UPDATED,
            hash=MD5_RES1,
            length=8876,
            type="text/html",
            links=[
                Link(rel="duplicate", pri=pri, href=href, modified=t(3, 18))
                for pri, href in (
                    (1, "http://mirror1.example.com/res1"),
                    (2, "http://mirror2.example.com/res1"),
                    (3, "gsiftp://gridftp.example.com/res1"),
                )
            ],
        ),
        from_=t(3),
        links=[UP],
    ),
    # 25: a generic URI with two alternate representations.
    25: doc(
        ChangeList,
        U,
        "changelist",
        Entry(
            loc=ex("res1"),
            lastmod=t(3, 18),
            change=UPDATED,
            links=[
                Link(rel="alternate", href=ex("res1.html"), modified=t(3, 18), type="text/html"),
                Link(
                    rel="alternate", href=ex("res1.pdf"), modified=t(3, 18), type="application/pdf"
                ),
            ],
        ),
        from_=t(3, 11),
        links=[UP],
    ),
    # 26: a specific URI with a canonical link to the generic one.
    26: doc(
        ChangeList,
        U,
        "changelist",
        Entry(
            loc=ex("res1.html"),
            lastmod=t(3, 18),
            change=UPDATED,
            hash=MD5_RES1,
            length=8876,
            links=[Link(rel="canonical", href=ex("res1"), modified=t(3, 18))],
        ),
        from_=t(3),
        links=[UP],
    ),
    # 27: patches: a JSON Patch and an experimental TIFF diff (a 9.8 GB resource).
    27: doc(
        ChangeList,
        U,
        "changelist",
        Entry(
            loc=ex("res4"),
            lastmod=t(3, 17),
            change=UPDATED,
            hash="sha-256:f4OxZX_x_DFGFDgghgdfb6rtSx-iosjf6735432nklj",
            length=56778,
            type="application/json",
            links=[
                Link(
                    rel=PATCH,
                    href=ex("res4-json-patch"),
                    modified=t(3, 17),
                    hash="sha-256:y66dER_t_HWEIKpesdkeb7rtSc-ippjf9823742opld",
                    length=73,
                    type="application/json-patch",
                )
            ],
        ),
        Entry(
            loc=ex("res5-full.tiff"),
            lastmod=t(3, 18),
            change=UPDATED,
            hash="sha-256:f4OxZX_x_FO5LcGBSKHWXfwtSx-j1ncoSt3SABJtkGk",
            length=9788456778,
            type="image/tiff",
            links=[
                Link(
                    rel=PATCH,
                    href=ex("res5-diff"),
                    modified=t(3, 18),
                    hash="sha-256:h986gT_t_87HTkjHYE76G558hY-jdfgy76t55sadJUYT",
                    length=4533,
                    type="application/x-tiff-diff",
                )
            ],
        ),
        from_=t(3),
        links=[UP],
    ),
    # 28: a resource and its metadata record, linked both ways, with a profile.
    28: doc(
        ChangeList,
        U,
        "changelist",
        Entry(
            loc=ex("res2.pdf"),
            lastmod=t(3, 18),
            change=UPDATED,
            hash=MD5_RES1,
            length=8876,
            type="application/pdf",
            links=[
                Link(
                    rel="describedby",
                    href=ex("res2_dublin-core_metadata.xml"),
                    modified=t(1, 12),
                    type=XML,
                )
            ],
        ),
        Entry(
            loc=ex("res2_dublin-core_metadata.xml"),
            lastmod=t(3, 19),
            change=UPDATED,
            type=XML,
            links=[
                Link(
                    rel="describes",
                    href=ex("res2.pdf"),
                    modified=t(3, 18),
                    hash=MD5_RES1,
                    length=8876,
                    type="application/pdf",
                ),
                Link(rel="profile", href="http://purl.org/dc/elements/1.1/"),
            ],
        ),
        from_=t(3),
        links=[UP],
    ),
    # 29: memento, timegate and timemap links.
    29: doc(
        ChangeList,
        U,
        "changelist",
        Entry(
            loc=ex("res1"),
            lastmod=t(3, 18),
            change=UPDATED,
            hash=MD5_RES1,
            length=8876,
            type="text/html",
            links=[
                Link(
                    rel="memento",
                    href=ex("20130103070000/res1"),
                    modified=t(2, 18),
                    hash=MD5_RES1,
                    length=8876,
                    type="text/html",
                ),
                Link(rel="timegate", href=ex("timegate/http://example.com/res1")),
                Link(
                    rel="timemap",
                    href=ex("timemap/http://example.com/res1"),
                    type="application/link-format",
                ),
            ],
        ),
        from_=t(3),
        links=[UP],
    ),
    # 30: membership of an OAI-ORE Aggregation.
    30: doc(
        ChangeList,
        U,
        "changelist",
        Entry(
            loc=ex("res1"),
            lastmod=t(3, 7),
            change=UPDATED,
            hash=MD5_RES1,
            length=8876,
            type="text/html",
            links=[Link(rel="collection", href=ex("aggregation/0601007"))],
        ),
        from_=t(3),
        links=[UP],
    ),
    # 31: the original Source's change to one resource.
    31: doc(
        ChangeList,
        U,
        "changelist",
        Entry(
            loc="http://original.example.com/res1.html",
            lastmod=t(3, 7),
            change=UPDATED,
            hash=MD5_RES1,
            length=8876,
            type="text/html",
        ),
        from_=t(3),
        links=[UP],
    ),
    # 32: a primary aggregator republishing it with a via link.
    32: doc(
        ChangeList,
        U,
        "changelist",
        Entry(
            loc="http://aggregator1.example.com/res1.html",
            lastmod=t(3, 20),
            change=UPDATED,
            hash=MD5_RES1,
            length=8876,
            type="text/html",
            links=[
                Link(
                    rel="via",
                    href="http://original.example.com/res1.html",
                    modified=t(3, 7),
                    hash=MD5_RES1,
                    length=8876,
                    type="text/html",
                )
            ],
        ),
        from_=t(3, 11),
        links=[Link(rel="up", href="http://aggregator1.example.com/dataset1/capabilitylist.xml")],
    ),
    # 33: a secondary aggregator keeping the primary's via link.
    33: doc(
        ChangeList,
        U,
        "changelist",
        Entry(
            loc="http://aggregator2.example.com/res1.html",
            lastmod=t(4, 9),
            change=UPDATED,
            hash=MD5_RES1,
            length=8876,
            type="text/html",
            links=[
                Link(
                    rel="via",
                    href="http://original.example.com/res1.html",
                    modified=t(3, 7),
                    hash=MD5_RES1,
                    length=8876,
                    type="text/html",
                )
            ],
        ),
        from_=t(3, 12),
        links=[Link(rel="up", href="http://aggregator2.example.com/dataset1/capabilitylist.xml")],
    ),
}


def path_of(number: int) -> Path:
    (found,) = SPEC.glob(f"example-{number:02d}-*.xml")
    return found


def read(number: int) -> Document:
    return sitemap.parse(path_of(number))


EXAMPLES = sorted(EXPECTED)


def test_every_xml_example_of_the_specification_is_covered() -> None:
    """33 examples, of which 9-11 are not XML: 30 fixtures, all with expectations."""
    files = sorted(SPEC.glob("example-*.xml"))
    assert [int(f.name.split("-")[1]) for f in files] == EXAMPLES
    assert len(EXAMPLES) == 30
    assert not set(EXAMPLES) & {9, 10, 11}


def test_fixture_names_say_what_kind_of_document_each_example_is() -> None:
    suffix = {
        19: "changelist",
        20: "changelist-index",
        8: "resourcelist-index",
        12: "description",
        23: "changedump-manifest",
    }
    for number, kind in suffix.items():
        assert path_of(number).name == f"example-{number:02d}-{kind}.xml"


@pytest.mark.parametrize("number", EXAMPLES)
def test_example_parses_to_what_the_specification_describes(number: int) -> None:
    expected = EXPECTED[number]
    document = read(number)
    assert type(document) is type(expected)
    assert document.root is expected.root
    assert document.capability == expected.capability
    assert len(document) == len(expected)
    assert [e.loc for e in document] == [e.loc for e in expected]
    assert document == expected


@pytest.mark.parametrize("number", EXAMPLES)
def test_example_round_trips_through_serialize(number: int) -> None:
    document = read(number)
    data = sitemap.serialize(document)
    again = sitemap.parse(data)
    assert again == document
    assert type(again) is type(document)
    # A second pass is byte-stable: serialization is canonical.
    assert sitemap.serialize(again) == data


@pytest.mark.parametrize("number", EXAMPLES)
def test_example_streams_the_same_entries_as_parse(number: int) -> None:
    reader = sitemap.DocumentReader(path_of(number))
    header = reader.header
    entries = list(reader)
    expected = EXPECTED[number]
    assert header.entries == []
    assert header.links == expected.links
    assert entries == expected.entries
    assert reader.warnings == []


# --- the two Table 2 templates -----------------------------------------------------
# Table 2 shows the skeleton of a <urlset> and a <sitemapindex> document, with empty
# <rs:md/>, <rs:ln/>, <loc/> and "..." placeholders (the index even uses "..." as
# namespace names).  They are not documents: a reader must refuse them, not guess.


def test_table2_urlset_template_is_refused() -> None:
    """Its ``<rs:ln />`` has neither rel nor href, and ``<rs:md />`` no capability.

    Both are well-formed XML, so the refusal is :class:`MissingElement` (an
    InvalidDocument), not MalformedXML.
    """
    with pytest.raises(MissingElement) as caught:
        sitemap.parse(SPEC / "table2-template-urlset.xml")
    assert caught.value.line == 1
    assert caught.value.element in ("rs:ln", "rs:md")


def test_table2_sitemapindex_template_is_refused() -> None:
    """``xmlns="..."`` puts <sitemapindex> outside the Sitemap namespace."""
    with pytest.raises(WrongNamespace) as caught:
        sitemap.parse(SPEC / "table2-template-sitemapindex.xml")
    assert caught.value.line == 1
    assert caught.value.element == "sitemapindex"


@pytest.mark.parametrize("name", ["table2-template-urlset.xml", "table2-template-sitemapindex.xml"])
def test_table2_templates_are_refused_by_the_streaming_reader_too(name: str) -> None:
    with pytest.raises(DocumentError):
        list(sitemap.iter_entries(SPEC / name))


# --- what the prose around each example says ----------------------------------------


def test_example_1_resource_list_conveys_uris_and_snapshot_time() -> None:
    document = read(1)
    assert isinstance(document, ResourceList)
    assert document.at == t(3, 9)
    assert [e.loc for e in document] == [ex("res1"), ex("res2")]


def test_example_2_lastmod_hash_and_mirror_link() -> None:
    res1, res2 = read(2)
    assert res1.hashes() == {"md5": "1584abdf8ebdc9802ac0c6a7402c03b6"}
    assert res2.link("duplicate") == Link(rel="duplicate", href="http://mirror.example.com/res2")
    assert res1.link("duplicate") is None


def test_example_3_two_changes_in_a_closed_interval() -> None:
    document = read(3)
    assert isinstance(document, ChangeList)
    assert not document.is_open
    assert (document.from_, document.until) == (t(2), t(3))
    assert [e.change for e in document] == [UPDATED, DELETED]
    assert all(document.from_ <= e.change_time <= document.until for e in document)


def test_examples_4_and_5_dump_and_its_manifest() -> None:
    dump, manifest = read(4), read(5)
    assert isinstance(dump, ResourceDump)
    assert [e.loc for e in dump] == [ex("resourcedump.zip")]
    assert isinstance(manifest, ResourceDumpManifest)
    # path is the place in the ZIP, loc the URI at the Source.
    assert {e.loc: e.path for e in manifest} == {
        ex("res1"): "/resources/res1",
        ex("res2"): "/resources/res2",
    }


@pytest.mark.parametrize("number", [6, 13])
def test_capability_lists_map_capabilities_to_uris(number: int) -> None:
    document = read(number)
    assert isinstance(document, CapabilityList)
    expected = {
        "resourcelist": ex("dataset1/resourcelist.xml"),
        "resourcedump": ex("dataset1/resourcedump.xml"),
        "changelist": ex("dataset1/changelist.xml"),
    }
    if number == 13:
        expected["changedump"] = ex("dataset1/changedump.xml")
    assert document.capabilities == expected
    assert document.capability_url("changelist") == ex("dataset1/changelist.xml")
    assert document.up == ex("resourcesync_description.xml")
    assert document.link("describedby").href == ex("info_about_set1_of_resources.xml")
    assert document.hubs == []


@pytest.mark.parametrize(("number", "count"), [(7, 1), (12, 3)])
def test_source_descriptions_enumerate_capability_lists(number: int, count: int) -> None:
    document = read(number)
    assert isinstance(document, SourceDescription)
    assert len(document.capability_lists) == count
    assert all(e.link("describedby") is not None for e in document)


def test_example_8_and_15_resource_list_indexes() -> None:
    index8, index15 = read(8), read(15)
    assert isinstance(index8, ResourceListIndex) and index8.is_index
    assert len(index8) == 2
    assert isinstance(index15, ResourceListIndex)
    assert [e.at for e in index15] == [t(3, 9), t(3, 9, 3), t(3, 9, 7)]
    assert (index15.at, index15.completed) == (t(3, 9), t(3, 9, 10))


def test_example_14_resources_unchanged_between_lastmod_and_at() -> None:
    document = read(14)
    assert [e.lastmod for e in document] == [t(2, 13), t(2, 14)]
    assert all(e.lastmod < document.at for e in document)
    assert document.entries[1].hashes() == {
        "md5": "1e0d5cb8ef6ba40c99b14c0237be735e",
        "sha-256": "854f61290e2e197a11bc91063afce22e43f8ccc655237050ace766adc68dc784",
    }


def test_example_16_links_to_its_index() -> None:
    document = read(16)
    assert document.index == ex("dataset1/resourcelist-index.xml")
    assert document.up == CAPLIST


def test_example_17_dump_packages_point_at_their_manifests() -> None:
    document = read(17)
    assert [e.link("contents").href for e in document] == [
        ex(f"resourcedump_manifest-part{n}.xml") for n in (1, 2, 3)
    ]
    assert [e.length for e in document] == [4765, 9875, 2298]


def test_example_19_four_changes_since_jan_3() -> None:
    """One creation, two updates (res2.pdf twice), one deletion; open list."""
    document = read(19)
    assert isinstance(document, ChangeList)
    assert document.is_open and document.from_ == t(3)
    assert len(document) == 4
    assert Counter(e.change for e in document) == {CREATED: 1, UPDATED: 2, DELETED: 1}
    assert [e.loc for e in document if e.change is UPDATED] == [ex("res2.pdf")] * 2
    times = [e.change_time for e in document]
    assert times == sorted(times) and all(when >= document.from_ for when in times)
    assert document.up == CAPLIST


def test_example_20_index_of_three_change_lists_two_closed() -> None:
    """Three Change Lists, two closed and one open.

    The prose says the closed ones are "indicated by the provision of
    <lastmod>" with a value of 2013-01-02T23:59:59Z, but the markup of
    Examples 20 and 21 carries ``until`` instead (and no <lastmod>): the
    2014 text kept prose from a draft.  We test the markup, which is what
    a Destination receives, and what section 12.2 says an index entry has.
    """
    document = read(20)
    assert isinstance(document, ChangeListIndex)
    assert len(document) == 3
    assert [e.loc for e in document.open_lists] == [ex("20130103-changelist.xml")]
    closed = [e for e in document if e.until is not None]
    assert len(closed) == 2
    assert all(e.lastmod is None for e in document)
    # Contiguous intervals in forward chronological order.
    for before, after in zip(document.entries, document.entries[1:], strict=False):
        assert before.until == after.from_
    assert [e.loc for e in document.lists_since(t(2, 12))] == [
        ex("20130102-changelist.xml"),
        ex("20130103-changelist.xml"),
    ]


def test_example_21_is_the_closed_list_named_in_example_20() -> None:
    index, closed = read(20), read(21)
    listed = next(e for e in index if e.loc == ex("20130102-changelist.xml"))
    assert (closed.from_, closed.until) == (listed.from_, listed.until)
    assert not closed.is_open
    assert closed.index == ex("dataset1/changelist.xml")
    assert Counter(e.change for e in closed) == {CREATED: 1, UPDATED: 2, DELETED: 1}


def test_example_22_open_change_dump() -> None:
    document = read(22)
    assert isinstance(document, ChangeDump)
    assert document.until is None
    assert [e.link("contents").href for e in document][1] == ex("20130102-changedump-manifest.xml")


def test_example_23_manifest_covers_the_changes_of_example_21() -> None:
    manifest, changes = read(23), read(21)
    assert isinstance(manifest, ChangeDumpManifest)
    # It is the manifest of the second package of Example 22, and covers its interval.
    package = read(22).entries[1]
    assert (manifest.from_, manifest.until) == (package.from_, package.until)
    assert package.link("contents").href == ex("20130102-changedump-manifest.xml")
    assert [(e.loc, e.change, e.change_time) for e in manifest] == [
        (e.loc, e.change, e.change_time) for e in changes
    ]
    # res7.html is listed twice, with two bitstreams at different paths.
    paths = [e.path for e in manifest if e.loc == ex("res7.html")]
    assert paths == ["/changes/res7.html", "/changes/res7-v2.html"]
    # Except for deletions, every entry has a path.
    assert all((e.path is None) == (e.change is DELETED) for e in manifest)


def test_example_24_mirrors_by_priority() -> None:
    (entry,) = read(24)
    mirrors = [ln for ln in entry.links if ln.rel == "duplicate"]
    assert [ln.pri for ln in mirrors] == [1, 2, 3]
    assert entry.link("duplicate").href == "http://mirror1.example.com/res1"
    assert mirrors[-1].href.startswith("gsiftp://")
    # The rs:md attributes apply to the mirrors and are not repeated on them.
    assert all(ln.hash is None and ln.length is None for ln in mirrors)


def test_example_25_and_26_alternate_and_canonical() -> None:
    (generic,) = read(25)
    assert {ln.type: ln.href for ln in generic.links if ln.rel == "alternate"} == {
        "text/html": ex("res1.html"),
        "application/pdf": ex("res1.pdf"),
    }
    (specific,) = read(26)
    assert specific.link("canonical").href == generic.loc


def test_example_27_patch_links_and_large_length() -> None:
    json_entry, tiff_entry = read(27)
    assert json_entry.link(PATCH).type == "application/json-patch"
    assert tiff_entry.link(PATCH).type == "application/x-tiff-diff"
    assert tiff_entry.length == 9788456778  # more than 2**32
    # These digests are not hex: the raw attribute is kept exactly.
    assert json_entry.hash == "sha-256:f4OxZX_x_DFGFDgghgdfb6rtSx-iosjf6735432nklj"


def test_example_28_resource_and_metadata_link_each_other() -> None:
    resource, metadata = read(28)
    assert resource.link("describedby").href == metadata.loc
    assert metadata.link("describes").href == resource.loc
    assert metadata.link("profile").href == "http://purl.org/dc/elements/1.1/"


def test_example_29_memento_link_repeats_the_fixity_of_rs_md() -> None:
    (entry,) = read(29)
    memento = entry.link("memento")
    assert (memento.hash, memento.length, memento.type) == (entry.hash, entry.length, entry.type)
    assert memento.modified == t(2, 18)
    assert entry.link("timegate") is not None and entry.link("timemap") is not None


def test_example_30_collection_membership() -> None:
    (entry,) = read(30)
    assert entry.link("collection").href == ex("aggregation/0601007")


def test_examples_31_to_33_via_links_carry_the_original_source_data() -> None:
    (original,) = read(31)
    (primary,) = read(32)
    (secondary,) = read(33)
    via = primary.link("via")
    assert via.href == original.loc
    assert (via.modified, via.hash, via.length, via.type) == (
        original.lastmod,
        original.hash,
        original.length,
        original.type,
    )
    # The secondary aggregator keeps the primary's via link unchanged.
    assert secondary.link("via") == via
    # Aggregators' own times may be later than the original change.
    assert read(32).from_ > original.lastmod
