"""Access control, end to end: real Mosquitto with passwords, ACLs and TLS, real processes.

Why one module of ~550 lines: the five tests are one acceptance list on one rig --
``make_pki``, ``secured_broker`` with ``deploy/mosquitto.acl``, the ``start_*`` process
helpers, ``wait_converged`` and the raw ``mqtt_client`` -- which is over a third of the file
and which each test uses in part.

``rsnotify simulate`` is the Source, ``rsnotify publish`` and ``rsnotify
subscribe`` run as child processes; the broker is Mosquitto with a password
file made here with ``mosquitto_passwd -b`` and the ACL shipped in
``deploy/mosquitto.acl``; certificates come from a throw-away CA made here
with the ``openssl`` command.  What the tests prove:

* ``test_mqtt_acl_publisher_writes_subscribers_read_and_a_forger_is_refused``:
  the publisher's account may write ``resourcesync/#``, a subscriber's only
  read; a read-only ``rsnotify subscribe`` converges from pushed
  notifications; the same read-only credentials publishing a forged
  notification (a ``deleted`` of a live resource) and a forged retained head
  get ``Not authorized`` PUBACKs, and a sentinel published afterwards reaches
  an observer that never sees the forgery; the mirror still equals the Source.
* ``test_a_wrong_mqtt_password_is_a_clear_error_and_never_logged``: both
  processes say "Bad user name or password" and never print the password.
* ``test_mqtts_with_a_private_ca_converges_and_a_wrong_ca_is_a_clear_error``.
* ``test_wss_with_a_bearer_token_converges_and_bad_tokens_are_refused``:
  ``--ws-cert/--ws-key`` on the publisher, ``--ws-ca`` and ``--ws-token`` on
  the subscriber; missing and wrong tokens get HTTP 401.
* ``test_hmac_key_rotation_accepts_both_keys_then_refuses_the_retired_one``:
  the subscriber holds ``k1`` and ``k2`` while the publisher moves from one
  to the other and applies every notification from the notification itself
  (its apply log records the seq); once ``k1`` is retired, notifications
  signed with it are refused and the changes arrive by polling instead.

A subscriber with a secret refusing *unsigned* notifications is proven in
``tests/test_subscriber_hostile.py::test_a_subscriber_with_a_secret_refuses_unsigned_notifications_and_polls``.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import re
import ssl
import subprocess
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from websockets.sync.client import connect as ws_connect

from rsnotify import envelope
from rsnotify.model import ChangeType
from rsnotify.subscriber.resources import ApplyRecord
from tests.devstack import ManagedProcess, Mosquitto, free_port, wait_for
from tests.groundtruth import mirror_differences
from tests.helpers import read_apply_log

DEPLOY = Path(__file__).parent.parent / "deploy"
PUBLISHER, SUBSCRIBER = "rsnotify-publisher", "rsnotify-subscriber"  # deploy/mosquitto.acl
PASSWORDS = {PUBLISHER: "pub-Secret-1", SUBSCRIBER: "sub-Secret-2"}
COLLECTION_LINE = re.compile(r"^rsnotify publish: collection (\S+) (\S+)$", re.MULTILINE)
RunRsnotify = Callable[..., ManagedProcess]

pytestmark = pytest.mark.timeout(120)


# --- certificates (openssl CLI) ------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    """A private CA and a server certificate it signed for 127.0.0.1 / localhost."""

    ca: Path
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", f"/CN=rsnotify test CA {directory.name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost",
             cwd=directory)  # fmt: skip
    (directory / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf",
        cwd=directory,
    )  # fmt: skip
    return Pki(directory / "ca.pem", directory / "server.pem", directory / "server.key")


# --- the broker --------------------------------------------------------------------------


def password_file(path: Path) -> Path:
    """Made the way deploy/README.md says: one ``mosquitto_passwd -b`` per account."""
    path.write_text("")
    path.chmod(0o600)
    for user, password in PASSWORDS.items():
        subprocess.run(["mosquitto_passwd", "-b", str(path), user, password], check=True)
    return path


def secured_broker(
    factory: Callable[..., Mosquitto], tmp_path: Path, tls: Pki | None = None
) -> tuple[Mosquitto, int | None]:
    """No anonymous access, the shipped ACL; with ``tls`` also a TLS listener (its port)."""
    extra: list[str] = []
    tls_port = None
    if tls is not None:
        tls_port = free_port()
        extra = [
            f"listener {tls_port} 127.0.0.1",
            f"certfile {tls.cert}",
            f"keyfile {tls.key}",
            "tls_version tlsv1.2",
        ]
    broker = factory(
        password_file=password_file(tmp_path / "passwd"),
        acl_file=DEPLOY / "mosquitto.acl",
        allow_anonymous=False,
        max_queued_messages=100_000,
        extra_config=extra,
    )
    return broker, tls_port


def url(scheme: str, user: str | None, port: int, password: str | None = None) -> str:
    if user is None:
        return f"{scheme}://127.0.0.1:{port}"
    return f"{scheme}://{user}:{password or PASSWORDS[user]}@127.0.0.1:{port}"


# --- the Source and the processes ----------------------------------------------------------


@dataclass
class Source:
    process: ManagedProcess
    base: str

    def _call(self, method: str, path: str) -> Any:
        request = urllib.request.Request(self.base + path, method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def advance(self, n: int) -> None:
        assert self._call("POST", f"_simulator/advance?n={n}")["applied"] == n

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = self._call("GET", "_simulator/state")
        return state


def start_source(run: RunRsnotify) -> Source:
    process = run(
        "simulate", "--port", "0", "--quiet", "--paused", "--rate", "0",
        "--collections", "1", "--resources", "20", "--payload-bytes", "200", "--seed", "8",
        name="simulate",
    )  # fmt: skip
    match = process.wait_for_line(r"rsnotify simulate: serving (http://\S+/)$", timeout=30)
    return Source(process, match.group(1))


def start_publisher(
    run: RunRsnotify, source: Source, state: Path, *args: str
) -> tuple[ManagedProcess, dict[str, str]]:
    """``rsnotify publish``, started and announced; its collections (id -> Capability List)."""
    process = run(
        "publish", source.base, "--state-dir", str(state), "--poll", "0.1", "--heartbeat", "1",
        *args, name="publish",
    )  # fmt: skip
    process.wait_for_line(r"rsnotify publish: running", timeout=30, stream="stdout")
    return process, wait_for(
        lambda: dict(COLLECTION_LINE.findall(process.output("stdout"))),
        10,
        message=lambda: f"no collection announced\n{process.tail()}",
    )


def start_subscriber(
    run: RunRsnotify, source: Source, mirror: Path, via: str, *args: str, live: bool = True
) -> ManagedProcess:
    """``rsnotify subscribe`` that would only poll every 10 minutes: changes come by push."""
    process = run(
        "subscribe", source.base, "--into", str(mirror), "--via", via,
        "--heartbeat-timeout", "600", "--safety-poll", "600", "--log-format", "text",
        *args, name="subscribe",
    )  # fmt: skip
    if live:
        wait_for(
            lambda: ": live" in process.output() or not process.running,
            60,
            message=lambda: f"the subscriber did not go live\n{process.tail()}",
        )
        assert process.running, process.tail()
    return process


def wait_converged(source: Source, mirror: Path, subscriber: ManagedProcess) -> None:
    last: list[str] = []

    def equal() -> bool:
        last[:] = mirror_differences(source.state(), mirror)
        return not last

    wait_for(equal, 30, 0.1, message=lambda: f"mirror differs: {last[:5]}\n{subscriber.tail()}")


def apply_log(mirror: Path) -> list[ApplyRecord]:
    return asyncio.run(read_apply_log(mirror))


def pushed(mirror: Path) -> list[int]:
    """Sequence numbers of the changes applied from their own notification (polls have none)."""
    return sorted(r.seq for r in apply_log(mirror) if r.seq is not None)


def wait_pushed(mirror: Path, expected: list[int], why: str = "") -> None:
    """Wait until the apply log shows exactly ``expected`` as applied from pushes.

    A change's apply-log row is written after its file is durable, so the
    mirror can equal the Source a moment before the last row is committed.
    """
    seen: list[int] = []

    def done() -> bool:
        seen[:] = pushed(mirror)
        return seen == expected

    wait_for(done, 10, 0.05, message=lambda: f"{why or 'pushed'}: {seen} != {expected}")


# --- a raw MQTT client ----------------------------------------------------------------------


@dataclass
class Client:
    client: mqtt.Client
    messages: list[tuple[str, bytes]]
    pubacks: dict[int, mqtt.ReasonCode]
    connack: list[mqtt.ReasonCode]

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> mqtt.ReasonCode:
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [(envelope.SIGNATURE_PROPERTY, "k1:sha256=" + "0" * 64)]
        info = self.client.publish(topic, payload, qos=1, retain=retain, properties=props)
        return wait_for(lambda: self.pubacks.get(info.mid), 10, message="no PUBACK")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def mqtt_client(port: int, user: str, name: str, *, subscribe: str | None = None) -> Client:
    c = Client(
        mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name, protocol=mqtt.MQTTv5),
        [],
        {},
        [],
    )
    c.client.username_pw_set(user, PASSWORDS[user])
    c.client.on_connect = lambda _c, _u, _f, reason, _p: c.connack.append(reason)
    c.client.on_message = lambda _c, _u, msg: c.messages.append((msg.topic, msg.payload))
    c.client.on_publish = lambda _c, _u, mid, reason, _p: c.pubacks.update({mid: reason})
    subscribed: list[Any] = []
    c.client.on_subscribe = lambda _c, _u, _m, reasons, _p: subscribed.append(reasons)
    c.client.connect("127.0.0.1", port)
    c.client.loop_start()
    wait_for(lambda: c.connack, 10, message=f"{user}: no CONNACK")
    assert not c.connack[0].is_failure, c.connack[0]
    if subscribe is not None:
        c.client.subscribe(subscribe, qos=1)
        wait_for(lambda: subscribed, 10, message="no SUBACK")
        assert [r.value for r in subscribed[0]] == [1], subscribed
    return c


# --- MQTT: passwords and ACLs ------------------------------------------------------------


def test_mqtt_acl_publisher_writes_subscribers_read_and_a_forger_is_refused(
    tmp_path: Path, mosquitto_factory: Callable[..., Mosquitto], rsnotify_process: RunRsnotify
) -> None:
    broker, _ = secured_broker(mosquitto_factory, tmp_path)
    source = start_source(rsnotify_process)
    _, collections = start_publisher(
        rsnotify_process, source, tmp_path / "pub", "--mqtt", url("mqtt", PUBLISHER, broker.port)
    )
    (cid,) = collections
    mirror = tmp_path / "mirror"
    subscriber = start_subscriber(
        rsnotify_process, source, mirror, url("mqtt", SUBSCRIBER, broker.port)
    )
    observer = mqtt_client(broker.port, SUBSCRIBER, "observer", subscribe="resourcesync/#")
    forger = mqtt_client(broker.port, SUBSCRIBER, "forger")
    try:
        source.advance(10)
        wait_converged(source, mirror, subscriber)
        wait_pushed(mirror, list(range(1, 11)), "not applied from pushed notifications")

        # The read-only account forges the deletion of a live resource, and a head
        # far ahead (which would make every subscriber look for a gap).
        victim = sorted(next(iter(source.state()["collections"].values()))["resources"])[0]
        forged = envelope.to_json(
            envelope.Notification(
                collection=cid, seq=11, capabilitylist=collections[cid],
                changelist=f"{source.base}changelist.xml", loc=victim,
                change=ChangeType.DELETED, datetime=datetime.now(UTC),
            )
        )  # fmt: skip
        forged_time = envelope.from_json(forged).datetime
        refused = forger.publish(f"resourcesync/{cid}/changes", forged)
        assert refused.getName() == "Not authorized"
        head = json.dumps({"head": 10**9, "earliest": 1}).encode()
        assert forger.publish(f"resourcesync/{cid}/head", head, retain=True).is_failure

        # Sentinel: the next real change.  Once it has arrived, the forgery (PUBACKed
        # before it was even made) had every chance to arrive first.
        source.advance(1)
        wait_for(
            lambda: any(json.loads(p).get("seq") == 11 for t, p in observer.messages
                        if t.endswith("/changes")),
            20,
            message="the sentinel never arrived",
        )  # fmt: skip
        assert forged not in [p for _, p in observer.messages]
        assert not [p for t, p in observer.messages if t.endswith("/head") and p == head]
        wait_converged(source, mirror, subscriber)
        wait_pushed(mirror, list(range(1, 12)))
        assert forged_time not in [r.datetime for r in apply_log(mirror) if r.loc == victim]
    finally:
        observer.close()
        forger.close()


def test_a_wrong_mqtt_password_is_a_clear_error_and_never_logged(
    tmp_path: Path, mosquitto_factory: Callable[..., Mosquitto], rsnotify_process: RunRsnotify
) -> None:
    broker, _ = secured_broker(mosquitto_factory, tmp_path)
    source = start_source(rsnotify_process)
    wrong = "not-the-Password-9"
    run = rsnotify_process(
        "publish", source.base, "--state-dir", str(tmp_path / "pub"),
        "--mqtt", url("mqtt", PUBLISHER, broker.port, wrong), name="publish",
    )  # fmt: skip
    # One line that says what to change, the same on every client but for the option.
    refused = (
        r"refused user '{}' \((Not authorized|Bad user name or password)\): .*USER:PASSWORD in {}"
    )
    run.wait_for_line(refused.format(PUBLISHER, "--mqtt"), 30)
    subscriber = start_subscriber(
        rsnotify_process, source, tmp_path / "mirror",
        url("mqtt", SUBSCRIBER, broker.port, wrong), live=False,
    )  # fmt: skip
    subscriber.wait_for_line(refused.format(SUBSCRIBER, "--via"), 30)
    for process in (run, subscriber):
        assert wrong not in process.output(), f"{process.name} printed the password"
        assert process.running, process.tail()  # it keeps retrying: the operator may fix it


# --- MQTT over TLS ---------------------------------------------------------------------------


def test_mqtts_with_a_private_ca_converges_and_a_wrong_ca_is_a_clear_error(
    tmp_path: Path, mosquitto_factory: Callable[..., Mosquitto], rsnotify_process: RunRsnotify
) -> None:
    pki = make_pki(tmp_path / "pki")
    other = make_pki(tmp_path / "other-ca")
    _, tls_port = secured_broker(mosquitto_factory, tmp_path, tls=pki)
    assert tls_port is not None
    source = start_source(rsnotify_process)
    start_publisher(
        rsnotify_process, source, tmp_path / "pub",
        "--mqtt", url("mqtts", PUBLISHER, tls_port), "--mqtt-ca", str(pki.ca),
    )  # fmt: skip
    mirror = tmp_path / "mirror"
    via = url("mqtts", SUBSCRIBER, tls_port)
    subscriber = start_subscriber(rsnotify_process, source, mirror, via, "--mqtt-ca", str(pki.ca))
    source.advance(10)
    wait_converged(source, mirror, subscriber)
    wait_pushed(mirror, list(range(1, 11)))

    # A subscriber that trusts another CA never connects, and says why.
    stranger = start_subscriber(
        rsnotify_process, source, tmp_path / "mirror-2", via, "--mqtt-ca", str(other.ca),
        live=False,
    )  # fmt: skip
    stranger.wait_for_line(
        r"MQTT broker mqtts://\S+: its TLS certificate is not trusted .*CERTIFICATE_VERIFY_FAILED"
        r".*--mqtt-ca"
    )
    assert PASSWORDS[SUBSCRIBER] not in stranger.output()
    # And a publisher with the system store (no --mqtt-ca) refuses the private CA too.
    publisher = rsnotify_process(
        "publish", source.base, "--state-dir", str(tmp_path / "pub-2"),
        "--mqtt", url("mqtts", PUBLISHER, tls_port), name="publish-2",
    )  # fmt: skip
    publisher.wait_for_line(r"CERTIFICATE_VERIFY_FAILED", timeout=30)


# --- WebSocket: bearer tokens over wss:// --------------------------------------------------


def upgrade_refusal(
    port: int, path: str, context: ssl.SSLContext, headers: dict[str, str]
) -> tuple[int, str | None]:
    """A WebSocket opening handshake (RFC 6455 section 4.1) over TLS: status, WWW-Authenticate.

    Plain ``http.client`` rather than websockets' sync client: under a full
    ``make test`` on two cores that client once lost the gateway's answer to
    an internal error of its receiving thread ("stream ended") and timed out.
    """
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    try:
        connection.request(
            "GET",
            path,
            headers={
                "Upgrade": "websocket",
                "Connection": "Upgrade",
                "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
                "Sec-WebSocket-Version": "13",
                **headers,
            },
        )
        response = connection.getresponse()
        response.read()
        return response.status, response.getheader("WWW-Authenticate")
    finally:
        connection.close()


def test_wss_with_a_bearer_token_converges_and_bad_tokens_are_refused(
    tmp_path: Path, rsnotify_process: RunRsnotify
) -> None:
    pki = make_pki(tmp_path / "pki")
    source = start_source(rsnotify_process)
    port = free_port()
    token = "t0ken-Of-The-Gateway"
    _, (cid,) = start_publisher(
        rsnotify_process, source, tmp_path / "pub",
        "--ws", f"127.0.0.1:{port}", "--ws-token", token,
        "--ws-cert", str(pki.cert), "--ws-key", str(pki.key),
    )  # fmt: skip
    mirror = tmp_path / "mirror"
    via = f"wss://127.0.0.1:{port}"
    subscriber = start_subscriber(
        rsnotify_process, source, mirror, via, "--ws-token", token, "--ws-ca", str(pki.ca)
    )
    source.advance(10)
    wait_converged(source, mirror, subscriber)
    wait_pushed(mirror, list(range(1, 11)))

    trusted = ssl.create_default_context(cafile=pki.ca)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {token}"}):
        status, challenge = upgrade_refusal(port, f"/{cid}", trusted, headers)
        assert (status, challenge) == (401, 'Bearer realm="rsnotify"'), headers
    with ws_connect(
        f"{via}/{cid}?access_token={token}", ssl=trusted, open_timeout=10
    ) as browser:  # the query-string form browsers need
        assert json.loads(browser.recv(timeout=10))["type"] == "hello"
    with pytest.raises(ssl.SSLCertVerificationError):
        ws_connect(f"{via}/{cid}", ssl=ssl.create_default_context(), open_timeout=10)

    # An `rsnotify subscribe` with a wrong token says so and gets nothing.
    intruder = start_subscriber(
        rsnotify_process, source, tmp_path / "mirror-2", via,
        "--ws-token", "wrong", "--ws-ca", str(pki.ca), live=False,
    )  # fmt: skip
    intruder.wait_for_line(r"HTTP 401", timeout=30)
    assert "wrong" not in intruder.output().replace("--ws-token", ""), "token printed"


# --- HMAC key rotation ----------------------------------------------------------------------


def test_hmac_key_rotation_accepts_both_keys_then_refuses_the_retired_one(
    tmp_path: Path, mosquitto_factory: Callable[..., Mosquitto], rsnotify_process: RunRsnotify
) -> None:
    broker, _ = secured_broker(mosquitto_factory, tmp_path)
    source = start_source(rsnotify_process)
    mqtt_pub = url("mqtt", PUBLISHER, broker.port)
    old, new = "k1=old-secret-1", "k2=new-secret-2"

    def publisher(key: str) -> ManagedProcess:
        kid, _, secret = key.partition("=")
        process, _ = start_publisher(
            rsnotify_process, source, tmp_path / "pub",
            "--mqtt", mqtt_pub, "--secret", secret, "--secret-id", kid,
        )  # fmt: skip
        return process

    signer = publisher(old)
    mirror = tmp_path / "mirror"
    via = url("mqtt", SUBSCRIBER, broker.port)
    subscriber = start_subscriber(
        rsnotify_process, source, mirror, via, "--secret", old, "--secret", new
    )
    source.advance(5)  # signed with k1
    wait_converged(source, mirror, subscriber)
    signer.terminate()
    signer = publisher(new)
    source.advance(5)  # signed with k2: the window, both accepted
    wait_converged(source, mirror, subscriber)
    wait_pushed(mirror, list(range(1, 11)), "a key of the window was refused")
    assert "invalid payload" not in subscriber.output()

    # k1 is retired at the subscriber; a publisher still signing with it is refused.
    subscriber.terminate()
    subscriber = start_subscriber(rsnotify_process, source, mirror, via, "--secret", new)
    signer.terminate()
    publisher(old)
    source.advance(3)
    wait_for(
        lambda: "unknown signing key 'k1'" in subscriber.output(),
        30,
        message=lambda: f"k1 was not refused\n{subscriber.tail()}",
    )
    # The three changes still arrive (the mirror equals the Source again), but by
    # polling the Change Lists: none was applied from its k1-signed notification.
    wait_converged(source, mirror, subscriber)
    assert pushed(mirror) == list(range(1, 11)), "a notification signed with k1 was applied"
