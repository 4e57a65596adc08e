"""WebSub for ResourceSync Change Notification: the protocol core (pure, no I/O).

:mod:`.websub` is the hub's I/O; this module decides everything that can be
decided without a socket, so it is unit tested with plain values
(``tests/test_websub_core.py``).

URLs (``BASE`` is the hub's public base URL, ``http://HOST:PORT/`` by default)

``BASE``
    The hub.  ``POST`` with a form (``application/x-www-form-urlencoded``)
    subscribes or unsubscribes; ``GET`` lists the topics (JSON).
``BASE<collection>``
    The **topic** of one collection: the collection's channel URL on the hub.
    ``GET``/``HEAD`` answer 200, ``Content-Type: application/xml`` and
    ``Link: <topic>; rel="self", <hub>; rel="hub"`` (Change Notification
    1.0.1 section 4.1, WebSub discovery); the body is the latest Change
    Notification, or nothing (``Content-Length: 0``) before the first
    and where the log stands: ``X-RsNotify-Head`` (last seq),
    ``X-RsNotify-Earliest`` (first retained seq) and ``X-RsNotify-Heartbeat``
    (the hub's clock).  The rsnotify Destination polls it as its heartbeat.
``BASE<collection>/feed.atom``
    The Atom feed of the collection's notifications (:mod:`.atom`).
``BASE<collection>/framework``
    The collection's **framework topic** (Framework Notification 1.0.1;
    Change Notification section 4: the two "must be sent on different
    channels"), served when the publisher watches the framework
    (``--framework-interval``): the same ``GET``/``HEAD`` answers and
    subscriptions, and deliveries of ``framework-notification`` payloads
    from the collection's framework stream (:mod:`rsnotify.framework`), in
    order, chained by detection time, with the same retries and cursors.

Subscriptions (W3C WebSub sections 5.1 to 5.3)
    ``hub.mode`` (``subscribe`` / ``unsubscribe``), ``hub.topic``,
    ``hub.callback``, optional ``hub.lease_seconds`` and ``hub.secret``.  A
    well-formed request is answered ``202 Accepted`` and verified
    asynchronously: the hub GETs the callback with ``hub.mode``,
    ``hub.topic``, ``hub.challenge`` and (subscribe) ``hub.lease_seconds``;
    only a 2xx whose body is exactly the challenge activates (or removes) the
    subscription.  What can be refused without contacting the callback is
    refused at once with a 4xx and the reason (WebSub 5.1: malformed, unknown
    topic, a callback address the hub may not call, too many subscriptions
    for this client, callback host or hub); a subscription refused after the
    202 (the hub filled up during the verification) is *denied*: a GET with
    ``hub.mode=denied``, ``hub.topic`` and ``hub.reason``.

Publishing (Change Notification 1.0.1 section 4.1)
    A Source may hand this hub a notification for a topic it serves: a
    ``POST`` of the Change Notification with ``Content-Type:
    application/xml`` and ``Link: <topic>; rel="self", <hub>; rel="hub"``
    (answered 200), or the widespread ping ``hub.mode=publish`` with
    ``hub.url`` (or ``hub.topic``) = the topic, the Capability List or its
    Change List (answered 202).  The Change Lists remain the truth: either
    makes the publisher read them at once, and what it finds is sequenced,
    logged and delivered like any change (so detection over HTTP takes a
    round trip, not a poll interval).  With ``--secret`` both must carry
    ``X-Hub-Signature: sha256=<HMAC of the body>``.

Leases
    The hub grants the requested lease clamped to ``[minimum, maximum]``
    (the default when none is asked): 300 s to 31 days by default, as
    Change Notification 4.2 recommends.  Subscribing again with the same topic
    and callback is a renewal: it restarts the lease, replaces the secret,
    and keeps the delivery cursor.  An expired subscription is removed
    with its cursor.

Content distribution (WebSub section 7, ResourceSync Change Notification 4.3)
    One ``POST`` per notification, body = a Change Notification of every
    change that waited (at most :data:`MAX_BATCH_CHANGES` and
    :data:`MAX_BATCH_BYTES`: one change when the callback keeps up, more
    when it lags; :func:`rsnotify.envelope.compose`, ``Content-Type:
    application/xml``),
    headers ``Link: <topic>; rel="self", <hub>; rel="hub"``,
    ``X-Hub-Signature: sha256=<hex HMAC-SHA256 of the body with hub.secret>``
    (only when the subscription has a secret) and, for Destinations that
    want them, ``X-RsNotify-Seq: N`` (the last seq of the notification) and
    ``X-RsNotify-Prev: P`` (the seq last
    delivered to this subscription, or its starting point: ``prev`` equal to
    the last seq received means nothing is missing), and, when the publisher
    signs (``--secret``), ``X-RsNotify-Signature`` with its own key.  A 2xx advances the
    subscription's cursor; ``410 Gone`` ends the subscription; anything else
    (or no answer within the timeout) is retried, same notification, with
    exponential backoff and jitter: delivery is in order and at least once.

``gap_too_old``: beyond the log's retention
    When the next seq a subscription needs is no longer in the log (the
    callback was down longer than the retention), the hub POSTs, once, in
    the topic's content type (WebSub 7: ``application/xml``),
    ``X-RsNotify-Type: gap_too_old``, signed like a notification::

        <rsn:gap xmlns:rsn="urn:x-rsnotify:notification:1" collection="c"
          since="S" earliest="E" head="H" capabilitylist="URI" changelist="URI"/>

    It is not a ``<urlset>``: a Destination that knows only the standard
    does not take it for a notification of no changes, and learns of the
    loss from the next notification's ``from``, later than the last
    ``until`` it has.  The fields are those of the WebSocket frame of the
    same name plus ``head`` and ``changelist``
    (the Change List, or Change List Index, to poll; omitted when the hub
    does not know it): seqs ``S+1 .. E-1`` are gone, catch up from the
    Change List Index of the Capability List.  As on WebSocket, delivery
    then goes on live, after ``H`` (the next ``X-RsNotify-Prev`` is ``H``):
    the catch-up covers ``S+1 .. H``, and a callback that cannot keep up with
    a short retention is not sent one notice after another at its trailing
    edge.

Why one module of ~640 lines: it is one protocol, both ends, and about a
fifth of the file is the reference above.  The hub (:mod:`.websub`), the
push to an external hub (:mod:`.websubpush`) and the subscriber's callback
(:mod:`rsnotify.subscriber.websub`) all read and write its requests,
verification URLs, headers, signatures, gap notices and batches through these
functions, so both ends agree by construction and the whole protocol is
tested without a socket.  What is not protocol is elsewhere: the hub's
defences in :mod:`.websubguard`, its subscription store in
:mod:`.websubstore`, the Atom feed in :mod:`.atom`.
"""

