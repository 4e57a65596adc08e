"""Start-up: find the Source's Capability Lists and open a collection for each.

Discovery runs the one :class:`~rsnotify.discovery.DiscoveryMachine` loop
(:func:`~rsnotify.discovery.drive`): over HTTP for a URL Source, or over the
files of a directory Source, read as if it were served at
:data:`DIRECTORY_ROOT`'s origin.  Each Capability List with a Change List is
registered in the log, and its head and checkpoint are read back, so a
restart carries on exactly after the last logged entry.

A Capability List that offers a Resource List (or Resource List Index) and
no Change List is published too (issue 23): its changes are derived from
successive snapshots of the Resource List
(:class:`~rsnotify.changes.snapshotwatch.SnapshotWatcher`), whose maps live
beside the log (:func:`snapshot_blobs`).  The first read of such a
collection only records the snapshot, as the first read of a Change List
starts at its end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from .. import discovery, sitemap
from ..backoff import Backoff
from ..changes.access import DirectoryAccess, DocumentAccess
from ..changes.snapshotblobs import BlobStore, DirectoryBlobs
from ..changes.snapshotwatch import SnapshotWatcher
from ..changes.watcher import ChangeWatcher, CollectionWatcher
from ..collection import collection_id
from ..errors import FetchError, RsNotifyError
from ..fetch import Fetcher
from ..log import LogUnavailable, NotificationLog
from ..metrics import PublisherMetrics
from ..model import Capability
from ..tracker import Checkpoint
from .config import PublisherConfig
from .frameworkwatch import FrameworkWatcher
from .sequencer import CollectionState
from .tasks import pause

log = logging.getLogger("rsnotify.publish")
T = TypeVar("T")

#: Where discovery starts in a directory Source (a URL maps to a file whatever its host).
DIRECTORY_ROOT = "http://localhost/.well-known/resourcesync"


def is_directory(source: str) -> bool:
    """A SOURCE that names a local directory rather than a URL."""
    return not source.startswith(("http://", "https://")) and Path(source).is_dir()


async def discover_source(
    source: str, access: DocumentAccess, fetcher: Fetcher
) -> discovery.SourceInfo:
    """Find the Capability Lists, over HTTP or in the Source's directory."""
    if not isinstance(access, DirectoryAccess):
        return await discovery.discover(source, fetcher)

    async def read(request: discovery.Request) -> discovery.Response:
        fetched = await access.read(request.url)
        return discovery.Response(request.url, {}, fetched.body)

    return await discovery.drive(discovery.DiscoveryMachine(DIRECTORY_ROOT), read)


class StartupRetry:
    """Runs a start-up log operation until the log answers, or gives up.

    The retry policy when Redis is down: at start-up, retry with backoff
    while the log has been unreachable for less than ``redis_wait`` seconds
    (``--redis-wait``), saying each time when the next try is and when
    start-up gives up; then raise, and the command exits 1 (systemd's
    ``Restart=on-failure`` starts it again), so a wrong ``--redis`` is an
    error within a minute instead of a silent loop.  Once running, a Redis
    outage is retried for as long as it lasts (the detection loops): nothing
    is lost, the checkpoint waits in the log.
    """

    def __init__(self, redis_wait: float, stopping: asyncio.Event) -> None:
        self.redis_wait = redis_wait
        self.stopping = stopping
        self._down_since: float | None = None  # when the log stopped answering

    async def __call__(self, operation: Callable[..., Awaitable[T]], *args: Any) -> T:
        backoff = Backoff()
        while True:
            try:
                result = await operation(*args)
            except LogUnavailable as exc:
                if self.stopping.is_set():
                    raise
                now = time.monotonic()
                if self._down_since is None:
                    self._down_since = now
                left = self._down_since + self.redis_wait - now
                if left <= 0:
                    raise LogUnavailable(
                        f"{exc} (gave up after --redis-wait {self.redis_wait:g} s)"
                    ) from None
                delay = min(backoff.next(), left)
                log.warning(
                    "log unavailable (%s); retrying in %.1fs, start-up gives up in %.0fs",
                    exc,
                    delay,
                    left,
                )
                await pause(self.stopping, delay)
            else:
                self._down_since = None
                return result


