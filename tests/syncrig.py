"""One real sync engine following a :class:`tests.minisource.Source`, for engine-level tests.

The applier, mirror directory, SQLite stores, HTTP fetches and Change List
walks are the subscriber's own; only the push channel is replaced by the
engine's queue (tests call ``engine.offer``), since these tests are about
what the engine does with what it receives.  The MQTT and WebSocket paths to
that queue are tested with real brokers elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rsnotify.changes.access import HttpAccess
from rsnotify.changes.watcher import CollectionWatcher
from rsnotify.fetch import Fetcher
from rsnotify.subscriber.applier import Applier
from rsnotify.subscriber.baseline import baseline
from rsnotify.subscriber.cursor import CursorStore
from rsnotify.subscriber.gaps import GapDetector
from rsnotify.subscriber.mirror import Mirror
from rsnotify.subscriber.resources import ResourceStore
from rsnotify.subscriber.sync import CollectionSync
from rsnotify.tracker import Checkpoint
from tests.minisource import Source


@contextlib.asynccontextmanager
async def running_engine(
    source: Source,
    tmp: Path,
    *,
    timeout: float = 5.0,
    metadata_only: bool = False,
    **engine_options: Any,
) -> AsyncIterator[tuple[CollectionSync, asyncio.Task[None]]]:
    """An engine mirroring ``source`` into ``tmp / "mirror"``: baselined, then running.

    Yields the engine and the task of its :meth:`~CollectionSync.run`;
    ``engine_options`` go to :class:`CollectionSync` (``keys``,
    ``doubt_interval``, ``max_in_flight`` ...), ``timeout`` to the applier's
    fetches, ``metadata_only`` to the applier.  Everything but the Source is
    closed on exit.
    """
    fetcher = Fetcher()
    resources = ResourceStore(tmp / "resources.sqlite3")
    cursors = CursorStore(tmp / "cursor.sqlite3")
    task: asyncio.Task[None] | None = None
    engine: CollectionSync | None = None
    try:
        applier = Applier(
            Mirror(tmp / "mirror"),
            resources,
            fetcher,
            allowed_origins=[source.base],
            retries=1,
            not_found_retries=0,
            backoff_initial=0.01,
            backoff_max=0.02,
            timeout=timeout,
            metadata_only=metadata_only,
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
                heartbeat_timeout=3600, head_grace=0.2, safety_interval=3600, now=time.monotonic()
            ),
            tick=0.05,
            resourcelist_url=source.url("resourcelist.xml"),
            **engine_options,
        )

        async def initial() -> object:
            summary = await baseline(
                fetcher, applier, source.url("resourcelist.xml"), collection=source.collection,
                workdir=tmp,
            )  # fmt: skip
            return summary.at

        await engine.start(initial)
        task = asyncio.create_task(engine.run())
        yield engine, task
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if engine is not None:
            await engine.close()
        await fetcher.close()
        await cursors.close()
        await resources.close()
