"""Push channels of the Destination: thin adapters that turn network input into events.

Neither channel decides anything: they decode just enough to route an event
to its collection's engine (:class:`~.sync.CollectionSync`) and keep the
connection up with backoff and jitter.  Decoding, verification, ordering and
gap handling happen in the engine, one task per collection.

MQTT uses a persistent session (MQTT 5 ``clean_start=False`` with a session
expiry), so QoS 1 messages published while the subscriber is away are queued
by the broker; paho acknowledges a message once it is handed to the engine's
queue.  If the broker drops queued messages (Mosquitto's
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
import sys
import threading
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit, urlunsplit

import paho.mqtt.client as mqtt
import websockets
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from .. import w3cdt
from ..backoff import Backoff
from ..envelope import SIGNATURE_PROPERTY, InvalidNotification
from ..transport import wsproto
from ..transport.mqtturl import parse_broker_url
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
    """One MQTT connection carrying every subscribed collection."""

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
    ) -> None:
        self.broker = parse_broker_url(url)
        self.sinks = dict(sinks)
        self.prefix = topic_prefix
        self.client_id = client_id
        self.keepalive = keepalive
        self._tls_ca = tls_ca
        self._tls_insecure = tls_insecure
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: mqtt.Client | None = None
        self._routes: dict[str, tuple[str, str]] = {}
        self._handoff: list[tuple[Callable[[ev.Event], None], ev.Event]] = []
        self._handoff_lock = threading.Lock()
        self._handoff_scheduled = False
        for collection in self.sinks:
            self._routes[f"{self.prefix}/{collection}/changes"] = (collection, "changes")
            self._routes[f"{self.prefix}/{collection}/head"] = (collection, "head")

    def _post(self, collection: str, event: ev.Event) -> None:
        """Hand an event from paho's thread to the loop, in order.

        Events queue here and one wake-up drains them all: a wake-up per
        message (a write to the loop's self-pipe, a callback) was a visible
        share of the subscriber's CPU at 1,000 messages/s.
        """
        loop = self._loop
        sink = self.sinks.get(collection)
        if loop is None or sink is None:
            return
        with self._handoff_lock:
            self._handoff.append((sink, event))
            if self._handoff_scheduled:
                return
            self._handoff_scheduled = True
        loop.call_soon_threadsafe(self._drain_handoff)

    def _drain_handoff(self) -> None:
        with self._handoff_lock:
            batch, self._handoff = self._handoff, []
            self._handoff_scheduled = False
        for sink, event in batch:
            sink(event)

    def _broadcast(self, event: ev.Event) -> None:
        for collection in self.sinks:
            self._post(collection, event)

    # paho callbacks run on paho's thread: route and enqueue only.

    def _on_connect(self, client, userdata, flags, reason, properties) -> None:  # type: ignore[no-untyped-def]
        if reason.is_failure:
            log.warning("MQTT connection to %s refused: %s", self.broker.redacted(), reason)
            return
        client.subscribe([(topic, 1) for topic in self._routes])
        self._broadcast(ev.Connected(session_present=bool(flags.session_present)))

    def _on_connect_fail(self, client, userdata) -> None:  # type: ignore[no-untyped-def]
        # paho retries a failed TCP/TLS connect silently; it calls this from inside
        # its except block, so the exception (e.g. an unknown CA) is still at hand.
        exc = sys.exc_info()[1]
        why = f"{type(exc).__name__}: {exc}" if exc is not None else "no connection"
        log.warning("MQTT connection to %s failed: %s", self.broker.redacted(), why)

    def _on_disconnect(self, client, userdata, flags, reason, properties) -> None:  # type: ignore[no-untyped-def]
        self._broadcast(ev.Disconnected(f"MQTT: {reason}"))

    def _on_message(self, client, userdata, message) -> None:  # type: ignore[no-untyped-def]
        route = self._routes.get(message.topic)
        if route is None:
            return
        collection, kind = route
        if kind == "head":
            head = _head_event(message.payload)
            if head is not None:
                self._post(collection, head)
            return
        signature = None
        props = getattr(message, "properties", None)
        for name, value in getattr(props, "UserProperty", None) or ():
            if name == SIGNATURE_PROPERTY:
                signature = value
        self._post(collection, ev.Message(payload=message.payload, signature=signature))

    def start(self) -> None:
        """Connect in the background; paho reconnects with backoff on its own thread."""
        self._loop = asyncio.get_running_loop()
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=True,
        )
        if self.broker.username is not None:
            client.username_pw_set(self.broker.username, self.broker.password)
        if self.broker.tls:
            context = ssl.create_default_context(cafile=self._tls_ca)
            if self._tls_insecure:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            client.tls_set_context(context)
        client.reconnect_delay_set(min_delay=1, max_delay=10)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = SESSION_EXPIRY
        client.connect_async(
            self.broker.host,
            self.broker.port,
            keepalive=self.keepalive,
            clean_start=False,
            properties=props,
        )
        client.loop_start()
        self._client = client

    async def stop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await asyncio.to_thread(client.disconnect)
            await asyncio.to_thread(client.loop_stop)


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
        self._connection: websockets.asyncio.client.ClientConnection | None = None
        self._replay_from: int | None = None
        self._restart = asyncio.Event()

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
