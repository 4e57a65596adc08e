"""The configuration layer: TOML file + RSNOTIFY_* variables beneath the flags.

Parse only: each test builds the real subcommand parser through
:func:`rsnotify.cli.parse_command` and looks at the resulting Namespace; no
service starts.  ``environ`` is passed explicitly, so the test process's own
environment never leaks in.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rsnotify import cli, config, options
from rsnotify.commands import config as config_command
from rsnotify.log import Retention

BASE = "https://source.example.org/"


def write(tmp_path: Path, text: str, name: str = "rsnotify.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def parse(name: str, argv: list[str], env: dict[str, str] | None = None) -> argparse.Namespace:
    return cli.parse_command(name, argv, environ=env or {})[1]


def problems(name: str, argv: list[str], env: dict[str, str] | None = None) -> str:
    with pytest.raises(config.ConfigError) as caught:
        parse(name, argv, env)
    return str(caught.value)


# --- precedence ----------------------------------------------------------------------


def test_flag_beats_env_beats_file_beats_default(tmp_path: Path) -> None:
    path = write(tmp_path, '[publish]\npoll = 0.5\nheartbeat = 2\nmqtt = "mqtt://file:1883"\n')
    argv = [BASE, "--config", str(path)]
    env = {"RSNOTIFY_PUBLISH_HEARTBEAT": "3", "RSNOTIFY_PUBLISH_MQTT": "mqtt://env:1883"}

    args = parse("publish", argv, env)
    assert args.poll == 0.5  # file over default (1.0)
    assert args.heartbeat == 3.0  # env over file
    assert args.mqtt == "mqtt://env:1883"
    assert args.topic_prefix == "resourcesync"  # untouched default

    args = parse("publish", [*argv, "--heartbeat", "4", "--poll", "0.25"], env)
    assert (args.heartbeat, args.poll) == (4.0, 0.25)  # flags over everything
    assert args.mqtt == "mqtt://env:1883"


def test_section_beats_common_and_specific_variable_beats_common_variable(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        """
[common]
log-level = "debug"
metrics-host = "0.0.0.0"
poll = 2.5   # publish has it; subscribe ignores it

[publish]
log-level = "warning"
""",
    )
    publish = parse("publish", [BASE, "--config", str(path)])
    assert (publish.log_level, publish.metrics_host) == ("warning", "0.0.0.0")
    assert publish.poll == 2.5

    subscribe = parse("subscribe", [BASE, "--into", "m", "--config", str(path)])
    assert (subscribe.log_level, subscribe.metrics_host) == ("debug", "0.0.0.0")
    assert not hasattr(subscribe, "poll")

    env = {"RSNOTIFY_COMMON_LOG_LEVEL": "error", "RSNOTIFY_COMMON_METRICS_HOST": "::1"}
    publish = parse("publish", [BASE, "--config", str(path)], env)
    assert publish.log_level == "error"  # any variable beats the file
    assert publish.metrics_host == "::1"
    env["RSNOTIFY_PUBLISH_LOG_LEVEL"] = "critical"
    assert parse("publish", [BASE, "--config", str(path)], env).log_level == "critical"


def test_rsnotify_config_names_the_file_and_the_flag_overrides_it(tmp_path: Path) -> None:
    one = write(tmp_path, "[publish]\npoll = 3\n", "one.toml")
    two = write(tmp_path, "[publish]\npoll = 4\n", "two.toml")
    env = {"RSNOTIFY_CONFIG": str(one)}
    assert parse("publish", [BASE], env).poll == 3.0
    assert parse("publish", [BASE, "--config", str(two)], env).poll == 4.0
    assert parse("publish", [BASE, f"--config={two}"], env).poll == 4.0
    assert parse("publish", [BASE]).poll == 1.0  # no file at all


def test_keys_take_dashes_or_underscores_and_values_go_through_the_option_type(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        """
[publish]
state_dir = "/var/lib/rsnotify"
retain = "50000,3d"
metrics-port = 9101

