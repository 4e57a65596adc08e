"""The MQTT transport: tail the log, publish each notification at QoS 1, in order.

Per collection the pusher publishes ``<prefix>/<collection>/changes`` (one
message per sequence number, strictly in sequence order) and keeps a retained
``<prefix>/<collection>/head`` message (latest seq, earliest retained seq,
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

Reconnects back off exponentially with jitter (``reconnect_min`` doubling to
``reconnect_max``, each delay drawn from [d/2, d]); the broker being down at
start-up is just the first failed attempt.

Protocol.  MQTT 5 first: the signature travels as a user property named
:data:`rsnotify.envelope.SIGNATURE_PROPERTY`, with the content type set.  If
the broker answers "unsupported protocol version", ``protocol="auto"`` falls
back to 3.1.1, which has no properties: with a signer configured the pusher
then refuses to run (:class:`~rsnotify.transport.SigningUnsupported`) rather
than publish unsigned data that signature-checking Destinations would drop.
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
from . import InvalidBrokerURL, SigningUnsupported, TransportError
from .mqtturl import BrokerURL, parse_broker_url

logger = logging.getLogger(__name__)

CURSOR_NAME = "mqtt"
CONTENT_TYPES = {"json": "application/json", "xml": "application/xml"}
PROTOCOLS = {"auto": mqtt.MQTTv5, "5": mqtt.MQTTv5, "3.1.1": mqtt.MQTTv311}
PROTOCOL_NAMES = {mqtt.MQTTv5: "5", mqtt.MQTTv311: "3.1.1"}
#: CONNACK "Unsupported protocol version" (paho maps a 3.1.1 broker's return code 1 to it).
UNSUPPORTED_PROTOCOL_VERSION = 0x84
MAX_WINDOW = 10_000  # far below paho's 65535 message ids
LOG_WAIT_S = 1.0  # how long one log.wait blocks; bounds how stale a lane's view can get
CLOSE_TIMEOUT_S = 3.0

#: ``on_published(collection, seq, rendered_payload_len, publish_latency_s)``
PublishedCallback = Callable[[str, int, int, float], None]


@dataclass(slots=True)
class MqttStats:
    """Counters for logs, the dashboard and tests (monotonic over a pusher's life)."""

    connect_attempts: int = 0
    connections: int = 0
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
    ``await stop()``.  ``run()`` only raises for problems retrying cannot fix
    (:class:`SigningUnsupported`); an unreachable broker or log is retried.
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
    ) -> None:
        self.broker: BrokerURL = parse_broker_url(url)
        if self.broker.topic:
            raise InvalidBrokerURL(
                f"{self.broker.redacted()}: a broker URL for publishing takes no path "
                "(topics are <topic_prefix>/<collection>/changes)"
            )
        if fmt not in CONTENT_TYPES:
            raise TransportError(f"unknown notification format {fmt!r} (json or xml)")
        if protocol not in PROTOCOLS:
            raise TransportError(f"unknown MQTT protocol {protocol!r} (auto, 5 or 3.1.1)")
        if not 1 <= window <= MAX_WINDOW:
            raise TransportError(f"window must be between 1 and {MAX_WINDOW}, not {window}")
        if not heartbeat > 0:
            raise TransportError(f"heartbeat must be positive, not {heartbeat}")
        prefix = topic_prefix.strip("/")
        if not prefix or any(ch in prefix for ch in "+#\0") or prefix.startswith("$"):
            raise TransportError(f"invalid MQTT topic prefix {topic_prefix!r}")
        has_tls_options = tls_ca or tls_cert or tls_key or tls_insecure
        if has_tls_options and not self.broker.tls:
            raise TransportError("TLS options need an mqtts:// broker URL")
        self._tls = (
            _tls_context(tls_ca, tls_cert, tls_key, tls_insecure) if self.broker.tls else None
        )
        self.log = log
        self.topic_prefix = prefix
        self.fmt = fmt
        self.signer = signer
        # Shared with the publisher's other transports when it passes one.
        self.renderer = renderer or outbound.Renderer(fmt, signer)
        if (self.renderer.fmt, self.renderer.signer) != (fmt, signer):
            raise TransportError("the renderer must use the pusher's format and signer")
        self.heartbeat = heartbeat
        # <= 23 characters: the limit every MQTT 3.1.1 broker must accept.
        self.client_id = client_id or f"rsnotify-{uuid.uuid4().hex[:12]}"
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

        self._lanes: dict[str, _Lane] = {}
        self._client: mqtt.Client | None = None
        self._client_protocol: int | None = None
        self._plain_properties: dict[str, Properties] = {}
        self._conn = 0  # id of the current paho client; events of older ones are ignored
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
        self._events: asyncio.Queue[tuple[int, str, ReasonCode | None]] = asyncio.Queue()
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
        return PROTOCOL_NAMES.get(self._client_protocol) if self._client_protocol else None

    @property
    def in_flight(self) -> int:
        """Messages published and not yet PUBACKed on the current connection."""
        return len(self._window)

    def topic(self, collection: str) -> str:
        return f"{self.topic_prefix}/{collection}/changes"

    def head_topic(self, collection: str) -> str:
        return f"{self.topic_prefix}/{collection}/head"

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
        if self.protocol == "3.1.1" and self.signer is not None:
            raise self._signing_unsupported("protocol='3.1.1' was requested")
        self._loop = asyncio.get_running_loop()
        self._running = True
        self._failure = None
        self._done.clear()
        try:
            self._spawn(self._connection_loop(), "mqtt-connection")
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
        client, self._client = self._client, None
        self._connected = False
        self._window.clear()
        await self._close_client(client)
        self._running = False
        self._done.set()

    # -- paho callbacks: run in paho's thread, only hand events over ------------

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            loop.call_soon_threadsafe(fn, *args)

    def _new_client(self, protocol: int) -> tuple[mqtt.Client, int]:
        self._conn += 1
        conn = self._conn
        v5 = protocol == mqtt.MQTTv5
        client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            clean_session=None if v5 else True,
            protocol=protocol,
            reconnect_on_failure=False,  # we reconnect, with jitter, on a fresh client
        )
        client.max_inflight_messages_set(self.window)  # until the CONNACK says less
        # paho counts in-flight messages in its queue cap too.
        client.max_queued_messages_set(self._handed_max)
        if self.broker.username is not None:
            client.username_pw_set(self.broker.username, self.broker.password)
        if self._tls is not None:
            client.tls_set_context(self._tls)
        client.connect_timeout = self.connect_timeout

        def on_connect(
            c: mqtt.Client, _u: Any, _f: Any, reason: ReasonCode, props: Properties | None
        ) -> None:
            # MQTT 5 section 3.2.2.3.3: never more unacknowledged QoS 1 PUBLISHes
            # than the broker's Receive Maximum (Mosquitto says 20; brokers that
            # enforce it disconnect a client that sends more).  paho ignores it,
            # and its setter refuses any change once connected (for fear of a
            # switch to or from 0, "unlimited", which this is not), so the
            # attribute is set directly, here in paho's thread, before the
            # asyncio side can publish anything on this connection.
            limit = getattr(props, "ReceiveMaximum", None) if props is not None else None
            inflight = self.window
            if isinstance(limit, int) and 0 < limit < inflight:
                inflight = limit
            c._max_inflight_messages = inflight
            self.inflight_limit = inflight
            self._post(self._on_connection_event, conn, "connack", reason)

        def on_disconnect(_c: mqtt.Client, _u: Any, _f: Any, reason: ReasonCode, _p: Any) -> None:
            self._post(self._on_connection_event, conn, "disconnect", reason)

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

        client.on_connect = on_connect
        client.on_disconnect = on_disconnect
        client.on_publish = on_publish
        return client, conn

    # -- events, on the asyncio loop ------------------------------------------------

    def _on_connection_event(self, conn: int, kind: str, reason: ReasonCode | None) -> None:
        if conn == self._conn and kind == "disconnect" and self._connected:
            # At once, not when the connection task gets round to it: lanes must
            # stop handing messages to a dead client now.
            self._set_disconnected()
        self._events.put_nowait((conn, kind, reason))

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
        if conn != self._conn or not self._connected:
            return False  # an older connection: its lanes were rewound, it will be resent
        sent = self._window.pop(mid, None)
        if sent is None:
            return False
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
                    "MQTT: broker refused %s seq %d (%s); retrying from the cursor",
                    lane.topic,
                    sent.seq,
                    reason.getName(),
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

    async def _next_event(self, conn: int) -> tuple[str, ReasonCode | None]:
        while True:
            event_conn, kind, reason = await self._events.get()
            if event_conn == conn:
                return kind, reason

    # -- the connection ------------------------------------------------------------

    def _signing_unsupported(self, why: str) -> SigningUnsupported:
        message = (
            f"MQTT broker {self.broker.redacted()}: {why}, and MQTT 3.1.1 cannot carry the "
            "signature (an MQTT 5 user property); refusing to publish unsigned notifications. "
            "Use an MQTT 5 broker, or run without a signing key."
        )
        logger.error("%s", message)
        return SigningUnsupported(message)

    async def _connection_loop(self) -> None:
        protocol = PROTOCOLS[self.protocol]
        failures = 0
        while True:
            if protocol == mqtt.MQTTv311 and self.signer is not None:
                raise self._signing_unsupported("the broker only speaks MQTT 3.1.1")
            outcome = await self._connect(protocol)
            if outcome == "connected":
                failures = 0
                await self._serve()
            elif (
                outcome == "unsupported-protocol"
                and self.protocol == "auto"
                and protocol == mqtt.MQTTv5
            ):
                logger.warning(
                    "MQTT broker %s refused MQTT 5; falling back to MQTT 3.1.1",
                    self.broker.redacted(),
                )
                protocol = mqtt.MQTTv311
                continue
            else:
                failures += 1
            delay = min(self.reconnect_max, self.reconnect_min * 2 ** min(failures, 30))
            await asyncio.sleep(random.uniform(delay / 2, delay))

    async def _connect(self, protocol: int) -> str:
        """One attempt: ``connected``, ``unsupported-protocol`` or ``failed``."""
        client, conn = self._new_client(protocol)
        old, self._client = self._client, client
        self._client_protocol = protocol
        await self._close_client(old)
        self.stats.connect_attempts += 1
        where = self.broker.redacted()
        try:
            # connect() resolves, opens TCP (and TLS) and sends CONNECT: blocking work.
            await asyncio.to_thread(
                client.connect,
                self.broker.host,
                self.broker.port,
                self.keepalive,
                # 3.1.1 takes its clean session from the Client (see _new_client).
                **({"clean_start": True} if protocol == mqtt.MQTTv5 else {}),
            )
        except OSError as exc:  # refused, unreachable, timeout, TLS failure
            logger.warning("MQTT broker %s unreachable: %s", where, exc)
            await self._close_client(client)
            return "failed"
        client.loop_start()
        try:
            async with asyncio.timeout(self.connect_timeout):
                kind, reason = await self._next_event(conn)
        except TimeoutError:
            logger.warning("MQTT broker %s sent no CONNACK in %g s", where, self.connect_timeout)
            await self._close_client(client)
            return "failed"
        if kind == "connack" and reason is not None and not reason.is_failure:
            self._set_connected()
            self.stats.connections += 1
            logger.info(
                "MQTT: connected to %s as %s (MQTT %s)",
                where,
                self.client_id,
                PROTOCOL_NAMES[protocol],
            )
            return "connected"
        await self._close_client(client)
        if reason is not None and reason.value == UNSUPPORTED_PROTOCOL_VERSION:
            if self.protocol != "auto":
                logger.error("MQTT broker %s refused MQTT %s", where, PROTOCOL_NAMES[protocol])
            return "unsupported-protocol"
        logger.warning(
            "MQTT broker %s refused the connection: %s",
            where,
            reason.getName() if reason is not None else "closed before CONNACK",
        )
        return "failed"

    async def _serve(self) -> None:
        """Wait for the current connection to end (the lanes do the publishing)."""
        conn = self._conn
        kind, reason = await self._next_event(conn)
        while kind != "disconnect":
            kind, reason = await self._next_event(conn)
        if self._connected:
            self._set_disconnected()
        logger.warning(
            "MQTT: lost connection to %s (%s); resending from the acknowledged cursor",
            self.broker.redacted(),
            reason.getName() if reason is not None else "unknown",
        )
        client, self._client = self._client, None
        await self._close_client(client)

    async def _close_client(self, client: mqtt.Client | None) -> None:
        """Disconnect cleanly if possible and always end paho's thread."""
        if client is None:
            return
        with contextlib.suppress(Exception):
            client.disconnect()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await asyncio.to_thread(client.loop_stop)
        except TimeoutError:
            # A stalled peer can keep paho's thread writing; closing the socket ends it.
            sock = client.socket()
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
            logger.warning("MQTT: paho's network thread did not stop; closed its socket")

    # -- publishing ----------------------------------------------------------------

    def _properties(self, content_type: str, signature: str | None) -> Properties | None:
        if self._client_protocol != mqtt.MQTTv5:
            return None
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
        self, topic: str, payload: bytes, props: Properties | None, *, retain: bool = False
    ) -> int | None:
        """Hand one QoS 1 message to paho; its message id, or None if paho refused it."""
        client = self._client
        if client is None:
            return None
        info = client.publish(topic, payload, qos=1, retain=retain, properties=props)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            logger.debug(
                "MQTT: paho refused a publish on %s: %s", topic, mqtt.error_string(info.rc)
            )
            return None
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
        props = self._properties(CONTENT_TYPES[self.fmt], rendered.signature)
        mid = self._publish(lane.topic, rendered.payload, props)
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
                lane.collection, head, earliest, publisher=self.client_id
            )
            signature = self.signer.sign(payload) if self.signer is not None else None
            props = self._properties(CONTENT_TYPES["json"], signature)
            mid = self._publish(lane.head_topic, payload, props, retain=True)
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
