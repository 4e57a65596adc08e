"""Private MQTT brokers on loopback: Mosquitto and NATS (its MQTT listener).

Integration tests run against the real brokers rsnotify meets in production,
never mocks: a mock cannot reproduce a broker that restarts, stalls or drops
a queue.  Readiness means a real CONNACK (:func:`mqtt_connack`), not just an
open port.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import paho.mqtt.client as mqtt

from .ports import tcp_accepts
from .process import StrPath
from .service import Service, installed_binary

__all__ = ["Mosquitto", "NatsServer", "Users", "mosquitto_password_line", "mqtt_connack"]


_probe_ids = itertools.count()


def mqtt_connack(
    host: str,
    port: int,
    *,
    credentials: tuple[str, str] | None = None,
    timeout: float = 2.0,
) -> mqtt.ReasonCode | None:
    """Do a real MQTT CONNECT with paho-mqtt; return the CONNACK reason code, or None.

    ``None`` means no CONNACK arrived (nothing listening, or not speaking MQTT).
    """
    received: list[mqtt.ReasonCode] = []
    client_id = f"rsnotify-test-probe-{os.getpid()}-{next(_probe_ids)}"
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
    if credentials:
        client.username_pw_set(*credentials)

    def on_connect(
        _c: mqtt.Client, _u: object, _f: object, reason: mqtt.ReasonCode, _p: object
    ) -> None:
        received.append(reason)

    client.on_connect = on_connect
    try:
        client.connect(host, port, keepalive=10)
        deadline = time.monotonic() + timeout
        while not received and time.monotonic() < deadline:
            if client.loop(timeout=0.05) != mqtt.MQTT_ERR_SUCCESS:
                break
        if received and not received[0].is_failure:
            client.disconnect()
    except OSError:
        return None
    finally:
        with contextlib.suppress(Exception):
            sock = client.socket()
            if sock is not None:
                sock.close()
    return received[0] if received else None


def mosquitto_password_line(user: str, password: str) -> str:
    """A mosquitto 2.x password-file line (``$7$`` = PBKDF2-SHA512, 101 rounds).

    Used only when ``mosquitto_passwd`` is missing; mosquitto 2 refuses plaintext.
    """
    salt = os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, 101)
    b64 = base64.b64encode
    return f"{user}:$7$101${b64(salt).decode()}${b64(digest).decode()}"


Users = Mapping[str, str] | Iterable[tuple[str, str]]


class Mosquitto(Service):
    """A private Mosquitto broker on ``127.0.0.1:<free port>``.

    ``password_file`` is either the path of an existing file or the users
    themselves (a mapping or ``(user, password)`` pairs), hashed into
    ``<directory>/passwords``.  ``acl_file`` is a path; ``acl`` is ACL text
    written to ``<directory>/acl``.  ``allow_anonymous`` defaults to true unless
    a password file is configured.  ``extra_config`` lines are appended verbatim.
    """

    name = "mosquitto"

    def __init__(
        self,
        directory: StrPath,
        *,
        port: int | None = None,
        allow_anonymous: bool | None = None,
        max_queued_messages: int | None = None,
        max_inflight_messages: int | None = None,
        persistence: bool = False,
        password_file: StrPath | Users | None = None,
        acl_file: StrPath | None = None,
        acl: str | None = None,
        extra_config: str | Iterable[str] = (),
        verbose: bool = False,
    ) -> None:
        super().__init__(directory, port)
        self.binary = installed_binary("mosquitto", "/usr/sbin/mosquitto")
        self.config_path = self.directory / "mosquitto.conf"
        self.max_queued_messages = max_queued_messages
        self.max_inflight_messages = max_inflight_messages
        self.persistence = persistence
        self.persistence_location = self.directory / "data"
        self.verbose = verbose
        self.extra_config = [extra_config] if isinstance(extra_config, str) else list(extra_config)
        self.users: dict[str, str] = {}
        self.password_path: Path | None = None
        if isinstance(password_file, str | os.PathLike):
            self.password_path = Path(password_file)
        elif password_file is not None:
            pairs = password_file.items() if isinstance(password_file, Mapping) else password_file
            self.users = dict(pairs)
            self.password_path = self.directory / "passwords"
            self._write_passwords()
        if acl is not None and acl_file is not None:
            raise ValueError("give acl (text) or acl_file (path), not both")
        self.acl_path: Path | None = Path(acl_file) if acl_file is not None else None
        if acl is not None:
            self.acl_path = self.directory / "acl"
            self.acl_path.write_text(acl if acl.endswith("\n") else acl + "\n")
        self.allow_anonymous = (
            allow_anonymous if allow_anonymous is not None else self.password_path is None
        )

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    @property
    def credentials(self) -> tuple[str, str] | None:
        """The first generated user, if any (also what the readiness probe logs in as)."""
        return next(iter(self.users.items()), None)

    def config_text(self) -> str:
        lines = [
            "# generated by tests.devstack",
            # Running as root, mosquitto would drop to user "mosquitto" and lose
            # access to our temp dir; as anyone else this line is ignored.
            f"user {pwd.getpwuid(os.getuid()).pw_name}",
            f"listener {self.port} {self.host}",
            f"allow_anonymous {'true' if self.allow_anonymous else 'false'}",
            "log_dest stderr",
            # One type per line: mosquitto ignores anything after the first word.
            *(
                ["log_type all"]
                if self.verbose
                else [f"log_type {t}" for t in ("error", "warning", "notice", "information")]
            ),
            "log_timestamp true",
            "log_timestamp_format %Y-%m-%dT%H:%M:%S",
            "connection_messages true",
        ]
        if self.persistence:
            lines += ["persistence true", f"persistence_location {self.persistence_location}/"]
        else:
            lines.append("persistence false")
        if self.max_queued_messages is not None:
            lines.append(f"max_queued_messages {self.max_queued_messages}")
        if self.max_inflight_messages is not None:
            lines.append(f"max_inflight_messages {self.max_inflight_messages}")
        if self.password_path is not None:
            lines.append(f"password_file {self.password_path}")
        if self.acl_path is not None:
            lines.append(f"acl_file {self.acl_path}")
        lines += self.extra_config
        return "\n".join(lines) + "\n"

    def _write_config(self) -> None:
        if self.persistence:
            self.persistence_location.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_text())

    def _write_passwords(self) -> None:
        assert self.password_path is not None
        path = self.password_path
        path.write_text("")
        path.chmod(0o600)
        tool = shutil.which("mosquitto_passwd")
        if tool is None:
            path.write_text(
                "".join(mosquitto_password_line(u, p) + "\n" for u, p in self.users.items())
            )
            return
        for user, password in self.users.items():
            subprocess.run(
                [tool, "-b", str(path), user, password],
                check=True,
                capture_output=True,
                timeout=10,
            )

    def _argv(self) -> list[str]:
        return [self.binary, "-c", str(self.config_path)]

    def _ready(self) -> bool:
        if not tcp_accepts(self.host, self.port):
            return False
        return mqtt_connack(self.host, self.port, credentials=self.credentials) is not None


class NatsServer(Service):
    """A private ``nats-server`` with its MQTT listener on ``127.0.0.1:<free port>``.

    The second MQTT broker of the tests (Debian's ``nats-server``): MQTT 3.1.1
    only, over JetStream, with its own rules (no ``.`` or space in topics).
    Its JetStream store (retained messages, sessions, QoS 1 queues) lives in
    ``<directory>/jetstream`` and survives :meth:`kill` and :meth:`restart`,
    like a broker with persistence.  The NATS client port is picked by NATS
    itself (``-1``): nothing here uses it.  ``extra_config`` lines are
    appended verbatim.
    """

    name = "nats-server"

    def __init__(
        self,
        directory: StrPath,
        *,
        port: int | None = None,
        extra_config: str | Iterable[str] = (),
    ) -> None:
        super().__init__(directory, port)
        self.binary = installed_binary("nats-server", "/usr/sbin/nats-server")
        self.config_path = self.directory / "nats.conf"
        self.store = self.directory / "jetstream"
        self.extra_config = [extra_config] if isinstance(extra_config, str) else list(extra_config)

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def config_text(self) -> str:
        lines = [
            "# generated by tests.devstack",
            f"server_name: rsnotify-test-{self.port}",
            f"listen: {self.host}:-1",
            # Limits, not allocations: the defaults are 75% of the machine's memory.
            f'jetstream {{ store_dir: "{self.store}", max_memory_store: 64MB, '
            "max_file_store: 1GB }",
            f"mqtt {{ listen: {self.host}:{self.port} }}",
            *self.extra_config,
        ]
        return "\n".join(lines) + "\n"

    def _write_config(self) -> None:
        self.store.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_text())

    def _argv(self) -> list[str]:
        return [self.binary, "-c", str(self.config_path)]

    def _ready(self) -> bool:
        # mqtt_connack speaks MQTT 3.1.1 (paho's default), which NATS accepts.
        return mqtt_connack(self.host, self.port) is not None
