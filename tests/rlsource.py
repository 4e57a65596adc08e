"""A static Source with no Change List: only a Resource List, or a Resource List Index (issue 23).

Many Sources publish nothing but a Resource List (CORE, Timbuctoo, most sitemap
plugins).  :class:`ResourceListSource` is such a Source as files in a directory
for a stock web server (``python -m http.server``, nginx), written from
Z39.99 alone, with no rsnotify code, so that a bug in rsnotify's writer cannot
hide the same bug in its reader:

* ``/.well-known/resourcesync``: the Source Description (section 8), one
  Capability List;
* ``capabilitylist.xml`` (section 9): ONE capability, ``resourcelist``; no
  Change List, no Dump;
* mode ``"list"``: ``resourcelist.xml``, a ``<urlset>`` with the mandatory
  ``<rs:md capability="resourcelist" at=…>`` (section 10.1);
* mode ``"index"``: ``resourcelist-index.xml``, a ``<sitemapindex>`` with its own
  ``at`` and one ``<sitemap>`` per part, each with ``<rs:md at=…>`` (section
  10.2: "The Destination can determine whether it has reached a Resource List
  or a Resource List Index based on whether the root element is ``<urlset>`` or
  ``<sitemapindex>``"), and the parts ``resourcelist-part1.xml`` … each linking
  ``up`` to the Capability List and ``index`` to the index;
* the resources under ``res/``, some with a space, ``&`` or a non-ASCII letter
  in their names, percent-encoded in ``<loc>`` (RFC 3986; ``&`` is a legal
  sub-delimiter and stays, escaped as ``&amp;`` in the XML).

Each resource is listed with ``<lastmod>`` and ``rs:md length`` and, unless
``hashes=False``, ``hash="md5:… sha-256:…"`` (section 7): without hashes a
Destination can only compare length and lastmod, so both kinds of fingerprint
are exercised.  Updates keep the length of the old content every other time,
so a hash-less Destination that looked at length alone would miss them.

:meth:`ResourceListSource.round` changes the Source the way a Source that
regenerates its lists does, and rewrites only what changed: the index (new
``at``, strictly later than the last) and the parts that gained, lost or
changed an entry; an unchanged part keeps its bytes and its modification time,
so a conditional GET of it is answered 304.  In index mode the rounds follow
:data:`ROUND_KINDS`: some change ONE part, some move resources from one part to
another (a per-part diff would see a deletion in one part and a creation in
the other; the resource never went away), some touch every part.

Time is a virtual clock a day in the past, one minute per round, in whole
seconds: ``at``, ``<lastmod>`` and the files' modification times come from it.
``python -m http.server`` sends ``Last-Modified`` in whole seconds and no ETag;
a date written in the same second as it is served is weak (RFC 9110 section
8.8.2.2) and a correct client must not trust it, so with real time whether a
part is re-fetched would depend on timing.  With dates well before the
response's ``Date`` every validator is usable and a test can assert exactly
which documents were fetched (:func:`requests`).  Dates strictly increase
round over round, so no change ever hides behind an unchanged date.

Every file is written atomically (temporary file in the same directory,
modification time set, ``os.replace``), resources before the lists that name
them, lists before the index, and deleted files removed only once no list
names them: a Destination reading at any moment sees a list whose entries
exist (it may see the index of the last round with a part of this one, as
with any Source that does not version its parts).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal
from urllib.parse import quote, unquote
from xml.sax.saxutils import escape, quoteattr

from tests.devstack import HttpServer, Nginx
from tests.groundtruth import tree_differences

__all__ = [
    "CAPABILITY_LIST",
    "DESCRIPTION",
    "INDEX",
    "LIST",
    "ROUND_KINDS",
    "Mode",
    "ResourceListSource",
    "Round",
    "requests",
]

Mode = Literal["list", "index"]
LIST = "resourcelist.xml"
INDEX = "resourcelist-index.xml"
CAPABILITY_LIST = "capabilitylist.xml"
DESCRIPTION = ".well-known/resourcesync"
NS = (
    'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
    'xmlns:rs="http://www.openarchives.org/rs/terms/"'
)
#: What each round of index mode does, cycled: ``one-part`` puts every create,
#: update and delete in one part; ``move`` also moves two resources (one as it
#: is, one updated) from that part to another; ``spread`` scatters the changes
#: over every part.
ROUND_KINDS = ("one-part", "move", "one-part", "spread", "one-part")
#: Name endings that real collections have: each must round-trip to the mirror.
ODD = ("", " with space", " & more", " ü", "-ß-é")


def _w3c(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fixity(data: bytes) -> str:
    return f"md5:{hashlib.md5(data).hexdigest()} sha-256:{hashlib.sha256(data).hexdigest()}"


@dataclass(slots=True)
class _Resource:
    data: bytes
    lastmod: int  # virtual POSIX seconds
    part: int  # 0-based; always 0 in list mode


@dataclass(slots=True)
class Round:
    """What one :meth:`ResourceListSource.round` did (locs, and documents rewritten)."""

    kind: str
    created: set[str] = field(default_factory=set)
    updated: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)
    moved: set[str] = field(default_factory=set)  # listed in another part now
    rewritten: set[str] = field(default_factory=set)  # list documents, relative to the root

    @property
    def fetched(self) -> set[str]:
        """The resources a Destination must GET to catch up: created and updated."""
        return self.created | self.updated


class ResourceListSource:
    """A directory of ResourceSync documents and resources with no Change List."""

    def __init__(
        self, root: Path, base: str, *, mode: Mode = "list", hashes: bool = True, parts: int = 3
    ) -> None:
        self.root = root
        self.base = base.rstrip("/") + "/"
        self.mode: Mode = mode
        self.hashes = hashes
        self.parts = parts if mode == "index" else 1
        self.resources: dict[str, _Resource] = {}  # name under res/ -> state
        self.clock = int(time.time()) - 86_400  # virtual seconds, see the module docstring
        self.at = 0
        self.part_at: list[int] = [0] * self.parts
        self.rounds = 0
        self._created = 0

    # -- names ---------------------------------------------------------------

    def url(self, relative: str) -> str:
        return self.base + relative

    def loc(self, name: str) -> str:
        """The URI of ``res/<name>``: percent-encoded UTF-8, ``/`` and ``&`` kept."""
        return self.url("res/" + quote(name, safe="/&"))

    @property
    def capability_list(self) -> str:
        return self.url(CAPABILITY_LIST)

    @property
    def resource_list(self) -> str:
        """The URI the Capability List gives for the Resource List (Index)."""
        return self.url(INDEX if self.mode == "index" else LIST)

    def part_name(self, part: int) -> str:
        return f"resourcelist-part{part + 1}.xml" if self.mode == "index" else LIST

    @property
    def documents(self) -> list[str]:
        """Every document this Source serves, relative to the root."""
        lists = [self.part_name(p) for p in range(self.parts)]
        return [DESCRIPTION, CAPABILITY_LIST, *([INDEX] if self.mode == "index" else []), *lists]

    # -- writing -------------------------------------------------------------

    def _write(self, relative: str, data: bytes, mtime: int) -> None:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.tmp")
        temp.write_bytes(data)
        os.utime(temp, (mtime, mtime))
        os.replace(temp, path)

    def _put(self, name: str, data: bytes, part: int) -> None:
        self.resources[name] = _Resource(data, self.clock, part)
        self._write("res/" + name, data, self.clock)

    def _entry(self, name: str) -> str:
        resource = self.resources[name]
        md = f'length="{len(resource.data)}" type="text/plain"'
        if self.hashes:
            md = f'hash="{_fixity(resource.data)}" ' + md
        return (
            f"<url><loc>{escape(self.loc(name))}</loc>"
            f"<lastmod>{_w3c(resource.lastmod)}</lastmod><rs:md {md}/></url>\n"
        )

    def _write_part(self, part: int) -> None:
        """One Resource List: section 10.1, plus the ``index`` link of section 10.2."""
        self.part_at[part] = self.at
        links = f'<rs:ln rel="up" href={quoteattr(self.capability_list)}/>\n'
        if self.mode == "index":
            links += f'<rs:ln rel="index" href={quoteattr(self.url(INDEX))}/>\n'
        names = sorted(n for n, r in self.resources.items() if r.part == part)
        text = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {NS}>\n{links}'
            f'<rs:md capability="resourcelist" at="{_w3c(self.at)}"/>\n'
            + "".join(self._entry(n) for n in names)
            + "</urlset>\n"
        )
        self._write(self.part_name(part), text.encode(), self.at)

    def _write_index(self) -> None:
        """The Resource List Index, section 10.2; unchanged parts keep their own ``at``."""
        sitemaps = "".join(
            f"<sitemap><loc>{escape(self.url(self.part_name(p)))}</loc>"
            f"<lastmod>{_w3c(self.part_at[p])}</lastmod>"
            f'<rs:md at="{_w3c(self.part_at[p])}"/></sitemap>\n'
            for p in range(self.parts)
        )
        text = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex {NS}>\n'
            f'<rs:ln rel="up" href={quoteattr(self.capability_list)}/>\n'
            f'<rs:md capability="resourcelist" at="{_w3c(self.at)}"/>\n'
            f"{sitemaps}</sitemapindex>\n"
        )
        self._write(INDEX, text.encode(), self.at)

    def _publish_lists(self, parts: Iterable[int]) -> set[str]:
        """Rewrite these parts, then the index (in index mode); returns what was rewritten."""
        rewritten = set()
        for part in sorted(set(parts)):
            self._write_part(part)
            rewritten.add(self.part_name(part))
        if self.mode == "index":
            self._write_index()
            rewritten.add(INDEX)
        return rewritten

    def publish(self, rng: random.Random, *, count: int = 24) -> None:
        """Write the Source Description, the Capability List, ``count`` resources and the lists."""
        self.clock += 60
        self.at = self.clock
        for i in range(count):
            name = f"base/{i:02d}{ODD[i % len(ODD)]}.txt"
            self._put(name, self._content(name, rng), i % self.parts)
        self._publish_lists(range(self.parts))
        capabilities = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {NS}>\n'
            f'<rs:ln rel="up" href={quoteattr(self.url(DESCRIPTION))}/>\n'
            '<rs:md capability="capabilitylist"/>\n'
            f"<url><loc>{escape(self.resource_list)}</loc>"
            '<rs:md capability="resourcelist"/></url>\n</urlset>\n'
        )
        self._write(CAPABILITY_LIST, capabilities.encode(), self.at)
        description = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {NS}>\n'
            '<rs:md capability="description"/>\n'
            f"<url><loc>{escape(self.capability_list)}</loc>"
            '<rs:md capability="capabilitylist"/></url>\n</urlset>\n'
        )
        self._write(DESCRIPTION, description.encode(), self.at)

    def _content(self, name: str, rng: random.Random, *, like: bytes | None = None) -> bytes:
        """New content for ``name``; with ``like``, different bytes of the same length."""
        text = f"{name} as of round {self.rounds}: {rng.getrandbits(64):016x}\n".encode()
        if like is None:
            return text * rng.randint(1, 4)
        fresh = (text * (len(like) // len(text) + 1))[: len(like)]
        if fresh == like:  # vanishingly unlikely; still, an update must change the bytes
            fresh = bytes([like[0] ^ 1]) + like[1:]
        return fresh

    def round(
        self, rng: random.Random, *, creates: int = 3, updates: int = 3, deletes: int = 2
    ) -> Round:
        """Create, update and delete resources, then rewrite the lists that changed."""
        self.rounds += 1
        self.clock += 60
        self.at = self.clock
        kind = ROUND_KINDS[(self.rounds - 1) % len(ROUND_KINDS)] if self.mode == "index" else "list"
        done = Round(kind)
        home = rng.randrange(self.parts)
        if kind in ("one-part", "move"):
            candidates = sorted(n for n, r in self.resources.items() if r.part == home)
        else:
            candidates = sorted(self.resources)
        rng.shuffle(candidates)
        doomed = candidates[:deletes]
        touched = candidates[deletes : deletes + updates]
        changed_parts = {self.resources[n].part for n in doomed + touched}
        for number, name in enumerate(touched):
            old = self.resources[name]
            data = self._content(name, rng, like=old.data if number % 2 == 0 else None)
            self._put(name, data, old.part)
            done.updated.add(self.loc(name))
        for _ in range(creates):
            self._created += 1
            name = f"r{self.rounds:02d}/new{self._created:03d}{ODD[self._created % len(ODD)]}.txt"
            part = home if kind in ("one-part", "move") else rng.randrange(self.parts)
            self._put(name, self._content(name, rng), part)
            changed_parts.add(part)
            done.created.add(self.loc(name))
        if kind == "move":
            target = (home + 1 + rng.randrange(self.parts - 1)) % self.parts
            still = [n for n in candidates[deletes + updates :]]
            for name in [*still[:1], *touched[:1]]:  # one as it is, one just updated
                self.resources[name].part = target
                done.moved.add(self.loc(name))
            changed_parts.add(target)
        gone = [(name, self.resources.pop(name)) for name in doomed]
        done.deleted = {self.loc(name) for name, _ in gone}
        done.rewritten = self._publish_lists(changed_parts)
        for name, _ in gone:
            (self.root / "res" / name).unlink()
        return done

    # -- what a mirror must hold ---------------------------------------------

    def expected_tree(self) -> dict[str, str]:
        """loc -> SHA-256 of every resource the Source lists now."""
        return {self.loc(n): hashlib.sha256(r.data).hexdigest() for n, r in self.resources.items()}

    def differences(self, mirror: Path) -> list[str]:
        """How ``mirror`` differs from the Source by SHA-256 (empty: equal)."""
        return sorted(tree_differences(self.expected_tree(), mirror))

    def listed(self) -> dict[str, int]:
        """loc -> 0-based part, as the lists now say."""
        return {self.loc(n): r.part for n, r in self.resources.items()}


_REQUEST = re.compile(r'"GET (\S+) HTTP/1\.[01]" (\d{3})')


def requests(server: HttpServer | Nginx) -> list[tuple[str, int]]:
    """Every GET the server logged so far: (decoded path without the leading ``/``, status).

    ``python -m http.server`` logs ``"GET /path HTTP/1.1" 304 -`` on stderr,
    the Nginx fixture ``"GET /path HTTP/1.1" 304 …`` in its access log; the
    path is percent-decoded, so whatever encoding the client chose compares
    equal to :meth:`ResourceListSource.loc`'s.
    """
    text = "\n".join(server.requests()) if isinstance(server, Nginx) else server.log_text()
    return [(unquote(m.group(1)).lstrip("/"), int(m.group(2))) for m in _REQUEST.finditer(text)]
