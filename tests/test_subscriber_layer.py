"""The subscriber does not import the publisher (issue 20: "wrong rooms").

What both need to read Change Lists lives in :mod:`rsnotify.changes`; a
Destination operator installs the subscriber without the publisher's
machinery, and a change in one side cannot break the other through a hidden
import.  A general import-layer check may replace this test; until then it
walks every module of ``rsnotify/subscriber`` with :mod:`ast`, so imports
inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rsnotify

PACKAGE = Path(rsnotify.__file__).parent
FORBIDDEN = "rsnotify.publisher"


def _imported(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, absolute, with its line number."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def test_the_import_walker_resolves_relative_imports() -> None:
    imported = {name for _, name in _imported(PACKAGE / "subscriber" / "sync.py")}
    assert "rsnotify.changes.watcher" in imported


def test_no_subscriber_module_imports_the_publisher() -> None:
    offending = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for path in sorted((PACKAGE / "subscriber").rglob("*.py"))
        for line, name in _imported(path)
        if name == FORBIDDEN or name.startswith(FORBIDDEN + ".")
    ]
    assert offending == []
