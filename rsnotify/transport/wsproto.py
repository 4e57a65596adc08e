"""The rsnotify WebSocket protocol, both ends, with no socket in sight (sans-I/O).

:mod:`.ws` is the gateway that speaks it over real connections; a subscriber
uses :func:`parse_frame`, :func:`subscribe_frame` and :func:`subscription_url`.
Everything here is pure, so the wire format is tested without a network and
both ends agree on it by construction.

Connecting
----------
``ws://host:port/<collection>[?since=<seq>][&prefix=<URI prefix>][&change=<c>,<c>]``
subscribes to one collection.  ``since`` is the last sequence number the
client already has (``0``: everything still retained); without it the stream
starts at the current head.  ``prefix`` keeps only notifications whose ``loc``
starts with it; ``change`` keeps only the listed change types (``created``,
``updated``, ``deleted``).  Unknown query parameters are ignored.

``ws://host:port/`` subscribes to several collections: the client's first
frame must be, within ten seconds::

    {"type": "subscribe", "collections": {"<c>": <since or null>, ...},
     "prefix": "<URI prefix>" | null, "change": ["created", ...] | null}

(at most :data:`MAX_COLLECTIONS` collections; filters apply to all of them).
Later client frames are ignored.

Authentication: when the gateway has a token, the handshake needs
``Authorization: Bearer <token>``; otherwise it is refused with HTTP 401.
Browsers cannot set that header on a WebSocket, so ``?access_token=<token>``
is accepted too -- at a price: a query string lands in proxy and server
access logs and in browser history, so give browsers a separate read-only
token, rotate it, and use ``wss://``.  A gateway at its client limit answers
HTTP 503; a client address holding its share of connections (256 by
default; an IPv6 /64 counts as one address) gets HTTP 429.

Frames
------
Every frame is a JSON text frame with a ``"type"``.  For each collection the
server sends, in this order:

``{"type":"hello","collection":c,"head":H,"earliest":E,"heartbeat":T,"server":id}``
    Where the log stands at subscription (the fields of
    :func:`rsnotify.outbound.head_message`): ``head`` is the last sequence
    number a reader can have (those assigned but still held back for
    replicas do not count: ``NotificationLog.released_head``), ``earliest``
    the first still retained (``head + 1`` when none is), ``heartbeat`` the
    gateway's clock (W3C datetime).  A ``since`` above ``head`` is refused
    (``since_ahead``) only beyond every seq assigned: a client may hold seqs
    a failover made the log hold back again, and waits for the rest.

``{"type":"gap_too_old","collection":c,"since":S,"earliest":E,"capabilitylist":URI}``
    Only when ``since + 1 < earliest``: the log no longer holds what the
    client missed, so it must poll the Change List Index of that Capability
    List.  The stream then continues live from ``hello.head``.

``{"type":"notification","collection":c,"seq":N,"prev":P,"format":"json"|"xml","payload":"...","signature":"..."}``
    One logged notification.  ``payload`` is the exact text of
    :func:`rsnotify.outbound.render`; ``signature`` (only when the gateway
    signs) is over its UTF-8 bytes.  ``prev`` is the ``seq`` of the previous
    notification sent to this client for ``c`` -- or its starting point
    (``since``; ``hello.head`` without ``since`` or after ``gap_too_old``), or
    ``resume - 1`` after a ``skipped``.  Notifications removed by the client's
    filters are not sent, and ``prev`` skips them too, so ``prev`` equal to
    the last ``seq`` received always means "nothing missing".

``{"type":"skipped","collection":c,"from":A,"resume":B}``
    Sequence numbers ``A .. B-1`` were not delivered: the client read too
    slowly (fell more than the gateway's queue size behind), or the log
    trimmed them during a replay, or one could not be rendered.  The stream
    goes on at ``B`` (next ``prev`` is ``B - 1``); the client catches up by
    reconnecting with ``since=A-1`` (or by polling the Change List Index).

``{"type":"heartbeat","collection":c,"head":H,"heartbeat":T}``
    Every few seconds while the client is caught up: every sequence number
    up to ``H`` has been sent to this client or removed by its filters (a
    filtered subscriber may resume with ``since=H``).  Heartbeats stop while
    the gateway cannot read its log, so silence means "do not trust push".

``{"type":"error","code":..., "message":..., "collection":c?}``
    The subscription was refused; the server closes with 1008 (policy
    violation: ``bad_request``, ``invalid_collection``,
    ``unknown_collection``, ``since_ahead``) or 1013 (try again later:
    ``unavailable``, the log is unreachable).

Other close codes: 1001 when the gateway shuts down, 1009 for an oversized
client frame.  Readers ignore unknown fields and return unknown frame types
as :class:`Unknown`, so the protocol can grow without breaking clients.

A client checks continuity per collection with one number, ``last``: set it
to ``since`` (or ``hello.head``; after ``gap_too_old``, ``hello.head``); each
notification must have ``prev == last`` (then ``last = seq``); each
``skipped`` must have ``from == last + 1`` (then ``last = resume - 1``).

Why one module of ~630 lines: it is one wire format, both ends -- the
gateway's frame builders and the client's frame readers next to each other,
with the send cursor that makes ``prev`` chain -- and about a sixth of the
file is the protocol reference above.  What is not wire format is elsewhere:
the connections in :mod:`.ws`, the payload rendering in
:mod:`rsnotify.outbound`, the subscriber's connection in
:mod:`rsnotify.subscriber.channels` and its continuity checks in
:mod:`rsnotify.subscriber.gaps`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

import orjson

from .. import outbound, w3cdt
from ..collection import is_valid_collection_id
from ..envelope import MAX_URI_CHARS, InvalidNotification
from ..errors import InvalidDatetime
from ..errors import InvalidSubscription as InvalidSubscription  # re-exported: its old home
from ..model import ChangeType

# Any (strict module): decoded JSON frames (orjson.loads), checked key by key below.

#: Largest server frame a client should accept (websockets ``max_size``): a
#: 64 KiB payload JSON-escaped, plus the frame's own fields.
MAX_FRAME_BYTES = 1024 * 1024
#: Largest client frame the gateway accepts (a subscribe frame).
MAX_CLIENT_FRAME_BYTES = 64 * 1024
#: Most collections one connection may subscribe to.
MAX_COLLECTIONS = 100
#: Seconds a client connected to ``/`` has to send its subscribe frame.
SUBSCRIBE_TIMEOUT = 10.0
#: Largest sequence number we accept from the network (fits a signed 64-bit int).
MAX_SEQ = 2**63 - 1
FORMATS = ("json", "xml")
CHANGES = frozenset(c.value for c in ChangeType)

# Close codes (RFC 6455 section 7.4.1).
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY_VIOLATION = 1008
CLOSE_INTERNAL_ERROR = 1011
CLOSE_TRY_AGAIN_LATER = 1013


# --- what a client asks for (parsed by the gateway) ----------------------------


@dataclass(frozen=True, slots=True)
class Filter:
    """Server-side filters: a ``loc`` prefix and a set of change types (None: all)."""

    prefix: str | None = None
    changes: frozenset[str] | None = None

    @property
    def everything(self) -> bool:
        """No filter at all: every notification passes, so ``prev`` is always ``seq - 1``."""
        return self.prefix is None and self.changes is None

    def matches(self, loc: str, change: str) -> bool:
        if self.prefix is not None and not loc.startswith(self.prefix):
            return False
        return self.changes is None or change in self.changes


@dataclass(frozen=True, slots=True)
class Subscription:
    """Collections (id -> since, None meaning "from the head") and the filters for all."""

    collections: dict[str, int | None]
    filter: Filter = Filter()


def _since(value: Any, collection: str | None = None) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        if not value.isdigit() or not value.isascii() or len(value) > 19:
            raise InvalidSubscription(
                "bad_request", "since must be a non-negative integer", collection=collection
            )
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_SEQ:
        raise InvalidSubscription(
            "bad_request", "since must be a non-negative integer", collection=collection
        )
    return value


def _collection(value: Any) -> str:
    if not isinstance(value, str) or not is_valid_collection_id(value):
        shown = value[:80] if isinstance(value, str) else type(value).__name__
        raise InvalidSubscription("invalid_collection", f"not a collection id: {shown!r}")
    return value


def _prefix(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_URI_CHARS:
        raise InvalidSubscription("bad_request", "prefix must be a non-empty URI prefix")
    return value


def _changes(values: Iterable[Any] | None) -> frozenset[str] | None:
    if values is None:
        return None
    changes = frozenset(values)
    if not changes or not changes <= CHANGES:
        raise InvalidSubscription(
            "bad_request", f"change must list some of {', '.join(sorted(CHANGES))}"
        )
    return changes


def parse_target(target: str) -> Subscription | None:
    """The subscription in a handshake's request target; None for ``/`` (subscribe frame)."""
    try:
        parts = urlsplit(target)
    except ValueError:  # "//[x": urlsplit reads a netloc with a broken IPv6 literal
        raise InvalidSubscription("bad_request", "malformed request target") from None
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise InvalidSubscription("bad_request", "request path must start with /")
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, max_num_fields=16)
    except ValueError:
        raise InvalidSubscription("bad_request", "malformed query string") from None
    params: dict[str, str] = {}
    for key, value in pairs:
        if key in params:
            raise InvalidSubscription("bad_request", f"query parameter {key!r} given twice")
        params[key] = value
    if path == "/":
        return None
    collection = _collection(path[1:])
    change = params.get("change")
    return Subscription(
        collections={collection: _since(params.get("since"), collection)},
        filter=Filter(
            prefix=_prefix(params.get("prefix")),
            changes=_changes(change.split(",") if change is not None else None),
        ),
    )