def snapshot_blobs(config: PublisherConfig) -> Callable[[str], BlobStore]:
    """Where each collection's snapshot maps live without ``--redis``: the state directory.

    ``<state dir>/snapshots/<collection id>/``, beside the SQLite log whose
    checkpoints name them.  (With ``--redis`` the publisher passes
    :class:`~rsnotify.log.redis_blobs.RedisBlobs`: a standby must find them.)
    """
    root = Path(config.state_dir) / "snapshots"
    return lambda cid: DirectoryBlobs(root / cid)


async def open_collections(
    config: PublisherConfig,
    notification_log: NotificationLog,
    access: DocumentAccess,
    fetcher: Fetcher,
    metrics: PublisherMetrics,
    stopping: asyncio.Event,
    *,
    blobs: Callable[[str], BlobStore] | None = None,
) -> dict[str, CollectionState]:
    """Discover the Source (retrying) and open every collection to publish.

    ``blobs``: the snapshot map store of a collection without Change Lists,
    by collection id (default: :func:`snapshot_blobs`).
    """
    blobs = blobs or snapshot_blobs(config)
    backoff = Backoff(maximum=10.0)
    while True:
        try:
            info = await discover_source(config.source, access, fetcher)
            break
        except (FetchError, RsNotifyError) as exc:
            if stopping.is_set():
                raise
            delay = backoff.next()
            log.warning("discovery of %s failed (%s); retrying in %.1fs", config.source, exc, delay)
            await pause(stopping, delay)
    retry = StartupRetry(config.redis_wait, stopping)
    limits = sitemap.Limits(lenient=config.lenient)
    wanted = set(config.collections)
    collections: dict[str, CollectionState] = {}
    for cap in info.capability_lists:
        changelist = cap.capabilities.get(Capability.CHANGELIST)
        resourcelist = cap.capabilities.get(Capability.RESOURCELIST)
        cid = collection_id(cap.url)
        if wanted and cap.url not in wanted and cid not in wanted:
            continue
        if changelist is None and resourcelist is None:
            log.warning(
                "%s offers neither a Change List nor a Resource List; not published", cap.url
            )
            continue
        await retry(notification_log.register, cid, cap.url)
        checkpoint = Checkpoint.from_json(await retry(notification_log.checkpoint, cid))
        head = await retry(notification_log.head, cid)
        watcher: ChangeWatcher
        if changelist is not None:
            watcher = CollectionWatcher(
                access=access,
                collection=cid,
                capability_list=cap.url,
                changelist_url=changelist,
                checkpoint=checkpoint,
                from_beginning=config.from_beginning,
                limits=limits,
            )
        else:
            assert resourcelist is not None
            watcher = SnapshotWatcher(
                access=access,
                collection=cid,
                capability_list=cap.url,
                resourcelist_url=resourcelist,
                checkpoint=_snapshot_checkpoint(checkpoint, cid),
                blobs=blobs(cid),
                limits=limits,
            )
            log.info(
                "%s offers no Change List: its changes are derived from successive snapshots of %s",
                cap.url,
                resourcelist,
                extra={"collection": cid},
            )
        collections[cid] = CollectionState(cid, cap.url, watcher, head=head)
        if config.framework_enabled():
            collections[cid].framework = FrameworkWatcher(
                access=access,
                collection=cid,
                capability_list=cap.url,
                changes=watcher if isinstance(watcher, CollectionWatcher) else None,
                limits=limits,
            )
        metrics.head.labels(cid).set(head)
        log.info(
            "watching %s (collection %s, head %d)",
            cap.url,
            cid,
            head,
            extra={"collection": cid, "seq": head},
        )
    if not collections:
        raise RsNotifyError(
            f"{config.source}: no Capability List with a Change List or a Resource List to publish"
        )
    return collections


def _snapshot_checkpoint(checkpoint: Checkpoint, cid: str) -> Checkpoint:
    """The checkpoint a SnapshotWatcher goes on from (said aloud when it is a Change List's).

    One left by Change Lists (the Source stopped offering them) holds no
    snapshot: the first read records one, as for a new collection, and what
    changed between the last Change List entry and that snapshot is not seen.
    """
    if checkpoint.snapshot is None and checkpoint.started:
        log.warning(
            "%s: the Source no longer offers a Change List; its changes are derived from "
            "Resource List snapshots from now on",
            cid,
            extra={"collection": cid},
        )
    return checkpoint
