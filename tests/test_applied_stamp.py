"""The telemetry's applied time is when a pushed change was applied, not when the cursor passed it.

The engine counts outcomes in pipeline order, when its cursor moves past
them.  A change applied at once behind one that waits for its Source used
to be stamped then, as late as the slow one: the dashboard's change ->
applied latency and its stages read seconds high at 1,000 changes/s, where
a retried fetch or two always sits at the head of the pipeline.

A real engine (tests/syncrig.py) against the minimal Source of
tests/minisource.py (HoldingSource), one of whose resources hangs until released.
"""

from __future__ import annotations

import time
from pathlib import Path

from rsnotify.envelope import Notification
from rsnotify.subscriber import events as ev
from rsnotify.subscriber.mirror import path_for
from tests.devstack import async_wait_for
from tests.minisource import HoldingSource, of_entry
from tests.syncrig import running_engine


async def test_a_change_applied_behind_a_slow_one_is_stamped_when_it_was_applied(
    tmp_path: Path,
) -> None:
    source = HoldingSource(lambda path: path.endswith("/r/slow.txt"), opened=False)
    await source.start({"a.txt": b"alpha\n"})
    observed: dict[str, float] = {}

    def on_applied(n: Notification, received: float, applied: float) -> None:
        observed[n.loc] = applied

    try:
        async with running_engine(source, tmp_path, timeout=60.0, on_applied=on_applied) as (
            engine,
            task,
        ):
            slow = source.change("slow.txt", b"slow\n")
            fast = source.change("fast.txt", b"fast\n")
            engine.offer(ev.Message(of_entry(source, 1, slow), None))
            engine.offer(ev.Message(of_entry(source, 2, fast), None))
            fast_file = path_for(fast.loc, tmp_path / "mirror")
            # Applied and finished: the file is written before the change's
            # outcome is recorded, and the stamp is taken when it finishes
            # (the applier's own done-callback runs just before the engine's).
            await async_wait_for(
                lambda: fast_file.exists() and engine.applier.pending == 1,
                timeout=10,
                message="fast.txt never applied",
            )
            assert fast.loc not in observed  # not counted yet: the cursor waits for slow.txt
            released_at = time.time()
            source.open.set()

            def both() -> bool:
                if task.done():
                    task.result()  # an engine failure is the test's failure
                return slow.loc in observed and fast.loc in observed

            await async_wait_for(both, timeout=20, message=lambda: f"observed {observed}")
            assert observed[fast.loc] < released_at, "stamped when counted, not when applied"
            assert observed[slow.loc] >= released_at
    finally:
        await source.stop()
