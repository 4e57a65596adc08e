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
    ``GET`` returns the topic's content -- its latest Change Notification
    (an empty ``changelist-notification`` ``<urlset>`` before the first) --
    with ``Link: <topic>; rel="self", <hub>; rel="hub"`` (WebSub discovery)
    and where the log stands: ``X-RsNotify-Head`` (last seq),
    ``X-RsNotify-Earliest`` (first retained seq) and ``X-RsNotify-Heartbeat``
    (the hub's clock).  The rsnotify Destination polls it as its heartbeat.
``BASE<collection>/feed.atom``
    The Atom feed of the collection's notifications (:mod:`.atom`).

Subscriptions (W3C WebSub sections 5.1 to 5.3)
    ``hub.mode`` (``subscribe`` / ``unsubscribe``), ``hub.topic``,
    ``hub.callback``, optional ``hub.lease_seconds`` and ``hub.secret``.  A
    well-formed request is answered ``202 Accepted`` and verified
    asynchronously: the hub GETs the callback with ``hub.mode``,
    ``hub.topic``, ``hub.challenge`` and (subscribe) ``hub.lease_seconds``;
    only a 2xx whose body is exactly the challenge activates (or removes) the
    subscription.  A malformed request gets ``400`` with the reason.  A
    request the hub will not honour (unknown topic, too many subscriptions)
    is *denied*: the hub GETs the callback with ``hub.mode=denied``,
    ``hub.topic`` and ``hub.reason``.  ``hub.mode=publish`` is refused (400):
    this hub is fed by its publisher's log, not by pings.

Leases
    The hub grants the requested lease clamped to ``[minimum, maximum]``
    (the default when none is asked).  Subscribing again with the same topic
    and callback is a renewal: it restarts the lease, replaces the secret,
    and keeps the delivery cursor.  An expired subscription is removed
    with its cursor.

Content distribution (WebSub section 7, ResourceSync Change Notification 4.3)
    One ``POST`` per notification, body = the Change Notification XML
    (:func:`rsnotify.envelope.to_xml`, ``Content-Type: application/xml``),
    headers ``Link: <topic>; rel="self", <hub>; rel="hub"``,
    ``X-Hub-Signature: sha256=<hex HMAC-SHA256 of the body with hub.secret>``
    (only when the subscription has a secret) and, for Destinations that
    want them, ``X-RsNotify-Seq: N`` and ``X-RsNotify-Prev: P`` (the seq last
    delivered to this subscription, or its starting point: ``prev`` equal to
    the last seq received means nothing is missing), and, when the publisher
    signs (``--secret``), ``X-RsNotify-Signature`` with its own key.  A 2xx advances the
    subscription's cursor; ``410 Gone`` ends the subscription; anything else
    (or no answer within the timeout) is retried, same notification, with
    exponential backoff and jitter: delivery is in order and at least once.

``gap_too_old``: beyond the log's retention
    When the next seq a subscription needs is no longer in the log (the
    callback was down longer than the retention), the hub POSTs, once,
    ``Content-Type: application/json``, ``X-RsNotify-Type: gap_too_old``,
    signed like a notification::

        {"type":"gap_too_old","collection":c,"since":S,"earliest":E,"head":H,
         "capabilitylist":URI,"changelist":URI}

    the WebSocket frame of the same name plus ``head`` and ``changelist``
    (the Change List, or Change List Index, to poll; omitted when the hub
    does not know it): seqs ``S+1 .. E-1`` are gone, catch up from the
    Change List Index of the Capability List.  As on WebSocket, delivery
    then goes on live, after ``H`` (the next ``X-RsNotify-Prev`` is ``H``):
    the catch-up covers ``S+1 .. H``, and a callback that cannot keep up with
    a short retention is not sent one notice after another at its trailing
    edge.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .. import envelope, w3cdt
from ..envelope import MAX_URI_CHARS
from . import TransportError

MODES = ("subscribe", "unsubscribe")
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
GAP_TYPE = "application/json"
BACKOFF_MIN = 0.2


class RequestError(TransportError):
    """A subscription request the hub answers with ``400`` (the message says why)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


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
class LeasePolicy:
    """Lease lengths the hub grants (seconds)."""

    default: int = 10 * 24 * 3600
    minimum: int = 1
    maximum: int = 30 * 24 * 3600

    def grant(self, requested: int | None) -> int:
        if requested is None:
            return self.default
        return max(self.minimum, min(self.maximum, requested))


def _absolute_http(url: str, what: str) -> str:
    if not url or len(url) > MAX_URI_CHARS:
        raise RequestError(f"{what} must be an absolute http(s) URL of at most {MAX_URI_CHARS}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RequestError(f"{what} must be an absolute http(s) URL")
    if parts.fragment:
        raise RequestError(f"{what} must not have a fragment")
    return url


def parse_request(
    form: Mapping[str, str], topic_collection: Callable[[str], str | None]
) -> SubscriptionRequest:
    """Validate a hub request form; ``topic_collection`` maps a topic URL to a collection."""
    mode = form.get("hub.mode", "")
    if mode == "publish":
        raise RequestError("this hub is fed by its publisher's notification log; no pings")
    if mode not in MODES:
        raise RequestError("hub.mode must be subscribe or unsubscribe")
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
    """``url`` with ``params`` added to its query (WebSub: keep the callback's own query)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    query.extend(params.items())
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))


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