from __future__ import annotations

import datetime as dt  # for classes with a field named datetime
import enum
import hashlib
import hmac
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode, urlsplit

import orjson

from .. import envelope, framework, w3cdt
from ..backoff import Backoff
from ..envelope import MAX_URI_CHARS
from ..errors import RequestError as RequestError  # re-exported: its old home
from ..errors import RsNotifyError
from ..log import LogRecord

logger = logging.getLogger("rsnotify.transport.websub")

MODES = ("subscribe", "unsubscribe")
#: One delivery POST holds at most this many changes, and about this many bytes.
MAX_BATCH_CHANGES = 100
MAX_BATCH_BYTES = 60 * 1024
#: WebSub 5.1: hub.secret MUST be less than 200 bytes.
MAX_SECRET_BYTES = 199
SIGNATURE_HEADER = "X-Hub-Signature"
SEQ_HEADER = "X-RsNotify-Seq"
PREV_HEADER = "X-RsNotify-Prev"
TYPE_HEADER = "X-RsNotify-Type"
HEAD_HEADER = "X-RsNotify-Head"
EARLIEST_HEADER = "X-RsNotify-Earliest"
HEARTBEAT_HEADER = "X-RsNotify-Heartbeat"
#: The publisher's ``--secret`` signature (``<key id>:sha256=<hex>``), when it signs:
#: what rsnotify Destinations configured with ``--secret`` check, as on MQTT/WebSocket.
PUBLISHER_SIGNATURE_HEADER = "X-RsNotify-Signature"
NOTIFICATION_TYPE = "application/xml"
ATOM_TYPE = "application/atom+xml"
GAP_TYPE = NOTIFICATION_TYPE  # WebSub 7: the topic's content type
BACKOFF_MIN = 0.2


