"""Extract the XML examples of Z39.99 into one file per example.

Run once (``python tests/data/spec/extract.py [spec.txt]``); the output is
committed so the tests never depend on the reference text being present.

Why a script rather than hand-copied files: hand-copying 30 examples invites
silent typos, and a typo in a fixture would make the parser look right (or
wrong) for the wrong reason.

The examples are numbered in document order.  Examples 9, 10 and 11 are an
HTML ``<link>``, an HTTP ``Link`` header and a ``robots.txt`` file, not XML,
so the numbering skips them; each extracted number is checked against an
``Example N`` mention that precedes the block in the text.  The two Table 2
"templates" (element skeletons with ``...`` placeholders, inside a table row
ending in ``|``) are not documents; they are written as
``table2-template-*.xml`` so a test can show they are refused.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_SPEC = Path("/work/shared/reference/resourcesync-framework-spec-z39.99.txt")
NON_XML_EXAMPLES = {9: "HTML link", 10: "HTTP Link header", 11: "robots.txt"}
EXPECTED_XML_EXAMPLES = 33 - len(NON_XML_EXAMPLES)
_END = re.compile(r"</(urlset|sitemapindex)>\s*\|?\s*$")


def blocks(lines: list[str]) -> list[tuple[int, str]]:
    """(line number, text) of every XML block: one line, or lines up to the root's end tag."""
    out: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("<?xml"):
            start = i
            while not _END.search(lines[i]):
                i += 1
            out.append((start + 1, "\n".join(lines[start : i + 1])))
        i += 1
    return out


def kind(text: str) -> str:
    """A file-name slug from the root element and the document-level capability."""
    root = re.search(r"<(urlset|sitemapindex)\b", text)
    capability = re.search(r'capability="([^"]+)"', text)
    assert root and capability, text[:200]
    slug = capability.group(1)
    return f"{slug}-index" if root.group(1) == "sitemapindex" else slug


def main(spec: Path = DEFAULT_SPEC) -> None:
    lines = spec.read_text(encoding="utf-8").splitlines()
    number = 0
    templates = 0
    written = []
    for lineno, text in blocks(lines):
        if text.rstrip().endswith("|") and "..." in text:
            templates += 1
            root = "urlset" if "<urlset" in text else "sitemapindex"
            name = f"table2-template-{root}.xml"
            (HERE / name).write_text(text.rstrip().rstrip("|").rstrip() + "\n", encoding="utf-8")
            written.append(name)
            continue
        number += 1
        while number in NON_XML_EXAMPLES:
            number += 1
        before = "\n".join(lines[: lineno - 1])
        if not re.search(rf"\bExample {number}\b", before):
            raise SystemExit(f"line {lineno}: no 'Example {number}' mention before this block")
        name = f"example-{number:02d}-{kind(text)}.xml"
        (HERE / name).write_text(text + "\n", encoding="utf-8")
        written.append(name)
    if number != 33 or templates != 2 or len(written) != EXPECTED_XML_EXAMPLES + 2:
        raise SystemExit(f"expected 30 examples and 2 templates, got {written}")
    print("\n".join(written))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SPEC)
