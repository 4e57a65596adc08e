"""``rsnotify simulate --ping URL``: tell a hub "I just wrote my Change List".

After each batch of changes the simulator POSTs the widespread WebSub publish
ping, ``hub.mode=publish`` with ``hub.url`` = the Capability List of each
collection that changed, to every ``--ping`` URL (``rsnotify publish
--websub HOST:PORT`` takes it at its hub URL and reads the Change Lists at
once: detection then takes a round trip instead of a poll interval).  With
``--ping-secret`` the body is signed like a WebSub delivery,
``X-Hub-Signature: sha256=<HMAC-SHA256 of the body>``, which a publisher
started with the same ``--secret`` requires.

One ping is in flight at a time; collections that change meanwhile are
gathered into the next round, so a Source changing 1,000 times a second
sends a few pings per round trip, not 1,000.  A failed ping is counted
(``/_simulator/stats``) and not retried: the publisher's poll is the
fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
from collections.abc import Iterable, Sequence
from urllib.parse import urlencode

import aiohttp

log = logging.getLogger("rsnotify.simulate")


class Pinger:
    """Publish pings to hubs, coalesced, one round in flight."""

    def __init__(self, urls: Sequence[str], secret: bytes | None = None) -> None:
        self.urls = list(urls)
        self.secret = secret
        self.sent = 0
        self.failed = 0
        self._dirty: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None

    def changed(self, capability_lists: Iterable[str]) -> None:
        """These collections changed: ping soon (never blocks)."""
        self._dirty.update(capability_lists)
        if self._dirty and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        while self._dirty:
            batch, self._dirty = sorted(self._dirty), set()
            requests = [self._ping(hub, url) for hub in self.urls for url in batch]
            await asyncio.gather(*requests)

    async def _ping(self, hub: str, url: str) -> None:
        assert self._http is not None
        body = urlencode({"hub.mode": "publish", "hub.url": url}).encode()
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if self.secret is not None:
            digest = hmac.new(self.secret, body, hashlib.sha256).hexdigest()
            headers["X-Hub-Signature"] = f"sha256={digest}"
        try:
            async with self._http.post(hub, data=body, headers=headers) as response:
                await response.read()
                ok = 200 <= response.status < 300
        except (aiohttp.ClientError, TimeoutError, OSError):
            ok = False
        if ok:
            self.sent += 1
        else:
            self.failed += 1
            if self.failed in (1, 10) or self.failed % 1000 == 0:
                log.warning("publish ping to %s failed (%d so far)", hub, self.failed)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._http is not None:
            await self._http.close()
            self._http = None
