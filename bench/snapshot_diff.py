"""Diffing Resource List snapshots: one changed part against re-reading everything (issue 23).

Why one module of ~600 lines: it is one comparison -- the generated index set and its
one-part change, the contenders (each run in a fresh child process) and the table that
judges them -- read top to bottom; the measurement code it shares with the other benches
lives in ``bench/_common.py``.

A Source with no Change List tells what changed only by publishing a new
Resource List; rsnotify's :class:`~rsnotify.changes.snapshotwatch.SnapshotWatcher`
diffs successive snapshots.  The issue asks that detection cost stay
proportional to what changed where the server allows it, and that a
1,000,000-resource Resource List Index set be diffed within the parse bench's
memory bound (:data:`bench.parse.TARGET_SET_RSS_MB`).

Input: a Resource List Index of 20 parts x 50,000 resources (hash, length,
lastmod), written with rsnotify's own serializer as :mod:`bench.parse` writes
its inputs, read through :class:`~rsnotify.changes.access.DirectoryAccess`
(validator: the file's inode, size and mtime, like a strong ETag).  Then ONE
part changes: 100 updates, 10 deletions, 10 creations, and the index gets a
new ``at``.  Three contenders, each in a fresh process (peak RSS its own),
each starting from the same state directory:

* ``first``: the watcher's first read (no snapshot yet): reads every part and
  records the state (the maps, in a :class:`~rsnotify.changes.snapshotblobs.DirectoryBlobs`);
* ``one part``: the poll after the change, with the validators of the first
  read: 19 parts answer "not modified", one is parsed and diffed;
* ``everything``: the same poll by a watcher that kept no validators and no
  body digests, so it must re-read, parse and diff every part against its
  map (what a Source without validators, or a naive differ, costs);
* ``re-read, digests kept`` (extra): no validators, but each part's body
  digest is known, so unchanged bytes are hashed and not parsed;
* ``over HTTP`` (extra): (c') with the Source served by nginx (a stock web
  server: strong ETag), read by rsnotify's HTTP client (its imports count in
  the base RSS): every part downloaded, its body spooled to a temporary file
  as it arrives and hashed, only the changed one parsed;
* ``every part renamed`` (extra): the same change, but the Source also
  renamed every part (a re-sharded index, or parts named by date): each new
  part is compared with the maps of the parts the index no longer names, as
  one set (:class:`~rsnotify.changes.snapshot.Comparison`), so the
  resources that only moved cost table space, not entries.

Every diff must find the same 120 changes.  Run ``python -m bench.snapshot_diff``
(``--quick``: 4 x 5,000).  It always exits 0: it measures, and prints
PASS/FAIL of the one-part poll's peak RSS against the bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench._common import (
    REPO_ROOT,
    RESULTS_DIR,
    Series,
    format_table,
    machine_info,
    measure,
    source_digest,
    warn_about_machine,
    write_json,
)
from bench.parse import TARGET_SET_RSS_MB

NAME = "snapshot_diff"
_HERE = "bench.snapshot_diff"  # children import the contenders by this name, never __main__
DATA_VERSION = 1  # bump when the generated documents change shape

BASE_URL = "https://data.example.org"
INDEX = "resourcelist-index.xml"
CHANGED_PART = 7  # 0-based: which part the change touches (the last, with fewer parts)
RENAMED = "resourcelist-2024-01-31"  # contender (d)'s part names: every part renamed
UPDATES, DELETES, CREATES = 100, 10, 10
START = datetime(2024, 1, 1, tzinfo=UTC)
AT_BEFORE = START + timedelta(days=30)
AT_AFTER = AT_BEFORE + timedelta(hours=1)


# --- inputs --------------------------------------------------------------------


def changed_part(parts: int) -> int:
    return min(CHANGED_PART, parts - 1)


def _part_name(number: int, prefix: str = "resourcelist") -> str:
    return f"{prefix}-{number + 1:04d}.xml"


def _resources(part: int, per_part: int) -> list[Any]:
    """One part's Resource List entries: hash, length, lastmod, type (deterministic)."""
    from rsnotify.model import Entry

    rng = random.Random(1000 + part)
    folders = ("articles", "datasets", "images", "theses", "records", "collections/maps")
    types = ("application/xml", "text/html", "application/pdf", "image/jpeg", "text/csv")
    out = []
    for i in range(per_part):
        out.append(
            Entry(
                loc=f"{BASE_URL}/{rng.choice(folders)}/p{part:02d}/{i:06d}/item",
                lastmod=START + timedelta(seconds=rng.randrange(30 * 86_400)),
                hash=f"md5:{rng.getrandbits(128):032x} sha-256:{rng.getrandbits(256):064x}",
                length=rng.randrange(200, 5_000_000),
                type=rng.choice(types),
            )
        )
    return out


