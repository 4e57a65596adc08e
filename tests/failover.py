"""What the Redis failover tests share (Sentinel and Cluster, issue 19).

Independent witnesses of what was pushed: an MQTT subscriber
(:class:`MqttSeqRecorder`) and a WebSocket client (:class:`WsSeqRecorder`),
neither of them rsnotify's subscriber, each recording seq -> entry identity
per collection and every seq that arrived meaning another entry; and the
Change Lists read back from the simulator, to compare the log with.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import websockets
from paho.mqtt.enums import CallbackAPIVersion

from rsnotify import sitemap, w3cdt
from tests.devstack import ManagedProcess, Mosquitto, wait_for

__all__ = [
    "MqttSeqRecorder",
    "PushStack",
    "SeqRecord",
    "WsSeqRecorder",
    "change_list",
    "check_log_and_witnesses",
    "get",
    "identity",
    "made",
    "post",
    "start_push_stack",
]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url) as response:
        return response.read()


def post(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, method="POST", data=b"")) as r:
        r.read()


def made(base: str) -> int:
    """Changes the simulator has made so far (all collections)."""
    return int(json.loads(get(f"{base}_simulator/stats"))["changes"])


def change_list(base: str, name: str = "c1") -> list[tuple[str, str, str]]:
    """(loc, datetime, change) of every entry of collection ``name``'s Change Lists, in order."""
    index = sitemap.parse(get(f"{base}{name}/changelist.xml"))
    return [
        (e.loc, w3cdt.format(e.change_time), e.change.value)
        for ref in index.entries
        for e in sitemap.parse(get(ref.loc))
    ]


@dataclass
class PushStack:
    """What :func:`start_push_stack` started: both pushers and the two mirrors."""

    publisher: ManagedProcess  # MQTT
    gateway: ManagedProcess  # --ws-only
    mirrors: dict[str, Path]  # "mqtt" / "ws" -> mirror directory
    subscribers: dict[str, ManagedProcess]


def start_push_stack(
    run: Callable[..., ManagedProcess],
    base: str,
    redis_url: str,
    mosquitto: Mosquitto,
    ws_port: int,
    tmp_path: Path,
    *,
    collections: int,
    report: bool = False,
) -> PushStack:
    """A publisher (MQTT) and a ``--ws-only`` gateway on ``redis_url``, and two
    ``rsnotify subscribe`` mirrors (one per transport) keeping their cursors
    there too (``report``: their telemetry as well), each live on all
    ``collections`` before this returns.  ``run(*args, name=...)`` starts a
    process and owns it.
    """
    publisher = run(
        "publish", base, "--redis", redis_url, "--mqtt", mosquitto.url,
        "--poll", "0.05", "--from-beginning", "--log-format", "text",
        name="publish",
    )  # fmt: skip
    publisher.wait_for_line(r"rsnotify publish: running", timeout=30)
    gateway = run(
        "publish", base, "--ws-only", "--redis", redis_url,
        "--ws", f"127.0.0.1:{ws_port}", "--log-format", "text",
        name="gateway",
    )  # fmt: skip
    gateway.wait_for_line(r"rsnotify publish: running", timeout=30)
    mirrors = {"mqtt": tmp_path / "mirror-mqtt", "ws": tmp_path / "mirror-ws"}
    vias = {"mqtt": mosquitto.url, "ws": f"ws://127.0.0.1:{ws_port}"}
    telemetry = ("--report", redis_url) if report else ()
    subscribers: dict[str, ManagedProcess] = {}
    for name, mirror in mirrors.items():
        subscribers[name] = run(
            "subscribe", base, "--into", str(mirror), "--via", vias[name],
            "--name", f"sub-{name}", "--log-format", "text",
            "--redis", redis_url, *telemetry,
            name=f"subscribe-{name}",
        )  # fmt: skip
    for process in subscribers.values():
        wait_for(
            lambda p=process: p.output("stdout").count(": live\n") >= collections,
            timeout=60,
            message=lambda p=process: f"{p.name} did not go live\n{p.tail()}",
        )
    return PushStack(publisher, gateway, mirrors, subscribers)