def query_token(target: str) -> str | None:
    """The ``access_token`` query parameter of a request target, if any."""
    try:
        pairs = parse_qsl(urlsplit(target).query, max_num_fields=16)
    except ValueError:
        return None
    return next((value for key, value in pairs if key == "access_token"), None)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, if that is what it is."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def parse_subscribe(data: str | bytes) -> Subscription:
    """A client's first frame on ``/``; anything else raises InvalidSubscription."""
    if len(data) > MAX_CLIENT_FRAME_BYTES:
        raise InvalidSubscription("bad_request", "subscribe frame too large")
    try:
        obj = orjson.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidSubscription("bad_request", "first frame is not JSON") from None
    if not isinstance(obj, dict) or obj.get("type") != "subscribe":
        raise InvalidSubscription("bad_request", 'first frame must be {"type":"subscribe",...}')
    collections = obj.get("collections")
    if not isinstance(collections, dict) or not collections:
        raise InvalidSubscription("bad_request", "collections must be a non-empty object")
    if len(collections) > MAX_COLLECTIONS:
        raise InvalidSubscription(
            "bad_request", f"at most {MAX_COLLECTIONS} collections per connection"
        )
    wanted = {_collection(c): _since(since, c) for c, since in collections.items()}
    change = obj.get("change")
    if change is not None and (
        not isinstance(change, list) or not all(isinstance(c, str) for c in change)
    ):
        raise InvalidSubscription("bad_request", "change must be a list of change types")
    return Subscription(wanted, Filter(prefix=_prefix(obj.get("prefix")), changes=_changes(change)))


