"""Interoperability with ``resync`` 2.0.1, the reference ResourceSync library.

Documents rsnotify writes must be read by ``resync`` with the same entries, and
documents ``resync`` writes must be read by rsnotify with the same entries: URI,
change, change time (``<lastmod>`` in ResourceSync 1.0, ``rs:md datetime`` in
1.1), hashes (md5, sha-256), length, type and links.

Where ``resync`` is limited the test says so and checks rsnotify against the
specification instead.  Quirks found in resync 2.0.1:

* It cannot read a Change List Index: ``ChangeList.parse`` raises
  ``SitemapIndexError``, and its generic ``Sitemap.parse_xml`` reads the index
  entries but drops their ``rs:md from``/``until``.  More generally it ignores
  ``at``/``completed``/``from``/``until`` on every entry (Resource Dump
  packages, Resource List Index entries...).
* It writes a split Change List's index and parts without ``from``, although
  section 12 makes ``from`` mandatory on both.
* It writes ResourceSync 1.1 Change Lists with ``rs:md datetime`` and no
  ``<lastmod>`` unless ``add_lastmod=True``: a 1.0 reader finds no change time.
  Its 1.0 writer puts a resource's Last-Modified time, when it has one, in
  ``<lastmod>`` instead of the change time, which can break forward
  chronological order.  It reads both forms.
* It keeps Resource List entries in a dict keyed by URI and writes them sorted
  by URI, not in the order they were added.
* It knows only md5, sha-1 and sha-256 hashes, and drops ``encoding``.
* Times are float seconds: exact to the microsecond only for present-day dates.
"""

from __future__ import annotations

import base64
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from resync import CapabilityList as ResyncCapabilityList
from resync import ChangeList as ResyncChangeList
from resync import Resource
from resync import ResourceList as ResyncResourceList
from resync import SourceDescription as ResyncSourceDescription
from resync.sitemap import Sitemap, SitemapIndexError

from rsnotify import sitemap, w3cdt
from rsnotify.errors import OutOfOrder
from rsnotify.model import (
    CapabilityList,
    ChangeList,
    ChangeListIndex,
    ChangeType,
    Document,
    Entry,
    Link,
    ResourceList,
    Root,
    SourceDescription,
    make_document,
)

SPEC = Path(__file__).parent / "data" / "spec"
T0 = datetime(2013, 1, 3, tzinfo=UTC)
CAPLIST = "http://example.com/dataset1/capabilitylist.xml"
MD5 = "1584abdf8ebdc9802ac0c6a7402c03b6"
SHA256 = "854f61290e2e197a11bc91063afce22e43f8ccc655237050ace766adc68dc784"


def resync_time(value: str | None) -> datetime | None:
    """resync exposes times as W3C strings; read them with an independent parser."""
    if value is None:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)


def resync_hashes(resource: Resource) -> dict[str, str]:
    """resync's digests as hex: it keeps them as written, rsnotify reads base64 too."""
    found = {"md5": resource.md5, "sha-1": resource.sha1, "sha-256": resource.sha256}
    return {algo: as_hex(digest) for algo, digest in found.items() if digest is not None}


def as_hex(digest: str) -> str:
    """A hex digest lowercased, a base64 (standard or URL-safe) one decoded, independently."""
    if all(c in "0123456789abcdefABCDEF" for c in digest) and len(digest) % 2 == 0:
        return digest.lower()
    padded = digest + "=" * (-len(digest) % 4)
    return base64.urlsafe_b64decode(padded.replace("+", "-").replace("/", "_")).hex()


def resync_read(data: bytes, *, spec_version: str = "1.1") -> list[Resource]:
    """Read a <urlset> with resync's generic reader (no capability check)."""
    reader = Sitemap(spec_version=spec_version)
    return list(reader.parse_xml(fh=io.BytesIO(data), sitemapindex=False))


