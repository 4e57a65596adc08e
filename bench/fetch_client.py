"""What rsnotify's HTTP client costs over the library it wraps, per small fetch.

A Destination fetches every changed resource, nearly all of them small, so
the client's CPU per request is a share of every change's cost.
:class:`rsnotify.fetch.Fetcher` wraps one :class:`aiohttp.ClientSession`
and adds what a Destination must not go without: the origin allow-list
checked on every hop, redirects followed by hand, ``Retry-After`` and a
pace per origin, a deadline for the whole exchange, size limits, and the
response described as a :class:`~rsnotify.fetch.FetchResult`.  This bench
fetches the same 1 KB files from a private nginx (``tests.devstack.Nginx``)
with bare aiohttp (the baseline: a session, ``get``, ``read``) and with
:meth:`Fetcher.get`, ``--concurrency`` requests at once, rounds alternating
in one process, and reports the CPU per fetch of each and their ratio.  A
second pair fetches a missing file half the time (a pushed deletion the
Source confirms with a 404).

Figures are ratios within one run: on this shared two-core host single
rounds vary by a factor of two, so the median over ``--rounds`` counts.
Prints a table; writes ``bench/results/fetch_client.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from bench._common import format_table, machine_info, write_json
from rsnotify.errors import FetchError
from rsnotify.fetch import Fetcher
from tests.devstack import Nginx

NAME = "fetch_client"
FILES = 100
BODY_BYTES = 1024


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _paths(n: int, missing: bool) -> list[str]:
    """The paths of ``n`` requests: every file in turn, every other one missing if asked."""
    return [
        f"/gone{i % FILES}.txt" if missing and i % 2 else f"/r{i % FILES}.txt" for i in range(n)
    ]


async def _run(
    fetch_one: Callable[[str], Awaitable[None]], paths: list[str], concurrency: int
) -> float:
    """CPU seconds per request for ``paths``, ``concurrency`` at a time, after a warm-up."""
    slots = asyncio.Semaphore(concurrency)

    async def one(path: str) -> None:
        async with slots:
            await fetch_one(path)

    await asyncio.gather(*(one(p) for p in paths[:200]))  # connections open, caches warm
    started = _cpu_s()
    await asyncio.gather(*(one(p) for p in paths))
    return (_cpu_s() - started) / len(paths)


async def _bare(base: str, paths: list[str], concurrency: int) -> float:
    connector = aiohttp.TCPConnector(limit_per_host=concurrency)
    async with aiohttp.ClientSession(
        connector=connector, cookie_jar=aiohttp.DummyCookieJar()
    ) as session:

        async def fetch_one(path: str) -> None:
            async with session.get(base + path) as response:
                body = await response.read()
            if response.status == 200:
                assert len(body) == BODY_BYTES
            else:
                assert response.status == 404

        return await _run(fetch_one, paths, concurrency)


async def _fetcher(base: str, paths: list[str], concurrency: int) -> float:
    async with Fetcher(allowed_origins=[base], limit_per_host=concurrency) as fetcher:

        async def fetch_one(path: str) -> None:
            try:
                result = await fetcher.get(base + path)
            except FetchError as exc:
                assert exc.status == 404
                return
            assert len(result.body) == BODY_BYTES

        return await _run(fetch_one, paths, concurrency)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fetch_client", description=__doc__)
    ap.add_argument("--requests", type=int, default=3000, help="requests per round")
    ap.add_argument("--rounds", type=int, default=7, help="rounds of each contender")
    ap.add_argument("--concurrency", type=int, default=8, help="requests at once")
    opts = ap.parse_args(argv)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rsnotify-fetch-") as tmp:
        root = Path(tmp) / "www"
        root.mkdir()
        for i in range(FILES):
            (root / f"r{i}.txt").write_bytes(os.urandom(BODY_BYTES // 2).hex().encode())
        nginx = Nginx(Path(tmp) / "nginx", root)
        nginx.start()
        try:
            for missing in (False, True):
                paths = _paths(opts.requests, missing)
                bare: list[float] = []
                ours: list[float] = []
                for _ in range(opts.rounds):  # alternating: the host's speed drifts
                    bare.append(asyncio.run(_bare(nginx.url, paths, opts.concurrency)))
                    ours.append(asyncio.run(_fetcher(nginx.url, paths, opts.concurrency)))
                results.append(
                    {
                        "requests": "half 404" if missing else "all 200",
                        "aiohttp_us": [s * 1e6 for s in bare],
                        "fetcher_us": [s * 1e6 for s in ours],
                        "ratios": [o / b for o, b in zip(ours, bare, strict=True)],
                    }
                )
        finally:
            nginx.stop()
    headers = ["requests", "aiohttp us/fetch", "Fetcher us/fetch", "ratio", "ratio range"]
    table = [
        [
            r["requests"],
            statistics.median(r["aiohttp_us"]),
            statistics.median(r["fetcher_us"]),
            statistics.median(r["ratios"]),
            f"{min(r['ratios']):.2f}-{max(r['ratios']):.2f}",
        ]
        for r in results
    ]
    print(
        f"CPU per 1 KB fetch from nginx, {opts.concurrency} at once, median of "
        f"{opts.rounds} alternating rounds of {opts.requests:,} requests"
    )
    print(format_table(headers, table))
    path = write_json(
        NAME,
        {
            "machine": machine_info(),
            "requests_per_round": opts.requests,
            "concurrency": opts.concurrency,
            "body_bytes": BODY_BYTES,
            "results": results,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
