"""Parse speed and memory: rsnotify against resync and against a bare lxml loop.

(Why one module of ~700 lines: the inputs, the three contenders and their
child-process runner belong to one comparison and are read together.)

Two inputs, both written by rsnotify's own serializer:

* a 50,000-entry Change List (the Sitemap maximum for one document);
* a "million-entry Change List Index set": a Change List Index pointing at 20
  Change Lists of 50,000 entries, read the way a Destination catching up reads
  it: the index, then each list in order, streaming.

Three contenders read the same files in the same run, each run in a fresh
process so its peak RSS is its own:

* rsnotify (``DocumentReader`` streaming, and ``parse()`` materialising);
* resync 2.0.1, the reference ResourceSync library (``ChangeList.parse``);
* a bare lxml ``iterparse`` loop pulling the same fields and building nothing:
  the floor for any lxml-based parser, so "x bare" says how much of the cost
  is rsnotify's own.

Run ``python -m bench.parse`` (``--quick`` for a smoke run).  It always exits 0:
it measures, and prints PASS/FAIL against the issue's targets.
"""

from __future__ import annotations

import argparse
import json
import os
import random
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

NAME = "parse"
_HERE = "bench.parse"  # children import the contenders by this name, never __main__
DATA_VERSION = 1  # bump when the generated documents change shape

SITEMAP_NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
RS_NS = "http://www.openarchives.org/rs/terms/"
URL_TAG = f"{{{SITEMAP_NS}}}url"
SITEMAP_TAG = f"{{{SITEMAP_NS}}}sitemap"
LOC_TAG = f"{{{SITEMAP_NS}}}loc"
LASTMOD_TAG = f"{{{SITEMAP_NS}}}lastmod"
MD_TAG = f"{{{RS_NS}}}md"

# The targets.
TARGET_VS_RESYNC = 8.0
TARGET_VS_BARE = 0.7
TARGET_SET_RSS_MB = 50.0

BASE_URL = "https://data.example.org"


# --- inputs --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Inputs:
    change_list: Path
    index: Path
    lists: list[Path]  # the index's Change Lists, in index order
    list_entries: int
    set_entries: int


def _entries(count: int, seed: int) -> list[Any]:
    """Realistic Change List entries: mostly updates, hashes and lengths, shared seconds."""
    from rsnotify.model import ChangeType, Entry

    rng = random.Random(seed)
    start = datetime(2024, 1, 1, tzinfo=UTC)
    folders = ("articles", "datasets", "images", "theses", "records", "collections/maps")
    types = ("application/xml", "text/html", "application/pdf", "image/jpeg", "text/csv")
    changes = (ChangeType.CREATED, ChangeType.UPDATED, ChangeType.DELETED)
    out = []
    for i in range(count):
        change = rng.choices(changes, weights=(2, 7, 1))[0]
        loc = f"{BASE_URL}/{rng.choice(folders)}/{rng.randrange(10**8):08d}/item.{i % 7}"
        when = start + timedelta(seconds=i * 2 // 3)  # some entries share a second
        if change is ChangeType.DELETED:
            out.append(Entry(loc=loc, lastmod=when, change=change))
            continue
        out.append(
            Entry(
                loc=loc,
                lastmod=when,
                change=change,
                hash=f"md5:{rng.getrandbits(128):032x} sha-256:{rng.getrandbits(256):064x}",
                length=rng.randrange(200, 5_000_000),
                type=rng.choice(types),
            )
        )
    return out


def _write(document: Any, path: Path) -> None:
    from rsnotify import sitemap

    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as handle:
        sitemap.write(document, handle)
    tmp.replace(path)


def _data_root(data_dir: Path, list_entries: int, parts: int, per_part: int) -> Path:
    return data_dir / f"v{DATA_VERSION}-cl{list_entries}-set{parts}x{per_part}"


def load(data_dir: Path, list_entries: int, parts: int, per_part: int) -> Inputs | None:
    """The inputs written by an earlier run with the same sizes, if all still there."""
    root = _data_root(data_dir, list_entries, parts, per_part)
    manifest_path = root / "manifest.json"
    if not manifest_path.exists():
        return None
    manifest = json.loads(manifest_path.read_text())
    inputs = Inputs(
        change_list=root / manifest["change_list"],
        index=root / "set" / manifest["index"],
        lists=[root / "set" / name for name in manifest["lists"]],
        list_entries=manifest["list_entries"],
        set_entries=manifest["set_entries"],
    )
    if all(p.exists() for p in (inputs.change_list, inputs.index, *inputs.lists)):
        return inputs
    return None


def ensure_inputs(data_dir: Path, list_entries: int, parts: int, per_part: int) -> Inputs:
    """Reuse the inputs, or write them in a child process.

    A child because the million entries are built in memory before split():
    the bench process itself stays small while it starts the contenders.
    """
    inputs = load(data_dir, list_entries, parts, per_part)
    if inputs is None:
        args = json.dumps([str(data_dir), list_entries, parts, per_part])
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys, json; from bench.parse import generate; "
                "generate(*json.loads(sys.argv[1]))",
                args,
            ],
            cwd=REPO_ROOT,
            check=True,
        )
        inputs = load(data_dir, list_entries, parts, per_part)
    if inputs is None:
        raise RuntimeError(f"generating the inputs in {data_dir} failed")
    return inputs


