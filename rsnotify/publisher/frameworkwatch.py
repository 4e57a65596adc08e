"""Detection of framework changes for one collection (Framework Notification 1.0.1).

A framework notification says that a capability document changed: a new
Resource List, an updated Change List, a new Resource Dump (section 3).
:class:`FrameworkWatcher` finds those changes for one Capability List; the
publisher logs them in the collection's framework stream and its WebSub hub
delivers them on the collection's framework topic (:mod:`rsnotify.framework`).

What a check reads, and what it costs
    One conditional GET of the Capability List and one of each capability
    document it advertises that we watch: the Resource List (or Resource List
    Index), the Resource Dump and the Change Dump.  An unchanged Source
    answers ``304`` to each (a directory Source: a ``stat``).  A document is
    parsed and hashed only when it comes back changed; for a Resource List
    that is when the Source regenerated it, typically once a day.  The Change
    Lists cost nothing more: the collection's
    :class:`~rsnotify.changes.watcher.CollectionWatcher` already reads the
    Change List Index and the lists on every poll, and tells us which lists
    it saw and which held new entries.  A collection without Change Lists
    (its changes derived from Resource List snapshots, issue 23) has no
    such watcher (``changes=None``): its framework is the Resource List and
    the Dumps alone.

What becomes a framework change (Table 2 as :mod:`rsnotify.framework` reads it)
    * a document whose bytes changed: ``updated`` (a Resource Dump:
      ``created``, a changed Resource Dump is a new one), ``datetime`` = its
      ``at`` (else ``completed``, else ``until``);
    * a document newly advertised in the Capability List: ``created``;
    * under an index (a Resource List Index, say) the notification is about
      the newest component that is new or changed, with ``rs:ln
      rel="index"`` to the index, never about the index itself (section 2);
    * a Change List newly named by the Change List Index: ``changelist
      created``; one that held new entries since the last check:
      ``changelist updated``, dated by its last new entry, at most one per
      list per check (rel ``index`` when there is an index).
    A document that is no longer advertised is forgotten without a
    notification (Table 2 has no deletion for these capabilities).

State
    What was last seen (validators, digests, an index's components, the
    Change Lists known, when the last framework change was detected) is the
    framework stream's checkpoint in the log, written with the records in
    one step: a restarted or newly elected publisher reports what changed
    while it was away, exactly once.  The very first check only records.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import cast

from .. import sitemap, w3cdt
from ..changes.access import DocumentAccess
from ..changes.watcher import CollectionWatcher
from ..errors import DocumentError, FetchError, InvalidDocument
from ..framework import FrameworkChange
from ..model import Capability, CapabilityList, ChangeType, Entry, Root
from ..tracker import ListRef

log = logging.getLogger("rsnotify.publish")

#: The capability documents read by URL (Change Lists come from the CollectionWatcher).
WATCHED = (Capability.RESOURCELIST, Capability.RESOURCEDUMP, Capability.CHANGEDUMP)


@dataclass(slots=True)
class DocumentState:
    """What was last seen of one capability document."""

    url: str
    etag: str | None = None
    last_modified: str | None = None
    digest: str | None = None  # sha-256 of the body last read
    # An index: component loc -> (fingerprint, its time as W3C text or "").
    components: dict[str, tuple[str, str]] = field(default_factory=dict)


@dataclass(slots=True)
class FrameworkState:
    """The framework stream's checkpoint: everything a check compares with."""

    started: bool = False  # the first check ever only records
    capability_etag: str | None = None
    capability_last_modified: str | None = None
    advertised: dict[str, str] = field(default_factory=dict)  # watched capability -> URL
    documents: dict[str, DocumentState] = field(default_factory=dict)  # capability -> state
    changelists: list[str] | None = None  # the Change Lists known (None: none seen yet)
    last_detected: datetime | None = None  # the interval chain's last ``until``

    def to_json(self) -> str:
        obj = {
            "v": 1,
            "started": self.started,
            "capability_etag": self.capability_etag,
            "capability_last_modified": self.capability_last_modified,
            "advertised": self.advertised,
            "documents": {
                cap: {
                    "url": d.url,
                    "etag": d.etag,
                    "last_modified": d.last_modified,
                    "digest": d.digest,
                    "components": {loc: list(v) for loc, v in d.components.items()},
                }
                for cap, d in self.documents.items()
            },
            "changelists": self.changelists,
            "last_detected": w3cdt.format(self.last_detected) if self.last_detected else None,
        }
        return json.dumps(obj, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> FrameworkState:
        if not text:
            return cls()
        obj = json.loads(text)
        documents = {
            cap: DocumentState(
                url=d["url"],
                etag=d.get("etag"),
                last_modified=d.get("last_modified"),
                digest=d.get("digest"),
                components={loc: (v[0], v[1]) for loc, v in (d.get("components") or {}).items()},
            )
            for cap, d in (obj.get("documents") or {}).items()
        }
        detected = obj.get("last_detected")
        return cls(
            started=bool(obj.get("started")),
            capability_etag=obj.get("capability_etag"),
            capability_last_modified=obj.get("capability_last_modified"),
            advertised=dict(obj.get("advertised") or {}),
            documents=documents,
            changelists=obj.get("changelists"),
            last_detected=w3cdt.parse(detected) if detected else None,
        )

    def copy(self) -> FrameworkState:
        return FrameworkState.from_json(self.to_json())


# --- the rules (pure) ------------------------------------------------------------------


def _time_of(entry: Entry) -> datetime | None:
    return entry.at or entry.completed or entry.until or entry.lastmod


def _fingerprint(entry: Entry) -> tuple[str, str]:
    when = _time_of(entry)
    times = (entry.at, entry.completed, entry.from_, entry.until, entry.lastmod)
    parts = [w3cdt.format(t) if t else "" for t in times]
    parts += [entry.hash or "", str(entry.length or "")]
    return "|".join(parts), w3cdt.format(when) if when else ""


def _change_type(capability: str, created: bool) -> ChangeType:
    if created or capability == Capability.RESOURCEDUMP:
        return ChangeType.CREATED  # Table 2: a Resource Dump is only ever created
    return ChangeType.UPDATED


def examine(
    capability: str,
    url: str,
    body: bytes,
    previous: DocumentState | None,
    *,
    report: bool,
    limits: sitemap.Limits = sitemap.DEFAULT_LIMITS,
) -> tuple[DocumentState, FrameworkChange | None]:
    """What a fresh read of a capability document means (validators are the caller's).

    ``previous`` is what was seen of the same URL (None: never seen, so a
    change is ``created``); with ``report`` False (the first check) nothing
    is reported, only recorded.
    """
    state = DocumentState(url=url, digest=hashlib.sha256(body).hexdigest())
    if previous is not None and previous.digest == state.digest:
        state.components = previous.components
        return state, None
    reader = sitemap.DocumentReader(body, limits=limits)
    header = reader.header
    if header.capability != capability:
        raise InvalidDocument(
            f"{url} is advertised as a {capability} but says capability={header.capability!r}"
        )
    if header.root is Root.SITEMAPINDEX:
        state.components = {entry.loc: _fingerprint(entry) for entry in reader}
        known = previous.components if previous is not None else {}
        fresh = [
            (when, loc)
            for loc, (fingerprint, when) in state.components.items()
            if known.get(loc, ("", ""))[0] != fingerprint
        ]
        if not report or not fresh:
            return state, None
        when, loc = max(fresh)  # W3C UTC text sorts in time order; undated first
        dated = w3cdt.parse(when) if when else header.at or header.completed
        change = FrameworkChange(
            loc=loc,
            capability=capability,
            change=_change_type(capability, loc not in known),
            datetime=dated,
            index=url,
        )
        return state, change
    if not report:
        return state, None
    change = FrameworkChange(
        loc=url,
        capability=capability,
        change=_change_type(capability, previous is None),
        datetime=header.at or header.completed or header.until,
    )
    return state, change


def changelist_changes(
    known: list[str] | None,
    refs: Sequence[ListRef],
    index: str | None,
    updated: Mapping[str, datetime | None],
) -> list[FrameworkChange]:
    """Change Lists named for the first time (``created``) or holding new entries
    (``updated``), in the index's order; nothing when nothing was known before."""
    if known is None:
        return []
    old = set(known)
    out = []
    for ref in refs:
        if ref.url not in old:
            when = updated.get(ref.url) or ref.from_
            out.append(FrameworkChange(ref.url, Capability.CHANGELIST, ChangeType.CREATED, when))
        elif ref.url in updated:
            out.append(
                FrameworkChange(
                    ref.url, Capability.CHANGELIST, ChangeType.UPDATED, updated[ref.url]
                )
            )
    for change in out:
        change.index = index
    return out


def stamp(
    changes: Sequence[FrameworkChange], now: datetime, last: datetime | None
) -> datetime | None:
    """Date the changes of one check (``detected``, ``since``) so intervals chain.

    Detection time never goes back, even across publishers whose clocks
    differ: it is at least the last one logged.  Returns the new last.
    """
    if not changes:
        return last
    detected = max(now, last) if last is not None else now
    previous = last
    for change in changes:
        change.detected, change.since = detected, previous
        previous = detected
    return detected


# --- the watcher (I/O) ------------------------------------------------------------------


class FrameworkWatcher:
    """Finds the framework changes of one Capability List (see the module docstring)."""

    def __init__(
        self,
        *,
        access: DocumentAccess,
        collection: str,
        capability_list: str,
        changes: CollectionWatcher | None,
        state: FrameworkState | None = None,
        limits: sitemap.Limits = sitemap.DEFAULT_LIMITS,
    ) -> None:
        self.access = access
        self.collection = collection
        self.capability_list = capability_list
        self.changes = changes
        self.state = state or FrameworkState()
        self.limits = limits
        #: Change Lists that held new entries since the last committed check,
        #: with their last new entry's time (fed by the publisher as it logs).
        self.updated: dict[str, datetime | None] = {}
        self._pending: dict[str, datetime | None] = {}
        self._failing: set[str] = set()  # documents whose last read failed (warned once)

    def note_entries(self, changelist: str, last: datetime | None) -> None:
        """The publisher logged new entries of ``changelist``, the last dated ``last``."""
        before = self.updated.get(changelist)
        self.updated[changelist] = max(before, last) if before and last else last or before

    async def check(self, now: datetime) -> tuple[FrameworkState, list[FrameworkChange]]:
        """Read what changed; returns the state to commit and the changes (stamped).

        Raises FetchError / DocumentError when the Capability List cannot be
        read; a capability document that cannot be read is skipped this time.
        """
        state = self.state.copy()
        report = state.started
        await self._read_capability_list(state)
        found: list[FrameworkChange] = []
        for capability in list(state.documents):
            if capability not in state.advertised:
                log.info("%s: %s no longer advertised", self.collection, capability)
                del state.documents[capability]
        for capability, url in state.advertised.items():
            change = await self._read_document(state, capability, url, report)
            if change is not None:
                found.append(change)
        self._pending = dict(self.updated)
        refs = self.changes.list_refs() if self.changes is not None else []
        if refs:
            assert self.changes is not None
            found += changelist_changes(
                state.changelists if report else None, refs, self.changes.index_url, self._pending
            )
            state.changelists = [ref.url for ref in refs]
        state.started = True
        state.last_detected = stamp(found, now, state.last_detected)
        return state, found

    def commit(self, state: FrameworkState) -> None:
        """The changes of the last check are logged with ``state``."""
        self.state = state
        for url, when in self._pending.items():
            if self.updated.get(url) == when:
                del self.updated[url]
        self._pending = {}

    async def _read_capability_list(self, state: FrameworkState) -> None:
        fetched = await self.access.read(
            self.capability_list,
            etag=state.capability_etag,
            last_modified=state.capability_last_modified,
        )
        if fetched.not_modified:
            return
        document = await asyncio.to_thread(sitemap.parse, fetched.body)
        if document.capability != Capability.CAPABILITYLIST:
            raise InvalidDocument(f"{self.capability_list} is not a Capability List")
        capabilities = cast(CapabilityList, document).capabilities  # capability checked above
        state.advertised = {c.value: capabilities[c] for c in WATCHED if c in capabilities}
        state.capability_etag, state.capability_last_modified = (
            fetched.etag,
            fetched.last_modified,
        )

    async def _read_document(
        self, state: FrameworkState, capability: str, url: str, report: bool
    ) -> FrameworkChange | None:
        previous = state.documents.get(capability)
        if previous is not None and previous.url != url:
            previous = None  # another document now: a new one
        try:
            fetched = await self.access.read(
                url,
                etag=previous.etag if previous else None,
                last_modified=previous.last_modified if previous else None,
            )
            if fetched.not_modified:
                return None
            fresh, change = await asyncio.to_thread(
                examine, capability, url, fetched.body, previous, report=report, limits=self.limits
            )
        except (FetchError, DocumentError) as exc:
            level = logging.DEBUG if url in self._failing else logging.WARNING
            self._failing.add(url)
            log.log(level, "%s: cannot read the %s %s: %s", self.collection, capability, url, exc)
            return None
        self._failing.discard(url)
        state.documents[capability] = replace(
            fresh, etag=fetched.etag, last_modified=fetched.last_modified
        )
        return change
