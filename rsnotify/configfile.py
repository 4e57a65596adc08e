"""A TOML configuration file: its values, and the line of each table and key (for messages).

The values come from :mod:`tomllib`, which decides whether the file is TOML at
all.  ``tomllib`` gives no positions, so the lines come from a second, real
parse: tree-sitter's TOML grammar (``tree-sitter-toml``), whose syntax tree
has the row of every table header and every ``key = value`` pair.  The key
written in the tree (bare, quoted, dotted) is decoded by ``tomllib`` itself,
so ``"poll"``, ``'poll'`` and ``poll`` are the same key here as in the
values.  Where the two parsers were ever to disagree, a message names the
file without a line rather than a wrong one.
"""

from __future__ import annotations

import functools
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["ConfigError", "ConfigFile", "Problem", "load", "positions"]

Path_ = tuple[str, ...]  # a table or key: ("publish", "poll")


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong, located: ``where`` is ``file:line``, a file, or a variable name."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass(slots=True)
class ConfigFile:
    """A parsed TOML configuration file and the line where each table and key is first named."""

    path: Path
    data: dict[str, Any]
    lines: dict[Path_, int] = field(default_factory=dict)

    def where(self, *names: str) -> str:
        """``file:line`` of the table or key ``names``, else of its nearest table, else the file."""
        for end in range(len(names), 0, -1):
            line = self.lines.get(names[:end])
            if line is not None:
                return f"{self.path}:{line}"
        return str(self.path)


def load(path: str | os.PathLike[str]) -> ConfigFile:
    """Read and parse a TOML file; unreadable files and syntax errors are ConfigErrors."""
    location = Path(path)
    try:
        raw = location.read_bytes()
    except OSError as exc:
        raise ConfigError([Problem(str(location), f"cannot read: {exc.strerror or exc}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([Problem(str(location), f"not UTF-8: {exc}")]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([Problem(str(location), f"invalid TOML: {exc}")]) from None
    return ConfigFile(location, data, positions(raw))


# --- positions from the syntax tree ------------------------------------------------------

_KEYS = frozenset({"bare_key", "quoted_key", "dotted_key"})
_TABLES = frozenset({"table", "table_array_element"})


@functools.cache
def _parser() -> Any:
    import tree_sitter
    import tree_sitter_toml

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_toml.language()))


def positions(source: bytes) -> dict[Path_, int]:
    """The 1-based line where each table, and each key within it, first appears.

    A key is recorded under its full path (``[publish]`` then ``poll = 1`` is
    ``("publish", "poll")``) and so is every table a header or dotted key opens.
    """
    lines: dict[Path_, int] = {}
    for node in _parser().parse(source).root_node.named_children:
        if node.type == "pair":
            _record(node, (), lines)
        elif node.type in _TABLES:
            table = _key_of(node)
            if table is None:
                continue
            _note(table, node.start_point[0] + 1, lines)
            for child in node.named_children:
                if child.type == "pair":
                    _record(child, table, lines)
    return lines


def _record(pair: Any, table: Path_, lines: dict[Path_, int]) -> None:
    key = _key_of(pair)
    if key is not None:
        _note(table + key, pair.start_point[0] + 1, lines)


def _note(path: Path_, line: int, lines: dict[Path_, int]) -> None:
    for end in range(1, len(path) + 1):
        lines.setdefault(path[:end], line)


def _key_of(node: Any) -> Path_ | None:
    """The decoded key of a pair or table header node (``a."b.c"`` is ``("a", "b.c")``)."""
    written = next((c for c in node.named_children if c.type in _KEYS), None)
    if written is None:
        return None
    try:
        value: Any = tomllib.loads(f"{written.text.decode('utf-8')} = 0")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    path: list[str] = []
    while isinstance(value, dict) and len(value) == 1:
        name, value = next(iter(value.items()))
        path.append(name)
    return tuple(path)
