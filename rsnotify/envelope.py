"""The notification wire contract: encode, decode, sign, verify (pure, no I/O).

One notification says "entry N of this collection's Change Lists is this
change".  It carries enough identity to be applied idempotently: collection,
sequence number, ``loc``, change time and change type.

JSON (the default) is compact and canonical: keys sorted, no spaces, UTF-8.
Readers ignore unknown keys (forward compatibility) and optional fields are
omitted rather than null.  The XML form is a Sitemap ``<urlset>`` in the
ResourceSync namespace as the Change Notification specification describes, the
sequence number travelling in an rsnotify namespace (community attributes are
allowed outside the rs namespace).

Signatures are HMAC-SHA256 over the exact payload bytes, like WebSub's
``X-Hub-Signature``, written ``<key id>:sha256=<hex>``; the key id lets a
Source rotate secrets while Destinations accept both keys for a while.  The
signature travels beside the payload (MQTT 5 user property, WebSocket frame
field, HTTP header), never inside it, so "the bytes that were signed" is never
ambiguous.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from . import w3cdt
from .collection import is_valid_collection_id
from .errors import DocumentError, InvalidDatetime, RsNotifyError
from .model import ChangeType, Entry, Link, Root, make_document

VERSION = 1
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_URI_CHARS = 8192
RSNOTIFY_NS = "urn:x-rsnotify:notification:1"
NOTIFICATION_CAPABILITY = "changelist-notification"
SIGNATURE_PROPERTY = "rsnotify-signature"  # MQTT 5 user property / WebSocket field name

_CHANGES = {c.value: c for c in ChangeType}
# Characters XML 1.0 cannot carry (as in sitemap.py), lone surrogates included.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_TEXT_FIELDS = ("collection", "capabilitylist", "changelist", "loc", "hash", "type")


class InvalidNotification(RsNotifyError):
    """A payload that is not a notification rsnotify can apply (garbage, oversized, forged)."""


class SignatureError(InvalidNotification):
    """A payload that is unsigned, or signed with an unknown key or a wrong digest."""


@dataclass(slots=True)
class Notification:
    """One Change List entry as pushed to Destinations.

    ``detected`` is when the publisher found the entry (and logged it);
    ``published`` is when a transport sent it.  With the change time they
    give the latency stages the dashboard shows.
    """

    collection: str
    seq: int
    capabilitylist: str
    changelist: str
    loc: str
    change: ChangeType
    datetime: datetime
    hash: str | None = None
    length: int | None = None
    type: str | None = None
    links: list[dict[str, Any]] = field(default_factory=list)
    lastmod: datetime | None = None
    detected: datetime | None = None
    published: datetime | None = None
    # Not on the wire: when this Destination received it (epoch seconds), for latency.
    received: float | None = field(default=None, compare=False)

    @property
    def identity(self) -> tuple[str, datetime, str]:
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
        detected: datetime | None = None,
    ) -> Notification:
        """Build the notification for a Change List entry (which the parser validated)."""
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
        )

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
    if n.published is not None:
        out["published"] = w3cdt.format(n.published)
    return out


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


def from_dict(obj: Any) -> Notification:
    """Validate a decoded JSON object into a Notification, or raise InvalidNotification."""
    if not isinstance(obj, dict):
        raise InvalidNotification("notification is not a JSON object")
    version = _require(obj, "v", int)
    if version < 1:
        raise InvalidNotification(f"unsupported notification version {version}")
    collection = _require(obj, "collection", str)
    if not is_valid_collection_id(collection):
        raise InvalidNotification(f"invalid collection id {collection[:80]!r}")
    seq = _require(obj, "seq", int)
    if seq < 1:
        raise InvalidNotification(f"sequence number {seq} is not positive")
    change = _CHANGES.get(_require(obj, "change", str))
    if change is None:
        raise InvalidNotification(f"unknown change {obj.get('change')!r}")
    length = _optional(obj, "length", int)
    if length is not None and length < 0:
        raise InvalidNotification("negative length")
    links = [_link_of(link) for link in _optional(obj, "links", list) or []]
    _check_chars(obj.get(key) for key in _TEXT_FIELDS)
    return Notification(
        collection=collection,
        seq=seq,
        capabilitylist=_uri(_require(obj, "capabilitylist", str), "capabilitylist"),
        changelist=_uri(_require(obj, "changelist", str), "changelist"),
        loc=_uri(_require(obj, "loc", str), "loc"),
        change=change,
        datetime=_time(obj.get("datetime"), "datetime"),
        hash=_optional(obj, "hash", str),
        length=length,
        type=_optional(obj, "type", str),
        links=links,
        lastmod=_time(obj["lastmod"], "lastmod") if obj.get("lastmod") is not None else None,
        detected=_time(obj["detected"], "detected") if obj.get("detected") is not None else None,
        published=(
            _time(obj["published"], "published") if obj.get("published") is not None else None
        ),
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


# --- XML (ResourceSync Change Notification form) -------------------------------


def to_xml(n: Notification) -> bytes:
    """The notification as a Change Notification ``<urlset>``, sequence in our namespace."""
    from . import sitemap

    entry = Entry(
        loc=n.loc,
        lastmod=n.lastmod if n.lastmod is not None else n.datetime,
        change=n.change,
        datetime=n.datetime,
        hash=n.hash,
        length=n.length,
        type=n.type,
        links=[
            Link(
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
            for d in n.links
        ],
        md_extra={f"{{{RSNOTIFY_NS}}}seq": str(n.seq)},
    )
    extra = {f"{{{RSNOTIFY_NS}}}collection": n.collection, f"{{{RSNOTIFY_NS}}}version": "1"}
    extra[f"{{{RSNOTIFY_NS}}}changelist"] = n.changelist
    if n.detected is not None:
        extra[f"{{{RSNOTIFY_NS}}}detected"] = w3cdt.format(n.detected)
    if n.published is not None:
        extra[f"{{{RSNOTIFY_NS}}}published"] = w3cdt.format(n.published)
    document = make_document(
        Root.URLSET,
        NOTIFICATION_CAPABILITY,
        links=[Link(rel="up", href=n.capabilitylist)],
        md_extra=extra,
        entries=[entry],
    )
    return sitemap.serialize(document)


def from_xml(payload: bytes, *, max_bytes: int = MAX_PAYLOAD_BYTES) -> Notification:
    """Decode the XML form (one ``<url>``) with the same validation as JSON."""
    from . import sitemap

    if len(payload) > max_bytes:
        raise InvalidNotification(f"payload of {len(payload)} bytes exceeds {max_bytes}")
    try:
        document = sitemap.parse(payload, limits=sitemap.Limits(max_bytes=max_bytes))
    except DocumentError as exc:
        raise InvalidNotification(f"payload is not a ResourceSync document: {exc}") from None
    if document.capability != NOTIFICATION_CAPABILITY or len(document.entries) != 1:
        raise InvalidNotification("expected one change in a changelist-notification document")
    entry = document.entries[0]
    ns = f"{{{RSNOTIFY_NS}}}"
    obj: dict[str, Any] = {
        "v": 1,
        "collection": document.md_extra.get(ns + "collection"),
        "seq": _int_or_none(entry.md_extra.get(ns + "seq")),
        "capabilitylist": document.up,
        "changelist": document.md_extra.get(ns + "changelist"),
        "loc": entry.loc,
        "change": entry.change.value if entry.change else None,
        "datetime": w3cdt.format(entry.change_time) if entry.change_time else None,
        "hash": entry.hash,
        "length": entry.length,
        "type": entry.type,
        "links": [_link_dict(link) for link in entry.links],
        "detected": document.md_extra.get(ns + "detected"),
        "published": document.md_extra.get(ns + "published"),
    }
    if entry.datetime is not None and entry.lastmod is not None and entry.lastmod != entry.datetime:
        obj["lastmod"] = w3cdt.format(entry.lastmod)
    return from_dict(obj)


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def encode(n: Notification, fmt: str = "json") -> bytes:
    """Encode in ``json`` or ``xml``."""
    if fmt == "json":
        return to_json(n)
    if fmt == "xml":
        return to_xml(n)
    raise ValueError(f"unknown notification format {fmt!r}")


def decode(payload: bytes, *, max_bytes: int = MAX_PAYLOAD_BYTES) -> Notification:
    """Decode either form, telling them apart by the first non-blank byte."""
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
