"""The detection loops of one collection: its Change Lists, and its framework.

:meth:`DetectionLoop.watch` polls the collection's Change Lists (or, for a
Source without any, its Resource List snapshots: the same interface) every
``--poll`` seconds (at once when a Source pings or a watched file changes)
and hands what it finds to the :class:`~.sequencer.Sequencer`.
:meth:`DetectionLoop.watch_framework` checks the Resource List, Dumps and
Change Lists for Framework Notification 1.0.1.  Both run only on the leader
and retry everything transient (the Source, the log) with backoff; nothing
here exits on a network error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace

from .. import w3cdt
from ..backoff import Backoff
from ..cancellation import raise_if_cancelled
from ..changes.snapshotwatch import SnapshotWatcher
from ..errors import CoverageHole, DocumentError, FetchError, LogDiverged
from ..log import Fenced, LogConflict, LogUnavailable
from ..metrics import PublisherMetrics
from .sequencer import CollectionState, Sequencer
from .tasks import pause

log = logging.getLogger("rsnotify.publish")

# New entries per detection pass: a 50,000-entry list is parsed, logged and
# pushed 2,000 entries at a time, so the first notifications leave ~15 ms
# after the read instead of after the whole parse (~0.7 s), and the event
# loop (PUBACKs, WebSocket clients) is never held longer than that.
DETECT_CHUNK = 2_000
FRAMEWORK_MIN_GAP = 1.0  # seconds: a publish ping makes a framework check at most this often


class DetectionLoop:
    """Runs detection for one collection until ``stopping`` is set (or the lease is lost)."""

    def __init__(
        self,
        collection: CollectionState,
        sequencer: Sequencer,
        metrics: PublisherMetrics,
        *,
        poll: float,
        framework_interval: float,
        stopping: asyncio.Event,
        on_health: Callable[[bool], None],
        on_lists: Callable[[CollectionState], None],
    ) -> None:
        self.collection = collection
        self.sequencer = sequencer
        self.metrics = metrics
        self.poll = poll
        self.framework_interval = framework_interval
        self.stopping = stopping
        self._on_health = on_health  # False after five failed passes in a row
        self._on_lists = on_lists  # the lists were read anew: watch their directories

    async def _wait_trigger(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.poll):
                await self.collection.trigger.wait()
        self.collection.trigger.clear()

    async def watch(self) -> None:
        """Poll, sequence and log the collection's new Change List entries."""
        collection = self.collection
        watcher = collection.watcher
        backoff = Backoff()
        reload = False  # after a conflict or an outage (the log may be a failed-over primary)
        lists_read: int | None = None  # watcher.lists_read when on_lists last ran
        while not self.stopping.is_set():
            raise_if_cancelled()  # the log's Redis client may have swallowed a cancellation
            holes = watcher.holes
            try:
                if reload:
                    await self.sequencer.reload(collection)
                    reload = False
                result = await watcher.poll(DETECT_CHUNK)
                detected = w3cdt.now()
                self.metrics.bytes_read.labels(collection.id).inc(result.bytes_read)
                if watcher.holes > holes:  # logged by the watcher; Destinations re-baseline
                    self.metrics.coverage_holes.labels(collection.id).inc(watcher.holes - holes)
                last = result.detections[-1] if result.detections else None
                for found in result.detections:
                    closing = result.checkpoint if found is last else None
                    await self.sequencer.log_detection(collection, found, detected, closing=closing)
                if result.checkpoint != watcher.checkpoint:
                    await self.sequencer.commit_checkpoint(collection, result.checkpoint)
                backoff.reset()
                self._on_health(True)
                if result.more:
                    continue  # the rest of a long list, at once
                if watcher.lists_read != lists_read:
                    # A rollover may open a list in a new directory.  Only when the
                    # lists were read anew: every list's path is resolved, and an
                    # index names more lists every day (once per detection, it was
                    # 5.5 % of the publisher's CPU at 200 changes/s with 3 lists).
                    lists_read = watcher.lists_read
                    self._on_lists(collection)
            except asyncio.CancelledError:
                raise
            except Fenced as exc:
                log.warning("%s; another publisher leads now", exc)
                return  # the election notices the lost lease and stands down
            except CoverageHole as exc:
                if not isinstance(watcher, SnapshotWatcher):
                    raise  # a publisher's CollectionWatcher only reports holes
                # The maps of the last snapshot are gone (a wiped state directory,
                # a flushed Redis): nothing to diff with, so record the snapshot as it
                # is now and publish from the next change; Destinations re-baseline.
                self.metrics.coverage_holes.labels(collection.id).inc(watcher.holes - holes)
                log.warning(
                    "%s: %s; recording the Resource List as it is now",
                    collection.id,
                    exc,
                    extra={"collection": collection.id},
                )
                watcher.reset(replace(watcher.checkpoint, snapshot=None))
                # The next change's interval starts at the new snapshot, not at the
                # last change logged: what happened in between was never seen
                # (Change Notification 1.0.1: consecutive intervals, no gap hidden).
                collection.last_change = None
                continue
            except LogDiverged as exc:
                log.error(
                    "%s; appending to this collection stops (see deploy/README.md, failure model)",
                    exc,
                    extra={"collection": collection.id},
                )
                self._on_health(False)
                return
            except LogConflict as exc:
                log.warning(
                    "%s; reloading the checkpoint", exc, extra={"collection": collection.id}
                )
                reload = True  # at the top of the loop, where its own failures are handled
                continue
            except (FetchError, DocumentError, LogUnavailable) as exc:
                self.metrics.poll_errors.labels(collection.id).inc()
                # What was read but not logged must be read again: forget cached tails.
                watcher.reset(watcher.checkpoint)
                reload = reload or isinstance(exc, LogUnavailable)
                delay = backoff.next()
                log.warning(
                    "%s: %s; retrying in %.1fs",
                    collection.id,
                    exc,
                    delay,
                    extra={"collection": collection.id},
                )
                self._on_health(backoff.attempts < 5)
                await pause(self.stopping, delay)
                continue
            await self._wait_trigger()

    async def watch_framework(self) -> None:
        """Check the collection's framework; log what changed in its framework stream.

        Every ``--framework-interval`` seconds, and at once (at most every
        :data:`FRAMEWORK_MIN_GAP` s) when a Source pings.  The records and the
        state they were found against are appended in one step (see
        :mod:`.frameworkwatch`), under the leader's fence.
        """
        collection = self.collection
        assert collection.framework is not None
        watcher = collection.framework
        interval = self.framework_interval
        backoff = Backoff(maximum=max(interval, 10.0))
        loaded = False
        while not self.stopping.is_set():
            raise_if_cancelled()
            delay = interval
            try:
                if not loaded:  # at each leadership: what the last leader committed
                    await self.sequencer.load_framework(collection)
                    loaded = True
                first = not watcher.state.started
                collection.framework_trigger.clear()  # a ping from now on: check again
                state, changes = await watcher.check(w3cdt.now())
                if changes or state != watcher.state:
                    await self.sequencer.log_framework(collection, state, changes)
                if first:
                    log.info(
                        "%s: framework: watching %s%s (every %gs)",
                        collection.id,
                        ", ".join(sorted(state.advertised)) or "no other capability",
                        " and the Change Lists" if watcher.changes is not None else "",
                        interval,
                        extra={"collection": collection.id},
                    )
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except Fenced as exc:
                log.warning("%s; another publisher leads now", exc)
                return
            except LogConflict:
                loaded = False
                continue
            except (FetchError, DocumentError, LogUnavailable) as exc:
                delay = min(interval, backoff.next())
                log.warning(
                    "%s: framework check failed (%s); retrying in %.1fs",
                    collection.id,
                    exc,
                    delay,
                    extra={"collection": collection.id},
                )
            await pause(self.stopping, min(FRAMEWORK_MIN_GAP, delay))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, delay - FRAMEWORK_MIN_GAP)):
                    await collection.framework_trigger.wait()