# --- the gateway's per-client, per-collection position --------------------------

IDLE, FROM_RING, SKIP, REPLAY = "idle", "from_ring", "skip", "replay"


@dataclass(slots=True)
class SendCursor:
    """Where one client stands in one collection, and what to send it next.

    ``position`` is the last sequence number accounted for (sent, filtered
    out or skipped); ``prev`` the last one actually sent (the next
    notification's ``prev``).  A cursor starts in replay mode and turns live
    once it reaches the gateway's in-memory window; from then on, falling
    out of that window means the client is too slow and gets skipped ahead
    instead of replayed (replay would let one slow reader load the log
    forever).
    """

    collection: str
    filter: Filter
    position: int
    prev: int
    live: bool = False

    def plan(self, window_start: int, head: int) -> str:
        """IDLE, FROM_RING, SKIP or REPLAY, given the window ``window_start..head`` in memory."""
        wanted = self.position + 1
        if wanted > head:
            self.live = True
            return IDLE
        if wanted >= window_start:
            self.live = True
            return FROM_RING
        return SKIP if self.live else REPLAY

    def accept(self, seq: int, loc: str, change: str) -> int | None:
        """Account for ``seq``; its frame's ``prev`` if the filters keep it, else None."""
        if seq != self.position + 1:
            raise ValueError(f"{self.collection}: expected seq {self.position + 1}, got {seq}")
        self.position = seq
        if not self.filter.matches(loc, change):
            return None
        prev, self.prev = self.prev, seq
        return prev

    def send_shared(self, last: int) -> None:
        """Account for ``position+1 .. last``, all sent with ``prev = seq - 1``.

        The frames an unfiltered client gets do not depend on the client
        (``prev`` is the seq before), so the gateway encodes them once and
        writes the same bytes to many clients; this moves the cursor over them.
        """
        if not self.filter.everything:
            raise ValueError(f"{self.collection}: a filtered cursor gets frames of its own")
        if last <= self.position:
            raise ValueError(f"{self.collection}: cannot send up to {last} from {self.position}")
        self.position = self.prev = last

    def skip_to(self, resume: int) -> tuple[int, int]:
        """Give up on ``position+1 .. resume-1``; the ``(from, resume)`` of the skipped frame."""
        first = self.position + 1
        if resume <= first:
            raise ValueError(f"{self.collection}: cannot skip from {first} to {resume}")
        self.position = self.prev = resume - 1
        return first, resume


