"""Issue 18 item 3: while push is down the Destination polls the Change Lists on a timer.

Before, with push unreachable (a closed port, a broker refusing the protocol)
the subscriber called itself live and caught up only when its heartbeat
timer fired, then once every 300 s (the safety poll): minutes-old mirrors and
no alarm.  Now (rsnotify.subscriber.pushhealth) a channel down for longer
than ``--degraded-after`` puts the collection in ``polling`` mode: the Change
Lists are walked every ``--degraded-poll`` seconds until a connected channel
shows a sign of life, then one catch-up and back to push.

The pure state machine first; then real processes: ``rsnotify simulate``,
``rsnotify publish`` (MQTT on a real Mosquitto), ``rsnotify subscribe``.
The worst lag of a run is the largest (applied time - change time) in the
subscriber's apply log.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rsnotify.subscriber.pushhealth import PushHealth
from rsnotify.subscriber.resources import ApplyRecord
from tests.devstack import ManagedProcess, Mosquitto, free_port, wait_for
from tests.helpers import freeze_and_converge, get_json, post_json, read_apply_log

RunProcess = Callable[..., ManagedProcess]
POLL = 2.0  # --degraded-poll in these tests
AFTER = 1.0  # --degraded-after
SLACK = 4.0  # seconds of fetching and applying on a loaded 2-core machine


# --- the pure state machine ---------------------------------------------------------


def test_a_channel_down_past_the_grace_polls_every_interval_until_it_is_alive() -> None:
    health = PushHealth(grace=5, interval=10, now=0)
    assert health.tick(4.9) == (None, False)  # still within the grace
    change, due = health.tick(5.0)
    assert change is not None and change.mode == "polling" and due
    assert health.tick(9.9) == (None, False)
    assert health.tick(15.0) == (None, True)
    health.on_connected(16.0)
    assert health.tick(17.0) == (None, False), "connected is not alive yet"
    back = health.on_alive(18.0)
    assert back is not None and back.mode == "push"
    assert health.tick(30.0) == (None, False)


def test_a_refusal_polls_at_once_and_a_blip_does_not() -> None:
    health = PushHealth(grace=5, interval=10, now=0)
    health.on_connected(0)
    health.on_alive(0)
    health.on_down("MQTT: connection lost", 10)
    health.on_connected(12)  # back within the grace: no polling
    assert health.tick(20) == (None, False)
    health.on_down("broker refused MQTT 5 and 3.1.1", 30, at_once=True)
    change, due = health.tick(30)
    assert change is not None and "refused" in change.reason and due


def test_silence_polls_and_no_channel_polls_from_the_start() -> None:
    health = PushHealth(grace=5, interval=10, now=0)
    health.on_connected(0)
    health.on_silent("no heartbeat for 30s", 31)
    change, due = health.tick(31)
    assert change is not None and change.mode == "polling" and due
    alone = PushHealth(channel=False, now=0)
    assert alone.tick(0)[1]


# --- end to end ----------------------------------------------------------------------


def _worst_lag(records: list[ApplyRecord]) -> float:
    done = [r for r in records if r.outcome in ("applied", "deleted")]
    return max((r.applied_at - r.datetime).total_seconds() for r in done)


def _applied_twice(records: list[ApplyRecord]) -> list[Any]:
    done = Counter(
        (r.loc, r.datetime, r.change) for r in records if r.outcome in ("applied", "deleted")
    )
    return [key for key, count in done.items() if count > 1]


def _simulate(run: RunProcess, *extra: str) -> str:
    sim = run(
        "simulate", "--port", "0", "--resources", "20", "--payload-bytes", "200",
        "--changelist-size", "100", "--seed", "18", "--quiet", *extra,
    )  # fmt: skip
    return sim.wait_for_line(r"serving (\S+)", stream="stdout", timeout=30).group(1)


def _subscribe(run: RunProcess, source: str, mirror: Path, via: str, *extra: str) -> ManagedProcess:
    return run(
        "subscribe", source, "--into", str(mirror), "--via", via,
        "--degraded-after", f"{AFTER:g}", "--degraded-poll", f"{POLL:g}",
        "--heartbeat-timeout", "5", "--log-format", "json", *extra,
    )  # fmt: skip


def _gauges(port: int) -> dict[str, float]:
    """``rsnotify_subscriber_live`` and ``_polling`` from the subscriber's /metrics."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}  # not serving yet
    found = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in ("rsnotify_subscriber_live", "rsnotify_subscriber_polling"):
            found[name] = float(line.rsplit(" ", 1)[1])
    return found


