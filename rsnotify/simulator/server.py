"""The simulator's HTTP face: an aiohttp application plus the change generator.

Everything a Destination sees is served from :class:`~rsnotify.simulator.site.Site`
with ``ETag``, ``Last-Modified``, ``Content-Length``, ``Content-Type`` and
``Cache-Control: no-cache``; a conditional GET (``If-None-Match`` or
``If-Modified-Since``) that matches gets ``304``; resources carry
``Link: <capability list>; rel="resourcesync"``; ``HEAD`` works everywhere.
aiohttp provides keep-alive and concurrency.

Changes
-------
One code path makes changes: :meth:`Simulator.apply`.  The rate-driven
generator calls it once per tick (10 ms by default) with however many changes
are due by then (``rate * elapsed - made``), so high rates become batches per
event-loop tick, not one timer per change, and a loop delayed by request load
catches up on its next tick instead of falling behind.  A backlog larger than
one second's worth is dropped rather than burst out.  The control endpoint
``POST /_simulator/advance?n=N`` calls the same method, which is how tests
drive the Source deterministically without waiting on a clock.

Control and ground truth (JSON)
-------------------------------
``GET /_simulator/state``
    ``{"collections": {<capability list URI>: {"resources": {<loc>: <sha-256>},
    "changes": N, "last_change": <datetime>|null}}}`` -- the live state at that
    instant (the event loop is single-threaded, so it is always consistent
    with the documents served at the same instant).
``GET /_simulator/stats``
    Counters: changes (total and by kind), rates, requests by status, bytes,
    whole (200) GETs of resources and of Change Dump packages
    (``resource_gets``, ``package_gets``), open Change Lists, seed, configuration.
``POST /_simulator/pause`` / ``POST /_simulator/resume``
    Freeze / unfreeze the rate-driven generator.  ``advance`` still works
    while paused: pausing freezes the clock-driven changes, not the tests'
    explicit ones.
``POST /_simulator/advance?n=N``
    Apply N changes now (bounded by ``--max-changes``) and answer
    ``{"applied": k, "changes": total}``.
``POST /_simulator/faults`` ``{"mode": M, "seconds": S, "scope": "all"|"resources"|"documents"}``
    Misbehave for S seconds (fault-injection tests): ``500`` answers 500;
    ``timeout`` holds each request until the window ends (or the fault is
    replaced), then closes the connection without an answer; ``truncate``
    sends the headers and half the body, then closes; ``bad-hash`` serves
    resources with altered bytes (same length) so their fixity fails.  Mode
    ``none`` ends the window now.
    Control endpoints never misbehave.
``POST /_simulator/clock?skew=S``
    Offset the Source's clock by S seconds from now on (every datetime it
    hands out and its ``Last-Modified`` headers); change datetimes still never
    go backwards (see :class:`~.source.Source`).  ``--clock-skew`` sets it at start.
``POST /_simulator/drop-entry``
    Republish each collection's open Change List without one entry that a
    later entry of the same resource supersedes (see :meth:`.site.Site.drop_superseded`);
    answers ``{"dropped": [<loc>...]}``.

Control requests that change state (pause, advance) return only after the
``--dir`` copy, if any, has caught up, so a test can compare it right away.

Why one module of ~620 lines: it is one aiohttp application, and the
document handlers, the fault injection, the counters and the control
endpoints all read and change the same live state of one :class:`Simulator`
(paused or not, the fault window, the clock skew, the ``--dir`` copy to
settle before answering); about a tenth of the file is the endpoint reference
above.  Everything that needs no server lives beside it: the changes in
:mod:`.source` (pure state machine), the published bytes and their validators
in :mod:`.site`, the resource content in :mod:`.payload`, the ``--dir`` copy
in :mod:`.diskwriter`, WebSub pings in :mod:`.ping`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web

from . import payload
from .changedump import ZIP_TYPE
from .diskwriter import DiskWriter
from .ping import Pinger
from .site import RESOURCE_LIST_LIMIT, Site
from .source import (
    DEFAULT_CHANGELIST_SIZE,
    SPEC_VERSIONS,
    Layout,
    SimulatorError,
    Source,
    Weights,
)

MAX_ADVANCE = 10_000_000
MAX_SKEW = 10 * 365 * 86400.0
MAX_FAULT_SECONDS = 3600.0
FAULT_MODES = ("none", "500", "timeout", "truncate", "bad-hash")
FAULT_SCOPES = ("all", "resources", "documents")
_ADVANCE_CHUNK = 2000  # changes per slice, so /advance never blocks serving for long


@dataclass(slots=True)
class SimulatorConfig:
    """Every option of ``rsnotify simulate`` (see the command's ``--help``)."""

    host: str = "127.0.0.1"
    port: int = 0
    base_url: str | None = None
    collections: int = 1
    resources: int = 100
    rate: float = 10.0
    changelist_size: int = DEFAULT_CHANGELIST_SIZE
    resourcelist_size: int = RESOURCE_LIST_LIMIT
    max_changes: int | None = None
    payload_bytes: int = 1024
    seed: int | None = None
    spec_version: str = "1.1"
    dir: Path | None = None
    spare_inodes: bool = False  # --dir reuses retired inodes (rsnotify.spare)
    change_dump: bool = False  # a Change Dump: a ZIP package per closed Change List (.changedump)
    weights: Weights = field(default_factory=Weights)
    resurrect: float = 0.25
    hubs: tuple[str, ...] = ()
    paused: bool = False
    tick: float = 0.01
    resourcelist_max_age: float = 1.0
    flush_interval: float = 0.5
    clock_skew: float = 0.0
    large_every: int = 0
    large_bytes: int = 4 * 1024 * 1024  # the mean size of one in --large-every resources
    pings: tuple[str, ...] = ()  # hub URLs told "I just wrote my Change List" (see .ping)
    ping_secret: str | None = None

    def validate(self) -> None:
        """Raise :class:`SimulatorError` for any value the simulator cannot honour."""
        if not 0 <= self.port <= 65535:
            raise SimulatorError(f"port must be 0..65535, got {self.port}")
        if not (self.rate >= 0 and self.rate != float("inf")):
            raise SimulatorError(f"rate must be a finite number >= 0, got {self.rate}")
        if not 0.001 <= self.tick <= 1.0:
            raise SimulatorError(f"tick must be 0.001..1 s, got {self.tick}")
        if self.spec_version not in SPEC_VERSIONS:
            raise SimulatorError(f"spec version must be 1.0 or 1.1, got {self.spec_version!r}")
        if self.resourcelist_max_age < 0 or self.flush_interval <= 0:
            raise SimulatorError("resource list max age must be >= 0 and flush interval > 0")
        if abs(self.clock_skew) > MAX_SKEW:
            raise SimulatorError(f"clock skew must be within +-{MAX_SKEW:g} s")
        for url in self.pings:
            if not url.startswith(("http://", "https://")):
                raise SimulatorError(f"--ping must be an http(s) URL, got {url!r}")


@dataclass(slots=True)
class _Fault:
    """The HTTP misbehaviour in force (see ``POST /_simulator/faults``)."""

    mode: str
    until: float  # time.monotonic() when it ends
    scope: str = "all"
    hits: int = 0

    def active(self) -> bool:
        return self.mode != "none" and time.monotonic() < self.until


@dataclass(slots=True)
class _Counters:
    requests: int = 0
    bytes_sent: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    batches: int = 0
    ticks: int = 0  # generator wake-ups, so tests can see time pass without sleeping
    dropped: int = 0  # changes skipped because the loop fell more than 1 s behind
    resource_gets: int = 0  # GETs answered with a resource's bytes (200)
    package_gets: int = 0  # GETs answered with a Change Dump package (200)


def _format_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class Simulator:
    """A running simulated Source: Site + generator + HTTP server (+ disk writer).

    Use ``async with Simulator(config) as sim:`` (or :meth:`start` /
    :meth:`stop`).  Once started, :attr:`url` is where it listens and
    :attr:`base_url` the prefix of the URLs in its documents (the same unless
    ``base_url`` was configured; the server answers on the path part either way).
    """

    def __init__(self, config: SimulatorConfig) -> None:
        config.validate()
        self.config = config
        seed = config.seed
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**32)
        self.site: Site | None = None
        self.writer: DiskWriter | None = None
        self.paused = config.paused
        self.skew = timedelta(seconds=config.clock_skew)
        self.fault = _Fault("none", 0.0)
        self.counters = _Counters()
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()  # set by apply(): the --dir copy has something to write
        self._rate_samples: deque[tuple[float, int]] = deque(maxlen=64)
        self._started_mono = 0.0
        self.pinger = (
            Pinger(config.pings, config.ping_secret.encode() if config.ping_secret else None)
            if config.pings
            else None
        )
        self.url = ""  # where it listens: http://HOST:PORT/ (control endpoints live here)
        self.base_url = ""  # the URL prefix written into documents (--base-url, else url)

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> str:
        """Bind, build the Source, start serving and generating; returns the base URL."""
        config = self.config
        sock = self._bind()
        try:
            port = sock.getsockname()[1]
            listening = f"http://{_format_host(config.host)}:{port}/"
            layout = Layout(config.base_url or listening)
            source = Source(
                layout=layout,
                start=self.now(),
                collections=config.collections,
                resources=config.resources,
                changelist_size=config.changelist_size,
                payload_bytes=config.payload_bytes,
                seed=self.seed,
                weights=config.weights,
                spec_version=config.spec_version,
                max_changes=config.max_changes,
                resurrect=config.resurrect,
                hubs=config.hubs,
                large_every=config.large_every,
                large_bytes=config.large_bytes,
                change_dump=config.change_dump,
            )
            self.site = Site(source, resourcelist_size=config.resourcelist_size)
            if config.dir is not None:
                self.writer = DiskWriter(config.dir, self.site, spare_inodes=config.spare_inodes)
                self.writer.prepare()
                await self.writer.flush(self.now())
            self._runner = web.AppRunner(self._app(), access_log=None, handle_signals=False)
            await self._runner.setup()
            await web.SockSite(self._runner, sock).start()
        except BaseException:
            sock.close()
            if self._runner is not None:
                await self._runner.cleanup()
            raise
        self.url = listening
        self.base_url = layout.base_url
        self._started_mono = time.monotonic()
        self._tasks.append(asyncio.create_task(self._generate(), name="simulator-generator"))
        if self.writer is not None:
            self._tasks.append(asyncio.create_task(self._flush_loop(), name="simulator-flush"))
        return self.url

    def _bind(self) -> socket.socket:
        config = self.config
        try:
            family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
            sock = socket.create_server((config.host.strip("[]"), config.port), family=family)
        except OSError as exc:
            raise SimulatorError(
                f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}"
            ) from None
        sock.setblocking(False)
        return sock

    async def stop(self) -> None:
        """Stop generating, write the last changes to ``--dir``, close the server."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.writer is not None:
            await self.writer.flush(self.now())
            self.writer.close()
        if self.pinger is not None:
            await self.pinger.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Simulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- changing --------------------------------------------------------------------

    def now(self) -> datetime:
        """The Source's clock: the real time plus the configured skew."""
        return datetime.now(UTC) + self.skew

    @property
    def source(self) -> Source:
        assert self.site is not None, "simulator not started"
        return self.site.source

    def apply(self, n: int) -> int:
        """Make up to ``n`` changes now: the single path for generator and /advance."""
        assert self.site is not None, "simulator not started"
        applied = self.site.apply(n, self.now())
        if applied:
            self.counters.batches += 1
            if self.writer is not None:
                self.writer.note(applied)
                self._changed.set()
            if self.pinger is not None:
                self.pinger.changed({item.collection.capability_list_url for item in applied})
        return len(applied)

    @property
    def finished(self) -> bool:
        return self.source.remaining == 0

    async def _generate(self) -> None:
        rate = self.config.rate
        tick = self.config.tick
        loop = asyncio.get_running_loop()
        anchor, made = loop.time(), 0
        while True:
            self._sample()
            await asyncio.sleep(tick)
            self.counters.ticks += 1
            if rate <= 0 or self.paused or self.finished:
                anchor, made = loop.time(), 0
                continue
            due = int((loop.time() - anchor) * rate) - made
            if due > rate:  # more than a second behind: drop the backlog, keep the pace
                self.counters.dropped += due - int(rate * tick + 1)
                anchor, made = loop.time() - tick, 0
                due = int(rate * tick + 1)
            if due > 0:
                self.apply(due)
                made += due

    def _sample(self) -> None:
        now = time.monotonic()
        samples = self._rate_samples
        if not samples or now - samples[-1][0] >= 0.25:
            samples.append((now, self.source.total_changes))

    def recent_rate(self) -> float:
        """Changes per second over the last few seconds."""
        samples = self._rate_samples
        if len(samples) < 2:
            return 0.0
        now = time.monotonic()
        old = next((s for s in samples if now - s[0] <= 5.0), samples[0])
        span = now - old[0]
        return (self.source.total_changes - old[1]) / span if span > 0 else 0.0

    async def _flush_loop(self) -> None:
        """Write the ``--dir`` copy when something changed, at most once per flush interval.

        On the leading edge, as a Source that appends to its Change List when
        a change happens: a change after a quiet interval is written at once,
        and a burst is coalesced into one write per interval.  (A fixed timer
        made every change wait for its next tick: half the interval on
        average, 2.5 ms of bench.e2e's 5 ms, inside every latency it measured.)
        """
        assert self.writer is not None
        loop = asyncio.get_running_loop()
        written = loop.time() - self.config.flush_interval
        while True:
            await self._changed.wait()
            wait = written + self.config.flush_interval - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self._changed.clear()
            if self.writer.pending:
                await self.writer.flush(self.now(), self._resourcelist_max_age())
            written = loop.time()

    def _resourcelist_max_age(self) -> float:
        """Stale Resource Lists only while the generator is changing things."""
        if self.paused or self.config.rate <= 0 or self.finished:
            return 0.0
        return self.config.resourcelist_max_age

    async def _settle(self) -> None:
        if self.writer is not None:
            await self.writer.flush(self.now(), self._resourcelist_max_age())

    # -- HTTP ------------------------------------------------------------------------

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/_simulator/state", self._state)
        app.router.add_get("/_simulator/stats", self._stats)
        app.router.add_post("/_simulator/pause", self._pause)
        app.router.add_post("/_simulator/resume", self._resume)
        app.router.add_post("/_simulator/advance", self._advance)
        app.router.add_post("/_simulator/faults", self._faults)
        app.router.add_post("/_simulator/clock", self._clock)
        app.router.add_post("/_simulator/drop-entry", self._drop_entry)
        app.router.add_get("/{path:.*}", self._serve)
        return app

    def _count(self, status: int, size: int) -> None:
        counters = self.counters
        counters.requests += 1
        counters.bytes_sent += size
        counters.by_status[status] = counters.by_status.get(status, 0) + 1

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        assert self.site is not None
        rep = self.site.lookup(
            request.path,
            self.now(),
            resourcelist_max_age=self._resourcelist_max_age(),
        )
        if rep is None:
            self._count(404, 0)
            return web.Response(status=404, text="404: not found\n")
        fault = self.fault
        if fault.active() and fault.scope in ("all", _scope(rep.content_type)):
            faulty = await self._misbehave(request, rep.body, fault)
            if faulty is not None:
                return faulty
        headers = {
            "ETag": rep.etag,
            "Last-Modified": rep.last_modified,
            "Cache-Control": "no-cache",
        }
        if rep.link:
            headers["Link"] = rep.link
        if rep.not_modified(request.headers.get("If-None-Match"), request.if_modified_since):
            self._count(304, 0)
            return web.Response(status=304, headers=headers)
        headers["Content-Type"] = rep.content_type
        headers["Accept-Ranges"] = "bytes"
        if "Range" in request.headers and request.method == "GET":
            ranged = self._ranged(request, rep.body, headers)
            if ranged is not None:
                return ranged
        self._count(200, 0 if request.method == "HEAD" else len(rep.body))
        if request.method == "GET":
            if rep.content_type == payload.MEDIA_TYPE:
                self.counters.resource_gets += 1
            elif rep.content_type == ZIP_TYPE:
                self.counters.package_gets += 1
        return web.Response(body=rep.body, headers=headers)

    async def _misbehave(
        self, request: web.Request, body: bytes, fault: _Fault
    ) -> web.StreamResponse | None:
        """Answer as the fault in force says; None when it leaves this request alone."""
        if fault.mode == "bad-hash" and request.method == "GET" and body:
            fault.hits += 1
            corrupt = bytes([body[0] ^ 0x01]) + body[1:]  # same length, other digest
            self._count(200, len(corrupt))
            return web.Response(body=corrupt, content_type="text/plain")
        if fault.mode == "500":
            fault.hits += 1
            self._count(500, 0)
            return web.Response(status=500, text="500: injected fault\n")
        if fault.mode == "timeout":
            fault.hits += 1
            # Hold the request for the rest of the window (or until the fault is replaced).
            while self.fault is fault and fault.active():
                await asyncio.sleep(0.05)
            self._count(0, 0)
            if request.transport is not None:
                request.transport.close()  # no answer at all: the client sees its timeout
            return web.Response(status=504)  # never sent: the connection is gone
        if fault.mode == "truncate" and request.method == "GET" and len(body) > 1:
            fault.hits += 1
            response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
            response.content_length = len(body)
            await response.prepare(request)
            await response.write(body[: len(body) // 2])
            self._count(200, len(body) // 2)
            if request.transport is not None:
                request.transport.close()
            return response
        return None

    def _ranged(
        self, request: web.Request, body: bytes, headers: dict[str, str]
    ) -> web.Response | None:
        """Answer ``Range: bytes=N-`` (how a publisher reads only what was appended).

        Only single ranges are served; anything else gets the whole body, which
        RFC 9110 allows.  A start past the end is 416, so a client can tell a
        shrunken document from an unchanged one.
        """
        try:
            wanted = request.http_range
        except ValueError:
            return None
        if wanted.step not in (None, 1):
            return None
        start = wanted.start or 0
        stop = len(body) if wanted.stop is None else min(wanted.stop, len(body))
        if start < 0:  # suffix range: the last -start bytes
            start = max(0, len(body) + start)
        if start >= len(body) > 0:
            self._count(416, 0)
            headers["Content-Range"] = f"bytes */{len(body)}"
            return web.Response(status=416, headers=headers)
        part = body[start:stop]
        headers["Content-Range"] = f"bytes {start}-{start + len(part) - 1}/{len(body)}"
        self._count(206, len(part))
        return web.Response(status=206, body=part, headers=headers)

    async def _state(self, request: web.Request) -> web.Response:
        return web.json_response(self.source.state())

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    def stats(self) -> dict[str, Any]:
        """The ``/_simulator/stats`` document."""
        source = self.source
        layout = source.layout
        counters = self.counters
        config = self.config
        return {
            "changes": source.total_changes,
            "by_change": {kind.value: n for kind, n in source.counts.items()},
            "rate_target": config.rate,
            "rate_recent": round(self.recent_rate(), 1),
            "paused": self.paused,
            "finished": self.finished,
            "max_changes": config.max_changes,
            "batches": counters.batches,
            "generator_ticks": counters.ticks,
            "dropped_backlog": counters.dropped,
            "requests": counters.requests,
            "responses": {str(k): v for k, v in sorted(counters.by_status.items())},
            "bytes_sent": counters.bytes_sent,
            "resource_gets": counters.resource_gets,
            "package_gets": counters.package_gets,
            "uptime_s": round(time.monotonic() - self._started_mono, 3),
            "seed": self.seed,
            "spec_version": config.spec_version,
            "files_written": self.writer.files_written if self.writer else None,
            "dir_error": self.writer.error if self.writer else None,
            "clock_skew_s": self.skew.total_seconds(),
            "pings": (
                {"sent": self.pinger.sent, "failed": self.pinger.failed}
                if self.pinger is not None
                else None
            ),
            "fault": {
                "mode": self.fault.mode if self.fault.active() else "none",
                "hits": self.fault.hits,
            },
            "collections": {
                c.capability_list_url: {
                    "resources": len(c.live),
                    "changes": c.changes,
                    "changelists": len(c.changelists),
                    "open_changelist": layout.changelist(c.name, c.open_changelist.number),
                    "open_entries": c.open_changelist.count,
                }
                for c in source.collections
            },
        }

    def status_line(self) -> str:
        """One line for a terminal: changes, rate, open Change List fill."""
        source = self.source
        first = source.collections[0].open_changelist
        state = "paused" if self.paused else ("done" if self.finished else "running")
        return (
            f"{state} | changes {source.total_changes:,} | {self.recent_rate():,.0f}/s"
            f" | open list #{first.number} {first.count}/{source.changelist_size}"
            f" | requests {self.counters.requests:,}"
        )

    async def _pause(self, request: web.Request) -> web.Response:
        self.paused = True
        await self._settle()
        return web.json_response({"paused": True, "changes": self.source.total_changes})

    async def _resume(self, request: web.Request) -> web.Response:
        self.paused = False
        return web.json_response({"paused": False, "changes": self.source.total_changes})

    async def _faults(self, request: web.Request) -> web.Response:
        try:
            spec = await request.json()
            mode = spec["mode"]
            seconds = float(spec.get("seconds", 0))
            scope = spec.get("scope", "all")
        except (ValueError, TypeError, KeyError):
            return _bad('body must be {"mode": M, "seconds": S[, "scope": ...]}')
        if mode not in FAULT_MODES:
            return _bad(f"mode must be one of {', '.join(FAULT_MODES)}, got {mode!r}")
        if scope not in FAULT_SCOPES:
            return _bad(f"scope must be one of {', '.join(FAULT_SCOPES)}, got {scope!r}")
        if not 0 <= seconds <= MAX_FAULT_SECONDS:
            return _bad(f"seconds must be 0..{MAX_FAULT_SECONDS:g}")
        self.fault = _Fault(mode, time.monotonic() + seconds, scope)
        return web.json_response({"mode": mode, "seconds": seconds, "scope": scope})

    async def _clock(self, request: web.Request) -> web.Response:
        raw = request.query.get("skew", "")
        try:
            skew = float(raw)
        except ValueError:
            skew = float("nan")
        if not abs(skew) <= MAX_SKEW:
            return _bad(f"skew must be a number of seconds within +-{MAX_SKEW:g}, got {raw!r}")
        self.skew = timedelta(seconds=skew)
        return web.json_response({"clock_skew_s": skew, "now": self.now().isoformat()})

    async def _drop_entry(self, request: web.Request) -> web.Response:
        assert self.site is not None
        dropped = [self.site.drop_superseded(c) for c in self.source.collections]
        await self._settle()
        return web.json_response({"dropped": [loc for loc in dropped if loc is not None]})

    async def _advance(self, request: web.Request) -> web.Response:
        raw = request.query.get("n", "1")
        try:
            n = int(raw)
        except ValueError:
            n = -1
        if not 0 <= n <= MAX_ADVANCE:
            return web.json_response(
                {"error": f"n must be an integer 0..{MAX_ADVANCE}, got {raw!r}"}, status=400
            )
        applied = 0
        while applied < n:
            made = self.apply(min(_ADVANCE_CHUNK, n - applied))
            applied += made
            if made == 0:
                break  # max_changes reached
            await asyncio.sleep(0)  # let pending requests through between slices
        await self._settle()
        return web.json_response({"applied": applied, "changes": self.source.total_changes})


def _scope(content_type: str) -> str:
    return "resources" if content_type == payload.MEDIA_TYPE else "documents"


def _bad(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)
