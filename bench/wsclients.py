"""Many WebSocket subscribers in one process, cheap enough to measure the gateway, not themselves.

``python -m bench.wsclients PORT COLLECTION COUNT [--nice N] [--cpus 0,1]``
(started by :mod:`bench.ws_fanout`).  Each client is a plain non-blocking
TCP socket speaking just enough RFC 6455: the opening handshake (section 4.1),
then frame headers (a server's frames are never masked, section 5.1).  One
``epoll`` loop serves them all -- no asyncio, no per-read callback objects.
Even so 200,000 frames/s cost it about a core (4.3 us a frame), beside the
gateway it measures: ``bench/wsclients.c`` is the same client in C (same
commands, counts and checks, half that CPU), which :mod:`bench.ws_fanout`
runs when it can build it (:mod:`bench.wsclients_c`); this one is the
fallback and the reference.  Every notification frame is still checked: ``seq`` and ``prev``
(continuity: a ``prev`` that is not the last seq is a *break*) are read from
fixed places in the frame, and so is the send time the appender wrote into
the ``loc`` (``?t=<ns>``).  Hello, skipped and heartbeat frames are parsed
in full.  Pings get a pong, so the gateway's keepalive runs as in
production.  (``tests/chaos/wspool.py`` is the soak's pool: full clients
that reconnect.)

When did a frame arrive?  Each read is ``recvmsg`` on a socket with
``SO_TIMESTAMPNS`` (socket(7)), so the kernel hands over, with the bytes,
the time the last of them reached this socket: *arrival*.  Latency is
arrival minus the appender's send time, both on this machine's
``CLOCK_REALTIME``.  The time the process got round to reading the bytes is
recorded too (*read*): on a shared 2-core machine it adds the client
processes' own wait for a CPU, which a subscriber on another machine does
not charge to the gateway.  All frames of one read get that read's
arrival time, the arrival of its *last* bytes: an upper bound for the
others.  A read without a timestamp (none seen on Linux) falls back to the
read time and is counted (``unstamped``).

The first client of the process also splits its latency at the gateway's
``published`` stamp (when the gateway rendered the record): log and
gateway wake-up before it, fan-out and the kernel after.

``--nice`` lowers the process's priority: the clients stand for
subscribers on other machines, so on this one they take the CPU the
gateway leaves (they still must keep up: a client that falls behind the
gateway's ring is ``skipped``, counted).  ``--cpus`` pins the process
(``os.sched_setaffinity``).

Commands on stdin, one JSON line in reply on stdout: ``open`` (connect all,
wait for every hello), ``reset FIRST`` (count notifications from seq FIRST
on), ``target T`` (note when each client has seq T), ``stats``, ``quit``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import select
import socket
import struct
import sys
import time
from datetime import UTC, datetime
from typing import Any

CONNECT_SLOTS = 100  # handshakes in flight
BUCKET_NS = 100_000  # latency histograms: 0.1 ms buckets
READ_BYTES = 16 * 1024  # below malloc's mmap threshold: a larger read buffer costs an mmap per read
SO_TIMESTAMPNS = 35  # Linux, <asm-generic/socket.h> (also its SCM_ type); not in the socket module
_TIMESPEC = struct.Struct("@qq")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size)
_PUBLISHED = b'published\\":\\"'  # the gateway's stamp, inside the JSON-escaped payload


class _Subscriber:
    """One connection: its socket, unparsed bytes and the last seq it accounted for."""

    __slots__ = ("last", "open", "pending", "reached_at", "sampled", "sock")

    def __init__(self, sock: socket.socket, sampled: bool) -> None:
        self.sock = sock
        self.pending = b""
        self.open = False
        self.last = -1  # last seq accounted for (hello.head, then prev/seq/skipped)
        self.reached_at = 0.0
        self.sampled = sampled


class _Pool:
    """One process's clients and what they counted since the last ``reset``."""

    def __init__(self, port: int, collection: str) -> None:
        self.port = port
        self.path = f"/{collection}"
        self.prefix = b'{"type":"notification","collection":%s,"seq":' % json.dumps(
            collection
        ).encode("ascii")
        self.clients: dict[int, _Subscriber] = {}
        self.epoll = select.epoll()
        self.target = 0
        self.handshaking = 0  # connected, no hello yet
        self.opened = 0  # hello received
        self.failed: list[str] = []
        self.reset(0)

    def reset(self, first: int) -> None:
        """Count from seq ``first`` on (frames of earlier seqs may still be in flight)."""
        self.first = first
        self.notifications = self.skipped = self.breaks = self.closed = 0
        self.unstamped = 0
        self.histogram: dict[int, int] = {}  # send -> arrival, every client and frame
        self.read_histogram: dict[int, int] = {}  # send -> read by this process
        # The first client of each process splits its latency at the gateway's
        # "published" stamp (when it rendered the record): log, then fan-out.
        self.to_gateway: dict[int, int] = {}
        self.fan_out: dict[int, int] = {}

    def stats(self) -> dict[str, Any]:
        done = [c.reached_at for c in self.clients.values() if c.reached_at]
        return {
            "connected": sum(1 for c in self.clients.values() if c.open),
            "notifications": self.notifications,
            "skipped": self.skipped,
            "breaks": self.breaks,
            "closed": self.closed,
            "unstamped": self.unstamped,
            "done": len(done),
            "done_at": max(done, default=None),
            "histogram": self.histogram,
            "read_histogram": self.read_histogram,
            "to_gateway": self.to_gateway,
            "fan_out": self.fan_out,
        }

    # -- connections ------------------------------------------------------------

    def connect(self) -> None:
        """Open one connection and send its handshake; the loop reads the answer."""
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            f"GET {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        sock.setblocking(False)
        self.clients[sock.fileno()] = _Subscriber(sock, sampled=not self.clients)
        self.epoll.register(sock.fileno(), select.EPOLLIN)
        self.handshaking += 1

    def lost(self, client: _Subscriber, why: str) -> None:
        self.epoll.unregister(client.sock.fileno())
        del self.clients[client.sock.fileno()]
        client.sock.close()
        self.closed += 1
        if client.last < 0:  # no hello yet
            self.handshaking -= 1
            self.failed.append(why[:80])

    # -- reading ----------------------------------------------------------------

    def readable(self, client: _Subscriber) -> None:
        try:
            data, ancillary, _, _ = client.sock.recvmsg(READ_BYTES, _ANCILLARY)
        except BlockingIOError:
            return
        except OSError as exc:
            self.lost(client, repr(exc))
            return
        read_ns = time.time_ns()  # before any parsing: the process's own delay ends here
        if not data:
            self.lost(client, "closed by the gateway")
            return
        arrival_ns = read_ns
        if ancillary:
            seconds, nanoseconds = _TIMESPEC.unpack(ancillary[0][2][: _TIMESPEC.size])
            arrival_ns = seconds * 1_000_000_000 + nanoseconds
        else:
            self.unstamped += 1
        buf = client.pending + data if client.pending else data
        if not client.open:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                client.pending = buf
                return
            if b" 101 " not in buf[: buf.find(b"\r\n")]:
                self.lost(client, buf[:80].decode(errors="replace"))
                return
            client.open, buf = True, buf[end + 4 :]
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
                self.text(client, payload, arrival_ns, read_ns)
            elif opcode == 9:  # ping: a masked pong with the same payload (mask 0 is a mask)
                client.sock.send(bytes([0x8A, 0x80 | len(payload), 0, 0, 0, 0]) + payload)
        client.pending = buf[pos:]

    def text(self, client: _Subscriber, payload: bytes, arrival_ns: int, read_ns: int) -> None:
        if payload.startswith(self.prefix):
            start = len(self.prefix)
            comma = payload.index(b",", start)
            seq = int(payload[start:comma])
            prev = int(payload[comma + 8 : payload.index(b",", comma + 8)])  # ,"prev":
            if prev != client.last:
                self.breaks += 1
            client.last = seq
            if seq >= self.first:
                self.notifications += 1
                mark = payload.find(b"?t=")
                if mark > 0:
                    sent = int(payload[mark + 3 : payload.index(b"\\", mark)])
                    _count(self.histogram, arrival_ns - sent)
                    _count(self.read_histogram, read_ns - sent)
                    if client.sampled:
                        stamp = payload.find(_PUBLISHED) + len(_PUBLISHED)
                        text = payload[stamp : payload.index(b"Z", stamp)].decode()
                        published = datetime.fromisoformat(text).replace(tzinfo=UTC)
                        published_ns = int(published.timestamp() * 1e9)
                        _count(self.to_gateway, published_ns - sent)
                        _count(self.fan_out, arrival_ns - published_ns)
        else:  # hello, skipped, heartbeat: rare, so parsed in full
            frame = json.loads(payload)
            if frame["type"] == "skipped":
                self.skipped += frame["resume"] - frame["from"]
                client.last = frame["resume"] - 1
            elif frame["type"] == "hello" and client.last < 0:
                client.last = frame["head"]
                self.handshaking -= 1
                self.opened += 1
        if self.target and client.last >= self.target and not client.reached_at:
            client.reached_at = read_ns / 1e9


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


