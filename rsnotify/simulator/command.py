"""``rsnotify simulate``: serve a changing ResourceSync Source over HTTP.

On start the command prints exactly one line to stdout,
``rsnotify simulate: serving http://HOST:PORT/``, and flushes it, so scripts
and tests can wait for it (with ``--port 0`` it names the port picked).  On a
terminal a one-line live status follows on stderr; when stderr is not a TTY
the command says nothing more.  SIGINT / SIGTERM stop it cleanly (the
``--dir`` copy is brought up to date first) with exit status 0; a bad option
exits with status 2 and a one-line error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from .. import argtypes
from ..options import Group, Options, build, flag, option, repeated
from .server import Simulator, SimulatorConfig
from .site import RESOURCE_LIST_LIMIT
from .source import DEFAULT_CHANGELIST_SIZE, SimulatorError, Weights

NAME = "simulate"
HELP = "Serve a changing ResourceSync Source over HTTP (for demos, tests and benchmarks)."

_STATUS_INTERVAL = 0.5


def _weights(text: str) -> Weights:
    try:
        return Weights.parse(text)
    except SimulatorError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


SERVING = Group(
    "serving",
    option("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"),
    option("--port", type=argtypes.port, default=0, help="port; 0 picks a free one (default)"),
    option(
        "--base-url",
        help="URL prefix written into the documents (default http://HOST:PORT/); set it when "
        "another server serves the --dir copy",
    ),
    option(
        "--dir",
        type=Path,
        help="also write every document and resource under this directory, for a static server",
    ),
    flag(
        "--spare-inodes",
        toggle=True,
        default=False,
        help="--dir replaces files by swapping in inodes earlier replaces retired, kept in "
        "DIR/.rsnotify-spare; saves most on ext4 without a journal (default: off)",
    ),
)
SOURCE = Group(
    "the Source",
    option(
        "--collections",
        type=argtypes.positive_int,
        default=1,
        help="collections, one Capability List each (default: %(default)s)",
    ),
    option(
        "--resources",
        type=argtypes.nonneg_int,
        default=100,
        help="initial resources per collection (default: %(default)s)",
    ),
    option(
        "--payload-bytes",
        type=argtypes.nonneg_int,
        default=1024,
        help="mean resource size in bytes (default: %(default)s)",
    ),
    option(
        "--changelist-size",
        type=argtypes.positive_int,
        default=DEFAULT_CHANGELIST_SIZE,
        help="entries after which the open Change List is closed and a new one opened "
        "(default: %(default)s)",
    ),
    option(
        "--resourcelist-size",
        type=argtypes.positive_int,
        default=RESOURCE_LIST_LIMIT,
        help="entries per Resource List before it becomes an index with parts "
        "(default: %(default)s)",
    ),
    repeated(
        "--hub",
        metavar="URL",
        help="advertise a push channel in every Capability List ({collection} is replaced by "
        "c1, c2..., {id} by the rsnotify collection id): http(s) as a WebSub topic (Change "
        "Notification section 5; hub = the URL before {id}) with its framework topic "
        "URL/framework (Framework Notification section 5), mqtt/ws as rsnotify channels; "
        "repeatable",
        field="hubs",
        to_field=tuple,
    ),
    repeated(
        "--ping",
        metavar="URL",
        help="after each batch of changes, POST hub.mode=publish (hub.url = the Capability "
        "List) to this hub, e.g. rsnotify publish --websub's; repeatable",
        field="pings",
        to_field=tuple,
    ),
    option(
        "--ping-secret",
        metavar="SECRET",
        help="sign pings with X-Hub-Signature (the publisher's --secret)",
        secret=True,
    ),
    option(
        "--spec-version",
        choices=("1.0", "1.1"),
        default="1.1",
        help="1.1 writes rs:md datetime and <lastmod>; 1.0 only <lastmod> (default: %(default)s)",
    ),
    flag(
        "--change-dump",
        help="also publish a Change Dump (Z39.99 section 13): a ZIP package of the changed "
        "bitstreams, with its Change Dump Manifest, for every closed Change List",
    ),
    option(
        "--large-every",
        type=argtypes.nonneg_int,
        default=0,
        metavar="N",
        help="make one resource URI in N large (--large-bytes), e.g. to kill a Destination "
        "mid-write (default: none)",
    ),
    option(
        "--large-bytes",
        type=argtypes.nonneg_int,
        default=4 * 1024 * 1024,
        help="mean size of the large resources (default: %(default)s)",
    ),
)
CHANGES = Group(
    "changes",
    option(
        "--rate",
        type=argtypes.nonneg_number,
        default=10.0,
        help="changes per second across all collections, 0 for none (default: %(default)s)",
    ),
    option(
        "--max-changes",
        type=argtypes.nonneg_int,
        help="stop changing after this many changes, but keep serving",
    ),
    option(
        "--weights",
        type=_weights,
        default="created=1,updated=3,deleted=1",
        help="relative frequency of each kind of change (default: %(default)s)",
    ),
    option(
        "--resurrect",
        type=float,
        default=0.25,
        help="probability that a creation re-creates a deleted URI (default: %(default)s)",
    ),
    option(
        "--seed",
        type=int,
        help="random seed for a repeatable run (default: a random one, shown in /_simulator/stats)",
    ),
    flag(
        "--paused",
        help="start with the generator paused (POST /_simulator/resume to start it)",
    ),
    option(
        "--clock-skew",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="run the Source's clock this many seconds ahead (negative: behind) of real time",
    ),
    option(
        "--tick",
        type=argtypes.positive_number,
        default=0.01,
        help="seconds between generator batches (default: %(default)s)",
    ),
)
OPTIONS = Options(
    SERVING,
    SOURCE,
    CHANGES,
    flag("--quiet", help="no live status line even on a terminal", field=None),
)


def config_from_args(args: argparse.Namespace) -> SimulatorConfig:
    return build(SimulatorConfig, OPTIONS, args)


async def _main(config: SimulatorConfig, quiet: bool) -> int:
    simulator = Simulator(config)
    await simulator.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    print(f"rsnotify simulate: serving {simulator.url}", flush=True)
    live = not quiet and sys.stderr.isatty()
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _STATUS_INTERVAL)
            if live:
                sys.stderr.write("\r\x1b[2K" + simulator.status_line())
                sys.stderr.flush()
    finally:
        if live:
            sys.stderr.write("\n")
        await simulator.stop()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
        return asyncio.run(_main(config, args.quiet))
    except SimulatorError as exc:
        print(f"rsnotify simulate: error: {exc}", file=sys.stderr)
        return 2
