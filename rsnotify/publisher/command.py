"""``rsnotify publish SOURCE``: the command-line front of :mod:`.service`."""

from __future__ import annotations

import argparse
import asyncio
import os
import re

from .. import argtypes, httpoptions
from ..config import add_lenient_option, lenient_rules
from ..log import Retention
from ..logs import setup as setup_logging
from ..transport.topics import prefix_argument, protocol_argument
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


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        type=argtypes.source_location,
        metavar="SOURCE",
        help="the Source's base URL, a Source Description or Capability List URL, "
        "or a local directory holding the Source's documents",
    )
    where = parser.add_argument_group("log and state")
    where.add_argument(
        "--redis",
        type=argtypes.redis_url,
        metavar="URL",
        help="Redis URL for the log (default: embedded SQLite)",
    )
    where.add_argument(
        "--redis-wait",
        type=argtypes.positive_number,
        default=60.0,
        metavar="SECONDS",
        help="at start-up, retry an unreachable --redis this long, then exit 1 (default 60; "
        "once running, a Redis outage is retried for as long as it lasts)",
    )
    where.add_argument(
        "--state-dir", default=".rsnotify", help="embedded log directory (default: .rsnotify)"
    )
    where.add_argument(
        "--retain",
        type=parse_retention,
        default=Retention(),
        help="log retention: a count, an age (7d) or both (100000,7d); default 100000,7d",
    )
    watch = parser.add_argument_group("watching the Source")
    watch.add_argument(
        "--poll",
        type=argtypes.positive_number,
        default=1.0,
        help="poll interval in seconds, > 0 (default 1)",
    )
    watch.add_argument(
        "--watch",
        action="store_true",
        help="for a local directory: react to file-system notifications within milliseconds",
    )
    watch.add_argument(
        "--from-beginning",
        action="store_true",
        help="on first run, publish every entry already in the Change Lists "
        "(default: start at their current end)",
    )
    watch.add_argument(
        "--collection",
        action="append",
        default=[],
        metavar="URL|ID",
        help="publish only these Capability Lists (repeatable)",
    )
    add_lenient_option(watch)  # --lenient order: Change Lists out of order (resync-build's)
    push = parser.add_argument_group("push transports")
    push.add_argument(
        "--mqtt",
        type=argtypes.mqtt_url,
        metavar="URL",
        help="mqtt://[user:pass@]host:port or mqtts://...",
    )
    push.add_argument("--mqtt-ca", metavar="FILE", help="CA certificate for mqtts://")
    push.add_argument(
        "--mqtt-insecure", action="store_true", help="do not verify the broker's TLS name"
    )
    push.add_argument(
        "--topic-prefix",
        type=prefix_argument,
        default="resourcesync",
        help="MQTT topic prefix: levels of letters, digits, '-' and '_' (default resourcesync)",
    )
    push.add_argument(
        "--mqtt-protocol",
        type=protocol_argument,
        default="auto",
        help="MQTT version: auto (5, falling back to 3.1.1 when refused; default), 5 or 3.1.1",
    )
    push.add_argument(
        "--legacy-topics",
        action="store_true",
        help="publish on the old topic names <prefix>/<collection id>/... (dots included) "
        "for Destinations not yet upgraded; brokers such as NATS refuse them",
    )
    push.add_argument(
        "--ws",
        type=argtypes.listen_address,
        metavar="HOST:PORT",
        help="serve WebSocket clients here",
    )
    push.add_argument(
        "--ws-token",
        type=argtypes.non_empty,
        default=os.environ.get("RSNOTIFY_WS_TOKEN"),
        help="bearer token WebSocket clients must present (or RSNOTIFY_WS_TOKEN); set it on "
        "any gateway reachable from outside this host",
    )
    push.add_argument(
        "--ws-max-per-address",
        type=argtypes.nonneg_int,
        metavar="N",
        help="WebSocket connections one client address (an IPv6 /64) may hold, then HTTP 429 "
        "(default 256; 0: no limit, e.g. behind a proxy that limits per client)",
    )
    push.add_argument(
        "--ws-cert", metavar="FILE", help="serve wss:// with this certificate chain (PEM)"
    )
    push.add_argument("--ws-key", metavar="FILE", help="private key for --ws-cert (PEM)")
    push.add_argument(
        "--ws-only",
        action="store_true",
        help="gateway mode: serve WebSocket clients from the shared Redis log, detect nothing",
    )
    push.add_argument(
        "--mqtt-hub",
        type=argtypes.mqtt_url,
        metavar="URL",
        help="advertise this broker's channels (rs:ln rel=hub) without pushing to it: "
        "an --mqtt-only gateway does the pushing",
    )
    push.add_argument(
        "--mqtt-only",
        action="store_true",
        help="gateway mode: push the shared Redis log over --mqtt, detect nothing (run the "
        "detecting publisher without --mqtt; the two then use two cores)",
    )
    push.add_argument(
        "--websub",
        type=argtypes.listen_address,
        metavar="HOST:PORT",
        help="run a WebSub hub here (ResourceSync Change Notification): topic per "
        "collection at http://HOST:PORT/<collection>, Atom feed at <topic>/feed.atom",
    )
    push.add_argument(
        "--websub-url",
        metavar="URL",
        help="the hub's public URL when it is not http://HOST:PORT/ (behind a proxy)",
    )
    push.add_argument(
        "--websub-lease",
        type=argtypes.positive_int,
        metavar="SECONDS",
        help="lease granted when a subscriber asks for none (default 10 days)",
    )
    push.add_argument(
        "--websub-retry-max",
        type=argtypes.positive_number,
        default=30.0,
        metavar="SECONDS",
        help="longest wait between retries to a failing callback (default 30)",
    )
    push.add_argument(
        "--websub-lease-min",
        type=_positive_int,
        metavar="SECONDS",
        help="shortest lease granted (default 300, as Change Notification 4.2 recommends)",
    )
    push.add_argument(
        "--websub-lease-max",
        type=_positive_int,
        metavar="SECONDS",
        help="longest lease granted (default 2678400: a month)",
    )
    push.add_argument(
        "--websub-allow-callback",
        action="append",
        default=[],
        metavar="CIDR|HOST",
        help="let the hub call callbacks in this network or on this host although they are "
        "loopback, private, link-local... (refused by default); repeatable",
    )
    push.add_argument(
        "--websub-max-subscriptions",
        type=_positive_int,
        default=10_000,
        metavar="N",
        help="subscriptions plus pending verifications the hub holds, in all (default 10000)",
    )
    push.add_argument(
        "--websub-max-per-client",
        type=_positive_int,
        default=100,
        metavar="N",
        help="... per client address, and per callback host (default 100 each)",
    )
    push.add_argument(
        "--websub-hub",
        metavar="URL",
        help="also hand every notification to this WebSub hub (run by someone else); "
        "the topics stay at --websub",
    )
    push.add_argument(
        "--websub-hub-mode",
        choices=("post", "ping"),
        default="post",
        help="post: Change Notification 4.1's POST of the payload (default); ping: "
        "hub.mode=publish, for hubs that fetch the topic",
    )
    push.add_argument(
        "--framework-interval",
        type=_non_negative_float,
        default=30.0,
        metavar="SECONDS",
        help="with --websub: check the Resource List, Dumps and Change Lists this often and "
        "publish Framework Notification 1.0.1 on each collection's <topic>/framework "
        "(default 30; 0: off)",
    )
    push.add_argument(
        "--write-hubs",
        action="store_true",
        help="directory SOURCE: advertise the channels in its Capability Lists "
        "(WebSub as Change Notification section 5 says)",
    )
    push.add_argument(
        "--heartbeat",
        type=argtypes.positive_number,
        default=5.0,
        help="head/heartbeat interval (s)",
    )
    push.add_argument("--format", choices=("json", "xml"), default="json", help="payload format")
    push.add_argument(
        "--secret",
        type=argtypes.non_empty,
        default=os.environ.get("RSNOTIFY_SECRET"),
        help="HMAC-SHA256 signing secret (or RSNOTIFY_SECRET)",
    )
    push.add_argument(
        "--secret-id",
        type=argtypes.non_empty,
        default="k1",
        help="key id sent with signatures (for rotation)",
    )
    httpoptions.add_arguments(parser)
    ha = parser.add_argument_group("high availability")
    ha.add_argument(
        "--ha",
        action="store_true",
        help="run several publishers for one Source: a Redis lease elects the one that publishes",
    )
    ha.add_argument("--ha-group", help="name shared by the publishers of one Source")
    ha.add_argument(
        "--lease-ttl",
        type=argtypes.positive_number,
        default=3.0,
        help="leader lease TTL in seconds",
    )
    ops = parser.add_argument_group("operations")
    ops.add_argument(
        "--metrics-port", type=argtypes.port, help="serve /metrics and /healthz on this port"
    )
    ops.add_argument("--metrics-host", default="127.0.0.1")
    ops.add_argument(
        "--report",
        type=argtypes.redis_url,
        metavar="URL",
        help="dashboard telemetry (default: --redis)",
    )
    ops.add_argument("--log-level", type=argtypes.log_level, default="info")
    ops.add_argument("--log-format", choices=("auto", "json", "text"), default="auto")


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
    if args.websub_allow_callback:
        from ..transport.websubguard import CallbackPolicy

        try:
            CallbackPolicy.parse(args.websub_allow_callback)
        except ValueError as exc:
            print(f"rsnotify publish: {exc}", flush=True)
            return 2
    if not (args.mqtt or args.ws or args.websub):
        print(
            "rsnotify publish: note: no --mqtt, --ws or --websub given; "
            "notifications are only logged",
            flush=True,
        )
    try:
        http = httpoptions.policy_from_args(args)
    except ValueError as exc:
        print(f"rsnotify publish: {exc}", flush=True)
        return 2
    config = PublisherConfig(
        source=args.source,
        http=http,
        redis=args.redis,
        state_dir=args.state_dir,
        mqtt=args.mqtt,
        ws=args.ws,
        ws_only=args.ws_only,
        mqtt_only=args.mqtt_only,
        mqtt_hub=args.mqtt_hub,
        poll=args.poll,
        watch=args.watch,
        lenient=lenient_rules(args),
        topic_prefix=args.topic_prefix,
        mqtt_protocol=args.mqtt_protocol,
        legacy_topics=args.legacy_topics,
        heartbeat=args.heartbeat,
        retention=args.retain,
        fmt=args.format,
        secret=args.secret.encode() if args.secret else None,
        secret_id=args.secret_id,
        ws_token=args.ws_token,
        ws_cert=args.ws_cert,
        ws_key=args.ws_key,
        from_beginning=args.from_beginning,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        collections=args.collection,
        mqtt_tls_ca=args.mqtt_ca,
        mqtt_tls_insecure=args.mqtt_insecure,
        write_hubs=args.write_hubs,
        report=args.report or args.redis,
        ha=args.ha,
        ha_group=args.ha_group,
        lease_ttl=args.lease_ttl,
        websub=args.websub,
        websub_url=args.websub_url,
        websub_lease=args.websub_lease,
        websub_retry_max=args.websub_retry_max,
        websub_lease_min=args.websub_lease_min,
        websub_lease_max=args.websub_lease_max,
        websub_allow_callback=args.websub_allow_callback,
        websub_max_subscriptions=args.websub_max_subscriptions,
        websub_max_per_client=args.websub_max_per_client,
        websub_max_per_host=args.websub_max_per_client,
        websub_hub=args.websub_hub,
        websub_hub_mode=args.websub_hub_mode,
        framework_interval=args.framework_interval,
        ws_max_per_address=args.ws_max_per_address,
        redis_wait=args.redis_wait,
    )
    return asyncio.run(service.run(config))