def generate(data_dir: str, list_entries: int, parts: int, per_part: int) -> None:
    """Write the inputs with rsnotify's own serializer and split()."""
    from rsnotify import sitemap
    from rsnotify.model import Capability, Link, Root, make_document

    root = _data_root(Path(data_dir), list_entries, parts, per_part)
    manifest_path = root / "manifest.json"
    (root / "set").mkdir(parents=True, exist_ok=True)
    up = Link(rel="up", href=f"{BASE_URL}/capabilitylist.xml")
    start = datetime(2024, 1, 1, tzinfo=UTC)

    single = make_document(
        Root.URLSET,
        Capability.CHANGELIST,
        from_=start,
        links=[up],
        entries=_entries(list_entries, seed=1),
    )
    _write(single, root / "changelist.xml")
    del single

    whole = make_document(
        Root.URLSET,
        Capability.CHANGELIST,
        from_=start,
        links=[up],
        entries=_entries(parts * per_part, seed=2),
    )
    index, documents = sitemap.split(
        whole,
        index_url=f"{BASE_URL}/changelist-index.xml",
        part_url=lambda n: f"{BASE_URL}/changelist-{n:04d}.xml",
        max_entries=per_part,
    )
    assert index is not None and len(documents) == parts
    _write(index, root / "set" / "changelist-index.xml")
    names = []
    for url, part in documents:
        name = url.rsplit("/", 1)[1]
        _write(part, root / "set" / name)
        names.append(name)
    manifest_path.write_text(
        json.dumps(
            {
                "change_list": "changelist.xml",
                "index": "changelist-index.xml",
                "lists": names,
                "list_entries": list_entries,
                "set_entries": parts * per_part,
            },
            indent=2,
        )
    )


def _local(index: str, loc: str) -> str:
    """The local copy of a list the index names: same file name, next to the index."""
    return os.path.join(os.path.dirname(index), loc.rsplit("/", 1)[1])


# --- contenders (each called in a fresh child process by bench._common) ---------
# Each prepare_* does its imports and returns the callable that is timed.  With
# ``index`` set it reads the index first and takes the lists from it; ``sample``
# restricts which of those lists are read (positions in the index).


def prepare_rsnotify_stream(
    index: str | None, lists: list[str], sample: list[int] | None = None
) -> Callable[[], int]:
    from rsnotify.sitemap import DocumentReader

    def run() -> int:
        paths = lists
        if index is not None:
            paths = [_local(index, e.loc) for e in DocumentReader(index)]
        count = 0
        last = None
        for path in _pick(paths, sample):
            for entry in DocumentReader(path):
                last = entry.change_time  # the value a Destination orders by
                count += 1
        assert last is not None
        return count

    return run


def prepare_rsnotify_parse(
    index: str | None, lists: list[str], sample: list[int] | None = None
) -> Callable[[], int]:
    from rsnotify.sitemap import parse

    def run() -> int:
        paths = lists
        if index is not None:
            paths = [_local(index, e.loc) for e in parse(index).entries]
        count = 0
        for path in _pick(paths, sample):
            document = parse(path)
            assert document.entries[-1].change_time is not None
            count += len(document.entries)
        return count

    return run