[simulate]
port = 8080
dir = "/srv/source"
rate = 0
spec-version = "1.0"
""",
    )
    publish = parse("publish", [BASE, "--config", str(path)])
    assert publish.state_dir == "/var/lib/rsnotify"
    assert publish.retain == Retention(max_len=50000, max_age_s=3 * 86400.0)
    assert publish.metrics_port == 9101
    simulate = parse("simulate", ["--config", str(path)])
    assert (simulate.port, simulate.rate, simulate.spec_version) == (8080, 0.0, "1.0")
    assert simulate.dir == Path("/srv/source")


# --- repeatable options and flags ------------------------------------------------------


def test_repeatable_options_take_arrays_and_a_flag_replaces_them(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[subscribe]\ncollection = ["c1", "c2"]\nallow-origin = "https://mirror.example/"\n',
    )
    argv = [BASE, "--into", "m", "--config", str(path)]
    args = parse("subscribe", argv)
    assert args.collection == ["c1", "c2"]
    assert args.allow_origin == ["https://mirror.example/"]  # a single value is a list of one

    args = parse("subscribe", [*argv, "--collection", "c9", "--collection", "c8"])
    assert args.collection == ["c9", "c8"]  # replaced, not appended to the file's list

    env = {"RSNOTIFY_SUBSCRIBE_COLLECTION": '["e1", "e2"]'}
    assert parse("subscribe", argv, env).collection == ["e1", "e2"]
    env = {"RSNOTIFY_SUBSCRIBE_COLLECTION": "https://x.example/capabilitylist.xml"}
    assert parse("subscribe", argv, env).collection == ["https://x.example/capabilitylist.xml"]
    assert parse("subscribe", [BASE, "--into", "m"]).collection == []  # default intact


def test_flags_from_file_and_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "[publish]\nwatch = true\nfrom-beginning = false\n")
    argv = [BASE, "--config", str(path)]
    args = parse("publish", argv)
    assert (args.watch, args.from_beginning) == (True, False)
    assert parse("publish", argv, {"RSNOTIFY_PUBLISH_WATCH": "off"}).watch is False
    assert parse("publish", argv, {"RSNOTIFY_PUBLISH_FROM_BEGINNING": "yes"}).from_beginning
    assert parse("publish", [*argv, "--from-beginning"]).from_beginning is True


DEMO = options.Options(
    options.count("-v", "--verbose"),
    options.flag("--no-cache", dest_name="cache", negative=True),
    options.flag("--color", toggle=True, default=True),
    options.repeated("--pair", nargs=2, type=int),
    options.positional("names", nargs="+"),
)


def test_generic_option_kinds() -> None:
    """Kinds the real commands do not use yet: count, store_false, --x/--no-x, nargs."""
    env = {
        "RSNOTIFY_DEMO_VERBOSE": "2",
        "RSNOTIFY_DEMO_NO_CACHE": "true",
        "RSNOTIFY_DEMO_COLOR": "no",
        "RSNOTIFY_DEMO_PAIR": "[1, 2]",
        "RSNOTIFY_DEMO_NAMES": '["a", "b"]',
    }

    def demo(argv: list[str], env: dict[str, str]) -> argparse.Namespace:
        parser = argparse.ArgumentParser(prog="rsnotify demo")
        return config.parse_args(DEMO, parser, "demo", argv, environ=env)

    args = demo([], env)
    assert (args.verbose, args.cache, args.color, args.pair) == (2, False, False, [1, 2])
    assert args.names == ["a", "b"]
    settings = config.resolve("demo", DEMO, None, {"RSNOTIFY_DEMO_NO_CACHE": "yes"}, sections=[])
    shown = config.show(DEMO, settings, {})
    assert "no-cache = true  # RSNOTIFY_DEMO_NO_CACHE" in shown  # the flag, not its dest
    assert "color = true  # default" in shown and "verbose = 0  # default" in shown
    with pytest.raises(config.ConfigError, match="expected 2 values, got 1"):
        demo(["x"], {"RSNOTIFY_DEMO_PAIR": "[1]"})
    # The same declaration again, configured differently: nothing of the first run sticks.
    args = demo(["y"], {})
    assert (args.verbose, args.cache, args.color, args.pair, args.names) == (
        0,
        True,
        True,
        None,
        ["y"],
    )
    assert demo(["y", "-vv", "--no-color", "--pair", "3", "4"], env).pair == [3, 4]
    with pytest.raises(SystemExit):
        demo([], {})  # NAMES is required again


# --- positionals and required options ------------------------------------------------


def test_required_positional_and_required_option_can_come_from_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, f'[subscribe]\nsource = "{BASE}"\ninto = "/srv/mirror"\n')
    args = parse("subscribe", ["--config", str(path)])
    assert (args.source, args.into) == (BASE, "/srv/mirror")

    args = parse("subscribe", ["https://other.example/", "--into", "m", "--config", str(path)])
    assert (args.source, args.into) == ("https://other.example/", "m")  # flags win


def test_required_arguments_are_still_required_without_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, '[subscribe]\ninto = "/srv/mirror"\n')
    with pytest.raises(SystemExit) as exited:
        parse("subscribe", ["--config", str(path)])
    assert exited.value.code == 2
    assert "SOURCE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("subscribe", [BASE])
    assert "--into" in capsys.readouterr().err


def test_every_option_of_every_subcommand_is_configurable() -> None:
    """Every flag in a command's usage line has a config key (``--help`` aside)."""
    declared = cli.configurable()
    assert set(declared) == {n for n, _, _ in cli.COMMANDS} - {"config"}
    for name, command_options in declared.items():
        opts = config.options(command_options)
        parser = argparse.ArgumentParser(prog=f"rsnotify {name}")
        options.add_arguments(command_options, parser, environ={})
        offered = set(re.findall(r"(?<![\w-])--([a-z][a-z0-9-]*)", parser.format_usage()))
        offered.discard("help")
        for opt in command_options:
            offered.add(opt.key)
            if opt.toggle:  # --x and --no-x: one key, ``x = true|false``
                offered.discard(f"no-{opt.key}")
            assert opts[opt.key] is opt, f"rsnotify {name}: {opt.key}"
        assert offered <= set(opts), f"rsnotify {name}: {offered - set(opts)} not configurable"


