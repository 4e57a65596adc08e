"""Hand a collection's notifications to a WebSub hub that someone else runs.

``rsnotify publish --websub HOST:PORT --websub-hub URL`` keeps serving the
topics (their URLs, ``GET``/``HEAD`` answers and Capability List entries
stay on this publisher: Change Notification 1.0.1 section 4.1 makes the
topic the Source's) and gives the notifications to the hub at ``URL``, in
order and without loss, from a durable cursor in the log (the named log
cursor ``websub-hub:<digest of URL>``), so a publisher restart or a leader
change resumes where the last one stopped.  While the hub is down the same
notification is retried with exponential backoff and jitter; what the log
logs meanwhile is grouped into the next notifications (at most
:data:`~.websubproto.MAX_BATCH_CHANGES` changes each).  Two ways, as hubs
differ:

``post`` (section 4.1, the default)
    ``POST`` the Change Notification to the hub, ``Content-Type:
    application/xml``, ``Link: <topic>; rel="self", <hub>; rel="hub"``; a
    200 (any 2xx) moves the cursor on.

``ping`` (the widespread ``hub.mode=publish``, for hubs that fetch the topic)
    The notification waits at the topic: the next ``GET`` of the topic
    returns it (:attr:`.websub.WebSubHub.handoff`), and the publisher pings
    the hub (``hub.mode=publish``, ``hub.url`` and ``hub.topic`` = the
    topic).  Only when the hub has fetched it does the cursor move on and
    the next notification (everything logged meanwhile) wait in its place,
    so a hub that fetches late still gets every change, in order: nothing
    it fetches replaces what it has not fetched yet.  A ping the hub
    accepted but never acted on is repeated after ``fetch_timeout``.  What
    the hub does after fetching is its own business (flask-websub retries a
    failed delivery later, out of order, and gives up after ten tries); a
    Destination then sees the loss in the interval chain -- the next
    ``from`` is later than the last ``until`` it got -- and catches up from
    the Change List Index.  One caveat: any ``GET`` of the topic takes the
    waiting notification, so rsnotify Destinations poll topics with
    ``HEAD``; a third party's GET costs the hub's subscribers one
    notification, which the same interval chain reveals.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable, Mapping

import aiohttp

from .. import outbound
from ..backoff import Backoff
from ..cancellation import raise_if_cancelled
from ..log import LogUnavailable, NotificationLog
from . import websubproto as proto
from .websubguard import quote

logger = logging.getLogger(__name__)

MODES = ("post", "ping")
WAIT_TIMEOUT = 2.0


def cursor_name(hub_url: str) -> str:
    """The log cursor of one external hub."""
    return "websub-hub:" + hashlib.sha256(hub_url.encode()).hexdigest()[:16]


class _Handoff:
    """Ping mode: the notification waiting at a topic for the hub's GET."""

    def __init__(self) -> None:
        self.body: bytes | None = None
        self.fetched = asyncio.Event()

    def take(self) -> bytes | None:
        body, self.body = self.body, None
        if body is not None:
            self.fetched.set()
        return body


