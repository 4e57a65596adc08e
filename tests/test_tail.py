"""The one log tailer of the WebSocket gateway and the WebSub hub, on a real (SQLite) log."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from rsnotify.log import LogRecord
from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.transport.tail import WAIT_TIMEOUT, LogTail
from tests.devstack import async_wait_for


@dataclass(frozen=True)
class Item:
    seq: int
    read_at: float


@dataclass(eq=False)
class Reader:
    wake: asyncio.Event = field(default_factory=asyncio.Event)


async def _append(log: SQLiteLog, count: int, *, max_len: int | None = None) -> None:
    head = await log.head("c")
    payloads = [b'{"n": %d}' % (head + i) for i in range(1, count + 1)]
    await log.append("c", payloads, expected_head=head, checkpoint="x", max_len=max_len)


async def test_each_record_is_rendered_once_into_a_bounded_ring_and_readers_are_woken(
    tmp_path: Path,
) -> None:
    log = SQLiteLog(tmp_path / "log.sqlite3")
    rendered: list[int] = []

    def render(record: LogRecord, read_at: float) -> Item:
        rendered.append(record.seq)
        return Item(record.seq, read_at)

    tail: LogTail[Item, Reader] = LogTail(log, "c", 0, 4, render, batch=100)
    readers = [Reader(), Reader()]
    tail.readers.update(readers)
    task = asyncio.create_task(tail.run())
    try:
        await _append(log, 3)
        await async_wait_for(lambda: tail.position == 3, message="tail did not read 1..3")
        assert all(r.wake.is_set() for r in readers)
        assert [i.seq for i in tail.ring] == [1, 2, 3] and tail.window_start == 1
        await _append(log, 3)
        await async_wait_for(lambda: tail.position == 6, message="tail did not read 4..6")
        assert [i.seq for i in tail.ring] == [3, 4, 5, 6]  # capacity 4: the oldest fell out
        assert tail.window_start == 3 and tail.item(5).seq == 5
        assert rendered == [1, 2, 3, 4, 5, 6]
        assert all(i.read_at > 0 for i in tail.ring)
        # No reader left: the tail ends by itself within one wait.
        tail.readers.clear()
        await async_wait_for(task.done, timeout=WAIT_TIMEOUT * 3, message="tail did not end")
        assert task.exception() is None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await log.close()


async def test_the_ring_restarts_after_records_trimmed_before_the_tail_read_them(
    tmp_path: Path,
) -> None:
    log = SQLiteLog(tmp_path / "log.sqlite3")
    tail: LogTail[Item, Reader] = LogTail(log, "c", 0, 16, lambda r, t: Item(r.seq, t), batch=100)
    await _append(log, 2)
    tail.advance(await log.read("c", 0))
    assert [i.seq for i in tail.ring] == [1, 2]
    await _append(log, 8, max_len=3)  # 3..10 logged, 3..7 trimmed before the tail read them
    tail.advance(await log.read("c", tail.position))
    assert [i.seq for i in tail.ring] == [8, 9, 10]  # dense: no 3..7 hole inside the ring
    assert tail.window_start == 8 and tail.position == 10
    await log.close()


async def test_an_empty_ring_starts_after_the_position(tmp_path: Path) -> None:
    log = SQLiteLog(tmp_path / "log.sqlite3")
    tail: LogTail[Item, Reader] = LogTail(log, "c", 41, 16, lambda r, t: Item(r.seq, t), batch=100)
    assert tail.window_start == 42
    await log.close()