CONFIG_OBJECTS = [
    ("publish", "rsnotify.publisher.service", "PublisherConfig"),
    ("subscribe", "rsnotify.subscriber.service", "SubscriberConfig"),
    ("dashboard", "rsnotify.dashboard.server", "DashboardConfig"),
    ("simulate", "rsnotify.simulator.server", "SimulatorConfig"),
]


@pytest.mark.parametrize(("name", "module", "cls"), CONFIG_OBJECTS)
def test_each_option_fills_a_field_of_the_config_object_with_the_same_default(
    name: str, module: str, cls: str
) -> None:
    """The config classes keep defaults for code that builds them directly: the same ones."""
    config_class = getattr(importlib.import_module(module), cls)
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    for opt in cli.command_module(name).OPTIONS:
        if opt.field_name is None:
            continue
        assert opt.field_name in fields, f"rsnotify {name}: {opt.key} -> {opt.field_name}?"
        spec = fields[opt.field_name]
        if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            continue  # a required field
        default = spec.default if spec.default_factory is dataclasses.MISSING else None
        if spec.default_factory is not dataclasses.MISSING:
            default = spec.default_factory()
        declared = opt.default
        if isinstance(declared, str) and opt.type is not None:
            declared = opt.type(declared)  # as argparse converts a string default
        if opt.to_field is not None:
            declared = opt.to_field(declared)
        if isinstance(declared, list):
            declared = tuple(declared)
        assert declared == default, f"rsnotify {name}: {opt.key}: {declared!r} != {default!r}"


# --- errors ------------------------------------------------------------------------


def test_unknown_key_suggests_the_real_one_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, '# comment\n[publish]\nmqtt = "mqtt://b:1883"\npol = 0.5\n')
    message = problems("publish", [BASE, "--config", str(path)])
    assert message == f"{path}:4: [publish] pol: unknown option; did you mean 'poll'?"