def prepare_resync(
    index: str | None, lists: list[str], sample: list[int] | None = None
) -> Callable[[], int]:
    import logging

    from resync.change_list import ChangeList
    from resync.sitemap import Sitemap

    logging.disable(logging.WARNING)

    def run() -> int:
        paths = lists
        if index is not None:
            # resync's ChangeList refuses a Change List Index (its <sitemap>
            # entries have no rs:md change), so its generic Sitemap reader takes
            # the index; each list then goes into a fresh ChangeList, resync's
            # best case for memory.
            with open(index, "rb") as handle:
                head = Sitemap().parse_xml(fh=handle, sitemapindex=True)
            paths = [_local(index, r.uri) for r in head]
        count = 0
        for path in _pick(paths, sample):
            changes = ChangeList()
            changes.parse(uri=path)
            assert changes.resources[-1].timestamp is not None
            count += len(changes)
        return count

    return run


def prepare_bare_lxml(
    index: str | None, lists: list[str], sample: list[int] | None = None
) -> Callable[[], int]:
    from lxml import etree

    def read(path: str, tag: str) -> tuple[int, list[str]]:
        # The fastest honest idiom: same safety options as rsnotify, one pass
        # over each entry's children, the element freed at once.
        count = 0
        locs: list[str] = []
        fields: tuple[Any, ...] = ()
        for _event, element in etree.iterparse(
            path,
            events=("end",),
            tag=tag,
            resolve_entities=False,
            no_network=True,
            load_dtd=False,
            huge_tree=False,
        ):
            loc = lastmod = md = None
            for child in element:
                child_tag = child.tag
                if child_tag == LOC_TAG:
                    loc = child.text
                elif child_tag == LASTMOD_TAG:
                    lastmod = child.text
                elif child_tag == MD_TAG:
                    md = dict(child.attrib)
            element.clear()
            element.getparent().remove(element)
            fields = (loc, lastmod, md)
            if tag == SITEMAP_TAG and loc is not None:
                locs.append(loc)
            count += 1
        assert fields
        return count, locs

    def run() -> int:
        paths = lists
        if index is not None:
            paths = [_local(index, loc) for loc in read(index, SITEMAP_TAG)[1]]
        return sum(read(path, URL_TAG)[0] for path in _pick(paths, sample))

    return run


def _pick(paths: list[str], sample: list[int] | None) -> list[str]:
    return paths if sample is None else [paths[i] for i in sample]


# --- the run ---------------------------------------------------------------------


@dataclass(slots=True)
class Contender:
    key: str  # stable id in the JSON
    label: str
    input: str  # "change list" or "index set"
    prepare: str
    args: list[Any]
    role: str  # "rsnotify", "resync" or "bare": what the ratios compare
    scale: float = 1.0  # > 1 when a sample is extrapolated to the whole input
    note: str | None = None


def contenders(inputs: Inputs, resync_sample: int | None) -> list[Contender]:
    one = [str(inputs.change_list)]
    index = str(inputs.index)
    lists = [str(p) for p in inputs.lists]
    set_label = f"index set ({len(lists)} x {inputs.set_entries // len(lists):,})"
    out = [
        Contender(
            "rsnotify_stream_list",
            "rsnotify DocumentReader",
            "change list",
            f"{_HERE}:prepare_rsnotify_stream",
            [None, one],
            "rsnotify",
        ),
        Contender(
            "rsnotify_parse_list",
            "rsnotify parse()",
            "change list",
            f"{_HERE}:prepare_rsnotify_parse",
            [None, one],
            "rsnotify_parse",
        ),
        Contender(
            "resync_list",
            "resync ChangeList.parse",
            "change list",
            f"{_HERE}:prepare_resync",
            [None, one],
            "resync",
        ),
        Contender(
            "bare_list",
            "bare lxml iterparse",
            "change list",
            f"{_HERE}:prepare_bare_lxml",
            [None, one],
            "bare",
        ),
        Contender(
            "rsnotify_stream_set",
            "rsnotify DocumentReader",
            set_label,
            f"{_HERE}:prepare_rsnotify_stream",
            [index, []],
            "rsnotify",
        ),
    ]
    resync_note = (
        "resync cannot read a Change List Index as such: ChangeList.read() rejects its "
        "<sitemap> entries (no rs:md change: ChangeTypeError), and a list read through an "
        "index would keep every entry of every list in memory. Timed here: resync's "
        "generic Sitemap.parse_xml reads the index, then each list is parsed with "
        "ChangeList.parse into a fresh ChangeList (resync's best case for memory)."
    )
    if resync_sample is not None and resync_sample < len(lists):
        step = (len(lists) - 1) / max(resync_sample - 1, 1)
        picks = sorted({round(i * step) for i in range(resync_sample)})
        out.append(
            Contender(
                "resync_set",
                f"resync (sampled {len(picks)}/{len(lists)} lists, extrapolated)",
                set_label,
                f"{_HERE}:prepare_resync",
                [index, [], picks],
                "resync",
                scale=len(lists) / len(picks),
                note=resync_note + f" Sampled lists {[p + 1 for p in picks]} of {len(lists)}; "
                "seconds and entries scaled to the whole set, RSS as measured.",
            )
        )
    else:
        out.append(
            Contender(
                "resync_set",
                "resync ChangeList.parse",
                set_label,
                f"{_HERE}:prepare_resync",
                [index, []],
                "resync",
                note=resync_note,
            )
        )
    out.append(
        Contender(
            "bare_set",
            "bare lxml iterparse",
            set_label,
            f"{_HERE}:prepare_bare_lxml",
            [index, []],
            "bare",
        )
    )
    return out


