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

from .. import discovery, w3cdt
from ..backoff import Backoff
from ..collection import collection_id
from ..envelope import Notification, to_json
from ..errors import DocumentError, FetchError, RsNotifyError, listening
from ..fetch import Fetcher
from ..log import Fenced, LogConflict, LogUnavailable, NotificationLog, Retention, open_log
from ..log.tail_cache import TailCache
from ..metrics import PublisherMetrics, metrics_app, serve
from ..model import Capability
from ..outbound import Renderer, Signer
from ..report import PublisherReporter
from ..tracker import Checkpoint, Detection
from . import fswatch
from .access import DirectoryAccess, DocumentAccess, HttpAccess
from .watcher import CollectionWatcher

log = logging.getLogger("rsnotify.publish")
T = TypeVar("T")

# New entries per detection pass: a 50,000-entry list is parsed, logged and
# pushed 2,000 entries at a time, so the first notifications leave ~15 ms
# after the read instead of after the whole parse (~0.7 s), and the event
# loop (PUBACKs, WebSocket clients) is never held longer than that.
DETECT_CHUNK = 2_000
COLLECTION_REFRESH = 5.0  # seconds between reads of the log's collection list (--mqtt-only)


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
    write_hubs: bool = False  # directory SOURCE: add the hub links to the Capability Lists
    report: str | None = None  # redis:// URL: heartbeat and heads for `rsnotify dashboard`
    ha: bool = False  # campaign for leadership through Redis; only the leader publishes
    ha_group: str | None = None  # publishers of one Source share a group (default: from SOURCE)
    lease_ttl: float = 3.0
    websub: str | None = None  # HOST:PORT of the WebSub hub (rsnotify.transport.websub)
    websub_url: str | None = None  # the hub's public URL, if not http://HOST:PORT/
    websub_lease: int | None = None  # default lease granted (seconds)
    websub_retry_max: float = 30.0  # longest wait between retries of a failing callback
    ws_max_per_address: int | None = None  # connections per client address (None: the default)
    redis_wait: float = 60.0  # seconds start-up waits for the log's Redis before exiting


