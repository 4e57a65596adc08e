"""The notification wire contract: encode, decode, sign, verify (pure, no I/O).

One notification says "entry N of this collection's Change Lists is this
change".  It carries enough identity to be applied idempotently: collection,
sequence number, ``loc``, change time and change type.

JSON (the default) is compact and canonical: keys sorted, no spaces, UTF-8.
Readers ignore unknown keys (forward compatibility) and optional fields are
omitted rather than null.

The XML form is ResourceSync Change Notification 1.0.1 (section 3): a
``<urlset>`` whose root ``<rs:md capability="change-notification" from=...
until=...>`` gives the interval the notification covers, an ``<rs:ln
rel="up">`` to the Capability List, and one ``<url>`` per change in forward
chronological order -- several changes per notification
(:class:`ChangeNotification`).  rsnotify's own fields travel as attributes in
the ``urn:x-rsnotify:notification:1`` namespace (the schema allows ``##other``
attributes): ``rsn:seq`` and ``rsn:changelist`` on each change's ``rs:md``,
``rsn:collection`` and ``rsn:published`` on the root's.  A Destination that
knows only the standard ignores them; a payload without them (another
Source, another hub) decodes to changes without a sequence number.

Derived changes
    A Source without Change Lists tells what changed only by publishing a
    new Resource List; the publisher diffs successive snapshots
    (:mod:`rsnotify.changes.snapshot`) and marks every change found that way
    (:class:`~rsnotify.tracker.Snapshots`), so a Destination can tell it
    from a Change List entry: a change between two snapshots may stand for
    several, and a resource created and deleted between them was never
    seen.  JSON: ``"derived": {"resourcelist": URI, "from": W3C datetime,
    "until": W3C datetime}`` (``from``, the older snapshot's ``at``, omitted
    when unknown; ``until`` is the newer one's; Z39.99 section 7: a Resource
    List's ``at`` is the time its resource states reflect).  XML: the same
    three on the change's ``rs:md``, ``rsn:derived-resourcelist``,
    ``rsn:derived-from``, ``rsn:derived-until``; the change itself stays a
    standard ``<url>`` a standard Destination applies as it is.  A change
    without them is a Change List entry.

The interval
    Each logged change remembers the change datetime of the change logged
    before it (``since``, JSON key ``"from"``: the log is in forward
    chronological order).  A notification of changes ``a..b`` covers
    ``from`` = the ``since`` of ``a`` up to ``until`` = the datetime of
    ``b``, so however a transport groups consecutive changes, the
    notifications it sends chain exactly: each ``from`` is the previous
    ``until`` -- across publisher restarts, leader changes and gateways,
    since every one of them renders from the same log.  The 1.0 draft's
    ``changelist-notification`` capability is read, never written.

Signatures are HMAC-SHA256 over the exact payload bytes, like WebSub's
``X-Hub-Signature``, written ``<key id>:sha256=<hex>``; the key id lets a
Source rotate secrets while Destinations accept both keys for a while.  The
signature travels beside the payload (MQTT 5 user property, WebSocket frame
field, HTTP header), never inside it, so "the bytes that were signed" is never
ambiguous.

Why one module of ~700 lines: it is one wire contract, written and read
here, both ends.  The XML form decodes through the same validator as the JSON
form (:func:`from_dict`), so a change is accepted or refused by the same
rules whichever form carried it, and encoders and decoders sit side by side
so they cannot drift apart; the signature is over the bytes those encoders
produce.  The document-level XML work is delegated: reading to
:mod:`rsnotify.sitemap` (its hostile-input bounds), writing to
:mod:`rsnotify.sitemapwriter`, datetimes to :mod:`rsnotify.w3cdt`; turning a
logged change into what a transport sends is :mod:`rsnotify.outbound`.
"""

from __future__ import annotations

import datetime as dt  # for classes with a field named datetime
import functools
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from . import w3cdt
from .collection import is_valid_collection_id
from .errors import DocumentError, InvalidDatetime
from .errors import InvalidNotification as InvalidNotification  # re-exported: its old home
from .errors import SignatureError as SignatureError  # re-exported: its old home
from .model import ChangeType, Document, Entry, Link, Root, make_document
from .tracker import Snapshots

# Any (strict module): decoded JSON values (orjson.loads), checked field by field
# (_require, _optional, _time, _link_of) before they become a Notification.