@dataclass(frozen=True, slots=True)
class SubscriptionRequest:
    """A well-formed ``hub.mode=subscribe|unsubscribe`` request, not yet verified."""

    mode: str
    topic: str
    collection: str | None  # None: not a topic of this hub (denied after the 202)
    callback: str
    lease_seconds: int | None
    secret: bytes | None


@dataclass(frozen=True, slots=True)
class PublishRequest:
    """``hub.mode=publish``: ``url`` (a topic, Capability List or Change List) changed."""

    url: str


#: Change Notification 4.2: "not less than 300 seconds ... not more than 2678400 seconds".
LEASE_MINIMUM = 300
LEASE_MAXIMUM = 2_678_400


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    """Lease lengths the hub grants (seconds)."""

    default: int = 10 * 24 * 3600
    minimum: int = LEASE_MINIMUM
    maximum: int = LEASE_MAXIMUM

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.default <= self.maximum:
            raise ValueError("leases need 1 <= minimum <= default <= maximum")

    def grant(self, requested: int | None) -> int:
        if requested is None:
            return self.default
        return max(self.minimum, min(self.maximum, requested))


_CONTROL = re.compile(r"[\x00-\x20\x7f]")


def _absolute_http(url: str, what: str) -> str:
    if not url or len(url) > MAX_URI_CHARS:
        raise RequestError(f"{what} must be an absolute http(s) URL of at most {MAX_URI_CHARS}")
    if _CONTROL.search(url):
        raise RequestError(f"{what} must not hold spaces or control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise RequestError(f"{what} must be an absolute http(s) URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RequestError(f"{what} must be an absolute http(s) URL")
    if parts.fragment:
        raise RequestError(f"{what} must not have a fragment")
    return url


def parse_request(
    form: Mapping[str, str], topic_collection: Callable[[str], str | None]
) -> SubscriptionRequest | PublishRequest:
    """Validate a hub request form; ``topic_collection`` maps a topic URL to a collection."""
    mode = form.get("hub.mode", "")
    if mode == "publish":
        url = form.get("hub.url") or form.get("hub.topic") or ""
        return PublishRequest(_absolute_http(url, "hub.url"))
    if mode not in MODES:
        raise RequestError("hub.mode must be subscribe, unsubscribe or publish")
    topic = _absolute_http(form.get("hub.topic", ""), "hub.topic")
    callback = _absolute_http(form.get("hub.callback", ""), "hub.callback")
    lease: int | None = None
    text = form.get("hub.lease_seconds")
    if text not in (None, ""):
        assert text is not None
        if not text.isdigit() or int(text) < 1:
            raise RequestError("hub.lease_seconds must be a positive integer")
        lease = int(text)
    secret: bytes | None = None
    raw = form.get("hub.secret")
    if raw not in (None, ""):
        assert raw is not None
        secret = raw.encode("utf-8", "surrogateescape")
        if len(secret) > MAX_SECRET_BYTES:
            raise RequestError(f"hub.secret must be less than {MAX_SECRET_BYTES + 1} bytes")
    return SubscriptionRequest(mode, topic, topic_collection(topic), callback, lease, secret)


def with_query(url: str, params: Mapping[str, str]) -> str:
    """``url`` with ``params`` appended to its query.

    WebSub 5.3: the hub "MUST preserve the query string" of the callback:
    its bytes are kept as they are, never decoded and encoded again.
    """
    base, _, _ = url.partition("#")
    joiner = "&" if "?" in base and not base.endswith(("?", "&")) else ""
    if "?" not in base:
        joiner = "?"
    return base + joiner + urlencode(params)


def verification_url(request: SubscriptionRequest, challenge: str, lease: int | None) -> str:
    params = {"hub.mode": request.mode, "hub.topic": request.topic, "hub.challenge": challenge}
    if request.mode == "subscribe" and lease is not None:
        params["hub.lease_seconds"] = str(lease)
    return with_query(request.callback, params)


def denial_url(callback: str, topic: str, reason: str) -> str:
    return with_query(callback, {"hub.mode": "denied", "hub.topic": topic, "hub.reason": reason})


def challenge_answered(status: int, body: bytes, challenge: str) -> bool:
    """WebSub 5.3: a 2xx whose body is exactly the challenge confirms intent."""
    return 200 <= status < 300 and body == challenge.encode("ascii")


def signature(body: bytes, secret: bytes) -> str:
    """The ``X-Hub-Signature`` value: ``sha256=<hex HMAC of the body>``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


#: WebSub 7.1: the methods a hub may state; sha1 is accepted (with a warning by the caller).
SIGNATURE_METHODS = {
    "sha1": hashlib.sha1,
    "sha256": hashlib.sha256,
    "sha384": hashlib.sha384,
    "sha512": hashlib.sha512,
}


def signature_method(body: bytes, header: str | None, secret: bytes) -> str | None:
    """The method of ``header`` when it is a valid HMAC of ``body`` with ``secret``, else None.

    WebSub 7.1.2: the subscriber checks the signature "using the method the
    hub stated": sha1, sha256, sha384 or sha512.
    """
    if not header:
        return None
    method, sep, digest = header.partition("=")
    method = method.strip().lower()
    algorithm = SIGNATURE_METHODS.get(method)
    if not sep or algorithm is None:
        return None
    expected = hmac.new(secret, body, algorithm).hexdigest()
    given = digest.strip().lower()
    if not given.isascii() or not hmac.compare_digest(expected, given):
        return None
    return method


def verify_signature(body: bytes, header: str | None, secret: bytes) -> bool:
    """True when ``header`` is a valid HMAC of ``body`` with ``secret`` (any WebSub method)."""
    return signature_method(body, header, secret) is not None


def link_header(topic: str, hub: str, *more_hubs: str, resourcesync: str | None = None) -> str:
    """``Link`` of a topic, a Source's POST and a delivery (Change Notification 4.1, 4.3).

    ``self`` and ``hub`` are mandatory; Examples 2 and 6 add the Capability
    List as ``rel="resourcesync"``, which we do when we know it.
    """
    hubs = "".join(f', <{h}>; rel="hub"' for h in (hub, *more_hubs))
    tail = f', <{resourcesync}>; rel="resourcesync"' if resourcesync else ""
    return f'<{topic}>; rel="self"{hubs}{tail}'


def link_targets(header: str | None) -> dict[str, list[str]]:
    """``rel -> [href]`` of a ``Link`` header (enough for self and hub)."""
    out: dict[str, list[str]] = {}
    for part in re.split(r",\s*(?=<)", header or ""):
        match = re.match(r"\s*<([^>]*)>(.*)", part, re.S)
        if match is None:
            continue
        for rel in re.findall(r"""rel\s*=\s*"?([^";,]+)"?""", match.group(2)):
            for name in rel.split():
                out.setdefault(name.lower(), []).append(match.group(1).strip())
    return out


