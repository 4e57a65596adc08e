"""WebSocket transport: a gateway that tails the notification log and fans out to clients.

Why one module of ~700 lines: it is one class, the gateway, whose admission
(slots per address), client handlers, replays, pacing and memory release
share the connection set, the tailers and one event loop's timing; the wire
protocol is :mod:`.wsproto` (pure), the log tail :mod:`.tail`, the shared
frames and their fan-out :mod:`.wsfeed` and rendering
:mod:`rsnotify.outbound`, so what is left here is the asyncio and
``websockets`` flow between them.

The wire protocol (URLs, frames, close codes, what ``prev`` and ``skipped``
promise) is specified in :mod:`.wsproto`; this module is the I/O around it,
built on the asyncio API of ``websockets``.

Everything comes from the log
    Heads, replays and live records are read from the log only -- never from
    a publisher in the same process -- so a gateway runs inside
    ``rsnotify publish`` or as any number of ``--ws-only`` processes sharing
    one Redis, and they all send the same sequence.  New collections are
    picked up from ``log.collections()`` (periodically, and at once when a
    client asks for one this gateway has not heard of yet).

One tailer per collection (:mod:`.tail`, shared with the WebSub hub)
    For each collection with clients, one task loops on ``log.wait``,
    renders each record once (:func:`rsnotify.outbound.render`: stamp,
    encode, sign), encodes its WebSocket frame once and keeps the last
    ``queue_size`` of them in a ring (:class:`~.wsfeed.Feed`).  Fan-out is
    one pass that writes those bytes to every unfiltered client in step
    with room in its write buffer, as ``websockets.broadcast`` does, and
    wakes the others' writer tasks: the tailer never awaits a client, so one
    slow reader cannot hold up anything else.  A tailer with no clients left
    ends; the next subscriber starts a new one.

Clients are cursors, not copies
    Each client has a :class:`~.wsproto.SendCursor` per collection (a few
    integers) and a writer task that pulls from the ring when the fan-out
    pass cannot serve it (filters, replay, a full buffer).  This *is* the
    protocol's "bounded queue of ``queue_size`` frames", with the frames
    shared: a client that falls more than ``queue_size`` behind live is
    skipped ahead (a ``skipped`` frame) exactly as if a private queue had
    overflowed and been dropped -- but a thousand clients cost one ring, not
    a thousand queues.  Per-client memory is the cursors, one frame in flight
    and websockets' write buffer (``write_limit``), however slowly the client
    reads.  A client that stops reading altogether is eventually closed by
    the keepalive (``ping_interval + ping_timeout``).

Replay without gaps or duplicates
    A client with ``since=S`` starts in replay mode: it reads ``S+1...`` from
    the log in batches, at its own pace (a replay waits for the client
    instead of dropping), until its next seq is inside the ring, then goes on
    from the ring.  Both sources are addressed by seq and the cursor moves
    forward one seq at a time, so the replay/live boundary can neither lose
    nor repeat a notification, however appends race with the connect.  The
    ring itself stays dense: if the log trimmed records before the tailer
    read them, the ring restarts and clients get ``skipped`` for the hole.

Compression (permessage-deflate) is off: it would cost every connection its
own zlib state and compress every shared frame once per client.

What one client address may take
    A connection costs the gateway about 20 KB (its tasks, buffers and
    websockets' state), so one client without a token could once hold all
    ``max_clients`` slots (10,000: +200 MB) and lock everyone else out.  Each
    client address (an IPv4 address, an IPv6 /64, which is what one host
    gets) may hold ``max_per_address`` connections (256 by default); the next
    is refused with HTTP 429 before the WebSocket opens.  Slots are counted
    from the moment a handshake is accepted until its TCP connection is gone,
    so a burst of simultaneous handshakes cannot overshoot.  Behind a reverse
    proxy every client has the proxy's address: raise the limit or set 0 (no
    limit) there, and let the proxy limit per client.

Giving memory back
    When many connections close (at least ``RELEASE_AFTER`` since the busiest
    moment, and half of them), the gateway calls ``release_memory`` once,
    ``RELEASE_DELAY`` seconds after the last connection is gone and the last
    handler has ended (what a running handler holds cannot be freed yet): the publisher passes
    :func:`rsnotify.runtime.release_memory`, which collects the reference
    cycles asyncio leaves behind each closed transport (otherwise held until a
    rare full collection) and returns freed heap pages to the system.
    Measured in ``bench/ws_connections.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import os
import socket
import ssl
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import orjson
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from .. import outbound
from ..errors import RsNotifyError
from ..log import LogRecord, LogUnavailable, NotificationLog
from ..outbound import Signer
from . import wsproto
from .wsfeed import Client, Feed, FeedItem, Stream, feed_item
from .wsproto import InvalidSubscription, SendCursor

logger = logging.getLogger(__name__)

#: Records per ``log.wait`` of a tailer (capped at ``queue_size``: more would
#: only be rendered to fall out of the ring at once).
TAIL_BATCH = 500
#: Records per ``log.read`` of a replaying client (bounds its memory).
REPLAY_BATCH = 100
#: Seconds before a replay looks again for records the log holds back (see ``_replay``).
REPLAY_RETRY = 0.5
#: Seconds between two warnings that replays of one collection wait for such records.
LOG_BEHIND_WARN_EVERY = 60.0
#: Frames one client sends for one collection before the others get a turn.
PUMP_BUDGET = 64
#: How long a tailer whose ring is full waits for its fastest client to make
#: room, and how recent that client's progress must be to be waited for.
PACE_GRACE = 0.5
#: Connections one client address may hold by default (0: no limit).
MAX_PER_ADDRESS = 256
#: Closed connections (since the busiest moment) that make memory worth releasing.
RELEASE_AFTER = 500
#: Seconds without a further close before ``release_memory`` runs.
RELEASE_DELAY = 1.0


class WebSocketGateway:
    """Serve the notification log over WebSocket (protocol: :mod:`.wsproto`).

    ``on_client_change`` is called with the number of connected clients
    whenever it changes (e.g. to set a Prometheus gauge).  ``on_published``
    is called once per live record, when its frame is first written to a
    client: ``(collection, seq, frame_tail_len, seconds since the tailer read
    it)``; replays and later clients are not counted again.  Bind to an IP
    address: with ``port=0`` and a host name that resolves to several
    addresses, each socket would get a different port.
    """

    def __init__(
        self,
        log: NotificationLog,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        fmt: str = "json",
        signer: Signer | None = None,
        token: str | None = None,
        # Per collection, shared by every client (~0.6 KB a frame): 10,000 lets a
        # client keep up through a burst of a whole Change List without a
        # skip-and-replay round trip (measured in bench/publish.py).
        queue_size: int = 10_000,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 20.0,
        heartbeat: float = 5.0,
        max_clients: int = 10_000,
        max_per_address: int = MAX_PER_ADDRESS,
        server_id: str | None = None,
        on_client_change: Callable[[int], None] | None = None,
        on_published: Callable[[str, int, int, float], None] | None = None,
        write_limit: int = 64 * 1024,
        close_timeout: float = 5.0,
        refresh_interval: float = 10.0,
        pace_grace: float = PACE_GRACE,
        ssl_context: ssl.SSLContext | None = None,
        renderer: outbound.Renderer | None = None,
        release_memory: Callable[[], object] | None = None,
    ) -> None:
        if fmt not in wsproto.FORMATS:
            raise ValueError(f"unknown notification format {fmt!r}")
        if queue_size < 1 or max_clients < 1 or write_limit < 1:
            raise ValueError("queue_size, max_clients and write_limit must be positive")
        if max_per_address < 0:
            raise ValueError("max_per_address must be >= 0 (0: no limit)")
        if heartbeat <= 0 or refresh_interval <= 0:
            raise ValueError("heartbeat and refresh_interval must be positive")
        if token is not None and not token:
            raise ValueError("an empty token would let anyone in; pass None for no auth")
        self.log = log
        self.host = host
        self.port = port
        self.fmt = fmt
        self.queue_size = queue_size
        self.heartbeat = heartbeat
        self.max_clients = max_clients
        self.max_per_address = max_per_address
        self.write_limit = write_limit
        self.server_id = server_id or f"{socket.gethostname()}:{os.getpid()}"
        self._signer = signer
        # Shared with the publisher's other transports when it passes one.
        self._renderer = renderer or outbound.Renderer(fmt, signer)
        if (self._renderer.fmt, self._renderer.signer) != (fmt, signer):
            raise ValueError("the renderer must use the gateway's format and signer")
        self._token = token
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._close_timeout = close_timeout
        self._refresh_interval = refresh_interval
        self._pace_grace = pace_grace
        self._on_client_change = on_client_change
        self._on_published = on_published
        self._ssl_context = ssl_context  # wss:// when set (see server_tls_context)
        self.replayed = 0  # records sent from the log rather than the ring (a cost metric)
        self.replay_waits = 0  # replays that found the log behind the tailer (see _replay)
        self._log_behind_warned: dict[str, float] = {}  # collection -> next warning (loop time)
        self._shared_before = 0  # shared frames written by feeds that have ended
        self._server: Server | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._refreshing: asyncio.Future[dict[str, str]] | None = None
        self._collections: dict[str, str] = {}
        self._tailers: dict[str, Feed] = {}
        self._connections: set[ServerConnection] = set()
        # Admitted handshakes (not yet disconnected), in all and per client address.
        self._admitted = 0
        self._per_address: dict[str, int] = {}
        self._release_memory = release_memory
        self._busiest = 0  # most admitted since memory was last released
        self._release_timer: asyncio.TimerHandle | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Bind and serve; ``.port`` is the real port afterwards."""
        if self._server is not None:
            raise RuntimeError("gateway already started")
        try:
            await self._refresh()
        except LogUnavailable as exc:
            logger.warning("starting without the collection list (%s); will retry", exc)
        self._server = await serve(
            self._handle,
            self.host,
            self.port,
            process_request=self._process_request,
            compression=None,
            ping_interval=self._ping_interval,
            ping_timeout=self._ping_timeout,
            close_timeout=self._close_timeout,
            max_size=wsproto.MAX_CLIENT_FRAME_BYTES,
            max_queue=4,
            write_limit=self.write_limit,
            ssl=self._ssl_context,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._refresher = asyncio.create_task(self._refresh_loop(), name="rsnotify-ws-refresh")
        scheme = "wss" if self._ssl_context is not None else "ws"
        logger.info(
            "WebSocket gateway %s listening on %s://%s:%d",
            self.server_id, scheme, self.host, self.port,
        )  # fmt: skip

    async def stop(self) -> None:
        """Close every client with 1001 (going away), then stop the tailers."""
        server, self._server = self._server, None
        if server is None:
            return
        tasks = [self._refresher] if self._refresher is not None else []
        for task in tasks:
            task.cancel()
        server.close(code=wsproto.CLOSE_GOING_AWAY)
        await server.wait_closed()
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None
        tasks += [t.task for t in self._tailers.values() if t.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tailers.clear()

    async def __aenter__(self) -> WebSocketGateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- state for operators and tests ------------------------------------------

    @property
    def clients(self) -> int:
        """Connected clients (handshake done, not yet closed)."""
        return len(self._connections)

    @property
    def collections(self) -> dict[str, str]:
        """Collections this gateway serves: id -> Capability List URI (from the log)."""
        return dict(self._collections)

    def position(self, collection: str) -> int | None:
        """The last seq this gateway has read for ``collection`` (None: no live tailer)."""
        tailer = self._tailers.get(collection)
        return tailer.position if tailer is not None else None

    @property
    def shared_frames(self) -> int:
        """Notification frames written as shared bytes (the rest were built per client)."""
        return self._shared_before + sum(f.shared_frames for f in self._tailers.values())

    def connections_from(self, address: str) -> int:
        """Connections held by one client address (its IPv6 /64 for IPv6)."""
        return self._per_address.get(address_key(address), 0)

    def buffered_bytes(self) -> int:
        """Bytes waiting in all clients' write buffers (each bounded by ``write_limit``)."""
        return sum(ws.transport.get_write_buffer_size() for ws in list(self._connections))

    # -- handshake -----------------------------------------------------------------

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if self._token is not None and not self._authorised(request):
            response = connection.respond(HTTPStatus.UNAUTHORIZED, "A bearer token is required.\n")
            response.headers["WWW-Authenticate"] = 'Bearer realm="rsnotify"'
            return response
        if self._admitted >= self.max_clients:
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "Too many clients.\n")
        address = address_key(connection.remote_address[0])
        if self.max_per_address and self._per_address.get(address, 0) >= self.max_per_address:
            return connection.respond(
                HTTPStatus.TOO_MANY_REQUESTS, "Too many connections from your address.\n"
            )
        self._admit(connection, address)
        return None

    def _admit(self, connection: ServerConnection, address: str) -> None:
        """Count the connection against its address until its TCP connection is gone.

        Counted here, not in the handler: the handler starts only after the
        101 response is written, and handshakes in flight meanwhile must see
        this one.  ``connection_lost_waiter`` completes however the connection
        ends, including a handshake that fails after this point.
        """
        self._admitted += 1
        self._per_address[address] = self._per_address.get(address, 0) + 1
        self._busiest = max(self._busiest, self._admitted)
        connection.connection_lost_waiter.add_done_callback(lambda _: self._discharge(address))

    def _discharge(self, address: str) -> None:
        self._admitted -= 1
        left = self._per_address[address] - 1
        if left:
            self._per_address[address] = left
        else:
            del self._per_address[address]  # the table must not keep every address ever seen
        self._schedule_release()

    def _schedule_release(self) -> None:
        """Release memory once after many closes, when they have stopped for a moment."""
        if self._release_memory is None or self._server is None:
            return
        closed = self._busiest - self._admitted
        if closed < RELEASE_AFTER or self._admitted > self._busiest // 2:
            return
        if self._release_timer is not None:
            self._release_timer.cancel()  # still closing: wait until they stop
        loop = asyncio.get_running_loop()
        self._release_timer = loop.call_later(RELEASE_DELAY, self._release)

    def _release(self) -> None:
        self._release_timer = None
        closed, self._busiest = self._busiest - self._admitted, self._admitted
        assert self._release_memory is not None
        try:
            self._release_memory()
        except Exception:
            logger.exception("release_memory callback failed")
        else:
            logger.info("released memory after %d connections closed", closed)

    def _authorised(self, request: Request) -> bool:
        assert self._token is not None
        headers = request.headers.get_all("Authorization")
        if headers:
            supplied = wsproto.bearer_token(headers[0]) if len(headers) == 1 else None
        else:
            supplied = wsproto.query_token(request.path)
        if supplied is None:
            return False
        return hmac.compare_digest(
            supplied.encode("utf-8", "surrogateescape"), self._token.encode("utf-8")
        )

    # -- one connection ----------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        client = Client(ws)
        self._connections.add(ws)
        self._client_count_changed()
        try:
            await self._serve(client)
        except InvalidSubscription as exc:
            frame = wsproto.error(exc.code, exc.message, collection=exc.collection)
            await self._refuse(ws, frame, wsproto.CLOSE_POLICY_VIOLATION, exc.code)
        except LogUnavailable as exc:
            logger.warning("refusing a client: %s", exc)
            frame = wsproto.error("unavailable", "the notification log is unreachable; retry")
            await self._refuse(ws, frame, wsproto.CLOSE_TRY_AGAIN_LATER, "unavailable")
        except ConnectionClosed:
            pass
        finally:
            for stream in client.streams:
                stream.feed.readers.discard(stream)
            self._connections.discard(ws)
            self._client_count_changed()
            # A handler may end after its TCP connection is gone: wait for it too.
            self._schedule_release()

    async def _refuse(self, ws: ServerConnection, frame: str, code: int, reason: str) -> None:
        # A client that reads nothing must not keep its handler alive forever.
        with contextlib.suppress(ConnectionClosed, TimeoutError):
            async with asyncio.timeout(self._close_timeout):
                await ws.send(frame)
        await ws.close(code, reason)

    async def _serve(self, client: Client) -> None:
        ws = client.ws
        assert ws.request is not None  # set by the handshake
        subscription = wsproto.parse_target(ws.request.path)
        if subscription is None:
            try:
                async with asyncio.timeout(wsproto.SUBSCRIBE_TIMEOUT):
                    message = await ws.recv()
            except TimeoutError:
                raise InvalidSubscription(
                    "bad_request", f"no subscribe frame within {wsproto.SUBSCRIBE_TIMEOUT:g} s"
                ) from None
            subscription = wsproto.parse_subscribe(message)
        capability_lists = {}
        for collection in subscription.collections:
            uri = await self._capability_list(collection)
            if uri is None:
                raise InvalidSubscription(
                    "unknown_collection", "no such collection here", collection=collection
                )
            capability_lists[collection] = uri
        for collection, since in subscription.collections.items():
            await self._open_stream(
                client, collection, since, capability_lists[collection], subscription.filter
            )
        await self._run(client)

    async def _open_stream(
        self,
        client: Client,
        collection: str,
        since: int | None,
        capability_list: str,
        filters: wsproto.Filter,
    ) -> None:
        # earliest before head: then earliest <= head + 1 even if a trim runs between.
        earliest = await self.log.earliest(collection)
        assigned = await self.log.head(collection)
        # What can be read: the hello must not announce (nor a live start skip)
        # seqs still held back for replicas.  A client may hold such a seq,
        # though (pushed before a failover lost its release): only a since
        # beyond every assigned seq is refused.
        head = min(assigned, await self.log.released_head(collection))
        if since is not None and since > assigned:
            raise InvalidSubscription(
                "since_ahead",
                f"since={since} is beyond the head {assigned}",
                collection=collection,
            )
        await client.ws.send(wsproto.hello(collection, head, earliest, server=self.server_id))
        start = head if since is None else since
        if since is not None and since + 1 < earliest:
            await client.ws.send(wsproto.gap_too_old(collection, since, earliest, capability_list))
            start = head
        feed = self._tailer(collection, head)
        # Shared frames only without extensions (compression is off anyway).
        shared = filters.everything and not client.ws.protocol.extensions
        stream = Stream(SendCursor(collection, filters, start, start), feed, client, shared)
        feed.readers.add(stream)  # no await since _tailer(): an idle tailer cannot slip away
        client.streams.append(stream)

    async def _run(self, client: Client) -> None:
        client.running = True  # every hello is out: the fan-out pass may write now
        writer = asyncio.create_task(self._write_loop(client))
        reader = asyncio.create_task(self._read_loop(client.ws))
        try:
            await asyncio.wait({writer, reader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            writer.cancel()
            reader.cancel()
            await asyncio.gather(writer, reader, return_exceptions=True)
        if not writer.cancelled():
            exc = writer.exception()
            if exc is not None and not isinstance(exc, ConnectionClosed):
                raise exc

    async def _read_loop(self, ws: ServerConnection) -> None:
        # Later client frames mean nothing, but reading them keeps websockets
        # processing close frames and pongs (and bounds what a chatty client buffers).
        with contextlib.suppress(ConnectionClosed):
            async for _ in ws:
                pass

    async def _write_loop(self, client: Client) -> None:
        loop = asyncio.get_running_loop()
        next_beat = loop.time() + self.heartbeat
        while True:
            client.wake.clear()
            busy = False
            for stream in client.streams:
                busy = await self._pump(client.ws, stream) or busy
            if loop.time() >= next_beat:
                for stream in client.streams:
                    cursor, feed = stream.cursor, stream.feed
                    if feed.healthy and cursor.position >= feed.position:
                        await client.ws.send(wsproto.heartbeat(cursor.collection, cursor.position))
                next_beat = loop.time() + self.heartbeat
            if busy:
                await asyncio.sleep(0)  # a fast client must not starve the others
                continue
            until = next_beat
            if client.log_behind:  # nothing wakes us when those records arrive: look again
                client.log_behind = False
                until = min(until, loop.time() + REPLAY_RETRY)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, until - loop.time())):
                    await client.wake.wait()

    async def _pump(self, ws: ServerConnection, stream: Stream) -> bool:
        """Send up to PUMP_BUDGET frames (or chunks) for one collection; False if nothing to do."""
        cursor, feed = stream.cursor, stream.feed
        for done in range(PUMP_BUDGET):
            action = cursor.plan(feed.window_start, feed.position)
            if action == wsproto.IDLE:
                return done > 0
            if action == wsproto.FROM_RING:
                if feed.write_ahead(stream):  # shared frames, as far as the buffer has room
                    continue
                # Filtered, unrenderable or a full buffer: one frame, waiting for the drain.
                item = feed.item(cursor.position + 1)
                await self._deliver(ws, cursor, item)
                feed.sent(item.seq)
            elif action == wsproto.SKIP:
                first, resume = cursor.skip_to(feed.position + 1)
                await ws.send(wsproto.skipped(cursor.collection, first, resume))
            elif not await self._replay(ws, stream):
                return done > 0
        return True

    async def _deliver(self, ws: ServerConnection, cursor: SendCursor, item: FeedItem) -> None:
        if item.wire is None:
            first, resume = cursor.skip_to(item.seq + 1)
            await ws.send(wsproto.skipped(cursor.collection, first, resume))
            return
        prev = cursor.accept(item.seq, item.loc, item.change)
        if prev is not None:
            frame = wsproto.notification_frame(cursor.collection, item.seq, prev, item.tail)
            await ws.send(frame, text=True)

    def _published(self, collection: str, item: FeedItem) -> None:
        if self._on_published is None or item.wire is None:
            return
        now = asyncio.get_running_loop().time()
        try:
            self._on_published(collection, item.seq, item.tail_len, now - item.read_at)
        except Exception:
            logger.exception("on_published callback failed")

    async def _replay(self, ws: ServerConnection, stream: Stream) -> bool:
        """One batch from the log for a client that is behind the ring; False if none yet.

        The log holding nothing after the client's position means one of two
        things.  Retention trimmed it (the log starts beyond the position):
        the client is told ``skipped`` up to what is left.  Or the records are
        not in the log *yet*: after a Redis failover the promoted replica may
        hold back (until replicated, ``--redis-wait-replicas``) what the old
        primary had released and this gateway's tailer had already read (see
        :mod:`rsnotify.log.redis_log`).  Those come, under the same seqs,
        and are never skipped: ``skipped`` tells a client they are gone for
        good, and it would resubscribe past them.  The writer looks again
        after :data:`REPLAY_RETRY` (a read, not a blocking wait: a waiting
        client holds no connection, and its other collections go on).
        """
        cursor, feed = stream.cursor, stream.feed
        records = await self.log.read(cursor.collection, cursor.position, limit=REPLAY_BATCH)
        if not records:
            earliest = await self.log.earliest(cursor.collection)
            if earliest > cursor.position + 1:  # trimmed: skip to what the log still has
                first, resume = cursor.skip_to(min(earliest, feed.window_start))
                await ws.send(wsproto.skipped(cursor.collection, first, resume))
                return True
            self.replay_waits += 1
            stream.client.log_behind = True
            self._warn_log_behind(cursor.collection, cursor.position)
            return False
        self.replayed += len(records)
        for record in records:
            if record.seq <= cursor.position:
                continue
            if record.seq > cursor.position + 1:  # trimmed while we replayed
                first, resume = cursor.skip_to(record.seq)
                await ws.send(wsproto.skipped(cursor.collection, first, resume))
            await self._deliver(ws, cursor, self._render(cursor.collection, record))
        return True

    def _warn_log_behind(self, collection: str, position: int) -> None:
        """Say (once per ``LOG_BEHIND_WARN_EVERY`` per collection) that a replay waits."""
        now = asyncio.get_running_loop().time()
        if now < self._log_behind_warned.get(collection, float("-inf")):
            return
        self._log_behind_warned[collection] = now + LOG_BEHIND_WARN_EVERY
        logger.warning(
            "%s: a client waits for records after seq %d that are not in the log yet "
            "(held back until replicated, or released again after a failover); "
            "%d such wait(s) so far",
            collection,
            position,
            self.replay_waits,
        )

    # -- tailers -------------------------------------------------------------------

    def _tailer(self, collection: str, head: int) -> Feed:
        tailer = self._tailers.get(collection)
        if tailer is None:
            tailer = Feed(
                self.log,
                collection,
                head,
                self.queue_size,
                lambda record, read_at: self._render(collection, record, read_at),
                batch=min(TAIL_BATCH, self.queue_size),
                write_limit=self.write_limit,
                on_sent=lambda item: self._published(collection, item),
            )
            self._tailers[collection] = tailer
            tailer.task = asyncio.create_task(self._tail(tailer), name=f"rsnotify-ws-{collection}")
        return tailer

    async def _tail(self, tailer: Feed) -> None:
        await tailer.run(pace=lambda: self._make_room(tailer, tailer.batch))
        if self._tailers.get(tailer.collection) is tailer:
            del self._tailers[tailer.collection]
            self._shared_before += tailer.shared_frames

    async def _make_room(self, tailer: Feed, batch: int) -> None:
        """Hold the tailer while reading on would push its fastest client out of the ring.

        In a burst (a 50,000-entry Change List appears at once) the tailer
        reads the log faster than any client can be written to; unpaced, it
        overruns the ring and every client falls back to re-reading and
        re-rendering from the log.  Paced to the fastest client, that client
        is served from memory throughout.  A client that makes no progress
        for ``pace_grace`` seconds is not waited for: slow clients must not hold
        the others back, and they get ``skipped`` as before.
        """
        loop = asyncio.get_running_loop()
        while tailer.readers:
            fastest = tailer.fastest()
            if fastest is None or tailer.position + batch - fastest <= self.queue_size:
                return
            if loop.time() - tailer.progressed > self._pace_grace:
                return
            tailer.progress.clear()
            try:
                async with asyncio.timeout(self._pace_grace):
                    await tailer.progress.wait()
            except TimeoutError:
                return

    def _render(self, collection: str, record: LogRecord, read_at: float = 0.0) -> FeedItem:
        try:
            obj: Any = orjson.loads(record.data)
            loc, change = obj["loc"], obj["change"]
            if not isinstance(loc, str) or not isinstance(change, str):
                raise TypeError("loc and change must be strings")
            rendered = self._renderer.render(collection, record)
        except (ValueError, KeyError, TypeError, RsNotifyError) as exc:
            logger.error(
                "%s: log record %d cannot be rendered (%s); clients are told it was skipped",
                collection,
                record.seq,
                exc,
            )
            return feed_item(collection, record.seq, "", "", None, read_at)
        tail = wsproto.notification_tail(self.fmt, rendered.payload, rendered.signature)
        return feed_item(collection, record.seq, loc, change, tail, read_at)

    # -- collections -------------------------------------------------------------

    async def _capability_list(self, collection: str) -> str | None:
        uri = self._collections.get(collection)
        if uri is None:  # maybe registered since the last refresh
            await self._refresh()
            uri = self._collections.get(collection)
        return uri

    async def _refresh(self) -> None:
        """Reload the collection list; concurrent callers share one query."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self.log.collections())
            self._refreshing.add_done_callback(_retrieve)
        self._collections = await asyncio.shield(self._refreshing)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_interval)
            try:
                await self._refresh()
            except LogUnavailable as exc:
                logger.warning("cannot refresh the collection list: %s", exc)
            except Exception:
                logger.exception("cannot refresh the collection list")

    def _client_count_changed(self) -> None:
        if self._on_client_change is None:
            return
        try:
            self._on_client_change(len(self._connections))
        except Exception:
            logger.exception("on_client_change callback failed")


def address_key(address: str) -> str:
    """The address a per-address limit counts: IPv4 as is, IPv6 by its /64 (one host's share)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a shared future's exception as seen even if every awaiter went away."""
    if not future.cancelled():
        future.exception()


def server_tls_context(certfile: str, keyfile: str | None = None) -> ssl.SSLContext:
    """The gateway's TLS context for ``wss://`` (certificate chain and key, PEM).

    Bearer tokens cross the wire in every handshake: without TLS anyone on the
    path can read and replay them.  A bad file is a clear TransportError at
    startup, not a failed handshake per client.
    """
    from . import TransportError

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        message = f"cannot load the WebSocket TLS certificate {certfile}: {exc}"
        raise TransportError(message) from None
    return context
