"""Many WebSocket subscribers in one process, cheap enough to measure the gateway, not themselves.

``python -m bench.wsclients PORT COLLECTION COUNT`` (started by
:mod:`bench.ws_fanout`): each client is a raw asyncio protocol -- the
RFC 6455 opening handshake, then frame headers (a server's frames are never
masked, section 5.1) -- that reads what the bench needs from fixed places in
each notification frame: ``seq`` and ``prev`` (continuity: a ``prev`` that
is not the last seq is a *break*) and the send time the appender wrote into
the ``loc`` (``?t=<ns>``), so latency is arrival minus send, on this
machine's clock.  Hello, skipped and heartbeat frames are parsed in full.
Pings get a pong, so the gateway's keepalive runs as in production.  With
``websockets``' client (every frame parsed, UTF-8 checked, queued and
awaited) 200,000 frames/s would need more cores than the gateway does.
(``tests/chaos/wspool.py`` is the soak's pool: full clients that reconnect.)

The first client of the process also splits its latency at the gateway's
``published`` stamp (when the gateway rendered the record): log and
gateway wake-up before it, fan-out and the client after.

Commands on stdin, one JSON line in reply on stdout: ``open`` (connect all,
wait for every hello), ``reset FIRST`` (count notifications from seq FIRST
on), ``target T`` (note when each client has seq T), ``stats``, ``quit``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
from datetime import UTC, datetime
from typing import Any

CONNECT_SLOTS = 100  # handshakes in flight
BUCKET_NS = 100_000  # latency histograms: 0.1 ms buckets
_PUBLISHED = b'published\\":\\"'  # the gateway's stamp, inside the JSON-escaped payload


class _Pool:
    """One process's clients and what they counted since the last ``reset``."""

    def __init__(self, collection: str) -> None:
        self.prefix = b'{"type":"notification","collection":%s,"seq":' % json.dumps(
            collection
        ).encode("ascii")
        self.clients: list[_Subscriber] = []
        self.target = 0
        self.made = 0  # subscribers constructed
        self.reset(0)

    def reset(self, first: int) -> None:
        """Count from seq ``first`` on (frames of earlier seqs may still be in flight)."""
        self.first = first
        self.notifications = self.skipped = self.breaks = self.closed = 0
        self.histogram: dict[int, int] = {}  # append -> arrival, every client
        # The first client of each process splits its latency at the gateway's
        # "published" stamp (when it rendered the record): log, then fan-out.
        self.to_gateway: dict[int, int] = {}
        self.fan_out: dict[int, int] = {}

    def stats(self) -> dict[str, Any]:
        done = [c.reached_at for c in self.clients if c.reached_at]
        return {
            "connected": sum(1 for c in self.clients if c.open and not c.lost),
            "notifications": self.notifications,
            "skipped": self.skipped,
            "breaks": self.breaks,
            "closed": self.closed,
            "done": len(done),
            "done_at": max(done, default=None),
            "histogram": self.histogram,
            "to_gateway": self.to_gateway,
            "fan_out": self.fan_out,
        }