class HubPusher:
    """Gives every notification of some collections to one WebSub hub, in order."""

    def __init__(
        self,
        log: NotificationLog,
        *,
        hub_url: str,
        topics: Callable[[str], str],
        capability_lists: Mapping[str, str],
        mode: str = "post",
        secret: bytes | None = None,
        signer: outbound.Signer | None = None,
        handoff: dict[str, Callable[[], bytes | None]] | None = None,
        backoff_max: float = 30.0,
        fetch_timeout: float = 10.0,
        timeout: float = 10.0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"--websub-hub-mode must be one of {', '.join(MODES)}")
        if mode == "ping" and handoff is None:
            raise ValueError("ping mode needs the topic server's hand-off table")
        self.log = log
        self.hub_url = hub_url
        self.topics = topics
        self.capability_lists = dict(capability_lists)
        self.mode = mode
        self.secret = secret
        self.signer = signer
        self.handoff = handoff
        self.backoff_max = backoff_max
        self.fetch_timeout = fetch_timeout
        self.timeout = timeout
        self.cursor_name = cursor_name(hub_url)
        self.delivered: dict[str, int] = {}  # changes handed over, per collection
        self.notifications: dict[str, int] = {}  # notifications handed over, per collection
        self._collections: list[str] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._http: aiohttp.ClientSession | None = None

    def add_collection(self, collection: str) -> None:
        self._collections.append(collection)
        if self._http is not None:
            self._tasks.append(asyncio.create_task(self._push(collection)))

    async def run(self) -> None:
        """Push until cancelled."""
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout, sock_connect=min(5.0, self.timeout))
        )
        try:
            self._tasks = [asyncio.create_task(self._push(c)) for c in self._collections]
            await asyncio.gather(*self._tasks)
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self.handoff is not None:
                for collection in self._collections:
                    self.handoff.pop(collection, None)
            await self._http.close()
            self._http = None

    # -- one collection ----------------------------------------------------------------

    async def _push(self, collection: str) -> None:
        backoff = Backoff(initial=0.2, maximum=self.backoff_max)
        cursor: int | None = None
        spot = _Handoff()
        if self.handoff is not None:
            self.handoff[collection] = spot.take
        while True:
            raise_if_cancelled()
            try:
                if cursor is None:
                    cursor = await self.log.cursor(collection, self.cursor_name)
                records = await self.log.wait(
                    collection, cursor, timeout=WAIT_TIMEOUT, limit=proto.MAX_BATCH_CHANGES
                )
            except LogUnavailable as exc:
                await self._pause(backoff, f"{collection}: cannot read the log: {exc}")
                continue
            if not records:
                continue
            if records[0].seq != cursor + 1:
                logger.warning(
                    "%s: seqs %d..%d left the log before the hub got them; Destinations "
                    "see the gap in the interval chain",
                    collection,
                    cursor + 1,
                    records[0].seq - 1,
                )
            items = [proto.render_change(collection, r) for r in records]
            batch = proto.take_batch(items)
            if not batch:  # an unrenderable record: skip it (the interval chain shows it)
                cursor = items[0].seq
                continue
            body = proto.compose_batch(
                batch,
                capabilitylist=self.capability_lists.get(collection, ""),
                collection=collection,
            )
            await self._hand_over(collection, body, spot, backoff)
            cursor = batch[-1].seq
            self.delivered[collection] = self.delivered.get(collection, 0) + len(batch)
            self.notifications[collection] = self.notifications.get(collection, 0) + 1
            with contextlib.suppress(LogUnavailable):  # resent after a restart at worst
                await self.log.set_cursor(collection, self.cursor_name, cursor)

    async def _hand_over(
        self, collection: str, body: bytes, spot: _Handoff, backoff: Backoff
    ) -> None:
        """Until the hub has it: POST it, or ping and wait for the fetch."""
        topic = self.topics(collection)
        if self.mode == "ping":
            spot.fetched.clear()
            spot.body = body
        while True:
            raise_if_cancelled()
            if self.mode == "post":
                error = await self._send(collection, topic, body, "application/xml", sign=True)
                if error is None:
                    backoff.reset()
                    return
            else:
                form = aiohttp.FormData(
                    {"hub.mode": "publish", "hub.url": topic, "hub.topic": topic}
                )
                error = await self._send(collection, topic, form, None, sign=False)
                if error is None:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.fetch_timeout):
                            await spot.fetched.wait()
                    if spot.fetched.is_set():
                        backoff.reset()
                        return
                    error = f"the hub did not fetch {topic} within {self.fetch_timeout:g}s"
            await self._pause(
                backoff, f"{collection}: handing a notification to {quote(self.hub_url)}: {error}"
            )

    async def _send(
        self,
        collection: str,
        topic: str,
        data: bytes | aiohttp.FormData,
        content_type: str | None,
        *,
        sign: bool,
    ) -> str | None:
        """One request to the hub; None on a 2xx, else what went wrong."""
        assert self._http is not None
        headers = {
            "Link": proto.link_header(
                topic, self.hub_url, resourcesync=self.capability_lists.get(collection)
            )
        }
        if content_type is not None:
            headers["Content-Type"] = content_type
        if sign and isinstance(data, bytes):
            if self.secret is not None:
                headers[proto.SIGNATURE_HEADER] = proto.signature(data, self.secret)
            if self.signer is not None:
                headers[proto.PUBLISHER_SIGNATURE_HEADER] = self.signer.sign(data)
        try:
            async with self._http.post(
                self.hub_url, data=data, headers=headers, allow_redirects=False
            ) as response:
                text = (await response.content.read(300)).decode("utf-8", "replace")
                if 200 <= response.status < 300:
                    return None
                return f"HTTP {response.status} {quote(text.strip(), 200)}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"

    async def _pause(self, backoff: Backoff, message: str) -> None:
        delay = backoff.next()
        if backoff.attempts in (1, 5) or backoff.attempts % 20 == 0:
            logger.warning("%s (%d in a row); retrying in %.1fs", message, backoff.attempts, delay)
        await asyncio.sleep(delay)


__all__ = ["MODES", "HubPusher", "cursor_name"]
