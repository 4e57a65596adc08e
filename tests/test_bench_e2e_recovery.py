"""bench.e2e's verdict on a subscriber's recovery after ``--stall`` (pure: the window only).

The bench stops the subscriber a third into its window and reports how long
after the resume it was back to its pace; these tests build windows whose
answer is known and check the verdict, including the two ways of never
recovering (changes keep waiting, changes never applied), and that a lone
slow change is not a backlog.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.e2e import Change, PhaseWindow

START = 1_000.0  # the window's start (s)
STOPPED, RESUMED = 1_010.0, 1_012.0  # the stall (s)
END = 1_030.0


def _window(
    wait_ms: Callable[[float], float], *, applied: Callable[[float], bool] = lambda _t: True
) -> PhaseWindow:
    """A change every 10 ms of the window, each waiting ``wait_ms(made_at)`` ms."""
    changes, reached = [], []
    for k in range(int((END - START) * 100)):
        made = START + k / 100
        change = Change(f"http://s.example/r{k % 50}", "updated", round(made * 1e6))
        changes.append(change)
        if applied(made):
            reached.append((change, change.datetime_us + round(wait_ms(made) * 1000)))
    return PhaseWindow(
        start=START,
        end=END,
        changes=changes,
        reached=reached,
        outcomes={},
        cpu_pct={},
        metrics_text="",
        waited_until=END + 5,
        stall=(STOPPED, RESUMED),
    )


def test_recovery_is_the_first_second_after_the_resume_from_which_every_second_kept_pace() -> None:
    # 10 ms before the stall (bound: 2 x p90 10 + 10 = 30 ms); 3 s after the resume,
    # changes still wait 500 ms, then 10 ms again.
    window = _window(lambda t: 10.0 if t < STOPPED or t >= RESUMED + 3 else 500.0)
    assert window.recovery_s() == 3.0


def test_no_recovery_when_the_lag_holds_to_the_end_of_the_window() -> None:
    window = _window(lambda t: 10.0 if t < STOPPED else 2_000.0)
    assert window.recovery_s() is None


def test_changes_never_applied_after_the_resume_mean_not_recovered() -> None:
    last = END - 1.0
    window = _window(lambda t: 10.0, applied=lambda t: t < last)
    assert window.recovery_s() is None


def test_one_slow_change_is_the_tail_a_slow_second_is_a_backlog() -> None:
    # Bound: 2 x p90 (10 ms) + 10 = 30 ms.  One change 5 s after the resume waits
    # 400 ms: the tail, recovered at once; every change of that second waits
    # 400 ms: back to its pace only from the second after it.
    late = RESUMED + 5.0
    one = _window(lambda t: 400.0 if abs(t - late) < 1e-6 else 10.0)
    assert one.recovery_s() == 0.0
    whole = _window(lambda t: 400.0 if late <= t < late + 1 else 10.0)
    assert whole.recovery_s() == 6.0


def test_without_a_stall_there_is_nothing_to_recover_from() -> None:
    window = _window(lambda t: 10.0)
    window.stall = None
    assert window.recovery_s() is None