def test_lines_come_from_the_toml_syntax_tree_not_from_the_look_of_a_line(
    tmp_path: Path,
) -> None:
    """Quoted and dotted keys, multi-line values, and text that only looks like TOML."""
    path = write(
        tmp_path,
        """[subscribe]
on-change = '''
[publish]
collection = 1
'''
"concurrency" = 0
allow-origin = [
  "https://mirror.example/",
  7,
]
  metrics-port = "x"
""",
    )
    lines = problems("subscribe", [BASE, "--into", "m", "--config", str(path)]).splitlines()
    assert lines == [
        f"{path}:6: [subscribe] concurrency: must be >= 1, got 0",
        f"{path}:7: [subscribe] allow-origin: item 2: expected a string, got a number (7) "
        "(quote it)",
        f"{path}:11: [subscribe] metrics-port: not an integer: 'x'",
    ]
    path = write(tmp_path, "publish.poll = 0\n", "dotted.toml")
    assert problems("publish", [BASE, "--config", str(path)]) == (
        f"{path}:1: [publish] poll: must be a number > 0, got 0"
    )


def test_wrong_type_bad_choice_and_type_function_errors(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """[publish]
heartbeat = true
format = "yaml"
retain = "7x"
poll = "fast"
mqtt = 1883
collection = ["a", 3]
watch = "yes"
""",
    )
    lines = problems("publish", [BASE, "--config", str(path)]).splitlines()
    assert lines == [
        f"{path}:2: [publish] heartbeat: expected a number, got a boolean (true)",
        f"{path}:3: [publish] format: invalid choice: 'yaml' (choose from 'json', 'xml')",
        f"{path}:4: [publish] retain: bad retention '7x': use N, Ns/m/h/d, or both",
        f"{path}:5: [publish] poll: not a number: 'fast'",
        f"{path}:6: [publish] mqtt: expected a string, got a number (1883) (quote it)",
        f"{path}:7: [publish] collection: item 2: expected a string, got a number (3) (quote it)",
        f"{path}:8: [publish] watch: expected true or false, got a string ('yes')",
    ]


def test_unknown_section_stray_key_and_syntax_errors(tmp_path: Path) -> None:
    path = write(tmp_path, 'poll = 1\n[subscibe]\ninto = "m"\n')
    lines = problems("publish", [BASE, "--config", str(path)]).splitlines()
    assert lines[0].startswith(f"{path}:1: 'poll' is outside any section")
    assert lines[1].startswith(f"{path}:2: unknown section [subscibe]; did you mean 'subscribe'?")

    path = write(tmp_path, "[publish]\npoll = \n", "broken.toml")
    message = problems("publish", [BASE, "--config", str(path)])
    assert message.startswith(f"{path}: invalid TOML: ") and "line 2" in message

    message = problems("publish", [BASE, "--config", str(tmp_path / "missing.toml")])
    assert message == f"{tmp_path / 'missing.toml'}: cannot read: No such file or directory"


def test_environment_errors_name_the_variable() -> None:
    env = {"RSNOTIFY_PUBLISH_POLLL": "1", "RSNOTIFY_PUBLISH_WATCH": "maybe"}
    lines = problems("publish", [BASE], env).splitlines()
    assert lines == [
        "RSNOTIFY_PUBLISH_POLLL: no option 'POLLL' in rsnotify publish; "
        "did you mean 'RSNOTIFY_PUBLISH_POLL'?",
        "RSNOTIFY_PUBLISH_WATCH: expected 1/0, true/false, yes/no or on/off, got 'maybe'",
    ]
    # Another subcommand's variables, unknown COMMON ones and hook variables are not ours.
    env = {
        "RSNOTIFY_SUBSCRIBE_INTO": "m",
        "RSNOTIFY_COMMON_INTO": "m",
        "RSNOTIFY_LOC": "https://x/",
        "RSNOTIFY_CHANGE": "created",
    }
    assert parse("publish", [BASE], env).source == BASE