VERSION = 1
MAX_PAYLOAD_BYTES = 64 * 1024
#: A Change Notification may hold many changes (section 3): XML payloads may be larger.
MAX_XML_PAYLOAD_BYTES = 1024 * 1024
MAX_URI_CHARS = 8192
RSNOTIFY_NS = "urn:x-rsnotify:notification:1"
#: Change Notification 1.0.1 section 3: the root ``rs:md`` capability.
NOTIFICATION_CAPABILITY = "change-notification"
#: Framework Notification 1.0.1 section 3 (a separate channel).
FRAMEWORK_CAPABILITY = "framework-notification"
#: The 1.0 draft's value (1.0.1's change log: "consistently use change-notification").
OBSOLETE_CAPABILITY = "changelist-notification"
_RSN = f"{{{RSNOTIFY_NS}}}"
SIGNATURE_PROPERTY = "rsnotify-signature"  # MQTT 5 user property / WebSocket field name

_CHANGES = {c.value: c for c in ChangeType}
# Characters XML 1.0 cannot carry (as in sitemapwriter.py), lone surrogates included.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_TEXT_FIELDS = ("collection", "capabilitylist", "changelist", "loc", "hash", "type")
#: The JSON ``derived`` keys and the ``rs:md`` attributes (rsnotify's namespace) carrying them.
_DERIVED = {
    "resourcelist": "derived-resourcelist",
    "from": "derived-from",
    "until": "derived-until",
}


# The latency stages a notification's times delimit, in order: change ->
# ``detected`` (detect) -> ``published`` (publish) -> received (deliver) ->
# applied (apply), and change -> applied (e2e).  One list for the telemetry
# writer (rsnotify.report) and the dashboard that reads it.
LATENCY_STAGES = ("e2e", "detect", "publish", "deliver", "apply")


@dataclass(slots=True)
class Notification:
    """One Change List entry as pushed to Destinations.

    ``detected`` is when the publisher found the entry (and logged it);
    ``published`` is when a transport sent it.  With the change time they
    give the latency stages the dashboard shows.
    """

    collection: str
    seq: int | None  # None: a standard payload without rsnotify's sequence number
    capabilitylist: str
    changelist: str
    loc: str
    change: ChangeType
    datetime: dt.datetime
    hash: str | None = None
    length: int | None = None
    type: str | None = None
    links: list[dict[str, Any]] = field(default_factory=list)
    lastmod: dt.datetime | None = None
    detected: dt.datetime | None = None
    published: dt.datetime | None = None
    # The change datetime of the change logged before this one (JSON "from"): where
    # the Change Notification interval of this change starts.  None: its own datetime.
    since: dt.datetime | None = None
    # Found by diffing two Resource List snapshots, not read from a Change List
    # (JSON "derived", see the module docstring).  None: a Change List entry.
    derived: Snapshots | None = None
    # Not on the wire: when this Destination received it (epoch seconds), for latency.
    received: float | None = field(default=None, compare=False)

    @property
    def identity(self) -> tuple[str, dt.datetime, str]:
        """(loc, change time, change): what makes applying this change idempotent."""
        return (self.loc, self.datetime, self.change.value)

    @classmethod
    def from_entry(
        cls,
        entry: Entry,
        *,
        collection: str,
        seq: int,
        capabilitylist: str,
        changelist: str,
        detected: dt.datetime | None = None,
        since: dt.datetime | None = None,
        derived: Snapshots | None = None,
    ) -> Notification:
        """Build the notification for a Change List entry (which the parser validated).

        ``since`` is the change datetime of the entry logged before this one;
        ``derived``: the entry was found between these Resource List snapshots.
        """
        when = entry.change_time
        if when is None or entry.change is None:
            raise ValueError(f"{entry.loc}: a Change List entry needs a change and a change time")
        links = [_link_dict(link) for link in entry.links]
        lastmod = entry.lastmod if entry.datetime is not None else None
        return cls(
            collection=collection,
            seq=seq,
            capabilitylist=capabilitylist,
            changelist=changelist,
            loc=entry.loc,
            change=entry.change,
            datetime=when,
            hash=entry.hash,
            length=entry.length,
            type=entry.type,
            links=links,
            lastmod=lastmod,
            detected=detected,
            since=since if since is not None and since < when else None,
            derived=derived,
        )

    @property
    def interval_start(self) -> dt.datetime:
        """``from`` of a notification that starts with this change."""
        return self.since if self.since is not None else self.datetime

    def hashes(self) -> dict[str, str]:
        from .model import parse_hashes

        return parse_hashes(self.hash)


