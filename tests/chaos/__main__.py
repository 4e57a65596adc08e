"""``python -m tests.chaos --minutes N [--only FAULT ...]``: run the fault matrix.

Prints one line per scenario as it finishes, then the table, and writes the
rows to ``chaos-report.json``.  Exit status 1 when any row misses the target
(zero missing, zero stale overwrites, mirror equal, nothing else wrong).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from .faults import BY_NAME, SCENARIOS
from .matrix import report, run_matrix, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="total run time")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(BY_NAME),
        metavar="FAULT",
        help=f"run only this scenario (repeatable): {', '.join(BY_NAME)}",
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help="CI timings: short faults (a 6 s hold is not a real client timeout)",
    )
    parser.add_argument("--report", type=Path, default=Path("chaos-report.json"))
    parser.add_argument("--workdir", type=Path, help="keep logs here (default: a temp dir)")
    args = parser.parse_args(argv)  # fmt: skip
    scenarios = [BY_NAME[n] for n in args.only] if args.only else list(SCENARIOS)
    with tempfile.TemporaryDirectory(prefix="rsnotify-chaos-") as tmp:
        workdir = args.workdir or Path(tmp)
        rows = run_matrix(scenarios, workdir, args.minutes, short=args.short)
    print()
    print(table(rows))
    report(rows, args.report)
    print(f"\nwritten to {args.report}")
    return 0 if all(r.passed for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
