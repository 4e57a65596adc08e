"""The fault matrix: one :class:`Scenario` per fault, each injected repeatedly.

A scenario is an *environment* (what the stack needs around it: a tmpfs, a
network namespace, a simulator option) and an *inject* function that causes
the fault, holds it for :attr:`Timing.fault_s` and clears it.  The runner
(:mod:`.matrix`) measures recovery after each clear.

Sleeps in this module are scenario durations ("the broker stays down for N
seconds"), never synchronisation: every wait for a state uses ``wait_for``.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from rsnotify.subscriber.mirror import TEMP_PREFIX
from tests.devstack import wait_for

from . import netns
from .stack import SUBSCRIBERS, Stack, StackOptions


@dataclass(frozen=True)
class Timing:
    """How long faults last and how long the stack runs undisturbed between them."""

    healthy_s: float = 4.0
    fault_s: float = 6.0
    # An HTTP hold must outlast the clients' 30 s timeout to be a real timeout.
    timeout_s: float = 35.0
    # Long enough for MQTT keepalive (15 s: a PINGREQ after 15 s of silence,
    # then up to 15 s for its answer) and WebSocket pings (10 s + 20 s) to
    # give up; a shorter one is noticed by the heartbeat timeout only.
    partition_s: float = 35.0


SHORT = Timing(healthy_s=1.0, fault_s=2.5, timeout_s=5.0, partition_s=12.0)
FULL = Timing()


@dataclass
class Context:
    """What an inject function gets: the stack, the timing, and a place for notes."""

    stack: Stack
    timing: Timing
    workdir: Path
    notes: list[str] = field(default_factory=list)
    counter: itertools.count[int] = field(default_factory=itertools.count)
    # Source changes that may legitimately never be published (entries removed
    # from a Change List before the publisher read them).
    unlisted: int = 0

    def hold(self, seconds: float) -> None:
        """The scenario itself: the fault stays in force this long."""
        time.sleep(seconds)


Environment = Callable[[Path], AbstractContextManager[StackOptions]]


@contextlib.contextmanager
def plain(workdir: Path) -> Iterator[StackOptions]:
    yield StackOptions()


@dataclass(frozen=True)
class Scenario:
    name: str
    inject: Callable[[Context], None]
    environment: Environment = plain
    doc: str = ""


# --- process faults ------------------------------------------------------------------


def kill_publisher(ctx: Context) -> None:
    publisher = ctx.stack.publisher
    assert publisher is not None
    code = publisher.kill()
    assert code == -9, f"publisher ended with {code}, not by SIGKILL"
    ctx.hold(ctx.timing.fault_s / 3)
    publisher.start().wait_for_line(r"rsnotify publish: running", timeout=60)


@contextlib.contextmanager
def large_resources(workdir: Path) -> Iterator[StackOptions]:
    """One URI in 15 is ~2 MB, so a kill often lands in the middle of writing one."""
    yield StackOptions(
        rate=40,
        simulator_args=["--large-every", "15", "--large-bytes", str(2 * 1024 * 1024)],
    )


def kill_subscriber(ctx: Context) -> None:
    """kill -9 the subscribers in turn, preferably while a temporary file is being written."""
    name = SUBSCRIBERS[next(ctx.counter) % len(SUBSCRIBERS)]
    process = ctx.stack.subscribers[name]
    mirror = ctx.stack.mirrors[name]

    def writing() -> bool:
        return any(True for _ in mirror.rglob(f"{TEMP_PREFIX}*"))

    try:
        wait_for(writing, timeout=10, interval=0.002)
        ctx.notes.append(f"{name} killed mid-write")
    except AssertionError:
        ctx.notes.append(f"{name} killed (no write in progress within 10 s)")
    code = process.kill()
    assert code == -9, f"{name} ended with {code}, not by SIGKILL"
    ctx.hold(ctx.timing.fault_s / 3)
    process.start()
    ctx.stack.wait_live(name)


def broker_restart(ctx: Context) -> None:
    broker = ctx.stack.broker
    broker.stop()
    ctx.hold(ctx.timing.fault_s)
    broker.start(timeout=30)


def broker_sigstop(ctx: Context) -> None:
    broker = ctx.stack.broker
    broker.pause()
    try:
        ctx.hold(ctx.timing.fault_s)
    finally:
        broker.resume()


def redis_restart(ctx: Context) -> None:
    redis = ctx.stack.redis
    redis.stop()
    ctx.hold(ctx.timing.fault_s)
    redis.start(timeout=30)


def redis_kill(ctx: Context) -> None:
    """kill -9 Redis: with ``appendfsync everysec`` up to a second of log writes is lost."""
    redis = ctx.stack.redis
    code = redis.kill()
    assert code == -9, f"redis ended with {code}, not by SIGKILL"
    ctx.hold(ctx.timing.fault_s)
    redis.start(timeout=30)


def redis_sigstop(ctx: Context) -> None:
    redis = ctx.stack.redis
    redis.pause()
    try:
        ctx.hold(ctx.timing.fault_s)
    finally:
        redis.resume()


# --- Source faults (the simulator's control endpoints) ----------------------------------


def source_fault(mode: str) -> Callable[[Context], None]:
    def inject(ctx: Context) -> None:
        seconds = ctx.timing.timeout_s if mode == "timeout" else ctx.timing.fault_s
        ctx.stack.control("faults", {"mode": mode, "seconds": seconds})
        try:
            ctx.hold(seconds)
            hits = ctx.stack.stats()["fault"]["hits"]
        finally:
            ctx.stack.control("faults", {"mode": "none", "seconds": 0})
        assert hits > 0, f"the {mode} fault hit no request: it proved nothing"
        ctx.notes.append(f"{hits} requests hit")

    return inject


def drop_entry(ctx: Context) -> None:
    """Republish each open Change List without one (superseded) entry, several times."""
    for _ in range(3):
        dropped = ctx.stack.control("drop-entry")["dropped"]
        ctx.unlisted += len(dropped)
        ctx.notes.append(f"dropped {len(dropped)}")
        ctx.hold(ctx.timing.fault_s / 3)


@contextlib.contextmanager
def skewed(workdir: Path) -> Iterator[StackOptions]:
    """The Source's clock starts 5 minutes ahead of the Destination's."""
    yield StackOptions(simulator_args=["--clock-skew", "300"])


SKEWS = (-300.0, 3600.0, -3600.0, 300.0, 0.0)


def clock_step(ctx: Context) -> None:
    """Step the Source's clock (ahead, behind, by an hour) while it keeps changing."""
    skew = SKEWS[next(ctx.counter) % len(SKEWS)]
    ctx.stack.control(f"clock?skew={skew:g}")
    ctx.notes.append(f"skew {skew:+g}s")
    ctx.hold(ctx.timing.fault_s)


