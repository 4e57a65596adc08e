"""The publisher's transports, behind one start/stop protocol.

Every transport tails the log and pushes what the sequencer appended:
MQTT (:class:`~rsnotify.transport.mqtt.MqttPusher`), WebSocket
(:class:`~rsnotify.transport.ws.WebSocketGateway`), the WebSub hub
(:class:`~rsnotify.transport.websub.WebSubHub`) and the hand-over to a hub
run by others (:class:`~rsnotify.transport.websubpush.HubPusher`).  They
differ in how they run (a server that binds, or a loop), so each gets a
small adapter to :class:`Transport`: ``start(tasks)`` returns once it serves,
with any loop it needs spawned in ``tasks``; ``stop()`` drains what it can
and closes.  The service starts them in order and stops them in reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..cancellation import raise_if_cancelled
from ..errors import RsNotifyError, listening
from ..log import LogUnavailable, NotificationLog
from ..metrics import PublisherMetrics
from ..outbound import Renderer, Signer
from .config import PublisherConfig
from .tasks import TaskGroup, pause

if TYPE_CHECKING:
    from ..transport.mqtt import MqttPusher
    from ..transport.websub import WebSubHub
    from ..transport.websubpush import HubPusher
    from ..transport.ws import WebSocketGateway

log = logging.getLogger("rsnotify.publish")

COLLECTION_REFRESH = 5.0  # seconds between reads of the log's collection list (--mqtt-only)


class Transport(Protocol):
    """A way notifications leave the publisher."""

    #: "mqtt", "ws", "websub" or "websub-hub": what it is, in logs and tests.
    name: str

    async def start(self, tasks: TaskGroup) -> None:
        """Begin serving or pushing; long-running work goes into ``tasks``."""

    async def stop(self) -> None:
        """Stop, draining what can be drained; safe after a failed start or a cancelled task."""


class MqttTransport:
    """The MQTT pusher: a loop; ``stop`` waits for in-flight PUBACKs (a leader's transport)."""

    name = "mqtt"

    def __init__(self, pusher: MqttPusher) -> None:
        self.pusher = pusher

    async def start(self, tasks: TaskGroup) -> None:
        tasks.spawn(self.pusher.run(), name="MQTT pusher")

    async def stop(self) -> None:
        await self.pusher.stop()


class WebSocketTransport:
    """The WebSocket gateway: a server every instance may run (it serves from the log)."""

    name = "ws"

    def __init__(self, gateway: WebSocketGateway) -> None:
        self.gateway = gateway

    async def start(self, tasks: TaskGroup) -> None:
        with listening("WebSocket clients", self.gateway.host, self.gateway.port):
            await self.gateway.start()

    async def stop(self) -> None:
        await self.gateway.stop()


class WebSubTransport:
    """The WebSub hub: a server with a subscription store, one per log.

    ``announce``: a failure to bind says which option to change (see
    :func:`~rsnotify.errors.listening`).  Under ``--ha`` the new leader's
    bind may meet the old leader's socket for a moment, so the service
    retries a plain ``OSError`` instead.
    """

    name = "websub"

    def __init__(self, hub: WebSubHub, *, announce: bool) -> None:
        self.hub = hub
        self.announce = announce

    async def start(self, tasks: TaskGroup) -> None:
        hub = self.hub
        try:
            if self.announce:
                with listening("the WebSub hub", hub.host, hub.port):
                    await hub.start()
            else:
                await hub.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.hub.stop()
        with contextlib.suppress(Exception):
            await self.hub.store.close()


class HubPushTransport:
    """``--websub-hub``: every notification handed to a hub run by others (a loop)."""

    name = "websub-hub"

    def __init__(self, pusher: HubPusher) -> None:
        self.pusher = pusher
        self._task: asyncio.Task[Any] | None = None

    async def start(self, tasks: TaskGroup) -> None:
        self._task = tasks.spawn(self.pusher.run(), name="WebSub hand-over")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class PublishedMetrics:
    """``on_published`` of one transport: counts and times every acknowledged notification."""

    def __init__(self, metrics: PublisherMetrics, transport: str) -> None:
        self.metrics = metrics
        self.transport = transport
        self._children: dict[str, tuple[Any, Any]] = {}

    def __call__(self, collection: str, seq: int, size: int, latency: float) -> None:
        # Called for every acknowledged notification: resolve the labelled
        # children once (labels() takes a lock and builds a key each time).
        children = self._children.get(collection)
        if children is None:
            children = self._children[collection] = (
                self.metrics.published.labels(collection, self.transport),
                self.metrics.publish_latency.labels(collection, self.transport),
            )
        counter, histogram = children
        counter.inc()
        histogram.observe(latency)


# -- building them from the options ---------------------------------------------------


def mqtt_transport(
    config: PublisherConfig,
    notification_log: NotificationLog,
    *,
    signer: Signer | None,
    renderer: Renderer,
    metrics: PublisherMetrics,
    collections: Sequence[str],
) -> MqttTransport:
    from ..transport.mqtt import MqttPusher

    assert config.mqtt is not None
    pusher = MqttPusher(
        config.mqtt,
        notification_log,
        topic_prefix=config.topic_prefix,
        fmt=config.fmt,
        signer=signer,
        heartbeat=config.heartbeat,
        tls_ca=config.mqtt_tls_ca,
        tls_insecure=config.mqtt_tls_insecure,
        on_published=PublishedMetrics(metrics, "mqtt"),
        renderer=renderer,
        protocol=config.mqtt_protocol,
        legacy_topics=config.legacy_topics,
        publisher_id=config.publisher_id,
    )
    for collection in collections:
        pusher.add_collection(collection)
    return MqttTransport(pusher)


def ws_transport(
    config: PublisherConfig,
    notification_log: NotificationLog,
    *,
    signer: Signer | None,
    renderer: Renderer,
    metrics: PublisherMetrics,
) -> WebSocketTransport:
    from ..runtime import release_memory
    from ..transport.ws import WebSocketGateway, server_tls_context

    assert config.ws is not None
    host, _, port = config.ws.rpartition(":")
    limits: dict[str, int] = {}
    if config.ws_max_per_address is not None:
        limits["max_per_address"] = config.ws_max_per_address
    gateway = WebSocketGateway(
        notification_log,
        host=host or "127.0.0.1",
        port=int(port),
        fmt=config.fmt,
        signer=signer,
        token=config.ws_token,
        ssl_context=server_tls_context(config.ws_cert, config.ws_key) if config.ws_cert else None,
        heartbeat=config.heartbeat,
        server_id=config.publisher_id,
        on_client_change=metrics.ws_clients.set,
        on_published=PublishedMetrics(metrics, "ws"),
        renderer=renderer,
        release_memory=release_memory,
        **limits,
    )
    return WebSocketTransport(gateway)


def websub_transport(
    config: PublisherConfig,
    notification_log: NotificationLog,
    *,
    signer: Signer | None,
    changelists: Mapping[str, str],
    on_publish: Callable[[str], None],
) -> WebSubTransport:
    """The hub serves from the log too (subscriptions: Redis or --state-dir)."""
    from ..transport.websub import WebSubHub
    from ..transport.websubproto import LEASE_MAXIMUM, LEASE_MINIMUM, LeasePolicy
    from ..transport.websubstore import open_store

    assert config.websub is not None
    host, _, port = config.websub.rpartition(":")
    minimum = config.websub_lease_min or LEASE_MINIMUM
    maximum = config.websub_lease_max or LEASE_MAXIMUM
    default = config.websub_lease or min(max(10 * 24 * 3600, minimum), maximum)
    try:
        lease = LeasePolicy(default=default, minimum=minimum, maximum=maximum)
    except ValueError as exc:
        raise RsNotifyError(f"--websub-lease*: {exc}") from None
    hub = WebSubHub(
        notification_log,
        open_store(config.redis, config.state_dir),
        host=host or "127.0.0.1",
        port=int(port),
        public_url=config.websub_url,
        lease=lease,
        changelists=dict(changelists),
        backoff_max=config.websub_retry_max,
        signer=signer,
        # Never hold more than the log retains: "beyond retention" then means what it says.
        ring_size=min(2_000, config.retention.max_len or 2_000),
        server_id=config.publisher_id,
        allow_callbacks=config.websub_allow_callback,
        max_subscriptions=config.websub_max_subscriptions,
        max_per_client=config.websub_max_per_client,
        max_per_host=config.websub_max_per_host,
        publish_secret=config.secret,
        on_publish=on_publish,
        external_hubs=[config.websub_hub] if config.websub_hub else [],
        framework_topics=config.framework_enabled(),
    )
    # With --ha only the leader runs the hub, and the old leader may hold the port a moment.
    return WebSubTransport(hub, announce=not config.ha)


def hub_push_transport(
    config: PublisherConfig,
    notification_log: NotificationLog,
    *,
    signer: Signer | None,
    hub: WebSubHub,
    capability_lists: Mapping[str, str],
) -> HubPushTransport:
    from ..transport.websubpush import HubPusher

    assert config.websub_hub is not None
    pusher = HubPusher(
        notification_log,
        hub_url=config.websub_hub,
        topics=hub.topic,
        capability_lists=dict(capability_lists),
        mode=config.websub_hub_mode,
        secret=config.secret,
        signer=signer,
        handoff=hub.handoff,
        backoff_max=config.websub_retry_max,
    )
    for collection in capability_lists:
        pusher.add_collection(collection)
    return HubPushTransport(pusher)


async def follow_collections(
    notification_log: NotificationLog,
    mqtt: MqttTransport,
    wanted: Sequence[str],
    stopping: asyncio.Event,
) -> None:
    """``--mqtt-only``: push every collection the shared log holds, new ones included.

    The detecting publisher registers a collection in the log before it
    appends to it, so a collection is found at most
    :data:`COLLECTION_REFRESH` seconds after it appears.
    """
    chosen = set(wanted)
    known: set[str] = set()
    while not stopping.is_set():
        raise_if_cancelled()  # the log's Redis client may have swallowed a cancellation
        try:
            found = await notification_log.collections()
        except LogUnavailable as exc:
            log.warning("cannot read the collection list: %s", exc)
            found = {}
        for cid, capability_list in sorted(found.items()):
            if cid in known or (chosen and cid not in chosen and capability_list not in chosen):
                continue
            known.add(cid)
            mqtt.pusher.add_collection(cid)
            log.info("pushing %s (%s)", cid, capability_list, extra={"collection": cid})
        await pause(stopping, COLLECTION_REFRESH)
