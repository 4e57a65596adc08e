"""The mirror's batched writer as a catch-up drives it, against writing one file at a time.

The write phase of ``bench.e2e``'s change-dump catch-up, without the rest of
the system (parse, packages, store, simulator): 2,124 bodies of 1 KB written
into one directory through :data:`rsnotify.subscriber.transfer.HELD_BODIES`
bodies waiting at once, beside 7,380 deletions of files that are not there,
queued together (a group, :mod:`rsnotify.subscriber.deletions`).  In that
catch-up the event loop idles through this phase: it is the disk's, and a
whole ``bench.e2e`` run is too noisy on a shared two-core machine to show
what a change to the writer does to it.

The baseline, in the same run and on the same filesystem: the same files
written the textbook way, one after the other in one thread (temp file,
write, fsync, rename, fsync of the directory), and the same deletions as
plain ``unlink`` calls.  Figures: seconds for each (median of ``--repeat``
runs, alternating), and the baseline's time over the writer's.

Each filesystem of ``--filesystems``: ``disk`` (a temp dir on the machine's
own disk) and ``loop`` (a journaled ext4 on a loop file, as ``bench.e2e``;
root only, else skipped with a note).  Prints a table; writes
``bench/results/mirror_writes.json`` (``-quick`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import tempfile
import time
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

from bench import loopfs
from bench._common import format_table, machine_info, write_json
from rsnotify.subscriber.mirror import Mirror
from rsnotify.subscriber.transfer import HELD_BODIES

NAME = "mirror_writes"
WRITES = 2_124  # bench.e2e's change-dump catch-up: bodies left after superseding
DELETES = 7_380  # and its deletions of resources created and deleted while away
BODY_BYTES = 1024
BASE = "http://source.example/c1/resources/"


async def _batched(root: Path, writes: int, deletes: int) -> float:
    """The mirror's way: write_bytes under a semaphore of HELD_BODIES, delete_many at once."""
    mirror = Mirror(root)
    try:
        await mirror.write_bytes(mirror.path_for(BASE + "baseline"), b"x")  # the directory
        body = os.urandom(BODY_BYTES)
        hashes = {"sha-256": hashlib.sha256(body).hexdigest()}
        held = asyncio.Semaphore(HELD_BODIES)
        paths = [mirror.path_for(f"{BASE}w{i:06d}") for i in range(writes)]
        gone = [mirror.path_for(f"{BASE}d{i:06d}") for i in range(deletes)]

        async def write(path: Path) -> None:
            async with held:
                await mirror.write_bytes(
                    path, body, expected_length=len(body), expected_hashes=hashes
                )

        started = time.perf_counter()
        await asyncio.gather(mirror.delete_many(gone), *(write(p) for p in paths))
        elapsed = time.perf_counter() - started
        await mirror.settle()
    finally:
        mirror.close()
    return elapsed


def _one_by_one(root: Path, writes: int, deletes: int) -> float:
    """The textbook way, in one thread: each file made durable before the next."""
    directory = root / "c1" / "resources"
    directory.mkdir(parents=True)
    body = os.urandom(BODY_BYTES)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        started = time.perf_counter()
        for i in range(deletes):
            with suppress(FileNotFoundError):
                os.unlink(f"d{i:06d}", dir_fd=dir_fd)
        for i in range(writes):
            temp = f".tmp-w{i:06d}"
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
            try:
                os.write(fd, body)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, f"w{i:06d}", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.fsync(dir_fd)
        return time.perf_counter() - started
    finally:
        os.close(dir_fd)


def _scenario(parent: Path, writes: int, deletes: int, repeat: int) -> dict[str, Any]:
    batched: list[float] = []
    plain: list[float] = []
    for run in range(repeat):
        with tempfile.TemporaryDirectory(prefix=f"mirror-writes-{run}-", dir=parent) as tmp:
            batched.append(asyncio.run(_batched(Path(tmp) / "a", writes, deletes)))
            plain.append(_one_by_one(Path(tmp) / "b", writes, deletes))
    return {"batched_s": batched, "one_by_one_s": plain}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.mirror_writes", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="a tenth of the files, one run")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each way (alternating)")
    ap.add_argument("--filesystems", default="disk,loop", help="comma-separated: disk, loop")
    ap.add_argument("--workdir", type=Path, default=None, help="where 'disk' runs (a temp dir)")
    opts = ap.parse_args(argv)
    scale = 10 if opts.quick else 1
    writes, deletes = WRITES // scale, DELETES // scale
    repeat = 1 if opts.quick else max(1, opts.repeat)
    wanted = [name.strip() for name in opts.filesystems.split(",") if name.strip()]
    results: list[dict[str, Any]] = []
    with ExitStack() as stack:
        base = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=opts.workdir)))
        for name in wanted:
            if name == "disk":
                where = base
            elif name == "loop":
                try:
                    where = stack.enter_context(loopfs.loop_ext4(base, 2 * 2**30))
                except loopfs.LoopUnavailable as exc:
                    print(f"loop: skipped ({exc})")
                    continue
            else:
                ap.error(f"unknown filesystem {name!r} (disk, loop)")
            filesystem = loopfs.describe(where, None if name == "disk" else name)
            print(f"{name}: {filesystem.label} ...", flush=True)
            figures = _scenario(where, writes, deletes, repeat)
            results.append({"fs": name, "label": filesystem.label, **figures})
    headers = ["fs", "writes", "deletes", "runs", "batched s", "files/s", "one by one s", "x"]
    table = []
    for r in results:
        batched = statistics.median(r["batched_s"])
        plain = statistics.median(r["one_by_one_s"])
        table.append(
            [r["label"], writes, deletes, repeat, batched, writes / batched, plain, plain / batched]
        )
    print(format_table(headers, table))
    path = write_json(
        NAME + ("-quick" if opts.quick else ""),
        {
            "machine": machine_info(),
            "writes": writes,
            "deletes": deletes,
            "body_bytes": BODY_BYTES,
            "held_bodies": HELD_BODIES,
            "results": results,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
