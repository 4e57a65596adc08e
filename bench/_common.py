"""Shared plumbing for the benches: isolated measurement, tables, JSON, machine info.

Every measurement runs in its own fresh interpreter so that peak RSS belongs to
one contender alone (a process's high-water mark never goes down, so measuring
two contenders in one process would charge the second for the first).  The
child imports its libraries, records the resident set, then times only the
work: interpreter start-up and imports are not counted as parsing.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"

# A contender is "module:function".  The function takes JSON-able arguments,
# does its imports and set-up, and returns the zero-argument callable to time;
# that callable returns the number of entries it read.
Prepare = Callable[..., Callable[[], int]]


# --- measuring in a child process ---------------------------------------------


def peak_rss_mb() -> float:
    """This process's peak resident set size, in MB (10**6 bytes).

    On Linux ``getrusage().ru_maxrss`` is the wrong number for a child: exec
    carries the parent's high-water mark over (a child of a 300 MB parent
    reports 300 MB), so the new image's own ``VmHWM`` is read instead.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1_000_000
    except OSError:
        pass
    # Elsewhere: ru_maxrss, in bytes on macOS and KiB on the BSDs.
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 1_000_000


def precompile() -> None:
    """Compile rsnotify's modules to bytecode, as an installed wheel has them.

    pip compiles a wheel's modules when it installs them; the editable
    install of ``make venv`` compiles nothing, and where
    ``PYTHONDONTWRITEBYTECODE`` is set (this machine sets it) the interpreter
    never writes what it compiled, so every ``rsnotify`` process a bench
    starts compiled every module again: 0.09 s of a process that imports the
    subscriber (0.37 -> 0.28 s), inside each catch-up's wall time.  Stale
    bytecode is never used (the source's mtime is checked at import).
    """
    import compileall

    compileall.compile_dir(REPO_ROOT / "rsnotify", quiet=1)


def child_main() -> None:
    """Entry point of the measuring child: ``python -c '...child_main()' target args``."""
    target, raw_args = sys.argv[1], sys.argv[2]
    module_name, _, func_name = target.partition(":")
    prepare: Prepare = getattr(importlib.import_module(module_name), func_name)
    run = prepare(*json.loads(raw_args))
    base = peak_rss_mb()
    start = time.perf_counter()
    entries = run()
    seconds = time.perf_counter() - start
    peak = peak_rss_mb()
    print(
        json.dumps(
            {"entries": entries, "seconds": seconds, "rss_base_mb": base, "rss_peak_mb": peak}
        )
    )


@dataclass(slots=True)
class Sample:
    """One timed run of one contender in one fresh process."""

    entries: int
    seconds: float
    rss_base_mb: float
    rss_peak_mb: float


def measure(target: str, args: Sequence[Any], *, timeout: float = 900.0) -> Sample:
    """Run ``target`` once in a fresh interpreter and return what it measured."""
    code = "from bench._common import child_main; child_main()"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", code, target, json.dumps(list(args))],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{target} failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    return Sample(**json.loads(proc.stdout.strip().splitlines()[-1]))


@dataclass(slots=True)
class Series:
    """Repeated runs of one contender; the rate uses the median, the best is kept too."""

    samples: list[Sample] = field(default_factory=list)

    @property
    def entries(self) -> int:
        return self.samples[0].entries

    @property
    def median_s(self) -> float:
        return statistics.median(s.seconds for s in self.samples)

    @property
    def best_s(self) -> float:
        return min(s.seconds for s in self.samples)

    @property
    def rate(self) -> float:
        return self.entries / self.median_s

    @property
    def best_rate(self) -> float:
        return self.entries / self.best_s

    @property
    def peak_mb(self) -> float:
        return max(s.rss_peak_mb for s in self.samples)

    @property
    def base_mb(self) -> float:
        return max(s.rss_base_mb for s in self.samples)


