"""``rsnotify publish SOURCE``: the command-line front of :mod:`.service`."""

from __future__ import annotations

import argparse
import asyncio
import re

from .. import argtypes, httpoptions
from ..commonoptions import LOG, METRICS_HOST, MQTT_PROTOCOL, lenient_options, lenient_rules
from ..log import Retention
from ..logs import setup as setup_logging
from ..options import Group, Options, build, flag, option, positional, repeated
from ..sitemapwriter import MAX_ENTRIES_PER_DOCUMENT
from ..transport.topics import prefix_argument
from . import service
from .service import PublisherConfig

NAME = "publish"
HELP = "watch a Source's Change Lists; log, sequence and push every new entry"

_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_retention(text: str) -> Retention:
    """``100000``, ``7d``, ``100000,7d`` or ``none``: count and/or age of the log kept."""
    max_len: int | None = None
    max_age: float | None = None
    if text.strip().lower() == "none":
        return Retention(max_len=None, max_age_s=None)
    for part in text.split(","):
        part = part.strip().lower()
        if part.isdigit():
            max_len = int(part)
        elif (match := _AGE.fullmatch(part)) is not None:
            max_age = float(match.group(1)) * _UNITS[match.group(2)]
        else:
            raise argparse.ArgumentTypeError(f"bad retention {part!r}: use N, Ns/m/h/d, or both")
    if max_len == 0 or max_age == 0:
        # A log that keeps nothing cannot replay a single reconnecting client.
        raise argparse.ArgumentTypeError(
            f"bad retention {text.strip()!r}: keep at least 1 entry and more than 0 s "
            "(or 'none' for no limit)"
        )
    return Retention(max_len=max_len, max_age_s=max_age)


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of seconds, 0 or more")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _changelist_size(text: str) -> int:
    value = argtypes.positive_int(text)
    if value > MAX_ENTRIES_PER_DOCUMENT:
        raise argparse.ArgumentTypeError(
            f"a Change List holds at most {MAX_ENTRIES_PER_DOCUMENT} entries "
            f"(Z39.99 section 7), got {value}"
        )
    return value


def _secret_bytes(text: str | None) -> bytes | None:
    return text.encode() if text else None