def _changed(entries: list[Any]) -> list[Any]:
    """The part after the change: updates, deletions and creations, as a Source would list."""
    from dataclasses import replace

    rng = random.Random(23)
    out = list(entries)
    picks = rng.sample(range(len(out)), UPDATES + DELETES)
    for i in picks[:UPDATES]:
        out[i] = replace(
            out[i],
            lastmod=AT_BEFORE + timedelta(minutes=rng.randrange(1, 60)),
            hash=f"md5:{rng.getrandbits(128):032x} sha-256:{rng.getrandbits(256):064x}",
            length=rng.randrange(200, 5_000_000),
        )
    for i in sorted(picks[UPDATES:], reverse=True):
        del out[i]
    for k in range(CREATES):
        out.append(
            replace(
                out[0],
                loc=f"{BASE_URL}/new/{k:03d}/item",
                lastmod=AT_BEFORE + timedelta(minutes=30),
                hash=f"md5:{rng.getrandbits(128):032x} sha-256:{rng.getrandbits(256):064x}",
            )
        )
    return out


def _write(document: Any, path: Path) -> None:
    from rsnotify import sitemap

    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as handle:
        sitemap.write(document, handle)
    tmp.replace(path)


def _index(
    parts: int,
    at: datetime,
    changed_at: datetime,
    prefix: str = "resourcelist",
    base: str = BASE_URL,
) -> Any:
    from rsnotify.model import Capability, Entry, Link, Root, make_document

    return make_document(
        Root.SITEMAPINDEX,
        Capability.RESOURCELIST,
        at=at,
        links=[Link(rel="up", href=f"{BASE_URL}/capabilitylist.xml")],
        entries=[
            Entry(
                loc=f"{base}/{_part_name(n, prefix)}",
                at=changed_at if n == changed_part(parts) else AT_BEFORE,
            )
            for n in range(parts)
        ],
    )


def _part(entries: list[Any], at: datetime) -> Any:
    from rsnotify.model import Capability, Link, Root, make_document

    links = [
        Link(rel="up", href=f"{BASE_URL}/capabilitylist.xml"),
        Link(rel="index", href=f"{BASE_URL}/{INDEX}"),
    ]
    return make_document(Root.URLSET, Capability.RESOURCELIST, at=at, links=links, entries=entries)


def data_root(data_dir: Path, parts: int, per_part: int) -> Path:
    return data_dir / f"snapshot-v{DATA_VERSION}-{parts}x{per_part}"


def generate(data_dir: str, parts: int, per_part: int) -> None:
    """``before/``: the index and its parts; ``after/``: the changed part and the new index.

    Part by part, so the generator never holds more than one part's entries.
    """
    root = data_root(Path(data_dir), parts, per_part)
    before, after = root / "before", root / "after"
    before.mkdir(parents=True, exist_ok=True)
    after.mkdir(parents=True, exist_ok=True)
    for n in range(parts):
        entries = _resources(n, per_part)
        _write(_part(entries, AT_BEFORE), before / _part_name(n))
        if n == changed_part(parts):
            _write(_part(_changed(entries), AT_AFTER), after / _part_name(n))
    _write(_index(parts, AT_BEFORE, AT_BEFORE), before / INDEX)
    _write(_index(parts, AT_AFTER, AT_AFTER), after / INDEX)
    (root / "ready").write_text("ok\n")


def ensure_inputs(data_dir: Path, parts: int, per_part: int) -> Path:
    """Reuse the inputs, or write them in a child process (the bench process stays small)."""
    root = data_root(data_dir, parts, per_part)
    if not (root / "ready").exists():
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys, json; from bench.snapshot_diff import generate; "
                "generate(*json.loads(sys.argv[1]))",
                json.dumps([str(data_dir), parts, per_part]),
            ],
            cwd=REPO_ROOT,
            check=True,
        )
    return root