# --- output ----------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table: text left, numbers right."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    numeric = [
        all(_is_number(row[i]) for row in rows) if rows else False for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    out = [line(list(headers)), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value >= 1000:
            return f"{value:,.0f}"
        if value >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` (the directory is gitignored)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def machine_info() -> dict[str, Any]:
    """Enough about the machine to tell whether two result files are comparable."""
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gb": _memory_gb(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # Other work on the machine skews every number: keep the evidence.
        "loadavg_1_5_15": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    info["cpu_probe_ms"] = cpu_probe_ms()
    info["handoff_probe_us"] = handoff_probe_us()
    info["git_head"] = _git_head()
    for dist in ("lxml", "resync", "rsnotify"):
        info[f"{dist}_version"] = _version(dist)
    try:
        from lxml import etree

        info["libxml2_version"] = ".".join(map(str, etree.LIBXML_VERSION))
    except ImportError:
        pass
    return info


def cpu_probe_ms(rounds: int = 5) -> float:
    """This machine's speed now: the best of ``rounds`` runs of a fixed pure-Python loop (ms).

    Every bench compares within one run, but a figure copied into a README
    is worth the day it was measured on: this shared host's speed moves from
    day to day (session 42: ``bench.parse`` read 64-68k entries/s where its
    README says 145k, every process's CPU per change about doubled).  Lower
    is faster; two result files whose probes differ by more than ~20 % were
    not measured on the same machine, whatever its name.
    """
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        counts: dict[int, int] = {}
        for i in range(200_000):
            key = i & 1023
            counts[key] = counts.get(key, 0) + i
        best = min(best, time.perf_counter() - started)
    return best * 1000


def handoff_probe_us(round_trips: int = 1000, rounds: int = 3) -> dict[str, float]:
    """CPU (us, all threads) of one thread-pool round trip from an event loop.

    ``run_in_executor`` of a function that does nothing: what the subscriber
    pays each time it hands work to its writer, resource-store or cursor
    thread and is woken with the result (a few per change at low rates, where
    there is no batch to share them).  On this VM one costs 71-100 us with
    the loop and the thread on one CPU and 154-200 us across two (session
    45), so per-change figures of two machines with the same CPU probe may
    still differ by it.  ``one_cpu``: both on the lowest CPU this process
    may use; ``all_cpus``: as scheduled.  Best of ``rounds``.  Empty where
    CPU affinity cannot be set (not Linux).
    """
    from .cpusides import on_cpus

    def probe() -> float:
        async def measure() -> float:
            loop = asyncio.get_running_loop()
            with ThreadPoolExecutor(1) as pool:
                await loop.run_in_executor(pool, int)  # the thread exists before timing
                best = float("inf")
                for _ in range(rounds):
                    started = time.process_time()
                    for _ in range(round_trips):
                        await loop.run_in_executor(pool, int)
                    best = min(best, (time.process_time() - started) / round_trips)
            return best * 1e6

        return asyncio.run(measure())

    def in_thread() -> float:
        # A thread of its own: no event loop running there, whoever calls this;
        # it (and the pool's thread) inherit the affinity it was started with.
        result: list[float] = []
        failure: list[BaseException] = []

        def run() -> None:
            try:
                result.append(probe())
            except BaseException as exc:  # raised again in the caller's thread
                failure.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        if failure:
            raise RuntimeError(f"the handoff probe failed: {failure[0]!r}") from failure[0]
        return result[0]

    if not hasattr(os, "sched_getaffinity"):  # not Linux: no way to pin the probe
        return {}
    with on_cpus({min(os.sched_getaffinity(0))}):
        one_cpu = in_thread()
    return {"one_cpu": round(one_cpu, 1), "all_cpus": round(in_thread(), 1)}


def warn_about_machine(info: dict[str, Any], effect: str) -> None:
    """Print the CPU probe, and a warning when other work loads the machine (``effect``)."""
    print(
        f"machine: CPU probe {info['cpu_probe_ms']:.1f} ms (bench._common.cpu_probe_ms: "
        "lower is faster; compare it before comparing figures across days)",
        flush=True,
    )
    handoff = info.get("handoff_probe_us")
    if handoff:
        print(
            f"machine: a thread-pool round trip costs {handoff['one_cpu']:.0f} us of CPU on "
            f"one CPU, {handoff['all_cpus']:.0f} us across CPUs (bench._common.handoff_probe_us)",
            flush=True,
        )
    load = info["loadavg_1_5_15"]
    if load and load[0] > 0.5:
        print(
            f"warning: load average {load[0]:.2f} before the run: other work on this "
            f"machine {effect}",
            flush=True,
        )


def _git_head() -> str | None:
    # rev-parse only reads: it never takes the index lock a concurrent commit needs.
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def source_digest(*relative: str) -> dict[str, str]:
    """SHA-256 (first 16 hex digits) of source files, to tie a result to the code measured.

    The working tree may be ahead of HEAD while code is being written.
    """
    out = {}
    for name in relative:
        path = REPO_ROOT / name
        if path.exists():
            out[name] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return out


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_gb() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)
    except (ValueError, OSError, AttributeError):
        return None
