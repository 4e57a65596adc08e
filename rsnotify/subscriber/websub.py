"""The WebSub channel of the Destination: a callback server that subscribes to hub topics.

``rsnotify subscribe --via websub --callback http://HOST:PORT/PATH`` (or
``--via http://hub/`` to name the hub) runs one aiohttp server for every
followed collection; collection ``c`` gets the callback ``<PATH>/<c>``.  Like
the MQTT and WebSocket channels it decides nothing: it turns HTTP into
:mod:`.events` for the collection's engine, which does decoding, ordering,
gap detection and catch-up exactly as for the other transports.

Subscribing (W3C WebSub 5.1 to 5.3)
    The channel POSTs ``hub.mode=subscribe`` with ``hub.callback``,
    ``hub.topic``, ``hub.lease_seconds`` and a ``hub.secret``, then answers
    the hub's verification GET by echoing ``hub.challenge`` -- only for a
    topic it is subscribing to right now (any other GET, including an
    ``unsubscribe`` it did not ask for, gets 404: the hub must not be able
    to subscribe or unsubscribe us on someone else's say-so).  It subscribes
    again at two thirds of the granted lease (renewal; the hub keeps its
    delivery cursor), and retries with backoff when the hub is unreachable,
    does not verify in time, or denies.

The secret
    Generated once (32 random bytes, hex) and kept in the state directory
    (``websub-secret``, mode 0600), so a restarted subscriber still verifies
    what the hub signed before the restart.  The signature is checked with
    the method the hub states (WebSub 7.1.2): sha256, sha384, sha512, and
    sha1 with a warning (it is what some hubs send).  A POST whose
    ``X-Hub-Signature`` is missing or wrong is answered 2xx (WebSub 7:
    acknowledge, then ignore) and reported to the engine as an invalid
    payload: something was sent that we could not trust, so it catches up
    from the Change List Index -- at most once per :data:`INVALID_INTERVAL`
    seconds, so a flood of forged POSTs costs the Source one catch-up, not
    one per POST (issue 22).  An empty POST is a topic without content
    (Change Notification 4.1: ``Content-Length: 0``) and is ignored.

What becomes an event
    A notification POST -> ``Message`` (with ``X-RsNotify-Prev`` as ``prev``
    and the publisher's ``X-RsNotify-Signature``); a ``gap_too_old`` POST ->
    ``TooOld``; a verified (re)subscription -> ``Connected`` (the hub keeps
    a cursor per subscription, so nothing is lost across our downtime within
    the lease and the retention); and, every ``heartbeat`` seconds, a GET of
    the topic URL (its ``X-RsNotify-Head`` header) -> ``Head``, which gives
    the engine both its heartbeat and the head-ahead check.  (A ``HEAD``:
    section 4.1 says the topic answers it like a GET, and a GET may be what
    a hub that fetches topics is waiting for.)

Framework notifications (Framework Notification 1.0.1)
    When the Capability List also advertises a framework channel (its
    section 5, Example 8: ``capability="framework-notification"``), a second
    channel subscribes to that topic with the callback ``<PATH>/<c>/framework``
    and the same secret.  It hands the engine ``Framework`` events, nothing
    else: no ``Connected``, no heartbeat, and a payload it cannot read or
    trust is logged and dropped, never a catch-up (a framework notification
    is a hint to poll, and losing one loses no change).

Which hub and topic
    A Capability List entry with ``rs:md capability="change-notification"``
    (section 5; the 1.0 draft's ``changelist-notification`` too): ``<loc>``
    is the topic, its ``rs:ln rel="hub"`` the hub.  The older top-level
    ``rs:ln rel="hub"`` with an http(s) URL is still read (topic
    ``<hub><collection>``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from aiohttp import web

from .. import framework, w3cdt
from ..backoff import Backoff
from ..discovery import websub_channels
from ..durable import write_file
from ..envelope import InvalidNotification
from ..errors import RsNotifyError
from ..transport import websubproto as proto
from ..transport.websubguard import quote
from . import events as ev

# Any (strict module): websub_target reads any Capability List-like object (.url, .links).

log = logging.getLogger("rsnotify.subscribe")

Sink = Callable[[ev.Event], None]
MAX_BODY = 1024 * 1024
VERIFY_TIMEOUT = 10.0  # seconds to wait for the hub's verification GET
RENEW_AT = 2 / 3  # of the granted lease
INVALID_INTERVAL = 10.0  # seconds: at most one catch-up per interval for untrusted POSTs


class Throttle:
    """Let one event through per ``interval`` seconds; count the rest (pure; time passed in)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.next_allowed = float("-inf")
        self.dropped = 0

    def allow(self, now: float) -> bool:
        if now >= self.next_allowed:
            self.next_allowed = now + self.interval
            return True
        self.dropped += 1
        return False


