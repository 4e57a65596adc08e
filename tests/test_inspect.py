"""``rsnotify inspect``: nothing on stdout for a refused document, every parsed field in
``--json``, and the lenient rules by name (issue 17, items 5 and 6)."""

from __future__ import annotations

import json
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rsnotify.cli import main
from rsnotify.commands.inspect import entry_json, header_json, link_json
from rsnotify.model import ChangeType, Document, Entry, Link, Root

from .test_sitemap import change, changelist

CORPUS = Path(__file__).parent / "data" / "interop-corpus"
T = datetime(2013, 1, 3, 10, tzinfo=UTC)


def inspect(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["inspect", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_document_refused_late_writes_nothing_to_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two thousand good entries, then one out of order: no truncated listing."""
    lines = [change(f"http://example.com/{i}", f"2013-01-03T10:{i // 60 % 60:02d}:{i % 60:02d}Z")
             for i in range(2000)]  # fmt: skip
    lines.append(change("http://example.com/late", "2013-01-03T09:00:00Z"))
    path = tmp_path / "changelist.xml"
    path.write_bytes(changelist(*lines))
    code, out, err = inspect(capsys, "--json", str(path))
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and "[Z39.99 section 12.1]" in err and "--lenient order" in err
    code, out, err = inspect(capsys, str(path))  # the text form too
    assert (code, out) == (1, "")
    code, out, err = inspect(capsys, "--json", "--lenient", "order", str(path))
    assert code == 0 and len(out.splitlines()) == 1 + 2001
    assert err.count("warning:") == 1
    assert inspect(capsys, "--json", "--allow-unordered", str(path))[1] == out


def test_json_carries_lastmod_beside_datetime_and_manifest_paths(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = inspect(capsys, "--json", str(CORPUS / "resync/spec-v1_1-ex3.xml"))
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows[0]["type"] == "ChangeList"
    both = [row for row in rows[1:] if "lastmod" in row and row["lastmod"] != row["datetime"]]
    assert both, rows  # 1.1: the resource's time and the change's time, both shown
    code, out, _ = inspect(capsys, "--json", str(CORPUS / "resync/spec-v1_1-ex23.xml"))
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows[0]["capability"] == "changedump-manifest"
    assert "/changes/res7.html" in [row.get("path") for row in rows[1:]]


def test_every_field_the_parser_keeps_is_in_the_json() -> None:
    """Built from the dataclasses: a field added to the model cannot be forgotten here."""
    link = Link(rel="duplicate", href="http://m/a", hash="md5:00", length=1, modified=T,
                path="/p", type="text/plain", pri=2, encoding="gzip",
                extra={"{http://x/}y": "z"})  # fmt: skip
    entry = Entry(
        loc="http://example.com/a", lastmod=T, changefreq="daily", change=ChangeType.UPDATED,
        datetime=datetime(2014, 1, 1, tzinfo=UTC), hash="md5:00", length=3, type="text/plain",
        path="/r/a", encoding="gzip", capability="resourcelist", at=T, completed=T, from_=T,
        until=T, links=[link], md_extra={"{http://x/}y": "z"}, line=7,
    )  # fmt: skip
    out = entry_json(entry)
    names = {f.name for f in fields(Entry)} - {"line"}
    assert set(out) == {{"from_": "from", "md_extra": "extra"}.get(n, n) for n in names}
    assert out["datetime"] == "2014-01-01T00:00:00Z" and out["lastmod"] == "2013-01-03T10:00:00Z"
    assert out["change"] == "updated" and out["extra"] == {"{http://x/}y": "z"}
    assert set(link_json(link)) == {f.name for f in fields(Link)}
    document = Document(root=Root.URLSET, capability="resourcelist", at=T, completed=T,
                        from_=T, until=T, links=[link], md_extra={"a": "b"})  # fmt: skip
    header = header_json(document)
    assert set(header) == {"type", "root", "capability", "at", "completed", "from", "until",
                           "links", "extra"}  # fmt: skip


def test_lenient_rules_by_name_and_unknown_names_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    manifest = str(CORPUS / "go-resourcesync/core-changedump-manifest.xml")
    code, out, err = inspect(capsys, "--json", manifest)
    assert (code, out) == (1, "") and "--lenient timezone" in err
    code, out, err = inspect(capsys, "--json", "--lenient", "timezone,order", manifest)
    assert code == 0 and len(out.splitlines()) == 4
    assert err.count("warning:") == 2  # one per rule relaxed, not one per entry
    code, out, err = inspect(capsys, "--lenient", "all", "--strict", manifest)
    assert (code, out) == (1, "")
    code, out, err = inspect(capsys, "--lenient", "ordre", manifest)
    assert (code, out) == (2, "") and "unknown lenient rule 'ordre'" in err
