"""``rsnotify subscribe SOURCE --into DIR``: the command-line front of :mod:`.service`."""

from __future__ import annotations

import argparse
import asyncio

from .. import argtypes, httpoptions, memtrace
from ..commonoptions import LOG, METRICS_HOST, MQTT_PROTOCOL, lenient_options, lenient_rules
from ..errors import RsNotifyError
from ..logs import setup as setup_logging
from ..options import Options, build, flag, option, positional, repeated
from ..runtime import settle_gc
from ..transport.topics import prefix_argument
from . import service
from .pushhealth import DEFAULT_GRACE, DEFAULT_INTERVAL
from .resources import LOG_ROWS
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


OPTIONS = Options(
    positional(
        "source",
        type=argtypes.http_url,
        metavar="SOURCE",
        help="the Source's base URL or a Capability List URL",
    ),
    option(
        "--into",
        required=True,
        type=argtypes.non_empty,
        metavar="DIR",
        help="the mirror directory: new, empty, or one rsnotify made (never / or your home)",
    ),
    flag(
        "--adopt",
        help="take over a non-empty --into that rsnotify did not make (its own files stay; "
        "rsnotify's temp files are the only ones it ever cleans up)",
    ),
    # The Destination reads Change Lists out of order by default (resync-built Sources
    # group them by change type): --strict refuses them (Z39.99 section 12.1).
    lenient_options(default="order"),
    option(
        "--state",
        metavar="DIR",
        help="cursor and resource state (default: .<DIR>.rsnotify beside DIR)",
    ),
    option(
        "--via",
        type=channel_argument,
        metavar="URL",
        help="push channel (mqtt://host:port, ws://host:port, websub for the advertised "
        "WebSub hub, or a WebSub hub's http(s):// URL); default: the advertised hub",
    ),
    option(
        "--callback",
        metavar="URL",
        help="WebSub: this Destination's callback base URL (collection c is <URL>/c)",
    ),
    option(
        "--callback-listen",
        metavar="HOST:PORT",
        help="WebSub: bind here instead of the --callback URL's host and port",
    ),
    option(
        "--websub-lease",
        type=argtypes.positive_int,
        metavar="SECONDS",
        help="WebSub: hub.lease_seconds to ask for (renewed at 2/3; default: the hub's)",
    ),
    repeated(
        "--collection",
        metavar="URL|ID",
        help="follow only these (repeatable)",
        field="collections",
    ),
    option(
        "--topic-prefix",
        type=prefix_argument,
        help="MQTT topic prefix (default: from the advertised hub)",
    ),
    option(
        "--concurrency",
        type=argtypes.positive_int,
        default=16,
        help="resources fetched at once, >= 1 (default 16)",
    ),
    flag("--metadata-only", help="record changes without fetching resources"),
    flag(
        "--spare-inodes",
        toggle=True,
        default=False,
        help="replace small files by swapping in inodes earlier replaces retired, kept in "
        "<state>/spare, instead of a new file each time; saves most on ext4 without a "
        "journal, and helped at ~1,000 changes/s with one (bench/README.md); files then "
        "take the state directory's SELinux label, default ACL and group (default: off)",
    ),
    option(
        "--parse-processes",
        type=argtypes.nonneg_int,
        metavar="N",
        help="worker processes that parse the Change Lists a catch-up reads, beside the "
        "event loop; 0: parse in a thread (default: 1 where there is a second core)",
    ),
    flag("--once", help="catch up to the Source's current state and exit"),
    option(
        "--heartbeat-timeout",
        type=argtypes.positive_number,
        default=30.0,
        help="seconds without a heartbeat before catching up",
    ),
    option(
        "--safety-poll",
        type=argtypes.positive_number,
        default=300.0,
        help="seconds between safety polls of the Change Lists",
    ),
    repeated(
        "--secret",
        type=secret_argument,
        default_env="RSNOTIFY_SECRET",
        metavar="[KEYID=]SECRET",
        help="require notifications signed with this secret (repeat for key rotation)",
        secret=True,
        field="secrets",
        to_field=parse_secrets,
    ),
    option(
        "--degraded-poll",
        type=argtypes.positive_number,
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help="while push is unavailable, poll the Change Lists this often (conditional, ranged "
        "GETs; default %(default)g)",
    ),
    option(
        "--resourcelist-poll",
        type=argtypes.positive_number,
        default=300.0,
        metavar="SECONDS",
        help="a collection without a Change List is followed by re-reading its Resource List "
        "(Index) this often when no push arrives: conditional GETs, and only changed parts "
        "are parsed (default %(default)g)",
    ),
    option(
        "--degraded-after",
        type=argtypes.nonneg_number,
        default=DEFAULT_GRACE,
        metavar="SECONDS",
        help="push down (not connected, refused, unreachable) this long before polling starts; "
        "a refusal starts it at once (default %(default)g)",
    ),
    option(
        "--max-clock-skew",
        type=argtypes.nonneg_number,
        default=DEFAULT_MAX_SKEW,
        metavar="SECONDS",
        help="refuse pushed changes dated more than this ahead of this host's clock, and never "
        "trust such a date for ordering (default %(default)g)",
        field="max_skew",
    ),
    option(
        "--ws-token",
        type=argtypes.non_empty,
        default_env="RSNOTIFY_WS_TOKEN",
        help="bearer token for the WebSocket gateway",
        secret=True,
    ),
    repeated(
        "--allow-origin",
        type=argtypes.http_url,
        metavar="URL",
        help="also fetch from this origin (mirrors)",
        field="allow_origins",
    ),
    option(
        "--apply-log-rows",
        type=argtypes.nonneg_int,
        default=LOG_ROWS,
        metavar="N",
        help="keep the newest N rows of the apply log (<state>/resources.sqlite3, one row per "
        "change and what became of it); 0 keeps every row (default %(default)d, ~150 MB)",
    ),
    option(
        "--on-change",
        metavar="CMD",
        help="run CMD per applied change (RSNOTIFY_CHANGE, _LOC, _PATH, _DATETIME, _SEQ)",
    ),
    option(
        "--retries",
        type=argtypes.nonneg_int,
        default=5,
        help="retries per change on fixity or transient errors",
    ),
    option("--name", help="subscriber name in metrics and the dashboard"),
    option("--report", type=argtypes.redis_url, metavar="URL", help="send telemetry to this Redis"),
    option(
        "--redis",
        type=argtypes.redis_url,
        metavar="URL",
        help="keep the cursors in this Redis (key rsn:dest:{NAME}:cursors) instead of SQLite",
    ),
    httpoptions.HTTP,
    option("--mqtt-ca", metavar="FILE", field="mqtt_tls_ca"),
    flag("--mqtt-insecure", field="mqtt_tls_insecure"),
    MQTT_PROTOCOL,
    option(
        "--ws-ca",
        metavar="FILE",
        help="CA certificate for wss:// (default: the system store)",
        field="ws_tls_ca",
    ),
    option("--metrics-port", type=argtypes.port),
    METRICS_HOST,
    LOG,
)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, args.log_format)
    memtrace.start_from_env(NAME)  # RSNOTIFY_TRACEMALLOC=PATH: a diagnostic, off by default
    try:
        http = httpoptions.policy_from_args(args)
    except ValueError as exc:
        print(f"rsnotify subscribe: {exc}", flush=True)
        return 2
    config = build(SubscriberConfig, OPTIONS, args, http=http, lenient=lenient_rules(args))
    return asyncio.run(service.run(config, on_live=settle_gc))