def assert_same_entries(resources: list[Resource], entries: list[Entry]) -> None:
    assert [r.uri for r in resources] == [e.loc for e in entries]
    for resource, entry in zip(resources, entries, strict=True):
        assert resync_time(resource.lastmod) == entry.lastmod, entry.loc
        assert resync_time(resource.datetime) == entry.datetime, entry.loc
        assert resource.change == (entry.change.value if entry.change else None)
        assert resync_hashes(resource) == entry.hashes()
        assert resource.length == entry.length
        assert resource.mime_type == entry.type
        assert resource.path == entry.path
        assert resource.capability == entry.capability
        expected_links = [
            {
                key: value
                for key, value in {
                    "rel": link.rel,
                    "href": link.href,
                    "modified": link.modified and w3cdt.format(link.modified),
                    "hash": link.hash,
                    "length": link.length,
                    "mime_type": link.type,
                    "path": link.path,
                    "pri": link.pri,
                }.items()
                if value is not None
            }
            for link in entry.links
        ]
        assert (resource.ln or []) == expected_links


# --- every specification example, read by both ----------------------------------------


URLSET_EXAMPLES = [
    path for path in sorted(SPEC.glob("example-*.xml")) if not path.stem.endswith("-index")
]


@pytest.mark.parametrize("path", URLSET_EXAMPLES, ids=lambda p: p.stem)
def test_both_read_the_specification_examples_alike(path: Path) -> None:
    """Example 27's sha-256 is not hex (section 7 says it is) but URL-safe base64: decoded."""
    data = path.read_bytes()
    assert_same_entries(resync_read(data), sitemap.parse(data).entries)


# --- rsnotify writes, resync reads ---------------------------------------------------------


def rsnotify_changes(*, version: str) -> ChangeList:
    """Changes in the 1.0 form (time in <lastmod>) or the 1.1 form (rs:md datetime)."""

    def when(hours: int, micro: int = 0) -> dict[str, datetime]:
        value = T0 + timedelta(hours=hours, microseconds=micro)
        return {"lastmod": value} if version == "1.0" else {"datetime": value}

    entries = [
        Entry(
            loc="http://example.com/res1.html",
            change=ChangeType.CREATED,
            hash=f"md5:{MD5} sha-256:{SHA256}",
            length=8876,
            type="text/html",
            **when(11, 250000),
        ),
        Entry(
            loc="http://example.com/res2.pdf",
            change=ChangeType.UPDATED,
            hash=f"md5:{MD5}",
            length=0,
            type="application/pdf",
            links=[
                Link(rel="duplicate", href="http://mirror.example.com/res2.pdf", pri=1),
                Link(
                    rel="describedby",
                    href="http://example.com/res2.xml",
                    modified=T0,
                    type="application/xml",
                ),
            ],
            **when(13),
        ),
        Entry(loc="http://example.com/res3 & co.tiff", change=ChangeType.DELETED, **when(18)),
        Entry(loc="http://example.com/é/😀", change=ChangeType.UPDATED, **when(18)),
    ]
    if version == "1.1":
        # In 1.1 <lastmod> is when the resource last changed, not the change time.
        entries[1].lastmod = T0 - timedelta(days=3)
    document = make_document(
        Root.URLSET,
        "changelist",
        from_=T0,
        links=[Link(rel="up", href=CAPLIST)],
        entries=entries,
    )
    assert isinstance(document, ChangeList)
    return document


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_resync_reads_rsnotify_change_lists(version: str) -> None:
    document = rsnotify_changes(version=version)
    data = sitemap.serialize(document)
    changes = ResyncChangeList(spec_version=version)
    changes.parse(str_data=data.decode("utf-8"))
    assert changes.md == {"capability": "changelist", "md_from": "2013-01-03T00:00:00Z"}
    assert changes.up == CAPLIST
    assert_same_entries(list(changes), document.entries)
    # Both agree on when each change happened, whichever form carries it.
    times = [resync_time(r.datetime or r.lastmod) for r in changes]
    assert times == [e.change_time for e in document]


