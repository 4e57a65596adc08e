"""``rsnotify subscribe SOURCE --into DIR``: the command-line front of :mod:`.service`."""

from __future__ import annotations

import argparse
import asyncio
import os

from .. import argtypes, httpoptions
from ..config import add_lenient_option, lenient_rules
from ..errors import RsNotifyError
from ..logs import setup as setup_logging
from ..transport.topics import prefix_argument, protocol_argument
from . import service
from .pushhealth import DEFAULT_GRACE, DEFAULT_INTERVAL
from .service import SubscriberConfig
from .trust import DEFAULT_MAX_SKEW

NAME = "subscribe"
HELP = "mirror a ResourceSync Source: baseline, then apply pushed changes, catching up on gaps"


def parse_secrets(values: list[str]) -> dict[str, bytes] | None:
    """``--secret KEYID=SECRET`` (repeatable, for rotation) or a bare secret (key id k1)."""
    if not values:
        return None
    keys: dict[str, bytes] = {}
    for value in values:
        key_id, sep, secret = value.partition("=")
        if sep and key_id and ":" not in key_id:
            keys[key_id] = secret.encode()
        else:
            keys["k1"] = value.encode()
    return keys


def secret_argument(text: str) -> str:
    """``[KEYID=]SECRET`` with a non-empty SECRET (an empty key would verify forgeries)."""
    key_id, sep, secret = text.partition("=")
    if sep and key_id and ":" not in key_id and not secret.strip():
        raise argparse.ArgumentTypeError(f"the secret after {key_id + '='!r} must not be empty")
    return argtypes.non_empty(text)


