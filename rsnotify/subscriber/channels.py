"""Push channels of the Destination: thin adapters that turn network input into events.

Neither channel decides anything: they decode just enough to route an event
to its collection's engine (:class:`~.sync.CollectionSync`) and keep the
connection up with backoff and jitter.  Decoding, verification, ordering and
gap handling happen in the engine, one task per collection.

MQTT uses a persistent session (MQTT 5 ``clean_start=False`` with a session
expiry; MQTT 3.1.1 ``clean_session=False`` when the broker refuses 5), so QoS
1 messages published while the subscriber is away are queued by the broker;
paho acknowledges a message once it is handed to the engine's queue.  It
reads each collection's broker-safe topics and its legacy ones
(:class:`~rsnotify.transport.topics.Topics`), so it follows old and new
publishers alike.  If the broker drops queued messages (Mosquitto's
``max_queued_messages``), the sequence jump shows it and the engine catches
up from the Change List Index.

WebSocket connects with ``?since=<last received seq>`` so the gateway replays
what was missed from its log; an engine-requested replay opens a new
connection and bumps the *generation*, so messages still queued from the old
connection are recognised as stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import threading
from collections.abc import Callable, Mapping
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import paho.mqtt.client as mqtt
import websockets
from paho.mqtt.reasoncodes import ReasonCode
from websockets.asyncio.client import ClientConnection

from .. import w3cdt
from ..backoff import Backoff
from ..envelope import SIGNATURE_PROPERTY, InvalidNotification
from ..transport import mqttsig, wsproto
from ..transport.mqttlink import BrokerLink, LinkState
from ..transport.mqttproblems import subscribe_refused
from ..transport.mqtturl import parse_broker_url
from ..transport.topics import Topics
from . import events as ev

log = logging.getLogger("rsnotify.subscribe")

Sink = Callable[[ev.Event], None]

SESSION_EXPIRY = 7 * 24 * 3600  # how long the broker keeps our queue while we are away
CLOSE_TIMEOUT = 2.0  # WebSocket closing handshake bound (on stop)


def _head_event(payload: bytes) -> ev.Head | None:
    try:
        obj = json.loads(payload)
        head = obj["head"]
        earliest = obj.get("earliest")
        beat = obj.get("heartbeat")
        if not isinstance(head, int) or isinstance(head, bool) or head < 0:
            return None
        return ev.Head(
            head=head,
            earliest=earliest if isinstance(earliest, int) else None,
            heartbeat=w3cdt.parse(beat) if isinstance(beat, str) else None,
        )
    except (ValueError, KeyError, TypeError, InvalidNotification):
        return None
    except Exception:  # a hostile head message must never kill the paho thread
        return None


def client_tls_context(cafile: str) -> ssl.SSLContext:
    """Verify a ``wss://`` gateway against this CA file (a private CA, a test CA)."""
    return ssl.create_default_context(cafile=cafile)


