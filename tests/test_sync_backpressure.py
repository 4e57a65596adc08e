"""A subscriber behind its Source holds a bounded backlog (issue 22, the soak).

The sync engine holds at most ``max_in_flight`` changes in its pipeline and
``queue_size`` events in its queue.  It used to take every notification off
its queue at once and hold each as a task, so its memory grew for as long as
it stayed behind; and a full queue put one overflow marker per dropped
event.  Here the Source's resources hang until released: the engine must
stop at the cap, leave the rest in its queue (or drop them behind a single
marker), and still converge once the Source answers again.

A real engine (tests/syncrig.py: applier, mirror directory, SQLite stores,
HTTP fetches) against the minimal Source of tests/minisource.py on a
loopback port.
"""

from __future__ import annotations

from pathlib import Path

from rsnotify.subscriber import events as ev
from tests.devstack import async_wait_for
from tests.minisource import HoldingSource, differences, of_entry
from tests.syncrig import running_engine

CAP = 5
CHANGES = 40
QUEUE = 10


async def test_the_pipeline_stops_at_its_cap_and_the_rest_waits_in_the_queue(
    tmp_path: Path,
) -> None:
    source = HoldingSource()
    await source.start({"a.txt": b"alpha\n"})
    try:
        async with running_engine(source, tmp_path, timeout=60.0, max_in_flight=CAP) as (
            engine,
            task,
        ):
            source.open.clear()  # from now on every fetch hangs: nothing leaves the pipeline
            for seq in range(1, CHANGES + 1):
                entry = source.change(f"f{seq:02d}.txt", f"file {seq}\n".encode())
                engine.offer(ev.Message(of_entry(source, seq, entry), None))

            def held_back() -> bool:
                assert engine.in_flight <= CAP, f"{engine.in_flight} changes in flight, cap {CAP}"
                return engine.in_flight == CAP and engine.queue.qsize() >= CHANGES - CAP - 1

            await async_wait_for(
                held_back,
                timeout=10,
                message=lambda: f"in flight {engine.in_flight}, queued {engine.queue.qsize()}",
            )
            source.open.set()

            def converged() -> bool:
                if task.done():
                    task.result()  # an engine failure is the test's failure
                return not differences(source, tmp_path / "mirror") and engine.in_flight == 0

            await async_wait_for(
                converged,
                timeout=20,
                message=lambda: f"{differences(source, tmp_path / 'mirror')}, {engine.stats}",
            )
    finally:
        source.open.set()
        await source.stop()


async def test_a_full_queue_drops_behind_one_marker_and_the_catch_up_recovers(
    tmp_path: Path,
) -> None:
    source = HoldingSource()
    await source.start({"a.txt": b"alpha\n"})
    try:
        async with running_engine(
            source, tmp_path, timeout=60.0, max_in_flight=CAP, queue_size=QUEUE
        ) as (engine, task):
            source.open.clear()
            for seq in range(1, CAP + 2):  # fill the pipeline, the engine then waits for room
                entry = source.change(f"f{seq:02d}.txt", f"file {seq}\n".encode())
                engine.offer(ev.Message(of_entry(source, seq, entry), None))
            await async_wait_for(lambda: engine.in_flight == CAP, timeout=10)
            for seq in range(CAP + 2, CHANGES + 1):
                entry = source.change(f"f{seq:02d}.txt", f"file {seq}\n".encode())
                engine.offer(ev.Message(of_entry(source, seq, entry), None))
            queued = list(engine.queue._queue)  # type: ignore[attr-defined]
            markers = sum(isinstance(e, ev.Overflow) for e in queued)
            assert len(queued) <= QUEUE and markers == 1, (len(queued), markers)
            source.open.set()

            def converged() -> bool:
                if task.done():
                    task.result()
                return not differences(source, tmp_path / "mirror") and engine.in_flight == 0

            await async_wait_for(
                converged,
                timeout=20,
                message=lambda: f"{differences(source, tmp_path / 'mirror')}, {engine.stats}",
            )
            assert engine.stats.gaps >= 1  # the dropped ones came from the Change List
    finally:
        source.open.set()
        await source.stop()
