"""The paho bridge: one MQTT connection, its thread, and its events on the asyncio loop.

Every rsnotify MQTT client goes through a :class:`BrokerLink`: the
publisher's pusher (and the ``--mqtt-only`` gateway, the same pusher), the
subscriber's channel and the dashboard's head reader.  It does what all
three need and none should write again:

* **a fresh paho client per attempt** (``reconnect_on_failure=False``): the
  protocol version is fixed when a paho client is made, so falling back from
  MQTT 5 to 3.1.1 needs a new one; and a fresh client never resends stale
  in-flight messages of an old connection behind its owner's back.
* **protocol fallback**: ``protocol="auto"`` tries MQTT 5, and on a CONNACK
  "unsupported protocol version" (NATS: "unacceptable protocol version of 5";
  Mosquitto 1.x) tries 3.1.1 at once.  What worked is remembered for the
  life of the link (each rsnotify process has one link per broker), so
  reconnects start with it, and the fallback is logged once.
* **one line per failure, saying what to change** (:mod:`.mqttproblems`),
  followed by the **retry policy**: every client retries forever, with
  exponential backoff and jitter from ``reconnect_min`` to ``reconnect_max``
  (straight to ``reconnect_max`` for refusals waiting will not fix: bad
  credentials, a banned client, a protocol neither side speaks), and says
  when the next attempt comes: ``...; retrying in 3.2 s (backoff up to 10 s,
  until it works)``.  A broker is an optional fast path for every client
  (the publisher logs everything, a Destination polls the Change Lists), so
  no client exits because a broker is away.
* **state for its owner**: :class:`LinkState` (``connected``, ``refused``,
  ``unreachable``, ``lost``) on the asyncio loop, with the reason line; the
  subscriber turns it into channel events, the pusher into its window.
* **the thread hop**: paho runs its network loop in a thread of its own
  (``loop_start``).  Its callbacks never do work: each one hands its event
  to the asyncio loop through one :class:`Handoff`, so the owner sees
  CONNACKs, SUBACKs, PUBACKs, its own messages and disconnects on the loop,
  in the order paho saw them, and needs no locks.
* **publish and subscribe**: :meth:`BrokerLink.subscribe` returns a future
  that the SUBACK resolves; :meth:`BrokerLink.publish` hands one QoS 1
  message to paho and returns its message id, and each PUBACK reaches the
  owner's ``on_ack`` on the loop.  (Not a future per message: the pusher
  books thousands of PUBACKs a second in batches, and a future's callbacks
  would cost a loop turn each.)
* **the in-flight limit**: ``max_inflight`` messages on the wire, lowered at
  CONNACK to the broker's MQTT 5 Receive Maximum, and paho's own queue
  capped at ``max_queued``.  Setting the limit at CONNACK needs a private
  paho attribute (see :func:`.pahoprivate.cap_inflight`).
* **no garbage cycle per received message**: paho's per-topic-filter table
  is swapped for one whose empty lookup makes none, the other private paho
  attribute rsnotify writes (:func:`.pahoprivate.lighten`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from ..backoff import Backoff
from . import TransportError
from . import mqttproblems as problems
from .handoff import Handoff
from .mqtturl import BrokerURL
from .pahoprivate import cap_inflight, lighten

PROTOCOLS = {"auto": mqtt.MQTTv5, "5": mqtt.MQTTv5, "3.1.1": mqtt.MQTTv311}
PROTOCOL_NAMES = {mqtt.MQTTv5: "5", mqtt.MQTTv311: "3.1.1"}
CLOSE_TIMEOUT_S = 3.0
PROTOCOL_ERROR = 0x82

State = Literal["connecting", "connected", "refused", "unreachable", "lost"]


def check_protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise TransportError(f"unknown MQTT protocol {protocol!r} (auto, 5 or 3.1.1)")
    return protocol


def tls_context(
    ca: str | None, cert: str | None, key: str | None, insecure: bool
) -> ssl.SSLContext:
    """The TLS context of an ``mqtts://`` client from its options (``tls=`` of a link)."""
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


@dataclass(frozen=True, slots=True)
class LinkState:
    """Where a link stands, as its owner hears it (on the asyncio loop)."""

    state: State
    reason: str = ""  # one line; for refused/unreachable it says what to change
    conn: int = 0  # the paho client this is about
    protocol: str | None = None  # "5" or "3.1.1" once connected
    session_present: bool = False
    retry_in: float | None = None


@dataclass(slots=True)
class LinkStats:
    connect_attempts: int = 0
    connections: int = 0


