"""The sync engine holds at most ``max_in_flight`` changes in its pipeline (issue 22).

A subscriber slower than its Source used to take every notification off its
queue at once and hold each as a task, so its memory grew for as long as it
stayed behind (the 500 changes/s soak).  Here the Source's resources hang
until released: the engine must stop at the cap, leave the rest in its
queue, and still apply everything once the Source answers again.

A real engine (applier, mirror directory, SQLite stores, HTTP fetches)
against the minimal Source of tests/minisource.py on a loopback port.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from aiohttp import web

from rsnotify.devstack import async_wait_for
from rsnotify.fetch import Fetcher
from rsnotify.publisher.access import HttpAccess
from rsnotify.publisher.watcher import CollectionWatcher
from rsnotify.subscriber import events as ev
from rsnotify.subscriber.applier import Applier
from rsnotify.subscriber.baseline import baseline
from rsnotify.subscriber.cursor import CursorStore
from rsnotify.subscriber.gaps import GapDetector
from rsnotify.subscriber.mirror import Mirror
from rsnotify.subscriber.resources import ResourceStore
from rsnotify.subscriber.sync import CollectionSync
from rsnotify.tracker import Checkpoint
from tests.minisource import Source, differences, of_entry

CAP = 5
CHANGES = 40


class HangingSource(Source):
    """A Source whose resources answer only while ``open`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.open = asyncio.Event()
        self.open.set()

    async def _handle(self, request: web.Request) -> web.Response:
        if request.path.startswith("/r/"):
            await self.open.wait()
        return await super()._handle(request)


async def test_the_pipeline_stops_at_its_cap_and_the_rest_waits_in_the_queue(
    tmp_path: Path,
) -> None:
    source = HangingSource()
    await source.start({"a.txt": b"alpha\n"})
    fetcher = Fetcher()
    resources = ResourceStore(tmp_path / "resources.sqlite3")
    cursors = CursorStore(tmp_path / "cursor.sqlite3")
    task: asyncio.Task[None] | None = None
    engine: CollectionSync | None = None
    try:
        applier = Applier(
            Mirror(tmp_path / "mirror"),
            resources,
            fetcher,
            allowed_origins=[source.base],
            retries=1,
            not_found_retries=0,
            backoff_initial=0.01,
            backoff_max=0.02,
            timeout=60.0,
        )
        watcher = CollectionWatcher(
            access=HttpAccess(fetcher),
            collection=source.collection,
            capability_list=source.capability_list,
            changelist_url=source.changelist,
            checkpoint=Checkpoint(started=True),
        )
        engine = CollectionSync(
            collection=source.collection,
            capability_list=source.capability_list,
            watcher=watcher,
            applier=applier,
            cursors=cursors,
            detector=GapDetector(
                heartbeat_timeout=3600, head_grace=3600, safety_interval=3600, now=time.monotonic()
            ),
            tick=0.05,
            max_in_flight=CAP,
            resourcelist_url=source.url("resourcelist.xml"),
        )

        async def initial() -> object:
            summary = await baseline(
                fetcher, applier, source.url("resourcelist.xml"), collection=source.collection,
                workdir=tmp_path,
            )  # fmt: skip
            return summary.at

        await engine.start(initial)
        task = asyncio.create_task(engine.run())
        source.open.clear()  # from now on every fetch hangs: nothing leaves the pipeline
        for seq in range(1, CHANGES + 1):
            entry = source.change(f"f{seq:02d}.txt", f"file {seq}\n".encode())
            engine.offer(ev.Message(of_entry(source, seq, entry), None))
        live = engine

        def held_back() -> bool:
            assert live.in_flight <= CAP, f"{live.in_flight} changes in flight, cap {CAP}"
            return live.in_flight == CAP and live.queue.qsize() >= CHANGES - CAP - 1

        await async_wait_for(
            held_back,
            timeout=10,
            message=lambda: f"in flight {live.in_flight}, queued {live.queue.qsize()}",
        )
        source.open.set()

        def converged() -> bool:
            if task.done():
                task.result()  # an engine failure is the test's failure
            return not differences(source, tmp_path / "mirror") and live.in_flight == 0

        await async_wait_for(
            converged,
            timeout=20,
            message=lambda: f"{differences(source, tmp_path / 'mirror')}, {live.stats}",
        )
    finally:
        source.open.set()
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if engine is not None:
            await engine.close()
        await fetcher.close()
        await cursors.close()
        await resources.close()
        await source.stop()