def _reply(obj: dict[str, Any]) -> None:
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(sys.stdout.fileno(), data) :]


def run(port: int, collection: str, count: int, poll_every: float = 0.0) -> None:
    """The loop: commands on stdin, frames on every socket, until ``quit`` or end of input.

    With ``poll_every`` (seconds) the process looks at its sockets that often
    instead of sleeping in ``epoll_wait`` (see the module's docstring).
    """
    pool = _Pool(port, collection)
    stdin = sys.stdin.fileno()
    os.set_blocking(stdin, False)
    pool.epoll.register(stdin, select.EPOLLIN)
    commands = b""
    opening: float | None = None  # perf_counter at "open", until all are open or failed
    to_open = 0
    while True:
        if opening is not None:
            while to_open and pool.handshaking < CONNECT_SLOTS:
                to_open -= 1
                try:
                    pool.connect()
                except OSError as exc:
                    pool.failed.append(repr(exc)[:80])
            if not to_open and not pool.handshaking:
                failed = sorted(set(pool.failed))
                _reply({"opened": pool.opened, "failed": failed,
                        "seconds": time.perf_counter() - opening})  # fmt: skip
                opening = None
        events = pool.epoll.poll(0 if poll_every else 1.0)
        if not events and poll_every:
            time.sleep(poll_every)
            continue
        for fd, _ in events:
            client = pool.clients.get(fd)
            if client is not None:
                pool.readable(client)
                continue
            if fd != stdin:
                continue
            chunk = os.read(stdin, 4096)
            if not chunk:
                return
            commands += chunk
            while b"\n" in commands:
                line, commands = commands.split(b"\n", 1)
                command = line.decode().split()
                if not command or command[0] == "quit":
                    return
                if command[0] == "open":
                    opening, to_open = time.perf_counter(), count
                    continue
                reply: dict[str, Any] = {"ok": True}
                if command[0] == "reset":
                    pool.reset(int(command[1]))
                elif command[0] == "target":
                    pool.target = int(command[1])
                    for c in pool.clients.values():
                        c.reached_at = 0.0
                elif command[0] == "stats":
                    reply = pool.stats()
                _reply(reply)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.wsclients")
    ap.add_argument("port", type=int)
    ap.add_argument("collection")
    ap.add_argument("count", type=int)
    ap.add_argument("--nice", type=int, default=0, help="added to the process's niceness")
    ap.add_argument("--cpus", help="pin to these CPUs, e.g. 1 or 0,1")
    ap.add_argument(
        "--poll-ms",
        type=float,
        default=0.0,
        help="look at the sockets every N ms instead of sleeping in epoll_wait",
    )
    opts = ap.parse_args()
    if opts.nice:
        os.nice(opts.nice)
    if opts.cpus:
        os.sched_setaffinity(0, {int(c) for c in opts.cpus.split(",")})
    run(opts.port, opts.collection, opts.count, opts.poll_ms / 1e3)


if __name__ == "__main__":
    main()