def _row(c: Contender, s: Series, by_role: dict[tuple[str, str], Series]) -> dict[str, Any]:
    entries = round(s.entries * c.scale)
    median_s, best_s = s.median_s * c.scale, s.best_s * c.scale
    rate, best = entries / median_s, entries / best_s
    resync = by_role.get((c.input, "resync"))
    bare = by_role.get((c.input, "bare"))

    def ratio(value: float, other: float | None) -> float | None:
        return value / other if other else None

    return {
        "key": c.key,
        "contender": c.label,
        "input": c.input,
        "entries": entries,
        "extrapolated": c.scale != 1.0,
        "median_s": median_s,
        "best_s": best_s,
        "entries_per_s": rate,
        "best_entries_per_s": best,
        "peak_rss_mb": s.peak_mb,
        "base_rss_mb": s.base_mb,
        "runs_s": [x.seconds * c.scale for x in s.samples],
        # Targets use the best runs: interference from other work only adds time.
        "vs_resync": ratio(best, resync.best_rate if resync else None),
        "vs_bare": ratio(best, bare.best_rate if bare else None),
        "vs_resync_median": ratio(rate, resync.rate if resync else None),
        "vs_bare_median": ratio(rate, bare.rate if bare else None),
        "note": c.note,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.parse", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small inputs, one run: a smoke test")
    ap.add_argument("--repeat", type=int, default=None, help="runs per contender (default 5)")
    ap.add_argument(
        "--resync-sample",
        type=int,
        default=3,
        help="lists of the index set resync reads, extrapolated (0: all)",
    )
    ap.add_argument(
        "--data-dir",
        type=Path,
        default=RESULTS_DIR / "data",
        help="where the generated documents are kept and reused",
    )
    opts = ap.parse_args(argv)

    if opts.quick:
        list_entries, parts, per_part, repeat = 5_000, 4, 5_000, opts.repeat or 1
        resync_sample = None
    else:
        list_entries, parts, per_part, repeat = 50_000, 20, 50_000, opts.repeat or 5
        resync_sample = opts.resync_sample or None

    started = time.perf_counter()
    machine_before = machine_info()
    warn_about_machine(machine_before, "will slow every contender unevenly")
    print(f"generating inputs in {opts.data_dir} (reused when present) ...", flush=True)
    inputs = ensure_inputs(opts.data_dir, list_entries, parts, per_part)
    for path in (inputs.change_list, inputs.index, *inputs.lists):
        path.read_bytes()  # every contender starts from a warm page cache
    bytes_list = inputs.change_list.stat().st_size
    bytes_set = inputs.index.stat().st_size + sum(p.stat().st_size for p in inputs.lists)
    print(
        f"change list: {inputs.list_entries:,} entries, {bytes_list / 1e6:.1f} MB; "
        f"index set: {inputs.set_entries:,} entries, {bytes_set / 1e6:.1f} MB",
        flush=True,
    )

    todo = contenders(inputs, resync_sample)
    series = {c.key: Series() for c in todo}
    # Round-robin so drift on a shared machine spreads over every contender.
    for run in range(1, repeat + 1):
        for c in todo:
            sample = measure(c.prepare, c.args)
            series[c.key].samples.append(sample)
            print(
                f"  run {run}/{repeat}  {c.label:<48} {c.input:<24} "
                f"{sample.seconds:7.2f}s  {sample.rss_peak_mb:6.1f} MB",
                flush=True,
            )

    by_role: dict[tuple[str, str], Series] = {}
    for c in todo:  # ratios compare rates, which a sampled series gives unscaled
        by_role.setdefault((c.input, c.role), series[c.key])
    rows = [_row(c, series[c.key], by_role) for c in todo]

    print()
    headers = [
        "contender",
        "input",
        "entries",
        "median s",
        "best s",
        "entries/s med",
        "entries/s best",
        "peak RSS MB",
        "base RSS MB",
        "x resync",
        "x bare",
    ]
    print(
        format_table(
            headers,
            [
                [
                    r["contender"],
                    r["input"],
                    r["entries"],
                    r["median_s"],
                    r["best_s"],
                    r["entries_per_s"],
                    r["best_entries_per_s"],
                    r["peak_rss_mb"],
                    r["base_rss_mb"],
                    r["vs_resync"],
                    r["vs_bare"],
                ]
                for r in rows
            ],
        )
    )
    print(
        "\nx resync and x bare compare best runs (other work on the machine only adds "
        "time); the JSON also has median-based ratios. Base RSS is the process after its "
        "imports, before reading; peak RSS includes it."
    )
    for r in rows:
        if r["note"]:
            print(f"note ({r['contender']}, {r['input']}): {r['note']}")

    targets = _targets({r["key"]: r for r in rows})
    print()
    for t in targets:
        print(
            f"{'PASS' if t['passed'] else 'FAIL'}  {t['name']}: {t['value']:.2f} "
            f"{t['op']} {t['threshold']}"
        )

    payload = {
        "bench": NAME,
        "quick": opts.quick,
        "repeat": repeat,
        "inputs": {
            "change_list": {
                "path": str(inputs.change_list),
                "entries": inputs.list_entries,
                "bytes": bytes_list,
            },
            "index_set": {
                "index": str(inputs.index),
                "lists": len(inputs.lists),
                "entries": inputs.set_entries,
                "bytes": bytes_set,
            },
        },
        "rows": rows,
        "targets": targets,
        "machine": machine_before,
        "loadavg_after": machine_info()["loadavg_1_5_15"],
        "source": source_digest("rsnotify/sitemap.py", "rsnotify/model.py", "rsnotify/w3cdt.py"),
        "wall_s": time.perf_counter() - started,
    }
    # A smoke run must not overwrite the real measurement.
    path = write_json(f"{NAME}-quick" if opts.quick else NAME, payload)
    print(f"\nwrote {path} in {payload['wall_s']:.0f}s")
    return 0


