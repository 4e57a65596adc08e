"""bench.ws_fanout's two clients, ``bench/wsclients.c`` and ``bench/wsclients.py``, count alike.

The fan-out figures of issue 21 come from whichever client ran
(:mod:`bench.wsclients_c` picks), so both must report the same thing for
the same frames.  Here both run side by side against one real gateway over
a real Redis log, started as ``bench.ws_fanout`` starts it, with a keepalive
ping every 0.2 s: each process's clients connect directly, and the same
again through a relay that loses one notification frame on every
connection -- the break that ``prev`` continuity must catch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bench import ws_fanout, wsclients_c
from bench._common import REPO_ROOT
from bench.wsclients import BUCKET_NS
from rsnotify.collection import collection_id
from rsnotify.log.redis_log import RedisLog
from rsnotify.transport.ws import WebSocketGateway
from tests.devstack import Redis, async_wait_for

pytestmark = pytest.mark.skipif(
    wsclients_c.compiler() is None,
    reason="no C compiler ($CC, cc or gcc): bench/wsclients.c cannot be built here",
)

COLLECTION = collection_id(ws_fanout.CAP)
CLIENTS = 5  # per process
RECORDS = 40
UNRENDERABLE = 10  # the 10th record
DROPPED = 20  # the relay loses the 20th
IMPLEMENTATIONS = ("c", "python")


class LossyLink:
    """A TCP relay to the gateway that loses the notification frame of seq ``drop``.

    The handshake passes unchanged; from the gateway on, frames are read
    whole (RFC 6455 5.2; a server's are unmasked) and passed on, except that
    one.  Client bytes (handshake, pongs) pass unchanged.
    """

    def __init__(self, gateway_port: int, drop: int) -> None:
        self.gateway_port = gateway_port
        self.marker = b'{"type":"notification","collection":"%s","seq":%d,' % (
            COLLECTION.encode(),
            drop,
        )
        self.tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[LossyLink]:
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.gateway_port)
        for task in (self._copy(reader, up_writer), self._frames(up_reader, writer)):
            self.tasks.add(asyncio.create_task(task))

    async def _copy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.closing(writer):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()

    async def _frames(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.closing(writer):
            writer.write(await reader.readuntil(b"\r\n\r\n"))
            while True:
                head = await reader.readexactly(2)
                length = head[1] & 0x7F
                extended = {126: 2, 127: 8}.get(length, 0)
                if extended:
                    more = await reader.readexactly(extended)
                    head, length = head + more, int.from_bytes(more, "big")
                payload = await reader.readexactly(length)
                if not payload.startswith(self.marker):
                    writer.write(head + payload)
                    await writer.drain()


async def _when_done(child: ws_fanout._Process) -> dict[str, Any] | None:
    """The process's raw counts if each of its clients has the last seq, else None."""
    stats = await child.ask("stats")
    return stats if stats["done"] == CLIENTS else None


def _values(histogram: dict[str, int]) -> list[int]:
    """A histogram's buckets, one per frame, sorted."""
    return sorted(int(bucket) for bucket, n in histogram.items() for _ in range(n))


def _counts(stats: dict[str, Any]) -> dict[str, Any]:
    keys = ("connected", "notifications", "skipped", "breaks", "closed", "unstamped", "done")
    out = {key: stats[key] for key in keys}
    for name in ("histogram", "read_histogram", "to_gateway", "fan_out"):
        out[name] = sum(stats[name].values())
    return out


async def test_c_and_python_clients_count_alike_and_catch_a_lost_frame(
    redis_server: Redis,
) -> None:
    log = RedisLog(redis_server.url)
    await log.register(COLLECTION, ws_fanout.CAP)
    gateway = WebSocketGateway(log, max_per_address=0, ping_interval=0.2, ping_timeout=10.0)
    await gateway.start()
    head = await log.head(COLLECTION)
    children: dict[tuple[str, str], ws_fanout._Process] = {}
    try:
        async with LossyLink(gateway.port, drop=head + DROPPED).running() as link:
            for implementation in IMPLEMENTATIONS:
                ran, command = wsclients_c.command(implementation)
                assert ran == implementation
                for route, port in (("direct", gateway.port), ("lossy", link.port)):
                    proc = await asyncio.create_subprocess_exec(
                        *command, str(port), COLLECTION, str(CLIENTS), cwd=REPO_ROOT,
                        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                        limit=2**24,
                    )  # fmt: skip
                    children[implementation, route] = ws_fanout._Process(proc)
            opened = {key: await child.ask("open", 60) for key, child in children.items()}
            for key, reply in opened.items():
                assert (reply["opened"], reply["failed"]) == (CLIENTS, []), key
            # Pings answered: every connection's keepalive has had its pong.
            await async_wait_for(
                lambda: (
                    len(gateway._connections) == len(children) * CLIENTS
                    and all(ws.latency > 0 for ws in gateway._connections)
                ),
                timeout=30,
                message="a client did not answer the gateway's ping",
            )
            await ws_fanout._reset(list(children.values()), head + 1)
            # The target first: a client notes the read that brought it there.
            await asyncio.gather(*(c.ask(f"target {head + RECORDS}") for c in children.values()))
            for seq in range(head + 1, head + RECORDS + 1):
                # One record the gateway cannot render (no "loc"): a skipped frame.
                unrenderable = seq == head + UNRENDERABLE
                payload = (
                    b'{"seq":%d}' % seq if unrenderable else ws_fanout._envelope(COLLECTION, seq)
                )
                await log.append(COLLECTION, [payload], expected_head=seq - 1, checkpoint=str(seq))
            stats = {
                key: await async_wait_for(lambda child=child: _when_done(child), timeout=30)
                for key, child in children.items()
            }
    finally:
        for child in children.values():
            await child.end()
        await gateway.stop()
        await log.close()

    sent = RECORDS - 1  # notification frames
    whole = {"connected": CLIENTS, "notifications": sent * CLIENTS, "skipped": CLIENTS,
             "breaks": 0, "closed": 0, "unstamped": 0, "done": CLIENTS,
             "histogram": sent * CLIENTS, "read_histogram": sent * CLIENTS,
             "to_gateway": sent, "fan_out": sent}  # fmt: skip
    lost = (sent - 1) * CLIENTS
    one_lost = whole | {"notifications": lost, "breaks": CLIENTS, "histogram": lost,
                        "read_histogram": lost, "to_gateway": sent - 1,
                        "fan_out": sent - 1}  # fmt: skip
    for implementation in IMPLEMENTATIONS:
        assert _counts(stats[implementation, "direct"]) == whole, implementation
        assert _counts(stats[implementation, "lossy"]) == one_lost, implementation
        for route in ("direct", "lossy"):
            s = stats[implementation, route]
            # Every frame is read after it arrived; the stamps are seconds, not years, apart.
            read, arrival = _values(s["read_histogram"]), _values(s["histogram"])
            assert all(r >= a for r, a in zip(read, arrival, strict=True)), (implementation, route)
            assert read[-1] * BUCKET_NS < 10e9
            assert max(_values(s["to_gateway"]) + _values(s["fan_out"])) * BUCKET_NS < 10e9
    # Both sampled clients read the same records' send time and `published`
    # stamp: the same split to within a bucket (Python goes through a float).
    for route in ("direct", "lossy"):
        c, python = (_values(stats[i, route]["to_gateway"]) for i in IMPLEMENTATIONS)
        assert all(abs(a - b) <= 1 for a, b in zip(c, python, strict=True)), route