def websub_target(capability_list: Any, collection: str, via: str) -> tuple[str, str]:
    """(hub, topic) for a collection: from ``--via http://hub/``, else as advertised.

    The Change Notification markup (section 5) is a Capability List
    ``<url>`` whose ``<loc>`` is the topic, with ``rs:md
    capability="change-notification"`` and an ``rs:ln rel="hub"`` to the
    hub; a plain top-level ``rs:ln rel="hub"`` with an http(s) URL is taken
    as an rsnotify hub (topic ``<hub><collection>``).  With ``--via
    http://hub/`` the advertised topic is kept when the Capability List has
    one (it may live elsewhere than the hub).
    """
    advertised = websub_channels(capability_list.document)
    if via != "websub":
        hub = via if via.endswith("/") else via + "/"
        return hub, advertised[0][0] if advertised else hub + collection
    if advertised:
        topic, hub = advertised[0]
        return hub, topic
    for link in capability_list.hubs:
        if urlsplit(link.href).scheme in ("http", "https"):
            hub = link.href if link.href.endswith("/") else link.href + "/"
            return hub, hub + collection
    raise RsNotifyError(f"{capability_list.url} advertises no WebSub hub; give --via http://HUB/")


def load_secret(state_dir: Path) -> bytes:
    """This Destination's ``hub.secret``: created once, kept beside the cursor."""
    path = state_dir / "websub-secret"
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    secret = secrets.token_hex(32).encode()
    write_file(path, secret)  # owner-only: it signs what the hub delivers
    return secret


class CallbackServer:
    """One aiohttp server for every collection's callback path."""

    def __init__(self, callback: str, *, listen: str | None = None) -> None:
        parts = urlsplit(callback)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RsNotifyError(f"--callback {callback}: must be an absolute http(s) URL")
        if parts.query or parts.fragment:
            raise RsNotifyError(f"--callback {callback}: no query or fragment, please")
        self.base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self.base_path = parts.path.rstrip("/")
        if listen:
            host, _, port = listen.rpartition(":")
            self.host, self.port = host or "0.0.0.0", int(port)
        else:
            self.host = parts.hostname
            self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.channels: dict[str, WebSubChannel] = {}
        self._runner: web.AppRunner | None = None

    def callback_for(self, collection: str) -> str:
        return f"{self.base}/{collection}"

    async def start(self) -> None:
        if self._runner is not None:
            return
        app = web.Application(client_max_size=MAX_BODY)
        for suffix in ("", framework.TOPIC_SUFFIX):  # a collection's change and framework channels
            path = self.base_path + "/{collection}" + suffix
            app.router.add_get(path, functools.partial(self._verify, suffix))
            app.router.add_post(path, functools.partial(self._receive, suffix))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        log.info("WebSub callback listening on %s:%d for %s", self.host, self.port, self.base)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _channel(self, request: web.Request, suffix: str) -> WebSubChannel:
        channel = self.channels.get(request.match_info["collection"] + suffix)
        if channel is None:
            raise web.HTTPNotFound()
        return channel

    async def _verify(self, suffix: str, request: web.Request) -> web.Response:
        return self._channel(request, suffix).on_verify(dict(request.query))

    async def _receive(self, suffix: str, request: web.Request) -> web.Response:
        channel = self._channel(request, suffix)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            if channel.framework:
                channel._untrusted("a WebSub POST larger than 1 MiB")
            else:
                channel.sink(ev.Invalid("a WebSub POST larger than 1 MiB"))
            return web.Response(status=413)
        channel.on_content(body, request.headers)
        return web.Response(status=204)


