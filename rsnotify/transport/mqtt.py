"""The MQTT transport: tail the log, publish each notification at QoS 1, in order.

Why one module of ~590 lines: it is one class, the driver, whose lane,
heartbeat, cursor and drain loops share the connection epoch, the stop flag
and the wake-up; its rules live in :mod:`.mqttwindow` and its paho side in
:mod:`.mqttlink`, so what is left here is the asyncio flow between them.

Per collection the pusher publishes ``<prefix>/<level>/changes`` (one
message per sequence number, strictly in sequence order; ``<level>`` is the
collection's broker-safe topic level, :mod:`.topics`) and keeps a retained
``<prefix>/<level>/head`` message (latest seq, earliest retained seq,
heartbeat time) refreshed every ``heartbeat`` seconds and right after each
(re)connect, so a Destination can tell at connect time whether it missed
anything and whether the publisher is alive.

The pusher is the driver of three parts, each testable on its own:

* :mod:`.mqttwindow`, the delivery window (pure): at most ``2 * window``
  messages, notifications and heads together, handed to paho and not yet
  PUBACKed; acks booked in any order; lanes rewound to what the broker
  acknowledged on every connect and disconnect.  The durable cursor
  (``log.cursor(c, "mqtt")``) follows each lane's acked-through, written
  every ``cursor_interval`` seconds: it only bounds what is resent after a
  crash.
* :mod:`.mqttlink`, the paho bridge shared with the subscriber and the
  dashboard: connecting, the MQTT 5 to 3.1.1 fallback, reconnecting with
  backoff and jitter, one-line errors, the hop from paho's thread to this
  loop, and the in-flight limit: ``window`` on the wire, never more than
  the broker's MQTT 5 Receive Maximum, the rest of the ``2 * window`` in
  paho's own queue, which paho's thread sends the moment a PUBACK frees a
  slot (PUBACKs reach this loop in batches, so the pipe never idles
  waiting for it).
* :mod:`.mqttmessage`, the PUBLISH form: on MQTT 5 the signature rides as a
  user property, on 3.1.1 at the end of the payload (:mod:`.mqttsig`).

Sessions.  Every connection uses a *fresh* paho client with a clean start
(MQTT 5 ``clean_start=True``, session expiry 0; MQTT 3.1.1
``clean_session=True``).  The log plus our cursor already is the durable
session: a broker-side or paho-side session would hold a second, volatile
copy of the same state, and paho would resend its stale in-flight messages
ahead of ours, out of step with the cursor.  Nothing is published while
disconnected, and after a reconnect publishing restarts at ``acked + 1``: a
subscriber may see ``5, 6, 7, 5, 6, 7, 8`` (duplicates allowed, never a gap).

The retained head names the publisher by ``publisher_id`` (what it reports
to the dashboard), never by its MQTT client id: anyone reading the head
could otherwise connect with that id and push the publisher off the broker
(MQTT 3.1.1 section 3.1.4: the broker drops the older connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.reasoncodes import ReasonCode

from .. import outbound
from ..backoff import Backoff
from ..collection import is_valid_collection_id
from ..errors import RsNotifyError, TrailerUnsupported
from ..log import LogRecord, LogUnavailable, NotificationLog
from . import InvalidBrokerURL, TransportError, mqttproblems, mqttsig
from .mqttlink import BrokerLink, LinkState, LinkStats, check_protocol, tls_context
from .mqttmessage import CONTENT_TYPES, MessageForm
from .mqtturl import BrokerURL, parse_broker_url
from .mqttwindow import DeliveryWindow, Lane, Sent
from .pulse import Pulse
from .topics import Topics

logger = logging.getLogger(__name__)

CURSOR_NAME = "mqtt"
MAX_WINDOW = 10_000  # far below paho's 65535 message ids
LOG_WAIT_S = 1.0  # how long one log.wait blocks; bounds how stale a lane's view can get
REFUSED_MIN_S, REFUSED_MAX_S = 2.0, 32.0  # a lane's pause after the broker refused a message

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
        reconnect_max: float = 10.0,
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
            except TrailerUnsupported as exc:
                raise TransportError(f"signing key id: {exc}") from None
        has_tls_options = tls_ca or tls_cert or tls_key or tls_insecure
        if has_tls_options and not self.broker.tls:
            raise TransportError("TLS options need an mqtts:// broker URL")
        self._tls = (
            tls_context(tls_ca, tls_cert, tls_key, tls_insecure) if self.broker.tls else None
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
            # Handed to paho and not yet PUBACKed: ``window`` on the wire plus
            # as many in paho's own queue, which it sends from its thread the
            # moment an ack frees a slot, without waiting for this loop.
            max_inflight=window,
            max_queued=2 * window,
            on_ack=self._on_ack,
            on_state=self._on_link_state,
        )
        self._window = DeliveryWindow(2 * window)
        self._lane_tasks: dict[str, asyncio.Task[None]] = {}
        self._form = MessageForm()
        self._last_topic = ""
        self._heads_wanted = False
        self._pulse = Pulse()
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = False
        self._stopping = False
        self._failure: BaseException | None = None
        self._done = asyncio.Event()

    # -- public API ---------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True while a connection is up (CONNACK received, not yet lost)."""
        return self._window.connected

    @property
    def inflight_limit(self) -> int:
        """Messages on the wire at most: min(window, the broker's Receive Maximum)."""
        return self.link.inflight_limit or self.window

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
        """The live paho client (tests sample its queue)."""
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
        if collection_id in self._window.lanes:
            return
        lane = self._window.add(
            collection_id, self.topic(collection_id), self.head_topic(collection_id)
        )
        if self._running and not self._stopping:
            self._start_lane(lane)
            self._heads_wanted = True
            self._pulse.fire()

    def acked(self, collection: str) -> int:
        """Highest seq such that every seq up to it was PUBACKed (or already was at start)."""
        lane = self._window.lanes.get(collection)
        if lane is None:
            raise TransportError(f"collection {collection[:80]!r} was never added")
        return self._window.acked(lane)

    async def run(self) -> None:
        """Connect, push, reconnect, ... until :meth:`stop`; then drain and disconnect."""
        if self._running:
            raise RuntimeError("MqttPusher.run() is already running")
        self._running = True
        self._failure = None
        self._done.clear()
        try:
            self._spawn(self.link.run(), "mqtt-connection")
            self._spawn(self._cursor_loop(), "mqtt-cursor")
            self._spawn(self._heartbeat_loop(), "mqtt-heartbeat")
            for lane in self._window.lanes.values():
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

    def _start_lane(self, lane: Lane) -> None:
        task = self._lane_tasks.get(lane.collection)
        if task is None or task.done():
            self._lane_tasks[lane.collection] = self._spawn(
                self._lane_loop(lane), f"mqtt-lane-{lane.collection}"
            )

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout
        while self._window and self.connected and loop.time() < deadline:
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
        self._lane_tasks.clear()
        with contextlib.suppress(RsNotifyError):
            await self._flush_cursors()
        self._window.clear()
        await self.link.close()
        self._running = False
        self._done.set()

    # -- events, on the asyncio loop ------------------------------------------------

    def _on_link_state(self, state: LinkState) -> None:
        window = self._window
        if state.state == "connected":
            window.connect(state.conn)
            self._pulse.fire()
        elif state.state == "lost":
            lost_unacked = window.conn_sent and not window.conn_acked
            if window.connected:
                window.disconnect()
                self._pulse.fire()
            if lost_unacked:
                logger.warning(
                    "%s", mqttproblems.closed_after_publish(self._last_topic, self.link.context)
                )
            logger.info("MQTT: resending from the acknowledged cursor once reconnected")

    def _on_ack(self, conn: int, mid: int, reason: ReasonCode) -> None:
        """Book one PUBACK (posted by the link, on the loop, in bursts)."""
        ack = self._window.ack(conn, mid, reason.is_failure)
        if ack is None:
            return
        self._pulse.fire_soon()  # a slot is free: once per burst of acks
        sent, lane = ack.sent, ack.sent.lane
        if lane is None:
            if not ack.refused:
                self.stats.heads += 1
            return
        if ack.refused:
            # The lane pauses and resends from its cursor (see _lane_loop).
            self.stats.refused += 1
            if ack.first_refusal:
                logger.error(
                    "%s; seq %d and later wait (retrying from the cursor)",
                    mqttproblems.publish_refused(
                        lane.topic, reason.value, reason.getName(), self.link.context
                    ),
                    sent.seq,
                )
            return
        self.stats.acked += 1
        if self.on_published is not None:
            latency = asyncio.get_running_loop().time() - sent.started
            try:
                self.on_published(lane.collection, sent.seq, sent.size, latency)
            except Exception:
                logger.exception("on_published callback failed")

    # -- publishing ----------------------------------------------------------------

    def _can_publish(self, epoch: int) -> bool:
        return self._window.connected and not self._stopping and self._window.epoch == epoch

    async def _wait_room(self, epoch: int, lane: Lane | None = None) -> bool:
        """Wait for a free window slot; False if the connection changed or we stop."""
        while True:
            if not self._can_publish(epoch) or (lane is not None and lane.refused):
                return False
            if self._window.has_room():
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
        """Hand one QoS 1 message to paho; its message id, or None if paho refused it."""
        payload, props = self._form.build(payload, content_type, signature, v5=self.link.v5)
        mid = self.link.publish(topic, payload, retain=retain, properties=props)
        if mid is not None:
            self._last_topic = topic
        return mid

    def _publish_record(self, lane: Lane, record: LogRecord) -> bool:
        try:
            rendered = self.renderer.render(lane.collection, record)
        except (ValueError, RsNotifyError) as exc:
            # A record we cannot render will never render: skip it rather than
            # stall the collection (Destinations catch up from the Change List).
            logger.error(
                "MQTT: %s seq %d cannot be rendered, skipped: %s", lane.topic, record.seq, exc
            )
            self._window.skip(lane, record.seq)
            self.stats.skipped += 1
            return True
        mid = self._publish(
            lane.topic, rendered.payload, CONTENT_TYPES[self.fmt], rendered.signature
        )
        if mid is None:
            return False
        started = asyncio.get_running_loop().time()
        self._window.sent(mid, Sent(lane, record.seq, len(rendered.payload), started))
        self.stats.published += 1
        return True

    async def _init_lane(self, lane: Lane) -> None:
        while True:
            try:
                cursor = await self.log.cursor(lane.collection, CURSOR_NAME)
                break
            except LogUnavailable as exc:
                logger.warning("MQTT: cannot read the %s cursor: %s", lane.collection, exc)
                await asyncio.sleep(1.0)
        self._window.start(lane, cursor)

    async def _lane_loop(self, lane: Lane) -> None:
        """Publish one collection's records in seq order, within the shared window."""
        await self._init_lane(lane)
        while True:
            if lane.refused:
                # 2 s, 4 s, ... up to 32 s (or reconnect_max) while refusals go on.
                ceiling = min(self.reconnect_max, REFUSED_MAX_S)
                pause = Backoff(REFUSED_MIN_S, ceiling, attempts=lane.refusals).next()
                await asyncio.sleep(pause)
                self._window.retry(lane)
                continue
            if not self._window.connected or self._stopping:
                await self._pulse.wait()
                continue
            after = lane.sent_through
            try:
                batch = await self.log.wait(
                    lane.collection, after, timeout=LOG_WAIT_S, limit=self._window.limit
                )
            except LogUnavailable as exc:
                logger.warning("MQTT: cannot read the log of %s: %s", lane.collection, exc)
                await asyncio.sleep(1.0)
                continue
            epoch = self._window.epoch
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
                self._window.skip(lane, batch[0].seq - 1)
            for record in batch:
                # The window almost always has room during a burst: test it
                # inline and only await (a coroutine per record) when it is full.
                if not self._window.has_room() or not self._can_publish(epoch):
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
            if self._window.connected and not self._stopping:
                self._heads_wanted = False
                attempted = self._window.epoch
                await self._publish_heads(attempted)
            deadline = loop.time() + self.heartbeat
            # Heads wanted while disconnected (or stopping) wait: testing only
            # the flag spun this loop without ever yielding (a collection added
            # before the first CONNACK), and the connection never came.
            while loop.time() < deadline and not (
                self._heads_wanted and self._window.connected and not self._stopping
            ):
                if self._window.connected and self._window.epoch != attempted:
                    break  # a new connection: heads right away
                await self._pulse.wait(deadline - loop.time())

    async def _publish_heads(self, epoch: int) -> bool:
        for lane in list(self._window.lanes.values()):
            try:
                # earliest before head (as the WebSocket hello): then earliest <= head + 1
                # even if retention trims in between.
                earliest = await self.log.earliest(lane.collection)
                head = await self.log.released_head(lane.collection)  # not what is held back
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
            started = asyncio.get_running_loop().time()
            self._window.sent(mid, Sent(None, head, len(payload), started))
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
        for lane in list(self._window.lanes.values()):
            acked = self._window.cursor_due(lane)
            if acked is not None:
                await self.log.set_cursor(lane.collection, CURSOR_NAME, acked)
                self._window.stored(lane, acked)