WHERE = Group(
    "log and state",
    option(
        "--redis",
        type=argtypes.redis_url,
        metavar="URL",
        help="Redis URL for the log (default: embedded SQLite)",
    ),
    option(
        "--redis-wait",
        type=argtypes.positive_number,
        default=60.0,
        metavar="SECONDS",
        help="at start-up, retry an unreachable --redis this long, then exit 1 (default 60; "
        "once running, a Redis outage is retried for as long as it lasts)",
    ),
    option(
        "--redis-wait-replicas",
        type=argtypes.nonneg_int,
        default=None,
        metavar="N",
        help="push a logged entry only once N Redis replicas hold it (WAIT), so a failover "
        "cannot lose it (default: 1 with a redis+sentinel:// or redis+cluster:// URL, else 0; "
        "see deploy/README.md)",
    ),
    option(
        "--redis-wait-ms",
        type=argtypes.positive_int,
        default=1000,
        metavar="MS",
        help="each WAIT for --redis-wait-replicas lasts this long; on time-out the entries "
        "stay unpushed, a warning is logged and the WAIT repeats (default 1000)",
    ),
    option("--state-dir", default=".rsnotify", help="embedded log directory (default: .rsnotify)"),
    option(
        "--retain",
        type=parse_retention,
        default=Retention(),
        help="log retention: a count, an age (7d) or both (100000,7d); default 100000,7d",
        field="retention",
    ),
)
WATCH = Group(
    "watching the Source",
    option(
        "--poll",
        type=argtypes.positive_number,
        default=1.0,
        help="poll interval in seconds, > 0 (default 1)",
    ),
    flag(
        "--watch",
        help="for a local directory: react to file-system notifications within milliseconds",
    ),
    flag(
        "--from-beginning",
        help="on first run, publish every entry already in the Change Lists "
        "(default: start at their current end; a collection with only a Resource "
        "List has no history: its first snapshot is recorded, not published)",
    ),
    repeated(
        "--collection",
        metavar="URL|ID",
        help="publish only these Capability Lists (repeatable)",
        field="collections",
    ),
    lenient_options(),  # --lenient order: Change Lists out of order (resync-build's)
)
PUSH = Group(
    "push transports",
    option(
        "--mqtt",
        type=argtypes.mqtt_url,
        metavar="URL",
        help="mqtt://[user:pass@]host:port or mqtts://...",
    ),
    option("--mqtt-ca", metavar="FILE", help="CA certificate for mqtts://", field="mqtt_tls_ca"),
    flag(
        "--mqtt-insecure",
        help="do not verify the broker's TLS name",
        field="mqtt_tls_insecure",
    ),
    option(
        "--topic-prefix",
        type=prefix_argument,
        default="resourcesync",
        help="MQTT topic prefix: levels of letters, digits, '-' and '_' (default resourcesync)",
    ),
    MQTT_PROTOCOL,
    flag(
        "--legacy-topics",
        help="publish on the old topic names <prefix>/<collection id>/... (dots included) "
        "for Destinations not yet upgraded; brokers such as NATS refuse them",
    ),
    option(
        "--ws",
        type=argtypes.listen_address,
        metavar="HOST:PORT",
        help="serve WebSocket clients here",
    ),
    option(
        "--ws-token",
        type=argtypes.non_empty,
        default_env="RSNOTIFY_WS_TOKEN",
        help="bearer token WebSocket clients must present (or RSNOTIFY_WS_TOKEN); set it on "
        "any gateway reachable from outside this host",
        secret=True,
    ),
    option(
        "--ws-max-per-address",
        type=argtypes.nonneg_int,
        metavar="N",
        help="WebSocket connections one client address (an IPv6 /64) may hold, then HTTP 429 "
        "(default 256; 0: no limit, e.g. behind a proxy that limits per client)",
    ),
    option("--ws-cert", metavar="FILE", help="serve wss:// with this certificate chain (PEM)"),
    option("--ws-key", metavar="FILE", help="private key for --ws-cert (PEM)"),
    flag(
        "--ws-only",
        help="gateway mode: serve WebSocket clients from the shared Redis log, detect nothing",
    ),
    option(
        "--mqtt-hub",
        type=argtypes.mqtt_url,
        metavar="URL",
        help="advertise this broker's channels (rs:ln rel=hub) without pushing to it: "
        "an --mqtt-only gateway does the pushing",
    ),
    flag(
        "--mqtt-only",
        help="gateway mode: push the shared Redis log over --mqtt, detect nothing (run the "
        "detecting publisher without --mqtt; the two then use two cores)",
    ),
    option(
        "--websub",
        type=argtypes.listen_address,
        metavar="HOST:PORT",
        help="run a WebSub hub here (ResourceSync Change Notification): topic per "
        "collection at http://HOST:PORT/<collection>, Atom feed at <topic>/feed.atom",
    ),
    option(
        "--websub-url",
        metavar="URL",
        help="the hub's public URL when it is not http://HOST:PORT/ (behind a proxy)",
    ),
    option(
        "--websub-lease",
        type=argtypes.positive_int,
        metavar="SECONDS",
        help="lease granted when a subscriber asks for none (default 10 days)",
    ),
    option(
        "--websub-retry-max",
        type=argtypes.positive_number,
        default=30.0,
        metavar="SECONDS",
        help="longest wait between retries to a failing callback (default 30)",
    ),
    option(
        "--websub-lease-min",
        type=_positive_int,
        metavar="SECONDS",
        help="shortest lease granted (default 300, as Change Notification 4.2 recommends)",
    ),
    option(
        "--websub-lease-max",
        type=_positive_int,
        metavar="SECONDS",
        help="longest lease granted (default 2678400: a month)",
    ),
    repeated(
        "--websub-allow-callback",
        metavar="CIDR|HOST",
        help="let the hub call callbacks in this network or on this host although they are "
        "loopback, private, link-local... (refused by default); repeatable",
    ),
    option(
        "--websub-max-subscriptions",
        type=_positive_int,
        default=10_000,
        metavar="N",
        help="subscriptions plus pending verifications the hub holds, in all (default 10000)",
    ),
    option(
        "--websub-max-per-client",
        type=_positive_int,
        default=100,
        metavar="N",
        help="... per client address, and per callback host (default 100 each)",
    ),
    option(
        "--websub-hub",
        metavar="URL",
        help="also hand every notification to this WebSub hub (run by someone else); "
        "the topics stay at --websub",
    ),
    option(
        "--websub-hub-mode",
        choices=("post", "ping"),
        default="post",
        help="post: Change Notification 4.1's POST of the payload (default); ping: "
        "hub.mode=publish, for hubs that fetch the topic",
    ),
    option(
        "--framework-interval",
        type=_non_negative_float,
        default=30.0,
        metavar="SECONDS",
        help="with --websub: check the Resource List, Dumps and Change Lists this often and "
        "publish Framework Notification 1.0.1 on each collection's <topic>/framework "
        "(default 30; 0: off)",
    ),
    flag(
        "--write-hubs",
        help="directory SOURCE: advertise the channels in its Capability Lists "
        "(WebSub as Change Notification section 5 says)",
    ),
    option(
        "--heartbeat",
        type=argtypes.positive_number,
        default=5.0,
        help="head/heartbeat interval (s)",
    ),
    option("--format", choices=("json", "xml"), default="json", help="payload format", field="fmt"),
    option(
        "--secret",
        type=argtypes.non_empty,
        default_env="RSNOTIFY_SECRET",
        help="HMAC-SHA256 signing secret (or RSNOTIFY_SECRET)",
        secret=True,
        to_field=_secret_bytes,
    ),
    option(
        "--secret-id",
        type=argtypes.non_empty,
        default="k1",
        help="key id sent with signatures (for rotation)",
    ),
)
CHANGELIST = Group(
    "writing a Change List",
    option(
        "--write-changelist",
        metavar="DIR",
        help="write every logged notification into a Change List Index and Change Lists "
        "under DIR/<collection id>/ (Z39.99 section 12), for a Source that has none; serve "
        "DIR and advertise the index as printed at start-up",
    ),
    option(
        "--write-changelist-base",
        type=argtypes.http_url,
        metavar="URL",
        help="the URL DIR is served at (default: the directory of each Capability List)",
    ),
    option(
        "--write-changelist-size",
        type=_changelist_size,
        default=MAX_ENTRIES_PER_DOCUMENT,
        metavar="N",
        help="entries per Change List before a new one starts "
        f"(default and most: {MAX_ENTRIES_PER_DOCUMENT})",
    ),
)
HA = Group(
    "high availability",
    flag(
        "--ha",
        help="run several publishers for one Source: a Redis lease elects the one that publishes",
    ),
    option("--ha-group", help="name shared by the publishers of one Source"),
    option(
        "--lease-ttl",
        type=argtypes.positive_number,
        default=3.0,
        help="leader lease TTL in seconds",
    ),
)
OPS = Group(
    "operations",
    option("--metrics-port", type=argtypes.port, help="serve /metrics and /healthz on this port"),
    METRICS_HOST,
    option(
        "--report",
        type=argtypes.redis_url,
        metavar="URL",
        help="dashboard telemetry (default: --redis)",
        field=None,  # derived: --report, else --redis
    ),
    LOG,
)
OPTIONS = Options(
    positional(
        "source",
        type=argtypes.source_location,
        metavar="SOURCE",
        help="the Source's base URL, a Source Description or Capability List URL, "
        "or a local directory holding the Source's documents",
    ),
    WHERE,
    WATCH,
    PUSH,
    CHANGELIST,
    httpoptions.HTTP,
    HA,
    OPS,
)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, args.log_format)
    if args.ws_only and not args.redis:
        print("rsnotify publish: --ws-only serves from a shared log and needs --redis", flush=True)
        return 2
    if args.mqtt_only and (
        args.ws_only or args.ws or args.websub or not (args.redis and args.mqtt)
    ):
        print(
            "rsnotify publish: --mqtt-only pushes a shared log: it needs --redis and --mqtt, "
            "and serves no --ws or --websub (run those in another process)",
            flush=True,
        )
        return 2
    if args.mqtt_hub and (args.mqtt or args.mqtt_only):
        print("rsnotify publish: --mqtt-hub is for a publisher without --mqtt", flush=True)
        return 2
    if (args.ws_cert or args.ws_key) and not (args.ws and args.ws_cert):
        print("rsnotify publish: --ws-cert/--ws-key need --ws, --ws-key a --ws-cert", flush=True)
        return 2
    if args.websub_hub and not args.websub:
        print(
            "rsnotify publish: --websub-hub needs --websub HOST:PORT to serve the topics "
            "(Change Notification 4.1: the topic answers GET and HEAD)",
            flush=True,
        )
        return 2
    sized = args.write_changelist_size != MAX_ENTRIES_PER_DOCUMENT
    if (args.write_changelist_base or sized) and not args.write_changelist:
        print("rsnotify publish: --write-changelist-* need --write-changelist DIR", flush=True)
        return 2
    if args.write_changelist and (args.ws_only or args.mqtt_only):
        print(
            "rsnotify publish: --write-changelist writes what the detecting publisher logs: "
            "not with --ws-only or --mqtt-only",
            flush=True,
        )
        return 2
    if args.websub_allow_callback:
        from ..transport.websubguard import CallbackPolicy

        try:
            CallbackPolicy.parse(args.websub_allow_callback)
        except ValueError as exc:
            print(f"rsnotify publish: {exc}", flush=True)
            return 2
    if not (args.mqtt or args.ws or args.websub or args.write_changelist):
        print(
            "rsnotify publish: note: no --mqtt, --ws, --websub or --write-changelist given; "
            "notifications are only logged",
            flush=True,
        )
    try:
        http = httpoptions.policy_from_args(args)
    except ValueError as exc:
        print(f"rsnotify publish: {exc}", flush=True)
        return 2
    config = build(
        PublisherConfig,
        OPTIONS,
        args,
        http=http,
        lenient=lenient_rules(args),
        report=args.report or args.redis,
        websub_max_per_host=args.websub_max_per_client,
    )
    return asyncio.run(service.run(config))