class _Subscriber(asyncio.Protocol):
    """A WebSocket client reduced to what the bench reads (RFC 6455 framing, no extensions)."""

    def __init__(self, pool: _Pool, path: str, opened: asyncio.Future[None]) -> None:
        self.pool, self.path, self.opened = pool, path, opened
        self.transport: asyncio.Transport | None = None
        self.pending = b""
        self.open = self.lost = False
        self.last = -1  # last seq accounted for (hello.head, then prev/seq/skipped)
        self.reached_at = 0.0
        self.sampled = not pool.made  # the first one made (handshakes run 100 at a time)
        pool.made += 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        key = base64.b64encode(os.urandom(16)).decode()
        transport.write(
            f"GET {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pool.closed += 1
        if not self.opened.done():
            self.opened.set_exception(ConnectionError("closed during the handshake"))

    def data_received(self, data: bytes) -> None:
        buf = self.pending + data if self.pending else data
        if not self.open:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.pending = buf
                return
            if b" 101 " not in buf[: buf.find(b"\r\n")]:
                self.opened.set_exception(ConnectionError(buf[:80].decode(errors="replace")))
                assert self.transport is not None
                self.transport.close()
                return
            self.open, buf = True, buf[end + 4 :]
        now = time.time_ns()
        pos, size = 0, len(buf)
        while size - pos >= 2:
            length, head = buf[pos + 1] & 0x7F, 2
            if length == 126:
                length, head = int.from_bytes(buf[pos + 2 : pos + 4], "big"), 4
            elif length == 127:
                length, head = int.from_bytes(buf[pos + 2 : pos + 10], "big"), 10
            if size - pos < head + length:
                break
            opcode = buf[pos] & 0x0F
            payload = buf[pos + head : pos + head + length]
            pos += head + length
            if opcode == 1:
                self._text(payload, now)
            elif opcode == 9:  # ping: a masked pong with the same payload (mask 0 is a mask)
                assert self.transport is not None
                self.transport.write(bytes([0x8A, 0x80 | len(payload), 0, 0, 0, 0]) + payload)
        self.pending = buf[pos:]

    def _text(self, payload: bytes, now: int) -> None:
        pool = self.pool
        if payload.startswith(pool.prefix):
            start = len(pool.prefix)
            comma = payload.index(b",", start)
            seq = int(payload[start:comma])
            prev = int(payload[comma + 8 : payload.index(b",", comma + 8)])  # ,"prev":
            if prev != self.last:
                pool.breaks += 1
            self.last = seq
            if seq < pool.first:
                return
            pool.notifications += 1
            mark = payload.find(b"?t=")
            if mark > 0:
                sent = int(payload[mark + 3 : payload.index(b"\\", mark)])
                _count(pool.histogram, now - sent)
                if self.sampled:
                    stamp = payload.find(_PUBLISHED) + len(_PUBLISHED)
                    text = payload[stamp : payload.index(b"Z", stamp)].decode()
                    published = datetime.fromisoformat(text)
                    published_ns = int(published.replace(tzinfo=UTC).timestamp() * 1e9)
                    _count(pool.to_gateway, published_ns - sent)
                    _count(pool.fan_out, now - published_ns)
        else:  # hello, skipped, heartbeat: rare, so parsed in full
            frame = json.loads(payload)
            if frame["type"] == "skipped":
                pool.skipped += frame["resume"] - frame["from"]
                self.last = frame["resume"] - 1
            elif frame["type"] == "hello":
                self.last = frame["head"]
                if not self.opened.done():
                    self.opened.set_result(None)
        if pool.target and self.last >= pool.target and not self.reached_at:
            self.reached_at = now / 1e9


def _count(histogram: dict[int, int], ns: int) -> None:
    bucket = max(0, ns) // BUCKET_NS
    histogram[bucket] = histogram.get(bucket, 0) + 1


def percentiles(histogram: dict[int, int]) -> dict[str, float | None]:
    """p50, p90, p99 and max in ms (bucket upper bounds) of a histogram of BUCKET_NS buckets."""
    total = sum(histogram.values())

    def at(q: float) -> float | None:
        seen = 0
        for bucket in sorted(histogram):
            seen += histogram[bucket]
            if seen >= q * total:
                return (bucket + 1) * BUCKET_NS / 1e6
        return None

    return {"n": total, "p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": at(1.0)}


async def _clients_main(port: int, collection: str, count: int) -> None:
    """Open ``count`` subscriptions on ``open``; answer ``reset``, ``target T``, ``stats``."""
    loop = asyncio.get_running_loop()
    pool = _Pool(collection)
    slots = asyncio.Semaphore(CONNECT_SLOTS)

    async def one() -> None:
        async with slots:
            opened: asyncio.Future[None] = loop.create_future()
            factory = lambda: _Subscriber(pool, f"/{collection}", opened)  # noqa: E731
            _, client = await loop.create_connection(factory, "127.0.0.1", port)
            pool.clients.append(client)
            async with asyncio.timeout(60):
                await opened

    while True:
        command = (await loop.run_in_executor(None, sys.stdin.readline)).split()
        if not command or command[0] == "quit":
            return
        reply: dict[str, Any] = {"ok": True}
        if command[0] == "open":
            started = time.perf_counter()
            outcomes = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
            failed = sorted({repr(o)[:80] for o in outcomes if isinstance(o, BaseException)})
            reply = {"opened": count - len(failed), "failed": failed,
                     "seconds": time.perf_counter() - started}  # fmt: skip
        elif command[0] == "reset":
            pool.reset(int(command[1]))
        elif command[0] == "target":
            pool.target = int(command[1])
            for client in pool.clients:
                client.reached_at = 0.0
        elif command[0] == "stats":
            reply = pool.stats()
        print(json.dumps(reply), flush=True)


def main() -> None:
    asyncio.run(_clients_main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3])))


if __name__ == "__main__":
    main()
