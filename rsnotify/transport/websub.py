"""WebSub hub: ResourceSync Change Notification over W3C WebSub, fed by the notification log.

The protocol (URLs, headers, leases, ``gap_too_old``) is specified in
:mod:`.websubproto`, which also holds every decision that needs no socket;
this module is the aiohttp server and client around it.  It runs inside
``rsnotify publish --websub HOST:PORT``.

Why one module of ~900 lines: it is one aiohttp application, the hub, whose
request handlers (subscribe, publish, topics, feeds), lease reaper, cursor
flusher and per-subscription delivery loops share the subscription table,
the admission counts and the tailers.  Every decision that needs no socket
is in :mod:`.websubproto`, the guards in :mod:`.websubguard`, persistence in
:mod:`.websubstore`, Atom in :mod:`.atom` and the log tail in :mod:`.tail`.

Everything comes from the log
    As with the WebSocket gateway, the hub never takes notifications from the
    publisher in-process: per collection with subscribers, one tailer
    (:mod:`.tail`, shared with the WebSocket gateway) loops on ``log.wait``,
    renders each record once as Change Notification XML and keeps the last
    ``ring_size`` in a shared ring.  Subscriptions are
    cursors into it.  What the ring holds is delivered even if the log has
    trimmed it since; ``rsnotify publish`` sizes the ring to at most the
    log's count retention, so "beyond retention" means what it says.

One delivery task per subscription, in order, in batches
    Each subscription POSTs one Change Notification holding every change
    after its cursor that is ready (at most ``MAX_BATCH_CHANGES``), waits for
    the answer, and only then moves on: a callback that keeps up gets one
    change per POST, one that lags gets them grouped, so a slow round trip
    no longer caps its rate.  Each change's ``<url>`` is rendered once, in
    the shared ring; a notification is a header plus those fragments, its
    ``from``/``until`` taken from the log (see :mod:`rsnotify.envelope`), so
    any grouping chains exactly.  A 2xx advances the cursor, ``410`` ends the subscription,
    anything else retries the same notification with exponential backoff
    (capped at ``backoff_max``).  A callback that was down gets what it
    missed, in order, from the ring or -- if it fell behind the ring -- from
    the log, in batches of ``REPLAY_BATCH``; beyond the log's retention it
    gets one ``gap_too_old`` POST (its catch-up is the Change Lists) and goes
    on live, after the head that POST names.
    Per-subscription memory is the record, a few integers and at most one
    replay batch, however long the callback is away.

Persistence
    Subscriptions and cursors live in a :class:`~.websubstore.SubscriptionStore`
    (Redis or the embedded SQLite file); a restarted hub resumes every
    subscription from its stored cursor.  Run one hub per log: two hubs on
    one Redis would both deliver every notification (with ``--ha`` only
    the leader runs it, and a new leader resumes from the stored cursors).

Guards (issue 22.2, :mod:`.websubguard`)
    Callbacks are checked against the address policy before the hub
    answers (after DNS resolution) and on every connection; subscriptions
    and pending verifications are counted per client address, per callback
    host and in total; an unknown topic is refused at once, without a GET;
    store and log trouble is one log line and a denial, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from yarl import URL

from .. import envelope, framework, outbound
from ..cancellation import raise_if_cancelled
from ..collection import is_valid_collection_id
from ..errors import RsNotifyError
from ..log import LogRecord, LogUnavailable, NotificationLog
from . import atom
from . import websubproto as proto
from .tail import LogTail
from .websubguard import Admission, CallbackPolicy, FilteringResolver, quote, resolve_host
from .websubproto import (
    Action,
    Delivery,
    LeasePolicy,
    PublishRequest,
    RenderedChange,
    Subscription,
    SubscriptionRequest,
)
from .websubstore import CURSOR_FLUSH, SubscriptionStore

logger = logging.getLogger(__name__)

TAIL_BATCH = 500
REPLAY_BATCH = 100
WAIT_TIMEOUT = 2.0  # longest wait of a caught-up delivery before it looks again
REAP_INTERVAL = 0.25  # how often expired leases are looked for
VERIFY_CONCURRENCY = 64  # verification GETs at once; the rest wait their turn
MAX_REQUEST_BYTES = envelope.MAX_XML_PAYLOAD_BYTES  # a form, or a Source's notification
MAX_PAGE_DIGITS = 12  # feed.atom?page=: more digits than any log will ever have pages


@dataclass(frozen=True, slots=True)
class _Gap:
    since: int
    earliest: int
    head: int


_Tailer = LogTail[RenderedChange, "_Sub"]


@dataclass(eq=False)
class _KeyLock:
    """The lock of one (collection, callback), and the verifications holding or awaiting it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


