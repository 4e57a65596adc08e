"""What ``rsnotify publish`` is told (:class:`PublisherConfig`) and the role it takes.

One process takes one :class:`Role`, decided once from the options and
checked before anything opens: the combinations that cannot work are errors
here, not branches scattered through the service.  ``--ha`` (leader
election) and ``--websub`` (a WebSub hub) are not roles: they say who among
several processes of one role does the leader's work, and which transports
run.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from .. import redisurl, sitemap
from ..errors import RsNotifyError
from ..httppolicy import HttpPolicy
from ..log import Retention


class Role(enum.Enum):
    """What one publisher process does with the shared log."""

    #: Detect new Change List entries, sequence and log them, and push them (the default).
    PUBLISHER = "publisher"
    #: ``--ws-only``: serve the shared log over WebSocket; detect and lead nothing.
    WS_GATEWAY = "ws-only"
    #: ``--mqtt-only``: push the shared log over MQTT; detect nothing (a split deployment).
    MQTT_GATEWAY = "mqtt-only"

    @property
    def detects(self) -> bool:
        """Reads the Source and appends to the log."""
        return self is Role.PUBLISHER

    @property
    def leads(self) -> bool:
        """Has leader's work (detection or the MQTT push): alone, or when elected (``--ha``)."""
        return self is not Role.WS_GATEWAY


def role_of(config: PublisherConfig) -> Role:
    """The process's role; raises :class:`RsNotifyError` for options that cannot work together."""
    if config.ha and not config.redis:
        raise RsNotifyError("--ha elects a leader through Redis: give --redis")
    if config.mqtt_only and (config.ws_only or not config.redis or not config.mqtt):
        raise RsNotifyError("--mqtt-only pushes a shared log: give --redis and --mqtt")
    if config.websub and config.ws_only:
        # Every gateway would load the same subscriptions and deliver them all.
        raise RsNotifyError("--websub runs one hub per log: not with --ws-only")
    if config.ws_only:
        return Role.WS_GATEWAY
    if config.mqtt_only:
        return Role.MQTT_GATEWAY
    return Role.PUBLISHER


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
    # Write each collection's log as a Change List (Index) under DIR/<collection id>/
    # (rsnotify.publisher.changelistwriter), served at BASE/<collection id>/.
    write_changelist: str | None = None
    write_changelist_base: str | None = None  # default: the Capability List's directory
    write_changelist_size: int = 50_000  # entries per Change List (section 7's limit)
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
    # Replicas that must hold a logged entry before it is pushed (None: 1 with a
    # redis+sentinel:// or redis+cluster:// URL, else 0), and how long each WAIT lasts.
    redis_wait_replicas: int | None = None
    redis_wait_ms: int = 1000

    def wait_replicas(self) -> int:
        """The replicas to wait for (issue 19: a failover must not lose what was pushed)."""
        if self.redis_wait_replicas is not None:
            return self.redis_wait_replicas
        url = self.redis or ""
        return 1 if redisurl.is_sentinel(url) or redisurl.is_cluster(url) else 0

    def framework_enabled(self) -> bool:
        """Framework notifications travel on the WebSub hub's framework topics only."""
        return bool(self.websub) and self.framework_interval > 0