def test_main_reports_configuration_errors_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "[publish]\nformat = 'yaml'\n")
    assert cli.main(["publish", BASE, "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rsnotify publish: configuration error:\n")
    assert "format: invalid choice: 'yaml'" in err


# --- rsnotify config check / show -------------------------------------------------------


GOOD = f"""
[common]
log-level = "info"
metrics-host = "127.0.0.1"

[publish]
source = "{BASE}"
redis = "redis://127.0.0.1:6379/0"
retain = "100000,7d"
secret = "s3cret"

[subscribe]
source = "{BASE}"
into = "/srv/mirror"
secret = ["k1=old", "k2=new"]
ws-token = "t0ken"

[simulate]
rate = 5
"""


def test_config_check_accepts_a_good_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, GOOD)
    assert cli.main(["config", "check", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: OK ([common], [publish], [subscribe], [simulate])\n"


def test_config_check_reports_every_section_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        """[common]
log-levle = "info"
metrics-port = "abc"

[subscribe]
concurency = 4

[simulate]
port = -1

[audit]
into = "/srv/mirror"
""",
    )
    assert cli.main(["config", "check", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        f"{path}:2: [common] log-levle: no subcommand has this option; did you mean 'log-level'?",
        f"{path}:3: [common] metrics-port: not an integer: 'abc' (for rsnotify publish)",
        f"{path}:3: [common] metrics-port: not an integer: 'abc' (for rsnotify subscribe)",
        f"{path}:6: [subscribe] concurency: unknown option; did you mean 'concurrency'?",
        f"{path}:9: [simulate] port: a port is 0..65535, got -1",
    ]
    assert "5 problem(s)" in captured.err


def test_config_check_environment_and_unreadable_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, GOOD)
    env = {"RSNOTIFY_SIMULATE_PORT": "x", "RSNOTIFY_COMMON_NOPE": "1", "RSNOTIFY_LOC": "u"}
    found = config_command.check(path, env)
    assert [str(p) for p in found] == [
        "RSNOTIFY_COMMON_NOPE: no subcommand has this option",
        "RSNOTIFY_SIMULATE_PORT: not an integer: 'x'",
    ]
    assert cli.main(["config", "check", str(tmp_path / "none.toml")]) == 1
    assert "none.toml: cannot read" in capsys.readouterr().out
    monkeypatch.delenv("RSNOTIFY_CONFIG", raising=False)
    assert cli.main(["config", "check"]) == 2


def test_config_show_prints_valid_toml_with_origins_and_no_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("RSNOTIFY_SECRET", "RSNOTIFY_WS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    path = write(tmp_path, GOOD.replace("127.0.0.1:6379", "admin:hunter2@127.0.0.1:6379"))
    monkeypatch.setenv("RSNOTIFY_PUBLISH_POLL", "0.25")
    assert cli.main(["config", "show", "publish", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "hunter2" not in out and "s3cret" not in out
    assert 'secret = "<redacted>"' in out
    assert 'redis = "redis://admin:<redacted>@127.0.0.1:6379/0"' in out
    assert "poll = 0.25  # RSNOTIFY_PUBLISH_POLL" in out
    assert f'source = "{BASE}"  # {path}:7 [publish]' in out
    assert 'secret-id = "k1"  # default' in out
    # The output is itself a configuration that rsnotify accepts.
    shown = write(tmp_path, out, "shown.toml")
    tomllib.loads(out)
    assert config_command.check(shown) == []


def test_the_console_command_reads_the_file(tmp_path: Path) -> None:
    """End to end through a real process: ``python -m rsnotify.cli``."""
    path = write(tmp_path, "[inspect]\nlocation = 'nowhere.xml'\nmax-bytes = 'lots'\n")
    done = subprocess.run(
        [sys.executable, "-m", "rsnotify.cli", "inspect", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert f"{path}:3: [inspect] max-bytes: invalid int value: 'lots'" in done.stderr