# --- frames the gateway sends -----------------------------------------------------


def _frame(obj: Mapping[str, Any]) -> str:
    return orjson.dumps(obj).decode()


def hello(
    collection: str, head: int, earliest: int, *, server: str, now: datetime | None = None
) -> str:
    body = json.loads(outbound.head_message(collection, head, earliest, publisher=server, now=now))
    body["type"] = "hello"
    body["server"] = body.pop("publisher")
    return _frame(body)


def gap_too_old(collection: str, since: int, earliest: int, capabilitylist: str) -> str:
    return _frame(
        {
            "type": "gap_too_old",
            "collection": collection,
            "since": since,
            "earliest": earliest,
            "capabilitylist": capabilitylist,
        }
    )


def skipped(collection: str, first: int, resume: int) -> str:
    return _frame({"type": "skipped", "collection": collection, "from": first, "resume": resume})


def heartbeat(collection: str, head: int, *, now: datetime | None = None) -> str:
    return _frame(
        {
            "type": "heartbeat",
            "collection": collection,
            "head": head,
            "heartbeat": w3cdt.format(now or w3cdt.now()),
        }
    )


def error(code: str, message: str, *, collection: str | None = None) -> str:
    body: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if collection is not None:
        body["collection"] = collection
    return _frame(body)


def notification_tail(fmt: str, payload: bytes, signature: str | None) -> bytes:
    """The client-independent end of a notification frame, built once per record.

    Only ``seq``/``prev`` differ between clients, so the (escaped) payload is
    encoded once and shared by every connection's frame.
    """
    # orjson: escaping the payload into a JSON string is per record, and the
    # stdlib's json.dumps builds a new encoder per call.
    tail = b',"format":' + orjson.dumps(fmt) + b',"payload":'
    tail += orjson.dumps(payload.decode("utf-8"))
    if signature is not None:
        tail += b',"signature":' + orjson.dumps(signature)
    return tail + b"}"


