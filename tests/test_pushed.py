"""The reconciliation rule after a failover (issue 19): as pure code (rsnotify.publisher.pushed),
and the sequencer reading a real log for it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsnotify.log import Retention
from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.metrics import PublisherMetrics
from rsnotify.publisher.pushed import PushedWindow, Refuse, Rewrite
from rsnotify.publisher.sequencer import Sequencer


def window(high: int, capacity: int = 100) -> PushedWindow:
    """Seqs 1..high appended, entry ``e<seq>``, checkpoint ``cp<high>``."""
    w = PushedWindow(capacity)
    for seq in range(1, high + 1):
        w.record(seq, [f"e{seq}".encode()], f"cp{seq}")
    return w


def log_of(high: int, changed: dict[int, bytes] | None = None) -> dict[int, bytes]:
    entries = {seq: f"e{seq}".encode() for seq in range(1, high + 1)}
    entries.update(changed or {})
    return entries


@pytest.mark.parametrize(
    ("pushed", "capacity", "head", "earliest", "log", "verdict"),
    [
        # nothing pushed: nothing to check
        (0, 100, 5, 1, log_of(5), None),
        # the log holds all of it, or more (another publisher went on)
        (10, 100, 10, 1, log_of(10), None),
        (10, 100, 12, 1, log_of(12), None),
        # retention trimmed the oldest: only what is retained is compared
        (10, 100, 10, 6, {s: e for s, e in log_of(10).items() if s >= 6}, None),
        # a failover lost 8..10: written again, same bytes, checkpoint of the last
        (10, 100, 7, 1, log_of(7), Rewrite(7, (b"e8", b"e9", b"e10"), "cp10")),
        (10, 100, 0, 1, {}, Rewrite(0, tuple(f"e{s}".encode() for s in range(1, 11)), "cp10")),
        # lost more than is held
        (10, 3, 5, 1, log_of(5), Refuse("...")),
        # a pushed seq now means another entry
        (10, 100, 10, 1, log_of(10, {4: b"other"}), Refuse("...")),
        (10, 100, 7, 1, log_of(7, {7: b"other"}), Refuse("...")),
        (10, 100, 12, 1, log_of(12, {10: b"other"}), Refuse("...")),
        # a pushed seq the log should retain is missing
        (10, 100, 10, 1, {s: e for s, e in log_of(10).items() if s != 3}, Refuse("...")),
    ],
)
def test_reconcile_table(
    pushed: int,
    capacity: int,
    head: int,
    earliest: int,
    log: dict[int, bytes],
    verdict: Rewrite | Refuse | None,
) -> None:
    got = window(pushed, capacity).reconcile(head, earliest, log)
    if isinstance(verdict, Refuse):
        assert isinstance(got, Refuse), got
    else:
        assert got == verdict


def test_a_gap_in_appends_restarts_the_window() -> None:
    w = window(5)
    w.record(9, [b"e9"], "cp9")  # another writer appended 6..8
    assert (w.low, w.high) == (9, 9)
    assert w.reconcile(9, 1, log_of(9)) is None


@given(
    pushed=st.integers(0, 40),
    capacity=st.integers(1, 40),
    head=st.integers(0, 60),
    earliest=st.integers(1, 30),
    changed=st.dictionaries(st.integers(1, 60), st.binary(min_size=1, max_size=3), max_size=3),
)
def test_after_reconciling_no_pushed_seq_means_another_entry(
    pushed: int, capacity: int, head: int, earliest: int, changed: dict[int, bytes]
) -> None:
    """Whatever the log lost or changed: agree, restore exactly, or refuse; never accept."""
    w = window(pushed, capacity)
    log = {s: e for s, e in log_of(head, changed).items() if s >= earliest}
    verdict = w.reconcile(head, earliest, log)
    if isinstance(verdict, Refuse):
        return
    if isinstance(verdict, Rewrite):
        assert verdict.after == head
        log.update({head + 1 + i: p for i, p in enumerate(verdict.payloads)})
        head += len(verdict.payloads)
    assert head >= w.high
    for seq in range(max(w.low, earliest), w.high + 1):
        assert log[seq] == w.held(seq)


async def test_reconcile_does_not_take_a_trim_beside_it_for_a_loss(tmp_path: Path) -> None:
    """Retention runs beside the sequencer (keep_retention); a reload reconciles meanwhile.

    The reconciliation read ``earliest``, then the entries: a trim landing
    between the two removed seqs it still expected, and the collection
    stopped with LogDiverged ("the log holds nothing at seq 3, which was
    pushed").  Here the trim lands exactly there, on a real SQLite log.
    """

    class TrimmedAfterEarliest(SQLiteLog):
        trims = 0

        async def earliest(self, collection: str) -> int:
            earliest = await super().earliest(collection)
            if not self.trims:  # the retention task's turn, once
                self.trims += 1
                await self.trim(collection, Retention(max_len=6, max_age_s=None), 0)
            return earliest

    log = TrimmedAfterEarliest(tmp_path / "log.sqlite3")
    try:
        sequencer = Sequencer(
            log, PublisherMetrics(), batch=10, retention=Retention(max_len=None, max_age_s=None)
        )
        payloads = [f"e{seq}".encode() for seq in range(1, 11)]
        assert await log.append("c", payloads, expected_head=0, checkpoint="cp10") == 10
        sequencer.pushed["c"] = window(10)
        await sequencer.reconcile(SimpleNamespace(id="c"))  # type: ignore[arg-type]
        assert log.trims == 1
        assert [r.seq for r in await log.read("c", 0)] == [5, 6, 7, 8, 9, 10]
    finally:
        await log.close()