def test_resync_reading_as_1_0_sees_no_1_1_datetime() -> None:
    """A 1.0 reader ignores ``rs:md datetime``: 1.1 writers must add <lastmod> for it."""
    data = sitemap.serialize(rsnotify_changes(version="1.1"))
    resources = resync_read(data, spec_version="1.0")
    assert all(r.datetime is None for r in resources)
    assert [r.lastmod is not None for r in resources] == [False, True, False, False]


def test_resync_reads_rsnotify_resource_lists() -> None:
    entries = [
        Entry(
            loc=f"http://example.com/res{n}",
            lastmod=T0 - timedelta(hours=n, microseconds=n),
            hash=f"md5:{MD5} sha-256:{SHA256}" if n % 2 else f"md5:{MD5}",
            length=n * 1000,
            type="text/html",
        )
        for n in range(1, 6)
    ]
    document = make_document(
        Root.URLSET,
        "resourcelist",
        at=T0,
        completed=T0 + timedelta(minutes=1),
        links=[Link(rel="up", href=CAPLIST)],
        entries=entries,
    )
    resources = ResyncResourceList()
    resources.parse(str_data=sitemap.serialize(document).decode("utf-8"))
    assert resources.md_at == "2013-01-03T00:00:00Z"
    assert resources.md_completed == "2013-01-03T00:01:00Z"
    assert len(resources) == len(entries)
    # resync keys Resource Lists by URI: compare in its (sorted) order.
    assert_same_entries(list(resources), sorted(entries, key=lambda e: e.loc))


def test_resync_reads_rsnotify_capability_list_and_source_description() -> None:
    capabilities = make_document(
        Root.URLSET,
        "capabilitylist",
        links=[Link(rel="up", href="http://example.com/.well-known/resourcesync")],
        entries=[
            Entry(loc="http://example.com/dataset1/resourcelist.xml", capability="resourcelist"),
            Entry(loc="http://example.com/dataset1/changelist.xml", capability="changelist"),
        ],
    )
    theirs = ResyncCapabilityList()
    theirs.parse(str_data=sitemap.serialize(capabilities).decode("utf-8"))
    assert theirs.capability_info("changelist").uri == "http://example.com/dataset1/changelist.xml"
    assert theirs.up == "http://example.com/.well-known/resourcesync"

    description = make_document(
        Root.URLSET, "description", entries=[Entry(loc=CAPLIST, capability="capabilitylist")]
    )
    theirs = ResyncSourceDescription()
    theirs.parse(str_data=sitemap.serialize(description).decode("utf-8"))
    assert [r.uri for r in theirs] == [CAPLIST]


def rsnotify_index() -> tuple[ChangeListIndex, list[tuple[str, Document]]]:
    entries = [
        Entry(
            loc=f"http://example.com/res{n}",
            lastmod=T0 + timedelta(hours=n),
            change=ChangeType.UPDATED,
        )
        for n in range(5)
    ]
    document = make_document(
        Root.URLSET, "changelist", from_=T0, links=[Link(rel="up", href=CAPLIST)], entries=entries
    )
    index, parts = sitemap.split(
        document,
        index_url="http://example.com/changelist-index.xml",
        part_url=lambda n: f"http://example.com/changelist-{n}.xml",
        max_entries=2,
    )
    assert isinstance(index, ChangeListIndex)
    return index, parts