# --- disk full -----------------------------------------------------------------------

TMPFS_SIZE = "16m"


@contextlib.contextmanager
def small_disk(workdir: Path) -> Iterator[StackOptions]:
    """The MQTT subscriber's mirror and state on a 16 MB tmpfs, unmounted afterwards."""
    fs = workdir / "smalldisk"
    fs.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(fs)],
        check=True,
        capture_output=True,
    )
    try:
        yield StackOptions(mirrors={"mqtt": fs / "mirror-mqtt"})
    finally:
        result = subprocess.run(["umount", str(fs)], capture_output=True)
        if result.returncode != 0:
            subprocess.run(["umount", "-l", str(fs)], capture_output=True)


def fill_disk(path: Path) -> int:
    """Write ``path`` until the file system is full; the bytes written."""
    written = 0
    chunk = b"\0" * (256 * 1024)
    with open(path, "wb", buffering=0) as handle:
        while True:
            try:
                written += handle.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    # Byte-sized writes take whatever a partial chunk left.
    with open(path, "ab", buffering=0) as handle:
        for _ in range(256 * 1024):
            try:
                written += handle.write(b"\0")
            except OSError:
                break
    return written


def disk_full(ctx: Context) -> None:
    """Fill the MQTT subscriber's file system, hold, free it: it must report, retry, go on."""
    filler = ctx.stack.mirrors["mqtt"].parent / "filler"
    process = ctx.stack.subscribers["mqtt"]
    try:
        written = fill_disk(filler)
        ctx.notes.append(f"filled {written // 1024} KiB")
        ctx.hold(ctx.timing.fault_s)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(filler)
    assert process.running, f"the subscriber exited on a full disk:\n{process.tail()}"


