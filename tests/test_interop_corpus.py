"""The interop corpus as a test suite: 60 ResourceSync documents written by nine other projects.

``tests/data/interop-corpus/`` is a copy of the shared corpus (``SOURCES.md`` and
``manifest.json`` say where each file comes from and what its own project expects of
it).  Every file is one case, named by the project that wrote it:

* documents their project treats as valid are read: strictly, or with the
  :class:`~rsnotify.sitemap.Lenient` rules named here where the specification forbids
  what they do (and then a strict read refuses them, naming the rule to relax);
* documents their project treats as invalid are refused, even with every rule
  relaxed, with a message naming the rule (``DocumentError.rule``) and saying what
  is wrong.

Where rsnotify's verdict differs from the project's or from the corpus's reading
of the specification (``spec``: valid / tolerate / invalid), the case says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from rsnotify import sitemap
from rsnotify.errors import DocumentError
from rsnotify.model import Document, is_checkable, parse_hashes
from rsnotify.sitemap import Lenient, Limits

CORPUS = Path(__file__).parent / "data" / "interop-corpus"
MANIFEST = {item["file"]: item for item in json.loads((CORPUS / "manifest.json").read_text())}
ALL = frozenset(Lenient)
TZ, PLAIN, ORDER = Lenient.TIMEZONE, Lenient.PLAIN_SITEMAP, Lenient.ORDER


@dataclass(frozen=True)
class Read:
    """rsnotify reads it, relaxing ``rules`` (none: a strict read)."""

    entries: int
    rules: frozenset[Lenient] = frozenset()
    warns: tuple[str, ...] = ()  # fragments of the warnings it must give
    why: str = ""  # where this differs from SOURCES.md's verdicts

    valid = True


@dataclass(frozen=True)
class Refuse:
    """rsnotify refuses it, even with every rule relaxed; ``says`` is in the message."""

    rule: str
    says: str
    why: str = ""
    #: rules under which it is read after all (the operator's choice), else refused with all
    read_with: frozenset[Lenient] = frozenset()

    valid = False


CASES: dict[str, Read | Refuse] = {
    # resync (Python reference library)
    "resync/archives1-caps1.xml": Read(8),
    "resync/archives1-caps2-empty.xml": Read(0),
    "resync/archives1-resourcelist-archive.xml": Read(3),
    "resync/archives1-resourcelist-relative.xml": Read(3, warns=("mandatory 'at'",)),
    "resync/explore1-resourcesync.xml": Read(3),
    "resync/sitemapindex1-plain-index.xml": Read(3, frozenset({PLAIN}), ("plain Sitemap",)),
    "resync/sitemapindex1-rs-size.xml": Read(6, frozenset({PLAIN}), ("plain Sitemap",)),
    "resync/unknown1-capability-unknown.xml": Read(2, warns=("unknown capability 'unknown'",)),
    "resync/spec-v1_1-ex3.xml": Read(3),
    "resync/spec-v1_1-ex19.xml": Refuse(
        "Appendix A",
        "has no change time",
        why="resync reads it, but a change without a time cannot be placed in the list: a "
        "Destination could neither resume after it nor order it (Table 4: mandatory)",
    ),
    "resync/spec-v1_1-ex21.xml": Read(4),
    "resync/spec-v1_1-ex23.xml": Read(4),
    "resync/inline-dupe-entries-no-md.xml": Read(
        2, frozenset({PLAIN}), ("plain Sitemap",), why="relative <loc>s are kept as written"
    ),
    "resync/inline-md-after-url.xml": Refuse("section 7", "comes after the first <url>"),
    "resync/inline-unknown-junk-elements.xml": Read(1, warns=("mandatory 'at'",)),
    "resync/inline-two-loc.xml": Refuse("section 7", "second <loc>"),
    "resync/inline-empty-loc.xml": Refuse("section 7", "without <loc>"),
    "resync/inline-two-lastmod.xml": Refuse("section 7", "second <lastmod>"),
    "resync/inline-empty-lastmod.xml": Read(
        1,
        frozenset({PLAIN}),
        ("plain Sitemap", "empty <lastmod>"),
        why="the spec verdict is invalid: an empty <lastmod> is not a W3C Datetime; read as "
        "absent (it is optional in a Resource List) with a warning, never as a time",
    ),
    "resync/inline-two-top-md.xml": Refuse("section 7", "more than one document-level rs:md"),
    "resync/inline-not-xml.xml": Refuse("XML 1.0", "not well-formed"),
    "resync/inline-illformed.xml": Refuse(
        "section 7",
        "Sitemap namespace",
        why="refused as resync does, for the first fault rsnotify meets: its root is in no "
        "namespace (the unclosed <url> comes later)",
    ),
    "resync/inline-other-namespace.xml": Refuse("section 7", "Sitemap namespace"),
    "resync/inline-rs-ln-on-resource.xml": Read(2, warns=("mandatory 'at'",)),
    "resync/inline-ln-missing-href.xml": Refuse("section 7", "rel and href"),
    "resync/inline-ln-pri-0.xml": Refuse("section 7", "pri='0'"),
    "resync/inline-ln-extra-attribute.xml": Read(1, warns=("mandatory 'at'",)),
    "resync/inline-cl-date-only-from.xml": Read(2),
    "resync/inline-cl-no-capability.xml": Refuse("section 12.1", "Change List without its header"),
    "resync/inline-cl-bad-capability.xml": Read(
        1,
        warns=("unknown capability 'bad_capability'",),
        why="resync refuses it only when asked for a Change List; a capability rsnotify does "
        "not know is read as a generic document (never applied as changes), with a warning",
    ),
    "resync/inline-rl-date-only-at.xml": Read(2),
    "resync/inline-rl-no-rs-namespace.xml": Read(1, frozenset({PLAIN}), ("plain Sitemap",)),
    # resync-client (Ruby, CDL)
    "resync-client-rb/simulator-change-list.xml": Read(1000),
    "resync-client-rb/changedump-until-before-from.xml": Read(1),
    "resync-client-rb/resourcedump-completed-before-at.xml": Read(1),
    "resync-client-rb/resourcedump-manifest.xml": Read(2),
    # resync (Ruby library, CDL)
    "resync-rb/changedump-index.xml": Read(3),
    "resync-rb/resourcedump-index.xml": Read(3),
    "resync-rb/inline-no-root-md.xml": Refuse(
        "section 7", "no document-level rs:md", read_with=frozenset({PLAIN})
    ),
    "resync-rb/inline-md-without-capability.xml": Refuse("section 7", "has no capability"),
    "resync-rb/inline-unknown-capability.xml": Read(
        1,
        warns=("unknown capability 'NOT A CAPABILITY'",),
        why="the Ruby library refuses it; an unknown capability is read as a generic document "
        "with a warning (the Archives specification added capabilities; others may too)",
    ),
    "resync-rb/inline-loc-as-root.xml": Refuse("section 7", "neither <urlset> nor <sitemapindex>"),
    # resourcesync-validator (capture of Cornell's live simulator)
    "cbeer-validator/sim100-resourcelist-2014.xml": Read(112),
    # go-resourcesync (CORE)
    "go-resourcesync/core-capabilitylist.xml": Read(1),
    "go-resourcesync/core-frontiers-resourcelist-index.xml": Read(2),
    "go-resourcesync/core-frontiers-resourcelist.xml": Read(2),
    "go-resourcesync/core-changelist-of-datadumps.xml": Refuse(
        "section 12.1",
        "has no rs:md change",
        why="labelled a Change List, it is a Change Dump's list of archives: no entry says "
        "what changed, so there is nothing a Destination could apply; no lenient rule "
        "makes that up (its zone-less times alone would be read with --lenient timezone)",
    ),
    "go-resourcesync/core-changedump-manifest.xml": Read(
        3,
        frozenset({TZ, ORDER}),
        ("without a time zone", "not in forward chronological order"),
        why="'2020-03-18 01:20:10' (space, no zone) is read as UTC by the timezone rule",
    ),
    "go-resourcesync/resourcedump-manifest-leading-newline.xml": Refuse(
        "XML 1.0",
        "XML declaration allowed only at the start",
        why="Go's encoding/xml accepts it, but it is not well-formed XML (XML 1.0 section "
        "2.8): rsnotify's XML parser does not rewrite bytes before parsing",
    ),
    "go-resourcesync/core-unsupported-capability.xml": Read(
        1,
        warns=("unknown capability 'unsupported'",),
        why="go-resourcesync refuses the feed type; rsnotify reads any capability as a "
        "generic document, with a warning",
    ),
    "go-resourcesync/changelist-index-tabbed.xml": Read(3),
    # RDM2-osf.io (NII researcher database)
    "rdm-osf/nrid-changelist-jst-unordered.xml": Read(
        6, frozenset({ORDER}), ("not in forward chronological order",)
    ),
    "rdm-osf/nrid-no-md-no-change.xml": Refuse(
        "section 7", "no document-level rs:md", read_with=frozenset({PLAIN})
    ),
    "rdm-osf/nrid-change-without-lastmod.xml": Refuse(
        "section 12.1", "Change List without its header"
    ),
    # Timbuctoo
    "timbuctoo/sourcedescription.xml": Read(2),
    "timbuctoo/dataset1-capability.xml": Read(1),
    "timbuctoo/dataset1-resourcelist-no-at.xml": Read(2, warns=("mandatory 'at'",)),
    # nakamura196 (U-Tokyo)
    "nakamura196/capabilitylist-xsl-pi.xml": Read(1),
    "nakamura196/resourcelist-index-xsl-pi.xml": Read(2),
    # Brown University Library
    "birkin/dump-test-resourcedump.xml": Read(1115),
}


def test_every_corpus_file_is_a_case_and_the_manifest_describes_it() -> None:
    on_disk = {p.relative_to(CORPUS).as_posix() for p in CORPUS.rglob("*.xml")}
    assert on_disk == set(MANIFEST) == set(CASES)
    assert (CORPUS / "SOURCES.md").is_file()


def _read(name: str, rules: frozenset[Lenient]) -> tuple[Document, list[str]]:
    reader = sitemap.DocumentReader(CORPUS / name, limits=Limits(lenient=rules))
    document = reader.header
    document.entries = list(reader)
    return document, reader.warnings


def _case_id(name: str) -> str:
    return f"{MANIFEST[name]['repo']}:{name}"


@pytest.mark.parametrize("name", sorted(CASES), ids=_case_id)
def test_corpus_document(name: str) -> None:
    case, source = CASES[name], MANIFEST[name]
    context = (
        f"{name}, written by {source['project']} ({source['repo']}); its project says "
        f"{source['project_verdict']} ({source['project_evidence']}), the corpus reads the "
        f"spec as {source['spec_verdict']}"
    )
    # A verdict that differs from SOURCES.md's must say why.
    disagrees = (case.valid != (source["project_verdict"] == "valid")) or (
        source["spec_verdict"] == "valid" and (not case.valid or bool(getattr(case, "rules", ())))
    )
    if disagrees:
        assert case.why, f"{context}: rsnotify disagrees, and the case does not say why"
    if isinstance(case, Read):
        document, warnings = _read(name, case.rules)
        assert len(document.entries) == case.entries, context
        for fragment in case.warns:
            assert any(fragment in w for w in warnings), (context, warnings)
        if case.rules:
            with pytest.raises(DocumentError) as strict:
                _read(name, frozenset())
            assert strict.value.rule, context
            named = {rule.value for rule in case.rules}
            assert any(f"--lenient {rule}" in str(strict.value) for rule in named), (
                context,
                str(strict.value),
            )
    else:
        if case.read_with:  # a plain Sitemap: a Resource List only when the operator says so
            document, warnings = _read(name, case.read_with)
            assert document.capability == "resourcelist" and document.entries, context
            assert any("plain Sitemap" in w for w in warnings), (context, warnings)
        with pytest.raises(DocumentError) as refused:
            _read(name, ALL - case.read_with)
        message = str(refused.value)
        assert refused.value.rule and case.rule in refused.value.rule, (context, message)
        assert case.says in message, (context, message)
        assert f"[{refused.value.rule}]" in message  # the one line an operator sees names it
        with pytest.raises(DocumentError) as strict:
            _read(name, frozenset())
        assert strict.value.rule, context


def test_base64_digests_in_the_corpus_read_as_hex_and_unusable_ones_are_kept() -> None:
    """Cornell's simulator wrote base64 md5 (captured twice in the corpus); resync's test
    writes 'md5:r2d2', which no body can match."""
    for name in ("resync-client-rb/simulator-change-list.xml",
                 "cbeer-validator/sim100-resourcelist-2014.xml"):  # fmt: skip
        document, _ = _read(name, frozenset())
        hashed = [entry for entry in document.entries if entry.hash]  # deletions have none
        assert len(hashed) > len(document.entries) / 2
        for entry in hashed:
            assert "==" in entry.hash, entry
            assert all(is_checkable(a, d) for a, d in entry.hashes().items()), entry
    document, _ = _read("resync/inline-rs-ln-on-resource.xml", frozenset())
    hashes = [parse_hashes(e.hash) for e in document.entries if e.hash]
    assert {"md5": "r2d2"} in hashes and not is_checkable("md5", "r2d2")


def test_padded_locs_are_trimmed() -> None:
    """anyURI collapses whitespace: CORE wraps its <loc>s in a newline and a tab."""
    document, _ = _read("go-resourcesync/core-capabilitylist.xml", frozenset())
    assert document.entries
    assert all(e.loc == e.loc.strip() and e.loc.startswith("http") for e in document.entries)