def notification_frame(collection: str, seq: int, prev: int, tail: bytes | memoryview) -> bytes:
    """A whole notification frame (UTF-8, to be sent as a text frame)."""
    return b'{"type":"notification","collection":%s,"seq":%d,"prev":%d%s' % (
        orjson.dumps(collection),
        seq,
        prev,
        tail,
    )


# --- what a client receives ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    collection: str
    head: int
    earliest: int
    heartbeat: datetime
    server: str


@dataclass(frozen=True, slots=True)
class Notification:
    """A notification frame; ``payload`` is the exact signed bytes, for envelope.decode/verify."""

    collection: str
    seq: int
    prev: int
    format: str
    payload: bytes
    signature: str | None = None


@dataclass(frozen=True, slots=True)
class Skipped:
    """Sequence numbers ``first .. resume-1`` were not delivered (``from`` on the wire)."""

    collection: str
    first: int
    resume: int


@dataclass(frozen=True, slots=True)
class GapTooOld:
    collection: str
    since: int
    earliest: int
    capabilitylist: str


@dataclass(frozen=True, slots=True)
class Heartbeat:
    collection: str
    head: int
    heartbeat: datetime


@dataclass(frozen=True, slots=True)
class Error:
    code: str
    message: str
    collection: str | None = None


@dataclass(frozen=True, slots=True)
class Unknown:
    """A frame type this version does not know (a newer gateway): ignore it."""

    type: str


Frame = Hello | Notification | Skipped | GapTooOld | Heartbeat | Error | Unknown


def _bad(message: str) -> InvalidNotification:
    return InvalidNotification(f"WebSocket frame: {message}")


def _int(obj: Mapping[str, Any], key: str, minimum: int = 0) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_SEQ:
        raise _bad(f"{key!r} must be an integer >= {minimum}")
    return value


def _str(obj: Mapping[str, Any], key: str, *, optional: bool = False) -> Any:
    value = obj.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or (not value and not optional):
        raise _bad(f"{key!r} must be a string")
    if len(value) > MAX_URI_CHARS:
        raise _bad(f"{key!r} is longer than {MAX_URI_CHARS} characters")
    return value


def _coll(obj: Mapping[str, Any]) -> str:
    value = obj.get("collection")
    if not isinstance(value, str) or not is_valid_collection_id(value):
        raise _bad("'collection' is not a collection id")
    return value


def _when(obj: Mapping[str, Any], key: str) -> datetime:
    value = obj.get(key)
    if not isinstance(value, str):
        raise _bad(f"{key!r} must be a W3C datetime")
    try:
        return w3cdt.parse(value)
    except InvalidDatetime as exc:
        raise _bad(f"{key!r}: {exc}") from None


def _hello(obj: Mapping[str, Any]) -> Hello:
    head = _int(obj, "head")
    earliest = _int(obj, "earliest", 1)
    if earliest > head + 1:
        raise _bad("'earliest' is beyond head + 1")
    return Hello(_coll(obj), head, earliest, _when(obj, "heartbeat"), _str(obj, "server"))


def _notification(obj: Mapping[str, Any]) -> Notification:
    seq = _int(obj, "seq", 1)
    prev = _int(obj, "prev")
    if prev >= seq:
        raise _bad("'prev' must be below 'seq'")
    fmt = obj.get("format")
    if fmt not in FORMATS:
        raise _bad(f"'format' must be one of {', '.join(FORMATS)}")
    payload = obj.get("payload")
    if not isinstance(payload, str) or not payload:
        raise _bad("'payload' must be a non-empty string")
    try:
        data = payload.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad("'payload' is not valid Unicode") from None
    return Notification(_coll(obj), seq, prev, fmt, data, _str(obj, "signature", optional=True))


