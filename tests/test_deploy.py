"""deploy/: every file is checked by the program that will read it in production.

Why one module of ~580 lines: it is the check-list of ``deploy/``, one section per kind of
file, run by the program that reads it; the sections share little (``compose`` and
``PASSWORDS`` tie the compose and broker sections) and could be split, but together one file
shows what of ``deploy/`` is checked and how.

* systemd units: ``systemd-analyze verify`` (offline, no systemd needed as PID 1)
  must print nothing, and ``systemd-analyze security --offline`` must rate the
  sandbox "OK" (exposure <= 2.0).  verify checks that ExecStart's binary exists,
  so the test verifies a copy whose ``/opt/rsnotify/bin/rsnotify`` points at the
  ``rsnotify`` of this environment; nothing else is changed.
* the units' and compose services' command lines, with the example TOML and
  environment files, are parsed by the real rsnotify parsers and configuration
  layer, so an option renamed in the code breaks this test, not a deployment.
* mosquitto.conf and mosquitto.acl run in the real broker (port, paths and user
  substituted in a temporary copy), and the ACL is exercised with real clients;
  redis.conf runs in the real redis-server and is filled past maxmemory
  through rsnotify's own log to show it refuses writes rather than evicting.
* compose.yaml parses as YAML with the expected services, and the files it
  mounts exist.  (Docker itself is not available here.)
"""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import redis as redis_sync
import yaml
from paho.mqtt.reasoncodes import ReasonCode

from rsnotify import cli
from rsnotify.commands import config as config_command
from rsnotify.log import LogUnavailable
from rsnotify.log.redis_log import RedisLog
from rsnotify.metrics import PublisherMetrics
from rsnotify.subscriber.telemetry import SubscriberMetrics
from tests.devstack import Mosquitto, Redis, mqtt_connack, wait_for

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
UNITS = DEPLOY / "systemd"
INSTALLED = "/opt/rsnotify/bin/rsnotify"
UNIT_NAMES = [
    "rsnotify-publish.service",
    "rsnotify-subscribe@example.service",
    "rsnotify-dashboard.service",
]
PASSWORDS = {
    "rsnotify-publisher": "pub-pw",
    "rsnotify-subscriber": "sub-pw",
    "rsnotify-dashboard": "dash-pw",
    "rsnotify-health": "dash-pw",  # compose's health check: the dashboard's password, no rights
}


# --- systemd units --------------------------------------------------------------------


def _systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    assert found, "systemd-analyze is missing: apt-get install systemd"
    return found


def _rsnotify_here() -> str:
    found = Path(sys.executable).with_name("rsnotify")
    assert found.is_file(), f"no rsnotify console script beside {sys.executable}"
    return str(found)


@pytest.fixture
def units(tmp_path: Path) -> Path:
    """Copies of the units whose ExecStart names the rsnotify installed here."""
    for unit in UNITS.glob("*.service"):
        text = unit.read_text()
        assert INSTALLED in text, f"{unit.name} does not run {INSTALLED}"
        (tmp_path / unit.name).write_text(text.replace(INSTALLED, _rsnotify_here()))
    return tmp_path