def _targets(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    def target(name: str, value: float | None, op: str, threshold: float) -> dict[str, Any]:
        ok = value is not None and (value >= threshold if op == ">=" else value <= threshold)
        return {"name": name, "value": value, "op": op, "threshold": threshold, "passed": ok}

    return [
        target(
            "rsnotify vs resync, change list (x)",
            rows["rsnotify_stream_list"]["vs_resync"],
            ">=",
            TARGET_VS_RESYNC,
        ),
        target(
            "rsnotify vs resync, index set (x)",
            rows["rsnotify_stream_set"]["vs_resync"],
            ">=",
            TARGET_VS_RESYNC,
        ),
        target(
            "rsnotify vs bare lxml, change list (x)",
            rows["rsnotify_stream_list"]["vs_bare"],
            ">=",
            TARGET_VS_BARE,
        ),
        target(
            "rsnotify vs bare lxml, index set (x)",
            rows["rsnotify_stream_set"]["vs_bare"],
            ">=",
            TARGET_VS_BARE,
        ),
        target(
            "rsnotify peak RSS, index set (MB)",
            rows["rsnotify_stream_set"]["peak_rss_mb"],
            "<=",
            TARGET_SET_RSS_MB,
        ),
    ]


if __name__ == "__main__":
    sys.exit(main())