def test_resync_cannot_read_a_change_list_index() -> None:
    """resync refuses an index in ``ChangeList.parse`` and loses from/until elsewhere.

    So rsnotify's index is checked against the specification instead: the
    shape of Example 20 (section 12.2), contiguous intervals, one open list.
    """
    index, parts = rsnotify_index()
    data = sitemap.serialize(index)
    with pytest.raises(SitemapIndexError):
        ResyncChangeList().parse(str_data=data.decode("utf-8"))
    generic = Sitemap().parse_xml(fh=io.BytesIO(data), sitemapindex=True)
    assert [r.uri for r in generic] == [e.loc for e in index]
    assert generic.md == {"capability": "changelist", "md_from": "2013-01-03T00:00:00Z"}
    assert all(r.md_from is None and r.md_until is None for r in generic)  # lost by resync

    example = sitemap.parse(SPEC / "example-20-changelist-index.xml")
    again = sitemap.parse(data)
    assert type(again) is type(example) is ChangeListIndex
    assert (again.root, again.capability) == (example.root, example.capability)
    assert again.up == CAPLIST and again.from_ == T0
    assert [e.loc for e in again.open_lists] == [parts[-1][0]]
    assert [(e.from_, e.until) for e in again] == [(p.from_, p.until) for _, p in parts]
    for before, after in zip(again.entries, again.entries[1:], strict=False):
        assert before.until == after.from_
    # And resync reads each part as the Change List it is.
    for url, part in parts:
        theirs = ResyncChangeList()
        theirs.parse(str_data=sitemap.serialize(part).decode("utf-8"))
        assert theirs.index == "http://example.com/changelist-index.xml", url
        assert_same_entries(list(theirs), part.entries)


# --- resync writes, rsnotify reads ---------------------------------------------------------


def resync_changes(*, last_modified: bool = True, **options: object) -> ResyncChangeList:
    """Three changes; res2.pdf also carries its Last-Modified time when ``last_modified``."""
    changes = ResyncChangeList(**options)
    changes.md_from = "2013-01-03T00:00:00Z"
    changes.up = CAPLIST
    changes.add(
        Resource(
            "http://example.com/res1.html",
            datetime="2013-01-03T11:00:00.123456Z",
            change="created",
            md5=MD5,
            sha256=SHA256,
            length=8876,
            mime_type="text/html",
        )
    )
    changes.add(
        Resource(
            "http://example.com/res2.pdf",
            lastmod="2012-12-31T00:00:00Z" if last_modified else None,
            datetime="2013-01-03T13:00:00Z",
            change="updated",
            md5=MD5,
            length=0,
        )
    )
    mirrored = Resource(
        "http://example.com/res3.tiff", datetime="2013-01-03T18:00:00Z", change="deleted"
    )
    mirrored.link_add("duplicate", "http://mirror.example.com/res3.tiff", pri=2)
    mirrored.link_add("duplicate", "http://mirror2.example.com/res3.tiff", pri=1)
    changes.add(mirrored)
    return changes


@pytest.mark.parametrize(
    "options",
    [{}, {"spec_version": "1.1", "add_lastmod": True}, {"spec_version": "1.0"}],
    ids=["1.1", "1.1+lastmod", "1.0"],
)
def test_rsnotify_reads_resync_change_lists(options: dict[str, object]) -> None:
    theirs = resync_changes(last_modified=options.get("spec_version") != "1.0", **options)
    data = theirs.as_xml().encode("utf-8")
    document = sitemap.parse(data)
    assert isinstance(document, ChangeList)
    assert document.from_ == T0 and document.up == CAPLIST and document.is_open
    resources = list(theirs)
    assert_same_entries(
        resync_read(data, spec_version=str(options.get("spec_version", "1.1"))), document.entries
    )
    # The change time is the same for both, whichever element carries it.
    assert [e.change_time for e in document] == [resync_time(r.datetime) for r in resources]
    assert [e.change for e in document] == [
        ChangeType.CREATED,
        ChangeType.UPDATED,
        ChangeType.DELETED,
    ]
    assert document.entries[0].hashes() == {"md5": MD5, "sha-256": SHA256}
    assert document.entries[0].change_time.microsecond == 123456
    assert [ln.pri for ln in document.entries[2].links] == [2, 1]
    assert document.entries[2].link("duplicate").href == "http://mirror2.example.com/res3.tiff"


