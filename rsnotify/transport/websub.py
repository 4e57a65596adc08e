"""WebSub hub: ResourceSync Change Notification over W3C WebSub, fed by the notification log.

The protocol (URLs, headers, leases, ``gap_too_old``) is specified in
:mod:`.websubproto`, which also holds every decision that needs no socket;
this module is the aiohttp server and client around it.  It runs inside
``rsnotify publish --websub HOST:PORT``.

Everything comes from the log
    As with the WebSocket gateway, the hub never takes notifications from the
    publisher in-process: per collection with subscribers, one tailer loops
    on ``log.wait``, renders each record once as Change Notification XML and
    keeps the last ``ring_size`` in a shared ring.  Subscriptions are
    cursors into it.  What the ring holds is delivered even if the log has
    trimmed it since; ``rsnotify publish`` sizes the ring to at most the
    log's count retention, so "beyond retention" means what it says.

One delivery task per subscription, in order
    Each subscription POSTs ``cursor + 1``, waits for the answer, and only
    then moves on: a 2xx advances the cursor, ``410`` ends the subscription,
    anything else retries the same notification with exponential backoff
    (capped at ``backoff_max``).  A callback that was down gets what it
    missed, in order, from the ring or -- if it fell behind the ring -- from
    the log, in batches of ``REPLAY_BATCH``; beyond the log's retention it
    gets one ``gap_too_old`` POST and goes on from the log's earliest seq.
    Per-subscription memory is the record, a few integers and at most one
    replay batch, however long the callback is away.

Persistence
    Subscriptions and cursors live in a :class:`~.websubstore.SubscriptionStore`
    (Redis or the embedded SQLite file); a restarted hub resumes every
    subscription from its stored cursor.  Run one hub per log: two hubs on
    one Redis would both deliver every notification.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import socket
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from .. import outbound
from ..cancellation import raise_if_cancelled
from ..collection import is_valid_collection_id
from ..errors import RsNotifyError
from ..log import LogRecord, LogUnavailable, NotificationLog
from . import atom
from . import websubproto as proto
from .websubproto import Action, Delivery, LeasePolicy, Subscription, SubscriptionRequest
from .websubstore import CURSOR_FLUSH, SubscriptionStore

logger = logging.getLogger(__name__)

TAIL_BATCH = 500
REPLAY_BATCH = 100
WAIT_TIMEOUT = 2.0
REAP_INTERVAL = 0.25  # how often expired leases are looked for
MAX_PENDING = 1_000  # verifications in flight before the hub answers 503
MAX_FORM_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class _Item:
    seq: int
    body: bytes | None  # None: the record could not be rendered (sent as a gap)


@dataclass(frozen=True, slots=True)
class _Gap:
    since: int
    earliest: int
    head: int


class _Tailer:
    def __init__(self, collection: str, position: int, capacity: int) -> None:
        self.collection = collection
        self.position = position
        self.ring: deque[_Item] = deque(maxlen=capacity)
        self.subs: set[_Sub] = set()
        self.task: asyncio.Task[None] | None = None


@dataclass(eq=False)
class _Sub:
    sub: Subscription
    delivery: Delivery
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    buffer: deque[_Item] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    dirty: bool = False
    delivered: int = 0
    last_error: str = ""


class WebSubHub:
    """A WebSub hub serving every collection of ``log`` (protocol: :mod:`.websubproto`)."""

    def __init__(
        self,
        log: NotificationLog,
        store: SubscriptionStore,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        public_url: str | None = None,
        lease: LeasePolicy | None = None,
        changelists: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        backoff_max: float = 30.0,
        max_subscriptions: int = 10_000,
        ring_size: int = 2_000,
        feed_page: int = atom.PAGE_SIZE,
        server_id: str | None = None,
        signer: outbound.Signer | None = None,
    ) -> None:
        if ring_size < 1 or max_subscriptions < 1 or feed_page < 1:
            raise ValueError("ring_size, max_subscriptions and feed_page must be positive")
        self.log = log
        self.store = store
        self.host = host
        self.port = port
        self.public_url = public_url
        self.lease = lease or LeasePolicy()
        self.changelists = dict(changelists or {})
        self.timeout = timeout
        self.backoff_max = backoff_max
        self.max_subscriptions = max_subscriptions
        self.ring_size = ring_size
        self.feed_page = feed_page
        self.server_id = server_id or f"{socket.gethostname()}:{os.getpid()}"
        self.signer = signer
        self._subs: dict[tuple[str, str], _Sub] = {}
        self._tailers: dict[str, _Tailer] = {}
        self._collections: dict[str, str] = {}
        self._pending: set[asyncio.Task[None]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    # -- URLs ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The hub URL (``hub.*`` requests go here); ends with ``/``."""
        if self.public_url:
            return self.public_url if self.public_url.endswith("/") else self.public_url + "/"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def topic(self, collection: str) -> str:
        """The topic URL of a collection: its channel URL on the hub."""
        return self.url + collection

    def feed_url(self, collection: str) -> str:
        return self.topic(collection) + "/feed.atom"

    def _topic_collection(self, topic: str) -> str | None:
        base = urlsplit(self.url).path
        path = urlsplit(topic).path
        if not path.startswith(base):
            return None
        name = path[len(base) :].strip("/")
        return name if is_valid_collection_id(name) else None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Load subscriptions, bind, start delivering; ``.port`` is the real port afterwards."""
        self._http = aiohttp.ClientSession(
            # Per socket operation, not in total: waiting for a pooled connection
            # (many subscriptions on one callback host) is not the callback's fault.
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=min(5.0, self.timeout), sock_read=self.timeout
            ),
            connector=aiohttp.TCPConnector(limit=256, limit_per_host=0),
        )
        with contextlib.suppress(LogUnavailable):
            self._collections = await self.log.collections()
        app = web.Application(client_max_size=MAX_FORM_BYTES)
        app.router.add_post("/", self._hub_request)
        app.router.add_get("/", self._topics)
        app.router.add_get("/{collection}", self._topic_head)
        app.router.add_get("/{collection}/feed.atom", self._feed)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        if server is not None and getattr(server, "sockets", None):
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        now = time.time()
        for sub in await self.store.load():
            if sub.expired(now):
                await self.store.delete(*sub.key)
                continue
            self._add(sub)
        self._tasks.append(asyncio.create_task(self._reap_loop(), name="rsnotify-websub-reap"))
        self._tasks.append(asyncio.create_task(self._flush_loop(), name="rsnotify-websub-flush"))
        logger.info(
            "WebSub hub %s at %s (%d subscription(s))", self.server_id, self.url, len(self._subs)
        )

    async def stop(self) -> None:
        """Stop delivering and serving; write the cursors."""
        tasks = [*self._tasks, *self._pending]
        tasks += [s.task for s in self._subs.values() if s.task is not None]
        tasks += [t.task for t in self._tailers.values() if t.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._flush()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._http is not None:
            await self._http.close()
            self._http = None
        self._tailers.clear()

    async def __aenter__(self) -> WebSubHub:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- state for operators and tests -----------------------------------------------------

    def subscriptions(self) -> list[Subscription]:
        """Active subscriptions, cursors current."""
        out = []
        for s in self._subs.values():
            s.sub.cursor = s.delivery.cursor
            out.append(s.sub)
        return out

    # -- HTTP: the hub endpoint --------------------------------------------------------------

    async def _hub_request(self, request: web.Request) -> web.Response:
        try:
            form = await request.post()
        except (ValueError, web.HTTPRequestEntityTooLarge):
            return web.Response(status=413, text="request too large\n")
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        try:
            parsed = proto.parse_request(fields, self._topic_collection)
        except proto.RequestError as exc:
            return web.Response(status=exc.status, text=f"{exc}\n")
        if len(self._pending) >= MAX_PENDING:
            return web.Response(status=503, text="too many pending verifications; retry\n")
        task = asyncio.create_task(self._verify(parsed))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return web.Response(status=202, text="accepted; verifying intent\n")

    async def _known(self, collection: str) -> bool:
        if collection not in self._collections:
            with contextlib.suppress(LogUnavailable):
                self._collections = await self.log.collections()
        return collection in self._collections

    async def _verify(self, request: SubscriptionRequest) -> None:
        """Deny, or verify intent and then (un)subscribe (WebSub 5.2, 5.3)."""
        try:
            collection = request.collection
            key = (collection or "", request.callback)
            if request.mode == "subscribe":
                reason = None
                if collection is None or not await self._known(collection):
                    reason = "unknown topic"
                elif key not in self._subs and len(self._subs) >= self.max_subscriptions:
                    reason = "too many subscriptions"
                if reason is not None:
                    await self._get(proto.denial_url(request.callback, request.topic, reason))
                    logger.info("denied %s for %s: %s", request.topic, request.callback, reason)
                    return
            lease = self.lease.grant(request.lease_seconds)
            challenge = secrets.token_urlsafe(24)
            url = proto.verification_url(request, challenge, lease)
            answer = await self._get(url)
            if answer is None or not proto.challenge_answered(*answer, challenge):
                logger.info("%s of %s not verified", request.mode, request.callback)
                return
            if request.mode == "unsubscribe":
                await self._remove(key, "unsubscribed")
                return
            assert collection is not None
            head = await self.log.head(collection)
            existing = self._subs.get(key)
            sub = proto.activate(
                existing.sub if existing else None, request, lease=lease, head=head, now=time.time()
            )
            renewed = existing is not None and sub is existing.sub
            if renewed:
                assert existing is not None
                sub.cursor = existing.delivery.cursor
                await self.store.save(sub)
            else:
                if existing is not None:  # expired, not reaped yet: start afresh
                    await self._remove(key, "lease expired")
                await self.store.save(sub)
                self._add(sub)
            logger.info(
                "%s %s to %s (lease %ds, from seq %d)",
                "renewed" if renewed else "subscribed",
                request.callback,
                collection,
                lease,
                sub.cursor,
            )
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("verifying %s failed", request.callback)

    async def _get(self, url: str) -> tuple[int, bytes] | None:
        assert self._http is not None
        try:
            async with self._http.get(url, allow_redirects=False) as response:
                body = await response.content.read(1024)
                return response.status, body
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            logger.info("GET %s failed: %s", url.split("?")[0], exc)
            return None

    # -- HTTP: topics and feeds --------------------------------------------------------------

    async def _topics(self, request: web.Request) -> web.Response:
        with contextlib.suppress(LogUnavailable):
            self._collections = await self.log.collections()
        counts: dict[str, int] = {}
        for collection, _ in self._subs:
            counts[collection] = counts.get(collection, 0) + 1
        body = {
            cid: {
                "topic": self.topic(cid),
                "capabilitylist": cap,
                "subscriptions": counts.get(cid, 0),
            }
            for cid, cap in sorted(self._collections.items())
        }
        return web.json_response({"hub": self.url, "topics": body})

    async def _collection_of(self, request: web.Request) -> str:
        collection = request.match_info["collection"]
        if not is_valid_collection_id(collection) or not await self._known(collection):
            raise web.HTTPNotFound(text="no such collection here\n")
        return collection

    async def _topic_head(self, request: web.Request) -> web.Response:
        """The topic's content: its latest Change Notification, and where the log stands."""
        collection = await self._collection_of(request)
        try:
            earliest = await self.log.earliest(collection)
            head = await self.log.head(collection)
            latest = await self.log.read(collection, head - 1, limit=1) if head else []
        except LogUnavailable:
            raise web.HTTPServiceUnavailable(text="the log is unreachable; retry\n") from None
        item = self._render(collection, latest[0]) if latest else None
        if item is not None and item.body is not None:
            body = item.body
        else:
            body = proto.empty_notification(self._collections[collection])
        headers = proto.head_headers(
            topic=self.topic(collection), hub=self.url, head=head, earliest=earliest
        )
        return web.Response(body=body, headers=headers)

    async def _feed(self, request: web.Request) -> web.Response:
        collection = await self._collection_of(request)
        page_text = request.query.get("page")
        page: int | None = None
        if page_text is not None:
            if not page_text.isdigit() or int(page_text) < 1:
                raise web.HTTPBadRequest(text="page must be a positive integer\n")
            page = int(page_text)
        try:
            earliest = await self.log.earliest(collection)
            head = await self.log.head(collection)
            window = atom.page_window(head, page, self.feed_page)
            if window is None or (not window.current and window.last < earliest):
                raise web.HTTPNotFound(text="no such page (beyond the head or the retention)\n")
            records = []
            if window.last >= max(window.first, earliest):
                records = await self.log.read(
                    collection,
                    max(window.first, earliest) - 1,
                    limit=window.last - window.first + 1,
                )
        except LogUnavailable:
            raise web.HTTPServiceUnavailable(text="the log is unreachable; retry\n") from None
        records = [r for r in records if r.seq <= window.last]
        body = atom.render_feed(
            collection=collection,
            capability_list=self._collections[collection],
            records=records,
            window=window,
            earliest=earliest,
            feed_url=self.feed_url(collection),
            hub_url=self.url,
        )
        return web.Response(body=body, content_type="application/atom+xml")

    # -- subscriptions --------------------------------------------------------------------------

    def _add(self, sub: Subscription) -> None:
        s = _Sub(sub, Delivery(sub.cursor, backoff_max=self.backoff_max))
        self._subs[sub.key] = s
        tailer = self._tailer(sub.collection, sub.cursor)
        tailer.subs.add(s)
        s.task = asyncio.create_task(self._deliver_loop(s, tailer), name="rsnotify-websub-deliver")

    async def _remove(self, key: tuple[str, str], why: str) -> None:
        s = self._subs.pop(key, None)
        with contextlib.suppress(Exception):
            await self.store.delete(*key)
        if s is None:
            return
        tailer = self._tailers.get(s.sub.collection)
        if tailer is not None:
            tailer.subs.discard(s)
            if not tailer.subs:  # nobody left to feed: stop reading the log
                del self._tailers[s.sub.collection]
                if tailer.task is not None:
                    tailer.task.cancel()
        if s.task is not None and s.task is not asyncio.current_task():
            s.task.cancel()
        logger.info("subscription of %s to %s ended: %s", key[1], key[0], why)

    async def _reap_loop(self) -> None:
        while True:
            raise_if_cancelled()
            await asyncio.sleep(REAP_INTERVAL)
            now = time.time()
            for key, s in list(self._subs.items()):
                if s.sub.expired(now):
                    await self._remove(key, "lease expired")

    async def _flush(self) -> None:
        dirty = {key: s.delivery.cursor for key, s in self._subs.items() if s.dirty}
        if not dirty:
            return
        for key in dirty:
            self._subs[key].dirty = False
        try:
            await self.store.save_cursors(dirty)
        except Exception:
            for key in dirty:
                if key in self._subs:
                    self._subs[key].dirty = True
            raise

    async def _flush_loop(self) -> None:
        while True:
            raise_if_cancelled()
            await asyncio.sleep(CURSOR_FLUSH)
            try:
                await self._flush()
            except Exception as exc:
                logger.warning("cannot save WebSub cursors: %s", exc)

    # -- tailers ----------------------------------------------------------------------------

    def _tailer(self, collection: str, position: int) -> _Tailer:
        tailer = self._tailers.get(collection)
        if tailer is None:
            tailer = _Tailer(collection, position, self.ring_size)
            self._tailers[collection] = tailer
            tailer.task = asyncio.create_task(
                self._tail(tailer), name=f"rsnotify-websub-{collection}"
            )
        return tailer

    async def _tail(self, tailer: _Tailer) -> None:
        delay = 0.1
        while True:
            raise_if_cancelled()
            try:
                records = await self.log.wait(
                    tailer.collection, tailer.position, timeout=WAIT_TIMEOUT, limit=TAIL_BATCH
                )
                if not records:  # also learn a head that moved while nobody listened
                    head = await self.log.head(tailer.collection)
                    if head > tailer.position:
                        records = await self.log.read(
                            tailer.collection, tailer.position, limit=TAIL_BATCH
                        )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("%s: cannot read the log: %s", tailer.collection, exc)
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.1
            if records:
                self._advance(tailer, records)
                for s in tailer.subs:
                    s.wake.set()

    def _advance(self, tailer: _Tailer, records: Sequence[LogRecord]) -> None:
        for record in records:
            if record.seq <= tailer.position:
                continue
            if record.seq != tailer.position + 1:
                tailer.ring.clear()  # keep the ring dense
            tailer.ring.append(self._render(tailer.collection, record))
            tailer.position = record.seq

    def _render(self, collection: str, record: LogRecord) -> _Item:
        try:
            return _Item(record.seq, outbound.render(record, fmt="xml").payload)
        except (ValueError, KeyError, TypeError, RsNotifyError) as exc:
            logger.error("%s: log record %d cannot be rendered (%s)", collection, record.seq, exc)
            return _Item(record.seq, None)

    # -- delivery ---------------------------------------------------------------------------

    async def _next(self, s: _Sub, tailer: _Tailer) -> _Item | _Gap | None:
        """The next thing to POST to ``s``, or None when it is caught up."""
        cursor = s.delivery.cursor
        want = cursor + 1
        if want > tailer.position:
            return None
        ring = tailer.ring
        if ring and ring[0].seq <= want:
            s.buffer.clear()
            return ring[want - ring[0].seq]
        while s.buffer and s.buffer[0].seq < want:
            s.buffer.popleft()
        if s.buffer and s.buffer[0].seq == want:
            return s.buffer.popleft()
        s.buffer.clear()
        records = await self.log.read(s.sub.collection, cursor, limit=REPLAY_BATCH)
        if records and records[0].seq == want:
            s.buffer.extend(self._render(s.sub.collection, r) for r in records)
            return s.buffer.popleft()
        earliest = records[0].seq if records else await self.log.earliest(s.sub.collection)
        if s.delivery.plan(earliest, max(tailer.position, earliest - 1)) is Action.GAP:
            return _Gap(cursor, earliest, max(tailer.position, earliest - 1))
        return None

    async def _deliver_loop(self, s: _Sub, tailer: _Tailer) -> None:
        sub = s.sub
        topic = self.topic(sub.collection)
        while True:
            raise_if_cancelled()
            s.wake.clear()
            try:
                item = await self._next(s, tailer)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the delivery loop must outlive any log trouble
                logger.warning("%s: cannot read the log: %s", sub.collection, exc)
                await asyncio.sleep(random.uniform(0.5, 1.0))
                continue
            if item is None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(WAIT_TIMEOUT):
                        await s.wake.wait()
                continue
            if isinstance(item, _Item) and item.body is None:
                item = _Gap(s.delivery.cursor, item.seq + 1, max(tailer.position, item.seq))
            if isinstance(item, _Gap):
                capability_list = self._collections.get(sub.collection, "")
                body = proto.gap_too_old(
                    sub.collection,
                    item.since,
                    item.earliest,
                    item.head,
                    capability_list,
                    self.changelists.get(sub.collection),
                )
                headers = proto.content_headers(
                    topic=topic,
                    hub=self.url,
                    body=body,
                    secret=sub.secret,
                    content_type=proto.GAP_TYPE,
                    prev=item.since,
                    kind="gap_too_old",
                )
            else:
                assert item.body is not None
                body = item.body
                headers = proto.content_headers(
                    topic=topic,
                    hub=self.url,
                    body=body,
                    secret=sub.secret,
                    content_type=proto.NOTIFICATION_TYPE,
                    seq=item.seq,
                    prev=s.delivery.cursor,
                )
                if self.signer is not None:  # the publisher's own key, as on MQTT/WebSocket
                    headers[proto.PUBLISHER_SIGNATURE_HEADER] = self.signer.sign(body)
            outcome = await self._post(s, body, headers)
            if outcome == "ok":
                if isinstance(item, _Gap):
                    s.delivery.gap_delivered(item.earliest, item.head)
                    logger.info(
                        "%s: told %s seqs %d..%d are beyond retention; live after %d",
                        sub.collection,
                        sub.callback,
                        item.since + 1,
                        item.earliest - 1,
                        s.delivery.cursor,
                    )
                else:
                    s.delivery.delivered(item.seq)
                    s.delivered += 1
                s.dirty = True
            elif outcome == "gone":
                await self._remove(sub.key, "the callback answered 410 Gone")
                return
            else:
                delay = s.delivery.failed(time.time(), random.uniform(0.5, 1.0))
                if s.delivery.failures in (1, 5) or s.delivery.failures % 20 == 0:
                    logger.warning(
                        "delivery to %s failed (%s; %d in a row); retrying in %.1fs",
                        sub.callback,
                        s.last_error,
                        s.delivery.failures,
                        delay,
                    )
                await asyncio.sleep(delay)

    async def _post(self, s: _Sub, body: bytes, headers: dict[str, str]) -> str:
        assert self._http is not None
        try:
            async with self._http.post(
                s.sub.callback, data=body, headers=headers, allow_redirects=False
            ) as response:
                await response.content.read(1024)
                s.last_error = f"HTTP {response.status}"
                return proto.classify_response(response.status)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            s.last_error = f"{type(exc).__name__}: {exc}"
            return "retry"


def describe(hub: WebSubHub) -> dict[str, Any]:
    """A JSON-able view of the hub's subscriptions (for logs and tests)."""
    return {
        "hub": hub.url,
        "subscriptions": [
            {
                "collection": s.collection,
                "callback": s.callback,
                "cursor": s.cursor,
                "expires": s.expires,
            }
            for s in hub.subscriptions()
        ],
    }


__all__ = ["WebSubHub", "describe"]
