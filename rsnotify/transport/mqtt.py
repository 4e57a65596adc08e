"""The MQTT transport: tail the log, publish each notification at QoS 1, in order.

Per collection the pusher publishes ``<prefix>/<level>/changes`` (one
message per sequence number, strictly in sequence order; ``<level>`` is the
collection's broker-safe topic level, :mod:`.topics`) and keeps a retained
``<prefix>/<level>/head`` message (latest seq, earliest retained seq,
heartbeat time) refreshed every ``heartbeat`` seconds and right after each
(re)connect, so a Destination can tell at connect time whether it missed
anything and whether the publisher is alive.

Threads.  paho-mqtt runs its network loop in a thread of its own
(``loop_start()``).  Its callbacks never do work: each one only hands an event
to the asyncio loop with ``call_soon_threadsafe``.  All bookkeeping (window,
acks, cursors, reconnects) happens on the asyncio side, so it needs no locks.

Delivery.  At most ``window`` messages (notifications and heads together),
and never more than the broker's MQTT 5 Receive Maximum, are awaiting a
PUBACK on the wire; the rest of ``2 * window`` handed to paho wait in its own
queue, which paho's thread sends as soon as a PUBACK frees a slot (PUBACKs
reach the asyncio loop in batches, so the pipe never idles waiting for it).
The durable cursor (``log.cursor(c, "mqtt")``) moves to the
highest seq such that every seq up to it has been PUBACKed; acks may be
booked out of order.  The cursor write is batched (every
``cursor_interval`` seconds): it only bounds how much is resent after a crash.

Sessions and reconnects.  Every connection uses a *fresh* paho client with a
clean start (MQTT 5 ``clean_start=True``, session expiry 0; MQTT 3.1.1
``clean_session=True``).  The log plus our cursor already is the durable
session: a broker-side or paho-side session would hold a second, volatile copy
of the same state, and paho would resend its stale in-flight messages ahead
of ours, out of step with the cursor.  It would also let paho queue without
bound while the broker is away.  Instead nothing is published while
disconnected, and after a reconnect publishing restarts at ``acked + 1``.  A
subscriber may therefore see ``5, 6, 7, 5, 6, 7, 8``: in order per
connection, duplicates allowed (subscribers deduplicate by seq), never a gap.
paho's own queue is capped at ``2 * window`` (``max_queued_messages_set``) as
a second fence.

Connecting, reconnecting (exponential backoff with jitter from
``reconnect_min`` to ``reconnect_max``; the broker being down at start-up is
just the first failed attempt), the MQTT 5 to 3.1.1 fallback and the one-line
errors are :class:`~.mqttlink.BrokerLink`'s, shared with the subscriber and
the dashboard.

Protocol.  MQTT 5 first: the signature travels as a user property named
:data:`rsnotify.envelope.SIGNATURE_PROPERTY`, with the content type set.  If
the broker answers "unsupported protocol version", ``protocol="auto"`` falls
back to 3.1.1, which has no properties: the signature then travels at the
end of the payload, in the payload format's own syntax
(:mod:`.mqttsig`).  QoS 1, order and the retained head need nothing of
MQTT 5.  The retained head names the publisher by ``publisher_id`` (what it
reports to the dashboard), never by its MQTT client id: anyone reading the
head could otherwise connect with that id and push the publisher off the
broker (MQTT 3.1.1 section 3.1.4: the broker drops the older connection).

Topics.  :class:`~.topics.Topics`: broker-safe levels by default, the old
``<prefix>/<collection id>/...`` names with ``legacy_topics``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import ssl
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from .. import outbound
from ..collection import is_valid_collection_id
from ..envelope import SIGNATURE_PROPERTY
from ..errors import RsNotifyError
from ..log import LogRecord, LogUnavailable, NotificationLog
from . import InvalidBrokerURL, TransportError, mqttproblems, mqttsig
from .mqttlink import BrokerLink, LinkState, LinkStats, check_protocol
from .mqtturl import BrokerURL, parse_broker_url
from .topics import Topics

logger = logging.getLogger(__name__)

CURSOR_NAME = "mqtt"
CONTENT_TYPES = {"json": "application/json", "xml": "application/xml"}
MAX_WINDOW = 10_000  # far below paho's 65535 message ids
LOG_WAIT_S = 1.0  # how long one log.wait blocks; bounds how stale a lane's view can get

#: ``on_published(collection, seq, rendered_payload_len, publish_latency_s)``
PublishedCallback = Callable[[str, int, int, float], None]


@dataclass(slots=True)
class MqttStats(LinkStats):
    """Counters for logs, the dashboard and tests (monotonic over a pusher's life).

    ``connect_attempts`` and ``connections`` (from :class:`LinkStats`) are
    counted by the link.
    """

    published: int = 0  # notifications handed to paho, resends included
    acked: int = 0  # notifications PUBACKed
    refused: int = 0  # PUBACKs with a failure reason (e.g. not authorised by an ACL)
    heads: int = 0  # head messages PUBACKed
    skipped: int = 0  # seqs trimmed from the log before they could be pushed


@dataclass(slots=True)
class _Lane:
    """One collection's delivery state.

    ``sent_through`` and ``inflight`` describe the current connection; on a
    disconnect :meth:`rewind` folds them back to what the broker acknowledged.
    """

    collection: str
    topic: str
    head_topic: str
    ready: bool = False  # the durable cursor has been read
    sent_through: int = 0  # highest seq published (or skipped as trimmed) on this connection
    inflight: set[int] = field(default_factory=set)  # published, no PUBACK yet
    durable: int = 0  # what the log cursor holds
    refused: bool = False  # the broker refused a message; retry after a pause
    refusals: int = 0
    task: asyncio.Task[None] | None = None

    def acked_through(self) -> int:
        return min(self.inflight) - 1 if self.inflight else self.sent_through

    def rewind(self) -> None:
        self.sent_through = self.acked_through()
        self.inflight.clear()


@dataclass(slots=True)
class _Sent:
    lane: _Lane | None  # None: a head message
    seq: int
    size: int
    started: float


class _Pulse:
    """Wake every waiter on any state change (ack, connect, disconnect, stop).

    Usable from plain callbacks, unlike ``asyncio.Condition.notify_all``.
    """

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float | None = None) -> None:
        event = self._event
        if timeout is None:
            await event.wait()
            return
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
        # cancellation that races with the event being set.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(timeout, 0.0)):
                await event.wait()


def _tls_context(
    ca: str | None, cert: str | None, key: str | None, insecure: bool
) -> ssl.SSLContext:
    if key is not None and cert is None:
        raise TransportError("a TLS client key needs a client certificate (tls_cert)")
    try:
        context = ssl.create_default_context(cafile=ca)
        if cert is not None:
            context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise TransportError(f"cannot set up TLS: {exc}") from None
    if insecure:
        # Still verifies the certificate chain; only the host name check is off
        # (paho's tls_insecure meaning), e.g. for a broker reached by IP.
        context.check_hostname = False
    return context


class PackedOnce(Properties):
    """PUBLISH properties that serialise themselves once.

    paho calls ``pack()`` for every message it sends, and ``pack()`` probes
    all ~40 property names with ``hasattr``: ~8% of the publisher's CPU in a
    burst, for bytes that never change (the pusher never edits properties
    after building them).  Any later assignment drops the cached bytes.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        object.__setattr__(self, "_packed", None)

    def pack(self) -> bytes:
        packed: bytes | None = getattr(self, "_packed", None)
        if packed is None:
            packed = super().pack()
            object.__setattr__(self, "_packed", packed)
        return packed


class MqttPusher:
    """Push every logged notification of the added collections to an MQTT broker.

    Use: ``add_collection(c)`` (also while running), ``await run()`` until
    ``await stop()``.  An unreachable or refusing broker, and an unavailable
    log, are retried (and said so, one line each); ``run()`` raises only for a
    bug.
    """

    def __init__(
        self,
        url: str,
        log: NotificationLog,
        *,
        topic_prefix: str = "resourcesync",
        fmt: str = "json",
        signer: outbound.Signer | None = None,
        heartbeat: float = 5.0,
        client_id: str | None = None,
        window: int = 100,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_insecure: bool = False,
        protocol: str = "auto",
        on_published: PublishedCallback | None = None,
        keepalive: int = 30,
        connect_timeout: float = 10.0,
        drain_timeout: float = 5.0,
        cursor_interval: float = 0.05,
        reconnect_min: float = 0.25,
        reconnect_max: float = 30.0,
        renderer: outbound.Renderer | None = None,
        legacy_topics: bool = False,
        publisher_id: str | None = None,
    ) -> None:
        self.broker: BrokerURL = parse_broker_url(url)
        if self.broker.topic:
            raise InvalidBrokerURL(
                f"{self.broker.redacted()}: a broker URL for publishing takes no path "
                "(topics are <topic_prefix>/<collection>/changes)"
            )
        if fmt not in CONTENT_TYPES:
            raise TransportError(f"unknown notification format {fmt!r} (json or xml)")
        check_protocol(protocol)
        if not 1 <= window <= MAX_WINDOW:
            raise TransportError(f"window must be between 1 and {MAX_WINDOW}, not {window}")
        if not heartbeat > 0:
            raise TransportError(f"heartbeat must be positive, not {heartbeat}")
        self.topics = Topics(topic_prefix, legacy=legacy_topics)
        if signer is not None:
            try:
                mqttsig.check_key_id(signer.key_id)
            except mqttsig.TrailerUnsupported as exc:
                raise TransportError(f"signing key id: {exc}") from None
        has_tls_options = tls_ca or tls_cert or tls_key or tls_insecure
        if has_tls_options and not self.broker.tls:
            raise TransportError("TLS options need an mqtts:// broker URL")
        self._tls = (
            _tls_context(tls_ca, tls_cert, tls_key, tls_insecure) if self.broker.tls else None
        )
        self.log = log
        self.topic_prefix = self.topics.prefix
        self.fmt = fmt
        self.signer = signer
        # Shared with the publisher's other transports when it passes one.
        self.renderer = renderer or outbound.Renderer(fmt, signer)
        if (self.renderer.fmt, self.renderer.signer) != (fmt, signer):
            raise TransportError("the renderer must use the pusher's format and signer")
        self.heartbeat = heartbeat
        # <= 23 characters: the limit every MQTT 3.1.1 broker must accept.  Never
        # published (see the module docstring): the head carries publisher_id.
        self.client_id = client_id or f"rsnotify-{uuid.uuid4().hex[:12]}"
        self.publisher_id = publisher_id or f"publisher-{uuid.uuid4().hex[:12]}"
        self.window = window
        self.protocol = protocol
        self.on_published = on_published
        self.keepalive = keepalive
        self.connect_timeout = connect_timeout
        self.drain_timeout = drain_timeout
        self.cursor_interval = cursor_interval
        self.reconnect_min = reconnect_min
        self.reconnect_max = reconnect_max
        self.stats = MqttStats()
        self.link = BrokerLink(
            self.broker,
            client_id=self.client_id,
            logger=logger,
            option="--mqtt",
            protocol=protocol,
            keepalive=keepalive,
            connect_timeout=connect_timeout,
            tls=self._tls,
            reconnect_min=reconnect_min,
            reconnect_max=reconnect_max,
            stats=self.stats,
            setup=self._setup_client,
            on_connack=self._on_connack,
            on_state=self._on_link_state,
        )

        self._lanes: dict[str, _Lane] = {}
        self._plain_properties: dict[str, Properties] = {}
        # What the current connection has done: a broker that closes it after
        # PUBLISHes without acknowledging any is refusing them (MQTT 3.1.1).
        self._conn_published = 0
        self._conn_acked = 0
        self._last_topic = ""
        self._epoch = 0  # bumped on every connect and disconnect
        self._connected = False
        self._window: dict[int, _Sent] = {}  # paho message id -> what it carries
        # Handed to paho and not yet PUBACKed: ``window`` on the wire plus as
        # many in paho's own queue, which it sends from its thread the moment
        # an ack frees a slot, without waiting for this loop to come round.
        self._handed_max = 2 * window
        self.inflight_limit = window  # on the wire: min(window, the broker's Receive Maximum)
        self._acks: collections.deque[tuple[int, int, ReasonCode]] = collections.deque()
        self._acks_scheduled = False
        self._heads_wanted = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pulse = _Pulse()
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = False
        self._stopping = False
        self._failure: BaseException | None = None
        self._done = asyncio.Event()

    # -- public API ---------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True while a connection is up (CONNACK received, not yet lost)."""
        return self._connected

    @property
    def protocol_in_use(self) -> str | None:
        """``"5"`` or ``"3.1.1"``: what the current (or last) connection speaks."""
        return self.link.protocol_in_use

    @property
    def link_state(self) -> LinkState:
        """The connection's state and, when refused or unreachable, the reason."""
        return self.link.state

    @property
    def _client(self) -> mqtt.Client | None:
        return self.link.client

    @property
    def in_flight(self) -> int:
        """Messages published and not yet PUBACKed on the current connection."""
        return len(self._window)

    def topic(self, collection: str) -> str:
        return self.topics.changes(collection)

    def head_topic(self, collection: str) -> str:
        return self.topics.head(collection)

    def add_collection(self, collection_id: str) -> None:
        """Push this collection too (idempotent; works before and during :meth:`run`)."""
        if not is_valid_collection_id(collection_id):
            raise TransportError(f"invalid collection id {collection_id[:80]!r}")
        if collection_id in self._lanes:
            return
        lane = _Lane(collection_id, self.topic(collection_id), self.head_topic(collection_id))
        self._lanes[collection_id] = lane
        if self._running and not self._stopping:
            self._start_lane(lane)
            self._heads_wanted = True
            self._pulse.fire()

    def acked(self, collection: str) -> int:
        """Highest seq such that every seq up to it was PUBACKed (or already was at start)."""
        lane = self._lanes.get(collection)
        if lane is None:
            raise TransportError(f"collection {collection[:80]!r} was never added")
        return lane.acked_through() if lane.ready else lane.durable

    async def run(self) -> None:
        """Connect, push, reconnect, ... until :meth:`stop`; then drain and disconnect."""
        if self._running:
            raise RuntimeError("MqttPusher.run() is already running")
        self._loop = asyncio.get_running_loop()
        self._running = True
        self._failure = None
        self._done.clear()
        try:
            self._spawn(self.link.run(), "mqtt-connection")
            self._spawn(self._cursor_loop(), "mqtt-cursor")
            self._spawn(self._heartbeat_loop(), "mqtt-heartbeat")
            for lane in self._lanes.values():
                self._start_lane(lane)
            while not self._stopping and self._failure is None:
                await self._pulse.wait()
            if self._failure is None:
                await self._drain()
        finally:
            await self._shutdown()
        if self._failure is not None:
            raise self._failure

    async def stop(self) -> None:
        """Stop publishing, wait for in-flight PUBACKs (up to ``drain_timeout``), disconnect.

        Returns once :meth:`run` has finished.  A stopped pusher does not run
        again; make a new one (it resumes from the durable cursor).
        """
        self._stopping = True
        self._pulse.fire()
        if self._running:
            await self._done.wait()

    # -- tasks --------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and self._failure is None:
            self._failure = exc
            self._pulse.fire()

    def _start_lane(self, lane: _Lane) -> None:
        if lane.task is None or lane.task.done():
            lane.task = self._spawn(self._lane_loop(lane), f"mqtt-lane-{lane.collection}")

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout
        while self._window and self._connected and loop.time() < deadline:
            await self._pulse.wait(deadline - loop.time())
        if self._window:
            logger.warning(
                "MQTT: stopping with %d message(s) not acknowledged; they will be resent "
                "from the cursor next time",
                len(self._window),
            )

    async def _shutdown(self) -> None:
        pending = set(self._tasks)
        while pending:
            # Cancel again until done: on Python 3.11 a cancellation racing with
            # an asyncio.wait_for inside the log backend can be swallowed once.
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.5)
        for lane in self._lanes.values():
            lane.task = None
        with contextlib.suppress(RsNotifyError):
            await self._flush_cursors()
        self._connected = False
        self._window.clear()
        await self.link.close()
        self._running = False
        self._done.set()

    # -- paho callbacks: run in paho's thread, only hand events over ------------

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            loop.call_soon_threadsafe(fn, *args)

    def _setup_client(self, client: mqtt.Client, conn: int) -> None:
        """Limits and the PUBACK callback of each fresh paho client (the link makes them)."""
        client.max_inflight_messages_set(self.window)  # until the CONNACK says less
        # paho counts in-flight messages in its queue cap too.
        client.max_queued_messages_set(self._handed_max)

        def on_publish(_c: mqtt.Client, _u: Any, mid: int, reason: ReasonCode, _p: Any) -> None:
            # PUBACKs arrive thousands a second: queue them and wake the loop
            # once per burst, not once per ack (call_soon_threadsafe writes the
            # loop's self-pipe each time).  The flag is cleared by the drain
            # *before* it empties the queue, so an ack appended meanwhile either
            # is drained by it or schedules another drain: none is stranded.
            self._acks.append((conn, mid, reason))
            if not self._acks_scheduled:
                self._acks_scheduled = True
                self._post(self._drain_acks)

        client.on_publish = on_publish

    def _on_connack(self, client: mqtt.Client, _conn: int, props: Properties | None) -> None:
        # MQTT 5 section 3.2.2.3.3: never more unacknowledged QoS 1 PUBLISHes
        # than the broker's Receive Maximum (Mosquitto says 20; brokers that
        # enforce it disconnect a client that sends more).  paho ignores it,
        # and its setter refuses any change once connected (for fear of a
        # switch to or from 0, "unlimited", which this is not), so the
        # attribute is set directly, here in paho's thread, before the
        # asyncio side can publish anything on this connection.  MQTT 3.1.1
        # has no Receive Maximum: the window alone applies.
        limit = getattr(props, "ReceiveMaximum", None) if props is not None else None
        inflight = self.window
        if isinstance(limit, int) and 0 < limit < inflight:
            inflight = limit
        client._max_inflight_messages = inflight
        self.inflight_limit = inflight

    # -- events, on the asyncio loop ------------------------------------------------

    def _on_link_state(self, state: LinkState) -> None:
        if state.state == "connected":
            self._conn_published = self._conn_acked = 0
            self._set_connected()
        elif state.state == "lost":
            if self._connected:
                self._set_disconnected()
            if self._conn_published and not self._conn_acked:
                logger.warning(
                    "%s", mqttproblems.closed_after_publish(self._last_topic, self.link.context)
                )
            logger.info("MQTT: resending from the acknowledged cursor once reconnected")

    def _drain_acks(self) -> None:
        self._acks_scheduled = False
        acks = self._acks
        fired = False
        while acks:
            conn, mid, reason = acks.popleft()
            if self._on_ack(conn, mid, reason) and not fired:
                self._pulse.fire()
                fired = True

    def _on_ack(self, conn: int, mid: int, reason: ReasonCode) -> bool:
        """Book one PUBACK; True if it freed a window slot."""
        if conn != self.link.conn or not self._connected:
            return False  # an older connection: its lanes were rewound, it will be resent
        sent = self._window.pop(mid, None)
        if sent is None:
            return False
        self._conn_acked += 1
        lane = sent.lane
        if lane is None:
            if not reason.is_failure:
                self.stats.heads += 1
            return True
        if reason.is_failure:
            # The seq stays in ``inflight`` so the cursor cannot pass it; the lane
            # pauses and resends from its cursor (see _lane_loop).
            self.stats.refused += 1
            if not lane.refused:
                logger.error(
                    "%s; seq %d and later wait (retrying from the cursor)",
                    mqttproblems.publish_refused(
                        lane.topic, reason.value, reason.getName(), self.link.context
                    ),
                    sent.seq,
                )
            lane.refused = True
            return True
        lane.inflight.discard(sent.seq)
        lane.refusals = 0
        self.stats.acked += 1
        if self.on_published is not None:
            latency = asyncio.get_running_loop().time() - sent.started
            try:
                self.on_published(lane.collection, sent.seq, sent.size, latency)
            except Exception:
                logger.exception("on_published callback failed")
        return True

    def _set_connected(self) -> None:
        self._window.clear()
        for lane in self._lanes.values():
            lane.rewind()
        self._connected = True
        self._epoch += 1
        self._pulse.fire()

    def _set_disconnected(self) -> None:
        self._connected = False
        self._window.clear()
        for lane in self._lanes.values():
            lane.rewind()
        self._epoch += 1
        self._pulse.fire()

    # -- publishing ----------------------------------------------------------------

    def _properties(self, content_type: str, signature: str | None) -> Properties:
        if signature is None:
            # Unsigned properties are the same for every message: build them once
            # (paho packs them per publish; building them was ~13% of the CPU).
            cached = self._plain_properties.get(content_type)
            if cached is None:
                cached = self._plain_properties[content_type] = self._new_properties(
                    content_type, None
                )
            return cached
        return self._new_properties(content_type, signature)

    @staticmethod
    def _new_properties(content_type: str, signature: str | None) -> Properties:
        props = PackedOnce(PacketTypes.PUBLISH)
        props.ContentType = content_type
        props.PayloadFormatIndicator = 1  # UTF-8 text
        if signature is not None:
            props.UserProperty = [(SIGNATURE_PROPERTY, signature)]
        return props

    def _can_publish(self, epoch: int) -> bool:
        return self._connected and not self._stopping and self._epoch == epoch

    async def _wait_room(self, epoch: int, lane: _Lane | None = None) -> bool:
        """Wait for a free window slot; False if the connection changed or we stop."""
        while True:
            if not self._can_publish(epoch) or (lane is not None and lane.refused):
                return False
            if len(self._window) < self._handed_max:
                return True
            await self._pulse.wait()

    def _publish(
        self,
        topic: str,
        payload: bytes,
        content_type: str,
        signature: str | None,
        *,
        retain: bool = False,
    ) -> int | None:
        """Hand one QoS 1 message to paho; its message id, or None if paho refused it.

        The signature rides as an MQTT 5 user property, or on MQTT 3.1.1 at
        the payload's end (:mod:`.mqttsig`).
        """
        client = self._client
        if client is None:
            return None
        props: Properties | None = None
        if self.link.v5:
            props = self._properties(content_type, signature)
        elif signature is not None:
            payload = mqttsig.attach(payload, signature)
        info = client.publish(topic, payload, qos=1, retain=retain, properties=props)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            logger.debug(
                "MQTT: paho refused a publish on %s: %s", topic, mqtt.error_string(info.rc)
            )
            return None
        self._conn_published += 1
        self._last_topic = topic
        return info.mid

    def _publish_record(self, lane: _Lane, record: LogRecord) -> bool:
        try:
            rendered = self.renderer.render(lane.collection, record)
        except (ValueError, RsNotifyError) as exc:
            # A record we cannot render will never render: skip it rather than
            # stall the collection (Destinations catch up from the Change List).
            logger.error(
                "MQTT: %s seq %d cannot be rendered, skipped: %s", lane.topic, record.seq, exc
            )
            lane.sent_through = record.seq
            self.stats.skipped += 1
            return True
        mid = self._publish(
            lane.topic, rendered.payload, CONTENT_TYPES[self.fmt], rendered.signature
        )
        if mid is None:
            return False
        loop = asyncio.get_running_loop()
        self._window[mid] = _Sent(lane, record.seq, len(rendered.payload), loop.time())
        lane.inflight.add(record.seq)
        lane.sent_through = record.seq
        self.stats.published += 1
        return True

    async def _init_lane(self, lane: _Lane) -> None:
        while True:
            try:
                cursor = await self.log.cursor(lane.collection, CURSOR_NAME)
                break
            except LogUnavailable as exc:
                logger.warning("MQTT: cannot read the %s cursor: %s", lane.collection, exc)
                await asyncio.sleep(1.0)
        lane.durable = lane.sent_through = cursor
        lane.inflight.clear()
        lane.ready = True

    async def _lane_loop(self, lane: _Lane) -> None:
        """Publish one collection's records in seq order, within the shared window."""
        await self._init_lane(lane)
        while True:
            if lane.refused:
                lane.refusals += 1
                delay = min(self.reconnect_max, 2.0 ** min(lane.refusals, 5))
                await asyncio.sleep(random.uniform(delay / 2, delay))
                lane.refused = False
                lane.rewind()
                continue
            if not self._connected or self._stopping:
                await self._pulse.wait()
                continue
            after = lane.sent_through
            try:
                batch = await self.log.wait(
                    lane.collection, after, timeout=LOG_WAIT_S, limit=self._handed_max
                )
            except LogUnavailable as exc:
                logger.warning("MQTT: cannot read the log of %s: %s", lane.collection, exc)
                await asyncio.sleep(1.0)
                continue
            epoch = self._epoch
            if not batch or lane.sent_through != after or not self._can_publish(epoch):
                continue  # nothing new, or a reconnect rewound the lane meanwhile
            if batch[0].seq > after + 1:
                logger.warning(
                    "MQTT: %s seqs %d..%d left the log before they were pushed",
                    lane.collection,
                    after + 1,
                    batch[0].seq - 1,
                )
                self.stats.skipped += batch[0].seq - 1 - after
                lane.sent_through = batch[0].seq - 1
            for record in batch:
                # The window almost always has room during a burst: test it
                # inline and only await (a coroutine per record) when it is full.
                if len(self._window) >= self._handed_max or not self._can_publish(epoch):
                    if not await self._wait_room(epoch, lane):
                        break
                elif lane.refused:
                    break
                if not self._publish_record(lane, record):
                    await self._pulse.wait(0.05)  # paho refused it: the connection is going
                    break

    # -- heads and cursors ------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        attempted = -1  # the epoch (connection) of the last attempt
        while True:
            if self._connected and not self._stopping:
                self._heads_wanted = False
                attempted = self._epoch
                await self._publish_heads(attempted)
            deadline = loop.time() + self.heartbeat
            # Heads wanted while disconnected (or stopping) wait: testing only
            # the flag spun this loop without ever yielding (a collection added
            # before the first CONNACK), and the connection never came.
            while loop.time() < deadline and not (
                self._heads_wanted and self._connected and not self._stopping
            ):
                if self._connected and self._epoch != attempted:
                    break  # a new connection: heads right away
                await self._pulse.wait(deadline - loop.time())

    async def _publish_heads(self, epoch: int) -> bool:
        for lane in list(self._lanes.values()):
            try:
                head = await self.log.head(lane.collection)
                earliest = await self.log.earliest(lane.collection)
            except LogUnavailable as exc:
                logger.warning("MQTT: cannot read the head of %s: %s", lane.collection, exc)
                return False
            if not await self._wait_room(epoch):
                return False
            payload = outbound.head_message(
                lane.collection, head, earliest, publisher=self.publisher_id
            )
            signature = self.signer.sign(payload) if self.signer is not None else None
            mid = self._publish(
                lane.head_topic, payload, CONTENT_TYPES["json"], signature, retain=True
            )
            if mid is None:
                return False
            self._window[mid] = _Sent(None, head, len(payload), asyncio.get_running_loop().time())
        return True

    async def _cursor_loop(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(self.cursor_interval)
            try:
                await self._flush_cursors()
            except LogUnavailable as exc:
                # Once per outage, not every tick: a lagging cursor only means
                # more to resend after a crash.
                if not failing:
                    logger.warning("MQTT: cannot store the cursor (will keep trying): %s", exc)
                failing = True
            else:
                if failing:
                    logger.info("MQTT: storing the cursor again")
                failing = False

    async def _flush_cursors(self) -> None:
        for lane in list(self._lanes.values()):
            if not lane.ready:
                continue
            acked = lane.acked_through()
            if acked > lane.durable:
                await self.log.set_cursor(lane.collection, CURSOR_NAME, acked)
                lane.durable = max(lane.durable, acked)
