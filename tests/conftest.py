"""Shared fixtures: real brokers and real rsnotify processes, one set per test.

Everything is function-scoped and lives under the test's ``tmp_path``, so tests
never share broker state (retained messages, queued sessions, streams) and a
failing test leaves its logs behind for inspection.  Teardown stops and reaps
every process a fixture started, whether the test passed or not.  Nothing here
is autouse: a pure unit test pays for none of it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.devstack import (
    ManagedProcess,
    Mosquitto,
    NatsServer,
    Redis,
    StrPath,
    rsnotify_command,
)


@pytest.fixture
def mosquitto_factory(tmp_path: Path) -> Iterator[Callable[..., Mosquitto]]:
    """``make(**options) -> Mosquitto``: brokers with custom config (see ``Mosquitto``).

    Pass ``start=False`` to get an unstarted broker.
    """
    brokers: list[Mosquitto] = []
    stack = ExitStack()  # stops every one, even if stopping another fails

    def make(*, start: bool = True, **options: Any) -> Mosquitto:
        broker = Mosquitto(tmp_path / f"mosquitto-{len(brokers)}", **options)
        brokers.append(broker)
        stack.callback(broker.stop)
        return broker.start() if start else broker

    with stack:
        yield make


@pytest.fixture
def nats_factory(tmp_path: Path) -> Iterator[Callable[..., NatsServer]]:
    """``make(start=True, **options) -> NatsServer``: NATS brokers (MQTT 3.1.1 over JetStream).

    Each in its own directory (with its own JetStream store) on free ports;
    all stopped at teardown, even if stopping one fails.
    """
    with ExitStack() as stack:
        count = itertools.count()

        def make(*, start: bool = True, **options: Any) -> NatsServer:
            broker = NatsServer(tmp_path / f"nats-{next(count)}", **options)
            stack.callback(broker.stop)
            return broker.start() if start else broker

        yield make


@pytest.fixture
def nats(nats_factory: Callable[..., NatsServer]) -> NatsServer:
    """A running NATS broker with its MQTT listener, the second broker of the tests."""
    return nats_factory()


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[Callable[..., Redis]]:
    """``make(**options) -> Redis``: Redis servers with custom config (see ``Redis``)."""
    servers: list[Redis] = []
    stack = ExitStack()

    def make(*, start: bool = True, **options: Any) -> Redis:
        server = Redis(tmp_path / f"redis-{len(servers)}", **options)
        servers.append(server)
        stack.callback(server.stop)
        return server.start() if start else server

    with stack:
        yield make


@pytest.fixture
def mosquitto(mosquitto_factory: Callable[..., Mosquitto]) -> Mosquitto:
    """A running broker (anonymous, no persistence) with deploy/mosquitto.conf's limits.

    Mosquitto's default of 1,000 queued QoS 1 messages per client drops bursts
    silently on a loaded machine; tests about that use ``mosquitto_factory``.
    """
    return mosquitto_factory(max_queued_messages=100_000, max_inflight_messages=100)


@pytest.fixture
def redis_server(redis_factory: Callable[..., Redis]) -> Redis:
    """A running Redis with AOF on (``appendfsync everysec``)."""
    return redis_factory()


@pytest.fixture
def process_factory(tmp_path: Path) -> Iterator[Callable[..., ManagedProcess]]:
    """``make(argv, *, name=None, env=None, cwd=None, start=True) -> ManagedProcess``."""
    processes: list[ManagedProcess] = []
    stack = ExitStack()

    def make(
        argv: Sequence[StrPath],
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: StrPath | None = None,
        start: bool = True,
    ) -> ManagedProcess:
        base = name or Path(str(argv[0])).name
        process = ManagedProcess(
            argv,
            workdir=tmp_path / "processes",
            name=f"{base}-{len(processes)}",
            env=env,
            cwd=cwd,
        )
        processes.append(process)
        stack.callback(process.terminate)
        return process.start() if start else process

    with stack:
        yield make


@pytest.fixture
def rsnotify_process(
    process_factory: Callable[..., ManagedProcess],
) -> Callable[..., ManagedProcess]:
    """``run(*args, name=None, env=None, cwd=None, start=True)``: ``rsnotify <args>`` as a child.

    Example: ``run("simulate", "--port", "0").wait_for_line(r"listening on (\\S+)")``.
    """

    def run(
        *args: StrPath,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: StrPath | None = None,
        start: bool = True,
    ) -> ManagedProcess:
        label = name or ("rsnotify-" + str(args[0]) if args else "rsnotify")
        return process_factory(rsnotify_command(*args), name=label, env=env, cwd=cwd, start=start)

    return run


@pytest.fixture
def parser_process() -> Iterator[None]:
    """The Change List parser's worker process, started afresh and ready; threads after.

    (``rsnotify.changes.listparse`` is process-wide: an in-process
    Subscriber of an earlier test may have started one.)
    """
    import time

    from rsnotify.changes import listparse

    listparse.configure(0)
    listparse.configure(1)
    deadline = time.monotonic() + 60
    while not listparse.ready():
        assert time.monotonic() < deadline, "the parser process did not start within 60 s"
        time.sleep(0.01)
    yield
    listparse.configure(0)