def _link_dict(link: Link) -> dict[str, Any]:
    out: dict[str, Any] = {"rel": link.rel, "href": link.href}
    for name in ("hash", "length", "path", "type", "pri", "encoding"):
        value = getattr(link, name)
        if value is not None:
            out[name] = value
    if link.modified is not None:
        out["modified"] = w3cdt.format(link.modified)
    return out


# --- JSON ------------------------------------------------------------------------


# A publisher stamps every entry of one detection with the same ``detected``
# time: format it once per detection, not once per entry.
_format_detected = functools.lru_cache(maxsize=8)(w3cdt.format)


def to_dict(n: Notification) -> dict[str, Any]:
    """The envelope as a JSON-ready dict, optional fields omitted."""
    out: dict[str, Any] = {
        "v": VERSION,
        "collection": n.collection,
        "seq": n.seq,
        "capabilitylist": n.capabilitylist,
        "changelist": n.changelist,
        "loc": n.loc,
        "change": n.change.value,
        "datetime": w3cdt.format(n.datetime),
    }
    if n.hash is not None:
        out["hash"] = n.hash
    if n.length is not None:
        out["length"] = n.length
    if n.type is not None:
        out["type"] = n.type
    if n.links:
        out["links"] = n.links
    if n.lastmod is not None:
        out["lastmod"] = w3cdt.format(n.lastmod)
    if n.detected is not None:
        out["detected"] = _format_detected(n.detected)
    if n.since is not None:
        out["from"] = w3cdt.format(n.since)
    if n.published is not None:
        out["published"] = w3cdt.format(n.published)
    if n.derived is not None:
        out["derived"] = _derived_dict(n.derived)
    return out


def _derived_dict(derived: Snapshots) -> dict[str, str]:
    out = {"resourcelist": derived.resourcelist, "until": w3cdt.format(derived.until)}
    if derived.from_ is not None:
        out["from"] = w3cdt.format(derived.from_)
    return out


def _derived_of(value: Any) -> Snapshots:
    """The ``derived`` object, checked as strictly as the envelope's own fields."""
    if not isinstance(value, dict):
        raise InvalidNotification("notification 'derived' is not an object")
    resourcelist = value.get("resourcelist")
    if not isinstance(resourcelist, str):
        raise InvalidNotification("notification 'derived' has no 'resourcelist' URI")
    if _NOT_XML.search(resourcelist):
        raise InvalidNotification("notification 'derived.resourcelist' holds non-XML characters")
    until = _time(value.get("until"), "derived.until")
    since = _time(value["from"], "derived.from") if value.get("from") is not None else None
    if since is not None and since > until:
        raise InvalidNotification("notification 'derived.from' is later than its 'until'")
    return Snapshots(_uri(resourcelist, "derived.resourcelist"), since, until)


def dumps(value: Mapping[str, Any]) -> bytes:
    """Canonical JSON bytes: sorted keys, compact, UTF-8.

    orjson, because every notification is encoded once by the publisher and
    decoded once per hop: it is ~14x faster than the stdlib encoder and ~6x
    faster decoding, and for the str/int/bool/None/list/dict values envelopes
    hold it writes exactly the bytes of ``json.dumps(sort_keys=True,
    separators=(",", ":"), ensure_ascii=False)`` (tests/test_envelope.py
    checks that): UTF-8 byte order is code-point order, so keys sort alike.
    """
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def to_json(n: Notification) -> bytes:
    return dumps(to_dict(n))