#: A message received, in paho's thread: route it and :meth:`BrokerLink.post`, nothing more.
OnMessage = Callable[[mqtt.MQTTMessage], None]
#: ``on_ack(conn, mid, reason)``: a PUBACK, on the loop.
OnAck = Callable[[int, int, ReasonCode], None]
OnState = Callable[[LinkState], None]


class BrokerLink:
    """Connects, reports, falls back, backs off and reconnects; owners only react.

    ``session_expiry=None`` asks for a clean session every time; a number
    keeps the broker-side session (MQTT 5 clean start off with that session
    expiry; MQTT 3.1.1 clean session off).  :meth:`run` loops until
    cancelled; :meth:`close` ends the current connection and paho's thread.
    """

    def __init__(
        self,
        broker: BrokerURL,
        *,
        client_id: str,
        logger: logging.Logger,
        option: str = "--mqtt",
        protocol: str = "auto",
        keepalive: int = 30,
        connect_timeout: float = 10.0,
        tls: ssl.SSLContext | None = None,
        session_expiry: int | None = None,
        reconnect_min: float = 0.25,
        reconnect_max: float = 10.0,
        stats: LinkStats | None = None,
        max_inflight: int | None = None,
        max_queued: int | None = None,
        on_message: OnMessage | None = None,
        on_ack: OnAck | None = None,
        on_state: OnState | None = None,
    ) -> None:
        self.broker = broker
        self.client_id = client_id
        self.log = logger
        self.protocol = check_protocol(protocol)
        self.keepalive = keepalive
        self.connect_timeout = connect_timeout
        self.tls = tls
        self.session_expiry = session_expiry
        self.reconnect_min = reconnect_min
        self.reconnect_max = reconnect_max
        self.max_inflight = max_inflight
        self.max_queued = max_queued
        # On the wire: min(max_inflight, the broker's Receive Maximum), once connected.
        self.inflight_limit = max_inflight
        self.on_message = on_message
        self.on_ack = on_ack
        self.on_state = on_state
        self.context = problems.Context(broker, option, client_id)
        self.stats = stats if stats is not None else LinkStats()
        self.client: mqtt.Client | None = None
        self.conn = 0  # id of the current paho client; events of older ones are ignored
        self.connected = False
        self.state = LinkState("connecting")
        self._client_protocol: mqtt.MQTTProtocolVersion | None = None
        # the protocol of the last successful connection
        self._worked: mqtt.MQTTProtocolVersion | None = None
        self._handoff = Handoff(logger)
        self._task: asyncio.Task[None] | None = None
        self._events: asyncio.Queue[tuple[int, str, ReasonCode | None, bool]] = asyncio.Queue()
        self._subacks: dict[tuple[int, int], asyncio.Future[list[ReasonCode]]] = {}

    # -- what the owner reads ------------------------------------------------------

    @property
    def protocol_in_use(self) -> str | None:
        """``"5"`` or ``"3.1.1"``: what the current (or last) client speaks."""
        return PROTOCOL_NAMES.get(self._client_protocol) if self._client_protocol else None

    @property
    def v5(self) -> bool:
        return self._client_protocol == mqtt.MQTTv5

    # -- the loop ----------------------------------------------------------------------

    def _first_protocol(self) -> mqtt.MQTTProtocolVersion:
        if self.protocol != "auto":
            return PROTOCOLS[self.protocol]
        return self._worked or mqtt.MQTTv5

    async def run(self) -> None:
        """Connect, wait for the connection to end, reconnect; forever (cancel to stop)."""
        self._handoff.bind(asyncio.get_running_loop())
        backoff = Backoff(initial=self.reconnect_min, maximum=self.reconnect_max)
        protocol = self._first_protocol()
        fallback_logged = False
        while True:
            problem = await self._attempt(protocol)
            if problem is None:
                backoff.reset()
                await self._until_lost()
                delay = backoff.next()
            elif problem.kind == "protocol" and self.protocol == "auto" and protocol == mqtt.MQTTv5:
                protocol = mqtt.MQTTv311
                if not fallback_logged:
                    fallback_logged = True
                    self.log.warning(
                        "%s refused MQTT 5; using MQTT 3.1.1 with it from now on",
                        self.context.where,
                    )
                continue
            else:
                if problem.kind == "protocol" and self.protocol == "auto":
                    protocol = mqtt.MQTTv5  # refused 3.1.1 too: start over next time
                delay = (
                    Backoff(self.reconnect_max, self.reconnect_max).next()
                    if problem.lasting
                    else backoff.next()
                )
                state: State = "unreachable" if problem.kind == "unreachable" else "refused"
                self._report(LinkState(state, problem.line, self.conn, retry_in=delay))
                self.log.warning(
                    "%s; retrying in %.1f s (backoff up to %g s, until it works)",
                    problem.line,
                    delay,
                    self.reconnect_max,
                )
            await asyncio.sleep(delay)

    async def _attempt(self, protocol: mqtt.MQTTProtocolVersion) -> problems.Problem | None:
        """One connection attempt: None once connected, else why not."""
        client, conn = self._new_client(protocol)
        old, self.client = self.client, client
        self._client_protocol = protocol
        await self._close(old)
        self.stats.connect_attempts += 1
        options: dict[str, Any] = {}
        if protocol == mqtt.MQTTv5:
            options["clean_start"] = self.session_expiry is None
            if self.session_expiry is not None:
                # paho leaves Properties.__init__ unannotated.
                props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
                props.SessionExpiryInterval = self.session_expiry
                options["properties"] = props
        try:
            # connect() resolves, opens TCP (and TLS) and sends CONNECT: blocking work.
            await asyncio.to_thread(
                client.connect, self.broker.host, self.broker.port, self.keepalive, **options
            )
        except OSError as exc:  # refused, unresolvable, timeout, TLS failure
            await self._close(client)
            return problems.unreachable(exc, self.context, self.connect_timeout)
        client.loop_start()
        try:
            async with asyncio.timeout(self.connect_timeout):
                kind, reason, session = await self._next_event(conn)
        except TimeoutError:
            await self._close(client)
            return problems.no_connack(self.context, self.connect_timeout)
        if kind == "connack" and reason is not None and not reason.is_failure:
            self.connected = True
            self.stats.connections += 1
            self._worked = protocol
            name = PROTOCOL_NAMES[protocol]
            self.log.info(
                "MQTT: connected to %s as %s (MQTT %s)",
                self.broker.redacted(),
                self.client_id,
                name,
            )
            self._report(LinkState("connected", "", conn, name, session_present=session))
            return None
        await self._close(client)
        if kind == "connack" and reason is not None:
            return problems.refused(
                reason.value, reason.getName(), self.context, PROTOCOL_NAMES[protocol]
            )
        if protocol == mqtt.MQTTv311 and reason is not None and reason.value == PROTOCOL_ERROR:
            # paho's 3.1.1 client reports a CONNACK "unacceptable protocol version"
            # (return code 1) only as this disconnect, without on_connect.
            return problems.refused(
                problems.UNSUPPORTED_PROTOCOL, "Unsupported protocol version", self.context, "3.1.1"
            )
        return problems.closed_before_connack(self.context)

    async def _until_lost(self) -> None:
        conn = self.conn
        while True:
            kind, _reason, _session = await self._next_event(conn)
            if kind == "disconnect":
                break
        client, self.client = self.client, None
        await self._close(client)

    async def _next_event(self, conn: int) -> tuple[str, ReasonCode | None, bool]:
        while True:
            event_conn, kind, reason, session = await self._events.get()
            if event_conn == conn:
                return kind, reason, session

    def _report(self, state: LinkState) -> None:
        self.state = state
        if self.on_state is not None:
            try:
                self.on_state(state)
            except Exception:
                self.log.exception("MQTT link state callback failed")

    # -- paho clients ---------------------------------------------------------------------

    def _new_client(self, protocol: mqtt.MQTTProtocolVersion) -> tuple[mqtt.Client, int]:
        self.conn += 1
        conn = self.conn
        v5 = protocol == mqtt.MQTTv5
        client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            # 3.1.1 takes its clean session here, 5 its clean start at connect().
            clean_session=None if v5 else self.session_expiry is None,
            protocol=protocol,
            reconnect_on_failure=False,  # we reconnect, with jitter, on a fresh client
        )
        lighten(client)
        if self.broker.username is not None:
            client.username_pw_set(self.broker.username, self.broker.password)
        if self.tls is not None:
            client.tls_set_context(self.tls)
        client.connect_timeout = self.connect_timeout

        if self.max_inflight is not None:
            client.max_inflight_messages_set(self.max_inflight)  # until the CONNACK says less
        if self.max_queued is not None:
            # paho counts its in-flight messages in this cap too.
            client.max_queued_messages_set(self.max_queued)
        post = self._handoff.post
        # paho's callback API version 2 (CallbackOn*_v2).  Any: userdata, flags and
        # properties that go unused, and SUBACK reason codes passed on as they come.

        def on_connect(
            c: mqtt.Client,
            _u: Any,
            flags: mqtt.ConnectFlags,
            reason: ReasonCode,
            props: Properties | None,
        ) -> None:
            if not reason.is_failure and self.max_inflight is not None:
                self.inflight_limit = cap_inflight(c, self.max_inflight, props)
            session = bool(getattr(flags, "session_present", False))
            post(self._on_event, conn, "connack", reason, session)

        def on_disconnect(_c: mqtt.Client, _u: Any, _f: Any, reason: ReasonCode, _p: Any) -> None:
            post(self._on_event, conn, "disconnect", reason, False)

        def on_subscribe(_c: mqtt.Client, _u: Any, mid: int, reasons: Any, _p: Any) -> None:
            post(self._on_suback, conn, mid, list(reasons))

        client.on_connect = on_connect
        client.on_disconnect = on_disconnect
        client.on_subscribe = on_subscribe
        on_ack = self.on_ack
        if on_ack is not None:

            def on_publish(_c: mqtt.Client, _u: Any, mid: int, reason: ReasonCode, _p: Any) -> None:
                post(on_ack, conn, mid, reason)

            client.on_publish = on_publish
        on_message = self.on_message
        if on_message is not None:
            client.on_message = lambda _c, _u, message: on_message(message)
        return client, conn

    def post(self, fn: Callable[..., None], *args: Any) -> None:
        """From paho's thread: run ``fn(*args)`` on the loop, in order with every other event."""
        self._handoff.post(fn, *args)

    def _on_event(self, conn: int, kind: str, reason: ReasonCode | None, session: bool) -> None:
        if conn == self.conn and kind == "disconnect" and self.connected:
            # At once, not when the run loop gets round to it: the owner must
            # stop handing messages to a dead client now.
            self.connected = False
            self._fail_subacks(conn, "the connection was lost before the SUBACK")
            why = reason.getName() if reason is not None else "unknown"
            self.log.warning("MQTT: lost the connection to %s (%s)", self.broker.redacted(), why)
            self._report(LinkState("lost", why, conn, self.protocol_in_use))
        self._events.put_nowait((conn, kind, reason, session))

    # -- publish and subscribe, on the loop --------------------------------------------------

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        retain: bool = False,
        properties: Properties | None = None,
    ) -> int | None:
        """Hand one QoS 1 message to paho; its message id, or None if it was not taken.

        None: no connection, or paho refused it (its queue is full, the
        connection is going).  The PUBACK comes to ``on_ack`` with this id.
        """
        client = self.client
        if client is None:
            return None
        info = client.publish(topic, payload, qos=1, retain=retain, properties=properties)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            self.log.debug(
                "MQTT: paho refused a publish on %s: %s", topic, mqtt.error_string(info.rc)
            )
            return None
        return info.mid

    def subscribe(self, topics: list[tuple[str, int]]) -> asyncio.Future[list[ReasonCode]]:
        """Subscribe on the current connection; the future holds the SUBACK's reason codes.

        One reason code per topic, in order.  The future fails with
        :class:`~rsnotify.transport.TransportError` if there is no connection,
        paho refuses, or the connection ends before the SUBACK.
        """
        future: asyncio.Future[list[ReasonCode]] = asyncio.get_running_loop().create_future()
        client = self.client
        if client is None or not self.connected:
            future.set_exception(TransportError("not connected"))
            return future
        rc, mid = client.subscribe(topics)
        if rc != mqtt.MQTT_ERR_SUCCESS or mid is None:
            future.set_exception(TransportError(f"paho refused: {mqtt.error_string(rc)}"))
            return future
        # The SUBACK cannot overtake this: paho's thread only posts it to this loop.
        self._subacks[self.conn, mid] = future
        return future

    def _on_suback(self, conn: int, mid: int, reasons: list[ReasonCode]) -> None:
        future = self._subacks.pop((conn, mid), None)
        if future is not None and not future.done():
            future.set_result(reasons)

    def _fail_subacks(self, conn: int | None, why: str) -> None:
        for key in [k for k in self._subacks if conn is None or k[0] == conn]:
            future = self._subacks.pop(key)
            if not future.done():
                future.set_exception(TransportError(why))

    def start(self) -> None:
        """:meth:`run` in a task of its own, for owners with nothing else to run."""
        self._task = asyncio.get_running_loop().create_task(self.run(), name="mqtt-link")

    async def stop(self) -> None:
        """Cancel what :meth:`start` started, then :meth:`close`."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.close()

    async def close(self) -> None:
        """End the current connection (cleanly if possible) and paho's thread."""
        client, self.client = self.client, None
        self.connected = False
        self._fail_subacks(None, "the connection was closed before the SUBACK")
        await self._close(client)

    async def _close(self, client: mqtt.Client | None) -> None:
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
            self.log.warning("MQTT: paho's network thread did not stop; closed its socket")
