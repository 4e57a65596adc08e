"""Redis scaling figures (issue 19 item 4): log appends over 1, 2 and 3 primaries; WAIT's cost.

In one run, side by side (rounds round-robin over the contenders, so drift
on a shared machine spreads over all of them):

(a) **primaries**: three Redis Clusters without replicas, of 1, 2 and 3
    primaries (``tests.devstack.RedisCluster``, AOF ``everysec``), each with
    ``--collections`` collections spread evenly over its primaries.
    ``--workers`` appender processes (each a publisher's log client:
    :class:`rsnotify.log.redis_log.RedisLog` over ``redis+cluster://``) run
    one append loop per collection, ``--batch`` entries per append, for
    ``--seconds``, all starting at the same instant.  Reported: appends/s
    (entries logged per second), the busiest primary's CPU share and all
    primaries' together (redis-server CPU seconds per wall second, from
    ``/proc`` through psutil), and append latency p50/p99.
(b) **replication waiting**: one cluster of 3 primaries with a replica
    each; the same load with ``wait_replicas`` 0 and 1 (``WAIT 1`` on the
    connection of the collection's primary before the entries are
    released to transports, see ``rsnotify/log/redis_log.py``).  Reported:
    the same columns plus the wall microseconds per notification
    (1e6 / rate) and the difference on minus off.

On 2 shared cores the appenders (Python) and the servers compete for the
same CPUs, so throughput there mostly says what the client costs; the
per-primary CPU shows how the servers' share is divided as primaries are
added, which is what buys headroom on a machine with cores to spare.  Read
the load average printed beside the table.

Run ``.venv/bin/python -m bench.redis_scale`` (about a minute and a half on
2 cores; ``--quick``: one short round).  Writes
``bench/results/redis_scale.json`` (``redis_scale-quick.json``); no targets,
exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from redis.crc import key_slot

from bench._common import format_table, machine_info, measure, source_digest, write_json
from tests.devstack import RedisCluster

PAYLOAD = b'{"v":1,"loc":"http://bench.invalid/r/' + b"x" * 200 + b'","change":"updated"}'


# --- the appender process ------------------------------------------------------------------


def prepare_appends(
    url: str, names: list[str], start_at: float, seconds: float, batch: int, wait: int, out: str
) -> Any:
    """``measure`` target: append to ``names`` from ``start_at`` for ``seconds``."""

    def run() -> int:
        return asyncio.run(_appends(url, names, start_at, seconds, batch, wait, out))

    return run


async def _appends(
    url: str, names: list[str], start_at: float, seconds: float, batch: int, wait: int, out: str
) -> int:
    from rsnotify.log.redis_log import RedisLog

    log = RedisLog(url, wait_replicas=wait, wait_timeout=1.0)
    heads = {cid: await log.head(cid) for cid in names}  # connects before the window
    latencies: list[float] = []
    await asyncio.sleep(max(0.0, start_at - time.time()))  # the common start of all workers
    stop = time.monotonic() + seconds

    async def loop(cid: str) -> int:
        head, done = heads[cid], 0
        while time.monotonic() < stop:
            began = time.perf_counter()
            head = await log.append(
                cid, [PAYLOAD] * batch, expected_head=head, checkpoint=str(head + batch)
            )
            latencies.append((time.perf_counter() - began) / batch)
            done += batch
        return done

    entries = sum(await asyncio.gather(*(loop(cid) for cid in names)))
    await log.close()
    Path(out).write_text(json.dumps({"entries": entries, "latencies_us": _pcts(latencies)}))
    return entries


def _pcts(latencies: list[float]) -> dict[str, float]:
    if not latencies:
        return {"p50": 0.0, "p99": 0.0}
    ordered = sorted(latencies)
    return {
        "p50": round(ordered[len(ordered) // 2] * 1e6, 1),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6, 1),
    }


# --- the driver ----------------------------------------------------------------------------


def spread(cluster: RedisCluster, count: int, tag: str) -> list[str]:
    """``count`` collection names, as evenly over the cluster's primaries as can be."""
    ranges = [
        (int(low), int(high), int(owner[1]))
        for low, high, owner, *_ in cluster.nodes[0].call("CLUSTER", "SLOTS")
    ]
    ports = sorted({p for _, _, p in ranges})
    share = {p: 0 for p in ports}
    want = {p: count // len(ports) + (i < count % len(ports)) for i, p in enumerate(ports)}
    names: list[str] = []
    i = 0
    while len(names) < count:
        i += 1
        name = f"{tag}-c{i}"
        slot = key_slot(f"rsn:{{{name}}}:log".encode())
        port = next(p for low, high, p in ranges if low <= slot <= high)
        if share[port] < want[port]:
            share[port] += 1
            names.append(name)
    return names


def _cpu(cluster: RedisCluster) -> dict[int, float]:
    out = {}
    for node in cluster.primaries():
        times = psutil.Process(node.pid).cpu_times()
        out[node.port] = times.user + times.system
    return out


def run_load(
    cluster: RedisCluster, tag: str, args: argparse.Namespace, wait: int, workdir: Path
) -> dict[str, Any]:
    """``args.workers`` appender processes on ``cluster`` for ``args.seconds``."""
    names = spread(cluster, args.collections, tag)
    groups = [names[w :: args.workers] for w in range(args.workers)]
    start_at = time.time() + 2.5  # the workers' interpreters start within that
    outs = [workdir / f"{tag}-w{w}.json" for w in range(args.workers)]
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            measure(
                "bench.redis_scale:prepare_appends",
                [cluster.url, groups[w], start_at, args.seconds, args.batch, wait, str(outs[w])],
                timeout=60 + args.seconds,
            )
        except BaseException as exc:  # reported below, after the others finish
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(args.workers)]
    for thread in threads:
        thread.start()
    while time.time() < start_at:  # CPU counters at the window's start, not before
        time.sleep(0.01)
    before = _cpu(cluster)
    time.sleep(args.seconds)
    after = _cpu(cluster)
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    results = [json.loads(out.read_text()) for out in outs]
    entries = sum(r["entries"] for r in results)
    shares = [(after[p] - before[p]) / args.seconds for p in before]
    return {
        "entries": entries,
        "rate": entries / args.seconds,
        "busiest_primary_cpu": max(shares),
        "primaries_cpu": sum(shares),
        "latency_p50_us": statistics.median(r["latencies_us"]["p50"] for r in results),
        "latency_p99_us": max(r["latencies_us"]["p99"] for r in results),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_scale", description=__doc__)
    parser.add_argument("--collections", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2, help="appender processes")
    parser.add_argument("--batch", type=int, default=1, help="entries per append")
    parser.add_argument("--seconds", type=float, default=4.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="one round of 2 s")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 1, 2.0
    machine = machine_info()
    work = Path(tempfile.mkdtemp(prefix="rsnotify-redis-scale-"))
    clusters: dict[str, RedisCluster] = {}
    try:
        for k in (1, 2, 3):
            clusters[f"{k} primar{'y' if k == 1 else 'ies'}"] = RedisCluster(
                work / f"p{k}", primaries=k, replicas=0
            ).start()
        replicated = RedisCluster(work / "replicated", primaries=3, replicas=1).start()
        contenders: list[tuple[str, str, RedisCluster, int]] = [
            ("primaries", name, cluster, 0) for name, cluster in clusters.items()
        ] + [
            ("wait", "WAIT off (3 primaries + replicas)", replicated, 0),
            ("wait", "WAIT 1 (3 primaries + replicas)", replicated, 1),
        ]
        samples: dict[str, list[dict[str, Any]]] = {name: [] for _, name, _, _ in contenders}
        for r in range(args.rounds):
            for i, (_, name, cluster, wait) in enumerate(contenders):
                samples[name].append(run_load(cluster, f"r{r}x{i}", args, wait, work))
                print(f"  round {r + 1}: {name}: {samples[name][-1]['rate']:,.0f} appends/s",
                      flush=True)  # fmt: skip
    finally:
        for cluster in clusters.values():
            cluster.stop()
        if "replicated" in locals():
            replicated.stop()

    def best(name: str) -> dict[str, Any]:
        return max(samples[name], key=lambda s: s["rate"])

    base = best(contenders[0][1])["rate"]
    rows = []
    for part, name, _, _ in contenders:
        b = best(name)
        rows.append([
            name, round(b["rate"]), round(statistics.median(s["rate"] for s in samples[name])),
            round(b["rate"] / base, 2) if part == "primaries" else "",
            round(1e6 / b["rate"], 1), b["latency_p50_us"], b["latency_p99_us"],
            f"{b['busiest_primary_cpu']:.0%}", f"{b['primaries_cpu']:.0%}",
        ])  # fmt: skip
    off, on = best(contenders[3][1]), best(contenders[4][1])
    wait_cost = {
        "wall_us_per_notification": round(1e6 / on["rate"] - 1e6 / off["rate"], 1),
        "latency_p50_us": round(on["latency_p50_us"] - off["latency_p50_us"], 1),
    }
    print()
    print(format_table(
        ["contender", "appends/s best", "median", "x 1 primary", "wall us/notif",
         "append p50 us", "p99 us", "busiest primary CPU", "all primaries CPU"],
        rows,
    ))  # fmt: skip
    print(
        f"\nWAIT 1 costs {wait_cost['wall_us_per_notification']} us of wall time per "
        f"notification at this concurrency ({args.collections} collections, {args.workers} "
        f"workers, batch {args.batch}) and {wait_cost['latency_p50_us']} us on the median "
        f"append\nload average before {machine['loadavg_1_5_15']}, after {list(os.getloadavg())}"
    )
    path = write_json(
        "redis_scale-quick" if args.quick else "redis_scale",
        {
            "options": vars(args),
            "rows": {name: samples[name] for _, name, _, _ in contenders},
            "wait_cost": wait_cost,
            "machine": machine,
            "machine_after": machine_info(),
            "sources": source_digest(
                "rsnotify/log/redis_log.py", "rsnotify/redisurl.py", "bench/redis_scale.py"
            ),
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
