"""Acceptance on the second broker (issue 18 item 4): publisher -> NATS MQTT -> subscriber.

Everything is the real thing: ``rsnotify simulate`` (1,500 changes at 100/s over
two collections), ``rsnotify publish`` with its embedded SQLite log and a
signing secret, Debian's ``nats-server`` (MQTT 3.1.1 only, over JetStream, no
``.`` in topics), ``rsnotify subscribe --via mqtt://`` checking signatures,
and an independent Destination written here with plain paho in MQTT 3.1.1.
Mid-run (at 600 changes, by the Source's own count) the broker is killed and
restarted 4 s later on the same port and JetStream store.

What must hold: the mirror equals ``/_simulator/state``; the independent
client saw every sequence number of each collection, dense from 1 (a
redelivery may repeat one, none is missing), each signed (the 3.1.1 trailer);
the publisher said once that the broker refused MQTT 5; the subscriber
verified every pushed notification it applied (nothing refused as unsigned).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from rsnotify import envelope
from rsnotify.transport import mqttsig
from tests.devstack import ManagedProcess, NatsServer, wait_for
from tests.helpers import freeze_and_converge, get_json, messages, post_json

RunRsnotify = Callable[..., ManagedProcess]

CHANGES = 1500
RATE = 100
KILL_AT = 600
BROKER_DOWN_S = 4.0
SECRET = "nats-acceptance-secret"


class Destination311:
    """Plain paho, MQTT 3.1.1, a persistent session, on ``resourcesync/+/changes``."""

    def __init__(self, broker: NatsServer) -> None:
        self.lock = threading.Lock()
        self.seqs: dict[str, list[int]] = {}  # capability list URI -> seqs in arrival order
        self.unsigned = 0
        self.connections = 0
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"nats-acceptance-{uuid.uuid4().hex[:8]}",
            clean_session=False,  # the broker queues for it while it is away
            protocol=mqtt.MQTTv311,
        )
        self.client.reconnect_delay_set(0.05, 0.5)  # type: ignore[arg-type]
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.subscribed = threading.Event()
        self.client.on_subscribe = lambda *_: self.subscribed.set()
        self.client.connect(broker.host, broker.port, keepalive=5)
        self.client.loop_start()
        assert self.subscribed.wait(10), "no SUBACK"

    def _on_connect(self, client: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if not reason.is_failure:
            self.connections += 1
            client.subscribe("resourcesync/+/changes", qos=1)

    def _on_message(self, _c: mqtt.Client, _u: Any, message: mqtt.MQTTMessage) -> None:
        payload, signature = mqttsig.detach(message.payload)
        try:
            envelope.verify(payload, signature, {"k1": SECRET.encode()})
        except envelope.SignatureError:
            self.unsigned += 1
        body = json.loads(payload)
        with self.lock:
            self.seqs.setdefault(body["capabilitylist"], []).append(body["seq"])

    def seen(self, capability_list: str) -> list[int]:
        with self.lock:
            return list(self.seqs.get(capability_list, ()))

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.mark.timeout(180)
def test_publisher_nats_subscriber_converge_through_a_broker_kill(
    tmp_path: Path, nats: NatsServer, rsnotify_process: RunRsnotify
) -> None:
    sim = rsnotify_process(
        "simulate", "--port", "0", "--quiet", "--paused",
        "--collections", "2", "--resources", "50", "--rate", str(RATE),
        "--max-changes", str(CHANGES), "--changelist-size", "500", "--seed", "18",
        name="simulate",
    )  # fmt: skip
    source = sim.wait_for_line(r"rsnotify simulate: serving (http://\S+/)$", timeout=20).group(1)
    publisher = rsnotify_process(
        "publish", source, "--state-dir", str(tmp_path / "publisher"),  # embedded SQLite log
        "--mqtt", nats.url, "--poll", "0.1", "--heartbeat", "1", "--secret", SECRET,
        "--log-format", "json",
        name="publish",
    )  # fmt: skip
    publisher.wait_for_line(r"rsnotify publish: running", timeout=30)
    destination = Destination311(nats)
    mirror = tmp_path / "mirror"
    subscriber = rsnotify_process(
        "subscribe", source, "--into", str(mirror), "--via", nats.url,
        "--secret", f"k1={SECRET}", "--log-format", "json",
        name="subscribe",
    )  # fmt: skip
    try:
        wait_for(  # one "live" line per collection: both baselines done
            lambda: subscriber.output("stdout").count(": live\n") >= 2,
            timeout=60,
            message=lambda: f"the subscriber did not go live\n{subscriber.tail()}",
        )
        post_json(f"{source}_simulator/resume")
        wait_for(
            lambda: get_json(f"{source}_simulator/stats")["changes"] >= KILL_AT,
            timeout=60,
            interval=0.05,
            message="the Source never reached the broker kill",
        )
        assert nats.kill() == -9
        killed_at = get_json(f"{source}_simulator/stats")["changes"]
        time.sleep(BROKER_DOWN_S)  # the scenario itself: the broker is down for 4 s
        nats.start(timeout=20)
        state, converge_s = freeze_and_converge(source, mirror)
        assert sum(c["changes"] for c in state["collections"].values()) == CHANGES
        assert KILL_AT <= killed_at < CHANGES - RATE * BROKER_DOWN_S  # mid-run, changes went on
        expected = {cap: c["changes"] for cap, c in state["collections"].items()}
        wait_for(
            lambda: all(
                set(destination.seen(cap)) >= set(range(1, n + 1)) for cap, n in expected.items()
            ),
            timeout=30,
            message=lambda: "the 3.1.1 client is missing: "
            + str({c: sorted(set(range(1, n + 1)) - set(destination.seen(c)))[:10]
                   for c, n in expected.items()}),
        )  # fmt: skip
    finally:
        destination.close()

    for cap, n in expected.items():
        seen = destination.seen(cap)
        assert set(seen) == set(range(1, n + 1)), f"{cap}: not dense 1..{n}"
    assert destination.unsigned == 0
    assert destination.connections >= 2  # it lived through the kill
    for process in (publisher, subscriber):
        assert process.running, process.tail()
        assert "Traceback" not in process.output(), process.tail()
    assert len(messages(publisher, "refused MQTT 5; using MQTT 3.1.1")) == 1
    assert messages(subscriber, "(MQTT 3.1.1)"), "the subscriber never connected over 3.1.1"
    assert not messages(subscriber, "not signed"), "a pushed notification lost its signature"
    duplicates = sum(len(destination.seen(c)) - n for c, n in expected.items())
    print(
        f"\nNATS: {CHANGES} changes, broker killed at {killed_at} for {BROKER_DOWN_S:g} s; "
        f"mirror converged {converge_s:.1f} s after the Source stopped; "
        f"3.1.1 client: {sum(expected.values())} seqs dense, {duplicates} redelivered; "
        f"subscriber gaps: {[m.split(': gap: ', 1)[1] for m in messages(subscriber, ': gap: ')]}"
    )