def channel_argument(text: str) -> str:
    """``--via``: a channel :func:`.service.channel_kind` knows."""
    try:
        service.channel_kind(text)
    except RsNotifyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        type=argtypes.http_url,
        metavar="SOURCE",
        help="the Source's base URL or a Capability List URL",
    )
    parser.add_argument(
        "--into",
        required=True,
        type=argtypes.non_empty,
        metavar="DIR",
        help="the mirror directory: new, empty, or one rsnotify made (never / or your home)",
    )
    parser.add_argument(
        "--adopt",
        action="store_true",
        help="take over a non-empty --into that rsnotify did not make (its own files stay; "
        "rsnotify's temp files are the only ones it ever cleans up)",
    )
    # The Destination reads Change Lists out of order by default (resync-built Sources
    # group them by change type): --strict refuses them (Z39.99 section 12.1).
    add_lenient_option(parser, default="order")
    parser.add_argument(
        "--state",
        metavar="DIR",
        help="cursor and resource state (default: .<DIR>.rsnotify beside DIR)",
    )
    parser.add_argument(
        "--via",
        type=channel_argument,
        metavar="URL",
        help="push channel (mqtt://host:port, ws://host:port, websub for the advertised "
        "WebSub hub, or a WebSub hub's http(s):// URL); default: the advertised hub",
    )
    parser.add_argument(
        "--callback",
        metavar="URL",
        help="WebSub: this Destination's callback base URL (collection c is <URL>/c)",
    )
    parser.add_argument(
        "--callback-listen",
        metavar="HOST:PORT",
        help="WebSub: bind here instead of the --callback URL's host and port",
    )
    parser.add_argument(
        "--websub-lease",
        type=argtypes.positive_int,
        metavar="SECONDS",
        help="WebSub: hub.lease_seconds to ask for (renewed at 2/3; default: the hub's)",
    )
    parser.add_argument(
        "--collection",
        action="append",
        default=[],
        metavar="URL|ID",
        help="follow only these (repeatable)",
    )
    parser.add_argument(
        "--topic-prefix",
        type=prefix_argument,
        help="MQTT topic prefix (default: from the advertised hub)",
    )
    parser.add_argument(
        "--concurrency",
        type=argtypes.positive_int,
        default=16,
        help="resources fetched at once, >= 1 (default 16)",
    )
    parser.add_argument(
        "--metadata-only", action="store_true", help="record changes without fetching resources"
    )
    parser.add_argument(
        "--spare-inodes",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="replace small files by swapping in inodes earlier replaces retired, kept in "
        "<state>/spare, instead of a new file each time; pays only on ext4 without a "
        "journal, and files then take the state directory's SELinux label, default ACL "
        "and group (default: off)",
    )
    parser.add_argument(
        "--once", action="store_true", help="catch up to the Source's current state and exit"
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=argtypes.positive_number,
        default=30.0,
        help="seconds without a heartbeat before catching up",
    )
    parser.add_argument(
        "--safety-poll",
        type=argtypes.positive_number,
        default=300.0,
        help="seconds between safety polls of the Change Lists",
    )
    parser.add_argument(
        "--secret",
        action="append",
        type=secret_argument,
        default=[s for s in [os.environ.get("RSNOTIFY_SECRET")] if s],
        metavar="[KEYID=]SECRET",
        help="require notifications signed with this secret (repeat for key rotation)",
    )
    parser.add_argument(
        "--degraded-poll",
        type=argtypes.positive_number,
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help="while push is unavailable, poll the Change Lists this often (conditional, ranged "
        "GETs; default %(default)g)",
    )
    parser.add_argument(
        "--degraded-after",
        type=argtypes.nonneg_number,
        default=DEFAULT_GRACE,
        metavar="SECONDS",
        help="push down (not connected, refused, unreachable) this long before polling starts; "
        "a refusal starts it at once (default %(default)g)",
    )
    parser.add_argument(
        "--max-clock-skew",
        type=argtypes.nonneg_number,
        default=DEFAULT_MAX_SKEW,
        metavar="SECONDS",
        help="refuse pushed changes dated more than this ahead of this host's clock, and never "
        "trust such a date for ordering (default %(default)g)",
    )
    parser.add_argument(
        "--ws-token",
        type=argtypes.non_empty,
        default=os.environ.get("RSNOTIFY_WS_TOKEN"),
        help="bearer token for the WebSocket gateway",
    )
    parser.add_argument(
        "--allow-origin",
        action="append",
        type=argtypes.http_url,
        default=[],
        metavar="URL",
        help="also fetch from this origin (mirrors)",
    )
    parser.add_argument(
        "--on-change",
        metavar="CMD",
        help="run CMD per applied change (RSNOTIFY_CHANGE, _LOC, _PATH, _DATETIME, _SEQ)",
    )
    parser.add_argument(
        "--retries",
        type=argtypes.nonneg_int,
        default=5,
        help="retries per change on fixity or transient errors",
    )
    parser.add_argument("--name", help="subscriber name in metrics and the dashboard")
    parser.add_argument(
        "--report", type=argtypes.redis_url, metavar="URL", help="send telemetry to this Redis"
    )
    parser.add_argument(
        "--redis",
        type=argtypes.redis_url,
        metavar="URL",
        help="keep the cursors in this Redis (key rsn:dest:{NAME}:cursors) instead of SQLite",
    )
    httpoptions.add_arguments(parser)
    parser.add_argument("--mqtt-ca", metavar="FILE")
    parser.add_argument("--mqtt-insecure", action="store_true")
    parser.add_argument(
        "--mqtt-protocol",
        type=protocol_argument,
        default="auto",
        help="MQTT version: auto (5, falling back to 3.1.1 when refused; default), 5 or 3.1.1",
    )
    parser.add_argument(
        "--ws-ca", metavar="FILE", help="CA certificate for wss:// (default: the system store)"
    )
    parser.add_argument("--metrics-port", type=argtypes.port)
    parser.add_argument("--metrics-host", default="127.0.0.1")
    parser.add_argument("--log-level", type=argtypes.log_level, default="info")
    parser.add_argument("--log-format", choices=("auto", "json", "text"), default="auto")


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, args.log_format)
    try:
        http = httpoptions.policy_from_args(args)
    except ValueError as exc:
        print(f"rsnotify subscribe: {exc}", flush=True)
        return 2
    config = SubscriberConfig(
        source=args.source,
        http=http,
        into=args.into,
        adopt=args.adopt,
        state=args.state,
        via=args.via,
        collections=args.collection,
        topic_prefix=args.topic_prefix,
        concurrency=args.concurrency,
        metadata_only=args.metadata_only,
        spare_inodes=args.spare_inodes,
        once=args.once,
        heartbeat_timeout=args.heartbeat_timeout,
        safety_poll=args.safety_poll,
        secrets=parse_secrets(args.secret),
        max_skew=args.max_clock_skew,
        degraded_poll=args.degraded_poll,
        degraded_after=args.degraded_after,
        lenient=lenient_rules(args),
        ws_token=args.ws_token,
        allow_origins=args.allow_origin,
        on_change=args.on_change,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        name=args.name,
        report=args.report,
        redis=args.redis,
        mqtt_tls_ca=args.mqtt_ca,
        mqtt_tls_insecure=args.mqtt_insecure,
        mqtt_protocol=args.mqtt_protocol,
        ws_tls_ca=args.ws_ca,
        retries=args.retries,
        callback=args.callback,
        callback_listen=args.callback_listen,
        websub_lease=args.websub_lease,
    )
    return asyncio.run(service.run(config))
