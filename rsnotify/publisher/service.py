"""The publisher process, composed: its role, the log, detection, transports, metrics.

The pieces, each in its own module:

* :mod:`.config` -- the options and the process's validated :class:`Role`;
* :mod:`.startup` -- discovery and the collections to publish;
* :mod:`.sequencer` -- sequence numbers, appended to the log with the
  checkpoint (the order of operations is in its docstring);
* :mod:`.detection` -- the detection loops of each collection;
* :mod:`.transports` -- MQTT, WebSocket and WebSub behind one start/stop
  protocol;
* :mod:`.advertisement` and :mod:`.console` -- what to advertise, written
  into a directory Source's Capability Lists or printed.

This module only wires them: what runs on every instance (the WebSocket
gateway; the WebSub hub without ``--ha``), what runs on the leader alone (a
:class:`LeaderTerm`: detection, the MQTT push, the hand-over to another hub; the
WebSub hub with ``--ha``), and the order things stop in.  Everything that
can fail transiently (the Source, Redis, the broker) is retried with backoff
and jitter; nothing here exits on a network error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sqlite3
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..backoff import Backoff
from ..changes.access import DirectoryAccess, DocumentAccess, HttpAccess
from ..changes.snapshotblobs import BlobStore
from ..collection import collection_id
from ..errors import RsNotifyError, listening
from ..fetch import Fetcher
from ..log import NotificationLog, open_log
from ..log.tail_cache import TailCache
from ..metrics import PublisherMetrics, metrics_app, serve
from ..outbound import Renderer, Signer
from ..report import PublisherReporter
from . import fswatch
from .advertisement import Advertisement, write_capability_lists
from .changelistwriter import ChangeListWriter, advice_lines, prepare_directory
from .config import PublisherConfig, Role, role_of
from .console import PREFIX, running_lines, say
from .detection import DetectionLoop
from .sequencer import CollectionState, Sequencer
from .startup import is_directory, open_collections
from .tasks import TaskGroup, pause
from .transports import (
    Transport,
    WebSubTransport,
    follow_collections,
    hub_push_transport,
    mqtt_transport,
    websub_transport,
    ws_transport,
)

if TYPE_CHECKING:
    from aiohttp import web

    from ..redisurl import Client
    from ..transport.websub import WebSubHub
    from .leader import LeaderElection, Leadership

__all__ = ["Publisher", "PublisherConfig", "Role", "run"]

log = logging.getLogger("rsnotify.publish")


async def _stop_all(transports: list[Transport]) -> None:
    """Stop transports in the reverse of the order they started (emptying the list)."""
    while transports:
        transport = transports.pop()
        with contextlib.suppress(Exception):
            await transport.stop()


class LeaderTerm:
    """The leader's work for one term (the whole run without ``--ha``).

    Detection stops first, so nothing new is logged while the transports
    drain; the transports' own loops go last.
    """

    def __init__(self) -> None:
        self.detection = TaskGroup()  # detection loops, retention, --mqtt-only's collection list
        self.tasks = TaskGroup()  # the transports' loops (and --ha's WebSub start-up)
        self.transports: list[Transport] = []

    async def start(self, transport: Transport) -> None:
        await transport.start(self.tasks)
        self.transports.append(transport)

    async def stop(self, *, drain: bool) -> None:
        """End the term; ``drain``: let the MQTT pusher wait for its PUBACKs (a clean stop)."""
        await self.detection.cancel()
        if not drain:  # deposed: another publisher leads, stop pushing at once
            await self.tasks.cancel()
        await _stop_all(self.transports)
        await self.tasks.cancel()
        await _stop_all(self.transports)  # started by a task while the others stopped


class Publisher:
    """Runs one publisher until :meth:`stop` (or SIGTERM via :func:`run`)."""

    def __init__(self, config: PublisherConfig) -> None:
        self.config = config
        self.role: Role | None = None  # set (validated) by start()
        self.metrics = PublisherMetrics()
        self.log: NotificationLog | None = None
        self.collections: dict[str, CollectionState] = {}
        self.signer = Signer(config.secret_id, config.secret) if config.secret else None
        # One rendering per record for every transport of this process.
        self.renderer = Renderer(config.fmt, self.signer)
        self.sequencer: Sequencer | None = None
        self._fetcher: Fetcher | None = None
        self._access: DocumentAccess | None = None
        self._stopping = asyncio.Event()
        self._tasks = TaskGroup()  # the process's: telemetry, the election, the directory watch
        self._served: list[Transport] = []  # every instance's: WebSocket, WebSub without --ha
        self._term: LeaderTerm | None = None  # the leader's work, while leading
        self._metrics_runner: web.AppRunner | None = None
        self.metrics_port: int | None = None
        self.ws_port: int | None = None
        self._fswatch: fswatch.DirectoryWatch | None = None
        self.healthy = True  # False while detection keeps failing (/healthz, the dashboard)
        self._election: LeaderElection | None = None
        self.is_leader = False
        self._blob_client: Client | None = None  # --redis: snapshot maps (issue 23)

    # -- what runs -------------------------------------------------------------------

    def _running(self) -> Iterable[Transport]:
        yield from self._served
        if self._term is not None:
            yield from self._term.transports

    def transports(self) -> list[str]:
        """The names of the transports running now (see :class:`.transports.Transport`)."""
        return [transport.name for transport in self._running()]

    @property
    def websub(self) -> WebSubHub | None:
        """The WebSub hub this process runs (with ``--ha``: on the leader), or None."""
        for transport in self._running():
            if isinstance(transport, WebSubTransport):
                return transport.hub
        return None

    def advertisement(self) -> Advertisement:
        """The collections' channels, as this process knows them now."""
        return Advertisement(self.config, self.ws_port, self.websub)

    def hub_links(self, collection: str) -> list[str]:
        """The collection's MQTT and WebSocket channels (see :mod:`.advertisement`)."""
        return self.advertisement().hub_links(collection)

    def write_hub_links(self) -> None:
        """Advertise the channels in each Capability List file of a directory Source."""
        assert isinstance(self._access, DirectoryAccess)
        write_capability_lists(self.advertisement(), self._access, self._capability_lists())

    def _capability_lists(self) -> dict[str, str]:
        return {cid: c.capability_list for cid, c in self.collections.items()}

    # -- start -----------------------------------------------------------------------

    async def start(self) -> None:
        """Open the log, discover the Source, start watchers, transports and metrics."""
        config = self.config
        self.role = role = role_of(config)
        # Its own transports read back what it appends: from memory, not the backend.
        try:
            self.log = TailCache(
                open_log(
                    config.redis,
                    config.state_dir,
                    wait_replicas=config.wait_replicas(),
                    wait_timeout=config.redis_wait_ms / 1000,
                )
            )
        except (OSError, sqlite3.Error) as exc:
            raise RsNotifyError(f"--state-dir {config.state_dir}: {exc}") from None
        self._fetcher = Fetcher(policy=config.http.with_credential_origins([config.source]))
        self._access = (
            DirectoryAccess(config.source)
            if is_directory(config.source)
            else HttpAccess(self._fetcher)
        )
        if config.metrics_port is not None:
            with listening("metrics", config.metrics_host, config.metrics_port):
                self._metrics_runner, self.metrics_port = await serve(
                    metrics_app(self.metrics.registry, lambda: self.healthy),
                    config.metrics_host,
                    config.metrics_port,
                )
        self.sequencer = Sequencer(
            self.log, self.metrics, batch=config.batch, retention=config.retention
        )
        if role.detects:
            self.collections = await open_collections(
                config,
                self.log,
                self._access,
                self._fetcher,
                self.metrics,
                self._stopping,
                blobs=self._redis_blobs() if config.redis else None,
            )
        if config.report and role is not Role.MQTT_GATEWAY:  # for `rsnotify dashboard`
            self._tasks.spawn(PublisherReporter(config.report, self).run(), name="telemetry")
        if config.ws:  # the gateway serves from the log: every instance may run one
            ws = ws_transport(
                config, self.log, signer=self.signer, renderer=self.renderer, metrics=self.metrics
            )
            await self._serve(ws)
            self.ws_port = ws.gateway.port
        if config.websub and not config.ha:  # with --ha only the leader runs the hub
            await self._serve(self._websub_transport())
        if not role.leads:
            return
        if config.write_changelist:  # here, before any election (see prepare_directory)
            prepare_directory(config.write_changelist)
        if config.ha:
            from .leader import LeaderElection

            assert config.redis is not None  # role_of: --ha has --redis
            group = config.ha_group or collection_id(config.source)
            self._election = LeaderElection(
                config.redis,
                # The pushers of a split deployment elect their own leader: one
                # sharing the detecting publishers' group could win their lease
                # and stop detection.
                group=f"{group}/mqtt" if role is Role.MQTT_GATEWAY else group,
                owner=config.publisher_id,
                ttl=config.lease_ttl,
                retry=min(0.5, config.lease_ttl / 4),
            )
            self._tasks.spawn(
                self._election.run(self._on_elected, self._on_deposed, self._stopping),
                name="leader election",
            )
        else:
            await self._start_leading()
        if config.watch:
            self._start_fs_watch()

    def _fence(self) -> int | None:
        """The leader's fencing token now (None: not leading)."""
        return self.sequencer.fence if self.sequencer is not None else None

    def _redis_blobs(self) -> Callable[[str], BlobStore]:
        """``--redis``: snapshot maps beside the log, where a standby that takes over finds them.

        One client for every collection, made at the first collection that
        needs it (most Sources have Change Lists), closed by :meth:`stop`.
        """
        from .. import redisurl
        from ..log.redis_blobs import RedisBlobs
        from ..logs import redact_url

        assert self.config.redis is not None

        def make(cid: str) -> BlobStore:
            if self._blob_client is None:
                self._blob_client = redisurl.client(
                    self.config.redis or "", socket_timeout=5.0, socket_connect_timeout=5.0
                )
            fence = self._fence if self.config.ha else None
            redacted = redact_url(self.config.redis or "")
            return RedisBlobs(self._blob_client, cid, url=redacted, fence=fence)

        return make

    async def _serve(self, transport: Transport) -> None:
        await transport.start(self._tasks)
        self._served.append(transport)

    def _websub_transport(self) -> WebSubTransport:
        assert self.log is not None
        return websub_transport(
            self.config,
            self.log,
            signer=self.signer,
            changelists={cid: c.watcher.changelist_url for cid, c in self.collections.items()},
            on_publish=self._on_publish,
        )

    def _on_publish(self, collection: str) -> None:
        """A Source said its Change Lists changed (section 4.1 POST or ping): read them now."""
        found = self.collections.get(collection)
        if found is not None:
            found.trigger.set()
            found.framework_trigger.set()

    # -- leading ---------------------------------------------------------------------

    async def _on_elected(self, leadership: Leadership) -> None:
        assert self.sequencer is not None
        self.sequencer.fence = leadership.token
        self.is_leader = True
        for collection in self.collections.values():
            await self.sequencer.reload(collection)  # a previous leader may have moved the log on
        await self._start_leading()

    async def _on_deposed(self) -> None:
        """Lost the lease: stop detecting and pushing at once (the fence stops stale writes)."""
        self.is_leader = False
        if self.sequencer is not None:
            self.sequencer.fence = None
        term, self._term = self._term, None
        if term is not None:  # the WebSub hub too: the next leader serves it from the store
            await term.stop(drain=False)

    async def _start_leading(self) -> None:
        """Detection, the MQTT pusher and maintenance: what only the leader runs."""
        config = self.config
        assert self.log is not None and self.sequencer is not None
        if self._stopping.is_set():
            return  # elected while stopping
        self.is_leader = True
        term = self._term = LeaderTerm()
        mqtt = None
        if config.mqtt:
            mqtt = mqtt_transport(
                config,
                self.log,
                signer=self.signer,
                renderer=self.renderer,
                metrics=self.metrics,
                collections=list(self.collections),
            )
            await term.start(mqtt)
        if config.websub and config.ha:
            term.tasks.spawn(self._lead_websub(term), name="WebSub hub start-up")
        else:
            await self._start_hub_pusher(term)
        if config.write_changelist:  # one more log consumer; the leader alone owns DIR
            await term.start(
                ChangeListWriter(
                    self.log,
                    config.write_changelist,
                    self._capability_lists(),
                    base=config.write_changelist_base,
                    max_entries=config.write_changelist_size,
                )
            )
        if self.role is Role.MQTT_GATEWAY:
            assert mqtt is not None  # role_of: --mqtt-only has --mqtt
            term.detection.spawn(
                follow_collections(self.log, mqtt, config.collections, self._stopping),
                name="the log's collection list",
            )
            return
        for collection in self.collections.values():
            loop = DetectionLoop(
                collection,
                self.sequencer,
                self.metrics,
                poll=config.poll,
                framework_interval=config.framework_interval,
                stopping=self._stopping,
                on_health=self._set_health,
                on_lists=self._watch_lists,
            )
            term.detection.spawn(loop.watch(), name=f"detection of {collection.id}")
            if collection.framework is not None:
                term.detection.spawn(
                    loop.watch_framework(), name=f"framework checks of {collection.id}"
                )
        term.detection.spawn(
            self.sequencer.keep_retention(self.collections, self._stopping), name="retention"
        )

    async def _lead_websub(self, term: LeaderTerm) -> None:
        """``--ha``: the leader runs the hub; the port may still be the old leader's a moment."""
        backoff = Backoff(initial=0.1, maximum=2.0)
        while not self._stopping.is_set():
            try:
                await term.start(self._websub_transport())
                break
            except OSError as exc:
                delay = backoff.next()
                log.warning("cannot serve WebSub yet (%s); retrying in %.1fs", exc, delay)
                await pause(self._stopping, delay)
        else:
            return
        log.info("leading: WebSub hub at %s", self.websub.url if self.websub else "?")
        await self._start_hub_pusher(term)

    async def _start_hub_pusher(self, term: LeaderTerm) -> None:
        """``--websub-hub``: hand every notification to a hub run by others (leader only)."""
        config = self.config
        hub = self.websub
        if not config.websub_hub or hub is None or not self.is_leader:
            return
        assert self.log is not None
        transport = hub_push_transport(
            config,
            self.log,
            signer=self.signer,
            hub=hub,
            capability_lists=self._capability_lists(),
        )
        await term.start(transport)

    def _set_health(self, healthy: bool) -> None:
        self.healthy = healthy

    # -- --watch ---------------------------------------------------------------------

    def _start_fs_watch(self) -> None:
        """Poll a collection as soon as one of its Change List documents is written."""
        if not isinstance(self._access, DirectoryAccess):
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
        self._tasks.spawn(self._fswatch.run(), name="directory watch")

    def _watch_lists(self, collection: CollectionState) -> None:
        """Watch the directories of the collection's Change List Index and Change Lists."""
        if self._fswatch is None or not isinstance(self._access, DirectoryAccess):
            return
        watcher = collection.watcher
        for url in [watcher.changelist_url, *watcher.list_urls()]:
            path = self._access.local_path(url)
            self._fswatch.watch(path.parent, collection.trigger.set)

    # -- stop ------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Ask :meth:`wait` to return (the SIGTERM handler); :meth:`stop` does the rest."""
        self._stopping.set()

    async def stop(self) -> None:
        """Stop detecting, let transports drain, close everything (SIGTERM path)."""
        self._stopping.set()
        if self._fswatch is not None:
            self._fswatch.close()
        term, self._term = self._term, None
        if term is not None:
            await term.stop(drain=True)
        await _stop_all(self._served)
        await self._tasks.cancel()
        if self._election is not None:
            await self._election.close()
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
        if self._fetcher is not None:
            await self._fetcher.close()
        if self.log is not None:
            await self.log.close()
        if self._blob_client is not None:
            await self._blob_client.aclose()

    async def wait(self) -> None:
        await self._stopping.wait()


async def run(config: PublisherConfig, *, ready: asyncio.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT; print where it listens; return the exit code."""
    publisher = Publisher(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, publisher.request_stop)
    try:
        await publisher.start()
    except RsNotifyError as exc:
        log.error("cannot start: %s", exc)
        await publisher.stop()
        return 1
    lines = running_lines(
        publisher.advertisement(),
        publisher._capability_lists(),
        metrics_port=publisher.metrics_port,
    )
    if config.write_changelist:
        lines += advice_lines(
            publisher._capability_lists(),
            config.write_changelist,
            config.write_changelist_base,
            PREFIX,
        )
    for line in lines:
        say(line)
    if config.write_hubs:
        if not is_directory(config.source):
            say("rsnotify publish: --write-hubs needs a local directory SOURCE")
        else:
            publisher.write_hub_links()
    if ready is not None:
        ready.set()
    await publisher.wait()
    await publisher.stop()
    return 0
