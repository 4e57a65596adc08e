"""The publisher process: discovery, watchers, sequencing, log, transports, metrics.

Order of operations for every new entry (design.md section 3):

1. a watcher detects it, with the checkpoint just after it;
2. the service gives it the next sequence number and appends it to the log
   together with that checkpoint, atomically (a batch at a time);
3. transports (MQTT, WebSocket) tail the log and push it.

A crash anywhere re-detects from the last committed checkpoint, which is
exactly after the last logged entry, so an entry gets one sequence number
forever; a transport that had not pushed it yet pushes it from the log.
Everything that can fail transiently (the Source, Redis, the broker) is
retried with backoff and jitter; nothing here exits on a network error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from .. import discovery, framework, sitemap, w3cdt
from ..backoff import Backoff
from ..changes.access import DirectoryAccess, DocumentAccess, HttpAccess
from ..changes.watcher import CollectionWatcher
from ..collection import collection_id
from ..envelope import Notification, to_json
from ..errors import DocumentError, FetchError, RsNotifyError, listening
from ..fetch import Fetcher
from ..framework import FrameworkChange
from ..httppolicy import HttpPolicy
from ..log import Fenced, LogConflict, LogUnavailable, NotificationLog, Retention, open_log
from ..log.tail_cache import TailCache
from ..metrics import PublisherMetrics, metrics_app, serve
from ..model import Capability
from ..outbound import Renderer, Signer
from ..report import PublisherReporter
from ..tracker import Checkpoint, Detection
from . import fswatch
from .frameworkwatch import FrameworkState, FrameworkWatcher

log = logging.getLogger("rsnotify.publish")
T = TypeVar("T")

# New entries per detection pass: a 50,000-entry list is parsed, logged and
# pushed 2,000 entries at a time, so the first notifications leave ~15 ms
# after the read instead of after the whole parse (~0.7 s), and the event
# loop (PUBACKs, WebSocket clients) is never held longer than that.
DETECT_CHUNK = 2_000
COLLECTION_REFRESH = 5.0  # seconds between reads of the log's collection list (--mqtt-only)
FRAMEWORK_MIN_GAP = 1.0  # seconds: a publish ping makes a framework check at most this often


@dataclass(slots=True)
class PublisherConfig:
    """Everything ``rsnotify publish`` can be told (see its --help)."""

    source: str
    redis: str | None = None
    state_dir: str = ".rsnotify"
    mqtt: str | None = None
    ws: str | None = None  # HOST:PORT
    ws_only: bool = False
    mqtt_only: bool = False  # gateway mode: push the shared log over MQTT, detect nothing
    mqtt_hub: str | None = None  # advertise this broker, pushed to by an --mqtt-only gateway
    poll: float = 1.0
    watch: bool = False
    lenient: frozenset[sitemap.Lenient] = frozenset()  # rules relaxed reading the Source
    topic_prefix: str = "resourcesync"
    heartbeat: float = 5.0
    retention: Retention = field(default_factory=Retention)
    fmt: str = "json"
    secret: bytes | None = None
    secret_id: str = "k1"
    ws_token: str | None = None
    ws_cert: str | None = None  # PEM chain: the gateway serves wss://
    ws_key: str | None = None
    from_beginning: bool = False
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    batch: int = 1000
    collections: Sequence[str] = ()  # Capability List URLs or ids to publish (empty: all)
    publisher_id: str = field(default_factory=lambda: f"{os.uname().nodename}:{os.getpid()}")
    mqtt_tls_ca: str | None = None
    mqtt_tls_insecure: bool = False
    mqtt_protocol: str = "auto"  # "auto" (5, falling back to 3.1.1 when refused), "5", "3.1.1"
    legacy_topics: bool = False  # MQTT topics <prefix>/<collection id>/... (see transport.topics)
    write_hubs: bool = False  # directory SOURCE: add the hub links to the Capability Lists
    report: str | None = None  # redis:// URL: heartbeat and heads for `rsnotify dashboard`
    ha: bool = False  # campaign for leadership through Redis; only the leader publishes
    ha_group: str | None = None  # publishers of one Source share a group (default: from SOURCE)
    lease_ttl: float = 3.0
    websub: str | None = None  # HOST:PORT of the WebSub hub (rsnotify.transport.websub)
    websub_url: str | None = None  # the hub's public URL, if not http://HOST:PORT/
    websub_lease: int | None = None  # default lease granted (seconds)
    websub_retry_max: float = 30.0  # longest wait between retries of a failing callback
    # Credentials, CA, proxy, pace and deadline of every read of the Source
    # (rsnotify.httppolicy); credentials go to the Source's origin only.
    http: HttpPolicy = field(default_factory=HttpPolicy)
    websub_lease_min: int | None = None  # shortest lease granted (default 300 s)
    websub_lease_max: int | None = None  # longest lease granted (default 2678400 s)
    websub_allow_callback: Sequence[str] = ()  # CIDRs/hosts the hub may call despite the filter
    websub_max_subscriptions: int = 10_000  # subscriptions + pending verifications, in all
    websub_max_per_client: int = 100  # ... per client address
    websub_max_per_host: int = 100  # ... per callback host
    websub_hub: str | None = None  # a WebSub hub run by others to hand notifications to
    websub_hub_mode: str = "post"  # post (section 4.1) or ping (hub.mode=publish)
    # Framework Notification 1.0.1 (with --websub): seconds between checks of the
    # Capability List's Resource List, Dumps and Change Lists; 0 turns it off.
    framework_interval: float = 30.0
    ws_max_per_address: int | None = None  # connections per client address (None: the default)
    redis_wait: float = 60.0  # seconds start-up waits for the log's Redis before exiting


@dataclass(slots=True)
class _Collection:
    id: str
    capability_list: str
    watcher: CollectionWatcher
    head: int = 0
    trigger: asyncio.Event = field(default_factory=asyncio.Event)
    framework: FrameworkWatcher | None = None  # with --websub and --framework-interval
    framework_head: int = 0
    framework_trigger: asyncio.Event = field(default_factory=asyncio.Event)


class Publisher:
    """Runs one publisher until :meth:`stop` (or SIGTERM via :func:`run`)."""

    def __init__(self, config: PublisherConfig) -> None:
        self.config = config
        self.metrics = PublisherMetrics()
        self._published_children: dict[tuple[str, str], tuple[Any, Any]] = {}
        self.log: NotificationLog | None = None
        self.collections: dict[str, _Collection] = {}
        self.signer = Signer(config.secret_id, config.secret) if config.secret else None
        # One rendering per record for every transport of this process.
        self.renderer = Renderer(config.fmt, self.signer)
        self._fetcher: Fetcher | None = None
        self._access: DocumentAccess | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self._mqtt = None
        self._ws = None
        self.websub: Any = None  # the WebSubHub, when --websub (with --ha: on the leader)
        self._hub_pusher: Any = None  # the HubPusher, when --websub-hub
        self._hub_pusher_task: asyncio.Task[None] | None = None
        self._metrics_runner = None
        self.metrics_port: int | None = None
        self.ws_port: int | None = None
        self._fswatch: fswatch.DirectoryWatch | None = None
        self._healthy = True
        self._leading: list[asyncio.Task[Any]] = []
        self._election: Any = None
        self._fence: int | None = None
        self.is_leader = False
        self._log_down_since: float | None = None  # start-up: when the log stopped answering

    # -- set-up ------------------------------------------------------------------

    def _is_directory(self) -> bool:
        source = self.config.source
        return not source.startswith(("http://", "https://")) and Path(source).is_dir()

    async def _discover(self) -> discovery.SourceInfo:
        """Find the Capability Lists, over HTTP or in the Source's directory."""
        if self._is_directory():
            access = self._access
            assert access is not None
            machine = discovery.DiscoveryMachine("http://localhost/.well-known/resourcesync")
            while (request := machine.next_request()) is not None:
                try:
                    fetched = await access.read(request.url)
                except FetchError as exc:
                    machine.fail(request, str(exc))
                    continue
                machine.receive(request, final_url=request.url, headers={}, body=fetched.body)
            return machine.result()
        assert self._fetcher is not None
        return await discovery.discover(self.config.source, self._fetcher)

    async def _setup_collections(self) -> None:
        backoff = Backoff(maximum=10.0)
        while True:
            try:
                info = await self._discover()
                break
            except (FetchError, RsNotifyError) as exc:
                if self._stopping.is_set():
                    raise
                delay = backoff.next()
                log.warning(
                    "discovery of %s failed (%s); retrying in %.1fs", self.config.source, exc, delay
                )
                await self._sleep(delay)
        assert self.log is not None
        wanted = set(self.config.collections)
        for cap in info.capability_lists:
            changelist = cap.capabilities.get(Capability.CHANGELIST)
            cid = collection_id(cap.url)
            if wanted and cap.url not in wanted and cid not in wanted:
                continue
            if changelist is None:
                log.warning("%s offers no Change List; not published", cap.url)
                continue
            await self._retry(self.log.register, cid, cap.url)
            checkpoint = Checkpoint.from_json(await self._retry(self.log.checkpoint, cid))
            head = await self._retry(self.log.head, cid)
            assert self._access is not None
            watcher = CollectionWatcher(
                access=self._access,
                collection=cid,
                capability_list=cap.url,
                changelist_url=changelist,
                checkpoint=checkpoint,
                from_beginning=self.config.from_beginning,
                limits=sitemap.Limits(lenient=self.config.lenient),
            )
            self.collections[cid] = _Collection(cid, cap.url, watcher, head=head)
            if self._framework_enabled():
                self.collections[cid].framework = FrameworkWatcher(
                    access=self._access,
                    collection=cid,
                    capability_list=cap.url,
                    changes=watcher,
                    limits=sitemap.Limits(lenient=self.config.lenient),
                )
            self.metrics.head.labels(cid).set(head)
            log.info(
                "watching %s (collection %s, head %d)",
                cap.url,
                cid,
                head,
                extra={"collection": cid, "seq": head},
            )
        if not self.collections:
            raise RsNotifyError(
                f"{self.config.source}: no Capability List with a Change List to publish"
            )

    async def start(self) -> None:
        """Open the log, discover the Source, start watchers, transports and metrics."""
        config = self.config
        # Its own transports read back what it appends: from memory, not the backend.
        try:
            self.log = TailCache(open_log(config.redis, config.state_dir))
        except (OSError, sqlite3.Error) as exc:
            raise RsNotifyError(f"--state-dir {config.state_dir}: {exc}") from None
        self._fetcher = Fetcher(policy=config.http.with_credential_origins([config.source]))
        self._access = (
            DirectoryAccess(config.source) if self._is_directory() else HttpAccess(self._fetcher)
        )
        if config.metrics_port is not None:
            with listening("metrics", config.metrics_host, config.metrics_port):
                self._metrics_runner, self.metrics_port = await serve(
                    metrics_app(self.metrics.registry, lambda: self._healthy),
                    config.metrics_host,
                    config.metrics_port,
                )
        if config.ha and not config.redis:
            raise RsNotifyError("--ha elects a leader through Redis: give --redis")
        if config.mqtt_only and (config.ws_only or not config.redis or not config.mqtt):
            raise RsNotifyError("--mqtt-only pushes a shared log: give --redis and --mqtt")
        if not (config.ws_only or config.mqtt_only):
            await self._setup_collections()
        if config.report and not config.mqtt_only:  # telemetry for `rsnotify dashboard`
            self._tasks.append(asyncio.create_task(PublisherReporter(config.report, self).run()))
        await self._start_gateway()
        if config.ws_only:
            return
        if config.ha:
            from .leader import LeaderElection

            group = config.ha_group or collection_id(config.source)
            self._election = LeaderElection(
                config.redis,  # type: ignore[arg-type]
                # The pushers of a split deployment elect their own leader: one
                # sharing the detecting publishers' group could win their lease
                # and stop detection.
                group=f"{group}/mqtt" if config.mqtt_only else group,
                owner=config.publisher_id,
                ttl=config.lease_ttl,
                retry=min(0.5, config.lease_ttl / 4),
            )
            self._tasks.append(
                asyncio.create_task(
                    self._election.run(self._on_elected, self._on_deposed, self._stopping)
                )
            )
        else:
            await self._start_leading()
        if config.watch:
            self._start_fs_watch()

    def _framework_enabled(self) -> bool:
        """Framework notifications travel on the WebSub hub's framework topics only."""
        return bool(self.config.websub) and self.config.framework_interval > 0

    async def _on_elected(self, leadership: Any) -> None:
        self._fence = leadership.token
        self.is_leader = True
        for collection in self.collections.values():
            await self._reload(collection)  # a previous leader may have moved the log on
        await self._start_leading()

    async def _on_deposed(self) -> None:
        """Lost the lease: stop detecting and pushing at once (the fence stops stale writes)."""
        self.is_leader = False
        self._fence = None
        leading, self._leading = self._leading, []
        for task in leading:
            task.cancel()
        await asyncio.gather(*leading, return_exceptions=True)
        if self._mqtt is not None:
            mqtt, self._mqtt = self._mqtt, None
            with contextlib.suppress(Exception):
                await mqtt.stop()
        if self.config.ha:
            await self._stop_websub()  # the next leader serves (and delivers) from the store

    async def _start_leading(self) -> None:
        """Detection, the MQTT pusher and maintenance: what only the leader runs."""
        self.is_leader = True
        self._start_pusher()
        if self.config.websub and self.config.ha:
            self._leading.append(asyncio.create_task(self._lead_websub()))
        else:
            await self._start_hub_pusher()
        if self.config.mqtt_only:
            self._leading.append(asyncio.create_task(self._follow_collections()))
            return
        for collection in self.collections.values():
            self._leading.append(asyncio.create_task(self._watch(collection)))
            if collection.framework is not None:
                self._leading.append(asyncio.create_task(self._watch_framework(collection)))
        self._leading.append(asyncio.create_task(self._maintain()))

    def _start_pusher(self) -> None:
        config = self.config
        assert self.log is not None
        if config.mqtt:
            from ..transport.mqtt import MqttPusher

            self._mqtt = MqttPusher(
                config.mqtt,
                self.log,
                topic_prefix=config.topic_prefix,
                fmt=config.fmt,
                signer=self.signer,
                heartbeat=config.heartbeat,
                tls_ca=config.mqtt_tls_ca,
                tls_insecure=config.mqtt_tls_insecure,
                on_published=self._on_mqtt_published,
                renderer=self.renderer,
                protocol=config.mqtt_protocol,
                legacy_topics=config.legacy_topics,
                publisher_id=config.publisher_id,
            )
            for collection in self.collections:
                self._mqtt.add_collection(collection)
            self._leading.append(asyncio.create_task(self._mqtt.run()))

    async def _follow_collections(self) -> None:
        """``--mqtt-only``: push every collection the shared log holds, new ones included.

        The detecting publisher registers a collection in the log before it
        appends to it, so a collection is found at most
        :data:`COLLECTION_REFRESH` seconds after it appears.
        """
        assert self.log is not None
        wanted = set(self.config.collections)
        known: set[str] = set()
        while not self._stopping.is_set():
            try:
                found = await self.log.collections()
            except LogUnavailable as exc:
                log.warning("cannot read the collection list: %s", exc)
                found = {}
            for cid, capability_list in sorted(found.items()):
                if cid in known or (wanted and cid not in wanted and capability_list not in wanted):
                    continue
                known.add(cid)
                if self._mqtt is not None:
                    self._mqtt.add_collection(cid)
                log.info("pushing %s (%s)", cid, capability_list, extra={"collection": cid})
            await self._sleep(COLLECTION_REFRESH)

    async def _start_gateway(self) -> None:
        """The WebSocket gateway serves from the log: every instance may run one."""
        config = self.config
        assert self.log is not None
        if config.ws:
            from ..runtime import release_memory
            from ..transport.ws import WebSocketGateway, server_tls_context

            host, _, port = config.ws.rpartition(":")
            limits: dict[str, int] = {}
            if config.ws_max_per_address is not None:
                limits["max_per_address"] = config.ws_max_per_address
            self._ws = WebSocketGateway(
                self.log,
                host=host or "127.0.0.1",
                port=int(port),
                fmt=config.fmt,
                signer=self.signer,
                token=config.ws_token,
                ssl_context=server_tls_context(config.ws_cert, config.ws_key)
                if config.ws_cert
                else None,
                heartbeat=config.heartbeat,
                server_id=config.publisher_id,
                on_client_change=self.metrics.ws_clients.set,
                on_published=self._on_ws_published,
                renderer=self.renderer,
                release_memory=release_memory,
                **limits,
            )
            with listening("WebSocket clients", self._ws.host, self._ws.port):
                await self._ws.start()
            self.ws_port = self._ws.port
        if config.websub and not config.ha:  # with --ha only the leader runs the hub
            await self._start_websub()

    async def _start_websub(self) -> None:
        """The WebSub hub serves from the log too (subscriptions: Redis or --state-dir)."""
        from ..transport.websub import WebSubHub
        from ..transport.websubproto import LEASE_MAXIMUM, LEASE_MINIMUM, LeasePolicy
        from ..transport.websubstore import open_store

        config = self.config
        assert self.log is not None and config.websub is not None
        if config.ws_only:
            # Every gateway would load the same subscriptions and deliver them all.
            raise RsNotifyError("--websub runs one hub per log: not with --ws-only")
        host, _, port = config.websub.rpartition(":")
        minimum = config.websub_lease_min or LEASE_MINIMUM
        maximum = config.websub_lease_max or LEASE_MAXIMUM
        default = config.websub_lease or min(max(10 * 24 * 3600, minimum), maximum)
        try:
            lease = LeasePolicy(default=default, minimum=minimum, maximum=maximum)
        except ValueError as exc:
            raise RsNotifyError(f"--websub-lease*: {exc}") from None
        hub = WebSubHub(
            self.log,
            open_store(config.redis, config.state_dir),
            host=host or "127.0.0.1",
            port=int(port),
            public_url=config.websub_url,
            lease=lease,
            changelists={cid: c.watcher.changelist_url for cid, c in self.collections.items()},
            backoff_max=config.websub_retry_max,
            signer=self.signer,
            # Never hold more than the log retains: "beyond retention" then means what it says.
            ring_size=min(2_000, config.retention.max_len or 2_000),
            server_id=config.publisher_id,
            allow_callbacks=config.websub_allow_callback,
            max_subscriptions=config.websub_max_subscriptions,
            max_per_client=config.websub_max_per_client,
            max_per_host=config.websub_max_per_host,
            publish_secret=config.secret,
            on_publish=self._on_publish,
            external_hubs=[config.websub_hub] if config.websub_hub else [],
            framework_topics=self._framework_enabled(),
        )
        try:
            if self.config.ha:  # the old leader may hold the port a moment: _lead_websub retries
                await hub.start()
            else:
                with listening("the WebSub hub", hub.host, hub.port):
                    await hub.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await hub.stop()
            with contextlib.suppress(Exception):
                await hub.store.close()
            raise
        self.websub = hub

    async def _stop_websub(self) -> None:
        hub, self.websub = self.websub, None
        if hub is not None:
            with contextlib.suppress(Exception):
                await hub.stop()
            with contextlib.suppress(Exception):
                await hub.store.close()

    async def _lead_websub(self) -> None:
        """``--ha``: the leader runs the hub; the port may still be the old leader's a moment."""
        backoff = Backoff(initial=0.1, maximum=2.0)
        while True:
            try:
                await self._start_websub()
                break
            except OSError as exc:
                delay = backoff.next()
                log.warning("cannot serve WebSub yet (%s); retrying in %.1fs", exc, delay)
                await self._sleep(delay)
        log.info("leading: WebSub hub at %s", self.websub.url if self.websub else "?")
        await self._start_hub_pusher()

    def _on_publish(self, collection: str) -> None:
        """A Source said its Change Lists changed (section 4.1 POST or ping): read them now."""
        found = self.collections.get(collection)
        if found is not None:
            found.trigger.set()
            found.framework_trigger.set()

    async def _start_hub_pusher(self) -> None:
        """``--websub-hub``: hand every notification to a hub run by others (leader only)."""
        from ..transport.websubpush import HubPusher

        config = self.config
        if not config.websub_hub or self.websub is None or not self.is_leader:
            return
        assert self.log is not None
        hub = self.websub
        self._hub_pusher = HubPusher(
            self.log,
            hub_url=config.websub_hub,
            topics=hub.topic,
            capability_lists={cid: c.capability_list for cid, c in self.collections.items()},
            mode=config.websub_hub_mode,
            secret=config.secret,
            signer=self.signer,
            handoff=hub.handoff,
            backoff_max=config.websub_retry_max,
        )
        for collection in self.collections:
            self._hub_pusher.add_collection(collection)
        self._hub_pusher_task = asyncio.create_task(self._hub_pusher.run())
        self._leading.append(self._hub_pusher_task)

    def planned_websub(self, collection: str) -> tuple[str, str] | None:
        """``--ha`` follower: where the leader's hub will be (the same --websub address)."""
        config = self.config
        if not config.websub:
            return None
        base = config.websub_url or f"http://{config.websub}/"
        base = base if base.endswith("/") else base + "/"
        return base + collection, config.websub_hub or base

    def websub_advertisement(self, collection: str) -> tuple[str, str] | None:
        """(topic, hub) of the collection's Change Notification channel (section 5), if any."""
        if self.websub is None:
            return None
        return self.websub.topic(collection), self.config.websub_hub or self.websub.url

    def framework_advertisement(self, collection: str) -> tuple[str, str] | None:
        """(topic, hub) of the collection's Framework Notification channel (its section 5).

        Always on this publisher's own hub: the framework stream is not handed
        to a ``--websub-hub`` (see the README).
        """
        if not self._framework_enabled():
            return None
        if self.websub is not None:
            return self.websub.framework_topic(collection), self.websub.url
        planned = self.planned_websub(collection)  # --ha follower: the leader's hub
        if planned is None:
            return None
        base = planned[0][: -len(collection)]
        return planned[0] + framework.TOPIC_SUFFIX, base

    def hub_links(self, collection: str) -> list[str]:
        """The collection's MQTT and WebSocket channels (``rel="urn:x-rsnotify:channel"``)."""
        hrefs = []
        config = self.config
        broker_url = config.mqtt or config.mqtt_hub
        if broker_url:
            from ..transport.mqtturl import parse_broker_url
            from ..transport.topics import Topics

            broker = parse_broker_url(broker_url)
            host = f"[{broker.host}]" if ":" in broker.host else broker.host
            topic = Topics(config.topic_prefix, legacy=config.legacy_topics).changes(collection)
            hrefs.append(f"{broker.scheme}://{host}:{broker.port}/{topic}")
        if config.ws and self.ws_port is not None:
            host = config.ws.rpartition(":")[0] or "127.0.0.1"
            scheme = "wss" if config.ws_cert else "ws"
            hrefs.append(f"{scheme}://{host}:{self.ws_port}/{collection}")
        return hrefs

    def write_hub_links(self) -> None:
        """Advertise the channels in each Capability List file of a directory Source (atomically).

        WebSub as Change Notification 1.0.1 section 5 says (a ``<url>`` entry:
        topic in ``<loc>``, ``rs:ln rel="hub"``, ``capability="change-notification"``),
        MQTT and WebSocket as ``rs:ln rel="urn:x-rsnotify:channel"`` links (see
        :mod:`rsnotify.discovery`).  Forms written by earlier versions (a
        ``changelist-notification`` entry, ``rel="hub"`` links to ``mqtt://``
        or ``ws://``) are replaced.
        """
        from .. import sitemap
        from ..discovery import CHANNEL_REL, PUSH_SCHEMES
        from ..envelope import FRAMEWORK_CAPABILITY, NOTIFICATION_CAPABILITY, OBSOLETE_CAPABILITY
        from ..model import Entry, Link

        assert isinstance(self._access, DirectoryAccess)
        for cid, collection in self.collections.items():
            path = self._access.local_path(collection.capability_list)
            document = sitemap.parse(path)
            links = [
                ln
                for ln in document.links
                if not (ln.rel == "hub" and ln.href.partition(":")[0] in PUSH_SCHEMES)
            ]
            known = {ln.href for ln in links if ln.rel == CHANNEL_REL}
            links += [Link(rel=CHANNEL_REL, href=h) for h in self.hub_links(cid) if h not in known]
            entries = [e for e in document.entries if e.capability != OBSOLETE_CAPABILITY]
            channels = [
                (NOTIFICATION_CAPABILITY, self.websub_advertisement(cid)),
                (FRAMEWORK_CAPABILITY, self.framework_advertisement(cid)),
            ]
            for capability, websub in channels:
                if websub is None:
                    continue
                topic, hub = websub
                entries = [
                    e for e in entries if not (e.capability == capability and e.loc == topic)
                ]
                entries.append(
                    Entry(loc=topic, capability=capability, links=[Link(rel="hub", href=hub)])
                )
            if links == document.links and entries == document.entries:
                continue
            document.links, document.entries = links, entries
            temp = path.with_name(f".{path.name}.rsnotify-tmp")
            with open(temp, "wb") as handle:
                sitemap.write(document, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
            log.info("advertised the push channels in %s", path)

    def _published_metrics(self, collection: str, transport: str) -> tuple[Any, Any]:
        # Called for every acknowledged notification: resolve the labelled
        # children once (labels() takes a lock and builds a key each time).
        key = (collection, transport)
        children = self._published_children.get(key)
        if children is None:
            children = self._published_children[key] = (
                self.metrics.published.labels(collection, transport),
                self.metrics.publish_latency.labels(collection, transport),
            )
        return children

    def _on_mqtt_published(self, collection: str, seq: int, size: int, latency: float) -> None:
        counter, histogram = self._published_metrics(collection, "mqtt")
        counter.inc()
        histogram.observe(latency)

    def _on_ws_published(self, collection: str, seq: int, size: int, latency: float) -> None:
        counter, histogram = self._published_metrics(collection, "ws")
        counter.inc()
        histogram.observe(latency)

    def _start_fs_watch(self) -> None:
        """Poll a collection as soon as one of its Change List documents is written."""
        if not self._is_directory():
            log.warning(
                "--watch needs a local directory as SOURCE; polling every %.1fs instead",
                self.config.poll,
            )
            return
        if not fswatch.available():
            log.warning("no inotify on this system; polling every %.1fs instead", self.config.poll)
            return
        self._fswatch = fswatch.DirectoryWatch()
        for collection in self.collections.values():
            self._watch_lists(collection)
        self._tasks.append(asyncio.create_task(self._fswatch.run()))

    def _watch_lists(self, collection: _Collection) -> None:
        """Watch the directories of the collection's Change List Index and Change Lists."""
        if self._fswatch is None or not isinstance(self._access, DirectoryAccess):
            return
        watcher = collection.watcher
        urls = [watcher.changelist_url, *watcher.list_urls()]
        for url in urls:
            path = self._access.local_path(url)
            self._fswatch.watch(path.parent, collection.trigger.set)

    # -- the loops -----------------------------------------------------------------

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopping.wait()

    async def _retry(self, operation: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run a start-up log operation until the log answers, or give up.

        The retry policy when Redis is down: at start-up (the only caller),
        retry with backoff while the log has been unreachable for less than
        ``redis_wait`` seconds (``--redis-wait``), saying each time when the
        next try is and when start-up gives up; then raise, and the command
        exits 1 (systemd's ``Restart=on-failure`` starts it again), so a wrong
        ``--redis`` is an error within a minute instead of a silent loop.
        Once running, a Redis outage is retried for as long as it lasts (the
        watch loops): nothing is lost, the checkpoint waits in the log.
        """
        backoff = Backoff()
        while True:
            try:
                result = await operation(*args)
            except LogUnavailable as exc:
                if self._stopping.is_set():
                    raise
                now = time.monotonic()
                if self._log_down_since is None:
                    self._log_down_since = now
                left = self._log_down_since + self.config.redis_wait - now
                if left <= 0:
                    raise LogUnavailable(
                        f"{exc} (gave up after --redis-wait {self.config.redis_wait:g} s)"
                    ) from None
                delay = min(backoff.next(), left)
                log.warning(
                    "log unavailable (%s); retrying in %.1fs, start-up gives up in %.0fs",
                    exc,
                    delay,
                    left,
                )
                await self._sleep(delay)
            else:
                self._log_down_since = None
                return result

    async def _wait_trigger(self, collection: _Collection) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.config.poll):
                await collection.trigger.wait()
        collection.trigger.clear()

    async def _watch(self, collection: _Collection) -> None:
        watcher = collection.watcher
        backoff = Backoff()
        while not self._stopping.is_set():
            try:
                holes = watcher.holes
                result = await watcher.poll(DETECT_CHUNK)
                detected = w3cdt.now()
                self.metrics.bytes_read.labels(collection.id).inc(result.bytes_read)
                if watcher.holes > holes:  # logged by the watcher; Destinations re-baseline
                    self.metrics.coverage_holes.labels(collection.id).inc(watcher.holes - holes)
                for found in result.detections:
                    await self._log_detection(collection, found, detected)
                if result.checkpoint != watcher.checkpoint:
                    await self._commit_checkpoint(collection, result.checkpoint)
                backoff.reset()
                self._healthy = True
                if result.more:
                    continue  # the rest of a long list, at once
                self._watch_lists(collection)  # a rollover may open a list in a new directory
            except asyncio.CancelledError:
                raise
            except Fenced as exc:
                log.warning("%s; another publisher leads now", exc)
                return  # the election notices the lost lease and stands down
            except LogConflict as exc:
                log.warning(
                    "%s; reloading the checkpoint", exc, extra={"collection": collection.id}
                )
                await self._reload(collection)
                continue
            except (FetchError, DocumentError, LogUnavailable) as exc:
                self.metrics.poll_errors.labels(collection.id).inc()
                # What was read but not logged must be read again: forget cached tails.
                watcher.reset(watcher.checkpoint)
                delay = backoff.next()
                log.warning(
                    "%s: %s; retrying in %.1fs",
                    collection.id,
                    exc,
                    delay,
                    extra={"collection": collection.id},
                )
                self._healthy = backoff.attempts < 5
                await self._sleep(delay)
                continue
            await self._wait_trigger(collection)

    async def _reload(self, collection: _Collection) -> None:
        assert self.log is not None
        checkpoint = Checkpoint.from_json(await self.log.checkpoint(collection.id))
        collection.head = await self.log.head(collection.id)
        collection.watcher.reset(checkpoint)

    async def _commit_checkpoint(self, collection: _Collection, checkpoint: Checkpoint) -> None:
        assert self.log is not None
        collection.head = await self.log.append(
            collection.id,
            [],
            expected_head=collection.head,
            checkpoint=checkpoint.to_json(),
            fence=self._fence,
        )
        collection.watcher.commit(checkpoint)

    async def _log_detection(
        self, collection: _Collection, found: Detection, detected: datetime
    ) -> None:
        """Sequence and log one list's new entries, a batch at a time, each with its checkpoint."""
        assert self.log is not None
        watcher = collection.watcher
        batch = max(1, self.config.batch)
        for start in range(0, len(found.entries), batch):
            entries = found.entries[start : start + batch]
            checkpoint = found.checkpoints[start + len(entries) - 1]
            head = collection.head
            # Each change remembers the one logged before it: the start of its
            # Change Notification interval (see rsnotify.envelope).  The
            # watcher's checkpoint is the one committed with the previous batch.
            previous = watcher.checkpoint.last_time
            payloads = []
            for i, entry in enumerate(entries, start=1):
                payloads.append(
                    to_json(
                        Notification.from_entry(
                            entry,
                            collection=collection.id,
                            seq=head + i,
                            capabilitylist=collection.capability_list,
                            changelist=found.changelist,
                            detected=detected,
                            since=previous,
                        )
                    )
                )
                previous = entry.change_time
            collection.head = await self.log.append(
                collection.id,
                payloads,
                expected_head=head,
                checkpoint=checkpoint.to_json(),
                fence=self._fence,
                max_len=self.config.retention.max_len,
            )
            watcher.commit(checkpoint)
            if collection.framework is not None:  # a "changelist updated" at the next check
                collection.framework.note_entries(found.changelist, entries[-1].change_time)
            self.metrics.detected.labels(collection.id).inc(len(entries))
            self.metrics.head.labels(collection.id).set(collection.head)
            now = time.time()
            lag = self.metrics.detection_lag.labels(collection.id)
            for entry in entries:
                if entry.change_time is not None:
                    lag.observe(max(0.0, now - entry.change_time.timestamp()))
            log.debug(
                "logged %d entries of %s up to seq %d",
                len(entries),
                found.changelist,
                collection.head,
                extra={"collection": collection.id, "seq": collection.head},
            )

    async def _watch_framework(self, collection: _Collection) -> None:
        """Check the collection's framework; log what changed in its framework stream.

        Every ``--framework-interval`` seconds, and at once (at most every
        :data:`FRAMEWORK_MIN_GAP` s) when a Source pings.  The records and the
        state they were found against are appended in one step (see
        :mod:`.frameworkwatch`), under the leader's fence.
        """
        assert self.log is not None and collection.framework is not None
        watcher = collection.framework
        stream = framework.stream(collection.id)
        interval = self.config.framework_interval
        backoff = Backoff(maximum=max(interval, 10.0))
        loaded = False
        while not self._stopping.is_set():
            delay = interval
            try:
                if not loaded:  # at each leadership: what the last leader committed
                    watcher.state = FrameworkState.from_json(await self.log.checkpoint(stream))
                    collection.framework_head = await self.log.head(stream)
                    loaded = True
                first = not watcher.state.started
                collection.framework_trigger.clear()  # a ping from now on: check again
                state, changes = await watcher.check(w3cdt.now())
                if changes or state != watcher.state:
                    await self._log_framework(collection, state, changes)
                if first:
                    log.info(
                        "%s: framework: watching %s and the Change Lists (every %gs)",
                        collection.id,
                        ", ".join(sorted(state.advertised)) or "no other capability",
                        interval,
                        extra={"collection": collection.id},
                    )
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except Fenced as exc:
                log.warning("%s; another publisher leads now", exc)
                return
            except LogConflict:
                loaded = False
                continue
            except (FetchError, DocumentError, LogUnavailable) as exc:
                delay = min(interval, backoff.next())
                log.warning(
                    "%s: framework check failed (%s); retrying in %.1fs",
                    collection.id,
                    exc,
                    delay,
                    extra={"collection": collection.id},
                )
            await self._sleep(min(FRAMEWORK_MIN_GAP, delay))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, delay - FRAMEWORK_MIN_GAP)):
                    await collection.framework_trigger.wait()

    async def _log_framework(
        self, collection: _Collection, state: FrameworkState, changes: list[FrameworkChange]
    ) -> None:
        """Append a check's framework changes with the state they were found against."""
        assert self.log is not None and collection.framework is not None
        head = collection.framework_head
        records = []
        for i, change in enumerate(changes, start=1):
            change.seq = head + i
            records.append(
                framework.to_record(
                    change, collection=collection.id, capabilitylist=collection.capability_list
                )
            )
        collection.framework_head = await self.log.append(
            framework.stream(collection.id),
            records,
            expected_head=head,
            checkpoint=state.to_json(),
            fence=self._fence,
            max_len=self.config.retention.max_len,
        )
        collection.framework.commit(state)
        for change in changes:
            log.info(
                "%s: framework notification %d: %s",
                collection.id,
                change.seq,
                change.describe(),
                extra={"collection": collection.id, "seq": change.seq},
            )

    async def _maintain(self) -> None:
        """Apply age retention and refresh gauges once a minute."""
        assert self.log is not None
        while not self._stopping.is_set():
            for collection in list(self.collections.values()):
                with contextlib.suppress(LogUnavailable):
                    earliest = await self.log.trim(
                        collection.id, self.config.retention, int(time.time() * 1000)
                    )
                    self.metrics.earliest.labels(collection.id).set(earliest)
                    if collection.framework is not None:
                        await self.log.trim(
                            framework.stream(collection.id),
                            self.config.retention,
                            int(time.time() * 1000),
                        )
            await self._sleep(60.0)

    # -- shutdown -------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop detecting, let transports drain, close everything (SIGTERM path)."""
        self._stopping.set()
        if self._fswatch is not None:
            self._fswatch.close()
        leading, self._leading = self._leading, []
        for task in leading:
            name = task.get_coro().__name__  # type: ignore[union-attr]
            if name in ("_watch", "_watch_framework", "_maintain"):
                task.cancel()
        if self._mqtt is not None:
            with contextlib.suppress(Exception):
                await self._mqtt.stop()
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.stop()
        if self._hub_pusher_task is not None:  # before the topics it hands over go
            self._hub_pusher_task.cancel()
            await asyncio.gather(self._hub_pusher_task, return_exceptions=True)
        await self._stop_websub()
        for task in [*self._tasks, *leading]:
            task.cancel()
        await asyncio.gather(*self._tasks, *leading, return_exceptions=True)
        if self._election is not None:
            await self._election.close()
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
        if self._fetcher is not None:
            await self._fetcher.close()
        if self.log is not None:
            await self.log.close()

    async def wait(self) -> None:
        await self._stopping.wait()


async def run(config: PublisherConfig, *, ready: asyncio.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT; print where it listens; return the exit code."""
    publisher = Publisher(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, publisher._stopping.set)
    try:
        await publisher.start()
    except RsNotifyError as exc:
        log.error("cannot start: %s", exc)
        await publisher.stop()
        return 1
    parts = [f"{len(publisher.collections)} collection(s)"]
    if publisher.ws_port is not None:
        parts.append(f"ws://{config.ws.rpartition(':')[0] or '127.0.0.1'}:{publisher.ws_port}/")  # type: ignore[union-attr]
    if publisher.websub is not None:
        parts.append(f"websub {publisher.websub.url}")
    if publisher.metrics_port is not None:
        parts.append(f"metrics http://{config.metrics_host}:{publisher.metrics_port}/metrics")
    print(f"rsnotify publish: running: {'; '.join(parts)}", flush=True)
    for cid, collection in publisher.collections.items():
        print(f"rsnotify publish: collection {cid} {collection.capability_list}", flush=True)
        for href in publisher.hub_links(cid):
            link = f'<rs:ln rel="urn:x-rsnotify:channel" href="{href}"/>'
            print(f"rsnotify publish:   advertise {link}", flush=True)
        websub = publisher.websub_advertisement(cid) or publisher.planned_websub(cid)
        channels = [
            ("change-notification", websub),
            ("framework-notification", publisher.framework_advertisement(cid)),
        ]
        for capability, channel in channels:
            if channel is not None:
                print(
                    f"rsnotify publish:   advertise <url><loc>{channel[0]}</loc>"
                    f'<rs:ln rel="hub" href="{channel[1]}"/>'
                    f'<rs:md capability="{capability}"/></url>',
                    flush=True,
                )
    if config.write_hubs:
        if not publisher._is_directory():
            print("rsnotify publish: --write-hubs needs a local directory SOURCE", flush=True)
        else:
            publisher.write_hub_links()
    if ready is not None:
        ready.set()
    await publisher.wait()
    await publisher.stop()
    return 0
