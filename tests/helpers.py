"""Small pieces several integration test modules share."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from rsnotify.simulator.server import Simulator, SimulatorConfig
from rsnotify.subscriber.resources import ApplyRecord, ResourceStore
from rsnotify.subscriber.service import default_state_dir
from tests.devstack import ManagedProcess, wait_for
from tests.groundtruth import mirror_differences


@asynccontextmanager
async def running_simulator(**options: Any) -> AsyncIterator[tuple[Simulator, str]]:
    """An in-process ``rsnotify simulate``, quiet unless ``rate`` is given; yields it, its URL."""
    options.setdefault("rate", 0)
    sim = Simulator(SimulatorConfig(**options))
    url = await sim.start()
    try:
        yield sim, url
    finally:
        await sim.stop()


async def serve(
    port: int, routes: list[web.RouteDef], *, max_size: int = 4 * 1024 * 1024
) -> web.AppRunner:
    """An aiohttp app with ``routes`` on ``127.0.0.1:port`` (a test's callback, Source or hub).

    The caller owns the runner: ``await runner.cleanup()`` stops it.
    """
    app = web.Application(client_max_size=max_size)
    app.add_routes(routes)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def post_json(url: str, body: Any = None) -> Any:
    """POST (a JSON ``body``, or nothing) and return the JSON answer."""
    data = b"" if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, method="POST", data=data)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def log_events(process: ManagedProcess) -> list[dict[str, Any]]:
    """Every JSON log line a process wrote, over all its runs (``--log-format json``)."""
    events = []
    for line in process.output("stderr", whole_history=True).splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by kill -9
    return events


def messages(process: ManagedProcess, needle: str) -> list[str]:
    return [e["message"] for e in log_events(process) if needle in e.get("message", "")]


def newer_never_overwritten(records: list[ApplyRecord]) -> list[str]:
    """Per loc, successful writes/deletes must come in non-decreasing change datetime."""
    last: dict[str, ApplyRecord] = {}
    problems = []
    for record in records:
        if record.outcome not in ("applied", "deleted"):
            continue
        previous = last.get(record.loc)
        if previous is not None and record.datetime < previous.datetime:
            problems.append(
                f"{record.loc}: {record.change} of {record.datetime} (apply log id {record.id}) "
                f"after {previous.change} of {previous.datetime} (id {previous.id})"
            )
        last[record.loc] = record
    return problems


async def read_apply_log(mirror: Path, state_dir: Path | None = None) -> list[ApplyRecord]:
    """A subscriber's apply log (state in ``state_dir``, default: beside the mirror)."""
    state = state_dir if state_dir is not None else default_state_dir(str(mirror))
    store = ResourceStore(Path(state) / "resources.sqlite3")
    try:
        return await store.apply_log()
    finally:
        await store.close()


def freeze_and_converge(
    source: str,
    mirror: Path,
    *,
    finish_timeout: float = 60,
    converge_timeout: float = 60,
    finished: bool = True,
) -> tuple[dict[str, Any], float]:
    """Wait for the simulator to finish, freeze it, wait for ``mirror`` to equal its state.

    Returns the frozen ``/_simulator/state`` and the seconds the mirror took
    to converge after the freeze.  ``finished=False``: freeze it now.
    """
    if finished:
        wait_for(
            lambda: get_json(f"{source}_simulator/stats")["finished"],
            timeout=finish_timeout,
            interval=0.2,
            message="the simulator did not finish its changes",
        )
    post_json(f"{source}_simulator/pause")
    state: dict[str, Any] = get_json(f"{source}_simulator/state")
    started = time.monotonic()
    last: list[str] = []

    def equal() -> bool:
        last[:] = mirror_differences(state, mirror)
        return not last

    wait_for(
        equal,
        timeout=converge_timeout,
        interval=0.5,
        message=lambda: f"the mirror did not converge: {len(last)} differences: {last[:5]}",
    )
    return state, time.monotonic() - started
