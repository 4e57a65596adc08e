"""Keep one MQTT connection up: the one connection loop of every rsnotify MQTT client.

The publisher's pusher (and the ``--mqtt-only`` gateway, the same pusher),
the subscriber's channel and the dashboard's head reader each own a
:class:`BrokerLink`.  It does what all three need and none should write
again:

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
  when the next attempt comes: ``...; retrying in 3.2 s (backoff up to 30 s,
  until it works)``.  A broker is an optional fast path for every client
  (the publisher logs everything, a Destination polls the Change Lists), so
  no client exits because a broker is away.
* **state for its owner**: :class:`LinkState` (``connected``, ``refused``,
  ``unreachable``, ``lost``) on the asyncio loop, with the reason line; the
  subscriber turns it into channel events, the pusher into its window.

Threads: paho's network loop runs in its own thread (``loop_start``); the
callbacks installed here only hand events to the asyncio loop with
``call_soon_threadsafe``.  The owner installs its own message callbacks in
``setup`` and may act in paho's thread at CONNACK (``on_connack``: subscribe,
apply Receive Maximum) before the loop hears of the connection.
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
from .mqtturl import BrokerURL

PROTOCOLS = {"auto": mqtt.MQTTv5, "5": mqtt.MQTTv5, "3.1.1": mqtt.MQTTv311}
PROTOCOL_NAMES = {mqtt.MQTTv5: "5", mqtt.MQTTv311: "3.1.1"}
CLOSE_TIMEOUT_S = 3.0
PROTOCOL_ERROR = 0x82

State = Literal["connecting", "connected", "refused", "unreachable", "lost"]


def check_protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise TransportError(f"unknown MQTT protocol {protocol!r} (auto, 5 or 3.1.1)")
    return protocol


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


Setup = Callable[[mqtt.Client, int], None]
OnConnack = Callable[[mqtt.Client, int, Properties | None], None]
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
        reconnect_max: float = 30.0,
        stats: LinkStats | None = None,
        setup: Setup | None = None,
        on_connack: OnConnack | None = None,
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
        self.setup = setup
        self.on_connack = on_connack
        self.on_state = on_state
        self.context = problems.Context(broker, option, client_id)
        self.stats = stats if stats is not None else LinkStats()
        self.client: mqtt.Client | None = None
        self.conn = 0  # id of the current paho client; events of older ones are ignored
        self.connected = False
        self.state = LinkState("connecting")
        self._client_protocol: int | None = None
        self._worked: int | None = None  # the protocol of the last successful connection
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._events: asyncio.Queue[tuple[int, str, ReasonCode | None, bool]] = asyncio.Queue()

    # -- what the owner reads ------------------------------------------------------

    @property
    def protocol_in_use(self) -> str | None:
        """``"5"`` or ``"3.1.1"``: what the current (or last) client speaks."""
        return PROTOCOL_NAMES.get(self._client_protocol) if self._client_protocol else None

    @property
    def v5(self) -> bool:
        return self._client_protocol == mqtt.MQTTv5

    # -- the loop ----------------------------------------------------------------------

    def _first_protocol(self) -> int:
        if self.protocol != "auto":
            return PROTOCOLS[self.protocol]
        return self._worked or mqtt.MQTTv5

    async def run(self) -> None:
        """Connect, wait for the connection to end, reconnect; forever (cancel to stop)."""
        self._loop = asyncio.get_running_loop()
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

    async def _attempt(self, protocol: int) -> problems.Problem | None:
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
                props = Properties(PacketTypes.CONNECT)
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

    def _new_client(self, protocol: int) -> tuple[mqtt.Client, int]:
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
        if self.broker.username is not None:
            client.username_pw_set(self.broker.username, self.broker.password)
        if self.tls is not None:
            client.tls_set_context(self.tls)
        client.connect_timeout = self.connect_timeout

        def on_connect(c: mqtt.Client, _u: Any, flags: Any, reason: ReasonCode, props: Any) -> None:
            if not reason.is_failure and self.on_connack is not None:
                self.on_connack(c, conn, props)
            session = bool(getattr(flags, "session_present", False))
            self._post(conn, "connack", reason, session)

        def on_disconnect(_c: mqtt.Client, _u: Any, _f: Any, reason: ReasonCode, _p: Any) -> None:
            self._post(conn, "disconnect", reason, False)

        client.on_connect = on_connect
        client.on_disconnect = on_disconnect
        if self.setup is not None:
            self.setup(client, conn)
        return client, conn

    def _post(self, conn: int, kind: str, reason: ReasonCode | None, session: bool) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            loop.call_soon_threadsafe(self._on_event, conn, kind, reason, session)

    def _on_event(self, conn: int, kind: str, reason: ReasonCode | None, session: bool) -> None:
        if conn == self.conn and kind == "disconnect" and self.connected:
            # At once, not when the run loop gets round to it: the owner must
            # stop handing messages to a dead client now.
            self.connected = False
            why = reason.getName() if reason is not None else "unknown"
            self.log.warning("MQTT: lost the connection to %s (%s)", self.broker.redacted(), why)
            self._report(LinkState("lost", why, conn, self.protocol_in_use))
        self._events.put_nowait((conn, kind, reason, session))

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
