"""The service fixtures are real: real brokers, real restarts, real stalls.

Every later integration test trusts these fixtures, so each property a test
will lean on (delivery, durability across restart, same port after restart,
config actually applied, a stalled server really stalls, nothing left running)
is proved here against the real process.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import rsnotify
from tests.devstack import (
    ManagedProcess,
    Mosquitto,
    Redis,
    async_wait_for,
    free_port,
    mqtt_connack,
    wait_for,
)

V2 = mqtt.CallbackAPIVersion.VERSION2


@contextmanager
def mqtt_client(
    broker: Mosquitto,
    client_id: str,
    *,
    credentials: tuple[str, str] | None = None,
    clean_session: bool = True,
    on_message: Callable[[mqtt.MQTTMessage], None] | None = None,
) -> Iterator[mqtt.Client]:
    """A connected paho client with its network thread running; always torn down."""
    client = mqtt.Client(V2, client_id=client_id, clean_session=clean_session)
    if credentials:
        client.username_pw_set(*credentials)
    if on_message:
        client.on_message = lambda _c, _u, msg: on_message(msg)
    client.connect(broker.host, broker.port, keepalive=10)
    client.loop_start()
    try:
        wait_for(client.is_connected, 5, message=f"{client_id} did not connect")
        yield client
    finally:
        client.disconnect()
        client.loop_stop()


def subscribe(client: mqtt.Client, topic: str, qos: int = 1) -> list[mqtt.ReasonCode]:
    """Subscribe and wait for the SUBACK, so later publishes cannot race it."""
    granted: list[mqtt.ReasonCode] = []
    client.on_subscribe = lambda _c, _u, _mid, codes, _p: granted.extend(codes)
    client.subscribe(topic, qos)
    wait_for(lambda: granted, 5, message=f"no SUBACK for {topic}")
    return granted


def gone(pid: int) -> bool:
    """True once the pid no longer exists, zombie included (a zombie still answers kill 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# --- waiting -------------------------------------------------------------------


def test_wait_for_returns_value_and_fails_with_message() -> None:
    calls = iter([0, None, "ready"])
    assert wait_for(lambda: next(calls), 5) == "ready"
    with pytest.raises(AssertionError, match="never true"):
        wait_for(lambda: False, timeout=0.05, message=lambda: "never true")


async def test_async_wait_for_accepts_async_predicates() -> None:
    state = {"n": 0}

    async def bump() -> int:
        state["n"] += 1
        return state["n"] if state["n"] >= 3 else 0

    assert await async_wait_for(bump, 5) == 3
    with pytest.raises(AssertionError, match="nope"):
        await async_wait_for(lambda: False, timeout=0.05, message="nope")


# --- MQTT ----------------------------------------------------------------------


def test_mqtt_qos1_publish_subscribe(mosquitto: Mosquitto) -> None:
    received: list[mqtt.MQTTMessage] = []
    with mqtt_client(mosquitto, "sub", on_message=received.append) as sub:
        assert [code.value for code in subscribe(sub, "rs/test/changes")] == [1]
        with mqtt_client(mosquitto, "pub") as pub:
            info = pub.publish("rs/test/changes", b'{"seq":1}', qos=1)
            wait_for(info.is_published, 5, message="no PUBACK")
            wait_for(lambda: received, 5, message="message not delivered")
    [message] = received
    assert (message.topic, message.payload, message.qos) == ("rs/test/changes", b'{"seq":1}', 1)


def test_mosquitto_restart_keeps_port_and_accepts_new_connections(mosquitto: Mosquitto) -> None:
    port, old_pid = mosquitto.port, mosquitto.pid
    mosquitto.restart()
    assert mosquitto.port == port
    assert mosquitto.url == f"mqtt://127.0.0.1:{port}"
    assert mosquitto.pid != old_pid and gone(old_pid)
    code = mqtt_connack(mosquitto.host, port)
    assert code is not None and not code.is_failure


def test_max_queued_messages_is_written_and_applied(
    mosquitto_factory: Callable[..., Mosquitto],
) -> None:
    broker = mosquitto_factory(max_queued_messages=2, max_inflight_messages=1)
    lines = broker.config_path.read_text().splitlines()
    assert "max_queued_messages 2" in lines
    assert "max_inflight_messages 1" in lines
    # Applied, not just written: an offline persistent session keeps only 2 of 5.
    received: list[bytes] = []
    with mqtt_client(broker, "offline", clean_session=False) as sub:
        subscribe(sub, "q")
    with mqtt_client(broker, "pub") as pub:
        infos = [pub.publish("q", str(i).encode(), qos=1) for i in range(5)]
        wait_for(lambda: all(i.is_published() for i in infos), 5, message="no PUBACKs")
        with mqtt_client(
            broker, "offline", clean_session=False, on_message=lambda m: received.append(m.payload)
        ):
            # A marker published now arrives after whatever the queue held.
            wait_for(lambda: len(received) >= 2, 5, message="queued messages not delivered")
            marker = pub.publish("q", b"end", qos=1)
            wait_for(marker.is_published, 5, message="no PUBACK for marker")
            wait_for(lambda: b"end" in received, 5, message="marker not delivered")
    assert received == [b"0", b"1", b"end"]


def test_mosquitto_password_and_acl(mosquitto_factory: Callable[..., Mosquitto]) -> None:
    broker = mosquitto_factory(
        password_file=[("alice", "s3cret")],
        acl="user alice\ntopic readwrite allowed/#\n",
    )
    assert not broker.allow_anonymous
    refused = mqtt_connack(broker.host, broker.port)
    assert refused is not None and refused.is_failure
    wrong = mqtt_connack(broker.host, broker.port, credentials=("alice", "nope"))
    assert wrong is not None and wrong.is_failure
    received: list[str] = []
    alice = ("alice", "s3cret")
    with mqtt_client(
        broker, "alice", credentials=alice, on_message=lambda m: received.append(m.topic)
    ) as client:
        subscribe(client, "#")
        client.publish("denied/x", b"1", qos=1)
        client.publish("allowed/x", b"2", qos=1)
        wait_for(lambda: received, 5, message="allowed message not delivered")
    assert received == ["allowed/x"]


# --- Redis ---------------------------------------------------------------------


def test_redis_stream_xadd_xrange(redis_server: Redis) -> None:
    client = redis_server.client()
    try:
        first = client.xadd("rs:log", {"seq": "1", "loc": "http://example.com/a"})
        second = client.xadd("rs:log", {"seq": "2", "loc": "http://example.com/b"})
        entries = client.xrange("rs:log")
    finally:
        client.close()
    assert [entry_id for entry_id, _ in entries] == [first, second]
    assert entries[1][1] == {b"seq": b"2", b"loc": b"http://example.com/b"}


def test_redis_restart_keeps_stream_via_aof(redis_server: Redis) -> None:
    assert "appendonly yes" in redis_server.config_path.read_text().splitlines()
    client = redis_server.client()
    try:
        entry_id = client.xadd("rs:log", {"seq": "1"})
        port, old_pid = redis_server.port, redis_server.pid
        redis_server.restart()
        assert redis_server.port == port and redis_server.pid != old_pid and gone(old_pid)
        assert client.xrange("rs:log") == [(entry_id, {b"seq": b"1"})]
    finally:
        client.close()


def test_paused_redis_times_out_then_answers_after_resume(redis_server: Redis) -> None:
    client = redis.Redis(
        host=redis_server.host,
        port=redis_server.port,
        socket_timeout=0.3,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        assert client.ping()
        redis_server.pause()
        try:
            with pytest.raises(redis.exceptions.TimeoutError):
                client.ping()
        finally:
            redis_server.resume()
        assert client.ping()
    finally:
        client.close()


# --- process hygiene -----------------------------------------------------------


def test_stop_and_kill_reap_their_process(
    mosquitto_factory: Callable[..., Mosquitto], redis_factory: Callable[..., Redis]
) -> None:
    broker, server = mosquitto_factory(), redis_factory()
    broker_pid, server_pid = broker.pid, server.pid
    assert broker.stop() == 0
    assert server.kill() == -9
    assert gone(broker_pid) and gone(server_pid)
    assert not broker.running and not server.running


def test_service_on_taken_fixed_port_fails_with_its_log(
    mosquitto: Mosquitto, mosquitto_factory: Callable[..., Mosquitto]
) -> None:
    clash = mosquitto_factory(port=mosquitto.port, start=False)
    with pytest.raises(AssertionError, match="in use"):
        clash.start(timeout=5)
    assert not clash.running


def test_rsnotify_cli_runs_as_managed_process(
    rsnotify_process: Callable[..., ManagedProcess],
) -> None:
    process = rsnotify_process("--version")
    found = process.wait_for_line(r"^rsnotify (\S+)$", 10)
    assert found.group(1) == rsnotify.__version__
    assert process.wait(10) == 0


def test_wait_for_line_sees_only_complete_lines_and_terminate_reaps(
    tmp_path: Path, process_factory: Callable[..., ManagedProcess]
) -> None:
    go = tmp_path / "go"
    script = (
        "import pathlib, sys, threading\n"
        "sys.stdout.write('listening on http://127.0.0.1:80'); sys.stdout.flush()\n"
        f"go = pathlib.Path({str(go)!r})\n"
        "while not go.exists(): threading.Event().wait(0.01)\n"
        "print('80', flush=True)\n"
        "threading.Event().wait()\n"
    )
    process = process_factory([sys.executable, "-c", script], name="server")
    wait_for(lambda: process.stdout_path.read_bytes(), 10, message="no partial line")
    with pytest.raises(AssertionError, match="no line matching"):
        process.wait_for_line(r"http://127\.0\.0\.1:(\d+)$", 0.1)
    go.touch()
    found = process.wait_for_line(r"http://127\.0\.0\.1:(\d+)$", 10)
    assert found.group(1) == "8080"
    pid = process.pid
    assert process.terminate() == -15
    assert gone(pid)


def test_wait_for_line_fails_fast_when_process_exits(
    process_factory: Callable[..., ManagedProcess],
) -> None:
    process = process_factory([sys.executable, "-c", "print('bye')"], name="quitter")
    with pytest.raises(AssertionError, match="exited with 0"):
        process.wait_for_line("listening on", 10)


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
