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

A test that needs exact contents and dates changes the Source itself:
:meth:`~ResourceListSource.put` (with a chosen ``<lastmod>``, which a Source
may date inside the interval, before it or after it) and
:meth:`~ResourceListSource.delete`, then :meth:`~ResourceListSource.commit`,
which rewrites the lists those touched as :meth:`round` does;
:meth:`~ResourceListSource.rewrite_unchanged` regenerates every list to the
same bytes with a new file time (a Source with nothing new that writes its
lists anyway); :meth:`~ResourceListSource.snapshot` is what the lists say at
a moment, for a test to compare two of them.

Time is a virtual clock a day in the past, ``step`` seconds per round (a
minute unless told), in whole seconds: ``at``, the default ``<lastmod>`` and
the files' modification times come from it.
``python -m http.server`` sends ``Last-Modified`` in whole seconds and no ETag;
a date written in the same second as it is served is weak (RFC 9110 section
8.8.2.2) and a correct client must not trust it, so with real time whether a
part is re-fetched would depend on timing.  With dates well before the
response's ``Date`` every validator is usable and a test can assert exactly
which documents were fetched (:func:`requests`).  Dates strictly increase
round over round, so no change ever hides behind an unchanged date.

Every file is written atomically (temporary file in the same directory,
modification time set, ``os.replace``), resources before the lists that name
them (:meth:`put` writes the file, the next :meth:`commit` lists it), lists
before the index, and deleted files removed only once no list names them
(:meth:`delete` unlists, the next :meth:`commit` removes): a Destination
reading at any moment sees a list whose entries exist (it may see the index
of the last round with a part of this one, as with any Source that does not
version its parts).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import time
from dataclasses import dataclass, field, replace
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
    "Resource",
    "ResourceListSource",
    "Round",
    "Snapshot",
    "requests",
    "w3c",
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