def test_resync_1_0_writer_puts_last_modified_where_the_change_time_belongs() -> None:
    """Given a resource's Last-Modified, resync's 1.0 writer uses it as <lastmod>.

    In 1.0 <lastmod> is the change time, so the list falls out of forward
    chronological order; rsnotify says so rather than reorder the changes.
    """
    data = resync_changes(spec_version="1.0").as_xml().encode("utf-8")
    with pytest.raises(OutOfOrder) as caught:
        sitemap.parse(data)
    assert "http://example.com/res2.pdf" in str(caught.value)
    reader = sitemap.DocumentReader(data, allow_unordered=True)
    assert [e.change_time for e in reader][1] == datetime(2012, 12, 31, tzinfo=UTC)
    assert len(reader.warnings) == 1


def test_rsnotify_reads_resync_resource_lists() -> None:
    theirs = ResyncResourceList()
    theirs.md_at = "2013-01-03T09:00:00Z"
    theirs.md_completed = "2013-01-03T09:01:00Z"
    theirs.up = CAPLIST
    for n in (3, 1, 2):
        theirs.add(
            Resource(
                f"http://example.com/res{n}",
                lastmod=f"2013-01-02T1{n}:00:00Z",
                md5=MD5,
                sha256=SHA256 if n == 2 else None,
                length=n,
                mime_type="application/pdf",
            )
        )
    data = theirs.as_xml().encode("utf-8")
    document = sitemap.parse(data)
    assert isinstance(document, ResourceList)
    assert (document.at, document.completed) == (
        T0 + timedelta(hours=9),
        T0 + timedelta(hours=9, minutes=1),
    )
    assert document.up == CAPLIST
    assert_same_entries(list(theirs), document.entries)
    assert [e.loc for e in document] == [f"http://example.com/res{n}" for n in (1, 2, 3)]


def test_rsnotify_reads_resync_capability_list_and_source_description() -> None:
    theirs = ResyncCapabilityList()
    theirs.up = "http://example.com/.well-known/resourcesync"
    theirs.add_capability(uri="http://example.com/rl.xml", name="resourcelist")
    theirs.add_capability(uri="http://example.com/cl.xml", name="changelist")
    document = sitemap.parse(theirs.as_xml().encode("utf-8"))
    assert isinstance(document, CapabilityList)
    assert document.capabilities == {
        "resourcelist": "http://example.com/rl.xml",
        "changelist": "http://example.com/cl.xml",
    }
    assert document.up == "http://example.com/.well-known/resourcesync"

    description = ResyncSourceDescription()
    description.add_capability_list(CAPLIST)
    document = sitemap.parse(description.as_xml().encode("utf-8"))
    assert isinstance(document, SourceDescription)
    assert document.capability_lists == [CAPLIST]


def test_rsnotify_reads_a_change_list_resync_split_into_an_index(tmp_path: Path) -> None:
    """resync writes the index and parts without ``from`` (section 12 wants it).

    rsnotify reads them anyway, with a warning naming the missing attribute.
    """
    theirs = ResyncChangeList()
    theirs.max_sitemap_entries = 2
    for n in range(5):
        theirs.add(
            Resource(
                f"http://example.com/res{n}", datetime=f"2013-01-03T0{n}:00:00Z", change="updated"
            )
        )
    basename = str(tmp_path / "changelist.xml")
    reader = sitemap.DocumentReader(theirs.as_xml(allow_multifile=True, basename=basename).encode())
    index = reader.header
    listed = list(reader)
    assert isinstance(index, ChangeListIndex)
    assert len(listed) == 3
    assert any("from" in warning for warning in reader.warnings)
    entries: list[Entry] = []
    for number in range(3):
        part = sitemap.parse(theirs.as_xml_part(basename=basename, part_number=number).encode())
        assert isinstance(part, ChangeList)
        assert part.index == basename
        entries.extend(part)
    assert [e.loc for e in entries] == [f"http://example.com/res{n}" for n in range(5)]
    assert [e.change_time for e in entries] == [T0 + timedelta(hours=n) for n in range(5)]