# --- network partition ----------------------------------------------------------------


def partition(ctx: Context) -> None:
    """Silently drop every packet between the subscribers' namespace and the rest.

    No RST, no FIN: both ends keep a half-open connection until the
    subscriber notices -- its heartbeat timeout (publisher heartbeats stop
    arriving), MQTT keepalive or WebSocket pings, whichever comes first.  Each
    subscriber must log that it noticed within a deadline; the notes say how.
    """
    link = netns.current()
    assert link is not None, "partition without a namespace"
    marks = {n: p.mark()[1] for n, p in ctx.stack.subscribers.items()}
    link.cut()
    try:
        ctx.hold(ctx.timing.partition_s)
    finally:
        link.restore()
    for name, process in ctx.stack.subscribers.items():
        path, mark = process.stderr_path, marks[name]
        wait_for(
            lambda path=path, mark=mark: bool(_detections(_after(path, mark))),
            timeout=30,
            interval=0.2,
            message=f"{name} never noticed the half-open connection",
        )
        how = ", ".join(sorted(_detections(_after(path, mark))))
        ctx.notes.append(f"{name} noticed by {how}")


DETECTIONS = {
    "heartbeat timeout": ": gap: no heartbeat",
    "MQTT keepalive": ": disconnected: MQTT",
    "WebSocket ping": "keepalive ping timeout",
}


def _detections(text: str) -> set[str]:
    return {how for how, needle in DETECTIONS.items() if needle in text}


def _after(path: Path, offset: int) -> str:
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode("utf-8", "replace")


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("kill-publisher", kill_publisher, doc="kill -9 the publisher, restart"),
    Scenario(
        "kill-subscriber",
        kill_subscriber,
        large_resources,
        "kill -9 a subscriber, preferably mid-write of a ~2 MB resource",
    ),
    Scenario("broker-restart", broker_restart, doc="Mosquitto stopped, down, started"),
    Scenario("broker-sigstop", broker_sigstop, doc="Mosquitto SIGSTOP (hung), SIGCONT"),
    Scenario("redis-restart", redis_restart, doc="Redis stopped, down, started"),
    Scenario("redis-kill", redis_kill, doc="Redis kill -9 (last second of AOF lost)"),
    Scenario("redis-sigstop", redis_sigstop, doc="Redis SIGSTOP (hung), SIGCONT"),
    Scenario("source-500", source_fault("500"), doc="the Source answers 500"),
    Scenario("source-timeout", source_fault("timeout"), doc="the Source holds requests"),
    Scenario("source-truncate", source_fault("truncate"), doc="bodies cut in half"),
    Scenario("source-bad-hash", source_fault("bad-hash"), doc="resource bytes altered"),
    Scenario("changelist-entry-removed", drop_entry, doc="open Change List loses an entry"),
    Scenario("clock-skew", clock_step, skewed, "Source clock ahead/behind, stepped"),
    Scenario("disk-full", disk_full, small_disk, "the MQTT mirror's tmpfs fills up"),
    Scenario("network-partition", partition, netns.isolated, "netns link drops everything"),
)

BY_NAME = {s.name: s for s in SCENARIOS}