def w3c(seconds: int) -> str:
    """A W3C datetime in UTC, whole seconds, as the lists write it."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fixity(data: bytes) -> str:
    return f"md5:{hashlib.md5(data).hexdigest()} sha-256:{hashlib.sha256(data).hexdigest()}"


@dataclass(frozen=True, slots=True)
class Resource:
    """One resource as the lists list it (frozen: a :class:`Snapshot` keeps it as it was)."""

    data: bytes
    lastmod: int  # virtual POSIX seconds
    part: int  # 0-based; always 0 in list mode


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the lists say at one moment: their ``at`` and every resource, by name under res/."""

    at: int
    resources: dict[str, Resource]


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
        self,
        root: Path,
        base: str,
        *,
        mode: Mode = "list",
        hashes: bool = True,
        parts: int = 3,
        step: int = 60,
    ) -> None:
        self.root = root
        self.base = base.rstrip("/") + "/"
        self.mode: Mode = mode
        self.hashes = hashes
        self.parts = parts if mode == "index" else 1
        self.resources: dict[str, Resource] = {}  # name under res/ -> state
        self.clock = int(time.time()) - 86_400  # virtual seconds, see the module docstring
        self.step = step  # virtual seconds from one round's 'at' to the next
        self.at = 0
        self.part_at: list[int] = [0] * self.parts
        self.rounds = 0
        self._created = 0
        self._dirty: set[int] = set(range(self.parts))  # parts to rewrite at the next commit
        self._doomed: set[str] = set()  # unlisted at the next commit, then removed
        self._described = False  # Source Description and Capability List written
        self._listed = Snapshot(0, {})  # what the lists say, as of the last commit

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

    def put(self, name: str, data: bytes, *, lastmod: int | None = None, part: int = 0) -> None:
        """Write ``res/<name>`` now; the next :meth:`commit` lists it.

        ``lastmod`` defaults to the clock; a resource already listed stays in
        its part, a new one goes to ``part``.
        """
        old = self.resources.get(name)
        home = old.part if old is not None else part
        when = self.clock if lastmod is None else lastmod
        self._write("res/" + name, data, self.clock)
        self.resources[name] = Resource(data, when, home)
        self._doomed.discard(name)
        self._dirty.add(home)

    def delete(self, name: str) -> None:
        """Unlist ``res/<name>`` at the next :meth:`commit`, which then removes the file."""
        self._dirty.add(self.resources.pop(name).part)
        self._doomed.add(name)

    def _move(self, name: str, part: int) -> None:
        """List ``res/<name>`` in another part from the next commit, unchanged."""
        self._dirty.update((self.resources[name].part, part))
        self.resources[name] = replace(self.resources[name], part=part)

    def _part_document(self, part: int) -> bytes:
        """One Resource List: section 10.1, plus the ``index`` link of section 10.2."""
        links = f'<rs:ln rel="up" href={quoteattr(self.capability_list)}/>\n'
        if self.mode == "index":
            links += f'<rs:ln rel="index" href={quoteattr(self.url(INDEX))}/>\n'
        names = sorted(n for n, r in self.resources.items() if r.part == part)
        text = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {NS}>\n{links}'
            f'<rs:md capability="resourcelist" at="{w3c(self.part_at[part])}"/>\n'
            + "".join(self._entry(n) for n in names)
            + "</urlset>\n"
        )
        return text.encode()

    def _entry(self, name: str) -> str:
        resource = self.resources[name]
        md = f'length="{len(resource.data)}" type="text/plain"'
        if self.hashes:
            md = f'hash="{_fixity(resource.data)}" ' + md
        return (
            f"<url><loc>{escape(self.loc(name))}</loc>"
            f"<lastmod>{w3c(resource.lastmod)}</lastmod><rs:md {md}/></url>\n"
        )

    def _index_document(self) -> bytes:
        """The Resource List Index, section 10.2; unchanged parts keep their own ``at``."""
        sitemaps = "".join(
            f"<sitemap><loc>{escape(self.url(self.part_name(p)))}</loc>"
            f"<lastmod>{w3c(self.part_at[p])}</lastmod>"
            f'<rs:md at="{w3c(self.part_at[p])}"/></sitemap>\n'
            for p in range(self.parts)
        )
        text = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex {NS}>\n'
            f'<rs:ln rel="up" href={quoteattr(self.capability_list)}/>\n'
            f'<rs:md capability="resourcelist" at="{w3c(self.at)}"/>\n'
            f"{sitemaps}</sitemapindex>\n"
        )
        return text.encode()

    def _describe(self) -> None:
        """The Capability List (one capability, ``resourcelist``) and the Source Description."""
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
        self._described = True

    def _tick(self) -> None:
        """The next round's ``at``: one step on, strictly later than any file time written."""
        self.clock += self.step
        self.at = self.clock

    def _publish_lists(self) -> set[str]:
        """Rewrite the parts that changed, then the index; then remove what was deleted.

        The parts are those :meth:`put`, :meth:`delete` and a move touched
        (every part, the first time, and then the Capability List and Source
        Description too).  Returns the list documents rewritten.
        """
        rewritten = set()
        for part in sorted(self._dirty):
            self.part_at[part] = self.at
            self._write(self.part_name(part), self._part_document(part), self.at)
            rewritten.add(self.part_name(part))
        if self.mode == "index":
            self._write(INDEX, self._index_document(), self.at)
            rewritten.add(INDEX)
        if not self._described:
            self._describe()
        for name in sorted(self._doomed):
            (self.root / "res" / name).unlink()
        self._dirty, self._doomed = set(), set()
        self._listed = Snapshot(self.at, dict(self.resources))
        return rewritten

    def commit(self) -> set[str]:
        """A new round of the lists, ``step`` after the last, with what was put and deleted.

        Returns the list documents rewritten (the index, and the parts that changed).
        """
        self._tick()
        return self._publish_lists()

    def rewrite_unchanged(self) -> None:
        """Regenerate every list as it is: the same bytes, a new file time (and no new ``at``).

        The clock moves a step, so the next :meth:`commit`'s ``at`` is a step
        later than this file time (its Last-Modified never equals this one).
        """
        assert not self._dirty, "rewrite_unchanged with changes not committed"
        self.clock += self.step
        for part in range(self.parts):
            self._write(self.part_name(part), self._part_document(part), self.clock)
        if self.mode == "index":
            self._write(INDEX, self._index_document(), self.clock)

    def snapshot(self) -> Snapshot:
        """What the lists say now: as of the last commit, round or publish, not since."""
        return self._listed

    def publish(self, rng: random.Random, *, count: int = 24) -> None:
        """Write the Source Description, the Capability List, ``count`` resources and the lists."""
        self._tick()
        for i in range(count):
            name = f"base/{i:02d}{ODD[i % len(ODD)]}.txt"
            self.put(name, self._content(name, rng), part=i % self.parts)
        self._publish_lists()

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
        self._tick()
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
        for number, name in enumerate(touched):
            old = self.resources[name].data
            self.put(name, self._content(name, rng, like=old if number % 2 == 0 else None))
            done.updated.add(self.loc(name))
        for _ in range(creates):
            self._created += 1
            name = f"r{self.rounds:02d}/new{self._created:03d}{ODD[self._created % len(ODD)]}.txt"
            part = home if kind in ("one-part", "move") else rng.randrange(self.parts)
            self.put(name, self._content(name, rng), part=part)
            done.created.add(self.loc(name))
        if kind == "move":
            target = (home + 1 + rng.randrange(self.parts - 1)) % self.parts
            still = [n for n in candidates[deletes + updates :]]
            for name in [*still[:1], *touched[:1]]:  # one as it is, one just updated
                self._move(name, target)
                done.moved.add(self.loc(name))
        for name in doomed:
            self.delete(name)
            done.deleted.add(self.loc(name))
        done.rewritten = self._publish_lists()
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