def _link_tree(source: Path, target: Path) -> None:
    """``target`` holds hard links to ``source``'s files: a Source directory in no time."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for path in source.iterdir():
        os.link(path, target / path.name)


def _copy_site(
    site: Path, target: Path, parts: int, *, prefix: str = "resourcelist", base: str = BASE_URL
) -> None:
    """``site`` after its change, its parts (hard links) named ``prefix`` and an index
    naming them at ``base``: every part renamed (a re-sharded index, parts named by
    date), or the same site for a web server at ``base``."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for n in range(parts):
        os.link(site / _part_name(n), target / _part_name(n, prefix))
    _write(_index(parts, AT_AFTER, AT_AFTER, prefix, base), target / INDEX)


def _apply_change(inputs: Path, site: Path) -> None:
    """The Source publishes its change: the changed part, then the index, each replaced."""
    for name in sorted(p.name for p in (inputs / "after").iterdir()):
        if name == INDEX:
            continue
        os.link(inputs / "after" / name, site / f".{name}.new")
        os.replace(site / f".{name}.new", site / name)
    os.link(inputs / "after" / INDEX, site / f".{INDEX}.new")
    os.replace(site / f".{INDEX}.new", site / INDEX)


# --- contenders (each called in a fresh child process by bench._common) -------------
# Each prepare_* builds the watcher from the state directory and returns the
# callable that is timed: one poll; it returns the resources recorded (first
# read) or the changes found.


def _watcher(site: str, state: str, checkpoint: Any, access: Any = None, base: str = "") -> Any:
    from rsnotify.changes.access import DirectoryAccess
    from rsnotify.changes.snapshotblobs import DirectoryBlobs
    from rsnotify.changes.snapshotwatch import SnapshotWatcher

    return SnapshotWatcher(
        access=access if access is not None else DirectoryAccess(site),
        collection="bench",
        capability_list=f"{BASE_URL}/capabilitylist.xml",
        resourcelist_url=f"{base or BASE_URL}/{INDEX}",
        checkpoint=checkpoint,
        blobs=DirectoryBlobs(Path(state) / "maps"),
    )


def _checkpoint_path(state: str) -> Path:
    return Path(state) / "checkpoint.json"


def prepare_first(site: str, state: str) -> Callable[[], int]:
    from rsnotify.changes.snapshot import SnapshotState
    from rsnotify.tracker import Checkpoint

    watcher = _watcher(site, state, Checkpoint())

    def run() -> int:
        result = asyncio.run(watcher.poll())
        assert not result.detections, "a first read records, it reports no change"
        watcher.commit(result.checkpoint)
        _checkpoint_path(state).write_text(result.checkpoint.to_json())
        return SnapshotState.from_json(result.checkpoint.snapshot.state).count

    return run


def prepare_poll(site: str, state: str, forget: str, http: str = "") -> Callable[[], int]:
    """``forget``: "" (keep validators), "validators", or "validators+digests".

    ``http``: the base URL of a web server serving the Source (its index
    naming its parts there): the recorded state's document URLs are moved
    to it, and the watcher reads over HTTP (rsnotify's client imported
    here, so the base RSS includes it).
    """
    from dataclasses import replace

    from rsnotify.changes.snapshot import SnapshotState
    from rsnotify.tracker import Checkpoint, SnapshotPosition

    checkpoint = Checkpoint.from_json(_checkpoint_path(state).read_text())
    assert checkpoint.snapshot is not None
    if forget or http:
        snap = SnapshotState.from_json(checkpoint.snapshot.state)
        if forget:
            snap.etag = snap.last_modified = None
        if http:
            snap.url = snap.url.replace(BASE_URL, http, 1)
        for url, part in list(snap.parts.items()):
            if forget:
                part = replace(part, etag=None, last_modified=None)
            if "digests" in forget:
                part = replace(part, digest="")
            if http:
                del snap.parts[url]
                url = url.replace(BASE_URL, http, 1)
                part = replace(part, url=url)
            snap.parts[url] = part
        checkpoint = replace(checkpoint, snapshot=SnapshotPosition(snap.to_json()))
    fetcher = access = None
    if http:
        from rsnotify.changes.access import HttpAccess
        from rsnotify.fetch import Fetcher

        fetcher = Fetcher()  # its session is made on first use, in the poll's loop
        access = HttpAccess(fetcher)
    watcher = _watcher(site, state, checkpoint, access, http)

    def run() -> int:
        async def drain() -> int:
            found = 0
            try:
                while True:
                    result = await watcher.poll()
                    found += sum(len(d.entries) for d in result.detections)
                    watcher.commit(result.checkpoint)
                    if not result.more:
                        return found
            finally:
                if fetcher is not None:
                    await fetcher.close()

        return asyncio.run(drain())

    return run


