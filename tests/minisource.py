"""A minimal ResourceSync Source for tests, written from Z39.99 alone.

One Capability List with a Resource List (a snapshot at ``at``) and one
Change List that every :meth:`Source.change` appends to, served by aiohttp on
a free loopback port, counting every request per path.  Tests change the
Source, then send (or forge) the notifications a publisher would.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web

from rsnotify import sitemap, w3cdt
from rsnotify.collection import collection_id
from rsnotify.model import Capability, ChangeType, Entry, Link, Root, make_document
from rsnotify.subscriber.mirror import TEMP_PREFIX, path_for
from tests.devstack import free_port


def fixity(data: bytes) -> str:
    return f"md5:{hashlib.md5(data).hexdigest()} sha-256:{hashlib.sha256(data).hexdigest()}"


class Source:
    """A minimal ResourceSync Source: one Capability List, a Resource List, one Change List."""

    def __init__(self) -> None:
        self.base = ""
        self.files: dict[str, bytes] = {}
        self.changes: list[Entry] = []
        self.hits: Counter[str] = Counter()
        # path -> an Event requests for it wait for (counted in hits first): a slow Source.
        self.gates: dict[str, asyncio.Event] = {}
        self.initial: dict[str, bytes] = {}  # the Resource List's snapshot at self.at
        self.at = w3cdt.now() - timedelta(minutes=5)
        self.capability_links: list[Link] = []  # document-level rs:ln of the Capability List
        self._runner: web.AppRunner | None = None

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    @property
    def capability_list(self) -> str:
        return self.url("capabilitylist.xml")

    @property
    def changelist(self) -> str:
        return self.url("changelist.xml")

    @property
    def collection(self) -> str:
        return collection_id(self.capability_list)

    def change(self, name: str, data: bytes | None) -> Entry:
        """Change ``r/<name>`` at the Source (None deletes it) and list it in the Change List."""
        when = max([self.at, *(e.datetime for e in self.changes if e.datetime)])
        when = max(when + timedelta(milliseconds=1), w3cdt.now())
        loc = self.url(f"r/{name}")
        if data is None:
            self.files.pop(name)
            entry = Entry(loc=loc, change=ChangeType.DELETED, datetime=when, lastmod=when)
        else:
            kind = ChangeType.UPDATED if name in self.files else ChangeType.CREATED
            self.files[name] = data
            entry = Entry(
                loc=loc,
                change=kind,
                datetime=when,
                lastmod=when,
                hash=fixity(data),
                length=len(data),
            )
        self.changes.append(entry)
        return entry

    def _documents(self) -> dict[str, bytes]:
        description = make_document(
            Root.URLSET,
            Capability.DESCRIPTION,
            entries=[Entry(loc=self.capability_list, capability=Capability.CAPABILITYLIST)],
        )
        capabilities = make_document(
            Root.URLSET,
            Capability.CAPABILITYLIST,
            links=list(self.capability_links),
            entries=[
                Entry(loc=self.url("resourcelist.xml"), capability=Capability.RESOURCELIST),
                Entry(loc=self.changelist, capability=Capability.CHANGELIST),
            ],
        )
        resources = make_document(
            Root.URLSET,
            Capability.RESOURCELIST,
            at=self.at,
            entries=[
                Entry(loc=self.url(f"r/{n}"), hash=fixity(d), length=len(d))
                for n, d in sorted(self.initial.items())
            ],
        )
        changes = make_document(
            Root.URLSET, Capability.CHANGELIST, from_=self.at, entries=list(self.changes)
        )
        return {
            "/.well-known/resourcesync": sitemap.serialize(description),
            "/capabilitylist.xml": sitemap.serialize(capabilities),
            "/resourcelist.xml": sitemap.serialize(resources),
            "/changelist.xml": sitemap.serialize(changes),
        }

    async def _handle(self, request: web.Request) -> web.Response:
        self.hits[request.path] += 1
        gate = self.gates.get(request.path)
        if gate is not None:
            await gate.wait()
        document = self._documents().get(request.path)
        if document is not None:
            return web.Response(body=document, content_type="application/xml")
        if request.path.startswith("/r/") and request.path[3:] in self.files:
            return web.Response(body=self.files[request.path[3:]])
        return web.Response(status=404)

    async def start(self, files: dict[str, bytes]) -> str:
        self.files = dict(files)
        self.initial = dict(files)
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.base = f"http://127.0.0.1:{port}/"
        return self.base

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def notification(
    source: Source, seq: int, loc: str, change: str, when: datetime, **extra: Any
) -> dict[str, Any]:
    return {
        "v": 1,
        "collection": source.collection,
        "seq": seq,
        "capabilitylist": source.capability_list,
        "changelist": source.changelist,
        "loc": loc,
        "change": change,
        "datetime": w3cdt.format(when),
        **extra,
    }


class HoldingSource(Source):
    """A Source whose resources matching ``holds`` (a URL path) answer only while ``open`` is set.

    ``open`` starts set unless ``opened=False``: a test holds the answers back
    (its fetches hang) and releases them when it says so.
    """

    def __init__(
        self,
        holds: Callable[[str], bool] = lambda path: path.startswith("/r/"),
        *,
        opened: bool = True,
    ) -> None:
        super().__init__()
        self.holds = holds
        self.open = asyncio.Event()
        if opened:
            self.open.set()

    async def _handle(self, request: web.Request) -> web.Response:
        if self.holds(request.path):
            await self.open.wait()
        return await super()._handle(request)


def of_entry(source: Source, seq: int, entry: Entry) -> bytes:
    """The genuine notification of a Change List entry, as a publisher would send it."""
    assert entry.change is not None and entry.datetime is not None
    extra: dict[str, Any] = {}
    if entry.hash:
        extra.update(hash=entry.hash, length=entry.length)
    return json.dumps(
        notification(source, seq, entry.loc, entry.change.value, entry.datetime, **extra)
    ).encode()


def differences(source: Source, mirror: Path) -> list[str]:
    """How ``mirror`` differs from the Source's current files (empty: equal)."""
    expected = {
        path_for(source.url(f"r/{n}"), mirror): hashlib.sha256(d).hexdigest()
        for n, d in source.files.items()
    }
    found = {p for p in mirror.rglob("*") if p.is_file() and not p.name.startswith(TEMP_PREFIX)}
    out = [f"missing {p}" for p in expected.keys() - found]
    out += [f"extra {p}" for p in found - expected.keys()]
    out += [
        f"differs {p}"
        for p in found & expected.keys()
        if hashlib.sha256(p.read_bytes()).hexdigest() != expected[p]
    ]
    return out
