"""The simulated Source: a pure, deterministic state machine.

Everything the simulator publishes is derived from this object, and it does no
I/O and never reads a clock: every operation that needs the time is handed
``now``.  Given the same seed, options and sequence of ``now`` values, it makes
exactly the same changes, so tests can predict it and the HTTP layer
(:mod:`rsnotify.simulator.server`) stays a thin adapter.

Model
-----
A Source has one or more *collections* (``c1``, ``c2``...), each with its own
Capability List, Resource List, Change List Index and Change Lists.  A
collection starts with ``resources`` resources, all at version 1 and last
modified at ``start``; the initial Resource List is the baseline and every
later change goes into a Change List.

Each change picks a collection uniformly, then a kind by :class:`Weights`:

* ``created`` makes a new resource (``r000123.txt``) or, with probability
  ``resurrect``, re-creates one deleted earlier, so Destinations meet the
  delete-then-create sequence for one URI;
* ``updated`` bumps the version of a live resource;
* ``deleted`` removes a live resource.

When a collection has no live resource, ``updated`` and ``deleted`` fall back
to ``created``.  Content is :func:`rsnotify.simulator.payload.body` of
(seed, loc, version), so its hash and length are known without storing it.

Time
----
Change datetimes strictly increase across the whole Source with microsecond
precision: a change gets ``max(now, previous + 1 us)``, so two changes never
share a datetime even when the clock does not move between them, and the
(loc, datetime) pair the specification uses to locate an entry is unique.  A
Resource List snapshot takes ``at = max(now, previous)`` and raises the floor
to it, so every change after the snapshot is strictly later than ``at``: a
Destination that baselines from the Resource List and then applies changes
with ``datetime > at`` converges exactly.

Change Lists
------------
Each collection has one open Change List.  When it reaches ``changelist_size``
entries it is closed with ``until`` equal to its last entry's datetime, and a
new open list starts ``from`` that same instant; so the lists are contiguous
(``until`` of one is ``from`` of the next) and every entry lies inside its
list's interval.  Closed lists never change.  The Change List Index lists them
in forward chronological order, closed ones with ``until`` and a ``lastmod``
equal to it (section 12.2), the open one with ``from`` only.

Spec versions
-------------
``spec_version="1.1"`` (the default) writes both ``rs:md datetime`` and
``<lastmod>`` on Change List entries; ``"1.0"`` writes only ``<lastmod>``.
The reference client ``resync`` 2.0.1 defaults to 1.1 and, in that mode,
refuses an incremental sync over entries without ``datetime``, while 1.0
readers only look at ``<lastmod>``: writing both serves both.

Why one module of ~700 lines: it is one deterministic state machine.  The
change generator and the document builders read and move the same state (the
collections, the one random generator, the datetime floor, the open Change
Lists), and the guarantees above -- same seed, same changes; strictly
increasing datetimes; contiguous Change Lists; a snapshot that every later
change is after -- each span both sides.  Resource content is
:mod:`.payload`; turning the documents into served bytes is :mod:`.site`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

from .. import w3cdt
from ..collection import collection_id
from ..envelope import FRAMEWORK_CAPABILITY, NOTIFICATION_CAPABILITY
from ..errors import SimulatorError as SimulatorError  # re-exported: its old home
from ..framework import TOPIC_SUFFIX as FRAMEWORK_TOPIC_SUFFIX  # rsnotify's hub: <topic>/framework
from ..model import (
    CHANNEL_REL,
    Capability,
    ChangeType,
    Document,
    Entry,
    Link,
    Root,
    make_document,
)
from . import payload
from .payload import Fixity

MICROSECOND = timedelta(microseconds=1)
SPEC_VERSIONS = ("1.0", "1.1")
DEFAULT_CHANGELIST_SIZE = 1000
MAX_COLLECTIONS = 1000


# --- configuration values ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Weights:
    """Relative frequency of created / updated / deleted changes.

    The default 1:3:1 keeps the number of live resources roughly stable while
    most changes are updates, which is what real repositories look like.
    """

    created: float = 1.0
    updated: float = 3.0
    deleted: float = 1.0

    def __post_init__(self) -> None:
        values = (self.created, self.updated, self.deleted)
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise SimulatorError(f"change weights must be finite and >= 0, got {values}")
        if sum(values) <= 0:
            raise SimulatorError("at least one change weight must be positive")

    @classmethod
    def parse(cls, text: str) -> Weights:
        """Read ``created=1,updated=3,deleted=1`` (names may be omitted: ``1,3,1``).

        Named weights that are left out keep their default.
        """
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise SimulatorError("empty change weights")
        names = ("created", "updated", "deleted")
        values: dict[str, float] = {}
        try:
            if all("=" not in p for p in parts):
                if len(parts) != 3:
                    raise SimulatorError(
                        f"give three weights (created,updated,deleted), got {text!r}"
                    )
                values = dict(zip(names, (float(p) for p in parts), strict=True))
            else:
                for part in parts:
                    key, sep, value = part.partition("=")
                    key = key.strip().lower()
                    if not sep or key not in names:
                        raise SimulatorError(
                            f"bad change weight {part!r}: use created=N,updated=N,deleted=N"
                        )
                    values[key] = float(value)
        except ValueError:
            raise SimulatorError(f"change weights must be numbers, got {text!r}") from None
        return cls(**values)

    def cumulative(self) -> tuple[float, float]:
        """Thresholds on ``random() * total`` for created and updated."""
        return (self.created, self.created + self.updated)

    @property
    def total(self) -> float:
        return self.created + self.updated + self.deleted


@dataclass(frozen=True, slots=True)
class Layout:
    """Where every document and resource lives: the one place the URL scheme is decided.

    ``base_url`` is the Source's root (``http://127.0.0.1:8080/``); the live
    server routes on the path part of each URL, so a base URL with a path
    prefix serves everything under that prefix.  Change List numbers are
    zero-padded because ``resync`` reads the lists of an index in *sorted URI*
    order, not document order; padding makes the two agree.
    """

    base_url: str

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SimulatorError(f"base URL must be an http(s) URL, got {self.base_url!r}")
        if not self.base_url.endswith("/"):
            object.__setattr__(self, "base_url", self.base_url + "/")

    @property
    def origin(self) -> str:
        parts = urlsplit(self.base_url)
        return f"{parts.scheme}://{parts.netloc}"

    def path(self, url: str) -> str:
        """The request path at which the live server answers for ``url``."""
        return url[len(self.origin) :]

    def source_description(self) -> str:
        return f"{self.base_url}.well-known/resourcesync"

    def capability_list(self, collection: str) -> str:
        return f"{self.base_url}{collection}/capabilitylist.xml"

    def resource_list(self, collection: str) -> str:
        return f"{self.base_url}{collection}/resourcelist.xml"

    def resource_list_part(self, collection: str, number: int) -> str:
        return f"{self.base_url}{collection}/resourcelist/{number:05d}.xml"

    def changelist_index(self, collection: str) -> str:
        return f"{self.base_url}{collection}/changelist.xml"

    def changelist(self, collection: str, number: int) -> str:
        return f"{self.base_url}{collection}/changes/{number:06d}.xml"

    def resource(self, collection: str, name: str) -> str:
        return f"{self.base_url}{collection}/resources/{name}"

    def changedump(self, collection: str) -> str:
        return f"{self.base_url}{collection}/changedump.xml"

    def changedump_package(self, collection: str, number: int) -> str:
        return f"{self.base_url}{collection}/changedump/{number:06d}.zip"


# --- state -------------------------------------------------------------------


@dataclass(slots=True)
class ResourceRecord:
    """Current state of one URI ever published in a collection (deleted ones included).

    ``previous_modified`` lets the HTTP layer tell whether a second-granularity
    ``Last-Modified`` identifies exactly one version (see server docs).
    """

    name: str
    loc: str
    version: int
    fixity: Fixity
    modified: datetime
    previous_modified: datetime | None = None
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class Change:
    """One Change List entry.  ``fixity`` is None for ``deleted``."""

    loc: str
    change: ChangeType
    datetime: datetime
    version: int
    fixity: Fixity | None


def hub_root(template: str) -> str:
    """The hub of a WebSub topic template: the URL up to its first placeholder."""
    if "{" in template:
        return template[: template.index("{")]
    parts = urlsplit(template)
    return f"{parts.scheme}://{parts.netloc}/"


@dataclass(slots=True)
class ChangeListState:
    """One Change List: its interval and entries (dropped by :meth:`Source.release`)."""

    number: int
    from_: datetime
    until: datetime | None = None
    changes: list[Change] = field(default_factory=list)
    count: int = 0
    released: bool = False

    @property
    def is_open(self) -> bool:
        return self.until is None

    @property
    def last_time(self) -> datetime:
        """When this list last changed: its last entry, else its ``from``."""
        if self.until is not None:
            return self.until
        return self.changes[-1].datetime if self.changes else self.from_


class _Bag:
    """A set with O(1) add, remove and uniform random choice (swap-remove list)."""

    __slots__ = ("_items", "_where")

    def __init__(self) -> None:
        self._items: list[str] = []
        self._where: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, item: str) -> bool:
        return item in self._where

    def add(self, item: str) -> None:
        if item not in self._where:
            self._where[item] = len(self._items)
            self._items.append(item)

    def remove(self, item: str) -> None:
        index = self._where.pop(item)
        last = self._items.pop()
        if index < len(self._items):
            self._items[index] = last
            self._where[last] = index

    def pick(self, rng: random.Random) -> str:
        return self._items[rng.randrange(len(self._items))]


class Collection:
    """One set of resources with its own Capability List and Change Lists."""

    def __init__(self, name: str, layout: Layout, start: datetime) -> None:
        self.name = name
        self.layout = layout
        self.capability_list_url = layout.capability_list(name)
        self.resources: dict[str, ResourceRecord] = {}
        self.live = _Bag()
        self.gone = _Bag()
        self.next_number = 1
        self.changelists: list[ChangeListState] = [ChangeListState(number=1, from_=start)]
        self.changes = 0
        self.last_change: datetime | None = None

    @property
    def open_changelist(self) -> ChangeListState:
        return self.changelists[-1]

    def new_name(self) -> str:
        name = f"r{self.next_number:06d}.txt"
        self.next_number += 1
        return name

    def state(self) -> dict[str, str]:
        """``{loc: sha-256 hex}`` of every live resource: the ground truth."""
        return {
            loc: record.fixity.sha256
            for loc, record in self.resources.items()
            if not record.deleted
        }

    def live_records(self) -> Iterator[ResourceRecord]:
        return (r for r in self.resources.values() if not r.deleted)


@dataclass(frozen=True, slots=True)
class Applied:
    """One change as it happened; ``closed`` is the Change List it filled up, if any."""

    collection: Collection
    change: Change
    closed: ChangeListState | None = None


# --- the Source ---------------------------------------------------------------


class Source:
    """A changing ResourceSync Source, one method call per event.

    See the module docstring for the model.  ``max_changes`` bounds the total
    number of changes :meth:`apply` will ever make (None: unbounded).
    """

    def __init__(
        self,
        *,
        layout: Layout,
        start: datetime,
        collections: int = 1,
        resources: int = 100,
        changelist_size: int = DEFAULT_CHANGELIST_SIZE,
        payload_bytes: int = 1024,
        seed: int = 0,
        weights: Weights | None = None,
        spec_version: str = "1.1",
        max_changes: int | None = None,
        resurrect: float = 0.25,
        hubs: Sequence[str] = (),
        large_every: int = 0,
        large_bytes: int = 0,
        change_dump: bool = False,
    ) -> None:
        if not 1 <= collections <= MAX_COLLECTIONS:
            raise SimulatorError(f"collections must be 1..{MAX_COLLECTIONS}, got {collections}")
        if resources < 0:
            raise SimulatorError(f"resources must be >= 0, got {resources}")
        if changelist_size < 1:
            raise SimulatorError(f"changelist size must be >= 1, got {changelist_size}")
        if not 0 <= payload_bytes <= payload.MAX_PAYLOAD_BYTES:
            raise SimulatorError(
                f"payload bytes must be 0..{payload.MAX_PAYLOAD_BYTES}, got {payload_bytes}"
            )
        if spec_version not in SPEC_VERSIONS:
            raise SimulatorError(f"spec version must be 1.0 or 1.1, got {spec_version!r}")
        if large_every < 0 or not 0 <= large_bytes <= payload.MAX_PAYLOAD_BYTES:
            raise SimulatorError(
                f"large resources: every must be >= 0 and bytes 0..{payload.MAX_PAYLOAD_BYTES}"
            )
        if max_changes is not None and max_changes < 0:
            raise SimulatorError(f"max changes must be >= 0, got {max_changes}")
        if not 0.0 <= resurrect <= 1.0:
            raise SimulatorError(f"resurrect probability must be in [0, 1], got {resurrect}")
        if start.tzinfo is None:
            raise SimulatorError("start must be an aware datetime")
        self.layout = layout
        self.start = start.astimezone(UTC)
        self.changelist_size = changelist_size
        self.payload_bytes = payload_bytes
        self.large_every = large_every
        self.large_bytes = large_bytes
        self.change_dump = change_dump  # the Capability List lists a Change Dump (.changedump)
        self.seed = seed
        self.weights = weights or Weights()
        self.spec_version = spec_version
        self.max_changes = max_changes
        self.resurrect = resurrect
        self.hubs = tuple(hubs)
        for hub in self.hubs:
            if "://" not in hub:
                raise SimulatorError(f"hub must be an absolute URL template, got {hub!r}")
        self.total_changes = 0
        self.counts = {kind: 0 for kind in ChangeType}
        self._rng = random.Random(seed)
        self._floor = self.start
        self._thresholds = self.weights.cumulative()
        self.collections = [
            Collection(f"c{i}", layout, self.start) for i in range(1, collections + 1)
        ]
        self.by_name = {c.name: c for c in self.collections}
        for collection in self.collections:
            for _ in range(resources):
                name = collection.new_name()
                loc = layout.resource(collection.name, name)
                collection.resources[loc] = ResourceRecord(
                    name=name,
                    loc=loc,
                    version=1,
                    fixity=self.fixity(loc, 1),
                    modified=self.start,
                )
                collection.live.add(loc)

    # -- time ------------------------------------------------------------------

    @property
    def clock(self) -> datetime:
        """The latest datetime handed out (change or snapshot)."""
        return self._floor

    def _tick(self, now: datetime) -> datetime:
        """A change datetime: ``now``, or 1 us after the previous one if not later."""
        floor = self._floor
        when = now if now > floor else floor + MICROSECOND
        self._floor = when
        return when

    def snapshot_time(self, now: datetime) -> datetime:
        """The ``at`` of a snapshot taken now; later changes will be strictly after it."""
        when = now if now > self._floor else self._floor
        self._floor = when
        return when

    # -- changes ---------------------------------------------------------------

    @property
    def remaining(self) -> int | None:
        """How many more changes :meth:`apply` may make (None: unbounded)."""
        if self.max_changes is None:
            return None
        return max(0, self.max_changes - self.total_changes)

    def mean_bytes(self, loc: str) -> int:
        """The mean size of ``loc``: ``large_bytes`` for one URI in ``large_every``.

        Large resources let a test kill a Destination in the middle of writing
        one; which URIs are large depends only on the URI, so it is repeatable.
        """
        if self.large_every and payload.is_large(loc, self.large_every):
            return self.large_bytes
        return self.payload_bytes

    def fixity(self, loc: str, version: int) -> Fixity:
        return payload.fixity(self.seed, loc, version, self.mean_bytes(loc))

    def body(self, loc: str, version: int) -> bytes:
        return payload.body(self.seed, loc, version, self.mean_bytes(loc))

    def apply(self, n: int, now: datetime) -> list[Applied]:
        """Make up to ``n`` changes at ``now`` (bounded by ``max_changes``), in order."""
        if n < 0:
            raise SimulatorError(f"cannot apply a negative number of changes ({n})")
        remaining = self.remaining
        if remaining is not None:
            n = min(n, remaining)
        now = now.astimezone(UTC)
        out: list[Applied] = []
        for _ in range(n):
            out.append(self._one(now))
        return out

    def _one(self, now: datetime) -> Applied:
        rng = self._rng
        collection = self.collections[rng.randrange(len(self.collections))]
        roll = rng.random() * self.weights.total
        created_max, updated_max = self._thresholds
        if roll < created_max or not collection.live:
            kind = ChangeType.CREATED
        elif roll < updated_max:
            kind = ChangeType.UPDATED
        else:
            kind = ChangeType.DELETED
        when = self._tick(now)
        if kind is ChangeType.CREATED:
            if collection.gone and rng.random() < self.resurrect:
                loc = collection.gone.pick(rng)
                collection.gone.remove(loc)
                record = collection.resources[loc]
                record.deleted = False
                self._touch(record, when, new_version=True)
            else:
                name = collection.new_name()
                loc = self.layout.resource(collection.name, name)
                record = ResourceRecord(
                    name=name, loc=loc, version=1, fixity=self.fixity(loc, 1), modified=when
                )
                collection.resources[loc] = record
            collection.live.add(loc)
        else:
            loc = collection.live.pick(rng)
            record = collection.resources[loc]
            if kind is ChangeType.UPDATED:
                self._touch(record, when, new_version=True)
            else:
                record.deleted = True
                collection.live.remove(loc)
                collection.gone.add(loc)
                self._touch(record, when, new_version=False)
        change = Change(
            loc=loc,
            change=kind,
            datetime=when,
            version=record.version,
            fixity=None if kind is ChangeType.DELETED else record.fixity,
        )
        current = collection.open_changelist
        current.changes.append(change)
        current.count += 1
        collection.changes += 1
        collection.last_change = when
        self.total_changes += 1
        self.counts[kind] += 1
        closed = None
        if current.count >= self.changelist_size:
            current.until = when
            closed = current
            collection.changelists.append(ChangeListState(number=current.number + 1, from_=when))
        return Applied(collection=collection, change=change, closed=closed)

    def _touch(self, record: ResourceRecord, when: datetime, *, new_version: bool) -> None:
        if new_version:
            record.version += 1
            record.fixity = self.fixity(record.loc, record.version)
        record.previous_modified = record.modified
        record.modified = when

    def release(self, collection: Collection, number: int) -> None:
        """Forget the entries of a closed Change List whose bytes the caller keeps.

        The server calls this once a closed list is serialized, so memory holds
        about one serialized entry per past change rather than objects as well;
        afterwards :meth:`changelist` can no longer rebuild that document.
        """
        state = collection.changelists[number - 1]
        if state.is_open:
            raise SimulatorError(f"Change List {number} of {collection.name} is still open")
        state.changes = []
        state.released = True

    # -- ground truth ------------------------------------------------------------

    def state(self) -> dict[str, object]:
        """The ``/_simulator/state`` JSON document for this instant."""
        return {
            "collections": {
                c.capability_list_url: {
                    "resources": c.state(),
                    "changes": c.changes,
                    "last_change": w3cdt.format(c.last_change) if c.last_change else None,
                }
                for c in self.collections
            }
        }

    # -- documents -------------------------------------------------------------

    def source_description(self) -> Document:
        return make_document(
            Root.URLSET,
            Capability.DESCRIPTION,
            entries=[
                Entry(loc=c.capability_list_url, capability=Capability.CAPABILITYLIST)
                for c in self.collections
            ],
        )

    def capability_list(self, collection: Collection) -> Document:
        """Links ``up`` to the Source Description, plus every configured push channel.

        Channel templates may contain ``{collection}`` (``c1``...) and ``{id}``
        (the rsnotify collection id of this Capability List, which names its
        MQTT topic, WebSocket path and WebSub topic), so one option advertises
        every channel.  An http(s) template is a WebSub topic, advertised as
        Change Notification 1.0.1 section 5 says: a ``<url>`` with the topic
        in ``<loc>``, ``rs:ln rel="hub"`` to the hub root (the template up to
        its first placeholder, so ``http://HOST:PORT/{id}`` is the topic of
        ``rsnotify publish --websub HOST:PORT``) and ``capability=
        "change-notification"``; beside it the framework channel of that hub
        (Framework Notification 1.0.1 section 5, Example 8: topic
        ``<topic>/framework``, where ``rsnotify publish --websub`` serves it,
        ``capability="framework-notification"``).  ``mqtt://`` and ``ws://``
        templates become ``rs:ln rel="urn:x-rsnotify:channel"`` links (see
        rsnotify.discovery).
        """
        layout = self.layout
        cid = collection_id(layout.capability_list(collection.name))
        links = [Link(rel="up", href=layout.source_description())]
        entries = [
            Entry(loc=layout.resource_list(collection.name), capability=Capability.RESOURCELIST),
            Entry(loc=layout.changelist_index(collection.name), capability=Capability.CHANGELIST),
        ]
        if self.change_dump:
            entries.append(
                Entry(loc=layout.changedump(collection.name), capability=Capability.CHANGEDUMP)
            )
        for template in self.hubs:
            href = template.replace("{collection}", collection.name).replace("{id}", cid)
            if urlsplit(href).scheme in ("http", "https"):
                channels = (
                    (href, NOTIFICATION_CAPABILITY),
                    (href.rstrip("/") + FRAMEWORK_TOPIC_SUFFIX, FRAMEWORK_CAPABILITY),
                )
                entries += [
                    Entry(
                        loc=topic, capability=kind, links=[Link(rel="hub", href=hub_root(template))]
                    )
                    for topic, kind in channels
                ]
            else:
                links.append(Link(rel=CHANNEL_REL, href=href))
        return make_document(Root.URLSET, Capability.CAPABILITYLIST, links=links, entries=entries)

    def resource_list(self, collection: Collection, at: datetime) -> Document:
        """The Resource List of ``collection`` now, stamped ``at`` (see :meth:`snapshot_time`).

        Entries are sorted by URI so equal states give equal documents.
        """
        entries = [
            Entry(
                loc=r.loc,
                lastmod=r.modified,
                hash=r.fixity.hash,
                length=r.fixity.length,
                type=payload.MEDIA_TYPE,
            )
            for r in sorted(collection.live_records(), key=lambda r: r.loc)
        ]
        return make_document(
            Root.URLSET,
            Capability.RESOURCELIST,
            at=at,
            completed=at,
            links=[Link(rel="up", href=collection.capability_list_url)],
            entries=entries,
        )

    def changelist_index(self, collection: Collection) -> Document:
        layout = self.layout
        lists = collection.changelists
        return make_document(
            Root.SITEMAPINDEX,
            Capability.CHANGELIST,
            from_=lists[0].from_,
            links=[Link(rel="up", href=collection.capability_list_url)],
            entries=[
                Entry(
                    loc=layout.changelist(collection.name, cl.number),
                    lastmod=cl.until,
                    from_=cl.from_,
                    until=cl.until,
                )
                for cl in lists
            ],
        )

    def changelist(
        self, collection: Collection, number: int, *, with_entries: bool = True
    ) -> Document:
        """Change List ``number`` (1-based); ``with_entries=False`` gives just its header."""
        if not 1 <= number <= len(collection.changelists):
            raise SimulatorError(f"{collection.name} has no Change List {number}")
        state = collection.changelists[number - 1]
        if with_entries and state.released:
            raise SimulatorError(
                f"Change List {number} of {collection.name} was released; use its stored bytes"
            )
        return make_document(
            Root.URLSET,
            Capability.CHANGELIST,
            from_=state.from_,
            until=state.until,
            links=[
                Link(rel="up", href=collection.capability_list_url),
                Link(rel="index", href=self.layout.changelist_index(collection.name)),
            ],
            entries=[self.change_entry(c) for c in state.changes] if with_entries else [],
        )

    def change_entry(self, change: Change) -> Entry:
        """The ``<url>`` of one change: ``datetime`` only in 1.1, ``lastmod`` always."""
        fixity = change.fixity
        return Entry(
            loc=change.loc,
            lastmod=change.datetime,
            change=change.change,
            datetime=change.datetime if self.spec_version == "1.1" else None,
            hash=fixity.hash if fixity else None,
            length=fixity.length if fixity else None,
            type=payload.MEDIA_TYPE if fixity else None,
        )