def verify_signature(body: bytes, header: str | None, secret: bytes) -> bool:
    """True when ``header`` is a sha256 (or stronger) HMAC of ``body`` with ``secret``."""
    if not header:
        return False
    method, sep, digest = header.partition("=")
    algorithms = {"sha256": hashlib.sha256, "sha384": hashlib.sha384, "sha512": hashlib.sha512}
    if not sep or method not in algorithms:
        return False
    expected = hmac.new(secret, body, algorithms[method]).hexdigest()
    return hmac.compare_digest(expected, digest.strip().lower())


def link_header(topic: str, hub: str) -> str:
    return f'<{topic}>; rel="self", <{hub}>; rel="hub"'


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
) -> dict[str, str]:
    """Headers of one content-distribution POST."""
    headers = {"Content-Type": content_type, "Link": link_header(topic, hub)}
    if secret is not None:
        headers[SIGNATURE_HEADER] = signature(body, secret)
    if seq is not None:
        headers[SEQ_HEADER] = str(seq)
    if prev is not None:
        headers[PREV_HEADER] = str(prev)
    if kind is not None:
        headers[TYPE_HEADER] = kind
    return headers


def head_headers(*, topic: str, hub: str, head: int, earliest: int) -> dict[str, str]:
    """Headers of a topic GET: discovery links and where the log stands."""
    return {
        "Content-Type": NOTIFICATION_TYPE,
        "Link": link_header(topic, hub),
        HEAD_HEADER: str(head),
        EARLIEST_HEADER: str(earliest),
        HEARTBEAT_HEADER: w3cdt.format(w3cdt.now()),
    }


def empty_notification(capability_list: str) -> bytes:
    """A ``changelist-notification`` document with no change (a topic before its first)."""
    from .. import sitemap
    from ..model import Link, Root, make_document

    document = make_document(
        Root.URLSET,
        envelope.NOTIFICATION_CAPABILITY,
        links=[Link(rel="up", href=capability_list)],
        entries=[],
    )
    return sitemap.serialize(document)


def gap_too_old(
    collection: str,
    since: int,
    earliest: int,
    head: int,
    capability_list: str,
    changelist: str | None,
) -> bytes:
    """The body of the ``gap_too_old`` POST (see the module docstring)."""
    body: dict[str, object] = {
        "type": "gap_too_old",
        "collection": collection,
        "since": since,
        "earliest": earliest,
        "head": head,
        "capabilitylist": capability_list,
    }
    if changelist:
        body["changelist"] = changelist
    return envelope.dumps(body)


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
        self.failures = 0
        self.next_attempt = 0.0
        self.backoff_max = backoff_max

    def plan(self, earliest: int, head: int) -> Action:
        """What to do next, given the log's retained range ``earliest..head``."""
        if self.cursor >= head:
            return Action.IDLE
        if self.cursor + 1 < earliest:
            return Action.GAP
        return Action.DELIVER

    def delivered(self, seq: int) -> None:
        self.cursor = max(self.cursor, seq)
        self.failures = 0
        self.next_attempt = 0.0

    def gap_delivered(self, earliest: int, head: int) -> None:
        """``gap_too_old`` was accepted: go on live, after ``head``."""
        self.delivered(max(head, earliest - 1))

    def failed(self, now: float, jitter: float = 1.0) -> float:
        """Record a failed POST; returns the delay before retrying (``jitter`` in [0.5, 1])."""
        ceiling = min(self.backoff_max, BACKOFF_MIN * 2.0**self.failures)
        self.failures += 1
        delay = ceiling * max(0.5, min(1.0, jitter))
        self.next_attempt = now + delay
        return delay


def classify_response(status: int) -> str:
    """``ok`` (2xx), ``gone`` (410: the subscriber ended it), else ``retry``."""
    if 200 <= status < 300:
        return "ok"
    if status == 410:
        return "gone"
    return "retry"