class WebSubChannel:
    """One collection's subscription at a WebSub hub (its change or its framework topic)."""

    def __init__(
        self,
        server: CallbackServer,
        *,
        hub: str,
        topic: str,
        collection: str,
        sink: Sink,
        secret: bytes,
        lease_seconds: int | None = None,
        heartbeat: float = 5.0,
        framework_topic: bool = False,
    ) -> None:
        self.server = server
        self.hub = hub
        self.topic = topic
        self.collection = collection
        self.sink = sink
        self.secret = secret
        self.lease_seconds = lease_seconds
        self.heartbeat = heartbeat
        self.framework = framework_topic
        self.key = collection + (framework.TOPIC_SUFFIX if framework_topic else "")
        self.callback = server.callback_for(self.key)
        self.granted: int | None = None
        self.untrusted = Throttle(INVALID_INTERVAL)
        self._warned_sha1 = False
        self._intent: str | None = None  # the hub.mode we are asking for right now
        self._verified = asyncio.Event()
        self.first_attempt = asyncio.Event()  # see channels.MqttChannel.first_attempt
        self._lease_ends: float | None = None  # monotonic, of the last verified lease
        self._tasks: list[asyncio.Task[None]] = []
        server.channels[self.key] = self

    # -- the hub's requests -------------------------------------------------------------

    def on_verify(self, query: dict[str, str]) -> web.Response:
        mode = query.get("hub.mode")
        if query.get("hub.topic") != self.topic:
            return web.Response(status=404, text="not our topic\n")
        if mode == "denied":
            log.warning(
                "%s: the hub denied the subscription: %s",
                self.collection,
                quote(query.get("hub.reason", "no reason given")),
            )
            self._intent = None
            self.sink(ev.Disconnected(f"WebSub: denied: {query.get('hub.reason', '')}"))
            return web.Response(text="ok\n")
        challenge = query.get("hub.challenge")
        if mode != self._intent or not challenge:
            return web.Response(status=404, text="no such intent\n")
        lease = query.get("hub.lease_seconds", "")
        self.granted = int(lease) if lease.isdigit() else None
        self._verified.set()
        return web.Response(text=challenge)

    def on_content(self, body: bytes, headers: Mapping[str, str]) -> None:
        get = headers.get
        method = proto.signature_method(body, get(proto.SIGNATURE_HEADER), self.secret)
        if method is None:
            self._untrusted("a WebSub POST without a valid X-Hub-Signature")
            return
        if method == "sha1" and not self._warned_sha1:
            self._warned_sha1 = True
            log.warning(
                "%s: the hub signs with sha1 (WebSub 7.1.2: accepted, but ask for sha256)",
                self.collection,
            )
        if not body.strip():
            return  # a topic with no content (section 4.1): nothing to apply
        if self.framework:
            self._on_framework(body, get(proto.TYPE_HEADER))
            return
        if get(proto.TYPE_HEADER) == "gap_too_old":
            notice = proto.read_gap(body)
            if notice is None:
                self._untrusted("an unreadable gap_too_old")
            else:
                self.sink(ev.TooOld(notice.since, notice.earliest))
            return
        prev_text = get(proto.PREV_HEADER) or ""
        prev = int(prev_text) if prev_text.isascii() and prev_text.isdigit() else None
        self.sink(
            ev.Message(
                payload=body,
                signature=get(proto.PUBLISHER_SIGNATURE_HEADER),
                prev=prev,
            )
        )

    def _on_framework(self, body: bytes, kind: str | None) -> None:
        """A framework topic's POST: a ``Framework`` event, or a line in the log."""
        if kind == "gap_too_old":
            log.info("%s: some framework notifications are beyond the hub's log", self.collection)
            return
        try:
            notification = framework.decode(body)
        except InvalidNotification as exc:
            self._untrusted(f"an unreadable framework notification: {exc}")
            return
        self.sink(ev.Framework(notification))

    def _untrusted(self, reason: str) -> None:
        """Report an untrusted POST to the engine, at most once per :data:`INVALID_INTERVAL`.

        On a framework channel it is only logged (at most as often): losing a
        framework notification loses no change, so it is never a catch-up.
        """
        if self.untrusted.allow(time.monotonic()):
            if self.framework:
                log.warning("%s: ignored on the framework channel: %s", self.collection, reason)
            else:
                self.sink(ev.Invalid(reason))
        elif self.untrusted.dropped in (1, 100) or self.untrusted.dropped % 1000 == 0:
            log.warning(
                "%s: %d untrusted WebSub POST(s) ignored (one catch-up per %gs)",
                self.collection,
                self.untrusted.dropped,
                INVALID_INTERVAL,
            )

    # -- our requests -------------------------------------------------------------------

    async def _subscribe(self, http: aiohttp.ClientSession) -> int:
        """Subscribe (or renew) and wait for the verification; returns the granted lease."""
        form = {
            "hub.mode": "subscribe",
            "hub.topic": self.topic,
            "hub.callback": self.callback,
            "hub.secret": self.secret.decode(),
        }
        if self.lease_seconds:
            form["hub.lease_seconds"] = str(self.lease_seconds)
        self._verified.clear()
        self._intent = "subscribe"
        try:
            async with http.post(self.hub, data=form) as response:
                text = await response.text()
                if response.status != 202 and not 200 <= response.status < 300:
                    raise RsNotifyError(f"hub answered {response.status}: {text.strip()[:200]}")
            async with asyncio.timeout(VERIFY_TIMEOUT):
                await self._verified.wait()
        finally:
            self._intent = None
        return self.granted or self.lease_seconds or 600

    async def _subscription_loop(self, http: aiohttp.ClientSession) -> None:
        backoff = Backoff(initial=0.5, maximum=30.0)
        while True:
            try:
                lease = await self._subscribe(http)
            except (aiohttp.ClientError, TimeoutError, OSError, RsNotifyError) as exc:
                self.first_attempt.set()
                delay = backoff.next()
                log.warning(
                    "%s: subscribing at %s failed (%s); retrying in %.1fs",
                    self.collection,
                    self.hub,
                    exc or type(exc).__name__,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            what = "subscribed to framework notifications" if self.framework else "subscribed"
            log.info("%s: %s at %s (lease %ds)", self.collection, what, self.hub, lease)
            now = time.monotonic()
            # A renewal within the lease keeps the subscription (and what the hub
            # sent meanwhile was delivered); a first one, or one after the lease
            # ran out, starts from now.
            kept = self._lease_ends is not None and now < self._lease_ends
            self._lease_ends = now + lease
            if not self.framework:  # the change channel's (re)connection is the engine's cue
                self.sink(ev.Connected(session_present=kept, at=now))
            self.first_attempt.set()
            await asyncio.sleep(max(0.5, lease * RENEW_AT))

    async def _heartbeat_loop(self, http: aiohttp.ClientSession) -> None:
        while True:
            try:
                async with http.head(self.topic) as response:
                    head = response.headers.get(proto.HEAD_HEADER, "")
                    if response.status == 200 and head.isdigit():
                        earliest = response.headers.get(proto.EARLIEST_HEADER, "")
                        beat = response.headers.get(proto.HEARTBEAT_HEADER)
                        self.sink(
                            ev.Head(
                                head=int(head),
                                earliest=int(earliest) if earliest.isdigit() else None,
                                heartbeat=w3cdt.parse(beat) if beat else None,
                            )
                        )
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError, TypeError):
                pass  # silence is what the engine's heartbeat timeout is for
            except RsNotifyError:
                pass
            await asyncio.sleep(self.heartbeat)

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            if self.framework:  # no heartbeat: the framework stream's head means nothing here
                await self._subscription_loop(http)
            else:
                await asyncio.gather(self._subscription_loop(http), self._heartbeat_loop(http))

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._start_and_run()))

    async def _start_and_run(self) -> None:
        backoff = Backoff(initial=0.5, maximum=10.0)
        while True:
            try:
                await self.server.start()
                break
            except OSError as exc:
                delay = backoff.next()
                log.warning(
                    "cannot listen for WebSub callbacks (%s); retrying in %.1fs", exc, delay
                )
                await asyncio.sleep(delay)
        await self.run()

    async def stop(self) -> None:
        """Stop renewing (the hub keeps the subscription until its lease ends)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.server.channels.pop(self.key, None)
        if not self.server.channels:
            await self.server.stop()