@dataclass(eq=False)
class _Sub:
    sub: Subscription
    delivery: Delivery
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    buffer: deque[RenderedChange] = field(default_factory=deque)
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
        allow_callbacks: Sequence[str] = (),
        max_per_client: int = 100,
        max_per_host: int = 100,
        publish_secret: bytes | None = None,
        on_publish: Callable[[str], None] | None = None,
        external_hubs: Sequence[str] = (),
        framework_topics: bool = False,
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
        self.policy = CallbackPolicy.parse(allow_callbacks)
        self.admission = Admission(max_subscriptions, max_per_client, max_per_host)
        self.publish_secret = publish_secret
        self.on_publish = on_publish
        self.external_hubs = list(external_hubs)
        # Framework Notification 1.0.1: a topic per collection, <topic>/framework,
        # fed by the collection's framework stream (rsnotify.framework).
        self.framework_topics = framework_topics
        # Ping-mode hand-off to a hub that fetches the topic (rsnotify.transport.websubpush):
        # collection -> callable giving the body to serve to the next GET.
        self.handoff: dict[str, Callable[[], bytes | None]] = {}
        self._verifying = asyncio.Semaphore(VERIFY_CONCURRENCY)
        self._key_locks: dict[tuple[str, str], _KeyLock] = {}  # per (collection, callback)
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

    def framework_topic(self, collection: str) -> str:
        """The topic of a collection's framework notifications (a channel of its own)."""
        return self.topic(collection) + framework.TOPIC_SUFFIX

    def _stream_topic(self, stream: str) -> str:
        base = framework.collection_of(stream)
        return self.framework_topic(base) if base is not None else self.topic(stream)

    def _capability_list(self, stream: str) -> str:
        """The Capability List of a stream's collection ("" when unknown)."""
        return self._collections.get(framework.base_collection(stream), "")

    def _topic_collection(self, topic: str) -> str | None:
        """The stream of a topic URL: a collection (its topic or Atom feed), or the
        collection's framework stream (its framework topic)."""
        base = urlsplit(self.url).path
        path = urlsplit(topic).path
        if not path.startswith(base):
            return None
        name = path[len(base) :].strip("/")
        if name.endswith(framework.TOPIC_SUFFIX):
            collection = name[: -len(framework.TOPIC_SUFFIX)]
            served = self.framework_topics and is_valid_collection_id(collection)
            return framework.stream(collection) if served else None
        name = name.removesuffix("/feed.atom")
        return name if is_valid_collection_id(name) else None

    def _publish_collection(self, url: str) -> str | None:
        """The collection a publish names: by topic, Capability List or Change List URL."""
        if url.startswith(self.url):
            return self._topic_collection(url)
        for cid, capability_list in self._collections.items():
            if url in (capability_list, self.changelists.get(cid)):
                return cid
        return None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Load subscriptions, bind, start delivering; ``.port`` is the real port afterwards."""
        self._http = aiohttp.ClientSession(
            # Per socket operation, not in total: waiting for a pooled connection
            # (many subscriptions on one callback host) is not the callback's fault.
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=min(5.0, self.timeout), sock_read=self.timeout
            ),
            # Every connection to a callback resolves through the address policy.
            connector=aiohttp.TCPConnector(
                limit=256,
                limit_per_host=0,
                # Duck-typed: resolve() and close() are all TCPConnector calls.
                resolver=FilteringResolver(self.policy),  # type: ignore[arg-type]
            ),
        )
        with contextlib.suppress(LogUnavailable):
            self._collections = await self.log.collections()
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_post("/", self._hub_request)
        app.router.add_get("/", self._topics)
        app.router.add_get("/{collection}", self._topic_head)
        app.router.add_get("/{collection}" + framework.TOPIC_SUFFIX, self._framework_head)
        app.router.add_get("/{collection}/feed.atom", self._feed)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = cast("asyncio.Server | None", site._server)  # typed as an AbstractServer
        if server is not None and getattr(server, "sockets", None):
            self.port = server.sockets[0].getsockname()[1]
        now = time.time()
        for sub in await self.store.load():
            if sub.expired(now):
                await self.store.delete(*sub.key)
                continue
            self._add(sub)
            self.admission.add(sub.client, sub.callback)
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
        if request.content_type in ("application/xml", "text/xml"):
            return await self._publish_payload(request)
        try:
            raw = await request.read()
            form = await request.post()
        except (ValueError, web.HTTPRequestEntityTooLarge):
            return web.Response(status=413, text="request too large\n")
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        try:
            parsed = proto.parse_request(fields, self._topic_collection)
        except proto.RequestError as exc:
            return web.Response(status=exc.status, text=f"{exc}\n")
        if isinstance(parsed, PublishRequest):
            return self._publish(parsed.url, raw, request, status=202)
        return await self._subscription_request(parsed, request.remote or "")

    async def _subscription_request(self, parsed: SubscriptionRequest, client: str) -> web.Response:
        """Refuse at once what needs no callback contact (WebSub 5.1), else 202 and verify."""
        collection = parsed.collection
        if collection is None or not await self._known(collection):
            return web.Response(status=404, text="unknown topic: not a topic of this hub\n")
        why = self.policy.check_literal(parsed.callback)
        if why is None:
            host = urlsplit(parsed.callback).hostname or ""
            if not self.policy.host_allowed(host):
                why = self.policy.check_resolved(host, await resolve_host(host))
        if why is not None:
            logger.info("refused callback %s: %s", quote(parsed.callback), why)
            return web.Response(
                status=403,
                text=f"hub.callback refused: {why} (see --websub-allow-callback)\n",
            )
        key = (collection, parsed.callback)
        counted = parsed.mode == "subscribe" and key not in self._subs
        if counted:
            refusal = self.admission.check(client, parsed.callback)
            if refusal is not None:
                return web.Response(status=refusal[0], text=refusal[1] + "\n")
            self.admission.add(client, parsed.callback)
        task = asyncio.create_task(self._verify(parsed, client, counted))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return web.Response(status=202, text="accepted; verifying intent\n")

    def _authentic(self, body: bytes, request: web.Request) -> bool:
        """With a publisher secret, a publish must be signed with it (X-Hub-Signature)."""
        if self.publish_secret is None:
            return True
        header = request.headers.get(proto.SIGNATURE_HEADER)
        method = proto.signature_method(body, header, self.publish_secret)
        return method is not None and method != "sha1"

    def _publish(self, url: str, body: bytes, request: web.Request, *, status: int) -> web.Response:
        """A Source says ``url`` changed: read its Change Lists now (section 4.1)."""
        if not self._authentic(body, request):
            return web.Response(status=403, text="publish not signed with the publisher's secret\n")
        stream = self._publish_collection(url)
        collection = framework.base_collection(stream) if stream is not None else None
        if collection is None or collection not in self._collections:
            return web.Response(
                status=404, text="not a topic, Capability List or Change List here\n"
            )
        if self.on_publish is None:
            return web.Response(status=409, text="this hub has no publisher to tell\n")
        self.on_publish(collection)
        return web.Response(status=status, text="published; reading the Change Lists\n")

    async def _publish_payload(self, request: web.Request) -> web.Response:
        """Change Notification 4.1: a POST of the payload with Link self and hub."""
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return web.Response(status=413, text="notification too large\n")
        links = proto.link_targets(request.headers.get("Link"))
        if not links.get("self") or not links.get("hub"):
            return web.Response(
                status=400,
                text='Change Notification 4.1: the POST needs a Link header with rel="self" '
                'and rel="hub"\n',
            )
        stream = self._topic_collection(links["self"][0])
        try:
            if stream is not None and framework.collection_of(stream) is not None:
                framework.decode(body)
            else:
                envelope.decode_batch(body, collection=stream)
        except envelope.InvalidNotification as exc:
            return web.Response(status=400, text=f"not a notification for this topic: {exc}\n")
        return self._publish(links["self"][0], body, request, status=200)

    async def _known(self, stream: str) -> bool:
        """A collection this hub serves, or the framework stream of one."""
        base = framework.collection_of(stream)
        if base is not None and not self.framework_topics:
            return False
        collection = base or stream
        if collection not in self._collections:
            with contextlib.suppress(LogUnavailable):
                self._collections = await self.log.collections()
        return collection in self._collections

    async def _verify(self, request: SubscriptionRequest, client: str, counted: bool) -> None:
        """Verify intent and then (un)subscribe (WebSub 5.3); deny if it cannot be done."""
        collection = request.collection
        assert collection is not None
        key = (collection, request.callback)
        active = False
        # One verification per subscription at a time: two that both found no
        # subscription and both added one left the first's delivery task
        # running, unreachable (every change POSTed twice, and on after an
        # unsubscribe).  The key's lock before a verification slot: a request
        # waiting for its twin holds no slot.
        entry = self._key_locks.setdefault(key, _KeyLock())
        entry.users += 1
        try:
            async with entry.lock, self._verifying:
                active = await self._verify_intent(request, client, key)
        except asyncio.CancelledError:
            raise
        except (RsNotifyError, OSError) as exc:
            logger.warning(
                "cannot complete the %s of %s: %s", request.mode, quote(request.callback), exc
            )
            await self._get(
                proto.denial_url(request.callback, request.topic, "the hub cannot store it; retry")
            )
        except Exception:  # never let one request take the hub down; say which
            logger.exception("verifying %s failed", quote(request.callback))
        finally:
            entry.users -= 1
            if not entry.users:
                del self._key_locks[key]
            if counted and not active:
                self.admission.remove(client, request.callback)

    async def _verify_intent(
        self, request: SubscriptionRequest, client: str, key: tuple[str, str]
    ) -> bool:
        """True when a new subscription became active (it keeps its admission count)."""
        collection = key[0]
        lease = self.lease.grant(request.lease_seconds)
        challenge = secrets.token_urlsafe(24)
        answer = await self._get(proto.verification_url(request, challenge, lease))
        if answer is None or not proto.challenge_answered(*answer, challenge):
            logger.info("%s of %s not verified", request.mode, quote(request.callback))
            return False
        if request.mode == "unsubscribe":
            await self._remove(key, "unsubscribed")
            return False
        head = await self.log.released_head(collection)  # held-back entries come to it
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
            sub.client = client
            await self.store.save(sub)
            self._add(sub)
        logger.info(
            "%s %s to %s (lease %ds, from seq %d)",
            "renewed" if renewed else "subscribed",
            quote(request.callback),
            collection,
            lease,
            sub.cursor,
        )
        return not renewed

    async def _get(self, url: str) -> tuple[int, bytes] | None:
        assert self._http is not None
        why = self.policy.check_literal(url)
        if why is not None:
            logger.info("not calling %s: %s", quote(url.split("?")[0]), why)
            return None
        try:
            async with self._http.get(_exact(url), allow_redirects=False) as response:
                body = await response.content.read(1024)
                return response.status, body
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            logger.info("GET %s failed: %s", quote(url.split("?")[0]), exc)
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
        if self.framework_topics:
            for cid, topic in body.items():
                topic["framework"] = self.framework_topic(cid)
                topic["framework_subscriptions"] = counts.get(framework.stream(cid), 0)
        return web.json_response({"hub": self.url, "topics": body})

    async def _collection_of(self, request: web.Request) -> str:
        collection = request.match_info["collection"]
        if not is_valid_collection_id(collection) or not await self._known(collection):
            raise web.HTTPNotFound(text="no such collection here\n")
        return collection

    def hubs(self) -> list[str]:
        """The hubs a topic names in ``Link``: a hub handed the notifications first, then this."""
        return [*self.external_hubs, self.url]

    async def _topic_head(self, request: web.Request) -> web.Response:
        """The topic (section 4.1): 200, application/xml, Link self and hub; latest notification.

        Before the first notification the body is empty (``Content-Length:
        0``, as section 4.1 says).  While a hub that fetches topics is being
        handed notifications (:mod:`.websubpush`), a GET gets the one waiting.
        """
        return await self._serve_topic(request, await self._collection_of(request))

    async def _framework_head(self, request: web.Request) -> web.Response:
        """The framework topic (Framework Notification 4.1): as a topic, from its stream."""
        collection = await self._collection_of(request)
        if not self.framework_topics:
            raise web.HTTPNotFound(text="this hub serves no framework topics\n")
        return await self._serve_topic(request, framework.stream(collection))

    async def _serve_topic(self, request: web.Request, collection: str) -> web.Response:
        """GET/HEAD of the topic of ``collection`` (a change or a framework stream)."""
        is_framework = framework.collection_of(collection) is not None
        try:
            earliest = await self.log.earliest(collection)
            head = await self.log.released_head(collection)  # not what is held back
            handoff = None if is_framework else self.handoff.get(collection)
            body = handoff() if handoff is not None and request.method == "GET" else None
            if body is None:
                latest = await self.log.read(collection, head - 1, limit=1) if head else []
                item = self._render(collection, latest[0]) if latest else None
                body = b""
                if item is not None and item.fragment is not None:
                    body = self._compose(collection, [item])
        except LogUnavailable:
            raise web.HTTPServiceUnavailable(text="the log is unreachable; retry\n") from None
        headers = proto.head_headers(
            topic=self._stream_topic(collection),
            hubs=[self.url] if is_framework else self.hubs(),  # framework: ours only
            head=head,
            earliest=earliest,
            resourcesync=self._capability_list(collection) or None,
        )
        if body and self.signer is not None:  # relayed by hubs that fetch the topic
            headers[proto.PUBLISHER_SIGNATURE_HEADER] = self.signer.sign(body)
        headers["Content-Length"] = str(len(body))  # "0" before the first (4.1), HEAD too
        return web.Response(body=body, headers=headers)

    async def _feed(self, request: web.Request) -> web.Response:
        collection = await self._collection_of(request)
        page_text = request.query.get("page")
        page: int | None = None
        if page_text is not None:
            digits = len(page_text) <= MAX_PAGE_DIGITS and page_text.isascii()
            if not (digits and page_text.isdigit()) or int(page_text) < 1:
                raise web.HTTPBadRequest(text="page must be a positive integer\n")
            page = int(page_text)
        try:
            earliest = await self.log.earliest(collection)
            # Pages end at what can be read: a page held-back entries belong to is
            # not complete yet, and must not be served as an archive (RFC 5005).
            head = await self.log.released_head(collection)
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
        tailer.readers.add(s)
        s.task = asyncio.create_task(self._deliver_loop(s, tailer), name="rsnotify-websub-deliver")

    async def _remove(self, key: tuple[str, str], why: str) -> None:
        s = self._subs.pop(key, None)
        with contextlib.suppress(Exception):
            await self.store.delete(*key)
        if s is None:
            return
        self.admission.remove(s.sub.client, s.sub.callback)
        tailer = self._tailers.get(s.sub.collection)
        if tailer is not None:
            tailer.readers.discard(s)
            if not tailer.readers:  # nobody left to feed: stop reading the log
                del self._tailers[s.sub.collection]
                if tailer.task is not None:
                    tailer.task.cancel()
        if s.task is not None and s.task is not asyncio.current_task():
            s.task.cancel()
        logger.info("subscription of %s to %s ended: %s", quote(key[1]), key[0], why)

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
            tailer = _Tailer(
                self.log,
                collection,
                position,
                self.ring_size,
                lambda record, _read_at: self._render(collection, record),
                batch=TAIL_BATCH,
                recheck_head=True,
            )
            self._tailers[collection] = tailer
            tailer.task = asyncio.create_task(tailer.run(), name=f"rsnotify-websub-{collection}")
        return tailer

    def _render(self, collection: str, record: LogRecord) -> RenderedChange:
        return proto.render_record(collection, record)

    def _compose(self, collection: str, items: Sequence[RenderedChange]) -> bytes:
        base = framework.collection_of(collection)
        return proto.compose_batch(
            items,
            capabilitylist=self._capability_list(collection),
            collection=base or collection,
            capability=envelope.NOTIFICATION_CAPABILITY
            if base is None
            else envelope.FRAMEWORK_CAPABILITY,
        )

    # -- delivery ---------------------------------------------------------------------------

    async def _window(self, s: _Sub, tailer: _Tailer, want: int) -> list[RenderedChange]:
        """Up to a batch of rendered changes from ``want`` on (ring, else the log)."""
        ring = tailer.ring
        if ring and ring[0].seq <= want:
            s.buffer.clear()
            offset = want - ring[0].seq
            return list(itertools.islice(ring, offset, offset + proto.MAX_BATCH_CHANGES))
        while s.buffer and s.buffer[0].seq < want:
            s.buffer.popleft()
        if not s.buffer or s.buffer[0].seq != want:
            s.buffer.clear()
            records = await self.log.read(s.sub.collection, want - 1, limit=REPLAY_BATCH)
            if records and records[0].seq == want:
                s.buffer.extend(self._render(s.sub.collection, r) for r in records)
        return list(itertools.islice(s.buffer, proto.MAX_BATCH_CHANGES))

    async def _next(self, s: _Sub, tailer: _Tailer) -> list[RenderedChange] | _Gap | None:
        """The next thing to POST to ``s``, or None when it is caught up."""
        cursor = s.delivery.cursor
        want = cursor + 1
        if want > tailer.position:
            return None
        items = await self._window(s, tailer, want)
        if items and items[0].fragment is None:  # unrenderable: tell them to poll
            return _Gap(cursor, items[0].seq + 1, max(tailer.position, items[0].seq))
        if items:
            return proto.take_batch(items)
        earliest = await self.log.earliest(s.sub.collection)
        if s.delivery.plan(earliest, max(tailer.position, earliest - 1)) is Action.GAP:
            return _Gap(cursor, earliest, max(tailer.position, earliest - 1))
        return None

    def _content(self, s: _Sub, batch: list[RenderedChange]) -> tuple[bytes, str]:
        """The body of one delivery and its content type (the topic's: WebSub 7)."""
        collection = s.sub.collection
        if s.sub.topic.endswith("/feed.atom"):
            records = [i.record for i in batch if i.record is not None]
            body = atom.render_delivery(
                collection=collection,
                capability_list=self._collections.get(collection, ""),
                records=records,
                feed_url=self.feed_url(collection),
                hub_url=self.url,
            )
            return body, proto.ATOM_TYPE
        return self._compose(collection, batch), proto.NOTIFICATION_TYPE

    async def _deliver_loop(self, s: _Sub, tailer: _Tailer) -> None:
        """Deliver to one subscription until it ends; a bug is logged, never a silent stop."""
        while True:
            try:
                await self._deliver(s, tailer)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception(
                    "delivery to %s failed unexpectedly; retrying", quote(s.sub.callback)
                )
                await asyncio.sleep(random.uniform(0.5, 1.0))

    async def _deliver(self, s: _Sub, tailer: _Tailer) -> None:
        sub = s.sub
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
            if isinstance(item, _Gap):
                capability_list = self._capability_list(sub.collection)
                body = proto.gap_too_old(
                    sub.collection,
                    item.since,
                    item.earliest,
                    item.head,
                    capability_list,
                    self.changelists.get(sub.collection),
                )
                headers = proto.content_headers(
                    topic=sub.topic,
                    hub=self.url,
                    body=body,
                    secret=sub.secret,
                    content_type=proto.GAP_TYPE,
                    prev=item.since,
                    kind="gap_too_old",
                )
            else:
                body, content_type = self._content(s, item)
                headers = proto.content_headers(
                    topic=sub.topic,
                    hub=self.url,
                    body=body,
                    secret=sub.secret,
                    content_type=content_type,
                    seq=item[-1].seq,
                    prev=s.delivery.cursor,
                    resourcesync=self._capability_list(sub.collection) or None,
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
                        quote(sub.callback),
                        item.since + 1,
                        item.earliest - 1,
                        s.delivery.cursor,
                    )
                else:
                    s.delivery.delivered(item[-1].seq)
                    s.delivered += len(item)
                s.dirty = True
            elif outcome == "gone":
                await self._remove(sub.key, "the callback answered 410 Gone")
                return
            else:
                s.buffer.clear()  # a retry reads the log again: it may have trimmed since
                delay = s.delivery.failed(time.time(), random.uniform(0.5, 1.0))
                if s.delivery.failures in (1, 5) or s.delivery.failures % 20 == 0:
                    logger.warning(
                        "delivery to %s failed (%s; %d in a row); retrying in %.1fs",
                        quote(sub.callback),
                        s.last_error,
                        s.delivery.failures,
                        delay,
                    )
                await asyncio.sleep(delay)

    async def _post(self, s: _Sub, body: bytes, headers: dict[str, str]) -> str:
        assert self._http is not None
        why = self.policy.check_literal(s.sub.callback)
        if why is not None:  # the policy changed since it subscribed: never call it
            s.last_error = f"callback refused: {why}"
            return "retry"
        try:
            async with self._http.post(
                _exact(s.sub.callback), data=body, headers=headers, allow_redirects=False
            ) as response:
                await response.content.read(1024)
                s.last_error = f"HTTP {response.status}"
                return proto.classify_response(response.status)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            s.last_error = f"{type(exc).__name__}: {exc}"
            return "retry"


def _exact(url: str) -> URL:
    """The callback URL as given, never re-encoded (WebSub 5.3: preserve the query string)."""
    return URL(url, encoded=url.isascii())


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
