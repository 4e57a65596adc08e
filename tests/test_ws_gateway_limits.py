"""Issue 22, item 3: what one WebSocket client may take from the gateway, and getting it back.

Finding: one client without a token took all 10,000 connections (the 10,001st
got 503), and the publisher's RSS went from 145 to 290 MB and stayed at
~297 MB after they closed.  Now each client address holds at most
``max_per_address`` connections (HTTP 429 beyond), and after many closes the
gateway has the publisher release memory (:func:`rsnotify.runtime.release_memory`).
The 10,000-connection figures are in ``bench/ws_connections.py``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import psutil
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.transport.ws import WebSocketGateway, address_key
from tests.devstack import ManagedProcess, async_wait_for
from tests.helpers import running_simulator

CAP = "http://example.com/c1/capabilitylist.xml"
COLLECTION = "c1"


def test_an_address_is_a_host_an_ipv6_host_is_its_slash_64() -> None:
    assert address_key("192.0.2.7") == "192.0.2.7"
    assert address_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert address_key("2001:db8:1:2::1") == address_key("2001:db8:1:2:ffff::9")
    assert address_key("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("fe80::1%eth0") == "fe80::/64"


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[WebSocketGateway]:
    log = SQLiteLog(tmp_path / "log.sqlite3")
    await log.register(COLLECTION, CAP)
    gateway = WebSocketGateway(log, max_per_address=3, max_clients=100)
    await gateway.start()
    yield gateway
    await gateway.stop()
    await log.close()


async def _open(gateway: WebSocketGateway, source: str = "127.0.0.1") -> ClientConnection:
    ws = await connect(
        f"ws://127.0.0.1:{gateway.port}/{COLLECTION}", local_addr=(source, 0), ping_interval=None
    )
    await ws.recv()  # hello: the subscription is live
    return ws


async def test_one_address_cannot_take_every_slot(gateway: WebSocketGateway) -> None:
    # A burst of simultaneous handshakes from one address: three get in, not more.
    outcomes = await asyncio.gather(*(_open(gateway) for _ in range(10)), return_exceptions=True)
    held = [o for o in outcomes if isinstance(o, ClientConnection)]
    refused = [o for o in outcomes if isinstance(o, InvalidStatus)]
    assert len(held) == 3 and len(refused) == 7, outcomes
    assert {r.response.status_code for r in refused} == {429}
    assert gateway.connections_from("127.0.0.1") == 3
    # Everyone else still gets in.
    other = await _open(gateway, source="127.0.0.2")
    assert gateway.clients == 4
    # A slot comes back when its connection is gone.
    await held[0].close()
    await async_wait_for(lambda: gateway.connections_from("127.0.0.1") == 2, timeout=10)
    held[0] = await _open(gateway)
    for ws in [*held, other]:
        await ws.close()
    await async_wait_for(lambda: gateway.clients == 0, timeout=10)
    assert gateway.connections_from("127.0.0.1") == 0


def _rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 1e6


async def _wave(url: str, count: int) -> list[ClientConnection]:
    slots = asyncio.Semaphore(100)

    async def one() -> ClientConnection:
        async with slots:
            return await connect(url, ping_interval=None, open_timeout=30)

    return list(await asyncio.gather(*(one() for _ in range(count))))


async def test_memory_comes_back_after_a_thousand_connections_close(
    tmp_path: Path, rsnotify_process: Callable[..., ManagedProcess]
) -> None:
    """RSS before, during and after two waves of 1,000 connections from one address.

    The publisher runs with ``PYTHONMALLOC=malloc``, as the README advises for a
    gateway facing many clients: CPython's own small-object allocator keeps
    freed memory in partly used arenas that nothing can hand back (the bench
    shows both).  Without the release (collect the cycles each closed asyncio
    transport leaves, then ``malloc_trim``) the memory stayed held.
    """
    async with running_simulator() as (_sim, base):
        publisher = rsnotify_process(
            "publish",
            base,
            "--state-dir",
            tmp_path / "state",
            "--ws",
            "127.0.0.1:0",
            "--ws-max-per-address",
            "0",
            "--log-level",
            "warning",
            env={"PYTHONMALLOC": "malloc"},
        )
        await asyncio.to_thread(publisher.wait_for_line, r"rsnotify publish: running", 30)
        output = publisher.output()
        port = re.search(r"ws://127\.0\.0\.1:(\d+)/", output)
        collection = re.search(r"rsnotify publish: collection (\S+) ", output)
        assert port and collection, output
        url = f"ws://127.0.0.1:{port[1]}/{collection[1]}"
        before = _rss_mb(publisher.pid)
        figures: list[tuple[float, float]] = []
        for _ in range(2):
            clients = await _wave(url, 1_000)
            during = _rss_mb(publisher.pid)
            grown = during - before
            assert grown > 5, (before, during)  # the connections really cost memory
            await asyncio.gather(*(ws.close() for ws in clients))
            del clients
            target = before + 0.5 * grown  # at least half of the growth given back
            await async_wait_for(lambda t=target: _rss_mb(publisher.pid) < t, timeout=20)
            figures.append((during, _rss_mb(publisher.pid)))
        print(f"RSS MB: before {before:.1f}; (during, after) per wave: {figures}")
        assert figures[1][0] < figures[0][0] * 1.1  # the second wave reuses, not adds