@dataclass(slots=True)
class _Collection:
    id: str
    capability_list: str
    watcher: CollectionWatcher
    head: int = 0
    trigger: asyncio.Event = field(default_factory=asyncio.Event)


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
        self.websub: Any = None  # the WebSubHub, when --websub
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
            )
            self.collections[cid] = _Collection(cid, cap.url, watcher, head=head)
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
        self._fetcher = Fetcher()
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

    async def _start_leading(self) -> None:
        """Detection, the MQTT pusher and maintenance: what only the leader runs."""
        self.is_leader = True
        self._start_pusher()
        if self.config.mqtt_only:
            self._leading.append(asyncio.create_task(self._follow_collections()))
            return
        for collection in self.collections.values():
            self._leading.append(asyncio.create_task(self._watch(collection)))
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
        if config.websub:
            await self._start_websub()

    async def _start_websub(self) -> None:
        """The WebSub hub serves from the log too (subscriptions: Redis or --state-dir)."""
        from ..transport.websub import WebSubHub
        from ..transport.websubproto import LeasePolicy
        from ..transport.websubstore import open_store

        config = self.config
        assert self.log is not None and config.websub is not None
        if config.ha or config.ws_only:
            # Every instance would load the same subscriptions and deliver them all.
            raise RsNotifyError("--websub runs one hub per log: not with --ha or --ws-only")
        host, _, port = config.websub.rpartition(":")
        lease = LeasePolicy()
        if config.websub_lease:
            lease = LeasePolicy(default=config.websub_lease)
        self.websub = WebSubHub(
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
        )
        with listening("the WebSub hub", self.websub.host, self.websub.port):
            await self.websub.start()

    def websub_advertisement(self, collection: str) -> tuple[str, str] | None:
        """(topic, hub) for the Capability List's changelist-notification entry, if --websub."""
        if self.websub is None:
            return None
        return self.websub.topic(collection), self.websub.url

    def hub_links(self, collection: str) -> list[str]:
        """The ``rs:ln rel="hub"`` hrefs Destinations need to find this collection's channels."""
        hrefs = []
        config = self.config
        broker_url = config.mqtt or config.mqtt_hub
        if broker_url:
            from ..transport.mqtturl import parse_broker_url

            broker = parse_broker_url(broker_url)
            host = f"[{broker.host}]" if ":" in broker.host else broker.host
            hrefs.append(
                f"{broker.scheme}://{host}:{broker.port}/{config.topic_prefix}/{collection}/changes"
            )
        if config.ws and self.ws_port is not None:
            host = config.ws.rpartition(":")[0] or "127.0.0.1"
            scheme = "wss" if config.ws_cert else "ws"
            hrefs.append(f"{scheme}://{host}:{self.ws_port}/{collection}")
        return hrefs

    def write_hub_links(self) -> None:
        """Add the hub links to each Capability List file of a directory Source (atomically)."""
        from .. import sitemap
        from ..envelope import NOTIFICATION_CAPABILITY
        from ..model import Entry, Link

        assert isinstance(self._access, DirectoryAccess)
        for cid, collection in self.collections.items():
            path = self._access.local_path(collection.capability_list)
            document = sitemap.parse(path)
            known = {ln.href for ln in document.links if ln.rel == "hub"}
            new = [Link(rel="hub", href=h) for h in self.hub_links(cid) if h not in known]
            websub = self.websub_advertisement(cid)
            if websub is not None and not any(
                e.capability == NOTIFICATION_CAPABILITY and e.loc == websub[0]
                for e in document.entries
            ):
                topic, hub = websub
                document.entries.append(
                    Entry(
                        loc=topic,
                        capability=NOTIFICATION_CAPABILITY,
                        links=[Link(rel="hub", href=hub)],
                    )
                )
            elif not new:
                continue
            document.links.extend(new)
            temp = path.with_name(f".{path.name}.rsnotify-tmp")
            with open(temp, "wb") as handle:
                sitemap.write(document, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
            log.info("added %d hub link(s) to %s", len(new), path)

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
                result = await watcher.poll(DETECT_CHUNK)
                detected = w3cdt.now()
                self.metrics.bytes_read.labels(collection.id).inc(result.bytes_read)
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
            payloads = [
                to_json(
                    Notification.from_entry(
                        entry,
                        collection=collection.id,
                        seq=head + i,
                        capabilitylist=collection.capability_list,
                        changelist=found.changelist,
                        detected=detected,
                    )
                )
                for i, entry in enumerate(entries, start=1)
            ]
            collection.head = await self.log.append(
                collection.id,
                payloads,
                expected_head=head,
                checkpoint=checkpoint.to_json(),
                fence=self._fence,
                max_len=self.config.retention.max_len,
            )
            watcher.commit(checkpoint)
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
            await self._sleep(60.0)

    # -- shutdown -------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop detecting, let transports drain, close everything (SIGTERM path)."""
        self._stopping.set()
        if self._fswatch is not None:
            self._fswatch.close()
        leading, self._leading = self._leading, []
        for task in leading:
            if task.get_coro().__name__ in ("_watch", "_maintain"):  # type: ignore[union-attr]
                task.cancel()
        if self._mqtt is not None:
            with contextlib.suppress(Exception):
                await self._mqtt.stop()
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.stop()
        if self.websub is not None:
            with contextlib.suppress(Exception):
                await self.websub.stop()
            with contextlib.suppress(Exception):
                await self.websub.store.close()
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
            print(f'rsnotify publish:   advertise <rs:ln rel="hub" href="{href}"/>', flush=True)
        websub = publisher.websub_advertisement(cid)
        if websub is not None:
            print(
                f"rsnotify publish:   advertise <url><loc>{websub[0]}</loc>"
                f'<rs:md capability="changelist-notification"/>'
                f'<rs:ln rel="hub" href="{websub[1]}"/></url>',
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
