"""One live rsnotify deployment as real processes, and the measurements a scenario needs.

:class:`Stack` starts Redis, Mosquitto, ``rsnotify simulate`` (paused),
``rsnotify publish`` and two ``rsnotify subscribe`` processes (``mqtt`` and
``ws``), waits until both subscribers are live, and then lets the Source
change.  Everything lives under one work directory and is stopped, by pid, by
:meth:`Stack.close` whatever happened.

Measurements:

* **published**: the heads of the publisher's Redis log (every notification
  that got a sequence number);
* **lag**: a subscriber has caught up with the Source as of some instant when
  its resource store holds, per collection, a change at least as recent as the
  Source's last change at that instant (:meth:`Stack.caught_up`);
* **apply logs** and mirror comparison with ``/_simulator/state``
  (:meth:`Stack.outcome`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rsnotify import w3cdt
from rsnotify.log.redis_log import RedisLog
from rsnotify.subscriber.mirror import TEMP_PREFIX
from rsnotify.subscriber.resources import ApplyRecord
from rsnotify.subscriber.service import default_state_dir
from tests.devstack import (
    ManagedProcess,
    Mosquitto,
    Redis,
    free_port,
    rsnotify_command,
    wait_for,
)
from tests.groundtruth import mirror_differences
from tests.helpers import get_json, newer_never_overwritten, post_json, read_apply_log

SUBSCRIBERS = ("mqtt", "ws")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass
class StackOptions:
    """The shape of one deployment; scenarios change what their fault needs."""

    collections: int = 2
    resources: int = 60
    payload_bytes: int = 2048
    rate: float = 100.0
    changelist_size: int = 300
    simulator_args: Sequence[str] = ()
    subscriber_args: Sequence[str] = ()
    publisher_args: Sequence[str] = ()
    # Where the simulator, the WebSocket gateway and an extra broker listener
    # are reached by the subscribers (an address on a veth for netns runs).
    host: str = "127.0.0.1"
    # Prefix for the subscribers' argv (e.g. ``ip netns exec NS``).
    subscriber_wrapper: Sequence[str] = ()
    # Mirror directories per subscriber (default: under the work directory).
    mirrors: dict[str, Path] = field(default_factory=dict)
    seed: int = 20261122
    subscribers: Sequence[str] = SUBSCRIBERS


@dataclass
class SubscriberOutcome:
    name: str
    applied: int
    duplicates_applied: int
    stale: list[str]
    differences: list[str]
    temp_files: list[str]


class Stack:
    """The processes of one scenario run (see the module docstring)."""

    def __init__(self, workdir: Path, options: StackOptions | None = None) -> None:
        self.workdir = workdir
        self.options = options or StackOptions()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._exit = ExitStack()
        self.redis = Redis(workdir / "redis")
        self._exit.callback(self.redis.stop)
        self.mqtt_port = free_port()
        listeners = []
        if self.options.host != "127.0.0.1":
            listeners.append(f"listener {self.mqtt_port} {self.options.host}")
        # Persistence (saved every second) keeps the subscriber's session across restarts.
        self.broker = Mosquitto(
            workdir / "mosquitto",
            port=self.mqtt_port,
            persistence=True,
            max_queued_messages=100_000,
            max_inflight_messages=100,
            extra_config=["autosave_interval 1", *listeners],
        )
        self._exit.callback(self.broker.stop)
        self.ws_port = free_port()
        self.source = ""
        self.simulator: ManagedProcess | None = None
        self.publisher: ManagedProcess | None = None
        self.subscribers: dict[str, ManagedProcess] = {}
        self.mirrors: dict[str, Path] = {
            name: self.options.mirrors.get(name, workdir / f"mirror-{name}")
            for name in self.options.subscribers
        }

    # -- lifecycle -----------------------------------------------------------------

    def _process(self, argv: list[str], name: str) -> ManagedProcess:
        process = ManagedProcess(argv, workdir=self.workdir / "logs", name=name)
        self._exit.callback(process.terminate)
        return process

    @property
    def broker_url(self) -> str:
        """The broker as the subscribers reach it."""
        return f"mqtt://{self.options.host}:{self.mqtt_port}"

    def start(self) -> Stack:
        options = self.options
        self.redis.start(timeout=20)
        self.broker.start(timeout=20)
        host = options.host
        self.simulator = self._process(
            rsnotify_command(
                "simulate",
                "--host", host,
                "--port", "0",
                "--collections", str(options.collections),
                "--resources", str(options.resources),
                "--payload-bytes", str(options.payload_bytes),
                "--rate", str(options.rate),
                "--changelist-size", str(options.changelist_size),
                "--seed", str(options.seed),
                "--paused",
                "--hub", f"ws://{host}:{self.ws_port}/{{id}}",
                "--hub", f"{self.broker_url}/resourcesync/{{id}}/changes",
                *options.simulator_args,
            ),
            "simulate",
        ).start()  # fmt: skip
        self.source = self.simulator.wait_for_line(r"serving (http://\S+)", timeout=30).group(1)
        self.publisher = self._process(
            rsnotify_command(
                "publish", self.source,
                "--redis", self.redis.url,
                "--mqtt", self.broker.url,
                "--ws", f"{host}:{self.ws_port}",
                "--poll", "0.1",
                "--heartbeat", "1",
                "--log-format", "json",
                *options.publisher_args,
            ),
            "publish",
        ).start()  # fmt: skip
        self.publisher.wait_for_line(r"rsnotify publish: running", timeout=30)
        vias = {"mqtt": self.broker_url, "ws": f"ws://{host}:{self.ws_port}"}
        for name in options.subscribers:
            argv = [
                *options.subscriber_wrapper,
                *rsnotify_command(
                    "subscribe", self.source,
                    "--into", str(self.mirrors[name]),
                    "--via", vias[name],
                    "--name", f"chaos-{name}",
                    "--log-format", "json",
                    *options.subscriber_args,
                ),
            ]  # fmt: skip
            self.subscribers[name] = self._process(argv, f"subscribe-{name}").start()
        for name in options.subscribers:
            self.wait_live(name)
        post_json(f"{self.source}_simulator/resume")
        return self

    def wait_live(self, name: str, timeout: float = 90) -> None:
        """Wait for one ``live`` line per collection from this run of ``name``."""
        process = self.subscribers[name]
        wait_for(
            lambda: process.output("stdout").count(": live\n") >= self.options.collections,
            timeout=timeout,
            interval=0.1,
            message=lambda: f"{process.name} did not go live\n{process.tail()}",
        )

    def close(self) -> None:
        self._exit.close()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the Source ----------------------------------------------------------------

    def control(self, what: str, body: Any = None) -> Any:
        return post_json(f"{self.source}_simulator/{what}", body)

    def stats(self) -> dict[str, Any]:
        return dict(get_json(f"{self.source}_simulator/stats"))

    def state(self) -> dict[str, Any]:
        return dict(get_json(f"{self.source}_simulator/state"))

    def freeze(self) -> dict[str, Any]:
        """Stop the Source changing; return its final state."""
        self.control("pause")
        self.control("faults", {"mode": "none", "seconds": 0})
        return self.state()

    # -- measurements --------------------------------------------------------------

    def source_marks(self) -> dict[str, int]:
        """Per collection prefix: the Source's last change (epoch microseconds) right now."""
        marks = {}
        for cap, collection in self.state()["collections"].items():
            last = collection["last_change"]
            if last is not None:
                prefix = cap.rsplit("/", 1)[0] + "/"
                marks[prefix] = _us(w3cdt.parse(last))
        return marks

    def caught_up(self, name: str, marks: dict[str, int]) -> bool:
        """Whether subscriber ``name`` has applied, per collection, a change as recent as ``marks``.

        Reads the subscriber's resource store read-only (SQLite WAL allows a
        reader beside the writer); a busy or missing store reads as not yet.
        """
        path = self.state_dir(name) / "resources.sqlite3"
        if not path.exists():
            return False
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
        except sqlite3.Error:
            return False
        try:
            for prefix, mark in marks.items():
                row = db.execute(
                    "SELECT max(datetime_us) FROM resources WHERE loc >= ? AND loc < ?",
                    (prefix, prefix + "\uffff"),
                ).fetchone()
                if row is None or row[0] is None or row[0] < mark:
                    return False
            return True
        except sqlite3.Error:
            return False
        finally:
            db.close()

    def lag_s(self, name: str) -> float | None:
        """Seconds between now and the newest change ``name`` has applied (None: nothing yet)."""
        path = self.state_dir(name) / "resources.sqlite3"
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
            try:
                (newest,) = db.execute("SELECT max(datetime_us) FROM resources").fetchone()
            finally:
                db.close()
        except sqlite3.Error:
            return None
        return None if newest is None else round(time.time() - newest / 1e6, 2)

    def wait_recovered(self, timeout: float = 180) -> float:
        """Seconds until every subscriber caught up with the Source as of now."""
        started = time.monotonic()
        marks = self.source_marks()
        pending = set(self.subscribers)

        def done() -> bool:
            for name in list(pending):
                if self.caught_up(name, marks):
                    pending.discard(name)
            return not pending

        wait_for(
            done,
            timeout=timeout,
            interval=0.1,
            message=lambda: (
                f"{sorted(pending)} did not catch up\n"
                + "\n".join(self.subscribers[n].tail(15) for n in pending)
            ),
        )
        return time.monotonic() - started

    def state_dir(self, name: str) -> Path:
        return default_state_dir(str(self.mirrors[name]))

    def published(self) -> int:
        """Notifications that got a sequence number: the sum of the Redis log's heads."""

        async def heads() -> int:
            log = RedisLog(self.redis.url)
            try:
                return sum([await log.head(c) for c in await log.collections()])
            finally:
                await log.close()

        return asyncio.run(heads())

    def collection_ids(self) -> list[str]:
        """The rsnotify collection ids the publisher registered."""

        async def ids() -> list[str]:
            log = RedisLog(self.redis.url)
            try:
                return sorted(await log.collections())
            finally:
                await log.close()

        return asyncio.run(ids())

    def converge(self, state: dict[str, Any], timeout: float) -> dict[str, list[str]]:
        """Wait until every mirror equals ``state``; the differences left at the deadline."""
        last: dict[str, list[str]] = {}

        def equal() -> bool:
            for name, mirror in self.mirrors.items():
                try:
                    last[name] = mirror_differences(state, mirror)
                except FileNotFoundError as exc:  # deleted between listing and hashing
                    last[name] = [f"changing: {exc.filename}"]
            return not any(last.values())

        with contextlib.suppress(AssertionError):
            wait_for(equal, timeout=timeout, interval=0.5)
        return last

    def outcome(self, name: str, differences: list[str]) -> SubscriberOutcome:
        records = asyncio.run(read_apply_log(self.mirrors[name], self.state_dir(name)))
        return SubscriberOutcome(
            name=name,
            applied=len(_writes(records)),
            duplicates_applied=duplicates(records),
            stale=newer_never_overwritten(records),
            differences=differences,
            temp_files=[str(p) for p in self.mirrors[name].rglob(f"{TEMP_PREFIX}*")],
        )

    def dead(self) -> list[str]:
        """Processes of the stack that are not running (they should all be)."""
        processes = {"publisher": self.publisher, **self.subscribers}
        return [n for n, p in processes.items() if p is None or not p.running]


def _writes(records: list[ApplyRecord]) -> list[ApplyRecord]:
    return [r for r in records if r.outcome in ("applied", "deleted")]


def duplicates(records: list[ApplyRecord]) -> int:
    """Writes of a (loc, change datetime) already written once: work done twice."""
    writes = _writes(records)
    return len(writes) - len({(r.loc, r.datetime) for r in writes})


def _us(when: datetime) -> int:
    delta = when.astimezone(UTC) - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