def _require(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = obj.get(key)
    if value is None:
        raise InvalidNotification(f"notification has no {key!r}")
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidNotification(f"notification {key!r} has the wrong type")
    return value


def _optional(obj: Mapping[str, Any], key: str, kind: type) -> Any:
    value = obj.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise InvalidNotification(f"notification {key!r} has the wrong type")
    return value


def _time(value: Any, key: str) -> datetime:
    if not isinstance(value, str):
        raise InvalidNotification(f"notification {key!r} is not a W3C datetime")
    try:
        return w3cdt.parse(value)
    except InvalidDatetime as exc:
        raise InvalidNotification(f"notification {key!r}: {exc}") from None


def _uri(value: str, key: str) -> str:
    if not value or len(value) > MAX_URI_CHARS:
        raise InvalidNotification(f"notification {key!r} is empty or longer than {MAX_URI_CHARS}")
    # A URI has no surrounding white space; the XML form strips it, so " x" would
    # decode from JSON as another resource than the same notification as XML.
    if value != value.strip():
        raise InvalidNotification(f"notification {key!r} has leading or trailing white space")
    return value


def _check_chars(values: Any) -> None:
    """Refuse text no Change List could hold: NUL and other controls, lone surrogates.

    Every field comes from an XML document, so such a value is forged or garbage,
    and it would break later (re-encoding as XML, UTF-8 paths, the apply log).
    """
    for value in values:
        if isinstance(value, str) and _NOT_XML.search(value):
            raise InvalidNotification("notification text holds characters XML 1.0 cannot carry")


def _link_of(value: Any) -> dict[str, Any]:
    """A link checked by the document parser's own rules, as the XML form carries it.

    Unknown keys are dropped and values normalised, so a link decoded from JSON
    is exactly the link the same notification decodes to as XML.
    """
    from . import sitemap

    if not (
        isinstance(value, dict)
        and isinstance(value.get("rel"), str)
        and isinstance(value.get("href"), str)
    ):
        raise InvalidNotification("links must be objects with string rel and href")
    attrs: dict[str, str] = {}
    for key in ("rel", "href", "hash", "path", "type", "encoding", "modified", "length", "pri"):
        item = value.get(key)
        if item is None:
            continue
        numeric = key in ("length", "pri")
        if isinstance(item, bool) or not isinstance(item, int if numeric else str):
            raise InvalidNotification(f"link {key!r} has the wrong type")
        attrs[key] = str(item)
    _check_chars(attrs.values())
    try:
        return _link_dict(sitemap._link(attrs, None))
    except DocumentError as exc:
        raise InvalidNotification(f"invalid link: {exc}") from None


def from_dict(obj: Any, *, standard: bool = False) -> Notification:
    """Validate a decoded JSON object into a Notification, or raise InvalidNotification.

    ``standard``: a change read from a Change Notification that need not carry
    rsnotify's fields (``seq`` may be None, ``changelist`` empty); the caller
    supplies the collection.
    """
    if not isinstance(obj, dict):
        raise InvalidNotification("notification is not a JSON object")
    version = _require(obj, "v", int)
    if version < 1:
        raise InvalidNotification(f"unsupported notification version {version}")
    collection = _require(obj, "collection", str)
    if not is_valid_collection_id(collection):
        raise InvalidNotification(f"invalid collection id {collection[:80]!r}")
    seq = _optional(obj, "seq", int) if standard else _require(obj, "seq", int)
    if seq is not None and seq < 1:
        raise InvalidNotification(f"sequence number {seq} is not positive")
    change = _CHANGES.get(_require(obj, "change", str))
    if change is None:
        raise InvalidNotification(f"unknown change {obj.get('change')!r}")
    length = _optional(obj, "length", int)
    if length is not None and length < 0:
        raise InvalidNotification("negative length")
    links = [_link_of(link) for link in _optional(obj, "links", list) or []]
    _check_chars(obj.get(key) for key in _TEXT_FIELDS)
    when = _time(obj.get("datetime"), "datetime")
    since = _time(obj["from"], "from") if obj.get("from") is not None else None
    if since is not None and since > when:
        raise InvalidNotification("notification 'from' is later than its datetime")
    changelist = obj.get("changelist") if standard else _require(obj, "changelist", str)
    return Notification(
        collection=collection,
        seq=seq,
        capabilitylist=_uri(_require(obj, "capabilitylist", str), "capabilitylist"),
        changelist=_uri(changelist, "changelist") if changelist else "",
        loc=_uri(_require(obj, "loc", str), "loc"),
        change=change,
        datetime=when,
        hash=_optional(obj, "hash", str),
        length=length,
        type=_optional(obj, "type", str),
        links=links,
        lastmod=_time(obj["lastmod"], "lastmod") if obj.get("lastmod") is not None else None,
        detected=_time(obj["detected"], "detected") if obj.get("detected") is not None else None,
        published=(
            _time(obj["published"], "published") if obj.get("published") is not None else None
        ),
        since=since if since is not None and since < when else None,
        derived=_derived_of(obj["derived"]) if obj.get("derived") is not None else None,
    )


def from_json(payload: bytes | str, *, max_bytes: int = MAX_PAYLOAD_BYTES) -> Notification:
    """Decode a JSON envelope; garbage and oversized payloads raise InvalidNotification."""
    if len(payload) > max_bytes:
        raise InvalidNotification(f"payload of {len(payload)} bytes exceeds {max_bytes}")
    try:
        obj = orjson.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidNotification(f"payload is not JSON: {exc}") from None
    return from_dict(obj)


# --- XML (ResourceSync Change Notification 1.0.1) --------------------------------


@dataclass(slots=True)
class ChangeNotification:
    """One Change Notification payload (section 3): its interval and its changes, in order.

    ``from_``/``until`` are mandatory in 1.0.1 (None only when read from the
    obsolete 1.0 draft form); ``changes`` carry ``seq`` when the payload came
    from rsnotify, None otherwise.
    """

    capabilitylist: str | None
    from_: datetime | None
    until: datetime | None
    changes: list[Notification]
    capability: str = NOTIFICATION_CAPABILITY
    published: datetime | None = None

    @property
    def sequenced(self) -> bool:
        """True when every change carries rsnotify's sequence number."""
        return bool(self.changes) and all(n.seq is not None for n in self.changes)


def _entry_of(n: Notification) -> Entry:
    extra = {_RSN + "seq": str(n.seq)} if n.seq is not None else {}
    if n.changelist:
        extra[_RSN + "changelist"] = n.changelist
    if n.detected is not None:
        extra[_RSN + "detected"] = _format_detected(n.detected)
    if n.derived is not None:
        extra.update((_RSN + _DERIVED[k], v) for k, v in _derived_dict(n.derived).items())
    return Entry(
        loc=n.loc,
        lastmod=n.lastmod if n.lastmod is not None else n.datetime,
        change=n.change,
        datetime=n.datetime,
        hash=n.hash,
        length=n.length,
        type=n.type,
        links=[link_of(d) for d in n.links],
        md_extra=extra,
    )


def entry_fragment(entry: Entry) -> bytes:
    """The ``<url>`` element of one entry, self-contained (its rsnotify namespace declared).

    Change and Framework Notifications share the ``<urlset>`` structure
    (section 3 of both texts): each renders its entries with this and
    :func:`compose` puts the header around them.
    """
    from . import sitemapwriter

    return sitemapwriter._entry_xml(entry, "url").encode("utf-8")


def url_fragment(n: Notification) -> bytes:
    """The ``<url>`` element of one change (see :func:`entry_fragment`).

    Transports that group changes render each change's element once and
    :func:`compose` notifications from them.
    """
    return entry_fragment(_entry_of(n))


def compose(
    fragments: Sequence[bytes],
    *,
    capabilitylist: str | None,
    from_: datetime | None,
    until: datetime | None,
    collection: str | None = None,
    published: datetime | None = None,
    capability: str = NOTIFICATION_CAPABILITY,
) -> bytes:
    """A notification document from :func:`entry_fragment` elements (section 3).

    ``capability`` is ``change-notification`` (``from``/``until`` mandatory)
    or ``framework-notification`` (both optional, as is the ``up`` link:
    Framework Notification 1.0.1 section 3).
    """
    from . import sitemap

    extra = {_RSN + "version": str(VERSION)}
    if collection is not None:
        extra[_RSN + "collection"] = collection
    if published is not None:
        extra[_RSN + "published"] = w3cdt.format(published)
    header = make_document(
        Root.URLSET,
        capability,
        from_=from_,
        until=until,
        links=[Link(rel="up", href=capabilitylist)] if capabilitylist else [],
        md_extra=extra,
    )
    head = "".join(sitemap.iter_xml(header)).encode("utf-8")
    footer = b"</urlset>\n"
    assert head.endswith(footer)
    return b"".join([head[: -len(footer)], *fragments, footer])


def to_xml_batch(changes: Sequence[Notification], *, published: datetime | None = None) -> bytes:
    """Consecutive logged changes of one collection as one Change Notification."""
    if not changes:
        raise ValueError("a Change Notification holds at least one change")
    first, last = changes[0], changes[-1]
    return compose(
        [url_fragment(n) for n in changes],
        capabilitylist=first.capabilitylist,
        from_=first.interval_start,
        until=max(last.datetime, first.interval_start),
        collection=first.collection,
        published=published,
    )


def to_xml(n: Notification) -> bytes:
    """One change as a Change Notification: ``from`` its ``since``, ``until`` its datetime."""
    return to_xml_batch([n], published=n.published)


def decode_batch(
    payload: bytes,
    *,
    collection: str | None = None,
    max_bytes: int = MAX_XML_PAYLOAD_BYTES,
) -> ChangeNotification:
    """Decode a Change Notification (XML, any number of changes) or a JSON envelope.

    ``collection`` names the channel's collection for payloads that do not
    say (a Source or hub that knows nothing of rsnotify); a payload that
    names another collection is refused.
    """
    head = payload[:64].lstrip()
    if not head.startswith(b"<"):
        n = from_json(payload, max_bytes=min(max_bytes, MAX_PAYLOAD_BYTES))
        _same_collection(n.collection, collection)
        return ChangeNotification(
            n.capabilitylist, n.interval_start, n.datetime, [n], published=n.published
        )
    document = read_document(
        payload,
        (NOTIFICATION_CAPABILITY, OBSOLETE_CAPABILITY),
        spec="Change Notification 1.0.1 section 3",
        max_bytes=max_bytes,
    )
    capability = document.capability
    if capability == NOTIFICATION_CAPABILITY and (document.from_ is None or document.until is None):
        raise InvalidNotification(
            "a change-notification's rs:md needs from and until (Change Notification 1.0.1 "
            "section 3: they are mandatory)"
        )
    if (
        document.from_ is not None
        and document.until is not None
        and document.from_ > document.until
    ):
        raise InvalidNotification("a change-notification's from is later than its until")
    extra = document.md_extra
    named = extra.get(_RSN + "collection")
    _same_collection(named, collection)
    chosen = named or collection
    if chosen is None:
        raise InvalidNotification("notification has no 'collection'")
    published = extra.get(_RSN + "published")
    previous: datetime | None = None
    changes = []
    for entry in document.entries:
        n = _from_entry(entry, document, chosen, previous)
        if previous is not None and n.datetime < previous:
            raise InvalidNotification(
                f"changes not in forward chronological order at {n.loc[:200]!r} "
                "(Change Notification 1.0.1 section 3)"
            )
        previous = n.datetime
        changes.append(n)
    stamp = _time(published, "published") if published is not None else None
    for n in changes:
        n.published = stamp
    return ChangeNotification(
        document.up, document.from_, document.until, changes, capability=capability, published=stamp
    )


def read_document(
    payload: bytes, capabilities: Sequence[str], *, spec: str, max_bytes: int
) -> Document:
    """Parse a notification payload: a ``<urlset>`` whose root ``rs:md`` names one of
    ``capabilities`` (the shared structure of section 3 of both notification texts).

    The document parser's safe settings apply (no entities, no network,
    bounded); anything else is an :class:`InvalidNotification` naming ``spec``.
    """
    from . import sitemap

    if len(payload) > max_bytes:
        raise InvalidNotification(f"payload of {len(payload)} bytes exceeds {max_bytes}")
    try:
        document = sitemap.parse(payload, limits=sitemap.Limits(max_bytes=max_bytes))
    except DocumentError as exc:
        raise InvalidNotification(f"payload is not a ResourceSync document: {exc}") from None
    capability = document.capability
    if document.root is not Root.URLSET or capability not in capabilities:
        raise InvalidNotification(
            f"expected a <urlset> with rs:md capability={capabilities[0]!r} "
            f"({spec}), got {capability[:40]!r}"
        )
    return document


def _same_collection(named: str | None, expected: str | None) -> None:
    if named is not None and expected is not None and named != expected:
        raise InvalidNotification(f"notification for {named[:80]!r} on {expected!r}'s channel")


def _from_entry(
    entry: Entry, document: Any, collection: str, previous: datetime | None
) -> Notification:
    """One ``<url>`` of a Change Notification as a Notification (the JSON rules apply)."""
    extra = entry.md_extra
    root = document.md_extra
    # Section 3: rs:md datetime is optional; without it, <lastmod>; without both,
    # the change happened within the notification's interval: date it its end.
    when = entry.change_time or document.until
    obj: dict[str, Any] = {
        "v": 1,
        "collection": collection,
        "seq": _int_or_none(extra.get(_RSN + "seq")),
        "capabilitylist": document.up,
        "changelist": extra.get(_RSN + "changelist") or root.get(_RSN + "changelist"),
        "loc": entry.loc,
        "change": entry.change.value if entry.change else None,
        "datetime": w3cdt.format(when) if when else None,
        "hash": entry.hash,
        "length": entry.length,
        "type": entry.type,
        "links": [_link_dict(link) for link in entry.links],
        "detected": extra.get(_RSN + "detected") or root.get(_RSN + "detected"),
    }
    if entry.datetime is not None and entry.lastmod is not None and entry.lastmod != entry.datetime:
        obj["lastmod"] = w3cdt.format(entry.lastmod)
    since = previous if previous is not None else document.from_
    if since is not None and when is not None and since < when:
        obj["from"] = w3cdt.format(since)
    derived = {k: extra[_RSN + a] for k, a in _DERIVED.items() if _RSN + a in extra}
    if derived:  # any of the three: from_dict requires the URI and the until
        obj["derived"] = derived
    if obj["capabilitylist"] is None:
        obj["capabilitylist"] = "urn:x-rsnotify:unknown-capability-list"
    return from_dict(obj, standard=True)


def from_xml(payload: bytes, *, max_bytes: int = MAX_PAYLOAD_BYTES) -> Notification:
    """Decode a Change Notification of exactly one change (see :func:`decode_batch`)."""
    batch = decode_batch(payload, max_bytes=max_bytes)
    if len(batch.changes) != 1:
        raise InvalidNotification(
            f"expected one change, the notification holds {len(batch.changes)}"
        )
    (n,) = batch.changes
    n.published = batch.published
    return n


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None and value.isascii() and value.isdigit() else None


def encode(n: Notification, fmt: str = "json") -> bytes:
    """Encode in ``json`` or ``xml``."""
    if fmt == "json":
        return to_json(n)
    if fmt == "xml":
        return to_xml(n)
    raise ValueError(f"unknown notification format {fmt!r}")


def decode(payload: bytes, *, max_bytes: int = MAX_PAYLOAD_BYTES) -> Notification:
    """Decode either form (one change), telling them apart by the first non-blank byte."""
    head = payload[:64].lstrip()
    if head.startswith(b"<"):
        return from_xml(payload, max_bytes=max_bytes)
    return from_json(payload, max_bytes=max_bytes)


# --- signatures ---------------------------------------------------------------


def sign(payload: bytes, secret: bytes, key_id: str = "k1") -> str:
    """``<key id>:sha256=<hex>`` over the exact payload bytes."""
    if ":" in key_id or not key_id:
        raise ValueError("a key id must be non-empty and contain no ':'")
    digest = hmac.new(secret, payload, hashlib.sha256).hexdigest()
    return f"{key_id}:sha256={digest}"


def verify(payload: bytes, signature: str | None, keys: Mapping[str, bytes]) -> None:
    """Raise SignatureError unless ``signature`` is a valid HMAC by one of ``keys``."""
    if not signature:
        raise SignatureError("notification is not signed")
    key_id, sep, rest = signature.partition(":")
    algo, sep2, digest = rest.partition("=")
    if not sep or not sep2 or algo != "sha256":
        raise SignatureError("malformed signature")
    secret = keys.get(key_id)
    if secret is None:
        raise SignatureError(f"unknown signing key {key_id[:40]!r}")
    expected = hmac.new(secret, payload, hashlib.sha256).hexdigest()
    # compare_digest raises TypeError on non-ASCII str; a forged digest may be anything.
    if not digest.isascii() or not hmac.compare_digest(expected, digest):
        raise SignatureError("signature does not match the payload")


def link_of(d: Mapping[str, Any]) -> Link:
    """A notification's link (its JSON form) as a :class:`~rsnotify.model.Link`."""
    return Link(
        rel=d["rel"],
        href=d["href"],
        hash=d.get("hash"),
        length=d.get("length"),
        path=d.get("path"),
        type=d.get("type"),
        pri=d.get("pri"),
        encoding=d.get("encoding"),
        modified=w3cdt.parse(d["modified"]) if d.get("modified") else None,
    )