def content_headers(
    *,
    topic: str,
    hub: str,
    body: bytes,
    secret: bytes | None,
    content_type: str,
    seq: int | None = None,
    prev: int | None = None,
    kind: str | None = None,
    resourcesync: str | None = None,
) -> dict[str, str]:
    """Headers of one content-distribution POST."""
    link = link_header(topic, hub, resourcesync=resourcesync)
    headers = {"Content-Type": content_type, "Link": link}
    if secret is not None:
        headers[SIGNATURE_HEADER] = signature(body, secret)
    if seq is not None:
        headers[SEQ_HEADER] = str(seq)
    if prev is not None:
        headers[PREV_HEADER] = str(prev)
    if kind is not None:
        headers[TYPE_HEADER] = kind
    return headers


def head_headers(
    *, topic: str, hubs: list[str], head: int, earliest: int, resourcesync: str | None = None
) -> dict[str, str]:
    """Headers of a topic GET: discovery links and where the log stands."""
    return {
        "Content-Type": NOTIFICATION_TYPE,
        "Link": link_header(topic, *hubs, resourcesync=resourcesync),
        HEAD_HEADER: str(head),
        EARLIEST_HEADER: str(earliest),
        HEARTBEAT_HEADER: w3cdt.format(w3cdt.now()),
    }


