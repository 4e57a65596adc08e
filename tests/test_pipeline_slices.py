"""The engine's cursor gives the event loop back while it passes a burst of finished changes.

When a slow change at the head of the pipeline finishes, the hundreds that
finished behind it are passed at once; awaiting a future that is already done
does not yield, so their counting and metrics were one step of the loop
(~20 ms at 200 changes/s in bench.e2e) that every notification arriving
meanwhile waited for.  The cursor loop now looks at the loop every
``COMMIT_SLICE`` items.  A real engine (tests/syncrig.py) against the minimal
Source of tests/minisource.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from rsnotify.subscriber.applier import Outcome
from rsnotify.subscriber.sync import COMMIT_SLICE, _Pending
from tests.devstack import async_wait_for
from tests.minisource import Source
from tests.syncrig import running_engine


async def test_the_cursor_passes_a_burst_of_finished_changes_in_slices(tmp_path: Path) -> None:
    source = Source()
    await source.start({"a.txt": b"alpha\n"})
    try:
        async with running_engine(source, tmp_path) as (engine, _):
            await engine.drain()
            count = 3 * COMMIT_SLICE + 5
            skipped = engine.stats.skipped
            loop = asyncio.get_running_loop()
            head: asyncio.Future[Outcome] = loop.create_future()  # the slow change
            engine._pending.append(_Pending(head, None, None))
            for _ in range(count):
                done: asyncio.Future[Outcome] = loop.create_future()
                done.set_result(Outcome.SKIPPED_ALREADY_APPLIED)
                engine._pending.append(_Pending(done, None, None))
            engine._wake.set()
            seen: list[int] = []  # what the loop saw in flight, once per turn

            async def watch() -> None:
                while True:
                    seen.append(engine.in_flight)
                    await asyncio.sleep(0)

            watching = asyncio.create_task(watch())
            try:
                head.set_result(Outcome.SKIPPED_ALREADY_APPLIED)  # the burst goes through
                await async_wait_for(lambda: engine.in_flight == 0, timeout=10)
            finally:
                watching.cancel()
            between = sorted({n for n in seen if 0 < n < count + 1}, reverse=True)
            assert len(between) >= 3, seen[:20]  # the loop ran between the slices
            assert engine.stats.skipped == skipped + count + 1
    finally:
        await source.stop()