class MqttChannel:
    """One MQTT connection carrying every subscribed collection.

    The connection itself (MQTT 5 with a 3.1.1 fallback, reconnects with
    backoff, one-line errors) is a :class:`~rsnotify.transport.mqttlink.BrokerLink`;
    this class subscribes, routes messages to their collection's engine and
    turns the link's state into events: :class:`~.events.Connected` (at the
    SUBACK: only from then on does the broker route messages to a session
    it did not keep), :class:`~.events.Disconnected` (an established
    connection was lost) and
    :class:`~.events.Unavailable` (refused with the broker's reason, or
    unreachable), for every collection it carries.
    """

    def __init__(
        self,
        url: str,
        sinks: Mapping[str, Sink],
        *,
        topic_prefix: str = "resourcesync",
        client_id: str,
        tls_ca: str | None = None,
        tls_insecure: bool = False,
        keepalive: int = 15,
        protocol: str = "auto",
        reconnect_min: float = 0.5,
        reconnect_max: float = 10.0,
    ) -> None:
        self.broker = parse_broker_url(url)
        self.sinks = dict(sinks)
        self.topics = Topics(topic_prefix)
        self.prefix = self.topics.prefix
        self.client_id = client_id
        self.keepalive = keepalive
        self._routes: dict[str, tuple[str, str]] = {}
        self._legacy: set[str] = set()  # pre-safe names, read beside the safe ones
        # Set once the broker acknowledged every subscription of the current
        # connection: from then on nothing published is missed (tests wait on it).
        self.subscribed = threading.Event()
        # Set once the first connection attempt has an outcome (subscribed,
        # refused, unreachable, lost): the service waits on it before the
        # start-up catch-up, so that catch-up runs with the subscription in place.
        self.first_attempt = asyncio.Event()
        self._session_present = False
        for collection in self.sinks:
            for topic, kind, legacy in self.topics.read(collection):
                self._routes[topic] = (collection, kind)
                if legacy:
                    self._legacy.add(topic)
        tls = None
        if self.broker.tls:
            tls = ssl.create_default_context(cafile=tls_ca)
            if tls_insecure:
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE
        self.link = BrokerLink(
            self.broker,
            client_id=client_id,
            logger=log,
            option="--via",
            protocol=protocol,
            keepalive=keepalive,
            tls=tls,
            session_expiry=SESSION_EXPIRY,
            reconnect_min=reconnect_min,
            reconnect_max=reconnect_max,
            on_message=self._on_message,
            on_state=self._on_state,
        )

    def _post(self, collection: str, event: ev.Event) -> None:
        """Hand an event to its collection's engine, on the loop, in order (any thread).

        Through the link's hand-off, which wakes the loop once per burst.
        """
        sink = self.sinks.get(collection)
        if sink is not None:
            self.link.post(sink, event)

    def _broadcast(self, event: ev.Event) -> None:
        for collection in self.sinks:
            self._post(collection, event)

    # The link's state and SUBACKs, on the loop (state events through the same
    # hand-off as messages, to stay in order).

    def _on_state(self, state: LinkState) -> None:
        if state.state == "connected":
            self._session_present = state.session_present
            self._subscribe()
            return
        self.first_attempt.set()
        if state.state == "lost":
            self._broadcast(ev.Disconnected(f"MQTT: {state.reason}"))
        elif state.state in ("refused", "unreachable"):
            kind: Literal["refused", "unreachable"] = (
                "refused" if state.state == "refused" else "unreachable"
            )
            self._broadcast(ev.Unavailable(kind, state.reason, state.retry_in))

    def _subscribe(self) -> None:
        self.subscribed.clear()
        topics = list(self._routes)
        self.link.subscribe([(topic, 1) for topic in topics]).add_done_callback(
            lambda suback: self._on_subscribed(topics, suback)
        )

    def _on_subscribed(self, topics: list[str], suback: asyncio.Future[list[ReasonCode]]) -> None:
        if suback.cancelled() or suback.exception() is not None:
            return  # the connection went first; the next one subscribes again
        self.subscribed.set()
        self._broadcast(ev.Connected(session_present=self._session_present))
        self.first_attempt.set()
        for topic, reason in zip(topics, suback.result(), strict=False):
            if not reason.is_failure:
                continue
            if topic in self._legacy:  # e.g. NATS refuses the old names' dots: expected
                log.debug("MQTT: legacy topic %s refused (%s)", topic, reason)
                continue
            line = subscribe_refused(topic, reason.getName(), self.link.context)
            log.warning("%s", line)
            collection, _kind = self._routes[topic]
            self._post(collection, ev.Unavailable("refused", line))

    # Runs on paho's thread: route and enqueue only.

    def _on_message(self, message: mqtt.MQTTMessage) -> None:
        route = self._routes.get(message.topic)
        if route is None:
            return
        collection, kind = route
        signature = None
        props = getattr(message, "properties", None)
        for name, value in getattr(props, "UserProperty", None) or ():
            if name == SIGNATURE_PROPERTY:
                signature = value
        # paho types a payload bytes | bytearray; what it receives is bytes, for which
        # bytes() is the same object (no copy).
        payload = bytes(message.payload)
        if signature is None:  # MQTT 3.1.1: the signature may trail the payload
            payload, signature = mqttsig.detach(payload)
        if kind == "head":
            head = _head_event(payload)
            if head is not None:
                self._post(collection, head)
            return
        self._post(collection, ev.Message(payload=payload, signature=signature))

    def start(self) -> None:
        """Connect in the background; the link reconnects with backoff."""
        self.link.start()

    async def stop(self) -> None:
        await self.link.stop()


