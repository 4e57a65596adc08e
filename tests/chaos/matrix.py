"""Run fault scenarios, check what the subscribers ended with, write the report.

Per scenario: start a fresh :class:`~.stack.Stack` in the scenario's
environment, inject the fault again and again until the scenario's time
budget is spent (at least once), measuring after each clear how long the
subscribers take to catch up with the Source as of that moment.  Then freeze
the Source, give the subscribers a deadline to converge and compare.

A row of ``chaos-report.json``: ``fault``, ``injected``, ``published``
(notifications sequenced by the publisher), ``applied`` (writes and deletes in
both apply logs), ``duplicates_applied`` (a (loc, datetime) written twice),
``missing`` (mirror files missing, extra or different at the end),
``stale_overwrites`` (a newer version overwritten by an older one),
``mirror_equal``, ``worst_recovery_s``; plus ``problems`` (anything else that
went wrong: a process that died, a recovery that timed out, temp files left)
and ``notes``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.devstack import wait_for

from .faults import FULL, SHORT, Context, Scenario, Timing
from .stack import Stack

CONVERGE_TIMEOUT_S = 120.0
RECOVERY_TIMEOUT_S = 180.0


@dataclass
class Row:
    fault: str
    injected: int = 0
    published: int = 0
    applied: int = 0
    duplicates_applied: int = 0
    missing: int = 0
    stale_overwrites: int = 0
    mirror_equal: bool = False
    worst_recovery_s: float | None = None
    source_changes: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return (
            self.injected > 0
            and self.missing == 0
            and self.stale_overwrites == 0
            and self.mirror_equal
            and not self.problems
        )


def run_scenario(scenario: Scenario, workdir: Path, budget_s: float, timing: Timing) -> Row:
    """Run one scenario for about ``budget_s`` seconds of injections (at least one)."""
    row = Row(scenario.name)
    started = time.monotonic()
    try:
        with scenario.environment(workdir) as options, Stack(workdir, options) as stack:
            stack.start()
            ctx = Context(stack, timing, workdir)
            _inject_repeatedly(scenario, stack, ctx, budget_s, row)
            _judge(stack, row, ctx.unlisted)
    except Exception as exc:  # a scenario that breaks is a result, not the end of the matrix
        row.problems.append(f"{type(exc).__name__}: {exc}"[:2000])
        row.notes.append(traceback.format_exc(limit=3)[-1500:])
    row.seconds = round(time.monotonic() - started, 1)
    return row


def _inject_repeatedly(
    scenario: Scenario, stack: Stack, ctx: Context, budget_s: float, row: Row
) -> None:
    deadline = time.monotonic() + budget_s
    worst = 0.0
    while row.injected == 0 or time.monotonic() < deadline:
        time.sleep(ctx.timing.healthy_s)  # the scenario: the stack runs undisturbed
        scenario.inject(ctx)
        row.injected += 1
        try:
            worst = max(worst, stack.wait_recovered(timeout=RECOVERY_TIMEOUT_S))
        except AssertionError as exc:
            row.problems.append(f"no recovery after injection {row.injected}: {exc}"[:2000])
            break
        row.worst_recovery_s = round(worst, 2)
    row.notes.extend(_summarise(ctx.notes))


def _judge(stack: Stack, row: Row, unlisted: int) -> None:
    state = stack.freeze()
    row.source_changes = sum(c["changes"] for c in state["collections"].values())
    differences = stack.converge(state, CONVERGE_TIMEOUT_S)
    # Every change the Source listed gets exactly one sequence number, whatever
    # crashed: the log's append and checkpoint are one atomic step.
    with contextlib.suppress(AssertionError):
        wait_for(lambda: stack.published() >= row.source_changes - unlisted, timeout=60)
    row.published = stack.published()
    if not row.source_changes - unlisted <= row.published <= row.source_changes:
        row.problems.append(
            f"published {row.published} notifications for {row.source_changes} Source changes"
            + (f" ({unlisted} removed from the Change Lists)" if unlisted else "")
        )
    row.mirror_equal = not any(differences.values())
    for name in stack.subscribers:
        outcome = stack.outcome(name, differences.get(name, []))
        row.applied += outcome.applied
        row.duplicates_applied += outcome.duplicates_applied
        row.missing += len(outcome.differences)
        row.stale_overwrites += len(outcome.stale)
        if outcome.differences:
            row.problems.append(f"{name}: {outcome.differences[:3]}")
        if outcome.stale:
            row.problems.append(f"{name} stale: {outcome.stale[:3]}")
        if outcome.temp_files:
            row.problems.append(f"{name} left temp files: {outcome.temp_files[:3]}")
    dead = stack.dead()
    if dead:
        row.problems.append(f"not running at the end: {dead}")


def _summarise(notes: list[str]) -> list[str]:
    """Identical notes counted once (``3x dropped 2``)."""
    counts: dict[str, int] = {}
    for note in notes:
        counts[note] = counts.get(note, 0) + 1
    return [f"{n}x {note}" if n > 1 else note for note, n in counts.items()]


# --- reporting --------------------------------------------------------------------

COLUMNS = (
    ("fault", 25),
    ("injected", 8),
    ("published", 9),
    ("applied", 8),
    ("duplicates_applied", 10),
    ("missing", 7),
    ("stale_overwrites", 5),
    ("mirror_equal", 5),
    ("worst_recovery_s", 8),
)
HEADERS = {"duplicates_applied": "dup", "stale_overwrites": "stale", "mirror_equal": "equal",
           "worst_recovery_s": "recov_s"}  # fmt: skip


def table(rows: list[Row]) -> str:
    def cell(value: object) -> str:
        if isinstance(value, bool):
            return "yes" if value else "NO"
        return "-" if value is None else str(value)

    lines = [" ".join(HEADERS.get(c, c).ljust(w) for c, w in COLUMNS)]
    for row in rows:
        values = asdict(row)
        lines.append(" ".join(cell(values[c]).ljust(w) for c, w in COLUMNS))
        for problem in row.problems:
            lines.append(f"    problem: {problem[:300]}")
    return "\n".join(lines)


def report(rows: list[Row], path: Path) -> None:
    path.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")


def run_matrix(
    scenarios: list[Scenario], workdir: Path, minutes: float, *, short: bool = False
) -> list[Row]:
    """Every scenario with an equal share of ``minutes`` (setup and checks included)."""
    timing = SHORT if short else FULL
    overhead_s = 15.0  # start, converge, compare, stop: not spent injecting
    share = minutes * 60 / max(1, len(scenarios))
    rows = []
    for scenario in scenarios:
        directory = workdir / scenario.name
        shutil.rmtree(directory, ignore_errors=True)
        row = run_scenario(scenario, directory, max(0.0, share - overhead_s), timing)
        print(table([row]).splitlines()[1], flush=True)
        rows.append(row)
    return rows