def _skipped(obj: Mapping[str, Any]) -> Skipped:
    first = _int(obj, "from", 1)
    resume = _int(obj, "resume", 2)
    if resume <= first:
        raise _bad("'resume' must be above 'from'")
    return Skipped(_coll(obj), first, resume)


def _gap_too_old(obj: Mapping[str, Any]) -> GapTooOld:
    since = _int(obj, "since")
    earliest = _int(obj, "earliest", 1)
    if earliest <= since + 1:
        raise _bad("'earliest' must be beyond since + 1")
    return GapTooOld(_coll(obj), since, earliest, _str(obj, "capabilitylist"))


def _heartbeat(obj: Mapping[str, Any]) -> Heartbeat:
    return Heartbeat(_coll(obj), _int(obj, "head"), _when(obj, "heartbeat"))


def _error(obj: Mapping[str, Any]) -> Error:
    collection = obj.get("collection")
    if collection is not None:
        collection = _coll(obj)
    return Error(_str(obj, "code"), _str(obj, "message", optional=True) or "", collection)


_PARSERS: dict[str, Callable[[Mapping[str, Any]], Frame]] = {
    "hello": _hello,
    "notification": _notification,
    "skipped": _skipped,
    "gap_too_old": _gap_too_old,
    "heartbeat": _heartbeat,
    "error": _error,
}


def parse_frame(data: str | bytes, *, max_bytes: int = MAX_FRAME_BYTES) -> Frame:
    """One server frame as a typed value; garbage raises envelope.InvalidNotification."""
    if len(data) > max_bytes:
        raise _bad(f"{len(data)} bytes exceeds {max_bytes}")
    try:
        obj = orjson.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise _bad("not JSON") from None
    if not isinstance(obj, dict):
        raise _bad("not a JSON object")
    kind = obj.get("type")
    if not isinstance(kind, str) or not kind:
        raise _bad("no 'type'")
    parser = _PARSERS.get(kind)
    if parser is None:
        return Unknown(kind[:80])
    return parser(obj)


# --- what a client sends -----------------------------------------------------------


def subscribe_frame(
    collections: Mapping[str, int | None],
    *,
    prefix: str | None = None,
    change: Iterable[str] | None = None,
) -> str:
    """The first frame for ``ws://host:port/``; validated as the gateway will validate it."""
    if not collections or len(collections) > MAX_COLLECTIONS:
        raise InvalidSubscription("bad_request", f"subscribe to 1..{MAX_COLLECTIONS} collections")
    wanted = {_collection(c): _since(since, c) for c, since in collections.items()}
    changes = _changes(change)
    body: dict[str, Any] = {"type": "subscribe", "collections": wanted}
    if prefix is not None:
        body["prefix"] = _prefix(prefix)
    if changes is not None:
        body["change"] = sorted(changes)
    return _frame(body)


def subscription_url(
    hub: str,
    *,
    since: int | None = None,
    prefix: str | None = None,
    change: Iterable[str] | None = None,
    access_token: str | None = None,
) -> str:
    """A collection's hub URL (``ws://host:port/<collection>``) with the query filled in."""
    parts = urlsplit(hub)
    if parts.scheme not in ("ws", "wss") or not parts.netloc:
        raise InvalidSubscription("bad_request", f"not a ws:// or wss:// URL: {hub[:200]!r}")
    _collection(unquote(parts.path)[1:])
    query: list[tuple[str, str]] = []
    if since is not None:
        query.append(("since", str(_since(since))))
    if prefix is not None:
        query.append(("prefix", _prefix(prefix) or ""))
    changes = _changes(change)
    if changes is not None:
        query.append(("change", ",".join(sorted(changes))))
    if access_token is not None:
        query.append(("access_token", access_token))
    encoded = urlencode(query, quote_via=quote, safe=",")
    return urlunsplit((parts.scheme, parts.netloc, parts.path, encoded, ""))
