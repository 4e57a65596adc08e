"""``rsnotify dashboard``: the command-line front of :mod:`.server`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from .. import argtypes
from ..commonoptions import LOG, MQTT_PROTOCOL
from ..errors import RsNotifyError
from ..logs import setup as setup_logging
from ..options import Options, build, option, repeated
from ..transport.topics import prefix_argument
from .server import Dashboard, DashboardConfig

NAME = "dashboard"
HELP = "serve a live page of publish rates, subscriber lags and end-to-end latency"

log = logging.getLogger("rsnotify.dashboard")


OPTIONS = Options(
    option(
        "--redis",
        type=argtypes.redis_url,
        default="redis://127.0.0.1:6379/0",
        metavar="URL",
        help="the Redis holding the log and the telemetry (default: %(default)s)",
    ),
    option(
        "--mqtt",
        type=argtypes.mqtt_url,
        metavar="URL",
        help="also read publisher heartbeats from the retained <prefix>/<collection>/head",
    ),
    option(
        "--topic-prefix",
        type=prefix_argument,
        default="resourcesync",
        help="MQTT topic prefix (default resourcesync)",
    ),
    MQTT_PROTOCOL,
    option(
        "--host",
        default="127.0.0.1",
        help="address to serve on; also a Host name the dashboard answers to",
    ),
    repeated(
        "--allow-host",
        type=argtypes.non_empty,
        metavar="NAME",
        help="also answer requests for this host name (repeatable; '*' for any). IP "
        "addresses, localhost and --host are always answered; other names are refused "
        "against DNS rebinding",
        field="allow_hosts",
    ),
    repeated(
        "--allow-ws-origin",
        type=argtypes.non_empty,
        metavar="ORIGIN",
        help="let pages from this origin (https://ops.example.org) read /ws (repeatable; "
        "'*' for any); by default only the dashboard's own page may",
        field="allow_ws_origins",
    ),
    option("--port", type=argtypes.port, default=8080, help="port; 0 picks a free one"),
    option(
        "--interval",
        type=argtypes.positive_number,
        default=1.0,
        help="seconds between page updates (default 1)",
    ),
    option(
        "--offline-after",
        type=argtypes.positive_number,
        default=5.0,
        help="a subscriber silent this many seconds is offline (default 5)",
    ),
    option(
        "--stale-after",
        type=argtypes.positive_number,
        default=15.0,
        help="a publisher heartbeat older than this is stale (default 15)",
    ),
    LOG,
)


async def _serve(config: DashboardConfig) -> int:
    dashboard = Dashboard(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await dashboard.start()
    except OSError as exc:
        print(f"rsnotify dashboard: cannot serve on {config.host}:{config.port}: {exc}", flush=True)
        await dashboard.stop()
        return 1
    print(f"rsnotify dashboard: serving {dashboard.url}", flush=True)
    if not dashboard.collector.ok:
        print(
            f"rsnotify dashboard: Redis not answering yet: {dashboard.collector.error}", flush=True
        )
    try:
        await stop.wait()
    finally:
        await dashboard.stop()
    return 0


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, args.log_format)
    try:
        config = build(DashboardConfig, OPTIONS, args)
        return asyncio.run(_serve(config))
    except RsNotifyError as exc:
        print(f"rsnotify dashboard: {exc}", flush=True)
        return 2
