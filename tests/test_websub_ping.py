"""Issue 16 item 5: "I just wrote my Change List" -- a Source's ping makes the publisher read now.

``rsnotify simulate --ping HUB --ping-secret S`` POSTs a signed
``hub.mode=publish`` after each batch of changes; ``rsnotify publish
--websub --secret S --poll 60`` reads the Change Lists when pinged.  With a
60 s poll, a change that reaches the hub's topic within 10 s can only have
been found through the ping.  A ping without the secret is refused and
reads nothing.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from tests.devstack import ManagedProcess, async_wait_for, free_port
from tests.test_websub import http_json, start_publisher, start_simulator

RunRsnotify = Callable[..., ManagedProcess]
SECRET = "ping-secret"


def head_of(topic: str) -> int:
    request = urllib.request.Request(topic, method="HEAD")
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.headers["X-RsNotify-Head"])


def unsigned_ping(hub: str, url: str) -> int:
    form = urllib.parse.urlencode({"hub.mode": "publish", "hub.url": url}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(hub, data=form), timeout=10) as r:
            status: int = r.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code


async def test_a_signed_ping_makes_the_publisher_read_at_once(
    rsnotify_process: RunRsnotify,
) -> None:
    port = free_port()
    hub = f"http://127.0.0.1:{port}/"
    source = await start_simulator(
        rsnotify_process, "--rate", "0", "--ping", hub, "--ping-secret", SECRET
    )
    publisher = rsnotify_process(
        "publish", source, "--websub", f"127.0.0.1:{port}", "--secret", SECRET, "--poll", "60",
        name="publish", start=False,
    )  # fmt: skip
    ((collection, capability_list),) = (await start_publisher(publisher)).items()
    topic = hub + collection
    assert await asyncio.to_thread(head_of, topic) == 0
    # Unsigned: refused (403), and nothing is read (the Source has no change anyway).
    assert await asyncio.to_thread(unsigned_ping, hub, capability_list) == 403

    await asyncio.to_thread(http_json, source + "_simulator/advance?n=3", b"")
    await async_wait_for(
        lambda: asyncio.to_thread(lambda: head_of(topic) == 3),
        10,
        interval=0.05,
        message="the ping did not make the publisher read (the next poll is 60 s away)",
    )
    stats = await asyncio.to_thread(http_json, source + "_simulator/stats")
    assert stats["pings"]["sent"] >= 1 and stats["pings"]["failed"] == 0
