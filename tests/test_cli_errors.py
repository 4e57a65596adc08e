"""Issue 22, item 8: every operator mistake is one line, never a traceback or a silent loop.

The probe found tracebacks for ``--redis notaurl``, ``--concurrency 0``,
``--websub 127.0.0.1:99999``, ``--ws`` on a busy port and ``--ws-token ""``;
``--retain 0`` and ``--poll 0`` (5,673 requests to the Source in 6 s) were
accepted; ``publish /nonexistent/dir`` said "not an absolute http(s) URL" and
retried forever; a closed Redis port was retried forever without a word about
it.  Values are now checked while the arguments are parsed
(:mod:`rsnotify.argtypes`), before the command runs; what can only fail when
running (a busy port, Redis down) ends the command with one line and a stated
policy.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from rsnotify import cli
from tests.devstack import ManagedProcess, free_port
from tests.helpers import running_simulator

SOURCE = "https://source.example.org/"

# (command, arguments, what the one line must say)
MISTAKES = [
    ("publish", ["/nonexistent/dir"], "'/nonexistent/dir': no such directory"),
    ("publish", [SOURCE, "--redis", "notaurl"], "argument --redis: 'notaurl' is not a Redis URL"),
    ("publish", [SOURCE, "--websub", "127.0.0.1:99999"], "a port is 0..65535, got 99999"),
    ("publish", [SOURCE, "--ws", "127.0.0.1"], "argument --ws: '127.0.0.1' is not HOST:PORT"),
    ("publish", [SOURCE, "--ws", "127.0.0.1:0", "--ws-token", ""], "--ws-token: must not be empty"),
    ("publish", [SOURCE, "--retain", "0"], "argument --retain: bad retention '0': keep at least"),
    ("publish", [SOURCE, "--retain", "100,0s"], "argument --retain: bad retention"),
    ("publish", [SOURCE, "--poll", "0"], "argument --poll: must be a number > 0, got 0"),
    ("publish", [SOURCE, "--poll", "nan"], "argument --poll: must be a finite number"),
    ("publish", [SOURCE, "--heartbeat", "-1"], "argument --heartbeat: must be a number > 0"),
    ("publish", [SOURCE, "--metrics-port", "99999"], "a port is 0..65535, got 99999"),
    ("publish", [SOURCE, "--mqtt", "broker:1883"], "the scheme must be mqtt:// or mqtts://"),
    ("publish", [SOURCE, "--secret", ""], "argument --secret: must not be empty"),
    ("publish", [SOURCE, "--log-level", "bogus"], "'bogus' is not a log level"),
    ("subscribe", [SOURCE, "--into", "m", "--concurrency", "0"], "must be >= 1, got 0"),
    ("subscribe", [SOURCE, "--into", "m", "--parse-processes", "-1"], "must be >= 0, got -1"),
    ("subscribe", [SOURCE, "--into", "m", "--redis", "notaurl"], "is not a Redis URL"),
    ("subscribe", [SOURCE, "--into", "m", "--ws-token", ""], "--ws-token: must not be empty"),
    ("subscribe", [SOURCE, "--into", "m", "--secret", "k1="], "the secret after 'k1=' must not"),
    ("subscribe", [SOURCE, "--into", "m", "--via", "ftp://b/"], "a channel must be mqtt://"),
    ("subscribe", [SOURCE, "--into", "m", "--safety-poll", "0"], "must be a number > 0"),
    ("subscribe", ["source.example.org", "--into", "m"], "is not an absolute http(s) URL"),
    ("dashboard", ["--interval", "0"], "argument --interval: must be a number > 0"),
    ("simulate", ["--port", "70000"], "a port is 0..65535, got 70000"),
]


@pytest.mark.parametrize(("command", "argv", "said"), MISTAKES, ids=lambda v: str(v)[:40])
def test_operator_mistakes_are_refused_in_one_line_before_the_command_runs(
    command: str,
    argv: list[str],
    said: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("RSNOTIFY_CONFIG", "RSNOTIFY_SECRET", "RSNOTIFY_WS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    module = cli.command_module(command)

    def ran(args: object) -> int:
        raise AssertionError(f"rsnotify {command} accepted {argv} and ran")

    monkeypatch.setattr(module, "run", ran)
    assert cli.main([command, *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"rsnotify {command}: error: "), lines[0]
    assert said in lines[0], lines[0]
    assert lines[0].endswith(f"(see rsnotify {command} --help)")


def test_a_configuration_file_value_is_checked_by_the_same_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RSNOTIFY_CONFIG", raising=False)
    path = tmp_path / "rsnotify.toml"
    path.write_text('[publish]\npoll = 0\nredis = "notaurl"\n')
    assert cli.main(["publish", SOURCE, "--config", str(path)]) == 2
    assert capsys.readouterr().err.splitlines()[1:] == [
        f"{path}:2: [publish] poll: must be a number > 0, got 0",
        f"{path}:3: [publish] redis: 'notaurl' is not a Redis URL "
        "(the scheme must be redis://, rediss://, unix://, redis+sentinel://, redis+cluster://)",
    ]


def _assert_one_clean_error(process: ManagedProcess, said: str) -> None:
    output = process.output()
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if said in line]
    assert len(errors) == 1, output


async def test_a_busy_websocket_port_ends_the_publisher_with_one_line(
    tmp_path: Path, rsnotify_process: Callable[..., ManagedProcess]
) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        async with running_simulator() as (_sim, base):
            publisher = rsnotify_process(
                "publish", base, "--state-dir", tmp_path / "state", "--ws", f"127.0.0.1:{port}"
            )
            code = await asyncio.to_thread(publisher.wait, 30)
    finally:
        busy.close()
    assert code == 1
    _assert_one_clean_error(publisher, f"cannot listen on 127.0.0.1:{port} for WebSocket clients: ")


async def test_an_unusable_state_directory_ends_the_publisher_with_one_line(
    tmp_path: Path, rsnotify_process: Callable[..., ManagedProcess]
) -> None:
    occupied = tmp_path / "a-file"
    occupied.write_text("not a directory")
    async with running_simulator() as (_sim, base):
        publisher = rsnotify_process("publish", base, "--state-dir", occupied)
        code = await asyncio.to_thread(publisher.wait, 30)
    assert code == 1
    _assert_one_clean_error(publisher, f"cannot start: --state-dir {occupied}: ")


async def test_redis_down_at_start_up_is_retried_with_a_countdown_then_given_up(
    tmp_path: Path, rsnotify_process: Callable[..., ManagedProcess]
) -> None:
    """The stated policy: retry, saying when start-up gives up; then exit 1 (systemd restarts)."""
    closed = f"redis://127.0.0.1:{free_port()}/0"
    async with running_simulator() as (_sim, base):
        publisher = rsnotify_process(
            "publish", base, "--redis", closed, "--redis-wait", "1.5", "--log-format", "text"
        )
        code = await asyncio.to_thread(publisher.wait, 30)
    assert code == 1
    output = publisher.output()
    assert "start-up gives up in" in output, output
    _assert_one_clean_error(publisher, "(gave up after --redis-wait 1.5 s)")
