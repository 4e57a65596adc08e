"""The dashboard's HTTP server: the page, its assets, the JSON API, a WebSocket feed, metrics.

One snapshot is built per ``interval`` (Redis read once, JSON encoded once)
and the same bytes go to every connected page and every ``/api`` request
until the next one, so the cost of a snapshot does not grow with the number
of viewers.  A page that cannot keep up simply gets the newest snapshot
next: each client holds at most one pending send.

Routes (documented in the README):

* ``GET /``                   the page (static HTML, CSS, JS; charts by uPlot, shipped)
* ``GET /ws``                 WebSocket: a ``snapshot`` JSON message now and every interval
* ``GET /api/snapshot``       everything below in one document
* ``GET /api/collections``    per collection: head, earliest, rates, publisher health
* ``GET /api/subscribers``    per subscriber and collection (``?collection=``, ``?state=``)
* ``GET /api/latency``        percentiles per stage and window, series, histograms
* ``GET /api/events``         newest first (``?limit=``, ``?kind=``)
* ``GET /metrics``            Prometheus text format
* ``GET /healthz``            200 while Redis answers, else 503

Every request must carry a ``Host`` the dashboard answers to, and ``/ws`` an
``Origin`` of its own (or allowed) page: :mod:`.hosts` says which and why
(DNS rebinding, cross-site WebSockets); refusals are HTTP 403.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from ..cancellation import raise_if_cancelled
from .collector import Collector
from .hosts import host_allowed, origin_allowed
from .metrics import DashboardMetrics
from .state import DashboardState

if TYPE_CHECKING:
    from aiohttp.typedefs import Handler

# Any (strict module): the snapshot is the JSON document the page reads (state.build).

log = logging.getLogger("rsnotify.dashboard")

STATIC = Path(str(resources.files("rsnotify.dashboard") / "static"))
SECURITY_HEADERS = {
    # Everything the page needs is served from here: no CDN, no inline script.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self' ws: wss:; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@dataclass(slots=True)
class DashboardConfig:
    redis: str
    mqtt: str | None = None
    topic_prefix: str = "resourcesync"
    mqtt_protocol: str = "auto"  # "auto" (5, falling back to 3.1.1 when refused), "5", "3.1.1"
    host: str = "127.0.0.1"
    port: int = 8080
    interval: float = 1.0
    offline_after: float = 5.0
    stale_after: float = 15.0
    hold: float = 2.0
    allow_hosts: Sequence[str] = ()  # Host names answered besides IPs, localhost and `host`
    allow_ws_origins: Sequence[str] = ()  # page origins allowed on /ws besides the dashboard's


class Dashboard:
    def __init__(self, config: DashboardConfig) -> None:
        self.config = config
        self.state = DashboardState(
            time.time(),
            offline_after=config.offline_after,
            stale_after=config.stale_after,
            hold=config.hold,
        )
        self.snapshot: dict[str, Any] | None = None
        self.snapshot_text = ""
        self.version = 0
        self.metrics = DashboardMetrics(lambda: self.snapshot)
        self.collector = Collector(
            config.redis,
            self.state,
            mqtt_url=config.mqtt,
            topic_prefix=config.topic_prefix,
            mqtt_protocol=config.mqtt_protocol,
            on_samples=self.metrics.samples_seen,
            on_event=self.metrics.event,
        )
        self.port: int | None = None
        self.clients = 0
        self.timings: dict[str, float] = {}
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._metrics_cache: tuple[int, asyncio.Future[bytes]] | None = None

    # -- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        await self.collector.start()
        await self.tick()
        app = self.app()
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        server = site._server  # aiohttp exposes the bound sockets only here
        sockets = getattr(server, "sockets", None) or ()
        self.port = sockets[0].getsockname()[1] if sockets else self.config.port
        self._loop_task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        if self._runner is not None:
            await self._runner.cleanup()
        await self.collector.stop()

    @property
    def url(self) -> str:
        host = self.config.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/"

    # -- snapshots ------------------------------------------------------------------------

    async def tick(self) -> None:
        """Read Redis, build the snapshot, encode it once, wake every page."""
        started = time.perf_counter()
        await self.collector.refresh()
        read = time.perf_counter()
        snapshot = self.state.build(time.time())
        snapshot["dashboard"] = {
            "redis": {
                "ok": self.collector.ok,
                "error": self.collector.error,
                "last_ok": self.collector.last_ok,
            },
            "mqtt": None
            if self.collector.mqtt is None
            else {
                "connected": self.collector.mqtt.connected,
                # connecting / connected / refused / unreachable / lost, and why
                "state": self.collector.mqtt.link.state.state,
                "reason": self.collector.mqtt.link.state.reason,
            },
            "interval": self.config.interval,
            "clients": self.clients,
            "version": self.version + 1,
            "read_ms": round((read - started) * 1000, 3),
            "build_ms": self.timings.get("build_ms"),
        }
        text = json.dumps(snapshot, separators=(",", ":"))
        done = time.perf_counter()
        self.timings = {
            "read_ms": (read - started) * 1000,
            "build_ms": (done - read) * 1000,
            "bytes": float(len(text)),
        }
        self.metrics.snapshot_seconds.observe(done - started)
        self.metrics.redis_up.set(1 if self.collector.ok else 0)
        self.snapshot = snapshot
        self.snapshot_text = text
        self.version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _loop(self) -> None:
        interval = self.config.interval
        loop = asyncio.get_running_loop()
        next_at = loop.time() + interval
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at = max(next_at + interval, loop.time())
            try:
                await self.tick()
                raise_if_cancelled()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not freeze the page: log it, try next time
                log.exception("building the dashboard snapshot failed")

    # -- HTTP ---------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._check_host, _headers])
        app.router.add_get("/", self.page)
        app.router.add_static("/static/", STATIC, show_index=False)
        app.router.add_get("/ws", self.websocket)
        app.router.add_get("/api/snapshot", self.api_snapshot)
        app.router.add_get("/api/collections", self.api_part("collections"))
        app.router.add_get("/api/subscribers", self.api_subscribers)
        app.router.add_get("/api/latency", self.api_part("latency"))
        app.router.add_get("/api/events", self.api_events)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_get("/healthz", self.healthz)
        return app

    async def page(self, _: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def api_snapshot(self, _: web.Request) -> web.Response:
        return web.Response(text=self.snapshot_text, content_type="application/json")

    def api_part(self, key: str) -> Handler:
        async def handler(_: web.Request) -> web.Response:
            assert self.snapshot is not None
            return web.json_response(self.snapshot[key])

        return handler

    async def api_subscribers(self, request: web.Request) -> web.Response:
        assert self.snapshot is not None
        rows = self.snapshot["subscribers"]
        collection = request.query.get("collection")
        state = request.query.get("state")
        if collection:
            rows = [r for r in rows if r["collection"] == collection]
        if state:
            rows = [r for r in rows if r["state"] == state]
        return web.json_response(rows)

    async def api_events(self, request: web.Request) -> web.Response:
        assert self.snapshot is not None
        try:
            limit = int(request.query.get("limit", "100"))
        except ValueError:
            raise web.HTTPBadRequest(text="limit must be an integer") from None
        events = list(self.state.events)
        kind = request.query.get("kind")
        if kind:
            events = [e for e in events if e["kind"] == kind]
        return web.json_response(events[: max(0, min(limit, len(events)))])

    async def prometheus(self, _: web.Request) -> web.Response:
        """Rendered at most once per snapshot, off the event loop.

        prometheus-client spends tens of microseconds per line; with 50
        subscribers x 10 collections that is a few hundred milliseconds, which
        must not stall the page's updates.  Concurrent scrapes share one render.
        """
        version = self.version
        cached = self._metrics_cache
        if cached is None or cached[0] != version:
            cached = (version, asyncio.ensure_future(self._render_metrics()))
            self._metrics_cache = cached
        body = await asyncio.shield(cached[1])
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _render_metrics(self) -> bytes:
        return await asyncio.to_thread(generate_latest, self.metrics.registry)

    async def healthz(self, _: web.Request) -> web.Response:
        ok = self.collector.ok
        body = {"ok": ok, "redis": self.collector.error or "ok", "version": self.version}
        return web.json_response(body, status=200 if ok else 503)

    @web.middleware
    async def _check_host(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse a ``Host`` the dashboard was not configured with (DNS rebinding)."""
        host = request.headers.get("Host")
        if not host_allowed(host, self.config.host, self.config.allow_hosts):
            name = (host or "").rpartition(":")[0] or host or ""
            raise web.HTTPForbidden(
                text=f"Host {host!r} is not served here; to serve it, start the dashboard with "
                f"--allow-host {name or 'NAME'}\n"
            )
        return await handler(request)

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        origin = request.headers.get("Origin")
        allowed = self.config.allow_ws_origins
        if not origin_allowed(origin, request.headers.get("Host"), request.secure, allowed):
            raise web.HTTPForbidden(
                text=f"a page from {origin!r} may not read this dashboard; to allow it, start "
                f"the dashboard with --allow-ws-origin {origin}\n"
            )
        ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=4096)
        await ws.prepare(request)
        self.clients += 1
        self.metrics.clients.set(self.clients)
        reader = asyncio.create_task(self._read_until_closed(ws))
        try:
            sent = -1
            while not ws.closed and not reader.done():
                if self.version == sent:
                    waiter = asyncio.create_task(self._changed.wait())
                    await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    continue
                sent = self.version
                try:
                    async with asyncio.timeout(10.0):
                        await ws.send_str(self.snapshot_text)
                except (ConnectionError, TimeoutError, RuntimeError):
                    break
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            self.clients -= 1
            self.metrics.clients.set(self.clients)
            await ws.close()
        return ws

    @staticmethod
    async def _read_until_closed(ws: web.WebSocketResponse) -> None:
        """The page sends nothing we act on; reading is what processes pings and close."""
        async for message in ws:
            if message.type == WSMsgType.ERROR:
                break


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    if not response.prepared:  # a WebSocket upgrade already sent its headers
        response.headers.update(SECURITY_HEADERS)
        if request.path.startswith("/api/"):
            response.headers["Cache-Control"] = "no-store"
    return response