def gap_too_old(
    collection: str,
    since: int,
    earliest: int,
    head: int,
    capability_list: str,
    changelist: str | None,
) -> bytes:
    """The body of the ``gap_too_old`` POST (see the module docstring)."""
    from lxml import etree

    attrs = {
        "collection": collection,
        "since": str(since),
        "earliest": str(earliest),
        "head": str(head),
        "capabilitylist": capability_list,
    }
    if changelist:
        attrs["changelist"] = changelist
    element = etree.Element(
        f"{{{envelope.RSNOTIFY_NS}}}gap", attrs, nsmap={"rsn": envelope.RSNOTIFY_NS}
    )
    return etree.tostring(element, xml_declaration=True, encoding="UTF-8")


@dataclass(frozen=True, slots=True)
class GapNotice:
    """A decoded ``gap_too_old`` body."""

    since: int
    earliest: int
    head: int | None


def read_gap(body: bytes) -> GapNotice | None:
    """Parse a ``gap_too_old`` body (the XML form, or the JSON of earlier hubs)."""
    from lxml import etree

    try:
        if body.lstrip()[:1] == b"{":
            obj = orjson.loads(body)
            head = obj.get("head")
            return GapNotice(int(obj["since"]), int(obj["earliest"]), int(head) if head else None)
        parser = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)
        root = etree.fromstring(body, parser)
        if root.tag != f"{{{envelope.RSNOTIFY_NS}}}gap":
            return None
        head_text = root.get("head")
        return GapNotice(
            int(root.get("since", "")),
            int(root.get("earliest", "")),
            int(head_text) if head_text and head_text.isdigit() else None,
        )
    except (ValueError, KeyError, TypeError, etree.XMLSyntaxError):
        return None


# --- rendering: one change at a time, notifications from them ---------------------------


@dataclass(frozen=True, slots=True)
class RenderedChange:
    """One logged change, rendered once (its ``<url>``) for every notification it goes into."""

    seq: int
    fragment: bytes | None  # None: unrenderable (the hub sends a gap instead)
    datetime: dt.datetime | None = None
    since: dt.datetime | None = None
    record: LogRecord | None = None

    @property
    def start(self) -> dt.datetime | None:
        return self.since if self.since is not None else self.datetime


def _rendered(
    stream: str, record: LogRecord, read: Callable[[bytes], tuple[bytes, datetime, datetime | None]]
) -> RenderedChange:
    """Render a log record with ``read`` (-> fragment, time, interval start); a record
    that cannot be rendered is logged and marked."""
    try:
        fragment, when, since = read(record.data)
    except (ValueError, KeyError, TypeError, RsNotifyError) as exc:
        logger.error("%s: log record %d cannot be rendered (%s)", stream, record.seq, exc)
        return RenderedChange(record.seq, None)
    return RenderedChange(record.seq, fragment, when, since, record)


def _change_record(data: bytes) -> tuple[bytes, datetime, datetime | None]:
    n = envelope.from_json(data, max_bytes=max(len(data), 1))
    return envelope.url_fragment(n), n.datetime, n.since


def _framework_record(data: bytes) -> tuple[bytes, datetime, datetime | None]:
    """A framework change is dated by its detection (:mod:`rsnotify.framework`): its
    interval runs over detection times, so :func:`compose_batch` chains them too."""
    change = framework.from_record(data)
    if change.detected is None:
        raise ValueError("no detection time")
    return framework.url_fragment(change), change.detected, change.since


def render_change(collection: str, record: LogRecord) -> RenderedChange:
    """Render a change record's ``<url>`` (see :func:`_rendered`)."""
    return _rendered(collection, record, _change_record)


def render_record(stream: str, record: LogRecord) -> RenderedChange:
    """Render a record of a collection's change stream or of its framework stream."""
    framework_stream = framework.collection_of(stream) is not None
    return _rendered(stream, record, _framework_record if framework_stream else _change_record)


def compose_batch(
    items: Sequence[RenderedChange],
    *,
    capabilitylist: str,
    collection: str,
    capability: str = envelope.NOTIFICATION_CAPABILITY,
) -> bytes:
    """One notification of consecutive changes, ``from`` the first ``until`` the last.

    ``capability`` is ``change-notification``, or ``framework-notification``
    for a framework stream (whose records are dated by detection time).
    """
    first, last = items[0], items[-1]
    assert first.start is not None and last.datetime is not None
    return envelope.compose(
        [i.fragment for i in items if i.fragment is not None],
        capabilitylist=capabilitylist,
        from_=first.start,
        until=max(last.datetime, first.start),
        collection=collection,
        published=w3cdt.now(),
        capability=capability,
    )