# --- the run ---------------------------------------------------------------------


@dataclass(slots=True)
class Contender:
    key: str
    label: str
    prepare: str
    forget: str | None  # None: the first read


CONTENDERS = [
    Contender("first", "(a) first read, records the state", f"{_HERE}:prepare_first", None),
    Contender("one_part", "(b) poll: one part changed", f"{_HERE}:prepare_poll", ""),
    Contender(
        "everything",
        "(c) re-read and diff every part",
        f"{_HERE}:prepare_poll",
        "validators+digests",
    ),
    Contender(
        "reread_digests",
        "(c') re-read every part, digests kept",
        f"{_HERE}:prepare_poll",
        "validators",
    ),
    Contender(
        "renamed",
        "(d) every part renamed (a re-shard)",
        f"{_HERE}:prepare_poll",
        "",
    ),
    Contender(
        "http",
        "(e) (c') over HTTP, from nginx",
        f"{_HERE}:prepare_poll",
        "validators",
    ),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.snapshot_diff", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="small inputs, one run: a smoke test")
    ap.add_argument("--repeat", type=int, default=None, help="runs per contender (default 3)")
    ap.add_argument(
        "--data-dir",
        type=Path,
        default=RESULTS_DIR / "data",
        help="where the generated documents are kept and reused",
    )
    opts = ap.parse_args(argv)
    if opts.quick:
        parts, per_part, repeat = 4, 5_000, opts.repeat or 1
    else:
        parts, per_part, repeat = 20, 50_000, opts.repeat or 3

    started = time.perf_counter()
    machine_before = machine_info()
    warn_about_machine(machine_before, "slows every contender unevenly")
    print(f"generating inputs in {opts.data_dir} (reused when present) ...", flush=True)
    inputs = ensure_inputs(opts.data_dir, parts, per_part)
    work = opts.data_dir / f"{NAME}-work"
    served = work / "served"
    served.mkdir(parents=True, exist_ok=True)
    from tests.devstack import Nginx  # a stock web server on a free loopback port

    nginx = Nginx(work / "nginx", served).start()
    try:
        return _runs(opts, parts, per_part, repeat, inputs, work, nginx, started, machine_before)
    finally:
        nginx.stop()


def _runs(
    opts: argparse.Namespace,
    parts: int,
    per_part: int,
    repeat: int,
    inputs: Path,
    work: Path,
    nginx: Any,
    started: float,
    machine_before: dict[str, Any],
) -> int:
    """Every contender ``repeat`` times, round-robin; the table, the targets and the JSON."""
    site, recorded, state = work / "site", work / "recorded", work / "state"
    renamed, served = work / "renamed", work / "served"
    bytes_set = sum(p.stat().st_size for p in (inputs / "before").iterdir())
    print(
        f"index set: {parts} x {per_part:,} = {parts * per_part:,} resources, "
        f"{bytes_set / 1e6:.1f} MB; change: part {changed_part(parts) + 1}, {UPDATES} updates, "
        f"{DELETES} deletions, {CREATES} creations",
        flush=True,
    )

    series = {c.key: Series() for c in CONTENDERS}
    found: dict[str, set[int]] = {c.key: set() for c in CONTENDERS}
    for run in range(1, repeat + 1):
        for c in CONTENDERS:
            if c.forget is None:
                # A fresh Source directory and state: the first read records it.
                _link_tree(inputs / "before", site)
                for path in site.iterdir():
                    path.read_bytes()  # warm page cache, as for every contender
                shutil.rmtree(state, ignore_errors=True)
                state.mkdir(parents=True)
                sample = measure(c.prepare, [str(site), str(state)])
                shutil.rmtree(recorded, ignore_errors=True)
                shutil.copytree(state, recorded)
                _apply_change(inputs, site)
                _copy_site(site, renamed, parts, prefix=RENAMED)
                _copy_site(site, served, parts, base=nginx.url)
                for path in site.iterdir():
                    path.read_bytes()
            else:
                # Each poll starts from the state the first read recorded.
                shutil.rmtree(state, ignore_errors=True)
                shutil.copytree(recorded, state)
                where = renamed if c.key == "renamed" else site
                http = [nginx.url] if c.key == "http" else []
                sample = measure(c.prepare, [str(where), str(state), c.forget, *http])
            series[c.key].samples.append(sample)
            found[c.key].add(sample.entries)
            print(
                f"  run {run}/{repeat}  {c.label:<40} {sample.seconds:7.3f}s  "
                f"{sample.rss_peak_mb:6.1f} MB  ({sample.entries:,})",
                flush=True,
            )

    expected = UPDATES + DELETES + CREATES
    for key in ("one_part", "everything", "reread_digests", "renamed", "http"):
        if found[key] != {expected}:
            print(f"ERROR: {key} found {sorted(found[key])} changes, expected {expected}")
    rows = []
    for c in CONTENDERS:
        s = series[c.key]
        rows.append(
            {
                "key": c.key,
                "contender": c.label,
                "result": s.entries,
                "result_is": "resources recorded" if c.forget is None else "changes found",
                "median_s": s.median_s,
                "best_s": s.best_s,
                "peak_rss_mb": s.peak_mb,
                "base_rss_mb": s.base_mb,
                "runs_s": [x.seconds for x in s.samples],
                "runs_peak_rss_mb": [x.rss_peak_mb for x in s.samples],
            }
        )
    by_key = {r["key"]: r for r in rows}
    one, every = by_key["one_part"], by_key["everything"]
    ratio_median = one["median_s"] / every["median_s"]
    ratio_best = one["best_s"] / every["best_s"]

    print()
    headers = ["contender", "result", "median s", "best s", "peak RSS MB", "base RSS MB"]
    print(
        format_table(
            headers,
            [
                [
                    r["contender"],
                    r["result"],
                    r["median_s"],
                    r["best_s"],
                    r["peak_rss_mb"],
                    r["base_rss_mb"],
                ]
                for r in rows
            ],
        )
    )
    print(
        f"\nb/c: {ratio_median:.4f} (medians), {ratio_best:.4f} (best runs); peak RSS "
        f"b/c: {one['peak_rss_mb'] / every['peak_rss_mb']:.2f}. Base RSS is the process "
        "after its imports and the watcher's construction; peak RSS includes it."
    )
    targets = [
        {
            "name": "one-part poll peak RSS, 1M-resource index set (MB)",
            "value": one["peak_rss_mb"],
            "op": "<=",
            "threshold": TARGET_SET_RSS_MB,
            "passed": one["peak_rss_mb"] <= TARGET_SET_RSS_MB,
        },
        {
            "name": "both diffs find every change",
            "value": float(len(found["one_part"] | found["everything"])),
            "op": "==",
            "threshold": 1.0,
            "passed": found["one_part"] == found["everything"] == {expected},
        },
    ]
    print()
    for t in targets:
        print(f"{'PASS' if t['passed'] else 'FAIL'}  {t['name']}: {t['value']:.2f} {t['op']} "
              f"{t['threshold']}")  # fmt: skip

    payload = {
        "bench": NAME,
        "quick": opts.quick,
        "repeat": repeat,
        "inputs": {
            "parts": parts,
            "per_part": per_part,
            "resources": parts * per_part,
            "bytes": bytes_set,
            "changed_part": changed_part(parts) + 1,
            "change": {"updated": UPDATES, "deleted": DELETES, "created": CREATES},
        },
        "rows": rows,
        "ratio_one_part_vs_everything": {"median": ratio_median, "best": ratio_best},
        "targets": targets,
        "machine": machine_before,
        "loadavg_after": machine_info()["loadavg_1_5_15"],
        "source": source_digest(
            "rsnotify/changes/snapshot.py",
            "rsnotify/changes/snapshotwatch.py",
            "rsnotify/changes/access.py",
            "rsnotify/sitemap.py",
        ),
        "wall_s": time.perf_counter() - started,
    }
    path = write_json(f"{NAME}-quick" if opts.quick else NAME, payload)
    print(f"\nwrote {path} in {payload['wall_s']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
