"""Issue 22, item 5: the dashboard answers only its own names, and /ws only its own page.

Finding: ``/ws`` accepted any ``Origin`` (a page the operator visits could
read the whole snapshot) and every route any ``Host`` (DNS rebinding).
Rules and reasons: :mod:`rsnotify.dashboard.hosts`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from rsnotify.dashboard.hosts import host_allowed, origin_allowed
from rsnotify.dashboard.server import Dashboard, DashboardConfig
from tests.devstack import Redis


def test_host_names_other_than_the_configured_ones_are_refused() -> None:
    allowed = ["dash.example.org"]
    for header in ["127.0.0.1:8080", "[::1]:8080", "10.1.2.3", "localhost:8080", "LOCALHOST."]:
        assert host_allowed(header, "127.0.0.1", allowed), header
    for header in ["dash.example.org:8080", "Dash.Example.Org.", "ops:8080"]:
        assert host_allowed(header, "ops", allowed), header
    for header in [None, "", "evil.example:8080", "127.0.0.1.evil.example", "a b", "u@localhost"]:
        assert not host_allowed(header, "127.0.0.1", allowed), header
    assert host_allowed("anything.example", "0.0.0.0", ["*"])


def test_websocket_origins_must_be_the_dashboards_own_page_or_allowed() -> None:
    host = "127.0.0.1:8080"
    assert origin_allowed(None, host, False, [])  # a program, not a page
    assert origin_allowed("http://127.0.0.1:8080", host, False, [])
    assert origin_allowed("http://localhost", "localhost:80", False, [])
    assert origin_allowed("https://dash.example.org", "dash.example.org", True, [])
    for origin in [
        "http://evil.example",
        "http://127.0.0.1:8081",  # another port is another origin
        "https://127.0.0.1:8080",  # and another scheme
        "null",
        "file://",
    ]:
        assert not origin_allowed(origin, host, False, []), origin
    assert origin_allowed("https://ops.example.org", host, False, ["https://ops.example.org:443"])
    assert origin_allowed("http://evil.example", host, False, ["*"])


Start = Callable[..., Any]


@pytest.fixture
async def dashboards(redis_server: Redis) -> AsyncIterator[Start]:
    started: list[Dashboard] = []

    async def start(**options: Any) -> Dashboard:
        dashboard = Dashboard(DashboardConfig(redis=redis_server.url, port=0, **options))
        await dashboard.start()
        started.append(dashboard)
        return dashboard

    yield start
    for dashboard in started:
        await dashboard.stop()


async def _status(http: aiohttp.ClientSession, url: str, host: str) -> int:
    async with http.get(url, headers={"Host": host}) as response:
        return response.status


async def test_a_rebound_host_name_gets_403_on_every_route(dashboards: Start) -> None:
    dashboard = await dashboards(allow_hosts=["dash.example.org"])
    port = dashboard.port
    async with aiohttp.ClientSession() as http:
        for path in ["", "api/snapshot", "metrics", "healthz", "static/app.js", "ws"]:
            url = f"{dashboard.url}{path}"
            assert await _status(http, url, f"evil.example:{port}") == 403, path
        for host in [f"127.0.0.1:{port}", f"localhost:{port}", f"dash.example.org:{port}"]:
            assert await _status(http, f"{dashboard.url}api/snapshot", host) == 200, host
        async with http.get(dashboard.url, headers={"Host": "evil.example"}) as response:
            assert "--allow-host evil.example" in await response.text()


async def test_websocket_from_another_sites_page_is_refused(dashboards: Start) -> None:
    dashboard = await dashboards(allow_ws_origins=["https://ops.example.org"])
    ws_url = f"{dashboard.url}ws"
    own = f"http://127.0.0.1:{dashboard.port}"
    async with aiohttp.ClientSession() as http:
        for origin in ["http://evil.example", f"http://127.0.0.1:{dashboard.port + 1}", "null"]:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(ws_url, origin=origin)
            assert refused.value.status == 403, origin
        for origin in [own, "https://ops.example.org", None]:
            async with http.ws_connect(ws_url, origin=origin) as ws:
                message = await ws.receive_json(timeout=10)
                assert "totals" in message, origin