def take_batch(items: list[RenderedChange]) -> list[RenderedChange]:
    """The changes of one delivery: the leading renderable run, within the size bounds.

    When the bounds cut inside a run of changes sharing one datetime, the cut
    moves back to where the datetime changed (if anything is left), so that
    consecutive notifications advance ``until``: a Destination that has only
    the interval chain sees a lost notification by its interval, and one
    ``[t, t]`` interval after another would hide it.
    """
    out: list[RenderedChange] = []
    size = 0
    capped = False
    for item in items:
        if item.fragment is None:
            break
        if out and (len(out) >= MAX_BATCH_CHANGES or size + len(item.fragment) > MAX_BATCH_BYTES):
            capped = True
            break
        out.append(item)
        size += len(item.fragment)
    if capped and len(out) < len(items) and items[len(out)].datetime == out[-1].datetime:
        keep = len(out)
        while keep > 1 and out[keep - 1].datetime == out[-1].datetime:
            keep -= 1
        if keep >= 1 and out[keep - 1].datetime != out[-1].datetime:
            out = out[:keep]
    return out


# --- subscriptions and their delivery cursors -------------------------------------------


@dataclass(slots=True)
class Subscription:
    """One verified subscription: what is persisted (the store) and what delivery needs."""

    collection: str
    topic: str
    callback: str
    secret: bytes | None
    lease_seconds: int
    expires: float  # epoch seconds
    cursor: int  # the last seq delivered (2xx) -- or the starting point
    client: str = ""  # the address that subscribed (per-client limits)

    @property
    def key(self) -> tuple[str, str]:
        return (self.collection, self.callback)

    def expired(self, now: float) -> bool:
        return now >= self.expires


def activate(
    existing: Subscription | None,
    request: SubscriptionRequest,
    *,
    lease: int,
    head: int,
    now: float,
) -> Subscription:
    """The subscription after a verified subscribe: new (from ``head``) or renewed."""
    assert request.collection is not None
    if existing is not None and not existing.expired(now):
        existing.lease_seconds = lease
        existing.expires = now + lease
        existing.secret = request.secret
        existing.topic = request.topic
        return existing
    return Subscription(
        collection=request.collection,
        topic=request.topic,
        callback=request.callback,
        secret=request.secret,
        lease_seconds=lease,
        expires=now + lease,
        cursor=head,
    )


class Action(enum.Enum):
    IDLE = "idle"  # nothing new: wait for the log
    DELIVER = "deliver"  # POST seq cursor + 1
    GAP = "gap"  # cursor + 1 is gone from the log: POST gap_too_old


class Delivery:
    """The delivery state of one subscription: cursor, failures, backoff (pure)."""

    def __init__(self, cursor: int, *, backoff_max: float = 30.0) -> None:
        self.cursor = cursor
        self.next_attempt = 0.0
        self.backoff_max = backoff_max
        self._backoff = Backoff(initial=BACKOFF_MIN, maximum=backoff_max)

    @property
    def failures(self) -> int:
        """Failed POSTs in a row."""
        return self._backoff.attempts

    def plan(self, earliest: int, head: int) -> Action:
        """What to do next, given the log's retained range ``earliest..head``."""
        if self.cursor >= head:
            return Action.IDLE
        if self.cursor + 1 < earliest:
            return Action.GAP
        return Action.DELIVER

    def delivered(self, seq: int) -> None:
        self.cursor = max(self.cursor, seq)
        self._backoff.reset()
        self.next_attempt = 0.0

    def gap_delivered(self, earliest: int, head: int) -> None:
        """``gap_too_old`` was accepted: go on live, after ``head``."""
        self.delivered(max(head, earliest - 1))

    def failed(self, now: float, jitter: float = 1.0) -> float:
        """Record a failed POST; returns the delay before retrying (``jitter`` in [0.5, 1])."""
        delay = self._backoff.next(jitter)
        self.next_attempt = now + delay
        return delay


def classify_response(status: int) -> str:
    """``ok`` (2xx), ``gone`` (410: the subscriber ended it), else ``retry``."""
    if 200 <= status < 300:
        return "ok"
    if status == 410:
        return "gone"
    return "retry"