def check_log_and_witnesses(
    collection: str,
    logged: list[dict[str, Any]],
    entries: list[tuple[str, str, str]],
    witnesses: list[SeqRecord],
) -> None:
    """The no-reuse verdict of issue 19 for one collection.

    The log (``logged``, its envelopes in order) holds seqs 1..n, dense, equal
    to the Change Lists' ``entries`` one for one; every witness received every
    seq, each meaning the log's entry of that seq, and saw no seq change
    meaning.
    """
    dense = list(range(1, len(entries) + 1))
    assert [n["seq"] for n in logged] == dense, f"{collection}: seqs dense, unique"
    assert [(n["loc"], n["datetime"], n["change"]) for n in logged] == entries, collection
    for witness in witnesses:
        name = type(witness).__name__
        assert witness.reused == [], f"{name}: a seq changed meaning"
        received = witness.seqs[collection]
        assert sorted(received) == dense, (name, collection)
        for seq, meaning in received.items():
            assert meaning == identity(logged[seq - 1]), (name, collection, seq)


def identity(notification: dict[str, Any]) -> str:
    """What a seq must always mean: the Change List entry's (loc, datetime, change)."""
    n = notification
    return f"{n['loc']} {n['datetime']} {n['change']}"


class SeqRecord:
    """seq -> entry identity per collection, and every seq that came to mean another entry."""

    def __init__(self) -> None:
        self.seqs: dict[str, dict[int, str]] = defaultdict(dict)
        self.arrivals: dict[str, list[float]] = defaultdict(list)
        self.reused: list[tuple[str, int, str, str]] = []
        self.notices: list[dict[str, Any]] = []  # skipped, gap_too_old, error frames
        self._lock = threading.Lock()

    def record(self, notification: dict[str, Any]) -> None:
        collection, seq, meaning = (
            notification["collection"],
            notification["seq"],
            identity(notification),
        )
        with self._lock:
            self.arrivals[collection].append(time.monotonic())
            before = self.seqs[collection].setdefault(seq, meaning)
            if before != meaning:
                self.reused.append((collection, seq, before, meaning))

    def count(self) -> int:
        with self._lock:
            return sum(len(s) for s in self.seqs.values())

    def missing(self, expected: int) -> str:
        """Which of seqs ``1..expected`` never came, per collection, and any notices:
        for a failure message (a witness that lacks a few seqs says which)."""
        with self._lock:
            holes = {
                c: [q for q in range(1, expected + 1) if q not in s][:20]
                for c, s in self.seqs.items()
            }
            notices = self.notices[-10:]
        return f"missing (first 20) {holes}; last notices {notices}"

    def worst_pause_after(self, moment: float, collections: list[str] | None = None) -> float:
        """The longest gap between arrivals (of ``collections``) across ``moment`` (a failover)."""
        with self._lock:
            times = sorted(
                t
                for c, ts in self.arrivals.items()
                if collections is None or c in collections
                for t in ts
            )
        gaps = [b - a for a, b in itertools.pairwise(times) if b >= moment]
        return max(gaps[:50], default=0.0)


class MqttSeqRecorder(SeqRecord):
    """A plain paho subscriber (QoS 1) to the ``topics`` given."""

    def __init__(self, mosquitto: Mosquitto, topics: list[str], client_id: str) -> None:
        super().__init__()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
        self.client.on_message = lambda c, u, message: self.record(json.loads(message.payload))
        self.client.on_connect = lambda c, u, f, rc, p=None: c.subscribe(
            [(topic, 1) for topic in topics]
        )
        self.client.connect(mosquitto.host, mosquitto.port)
        self.client.loop_start()

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


class WsSeqRecorder(SeqRecord):
    """A plain ``websockets`` client of a gateway, in a thread of its own, for ``collections``.

    Subscribes to all of them on one connection from seq 0 (everything the log
    retains); after a lost connection it subscribes again from the last seq
    it holds per collection, as any client of the protocol would.
    """

    def __init__(self, url: str, collections: list[str]) -> None:
        super().__init__()
        self.url = url
        self.collections = collections
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        while not self._stop.is_set():
            since = {c: max(self.seqs[c], default=0) for c in self.collections}
            try:
                async with websockets.connect(self.url, max_size=None) as ws:
                    self.connections += 1
                    await ws.send(json.dumps({"type": "subscribe", "collections": since}))
                    while not self._stop.is_set():
                        with contextlib.suppress(TimeoutError):
                            frame = json.loads(await asyncio.wait_for(ws.recv(), 0.2))
                            if frame.get("type") == "notification":
                                self.record(json.loads(frame["payload"]))
                            elif frame.get("type") not in ("hello", "heartbeat"):
                                with self._lock:
                                    self.notices.append(frame)
            except (OSError, websockets.exceptions.WebSocketException):
                await asyncio.sleep(0.2)  # the gateway is starting or went away: try again

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
