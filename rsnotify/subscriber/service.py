"""The subscriber process: discovery, state, mirror, channels and one engine per collection.

Start-up order matters and is the same every time (see :mod:`.sync`):
discover the Source and its channels, take the state lock, open channels
(so notifications start queueing), then per collection baseline if needed,
catch up from the Change List Index, and consume the queue live.

Why one module of ~520 lines: it is the composition root, and the order
above is its content: each step needs what the one before opened (the lock
before the mirror, channels before catch-up, engines before telemetry), and
stopping undoes them in reverse.  What each step does lives elsewhere:
discovery in :mod:`rsnotify.discovery`, channels in :mod:`.channels`, the
engine in :mod:`.sync`, the mirror in :mod:`.mirror`, metrics in :mod:`.telemetry`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shlex
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .. import discovery, sitemap, w3cdt
from ..backoff import Backoff
from ..changes import listparse
from ..changes.access import HttpAccess
from ..changes.snapshotblobs import DirectoryBlobs
from ..changes.snapshotwatch import SnapshotWatcher
from ..changes.watcher import ChangeWatcher, CollectionWatcher
from ..collection import collection_id
from ..envelope import Notification
from ..errors import RsNotifyError, listening
from ..fetch import Fetcher, origin_of
from ..httppolicy import HttpPolicy
from ..metrics import metrics_app, serve
from ..model import Capability
from ..tracker import Checkpoint
from ..transport.topics import prefix_of
from .applier import Applier, Hooks
from .baseline import BaselineSummary, baseline
from .cursor import CursorStore, StateLock
from .gaps import GapDetector
from .mirror import Mirror
from .ownership import MirrorLock, MirrorRefused, claim
from .pushhealth import DEFAULT_GRACE, DEFAULT_INTERVAL
from .resources import LOG_ROWS, ResourceStore
from .sync import CollectionSync
from .telemetry import SubscriberMetrics
from .trust import DEFAULT_MAX_SKEW

if TYPE_CHECKING:  # the types only: each is imported when a channel or --redis asks for it
    from aiohttp import web

    from .channels import MqttChannel, Sink, WebSocketChannel
    from .redis_cursor import RedisCursorStore
    from .websub import CallbackServer, WebSubChannel

log = logging.getLogger("rsnotify.subscribe")

# How long the start-up catch-ups wait for the channels' first subscriptions.
# Only an optimisation: a subscription established after a catch-up began is
# a gap that one more catch-up covers (GapDetector.on_connect), so a broker
# slower than this costs a second walk, never a change.
FIRST_SUBSCRIPTION_WAIT = 5.0


@dataclass(slots=True)
class SubscriberConfig:
    source: str
    into: str
    adopt: bool = False  # take over a non-empty --into rsnotify did not make (see .ownership)
    state: str | None = None
    via: str | None = None  # mqtt://... or ws://...; default: the advertised hub
    collections: Sequence[str] = ()
    topic_prefix: str | None = None
    concurrency: int = 16
    metadata_only: bool = False
    spare_inodes: bool = False  # --spare-inodes: reuse retired inodes (rsnotify.spare)
    # --parse-processes: Change Lists parsed in worker processes (rsnotify.changes.listparse);
    # None: one where there is a second core.  For this whole process.
    parse_processes: int | None = None
    once: bool = False
    heartbeat_timeout: float = 30.0
    safety_poll: float = 300.0
    secrets: dict[str, bytes] | None = None  # key id -> secret; None: accept unsigned
    max_skew: float = DEFAULT_MAX_SKEW  # seconds a change may be dated ahead of this clock
    degraded_after: float = DEFAULT_GRACE  # push down this long: poll the Change Lists
    degraded_poll: float = DEFAULT_INTERVAL  # ... every this many seconds (see .pushhealth)
    # A collection without Change Lists: its Resource List is re-read this often
    # without push (rsnotify.changes.snapshotwatch); a full list can be large.
    resourcelist_poll: float = 300.0
    # Rules of the specification relaxed reading the Source (--lenient): by default
    # only entry order, since resync-built Sources write Change Lists out of order.
    lenient: frozenset[sitemap.Lenient] = frozenset({sitemap.Lenient.ORDER})
    ws_token: str | None = None
    allow_origins: Sequence[str] = ()
    on_change: str | None = None
    # --apply-log-rows: the newest apply-log rows kept; 0 keeps every row (.resources).
    apply_log_rows: int = LOG_ROWS
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    name: str | None = None  # subscriber name in telemetry
    report: str | None = None  # redis:// URL: latency samples and status for the dashboard
    redis: str | None = None  # redis:// URL: keep the cursors there instead of SQLite
    mqtt_tls_ca: str | None = None
    mqtt_tls_insecure: bool = False
    mqtt_protocol: str = "auto"  # "auto" (5, falling back to 3.1.1), "5" or "3.1.1"
    ws_tls_ca: str | None = None  # CA file for wss:// gateways (None: the system store)
    retries: int = 5
    callback: str | None = None  # --via websub: this Destination's callback base URL
    callback_listen: str | None = None  # HOST:PORT to bind, if not the callback's own
    websub_lease: int | None = None  # hub.lease_seconds to ask for (None: the hub's default)
    # Credentials, CA, proxy, pace and deadline of every request to the Source
    # and its mirrors (rsnotify.httppolicy); credentials go to the Source's origin only.
    http: HttpPolicy = field(default_factory=HttpPolicy)


def default_state_dir(into: str) -> Path:
    """``<DIR's parent>/.<DIR's name>.rsnotify``: beside the mirror, never inside it."""
    target = Path(into).resolve()
    return target.parent / f".{target.name}.rsnotify"


class _CommandHooks(Hooks):
    """``--on-change CMD``: run a shell command per applied change, with the change in env."""

    def __init__(self, command: str) -> None:
        super().__init__(self._run, self._run, self._run)
        self.argv = shlex.split(command)

    # Any: the change as submitted to the Applier (an Entry, a Notification's
    # change, any object with a loc), read by attribute as rules.read_change does.
    async def _run(self, change: Any, path: Path) -> None:
        env = dict(os.environ)
        env.update(
            RSNOTIFY_CHANGE=str(getattr(change, "change", "")),
            RSNOTIFY_LOC=str(change.loc),
            RSNOTIFY_PATH=str(path),
            RSNOTIFY_DATETIME=w3cdt.format(getattr(change, "datetime", None) or w3cdt.now()),
            RSNOTIFY_SEQ=str(getattr(change, "seq", "") or ""),
        )
        process = await asyncio.create_subprocess_exec(*self.argv, env=env)
        code = await process.wait()
        if code != 0:
            log.warning("--on-change exited %d for %s", code, change.loc)


def channel_kind(via: str) -> str:
    scheme = urlsplit(via).scheme
    if scheme in ("mqtt", "mqtts"):
        return "mqtt"
    if scheme in ("ws", "wss"):
        return "ws"
    if via == "websub" or scheme in ("http", "https"):
        return "websub"  # a WebSub hub (rsnotify.subscriber.websub)
    raise RsNotifyError(
        f"{via}: a channel must be mqtt://, mqtts://, ws://, wss://, websub or a WebSub hub's "
        "http(s):// URL"
    )


def _applied_seq_of(engine: CollectionSync) -> Callable[[], int | None]:
    """Where a WebSocket channel resumes from: the engine's last applied seq, read
    at each (re)connect, so a reconnect does not replay what was applied meanwhile."""
    return lambda: engine.applied_seq


class Subscriber:
    def __init__(
        self, config: SubscriberConfig, *, on_live: Callable[[], None] | None = None
    ) -> None:
        self.config = config
        listparse.configure(
            listparse.default_processes()
            if config.parse_processes is None
            else config.parse_processes
        )
        # Called each time a collection goes live (its baseline and catch-up done):
        # the command's rsnotify.runtime.settle_gc.
        self.on_live = on_live
        self.state_dir = Path(config.state) if config.state else default_state_dir(config.into)
        self.metrics = SubscriberMetrics(config.name or Path(config.into).name)
        self.engines: dict[str, CollectionSync] = {}
        self._lock = StateLock(self.state_dir)
        self._mirror_lock: MirrorLock | None = None
        self._mirror: Mirror | None = None
        self._fetcher: Fetcher | None = None
        self._cursors: CursorStore | RedisCursorStore | None = None
        self._resources: ResourceStore | None = None
        self._channels: list[MqttChannel | WebSocketChannel | WebSubChannel] = []
        # collection -> the channels that push its changes (an MQTT channel
        # serves every collection it subscribes for): whose first
        # subscriptions that collection's start-up catch-up waits for.
        self._channels_of: dict[str, list[MqttChannel | WebSocketChannel | WebSubChannel]] = {}
        self._callbacks: CallbackServer | None = None  # when --via websub
        self._tasks: list[asyncio.Task[None]] = []
        self._event_tasks: set[asyncio.Task[None]] = set()
        self._metrics_runner: web.AppRunner | None = None
        self.metrics_port: int | None = None
        self.stopping = asyncio.Event()

    async def _discover(self) -> discovery.SourceInfo:
        assert self._fetcher is not None
        backoff = Backoff(maximum=10.0)
        while True:
            try:
                return await discovery.discover(self.config.source, self._fetcher)
            except RsNotifyError as exc:
                if self.config.once or self.stopping.is_set():
                    raise
                delay = backoff.next()
                log.warning("discovery failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)

    def _add_channel(
        self, channel: MqttChannel | WebSocketChannel | WebSubChannel, *collections: str
    ) -> None:
        self._channels.append(channel)
        for cid in collections:
            self._channels_of.setdefault(cid, []).append(channel)

    def _hub_for(self, cap: discovery.CapabilityListInfo) -> str | None:
        """The channel to use: --via; else WebSub when advertised and --callback is given;
        else an advertised rsnotify channel (WebSocket first: it replays); else WebSub."""
        if self.config.via:
            return self.config.via
        if cap.websub and self.config.callback:
            return "websub"
        ranked = sorted(cap.channels, key=lambda href: urlsplit(href).scheme not in ("ws", "wss"))
        return ranked[0] if ranked else None

    async def start(self) -> None:
        config = self.config
        # The mirror first: it refuses / and foreign directories before anything is made.
        self._mirror_lock = claim(config.into, self.state_dir, adopt=config.adopt)
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()
        except OSError as exc:
            raise RsNotifyError(f"state directory {self.state_dir}: {exc.strerror}") from None
        # With --spare-inodes, retired inodes wait in the state directory,
        # beside the mirror and (by default) on its filesystem, never inside
        # the mirror itself: a web server publishing it must not serve old
        # versions.  Without, files are replaced by plain renames.
        spare_dir = self.state_dir / "spare" if config.spare_inodes else None
        mirror = self._mirror = Mirror(config.into, spare_dir=spare_dir)
        removed = mirror.cleanup_temp()
        if removed:
            log.info("removed %d temporary file(s) left by an interrupted write", removed)
        if config.redis:
            # Imported here: redis' client is a tenth of a second of start-up
            # that a Destination without --redis (and a --once catch-up) never needs.
            from .redis_cursor import RedisCursorStore, destination_id

            self._cursors = RedisCursorStore(config.redis, destination_id(config.into, config.name))
        else:
            self._cursors = CursorStore(self.state_dir / "cursor.sqlite3")
        self._resources = ResourceStore(
            self.state_dir / "resources.sqlite3", log_rows=config.apply_log_rows or None
        )
        # One keep-alive connection per transfer slot: fewer would quietly cap
        # --concurrency (the pool, not the semaphore, would be the limit).
        self._fetcher = Fetcher(
            limit_per_host=max(8, config.concurrency),
            policy=config.http.with_credential_origins([config.source]),
        )
        if config.metrics_port is not None:
            with listening("metrics", config.metrics_host, config.metrics_port):
                self._metrics_runner, self.metrics_port = await serve(
                    metrics_app(self.metrics.registry), config.metrics_host, config.metrics_port
                )
        info = await self._discover()
        allowed = {origin_of(config.source)} | {origin_of(o) for o in config.allow_origins}
        hooks = _CommandHooks(config.on_change) if config.on_change else None
        applier = Applier(
            mirror,
            self._resources,
            self._fetcher,
            allowed_origins=allowed,
            concurrency=config.concurrency,
            metadata_only=config.metadata_only,
            hooks=hooks,
            retries=config.retries,
            max_skew=config.max_skew,
        )
        mqtt_sinks: dict[str, Sink] = {}
        mqtt_url: str | None = None
        wanted = set(config.collections)
        for cap in info.capability_lists:
            cid = collection_id(cap.url)
            if wanted and cap.url not in wanted and cid not in wanted:
                continue
            watcher = self._watcher_for(cap, cid)
            if watcher is None:
                log.warning("%s offers neither a Change List nor a Resource List; skipped", cap.url)
                continue
            # Without Change Lists every walk re-reads a whole list: polled politely.
            poll_every = (
                config.resourcelist_poll
                if isinstance(watcher, SnapshotWatcher)
                else config.degraded_poll
            )
            engine = CollectionSync(
                collection=cid,
                capability_list=cap.url,
                watcher=watcher,
                applier=applier,
                cursors=self._cursors,
                detector=GapDetector(
                    heartbeat_timeout=config.heartbeat_timeout,
                    safety_interval=config.safety_poll,
                    now=time.monotonic(),
                ),
                keys=config.secrets,
                on_applied=self._telemetry(cid),
                on_event=self._event_recorder(cid),
                resourcelist_url=cap.capabilities.get(Capability.RESOURCELIST),
                resourcedump_url=cap.capabilities.get(Capability.RESOURCEDUMP),
                changedump_url=cap.capabilities.get(Capability.CHANGEDUMP),
                workdir=self.state_dir,
                max_skew=config.max_skew,
                degraded_after=config.degraded_after,
                degraded_poll=poll_every,
            )
            self.engines[cid] = engine
            if config.once:
                continue
            hub = self._hub_for(cap)
            if cap.framework and config.callback:  # Framework Notification: a channel of its own
                self._add_channel(self._websub_channel(cap, cid, "websub", engine, True), cid)
                engine.framework_polls = hub is None  # then it is the only push this engine gets
            if hub is None:
                what = (
                    "the Resource List"
                    if isinstance(watcher, SnapshotWatcher)
                    else "the Change Lists"
                )
                every = f"polling {what} every {poll_every:g}s"
                if cap.websub:
                    log.warning(
                        "%s advertises a WebSub channel (Change Notification section 5): "
                        "give --callback URL to receive it; %s",
                        cap.url,
                        every,
                    )
                else:
                    log.warning("%s advertises no push channel: %s (give --via)", cap.url, every)
                engine.without_push()
                continue
            if channel_kind(hub) == "websub":
                self._add_channel(self._websub_channel(cap, cid, hub, engine), cid)
                self.metrics.transport.labels(cid).info({"transport": "websub"})
            elif channel_kind(hub) == "ws":
                # Imported only when there is a channel: websockets and paho are
                # a tenth of start-up, which a --once catch-up without push pays.
                from .channels import WebSocketChannel, client_tls_context

                ws_channel = WebSocketChannel(
                    hub,
                    cid,
                    engine.offer,
                    since=_applied_seq_of(engine),
                    token=config.ws_token,
                    ssl_context=client_tls_context(config.ws_tls_ca) if config.ws_tls_ca else None,
                )
                engine.replay = ws_channel.replay
                self._add_channel(ws_channel, cid)
                self.metrics.transport.labels(cid).info({"transport": "websocket"})
            else:
                mqtt_url = mqtt_url or hub
                mqtt_sinks[cid] = engine.offer
                self.metrics.transport.labels(cid).info({"transport": "mqtt"})
        if not self.engines:
            raise RsNotifyError(
                f"{config.source}: no Capability List with a Change List or a Resource List "
                "to follow"
            )
        for engine in self.engines.values():
            engine.sole_collection = len(self.engines) == 1
        if mqtt_sinks and mqtt_url is not None:
            broker = urlsplit(mqtt_url)
            prefix = config.topic_prefix
            if prefix is None:  # from the advertised topic: <prefix>/<level>/changes
                prefix = prefix_of(broker.path) or "resourcesync"
            url = f"{broker.scheme}://{broker.netloc}"
            # One persistent session per mirror.  Keep the id's tail when shortening
            # it to 64 characters: the tail (path end and digest) tells mirrors apart.
            mirror_id = collection_id(str(Path(config.into).resolve()))
            client_id = f"rsnotify-sub-{mirror_id[-(64 - len('rsnotify-sub-')) :]}"
            from .channels import MqttChannel  # imported only when there is a channel

            self._add_channel(
                MqttChannel(
                    url,
                    mqtt_sinks,
                    topic_prefix=prefix,
                    client_id=client_id,
                    tls_ca=config.mqtt_tls_ca,
                    tls_insecure=config.mqtt_tls_insecure,
                    protocol=config.mqtt_protocol,
                ),
                *mqtt_sinks,
            )
        if self._channels and not config.secrets:
            self._warn_unsigned(mqtt_url)
        # Channels first, so nothing published during the catch-up is missed
        # (each engine waits for its own channels' subscriptions before its catch-up).
        for channel in self._channels:
            channel.start()
        if config.report:  # telemetry for `rsnotify dashboard` (see rsnotify.report)
            from ..report import SubscriberReporter  # imports redis: only when asked for

            reporter = SubscriberReporter(config.report, self).attach()
            self._tasks.append(asyncio.create_task(reporter.run()))

    def _watcher_for(self, cap: discovery.CapabilityListInfo, cid: str) -> ChangeWatcher | None:
        """How this collection's changes are found: its Change Lists, else its Resource List.

        A Capability List may offer no Change List at all (many Sources
        publish only a Resource List): then successive Resource List
        snapshots are compared (:mod:`rsnotify.changes.snapshotwatch`),
        their maps kept in the state directory.
        """
        assert self._fetcher is not None
        access = HttpAccess(self._fetcher)
        limits = sitemap.Limits(lenient=self.config.lenient)
        changelist = cap.capabilities.get(Capability.CHANGELIST)
        if changelist is not None:
            return CollectionWatcher(
                access=access,
                collection=cid,
                capability_list=cap.url,
                changelist_url=changelist,
                checkpoint=Checkpoint(started=True),
                limits=limits,
                stop_at_holes=True,  # a Destination re-baselines (CollectionSync._rebaseline)
            )
        resourcelist = cap.capabilities.get(Capability.RESOURCELIST)
        if resourcelist is None:
            return None
        log.info(
            "%s offers no Change List: following its Resource List %s by comparing snapshots",
            cap.url,
            resourcelist,
        )
        return SnapshotWatcher(
            access=access,
            collection=cid,
            capability_list=cap.url,
            resourcelist_url=resourcelist,
            checkpoint=Checkpoint(started=True),
            blobs=DirectoryBlobs(self.state_dir / "snapshots" / cid),
            limits=limits,
            stop_at_holes=True,
        )

    def _warn_unsigned(self, mqtt_url: str | None) -> None:
        """Say once what an unsigned channel means for this Destination (see .trust)."""
        anonymous = mqtt_url is not None and not urlsplit(mqtt_url).username
        where = (
            "the broker takes anonymous clients, so anyone who reaches it may be able to "
            "publish notifications"
            if anonymous
            else "anyone who can publish on the channel can send notifications"
        )
        log.warning(
            "push notifications are not signed (no --secret): %s. They are used as hints "
            "only (resources fetched from the Source, deletions confirmed there, the Change "
            "List position moved only by reading the Source); give --secret to trust push "
            "(see SECURITY.md)",
            where,
        )

    def _websub_channel(
        self,
        cap: discovery.CapabilityListInfo,
        cid: str,
        via: str,
        engine: CollectionSync,
        framework: bool = False,
    ) -> WebSubChannel:
        """A WebSub subscription for one collection's change (or framework) topic
        (wiring; see :mod:`.websub`)."""
        from .websub import CallbackServer, WebSubChannel, load_secret, websub_target

        if not self.config.callback:
            raise RsNotifyError("--via websub needs --callback http://HOST:PORT/PATH")
        if self._callbacks is None:
            self._callbacks = CallbackServer(
                self.config.callback, listen=self.config.callback_listen
            )
        if framework:  # as advertised (Framework Notification section 5)
            topic, hub = cap.framework[0]
        else:
            hub, topic = websub_target(cap, cid, via)
        return WebSubChannel(
            self._callbacks,
            hub=hub,
            topic=topic,
            collection=cid,
            sink=engine.offer,
            secret=load_secret(self.state_dir),
            lease_seconds=self.config.websub_lease,
            framework_topic=framework,
        )

    def _telemetry(self, collection: str) -> Callable[[Notification, float, float], None]:
        def on_applied(n: Notification, received: float, applied: float) -> None:
            self.metrics.observe(collection, n, received, applied)

        return on_applied

    def _event_recorder(self, collection: str) -> Callable[[str, str, dict[str, Any]], None]:
        def on_event(kind: str, detail: str, data: dict[str, Any]) -> None:
            self.metrics.event(collection, kind)
            if self._cursors is not None:
                task = asyncio.get_running_loop().create_task(
                    self._cursors.event(collection, kind, detail)
                )
                # Kept until done (a task nobody references may be collected
                # mid-flight), then dropped: a long run records many events.
                self._event_tasks.add(task)
                task.add_done_callback(self._event_tasks.discard)

        return on_event

    async def _baseline_for(self, engine: CollectionSync) -> BaselineSummary | None:
        url, dump = engine.resourcelist_url, engine.resourcedump_url
        if url is None and dump is None:
            log.warning("%s: no Resource List; starting from the Change Lists", engine.collection)
            return None
        assert self._fetcher is not None
        summary = await baseline(
            self._fetcher,
            engine.applier,
            url,
            collection=engine.collection,
            resourcedump_url=dump,
            workdir=self.state_dir,
            limits=sitemap.Limits(lenient=self.config.lenient),
        )
        print(f"rsnotify subscribe: {engine.collection}: {summary.line()}", flush=True)
        return summary

    async def _run_engine(self, engine: CollectionSync) -> None:
        """Run one collection; after a local failure, restart it from the durable cursor."""
        await self._first_subscriptions(engine)
        backoff = Backoff(maximum=30.0)
        while True:
            try:
                await engine.start(functools.partial(self._baseline_for, engine))
                self.metrics.state(engine.collection, "live")
                print(f"rsnotify subscribe: {engine.collection}: live", flush=True)
                if self.on_live is not None:
                    self.on_live()
                await engine.run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = backoff.next()
                log.error(
                    "%s: %s; restarting from the saved cursor in %.1fs",
                    engine.collection,
                    exc,
                    delay,
                    exc_info=not isinstance(exc, RsNotifyError),
                )
                await engine.close()
                engine.failure = None
                await asyncio.sleep(delay)

    async def run_once(self) -> int:
        """Catch every collection up to the Source's current state, then return."""
        for engine in self.engines.values():
            await engine.start(functools.partial(self._baseline_for, engine))
            await engine.close()
            print(
                f"rsnotify subscribe: {engine.collection}: up to date "
                f"({engine.stats.applied} applied, {engine.stats.failed} failed)",
                flush=True,
            )
        # Non-zero for a mirror known to be incomplete: failed changes, or a hole
        # in the Change Lists that no new baseline could close.
        return 1 if any(e.stats.failed or e.incomplete for e in self.engines.values()) else 0

    async def run_forever(self) -> None:
        for engine in self.engines.values():
            self._tasks.append(asyncio.create_task(self._run_engine(engine)))
        await self.stopping.wait()

    async def _first_subscriptions(self, engine: CollectionSync) -> None:
        """Wait until the first subscription attempts of the channels that push
        ``engine``'s collection have an outcome.

        The engine's start-up catch-up covers what was published before it
        began, push what comes after the subscription: a catch-up that ran
        before the broker acknowledged the subscription would leave the
        changes in between to the safety poll.  Attempts that fail (refused,
        unreachable) end the wait too: the engine polls.  Only this engine's
        channels: a collection without push, or with a WebSocket channel,
        does not wait for another collection's broker.
        """
        channels = self._channels_of.get(engine.collection, [])
        if not channels:
            return
        timeout = FIRST_SUBSCRIPTION_WAIT
        engine.stats.state = "subscribing"
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*(channel.first_attempt.wait() for channel in channels))
        except TimeoutError:
            log.warning(
                "%s: push channel not subscribed after %gs; catching up now, "
                "and once more when it is",
                engine.collection,
                timeout,
            )
        else:
            log.debug(
                "%s: channel(s) subscribed in %.3fs",
                engine.collection,
                time.monotonic() - started,
            )

    async def stop(self) -> None:
        self.stopping.set()
        if self._cursors is not None and not isinstance(self._cursors, CursorStore):
            # The Redis cursor store (imported only with --redis).
            self._cursors.begin_close()  # a Redis that stays away must not hold the exit
        for channel in self._channels:
            with contextlib.suppress(Exception):
                await channel.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for engine in self.engines.values():
            await engine.close()
        if self._event_tasks:  # the last events, before their store closes
            await asyncio.gather(*self._event_tasks, return_exceptions=True)
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
        if self._fetcher is not None:
            await self._fetcher.close()
        if self._cursors is not None:
            await self._cursors.close()
        if self._resources is not None:
            await self._resources.close()
        if self._mirror is not None:  # its writer threads, once the last write is done
            await self._mirror.settle()
            self._mirror.close()
        self._lock.release()
        if self._mirror_lock is not None:
            self._mirror_lock.release()


async def run(config: SubscriberConfig, *, on_live: Callable[[], None] | None = None) -> int:
    subscriber = Subscriber(config, on_live=on_live)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, subscriber.stopping.set)
    try:
        await subscriber.start()
        names = ", ".join(subscriber.engines)
        print(f"rsnotify subscribe: following {names} into {config.into}", flush=True)
        if subscriber.metrics_port is not None:
            print(
                f"rsnotify subscribe: metrics http://{config.metrics_host}:"
                f"{subscriber.metrics_port}/metrics",
                flush=True,
            )
        if config.once:
            return await subscriber.run_once()
        await subscriber.run_forever()
        return 0
    except RsNotifyError as exc:
        log.error("%s", exc)
        print(f"rsnotify subscribe: {exc}", flush=True)
        return 2 if isinstance(exc, MirrorRefused) else 1  # 2: not restarted by systemd
    finally:
        await subscriber.stop()