def test_push_unreachable_from_the_start_polls_and_stays_close(
    rsnotify_process: RunProcess, tmp_path: Path
) -> None:
    # Paused until the subscriber polls: a change made while it was still starting
    # (seconds, on a loaded machine) would measure its start-up, not its polling.
    source = _simulate(rsnotify_process, "--rate", "5", "--max-changes", "60", "--paused")
    mirror = tmp_path / "mirror"
    closed = f"mqtt://127.0.0.1:{free_port()}"  # nothing listens there
    metrics = free_port()
    subscriber = _subscribe(
        rsnotify_process, source, mirror, closed, "--metrics-port", str(metrics)
    )
    # Polling is not live: the gauges say so while the mirror keeps up.
    polling = {"rsnotify_subscriber_live": 0.0, "rsnotify_subscriber_polling": 1.0}
    wait_for(lambda: _gauges(metrics) == polling, timeout=30, message="gauges never said polling")
    post_json(f"{source}_simulator/resume")
    freeze_and_converge(source, mirror, finish_timeout=60, converge_timeout=POLL + SLACK + 5)
    records = asyncio.run(read_apply_log(mirror))
    assert _worst_lag(records) <= POLL + AFTER + SLACK
    assert _applied_twice(records) == []
    assert _gauges(metrics) == polling  # still: its catch-ups did not make it "live"
    said = subscriber.output("both")
    assert "polling the Change Lists every 2s" in said, subscriber.tail()
    assert subscriber.running


def test_push_lost_for_a_minute_polls_then_returns_to_push(
    rsnotify_process: RunProcess, tmp_path: Path, mosquitto: Mosquitto
) -> None:
    source = _simulate(rsnotify_process, "--rate", "4")
    mirror = tmp_path / "mirror"
    publisher = rsnotify_process(
        "publish", source, "--mqtt", mosquitto.url, "--poll", "0.2", "--heartbeat", "1",
        "--state-dir", str(tmp_path / "publisher"), "--log-format", "json",
    )  # fmt: skip
    subscriber = _subscribe(rsnotify_process, source, mirror, mosquitto.url)
    subscriber.wait_for_line(r": live", stream="stdout", timeout=60)
    wait_for(
        lambda: get_json(f"{source}_simulator/stats")["changes"] >= 20,
        timeout=30,
        message="the simulator made no changes",
    )
    mosquitto.stop()
    subscriber.wait_for_line(r"push unavailable", stream="stderr", timeout=30)
    # A minute without push, the simulator changing all along.
    wait_for(
        lambda: get_json(f"{source}_simulator/stats")["changes"] >= 260,
        timeout=120,
        interval=0.5,
        message="the simulator stalled",
    )
    mosquitto.start()
    # The publisher's and the subscriber's reconnect backoffs (up to 10 s each after
    # a minute of refusals) decide when push is back; the rest is slack for load.
    subscriber.wait_for_line(r": push: push is back", stream="stderr", timeout=40)
    back = datetime.now(UTC)
    changes = get_json(f"{source}_simulator/stats")["changes"]
    wait_for(
        lambda: get_json(f"{source}_simulator/stats")["changes"] >= changes + 20,
        timeout=30,
        message="the simulator stalled",
    )
    freeze_and_converge(source, mirror, converge_timeout=30, finished=False)
    records = asyncio.run(read_apply_log(mirror))
    assert _worst_lag(records) <= POLL + AFTER + SLACK + 1  # + the heartbeat's second
    assert _applied_twice(records) == []
    pushed_after = [
        r
        for r in records
        if r.seq is not None and r.outcome in ("applied", "deleted") and r.applied_at > back
    ]
    assert pushed_after, "push was used again after the outage"
    assert publisher.running and subscriber.running
