"""Issue 16 item 4: ``rsnotify publish`` hands its notifications to a hub it does not run.

The hub is PyPI's flask-websub (``tests/websub_flask_hub.py``): its Flask app
and its Celery worker (``--pool solo``) run as processes of their own, with
the test's own Redis as Celery's broker, all on loopback.  flask-websub takes
the widespread publish ping and then fetches the topic, so ``rsnotify
publish --websub-hub URL --websub-hub-mode ping`` serves each notification
at the topic until the hub has fetched it (see
:mod:`rsnotify.transport.websubpush`).  An independent subscriber written
here registers at flask-websub, verifies the sha512 signatures it sends and
reads the Change Notifications with lxml.  In the middle of the run both hub
processes are stopped for 10 s; the subscriber still gets every change made
after it subscribed, once, in order, the intervals chained.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from lxml import etree

from rsnotify import w3cdt
from tests.devstack import ManagedProcess, Redis, async_wait_for, free_port
from tests.helpers import serve
from tests.test_websub import (
    RS,
    SM,
    change_list_entries,
    http_json,
    start_publisher,
    start_simulator,
)

pytest.importorskip("flask_websub", reason="flask-websub is a test dependency (pyproject [test])")

RunRsnotify = Callable[..., ManagedProcess]
CHANGES = 600
DOWN_S = 10.0
SECRET = "flask-secret"


class FlaskSubscriber:
    """A callback for flask-websub: echoes challenges, checks sha512, reads with lxml."""

    def __init__(self) -> None:
        self.port = free_port()
        self.verified: list[dict[str, str]] = []
        self.notices: list[tuple[Any, Any, list[tuple[str, str, Any]]]] = []
        self.problems: list[str] = []
        self.runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/flask-cb"

    async def start(self) -> None:
        routes = [web.get("/flask-cb", self._get), web.post("/flask-cb", self._post)]
        self.runner = await serve(self.port, routes)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _get(self, request: web.Request) -> web.Response:
        self.verified.append(dict(request.query))
        return web.Response(text=request.query.get("hub.challenge", ""))

    async def _post(self, request: web.Request) -> web.Response:
        body = await request.read()
        method, _, digest = request.headers.get("X-Hub-Signature", "").partition("=")
        expected = hmac.new(SECRET.encode(), body, getattr(hashlib, method or "sha512"))
        if method not in ("sha256", "sha512") or not hmac.compare_digest(
            expected.hexdigest(), digest
        ):
            self.problems.append(f"signature {request.headers.get('X-Hub-Signature')!r}")
            return web.Response(status=204)
        if not body.strip():
            return web.Response(status=204)  # a topic without content: nothing to read
        root = etree.fromstring(body, etree.XMLParser(resolve_entities=False, no_network=True))
        md = root.find(RS + "md")
        if md is None or md.get("capability") != "change-notification":
            self.problems.append("not a change-notification")
            return web.Response(status=204)
        changes = []
        for url in root.findall(SM + "url"):
            umd = url.find(RS + "md")
            when = w3cdt.parse(umd.get("datetime") or url.findtext(SM + "lastmod"))
            changes.append((url.findtext(SM + "loc"), umd.get("change"), when))
        self.notices.append((w3cdt.parse(md.get("from")), w3cdt.parse(md.get("until")), changes))
        return web.Response(status=204)

    def changes(self) -> list[tuple[str, str, Any]]:
        seen: set[tuple[str, str, Any]] = set()
        out = []
        for _, _, changes in self.notices:
            for change in changes:
                if change not in seen:
                    seen.add(change)
                    out.append(change)
        return out


def _subscribe(hub: str, topic: str, callback: str) -> int:
    form = urllib.parse.urlencode(
        {
            "hub.mode": "subscribe",
            "hub.topic": topic,
            "hub.callback": callback,
            "hub.secret": SECRET,
            "hub.lease_seconds": "600",
        }
    ).encode()
    request = urllib.request.Request(hub, data=form, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        status: int = response.status
        return status


@pytest.mark.timeout(180)
async def test_flask_websub_relays_every_change_through_a_10_s_hub_outage(
    rsnotify_process: RunRsnotify,
    process_factory: Callable[..., ManagedProcess],
    redis_server: Redis,
    tmp_path: Path,
) -> None:
    root = Path(__file__).resolve().parent.parent
    hub_port = free_port()
    env = {
        "HUB_BROKER": redis_server.url,
        "HUB_DB": str(tmp_path / "flask-hub.db"),
        "HUB_PORT": str(hub_port),
        "PYTHONPATH": str(root),
    }
    web_app = process_factory(
        [sys.executable, "-m", "tests.websub_flask_hub"], name="flask-hub", env=env, cwd=root
    )
    worker = process_factory(
        [sys.executable, "-m", "celery", "-A", "tests.websub_flask_hub:celery", "worker",
         "--pool", "solo", "--loglevel", "info", "--without-gossip", "--without-mingle",
         "--without-heartbeat"],
        name="flask-worker", env=env, cwd=root,
    )  # fmt: skip

    def hub_ready() -> bool:
        return "ready" in worker.output("stderr") + worker.output("stdout") and _up(flask_hub)

    flask_hub = f"http://127.0.0.1:{hub_port}/hub"
    await async_wait_for(lambda: asyncio.to_thread(hub_ready), 60, interval=0.2)

    source = await start_simulator(
        rsnotify_process, "--collections", "1", "--rate", "60", "--max-changes", str(CHANGES)
    )
    ours = free_port()
    publisher = rsnotify_process(
        "publish", source, "--redis", redis_server.url, "--poll", "0.05",
        "--websub", f"127.0.0.1:{ours}", "--websub-hub", flask_hub,
        "--websub-hub-mode", "ping", "--websub-retry-max", "1",
        name="publish", start=False,
    )  # fmt: skip
    ((collection, capability_list),) = (await start_publisher(publisher)).items()
    topic = f"http://127.0.0.1:{ours}/{collection}"
    sub = FlaskSubscriber()

    async def made() -> int:
        stats = await asyncio.to_thread(http_json, source + "_simulator/stats")
        changes: int = stats["changes"]
        return changes

    async def made_at_least(n: int) -> bool:
        return await made() >= n

    await sub.start()
    try:
        assert await asyncio.to_thread(_subscribe, flask_hub, topic, sub.url) == 202
        await async_wait_for(lambda: sub.verified, 30, message="flask-websub never verified")
        # A third of the changes through the hub, then the generator paused, so
        # that the rest (not however many a loaded machine left) are made
        # while the hub is down.
        await asyncio.to_thread(http_json, source + "_simulator/resume", b"")
        await async_wait_for(lambda: made_at_least(CHANGES // 3), 60, interval=0.05)
        await asyncio.to_thread(http_json, source + "_simulator/pause", b"")
        paused_at = await made()
        await async_wait_for(lambda: len(sub.changes()) >= paused_at, 60, interval=0.1)
        # Both hub processes down for 10 s (the worker finishes the task it holds).
        worker.terminate()
        web_app.terminate()
        down_at = await made()
        await asyncio.to_thread(http_json, source + "_simulator/resume", b"")
        await asyncio.sleep(DOWN_S)  # scenario duration: the hub is unreachable
        await async_wait_for(lambda: made_at_least(down_at + 101), 60, interval=0.1)
        up_at = await made()
        web_app.start()
        worker.start()
        await async_wait_for(
            lambda: len(sub.changes()) >= CHANGES or None,
            90,
            interval=0.2,
            message=lambda: f"{len(sub.changes())} of {CHANGES}\n{publisher.tail()}",
        )
    finally:
        await sub.stop()
    assert up_at - down_at > 100, "changes were made while the hub was down"
    assert not sub.problems, sub.problems[:5]
    entries = await asyncio.to_thread(change_list_entries, capability_list)
    expected = [(e.loc, e.change.value, e.change_time) for e in entries if e.change]
    assert sub.changes() == expected, "not every change once, in order"
    holes = [
        (a[1], b[0]) for a, b in zip(sub.notices, sub.notices[1:], strict=False) if b[0] > a[1]
    ]
    assert not holes, f"the interval chain has holes: {holes[:3]}"
    print(f"\nflask-websub: {len(sub.notices)} notifications for {CHANGES} changes")


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # it answers (GET on the hub endpoint is 405)
    except OSError:
        return False
