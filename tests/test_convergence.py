"""Acceptance: mirrors converge on the Source whatever breaks, and nothing ever goes back in time.

Why one module of ~540 lines: one scenario and its ``Run``/``Fault`` record take half of it;
the two smaller scenarios start the same processes through the same fixtures, and the last
two tests are in-process regressions that scenario found, kept beside it though they share
almost nothing with it.

Everything runs as the real thing: ``rsnotify simulate``, ``rsnotify publish``
and two ``rsnotify subscribe`` processes (one over MQTT, one over WebSocket)
against a private Mosquitto and Redis.  Faults are injected at points chosen by
the Source's progress (changes made so far, from ``/_simulator/stats``), not by
the wall clock, so the scenario is the same on a fast and a slow machine.

What must hold at the end, after the Source is frozen:

* both mirrors equal ``/_simulator/state`` file for file (SHA-256), nothing extra;
* no resource was ever overwritten by an older version: in each subscriber's
  apply log, the change datetimes of the successful writes and deletes of one
  ``loc`` never decrease;
* the faults really happened and really hurt: every kill hit a running
  process mid-run, the WebSocket subscriber that stayed down past the log's
  retention was told ``gap_too_old`` and caught up from the Change List Index,
  and the MQTT subscriber outlived Mosquitto's per-client queue (the drops
  seen as a sequence jump, or read past by its start-up catch-up, as the
  machine's load decides) and caught up from the Change Lists.

The same file holds two smaller scenarios: a broker that silently drops
messages for a slow subscriber, and two mirrors on one broker whose long
sibling paths once mapped to one MQTT client id.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rsnotify.publisher.service import Publisher, PublisherConfig
from rsnotify.simulator.server import Simulator, SimulatorConfig
from rsnotify.subscriber import events as ev
from rsnotify.subscriber.channels import WebSocketChannel
from rsnotify.subscriber.mirror import TEMP_PREFIX
from rsnotify.subscriber.service import Subscriber, SubscriberConfig
from tests.devstack import ManagedProcess, Mosquitto, Redis, async_wait_for, free_port, wait_for
from tests.groundtruth import mirror_differences
from tests.helpers import (
    get_json,
    messages,
    newer_never_overwritten,
    post_json,
    read_apply_log,
)

RunRsnotify = Callable[..., ManagedProcess]

CHANGES = 10_000
RATE = 200
RETAIN = 400  # log entries kept per collection: far less than a long outage produces
BROKER_DOWN_S = 5.0


@dataclass
class Fault:
    what: str
    at: int  # Source changes made when it happened
    detail: str = ""


@dataclass
class Run:
    """The running stack and a record of every fault injected into it."""

    source: str
    broker: Mosquitto
    publisher: ManagedProcess
    subscribers: dict[str, ManagedProcess]
    mirrors: dict[str, Path]
    faults: list[Fault] = field(default_factory=list)

    def progress(self) -> int:
        return int(get_json(f"{self.source}_simulator/stats")["changes"])

    def wait_progress(self, n: int) -> int:
        return wait_for(
            lambda: (p := self.progress()) >= n and p,
            timeout=120,
            interval=0.05,
            message=f"the Source never reached {n} changes",
        )

    def note(self, what: str, detail: str = "") -> None:
        self.faults.append(Fault(what, self.progress(), detail))

    def after_last(self, what: str, changes: int, at_least: int) -> Callable[[], int]:
        """A plan point ``changes`` past the last ``what`` fault, and not before ``at_least``.

        An outage that must outlast a retention is measured from when its kill
        really happened: on a loaded machine an earlier step (a publisher
        restart) can hold the plan back by seconds, and a fixed point would
        shorten the outage below what the test asserts it was.
        """
        return lambda: max(at_least, [f for f in self.faults if f.what == what][-1].at + changes)

    # -- faults --

    def kill_subscriber(self, name: str) -> None:
        process = self.subscribers[name]
        assert process.running, f"{name} was not running when it was to be killed"
        code = process.kill()
        assert code == -9, f"{name} ended with {code}, not by SIGKILL"
        self.note(f"kill -9 subscriber {name}")

    def start_subscriber(self, name: str) -> None:
        self.subscribers[name].start()
        self.note(f"restart subscriber {name}")

    def kill_publisher(self) -> None:
        code = self.publisher.kill()
        assert code == -9, f"publisher ended with {code}, not by SIGKILL"
        self.note("kill -9 publisher")
        self.publisher.start().wait_for_line(r"rsnotify publish: running", timeout=30)
        self.note("publisher restarted")

    def broker_outage(self) -> None:
        code = self.broker.kill()
        assert code == -9, f"broker ended with {code}, not by SIGKILL"
        self.note("kill -9 broker")
        time.sleep(BROKER_DOWN_S)  # the scenario itself: the broker is down for 5 s
        self.broker.start(timeout=20)
        self.note("broker restarted", f"after {BROKER_DOWN_S:g}s")


# --- the test ---------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_mirrors_converge_under_faults(
    tmp_path: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    redis_server: Redis,
    rsnotify_process: RunRsnotify,
) -> None:
    # Persistence (saved every second) keeps the subscribers' sessions across a kill -9.
    broker = mosquitto_factory(persistence=True, extra_config=["autosave_interval 1"])
    ws_port = free_port()
    sim = rsnotify_process(
        "simulate",
        "--port", "0",
        "--collections", "2",
        "--resources", "100",
        "--payload-bytes", "1024",
        "--rate", str(RATE),
        "--max-changes", str(CHANGES),
        "--changelist-size", "500",
        "--seed", "20240607",
        "--paused",
        "--hub", f"ws://127.0.0.1:{ws_port}/{{id}}",
        "--hub", f"{broker.url}/resourcesync/{{id}}/changes",
        name="simulate",
    )  # fmt: skip
    source = sim.wait_for_line(r"serving (http://\S+)", timeout=30).group(1)
    publisher = rsnotify_process(
        "publish",
        source,
        "--redis", redis_server.url,
        "--mqtt", broker.url,
        "--ws", f"127.0.0.1:{ws_port}",
        "--retain", str(RETAIN),
        "--poll", "0.1",
        "--heartbeat", "1",
        "--log-format", "json",
        name="publish",
    )  # fmt: skip
    publisher.wait_for_line(r"rsnotify publish: running", timeout=30)
    mirrors = {"mqtt": tmp_path / "mirror-mqtt", "ws": tmp_path / "mirror-ws"}
    vias = {"mqtt": broker.url, "ws": f"ws://127.0.0.1:{ws_port}"}
    subscribers: dict[str, ManagedProcess] = {}
    for name, mirror in mirrors.items():
        args = ["subscribe", source, "--into", str(mirror), "--via", vias[name]]
        args += ["--name", f"sub-{name}", "--log-format", "json"]
        subscribers[name] = rsnotify_process(*args, name=f"subscribe-{name}")
    for process in subscribers.values():
        wait_for(  # one "live" line per collection: both baselines done
            lambda p=process: p.output("stdout").count(": live\n") >= 2,
            timeout=60,
            message=lambda p=process: f"{p.name} did not go live\n{p.tail()}",
        )
    run = Run(source, broker, publisher, subscribers, mirrors)
    post_json(f"{source}_simulator/resume")

    # The plan, by Source progress.  Short outages restart at once (the gateway
    # may replay from the log, if the restart beats its retention); the second
    # WebSocket outage outlasts the log's retention and the second MQTT outage
    # outlasts Mosquitto's per-client queue (1000 messages by default).
    # Outages that must outlast a retention end relative to their kill.
    long_ws_down = 2 * RETAIN + 200
    long_mqtt_down = 2 * 1000 + 100  # 2 collections, 1000 queued messages per client
    plan: list[tuple[int | Callable[[], int], Callable[[], None]]] = [
        (400, lambda: run.kill_subscriber("mqtt")),
        (600, lambda: run.start_subscriber("mqtt")),
        (900, lambda: run.kill_subscriber("ws")),
        (900, lambda: run.start_subscriber("ws")),
        (1400, run.broker_outage),
        (2800, run.kill_publisher),
        (3300, lambda: run.kill_subscriber("ws")),
        (3500, lambda: run.kill_subscriber("mqtt")),
        (
            run.after_last("kill -9 subscriber ws", long_ws_down, 4800),
            lambda: run.start_subscriber("ws"),
        ),
        (
            run.after_last("kill -9 subscriber mqtt", long_mqtt_down, 5600),
            lambda: run.start_subscriber("mqtt"),
        ),
        (6300, run.broker_outage),
        (7800, lambda: run.kill_subscriber("mqtt")),
        (8000, lambda: run.start_subscriber("mqtt")),
        (8400, lambda: run.kill_subscriber("ws")),
        (8400, lambda: run.start_subscriber("ws")),
    ]
    for at, action in plan:
        run.wait_progress(at if isinstance(at, int) else at())
        action()
    wait_for(
        lambda: get_json(f"{source}_simulator/stats")["finished"],
        timeout=120,
        interval=0.2,
        message="the simulator did not finish its changes",
    )
    post_json(f"{source}_simulator/pause")  # freeze
    state = get_json(f"{source}_simulator/state")
    (tmp_path / "state.json").write_text(json.dumps(state))  # for a post-mortem
    assert sum(c["changes"] for c in state["collections"].values()) == CHANGES

    started = time.monotonic()
    last: dict[str, list[str]] = {}

    def equal() -> bool:
        for name, mirror in mirrors.items():
            last[name] = mirror_differences(state, mirror)
        return not any(last.values())

    wait_for(
        equal,
        timeout=120,
        interval=0.5,
        message=lambda: (
            "mirrors did not converge:\n"
            + "\n".join(f"{n}: {len(d)} differences, e.g. {d[:5]}" for n, d in last.items())
        ),
    )
    converge_s = time.monotonic() - started
    for name, process in subscribers.items():
        assert process.running, f"{name} died:\n{process.tail()}"
    assert publisher.running, publisher.tail()
    for mirror in mirrors.values():
        assert not [p for p in mirror.rglob(f"{TEMP_PREFIX}*")], "temp files left behind"

    # Never backwards, across every restart.
    for name, mirror in mirrors.items():
        records = asyncio.run(read_apply_log(mirror))
        assert len([r for r in records if r.outcome in ("applied", "deleted")]) > 1000
        assert newer_never_overwritten(records) == [], f"{name} went back in time"

    ws, mq = subscribers["ws"], subscribers["mqtt"]
    print(
        "\nconvergence under faults:",
        *(f"{f.at:>6} {f.what} {f.detail}" for f in run.faults),
        f"converged {converge_s:.1f}s after the Source froze",
        f"ws gaps: {gap_reasons(ws)}",
        f"ws catch-ups from the Change List Index (changes, s): {catchups(ws)}",
        f"mqtt gaps: {gap_reasons(mq)}",
        f"mqtt catch-ups from the Change List Index (changes, s): {catchups(mq)}",
        f"ws replays the log could serve (from seq): {sorted(served_replays(ws))}",
        f"publisher MQTT skips: {messages(publisher, 'left the log before they were pushed')}",
        f"broker queue overflows: {broker.log_text().count('Outgoing messages are being dropped')}",
        sep="\n  ",
    )

    # The faults happened, mid-run, as planned.
    kills = {
        name: [f for f in run.faults if f.what == f"kill -9 subscriber {name}"]
        for name in subscribers
    }
    assert all(len(k) == 3 for k in kills.values()), run.faults
    assert len([f for f in run.faults if f.what == "kill -9 broker"]) == 2
    assert len([f for f in run.faults if f.what == "kill -9 publisher"]) == 1
    assert all(0 < f.at < CHANGES for f in run.faults), run.faults
    long_ws = [f for f in run.faults if f.what == "restart subscriber ws"][1]
    long_ws_kill = kills["ws"][1]
    assert long_ws.at - long_ws_kill.at > 2 * RETAIN, "2 collections: more than the retention each"

    # The WebSocket subscriber that stayed away too long asked for a replay, was
    # refused it (gap_too_old) and caught up from the Change List Index.
    assert messages(ws, "replay: from seq"), "no replay from the log was asked for"
    assert messages(ws, "log no longer holds"), "the long-down subscriber was never refused"
    assert max(n for n, _ in catchups(ws)) > RETAIN, catchups(ws)
    # The MQTT subscriber outlived the broker's queue and caught up from the
    # Change Lists.  Whether it saw the drops as a sequence jump or its
    # start-up catch-up read past them first is a race of this machine's load
    # (both are right; the mirror converged above): a jump is what
    # test_silent_broker_drops_are_caught_up below makes certain.
    assert "Outgoing messages are being dropped" in broker.log_text()
    assert max(n for n, _ in catchups(mq)) > 1000 / 2, catchups(mq)


def catchups(process: ManagedProcess) -> list[tuple[int, float]]:
    """(changes, seconds) of each catch-up from the Change List Index, from the log."""
    found = []
    for message in messages(process, "from the Change List Index in"):
        if "catch-up: " not in message:
            continue  # a poll (push down) or a quiet confirmation walk, not a gap's catch-up
        words = message.split("catch-up: ", 1)[1].split()
        found.append((int(words[0]), float(words[-1].rstrip("s"))))
    return found


def served_replays(process: ManagedProcess) -> set[int]:
    """Replays the gateway could serve: asked for, and not refused as too old."""
    asked = {int(m.rsplit(" ", 1)[1]) for m in messages(process, "replay: from seq ")}
    refused = {
        int(m.split("log no longer holds seq ", 1)[1].split()[0])
        for m in messages(process, "log no longer holds seq ")
    }
    return asked - refused


def gap_reasons(process: ManagedProcess) -> dict[str, int]:
    counts: dict[str, int] = {}
    for message in messages(process, ": gap: "):
        reason = message.split(": gap: ", 1)[1]
        reason = reason.split(" (")[0]
        counts[reason] = counts.get(reason, 0) + 1
    return counts


def test_silent_broker_drops_are_caught_up(
    tmp_path: Path,
    mosquitto_factory: Callable[..., Mosquitto],
    rsnotify_process: RunRsnotify,
) -> None:
    """Mosquitto drops QoS 1 messages beyond its queue without telling anyone.

    A subscriber slowed down by large resources (200 kB each, one transfer at
    a time) meets a burst of 400 changes through a broker that queues at most
    10 messages per client.  Nothing reports the drops to the subscriber: it
    must see them as sequence jumps, catch up from the Change List Index and
    converge.
    """
    broker = mosquitto_factory(max_queued_messages=10)
    sim = rsnotify_process(
        "simulate",
        "--port", "0",
        "--rate", "0",
        "--resources", "20",
        "--payload-bytes", "200000",
        "--changelist-size", "100",
        "--seed", "7",
        "--hub", f"{broker.url}/resourcesync/{{id}}/changes",
        name="simulate",
    )  # fmt: skip
    source = sim.wait_for_line(r"serving (http://\S+)", timeout=30).group(1)
    publisher = rsnotify_process(
        "publish", source,
        "--state-dir", str(tmp_path / "publisher"),
        "--mqtt", broker.url,
        "--poll", "0.05",
        "--heartbeat", "1",
        name="publish",
    )  # fmt: skip
    publisher.wait_for_line(r"rsnotify publish: running", timeout=30)
    mirror = tmp_path / "mirror"
    sub = rsnotify_process(
        "subscribe", source,
        "--into", str(mirror),
        "--via", broker.url,
        "--concurrency", "1",
        "--log-format", "json",
        name="subscribe",
    )  # fmt: skip
    sub.wait_for_line(r": live$", timeout=60)
    assert post_json(f"{source}_simulator/advance?n=400")["applied"] == 400
    state = get_json(f"{source}_simulator/state")
    wait_for(
        lambda: not mirror_differences(state, mirror),
        timeout=90,
        interval=0.2,
        message=lambda: f"no convergence: {mirror_differences(state, mirror)[:5]}\n{sub.tail()}",
    )
    assert "Outgoing messages are being dropped" in broker.log_text(), "the broker dropped nothing"
    jumps = messages(sub, "gap: sequence jump")
    assert jumps, f"drops were not seen as gaps: {gap_reasons(sub)}"
    assert sum(n for n, _ in catchups(sub)) > 0, catchups(sub)
    records = asyncio.run(read_apply_log(mirror))
    assert newer_never_overwritten(records) == []
    pushed = [r for r in records if r.seq is not None]
    baseline_at = min(r.datetime for r in records)  # the Resource List's snapshot time
    walked = [r for r in records if r.seq is None and r.datetime > baseline_at]
    assert pushed, "nothing was applied from notifications"
    assert walked, "nothing was applied from the Change List Index"
    print(
        f"\nsilent drops: {len(jumps)} sequence jump(s); catch-ups (changes, s): {catchups(sub)}; "
        f"{len(pushed)} apply-log rows from push, {len(walked)} from the Change Lists"
    )


def test_mirrors_with_long_sibling_paths_keep_their_own_mqtt_sessions(
    tmp_path: Path,
    mosquitto: Mosquitto,
    rsnotify_process: RunRsnotify,
) -> None:
    """Two subscribers on one broker must not share a client id (and so a session).

    The client id is derived from the mirror path; cut to MQTT's customary 64
    characters, the part that told two long sibling paths apart was lost, and
    the broker kept kicking one subscriber off for the other.
    """
    sim = rsnotify_process("simulate", "--port", "0", "--rate", "0", "--resources", "5")
    source = sim.wait_for_line(r"serving (http://\S+)", timeout=30).group(1)
    parent = tmp_path / ("a-long-directory-name-shared-by-both-mirrors-" * 2)
    subs = []
    for name in ("mirror-one", "mirror-two"):
        args = ["subscribe", source, "--into", str(parent / name), "--via", mosquitto.url]
        subs.append(rsnotify_process(*args, name=f"subscribe-{name}"))
    for sub in subs:
        sub.wait_for_line(r": live$", timeout=60)

    def client_ids() -> set[str]:
        return set(
            re.findall(
                r"New client connected from \S+ as (rsnotify-sub-\S+) ", mosquitto.log_text()
            )
        )

    ids = wait_for(
        lambda: len(client_ids()) >= 2 and client_ids(),
        timeout=20,
        message=lambda: f"one client id for two mirrors: {client_ids()}",
    )
    assert all(len(i) <= 64 for i in ids)
    assert "already connected, closing old connection" not in mosquitto.log_text()


@pytest.mark.timeout(60)  # the bug also stalls shutting the channel down
async def test_a_replay_asked_for_during_a_replay_is_served_at_once(tmp_path: Path) -> None:
    """Found by the convergence run: back-to-back replays stalled push for 10 s.

    The engine asks its WebSocket channel for a replay at start-up and again
    when the first connection reports no session.  The channel then dropped a
    connection in the middle of a replay burst with a polite close, which
    cannot complete while the burst sits unread (websockets pauses reading
    at ``max_queue``): the close waited out its 10 s timeout, and the new
    replay with it, until the head-ahead detector gave up and the log had
    trimmed the range.
    """

    sim = Simulator(SimulatorConfig(rate=0, seed=3, resources=10, payload_bytes=64, paused=True))
    base = await sim.start()
    port = free_port()
    publisher = Publisher(
        PublisherConfig(source=base, state_dir=str(tmp_path / "log"), ws=f"127.0.0.1:{port}")
    )
    publisher.config.poll = 0.05
    await publisher.start()
    (cid,) = publisher.collections
    events: list[ev.Event] = []
    channel = WebSocketChannel(f"ws://127.0.0.1:{port}", cid, events.append, since=lambda: None)
    try:
        assert publisher.log is not None
        log = publisher.log
        await async_wait_for(lambda: log.checkpoint(cid), timeout=10)
        sim.apply(3000)
        await async_wait_for(lambda: _at_least(log.head(cid), 3000), timeout=30)
        channel.start()
        await async_wait_for(lambda: _connected(events, 1), timeout=10)
        await channel.replay(0)
        # The second request arrives while the first replay's burst is streaming.
        await async_wait_for(lambda: _connected(events, 2), timeout=10)
        second = await channel.replay(0)
        started = time.monotonic()
        await async_wait_for(
            lambda: any(isinstance(e, ev.Message) and e.generation == second for e in events),
            timeout=5,
            message="the second replay was held up by the connection it replaced",
        )
        assert time.monotonic() - started < 5
    finally:
        await channel.stop()
        await publisher.stop()
        await sim.stop()


async def _at_least(value: Any, n: int) -> bool:
    return await value >= n


def _connected(events: list[Any], n: int) -> bool:
    return sum(isinstance(e, ev.Connected) for e in events) >= n


@pytest.mark.timeout(60)
async def test_once_returns_while_the_source_keeps_changing(tmp_path: Path) -> None:
    """Found by the convergence run: a catch-up walked "until nothing is new".

    Under a Source changing faster than one walk of its Change Lists takes,
    that is never: ``--once`` never returned, and a live subscriber restarted
    mid-run never went live again.  A catch-up now owes the Change Lists as
    they were when it read them, and notifications (or the next catch-up)
    carry the rest.
    """

    sim = Simulator(SimulatorConfig(rate=RATE, seed=5, resources=50, payload_bytes=256))
    base = await sim.start()
    try:
        await async_wait_for(lambda: sim.source.total_changes > 2 * RATE, timeout=20)
        # retries=2: changes the Source has moved past fail fast (they are not the point).
        config = SubscriberConfig(source=base, into=str(tmp_path / "m"), once=True, retries=2)
        sub = Subscriber(config)
        await sub.start()
        before = sim.source.total_changes
        try:
            code = await asyncio.wait_for(sub.run_once(), timeout=30)
            (engine,) = sub.engines.values()
            assert engine.stats.applied > 0
            # 1 when the last change of a resource that changed again after the
            # read could not be verified: the Source had moved on.  Either way, it
            # says so and returns.
            assert code == (1 if engine.stats.failed else 0)
        finally:
            await sub.stop()
        assert sim.source.total_changes > before, "the Source changed all along"
    finally:
        await sim.stop()
