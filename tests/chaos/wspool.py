"""Many WebSocket clients in one process, for the soak: ``python -m tests.chaos.wspool``.

Each client holds one connection to the gateway subscribed to every
collection (``ws://host:port/`` and a subscribe frame).  Parsing every frame
of every client in one Python process would measure this process, not the
gateway, so only ``--sampled`` clients decode their notifications (latency =
arrival - the change's datetime at the Source, both on this machine's clock);
the others count frames and bytes.  Every client counts ``skipped`` frames
(the gateway dropping a slow client's backlog) and reconnects with backoff if
dropped.

Every ``--interval`` seconds one JSON line is appended to ``--out``:
``{"t": epoch, "clients_connected": N, "frames": F, "notifications": M,
"skipped": S, "reconnects": R, "latency_ms": {"n", "p50", "p95", "p99", "max"}}``
with counts and latencies for that interval only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import websockets

from rsnotify import envelope
from rsnotify.transport import wsproto


@dataclass
class Counters:
    connected: int = 0
    frames: int = 0
    notifications: int = 0
    skipped: int = 0
    reconnects: int = 0
    latencies_ms: list[float] = field(default_factory=list)

    def take(self) -> dict[str, object]:
        values = sorted(self.latencies_ms)
        snapshot = {
            "t": round(time.time(), 3),
            "clients_connected": self.connected,
            "frames": self.frames,
            "notifications": self.notifications,
            "skipped": self.skipped,
            "reconnects": self.reconnects,
            "latency_ms": percentiles(values),
        }
        self.frames = self.notifications = self.skipped = self.reconnects = 0
        self.latencies_ms = []
        return snapshot


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    """n, p50, p95, p99 and max of sorted ``values`` (None when empty)."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}

    def at(q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))], 2)

    return {"n": len(values), "p50": at(0.5), "p95": at(0.95), "p99": at(0.99), "max": at(1.0)}


async def client(url: str, collections: list[str], sampled: bool, counters: Counters) -> None:
    delay = 0.5
    first = True
    while True:
        try:
            async with websockets.connect(url, max_size=2**20, open_timeout=30) as ws:
                await ws.send(wsproto.subscribe_frame({c: None for c in collections}))
                counters.connected += 1
                if not first:
                    counters.reconnects += 1
                first, delay = False, 0.5
                try:
                    async for data in ws:
                        counters.frames += 1
                        if sampled:
                            _sample(data, counters)
                        elif b'"skipped"' in (data if isinstance(data, bytes) else data.encode()):
                            counters.skipped += 1
                finally:
                    counters.connected -= 1
        except (OSError, websockets.WebSocketException, TimeoutError):
            await asyncio.sleep(delay)  # backoff before reconnecting
            delay = min(delay * 2, 10.0)


def _sample(data: str | bytes, counters: Counters) -> None:
    frame = wsproto.parse_frame(data)
    if isinstance(frame, wsproto.Notification):
        counters.notifications += 1
        note = envelope.decode(frame.payload)
        counters.latencies_ms.append((time.time() - note.datetime.timestamp()) * 1000)
    elif isinstance(frame, wsproto.Skipped):
        counters.skipped += 1


async def main_async(args: argparse.Namespace) -> None:
    counters = Counters()
    collections = args.collection
    tasks = [
        asyncio.create_task(client(args.url, collections, i < args.sampled, counters))
        for i in range(args.clients)
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"wspool: {args.clients} clients on {args.url}", flush=True)
    out = Path(args.out)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), args.interval)
        with open(out, "a") as handle:
            handle.write(json.dumps(counters.take()) + "\n")
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="ws://host:port/")
    parser.add_argument("--collection", action="append", required=True)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--sampled", type=int, default=10, help="clients that decode frames")
    parser.add_argument("--interval", type=float, default=60.0)
    parser.add_argument("--out", required=True)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