@pytest.mark.parametrize("name", UNIT_NAMES)
def test_unit_passes_systemd_analyze_verify(units: Path, name: str) -> None:
    done = subprocess.run(
        [_systemd_analyze(), "verify", "--man=no", str(units / name)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # verify exits 0 even for unknown keys and bad values; it only warns.
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


@pytest.mark.parametrize("name", UNIT_NAMES)
def test_unit_sandbox_is_rated_ok(units: Path, name: str) -> None:
    command = [_systemd_analyze(), "security", "--offline=true", "--threshold=20", "--no-pager"]
    done = subprocess.run(
        [*command, str(units / name)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    exposure = re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout)
    assert exposure and float(exposure.group(1)) <= 2.0


def _unit_settings(path: Path) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def _env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = shlex.split(value)[0] if value else ""
    return env


@pytest.mark.parametrize(
    ("unit", "instance"),
    [
        ("rsnotify-publish.service", ""),
        ("rsnotify-subscribe@.service", "example"),
        ("rsnotify-dashboard.service", ""),
    ],
)
def test_unit_command_lines_parse_with_the_example_configuration(
    unit: str, instance: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = {
        key: [v.replace("%i", instance) for v in values]
        for key, values in _unit_settings(UNITS / unit).items()
    }
    for required in ("Restart", "RestartSec", "User", "NoNewPrivileges", "ProtectSystem"):
        assert required in settings, f"{unit}: no {required}="
    assert settings["KillSignal"] == ["SIGTERM"] and settings["TimeoutStopSec"]
    argv = shlex.split(settings["ExecStart"][0])
    assert argv[0] == INSTALLED
    argv = [a.replace("/etc/rsnotify/", f"{DEPLOY}/") for a in argv]
    # As EnvironmentFile= does: the process environment (RSNOTIFY_SECRET and
    # RSNOTIFY_WS_TOKEN are read by the commands themselves).
    env = _env_file(DEPLOY / "rsnotify.env.example")
    for key in [k for k in os.environ if k.startswith("RSNOTIFY_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    _, args = cli.parse_command(argv[1], argv[2:])
    if argv[1] == "publish":
        assert args.source == "https://source.example.org/"
        assert args.mqtt.startswith("mqtt://rsnotify-publisher:")
        assert args.redis.startswith("redis://:") and args.secret
        assert settings["StateDirectory"] == ["rsnotify/publish"]
        assert args.state_dir == "/var/lib/rsnotify/publish"
    elif argv[1] == "subscribe":
        assert args.into.startswith(f"/var/lib/rsnotify/subscribe-{instance}/")
        assert settings["StateDirectory"] == [f"rsnotify/subscribe-{instance}"]
        assert args.name == instance and args.secret == [env["RSNOTIFY_SECRET"]]
    else:
        assert argv[1] == "dashboard"
        assert args.redis == env["RSNOTIFY_COMMON_REDIS"] and args.mqtt


def test_example_configuration_files_pass_config_check() -> None:
    for name in ("rsnotify.toml", "subscribe-example.toml"):
        assert config_command.check(DEPLOY / name) == [], name
    assert config_command.check_environment(_env_file(DEPLOY / "rsnotify.env.example")) == []


# --- compose.yaml ------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$\{([A-Z_]+)(?::?([-?])([^}]*))?\}")


def _interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR:?error} (and $$ for a literal $)."""
    if isinstance(value, dict):
        return {k: _interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        name, kind, extra = match.groups()
        if env.get(name):
            return env[name]
        if kind == "?":
            raise KeyError(f"{name}: {extra}")
        return extra if kind == "-" else ""

    return _VARIABLE.sub(one, value.replace("$$", "\0")).replace("\0", "$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert isinstance(document, dict)
    return document


COMPOSE_ENV = {
    "REDIS_PASSWORD": "r-pw",
    "MQTT_PUBLISHER_PASSWORD": "p-pw",
    "MQTT_SUBSCRIBER_PASSWORD": "s-pw",
    "MQTT_DASHBOARD_PASSWORD": "d-pw",
    "RSNOTIFY_SECRET": "sig",
    "RSNOTIFY_WS_TOKEN": "tok",
}


def test_compose_has_the_stack_and_refuses_to_start_without_secrets(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    assert {"redis", "mosquitto", "publisher", "subscriber", "dashboard"} <= set(services)
    with pytest.raises(KeyError, match=r"set \w+ in deploy/\.env"):
        _interpolate(compose, {})
    for name in COMPOSE_ENV:  # each secret is required on its own
        with pytest.raises(KeyError, match=name):
            _interpolate(compose, {k: v for k, v in COMPOSE_ENV.items() if k != name})
    resolved = _interpolate(compose, COMPOSE_ENV)["services"]
    for name, service in resolved.items():
        assert "image" in service, name
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in compose["volumes"], f"{name}: undeclared volume {source}"
    build = resolved["publisher"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).is_file()


@pytest.mark.parametrize("service", ["publisher", "subscriber", "dashboard", "simulator"])
def test_compose_rsnotify_commands_parse_with_the_real_parsers(
    compose: dict[str, Any], service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _interpolate(compose, COMPOSE_ENV)["services"][service]
    assert spec["image"] == "rsnotify:local" and spec["read_only"] is True
    command = [str(a) for a in spec["command"]]
    for key in [k for k in os.environ if k.startswith("RSNOTIFY_")]:
        monkeypatch.delenv(key)
    for key, value in spec.get("environment", {}).items():
        monkeypatch.setenv(key, str(value))
    _, args = cli.parse_command(command[0], command[1:])
    if service == "publisher":
        assert args.redis == "redis://:r-pw@redis:6379/0"
        assert args.mqtt == "mqtt://rsnotify-publisher:p-pw@mosquitto:1883"
        assert args.ws == "0.0.0.0:8765" and args.metrics_port == 9101
        assert (args.secret, args.ws_token) == ("sig", "tok")
    elif service == "subscriber":
        assert args.via == "mqtt://rsnotify-subscriber:s-pw@mosquitto:1883"
        assert args.report == "redis://:r-pw@redis:6379/0"
        assert (args.secret, args.ws_token) == (["sig"], "tok")
        mount = spec["volumes"][0].split(":")[1]
        assert Path(args.into).parent == Path(mount)  # mirror and its state in the volume
    elif service == "dashboard":
        assert args.redis == "redis://:r-pw@redis:6379/0" and args.port == 8080


def test_compose_brokers_use_the_deploy_files_where_they_expect_them(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["mosquitto"]["volumes"]}
    conf = _options(DEPLOY / "mosquitto.conf")
    assert mounts["/etc/mosquitto/mosquitto.conf"] == "./mosquitto.conf"
    assert mounts[conf["acl_file"][0]] == "./mosquitto.acl"
    assert conf["persistence_location"][0].rstrip("/") in mounts
    script = services["mosquitto"]["command"][-1]
    for user in PASSWORDS:
        assert f"{conf['password_file'][0]} {user} " in script
    redis_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["redis"]["volumes"]}
    assert redis_mounts["/usr/local/etc/redis/redis.conf"] == "./redis.conf"
    assert "/usr/local/etc/redis/redis.conf" in services["redis"]["command"][-1]


# --- Prometheus ---------------------------------------------------------------------


def _exported_metric_names() -> set[str]:
    from rsnotify.dashboard.metrics import DashboardMetrics

    names: set[str] = set()
    registries = [
        PublisherMetrics().registry,
        SubscriberMetrics("test").registry,
        DashboardMetrics(lambda: None).registry,
    ]
    for registry in registries:
        for family in registry.collect():
            names.add(family.name)
            if family.type == "histogram":
                names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count")}
            if family.type == "counter":
                names.add(f"{family.name}_total")
    source = (Path(cli.__file__).parent / "dashboard" / "metrics.py").read_text()
    names |= set(re.findall(r'"(rsnotify_dashboard_[a-z0-9_]+)"', source))  # scrape-time gauges
    source = (Path(cli.__file__).parent / "report.py").read_text()
    names |= set(re.findall(r'"(rsnotify_report_[a-z0-9_]+)"', source))
    return names


def test_alert_rules_use_only_metrics_rsnotify_exports() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rsnotify-rules.yml").read_text())
    exported = _exported_metric_names()
    used: set[str] = set()
    alerts = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            alerts.append(rule["alert"])
            assert rule["labels"]["severity"] in ("critical", "warning", "info")
            used |= set(re.findall(r"\b(rsnotify_[a-z0-9_]+)", rule["expr"]))
    assert used and used <= exported, sorted(used - exported)
    assert {"RsnotifySubscriberLagHigh", "RsnotifyPublisherHeartbeatStale"} <= set(alerts)
    assert "RsnotifySubscriberCatchUpsFrequent" in alerts
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"rsnotify-publish", "rsnotify-subscribe", "rsnotify-dashboard"} <= jobs


# --- mosquitto.conf in the real broker -------------------------------------------------


def _options(path: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.strip().partition(" ")
            found.setdefault(key, []).append(value.strip())
    return found


def _substitute(text: str, replacements: Mapping[str, str]) -> str:
    """Replace whole option lines; each must exist exactly once in the file."""
    for pattern, new in replacements.items():
        text, count = re.subn(pattern, new, text, flags=re.MULTILINE)
        assert count == 1, f"{pattern!r} matched {count} lines"
    return text


class DeployedMosquitto(Mosquitto):
    """deploy/mosquitto.conf itself, with only port, paths and user moved."""

    def config_text(self) -> str:
        assert self.password_path is not None and self.acl_path is not None
        return _substitute(
            (DEPLOY / "mosquitto.conf").read_text(),
            {
                r"^user \S+$": f"user {pwd.getpwuid(os.getuid()).pw_name}",
                r"^persistence_location \S+$": f"persistence_location {self.directory}/",
                r"^password_file \S+$": f"password_file {self.password_path}",
                r"^acl_file \S+$": f"acl_file {self.acl_path}",
                r"^listener 1883$": f"listener {self.port} {self.host}",
            },
        )


BROKER_ENV = {
    "MQTT_PUBLISHER_PASSWORD": PASSWORDS["rsnotify-publisher"],
    "MQTT_SUBSCRIBER_PASSWORD": PASSWORDS["rsnotify-subscriber"],
    "MQTT_DASHBOARD_PASSWORD": PASSWORDS["rsnotify-dashboard"],
}


def _compose_password_file(compose: dict[str, Any], path: Path) -> Path:
    """Run the mosquitto_passwd lines of compose's broker command, into ``path``."""
    script = _interpolate(compose["services"]["mosquitto"]["command"][-1], {})
    lines = [line for line in script.splitlines() if line.startswith("mosquitto_passwd ")]
    assert len(lines) == len(PASSWORDS)
    text = "\n".join(["set -eu", "umask 077", *lines]).replace("/etc/mosquitto/passwd", str(path))
    subprocess.run(["sh", "-c", text], env={**os.environ, **BROKER_ENV}, check=True, timeout=30)
    return path


@pytest.fixture
def broker(tmp_path: Path, compose: dict[str, Any]) -> Iterator[DeployedMosquitto]:
    passwords = _compose_password_file(compose, tmp_path / "passwd")
    server = DeployedMosquitto(
        tmp_path / "mosquitto", password_file=passwords, acl_file=DEPLOY / "mosquitto.acl"
    )
    try:
        yield server.start()
    finally:
        server.stop()


def test_compose_broker_healthcheck_passes_only_with_the_password(
    broker: DeployedMosquitto, compose: dict[str, Any]
) -> None:
    kind, command = _interpolate(compose["services"]["mosquitto"]["healthcheck"]["test"], {})
    assert kind == "CMD-SHELL"
    command += f" -p {broker.port}"
    ok = subprocess.run(["sh", "-c", command], env={**os.environ, **BROKER_ENV}, timeout=30)
    assert ok.returncode == 0
    wrong = {**BROKER_ENV, "MQTT_DASHBOARD_PASSWORD": "wrong"}
    refused = subprocess.run(
        ["sh", "-c", command], env={**os.environ, **wrong}, capture_output=True, timeout=30
    )
    assert refused.returncode != 0


def _client(broker: Mosquitto, user: str, name: str) -> tuple[mqtt.Client, dict[str, Any]]:
    seen: dict[str, Any] = {"messages": [], "puback": {}, "suback": None, "connack": None}
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name, protocol=mqtt.MQTTv5)
    client.username_pw_set(user, PASSWORDS[user])
    client.on_connect = lambda c, u, f, reason, props: seen.update(connack=(reason, props))
    client.on_message = lambda c, u, msg: seen["messages"].append((msg.topic, msg.payload))
    client.on_publish = lambda c, u, mid, reason, props: seen["puback"].update({mid: reason})
    client.on_subscribe = lambda c, u, mid, reasons, props: seen.update(suback=reasons)
    client.connect(broker.host, broker.port)
    client.loop_start()
    wait_for(lambda: seen["connack"], message=f"{user}: no CONNACK")
    assert not seen["connack"][0].is_failure, seen["connack"][0]
    return client, seen


def test_mosquitto_runs_the_deploy_configuration_and_enforces_the_acl(
    broker: DeployedMosquitto,
) -> None:
    assert mqtt_connack(broker.host, broker.port) == ReasonCode(
        mqtt.PacketTypes.CONNACK, "Not authorized"
    )
    clients = []
    try:
        sub, sub_seen = _client(broker, "rsnotify-subscriber", "t-sub")
        pub, pub_seen = _client(broker, "rsnotify-publisher", "t-pub")
        clients += [sub, pub]
        # max_inflight_messages is what the broker announces as Receive Maximum.
        assert sub_seen["connack"][1].ReceiveMaximum == 100

        sub.subscribe("resourcesync/+/changes", qos=1)
        wait_for(lambda: sub_seen["suback"], message="no SUBACK")
        assert [r.value for r in sub_seen["suback"]] == [1]  # granted QoS 1
        info = pub.publish("resourcesync/c1/changes", b'{"seq":1}', qos=1)
        wait_for(lambda: info.mid in pub_seen["puback"], message="no PUBACK")
        wait_for(lambda: sub_seen["messages"], message="the subscriber got nothing")
        assert sub_seen["messages"] == [("resourcesync/c1/changes", b'{"seq":1}')]

        # Destinations cannot publish.
        forged = sub.publish("resourcesync/c1/changes", b'{"seq":2}', qos=1)
        wait_for(lambda: forged.mid in sub_seen["puback"], message="no PUBACK for forgery")
        assert sub_seen["puback"][forged.mid].getName() == "Not authorized"

        # The publisher cannot read: Mosquitto grants the subscription but
        # delivers nothing.  Its PUBACK for a later message is written after
        # any delivery of the earlier one, so once it arrives nothing is pending.
        pub.subscribe("resourcesync/#", qos=1)
        wait_for(lambda: pub_seen["suback"], message="no SUBACK")
        second = pub.publish("resourcesync/c2/changes", b'{"seq":3}', qos=1)
        wait_for(lambda: len(sub_seen["messages"]) == 2, message="no second message")
        third = pub.publish("resourcesync/c2/head", b"{}", qos=1)
        wait_for(lambda: third.mid in pub_seen["puback"], message="no PUBACK")
        assert pub_seen["puback"][second.mid].getName() == "Success"
        assert sub_seen["messages"][1] == ("resourcesync/c2/changes", b'{"seq":3}')
        assert pub_seen["messages"] == []
    finally:
        for client in clients:
            client.disconnect()
            client.loop_stop()


def test_the_deployed_broker_binds_client_ids_to_accounts(broker: DeployedMosquitto) -> None:
    """Issue 22: another account connecting with the publisher's client id cannot push it off.

    MQTT drops the older of two connections with one client id; with
    ``use_username_as_clientid`` the broker uses each account's name instead
    of the id the client sent, so ids of different accounts never meet.
    """
    assert _options(DEPLOY / "mosquitto.conf")["use_username_as_clientid"] == ["true"]
    taken = "rsnotify-0123456789ab"  # what a publisher's id looks like
    pub, pub_seen = _client(broker, "rsnotify-publisher", taken)
    dropped: list[Any] = []
    pub.on_disconnect = lambda *args: dropped.append(args)
    clients = [pub]
    try:
        intruder, _ = _client(broker, "rsnotify-subscriber", taken)
        clients.append(intruder)
        # A PUBACK for a message sent after the intruder's CONNACK: the publisher's
        # connection was never dropped (a dropped one would have reconnected first).
        info = pub.publish("resourcesync/c1/head", b"{}", qos=1, retain=True)
        wait_for(lambda: info.mid in pub_seen["puback"], message="no PUBACK")
        assert not pub_seen["puback"][info.mid].is_failure
        assert dropped == [], "the publisher was pushed off by another account"
    finally:
        for client in clients:
            client.disconnect()
            client.loop_stop()


def test_mosquitto_configuration_keeps_deep_queues() -> None:
    options = _options(DEPLOY / "mosquitto.conf")
    assert int(options["max_queued_messages"][0]) >= 10_000  # the default 1,000 drops silently
    assert options["persistence"] == ["true"] and options["allow_anonymous"] == ["false"]


# --- redis.conf in the real redis-server ---------------------------------------------


class DeployedRedis(Redis):
    """deploy/redis.conf itself, then this test's port, address and directory."""

    def __init__(self, directory: Path, maxmemory: str) -> None:
        super().__init__(directory)
        self.maxmemory = maxmemory

    def config_text(self) -> str:
        overrides = [
            f"port {self.port}",
            f"bind {self.host}",
            f'dir "{self.directory}"',
            "daemonize no",
            'logfile ""',
            f"maxmemory {self.maxmemory}",
        ]
        return (DEPLOY / "redis.conf").read_text() + "\n" + "\n".join(overrides) + "\n"


def test_redis_runs_the_deploy_configuration_and_never_evicts_the_log(tmp_path: Path) -> None:
    server = DeployedRedis(tmp_path / "redis", maxmemory="4mb").start()
    client: redis_sync.Redis | None = None
    try:
        client = server.client()
        settings = {
            k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
            for k, v in client.config_get("*").items()
        }
        assert settings["appendonly"] == "yes"
        assert settings["appendfsync"] == "everysec"
        assert settings["maxmemory-policy"] == "noeviction"
        head, refused = asyncio.run(_fill_log(server.url))
        # Full: the append was refused whole, and nothing written before was evicted.
        assert "maxmemory" in refused
        assert head > 1000
        assert client.xlen("rsn:{c1}:log") == head
        assert int(client.xrange("rsn:{c1}:log", count=1)[0][0].split(b"-")[0]) == 1
        assert int(client.hget("rsn:{c1}:meta", "head")) == head
    finally:
        if client is not None:
            client.close()
        server.stop()


async def _fill_log(url: str) -> tuple[int, str]:
    """Append 600-byte notifications through rsnotify's log until Redis refuses."""
    log = RedisLog(url)
    head = 0
    try:
        for _ in range(10_000):
            try:
                head = await log.append(
                    "c1", [b"x" * 600] * 50, expected_head=head, checkpoint=f"cp{head}"
                )
            except (LogUnavailable, redis_sync.exceptions.ResponseError) as exc:
                return head, str(exc)
        raise AssertionError("Redis accepted everything: maxmemory is not enforced")
    finally:
        await log.close()
