"""``python -m tests.fuzz --minutes N``: run every fuzzer for a wall-clock budget.

The budget is split evenly between the runs: each hypothesis fuzzer of
:mod:`tests.fuzz.fuzzers` runs in rounds of 500 examples until its share is
spent, and, when atheris is installed (``--engine auto``, the default), each
raw-bytes target gets a coverage-guided libFuzzer run in a child process
(:mod:`tests.fuzz.atheris_main`).  ``--engine hypothesis`` or ``atheris``
runs only one kind.  Findings are printed with the failing input; atheris also
writes it, and its corpus, under ``--artifacts`` (default
``.hypothesis/atheris``, which git ignores).  Exit status 1 if anything was found.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given

from .fuzzers import FUZZERS, Fuzzer, long_run
from .seeds import write_corpus
from .targets import RAW_TARGETS


def run_hypothesis(fuzzer: Fuzzer, seconds: float) -> tuple[int, str | None]:
    """Rounds of 500 examples until ``seconds`` are spent; (examples run, failure or None)."""
    deadline = time.monotonic() + seconds
    examples = 0
    while time.monotonic() < deadline:
        test = long_run(500)(given(fuzzer.strategy)(fuzzer.target))
        try:
            test()
        except Exception as exc:  # the finding itself, already shrunk by hypothesis
            return examples, f"{type(exc).__name__}: {exc}"
        examples += 500
    return examples, None


def run_atheris(name: str, seconds: float, artifacts: Path) -> tuple[str, str | None]:
    """One libFuzzer run in a child (atheris cannot run twice in a process)."""
    corpus = artifacts / "corpus" / name
    write_corpus(name, corpus)
    argv = [
        sys.executable,
        "-m",
        "tests.fuzz.atheris_main",
        name,
        str(corpus),
        f"-max_total_time={max(1, int(seconds))}",
        f"-artifact_prefix={artifacts}/{name}-",
        "-rss_limit_mb=2048",
        "-timeout=20",
        "-print_final_stats=1",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    stats = [line for line in done.stderr.splitlines() if line.startswith("stat::")]
    summary = ", ".join(
        line.split("::", 1)[1].replace(":", "=").replace(" ", "")
        for line in stats
        if "number_of_executed_units" in line or "peak_rss" in line
    )
    if done.returncode != 0:
        return summary, done.stderr[-4000:]
    return summary, None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--minutes", type=float, default=5.0, help="total budget (default 5)")
    parser.add_argument(
        "--only", action="append", default=[], help="fuzzer name or prefix: sitemap, ws-... "
    )
    parser.add_argument(
        "--engine", choices=("auto", "hypothesis", "atheris"), default="auto",
        help="auto: hypothesis, plus atheris when installed",
    )  # fmt: skip
    parser.add_argument(
        "--artifacts", type=Path, default=Path(".hypothesis/atheris"), help="corpus and crashes"
    )
    args = parser.parse_args(argv)
    have_atheris = importlib.util.find_spec("atheris") is not None
    if args.engine == "atheris" and not have_atheris:
        parser.error("atheris is not installed (pip install atheris)")
    use_hypothesis = args.engine in ("auto", "hypothesis")
    use_atheris = args.engine == "atheris" or (args.engine == "auto" and have_atheris)

    def chosen(name: str) -> bool:
        return not args.only or any(name.startswith(o) or o.startswith(name) for o in args.only)

    fuzzers = [f for f in FUZZERS.values() if chosen(f.name)]
    raw = [n for n in RAW_TARGETS if chosen(n)]
    if not fuzzers and not raw:
        parser.error(f"no fuzzer matches {args.only}; known: {', '.join(FUZZERS)}")
    runs = (len(fuzzers) if use_hypothesis else 0) + (len(raw) if use_atheris else 0)
    share = args.minutes * 60 / max(1, runs)
    args.artifacts.mkdir(parents=True, exist_ok=True)
    found = 0
    print(f"{'engine':<11} {'fuzzer':<20} {'seconds':>7}  result")
    if use_hypothesis:
        for fuzzer in fuzzers:
            started = time.monotonic()
            examples, failure = run_hypothesis(fuzzer, share)
            spent = time.monotonic() - started
            print(f"hypothesis  {fuzzer.name:<20} {spent:7.0f}  {examples}+ examples, "
                  f"{'FOUND ' + failure if failure else 'nothing found'}", flush=True)  # fmt: skip
            found += failure is not None
    if use_atheris:
        for name in raw:
            started = time.monotonic()
            summary, failure = run_atheris(name, share, args.artifacts)
            spent = time.monotonic() - started
            result = f"FOUND:\n{failure}" if failure else "nothing found"
            print(f"atheris     {name:<20} {spent:7.0f}  {summary}, {result}", flush=True)
            found += failure is not None
    elif args.engine == "auto":
        print("atheris not installed: hypothesis only (pip install atheris to add it)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
