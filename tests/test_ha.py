"""Publisher high availability with real processes: kill -9 the leader, again and again."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import redis
from paho.mqtt.enums import CallbackAPIVersion

from rsnotify import sitemap, w3cdt
from rsnotify.collection import collection_id
from rsnotify.transport.topics import Topics
from tests.devstack import ManagedProcess, Mosquitto, Redis, wait_for

CHANGES = 5000
KILLS = 5


def _post(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, method="POST", data=b"")) as r:
        r.read()


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url) as response:
        return response.read()


def _stats(base: str) -> dict[str, Any]:
    return json.loads(_get(f"{base}_simulator/stats"))


def _leader_pid(r: redis.Redis, group: str) -> int | None:
    value = r.get(f"rsn:leader:{group}")
    if value is None:
        return None
    return int(value.decode().split(":")[-2])  # owner = host:pid, then :token


def _change_list(base: str) -> list[tuple[str, str, str]]:
    index = sitemap.parse(_get(f"{base}c1/changelist.xml"))
    out = []
    for ref in index.entries:
        for e in sitemap.parse(_get(ref.loc)):
            out.append((e.loc, w3cdt.format(e.change_time), e.change.value))
    return out


def test_killing_the_leader_five_times_loses_and_duplicates_nothing(
    tmp_path: Path, mosquitto: Mosquitto, redis_server: Redis
) -> None:
    sim = ManagedProcess.rsnotify(
        "simulate", "--port", "0", "--rate", "200", "--max-changes", str(CHANGES),
        "--changelist-size", "500", "--resources", "50", "--paused", "--seed", "5",
        workdir=tmp_path, name="simulate",
    ).start()  # fmt: skip
    publishers: dict[str, ManagedProcess] = {}
    received: dict[int, str] = {}
    duplicates_differing: list[int] = []
    lock = threading.Lock()
    try:
        base = sim.wait_for_line(r"serving (http://\S+)").group(1)
        cid = collection_id(f"{base}c1/capabilitylist.xml")
        group = "ha-test"

        def start(name: str) -> ManagedProcess:
            process = ManagedProcess.rsnotify(
                "publish", base, "--redis", redis_server.url, "--mqtt", mosquitto.url,
                "--ha", "--ha-group", group, "--lease-ttl", "2", "--poll", "0.05",
                "--from-beginning", "--log-format", "text",
                workdir=tmp_path, name=name,
            )  # fmt: skip
            publishers[name] = process
            return process.start()

        # An independent MQTT subscriber: every seq must arrive, a redelivery with its identity.
        def on_message(client: Any, userdata: Any, message: Any) -> None:
            n = json.loads(message.payload)
            identity = f"{n['loc']} {n['datetime']} {n['change']}"
            with lock:
                if n["seq"] in received and received[n["seq"]] != identity:
                    duplicates_differing.append(n["seq"])
                received[n["seq"]] = identity

        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="ha-test-sub")
        client.on_message = on_message
        client.on_connect = lambda c, u, f, rc, p=None: c.subscribe(Topics().changes(cid), qos=1)
        client.connect(mosquitto.host, mosquitto.port)
        client.loop_start()

        r = redis.Redis.from_url(redis_server.url)
        start("pub-a")
        start("pub-b")
        wait_for(lambda: _leader_pid(r, group) is not None, timeout=20, message="no leader")
        _post(f"{base}_simulator/resume")
        takeovers: list[float] = []
        spacing = CHANGES // (KILLS + 1)
        for k in range(1, KILLS + 1):
            wait_for(lambda k=k: _stats(base)["changes"] >= k * spacing, timeout=60)
            pid = _leader_pid(r, group)
            victim = next(n for n, p in publishers.items() if p.running and p.pid == pid)
            publishers[victim].kill()  # kill -9
            killed = time.monotonic()
            wait_for(
                lambda pid=pid: _leader_pid(r, group) not in (None, pid),
                timeout=15,
                message="no takeover",
            )
            takeovers.append(time.monotonic() - killed)
            start(victim)  # back as a follower
        wait_for(lambda: _stats(base)["changes"] >= CHANGES, timeout=90)
        expected = _change_list(base)
        assert len(expected) == CHANGES

        def head() -> int:
            return int(r.hget(f"rsn:{{{cid}}}:meta", "head") or 0)

        wait_for(lambda: head() >= CHANGES, timeout=30, message="the log did not catch up")
        rows = r.xrange(f"rsn:{{{cid}}}:log", "-", "+")
        logged = [json.loads(fields[b"d"]) for _, fields in rows]
        assert [n["seq"] for n in logged] == list(range(1, CHANGES + 1)), "seqs dense, unique"
        assert [(n["loc"], n["datetime"], n["change"]) for n in logged] == expected
        wait_for(lambda: len(received) >= CHANGES, timeout=30, message="MQTT did not deliver all")
        assert sorted(received) == list(range(1, CHANGES + 1))
        assert duplicates_differing == [], "a redelivered seq carried another identity"
        print(f"takeover per failover (s): {[round(t, 2) for t in takeovers]}")
        assert len(takeovers) == KILLS
        assert max(takeovers) <= 5.0, takeovers
        client.loop_stop()
        client.disconnect()
    finally:
        for process in publishers.values():
            process.kill()
        sim.terminate()