class WebSocketChannel:
    """One WebSocket connection for one collection, resuming from the last seq received."""

    def __init__(
        self,
        url: str,
        collection: str,
        sink: Sink,
        *,
        since: Callable[[], int | None],
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(url)
        path = parts.path.rstrip("/")
        if not path.endswith("/" + collection):
            path = f"{path}/{collection}"
        self.base = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
        self.collection = collection
        self.sink = sink
        self.since = since
        self.token = token
        self.ssl_context = ssl_context
        self.generation = 0
        self._received: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._connection: ClientConnection | None = None
        self._replay_from: int | None = None
        self._restart = asyncio.Event()
        self.first_attempt = asyncio.Event()  # see MqttChannel.first_attempt

    def _url(self, since: int | None) -> str:
        return self.base if since is None else f"{self.base}?since={since}"

    async def _session(self, since: int | None, generation: int) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        async with websockets.connect(
            self._url(since),
            additional_headers=headers,
            ssl=self.ssl_context,
            max_size=2**20,
            open_timeout=10,
            ping_interval=10,
            ping_timeout=20,
            close_timeout=CLOSE_TIMEOUT,
        ) as connection:
            self._connection = connection
            self.sink(ev.Connected(session_present=since is not None))
            self.first_attempt.set()
            async for data in connection:
                try:
                    frame = wsproto.parse_frame(data)
                except InvalidNotification as exc:
                    self.sink(ev.Invalid(str(exc)))
                    continue
                if isinstance(frame, wsproto.Notification):
                    self._received = frame.seq
                    self.sink(
                        ev.Message(
                            payload=frame.payload,
                            signature=frame.signature,
                            prev=frame.prev,
                            generation=generation,
                        )
                    )
                elif isinstance(frame, wsproto.Hello | wsproto.Heartbeat):
                    earliest = frame.earliest if isinstance(frame, wsproto.Hello) else None
                    self.sink(ev.Head(frame.head, earliest, frame.heartbeat))
                elif isinstance(frame, wsproto.Skipped):
                    self.sink(ev.Skipped(frame.first, frame.resume))
                elif isinstance(frame, wsproto.GapTooOld):
                    self.sink(ev.TooOld(frame.since, frame.earliest))
                elif isinstance(frame, wsproto.Error):
                    log.warning(
                        "%s: gateway error %s: %s", self.collection, frame.code, frame.message
                    )

    async def run(self) -> None:
        backoff = Backoff(initial=0.2, maximum=10.0)
        while True:
            since: int | None
            if self._replay_from is not None:
                since, self._replay_from = self._replay_from, None
            else:
                since = self._received if self._received is not None else self.since()
            self._restart.clear()
            # The generation of the request this connection serves: a replay asked
            # for later makes its messages stale, even if it connects after that.
            session = asyncio.create_task(self._session(since, self.generation))
            restart = asyncio.create_task(self._restart.wait())
            done, _ = await asyncio.wait({session, restart}, return_when=asyncio.FIRST_COMPLETED)
            if session not in done and self._connection is not None:
                # A replaced connection owes nobody a closing handshake, and one
                # with a burst of unread frames cannot finish it: its reading is
                # paused (max_queue) so the close reply is never read, and the
                # replay would wait out the close timeout.  Drop it.
                self._connection.transport.abort()
            for task in (session, restart):
                if task not in done:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            self._connection = None
            self.first_attempt.set()
            if restart in done:
                continue  # a replay was requested: reconnect at once
            exc = session.exception()
            reason = f"{type(exc).__name__}: {exc}" if exc else "closed by the gateway"
            self.sink(ev.Disconnected(f"WebSocket: {reason}"))
            delay = backoff.next()
            log.info("%s: WebSocket %s; reconnecting in %.1fs", self.collection, reason, delay)
            await asyncio.sleep(delay)
            if exc is None:
                backoff.reset()

    async def replay(self, since: int | None) -> int:
        """Reconnect asking the gateway for everything after ``since``; returns the generation."""
        self.generation += 1
        self._replay_from = since
        self._received = since
        self._restart.set()
        return self.generation

    def start(self) -> None:
        self._task = asyncio.create_task(self.run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
