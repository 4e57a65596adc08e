"""Getting a change's bytes from the Source, and asking the Source what it holds.

The applier's I/O: fetch a resource (its ``rel="duplicate"`` mirrors first,
lowest ``pri`` first, then ``loc``) in rounds with backoff until one verifies
against the advertised length and digests, hand small bodies to the mirror's
batched writer and stream large ones, and ask the Source whether a resource
is gone (a deletion nobody vouched for, or one older than what the mirror
holds).  Only transfers hold one of the ``concurrency`` slots: a change
waiting out a backoff holds none, and neither does a small body waiting for
the mirror's next write batch (those wait in ``held``, with the deletes
that go one by one; a group of deletions, :mod:`.deletions`, holds no
memory worth bounding and waits in neither).

Bodies fetched ahead: a Destination that falls behind a fast-changing Source
fetches, for an old change, bytes the Source wrote for a later one.  Those
fail the old change's fixity check, and the later change's own fetch (issued
only after the old one is superseded) gets bytes later still: on a hot
resource every change mismatched and the mirror froze.  A small body that
fails its check is therefore kept (the last :data:`AHEAD_PER_LOC` distinct
bodies of at most :data:`AHEAD_LOCS` resources, :data:`AHEAD_BYTES` in all,
oldest dropped first) and offered to the next change of the same ``loc``
before any request: applied only if it verifies against that change's own
digests, it is exactly what a fetch that returned it would have applied.
Several per resource, because a retry can fetch bytes newer still before the
change they belong to arrives.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from ..backoff import Backoff
from ..errors import FetchError
from ..fetch import Fetcher, check_origin
from ..model import normalize_digest
from .mirror import FixityMismatch, Mirror, PathConflict, UnsafePath, Written
from .mirror.fixity import HASHLIB_NAMES
from .rules import (
    GONE_STATUS,
    NOT_CURRENT,
    NOT_SERVED,
    OUTDATED_BYTES,
    AlreadyHeld,
    ChangeView,
    Failure,
    Outcome,
    classify,
    path_failure,
)

__all__ = [
    "AHEAD_BYTES",
    "AHEAD_LOCS",
    "AHEAD_PER_LOC",
    "HELD_BODIES",
    "IN_MEMORY_BYTES",
    "Transfer",
]

log = logging.getLogger("rsnotify.subscribe")

# Bodies of declared length up to this are read whole and handed to the
# mirror's batched writer (Mirror.write_bytes); larger or unsized ones stream
# to disk.  At most HELD_BODIES such bodies wait in memory for the disk.
IN_MEMORY_BYTES = 256 << 10
HELD_BODIES = 256
# Bodies that failed an older change's fixity check, kept for a newer change
# of the same loc (see the module's docstring): at most this many, this many
# bytes in all (each at most IN_MEMORY_BYTES).
AHEAD_LOCS = 512
AHEAD_PER_LOC = 4
AHEAD_BYTES = 32 << 20

Superseded = Callable[[], bool]  # "a newer change of this loc is queued": stop trying


class Transfer:
    """Fetches and checks at the Source for one applier (its limits and retry policy)."""

    def __init__(
        self,
        mirror: Mirror,
        fetcher: Fetcher,
        *,
        allowed_origins: frozenset[str] | None,
        concurrency: int,
        retries: int,
        not_found_retries: int,
        use_duplicates: bool,
        timeout: float,
        max_resource_bytes: int,
        backoff_initial: float,
        backoff_max: float,
    ) -> None:
        self.mirror = mirror
        self.fetcher = fetcher
        self.allowed_origins = allowed_origins
        self.retries = retries
        self.not_found_retries = not_found_retries
        self.use_duplicates = use_duplicates
        self.timeout = timeout
        self.max_resource_bytes = max_resource_bytes
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.slots = asyncio.Semaphore(concurrency)  # transfers at once
        self.held = asyncio.Semaphore(max(HELD_BODIES, concurrency))  # bodies and deletes waiting
        self._ahead: OrderedDict[str, list[bytes]] = OrderedDict()  # loc -> bodies, oldest first
        self._ahead_bytes = 0
        self.ahead_used = 0  # changes applied from a body fetched ahead (no request)
        self.packaged_used = 0  # changes applied from a Change Dump package (no request)

    def candidates(self, view: ChangeView) -> list[str]:
        urls: list[str] = []
        if self.use_duplicates:
            for href in view.duplicates:
                try:
                    check_origin(href, self.allowed_origins)
                except FetchError as exc:
                    log.info("not using duplicate %s of %s: %s", href, view.loc, exc)
                    continue
                if href != view.loc and href not in urls:
                    urls.append(href)
        urls.append(view.loc)
        return urls

    async def fetch(
        self,
        view: ChangeView,
        path: Path,
        superseded: Superseded,
        *,
        unless_sha256: str | None = None,
        only_if_current: bool = False,
        packaged: bytes | None = None,
    ) -> tuple[Written, str] | Failure:
        """Try duplicates then ``loc``, in rounds with backoff, until one verifies.

        ``packaged``: the change's bytes from a Change Dump package
        (:mod:`.changedump`), written if they verify, like a body fetched
        ahead; if they do not, the fetch goes on as without them.

        ``unless_sha256``: the digest of what the mirror holds from a newer,
        provisional change; a body with that digest means the Source agrees
        with the mirror, and nothing is written (:attr:`Outcome.OUTDATED`).
        ``only_if_current``: a back-dated change, applied only if the Source
        serves exactly its bytes now; a 404/410 or other bytes mean it is
        outdated (:attr:`Outcome.OUTDATED`, at once), not a failure to retry.
        """
        # A back-dated change, or one checked against a provisional state, asks
        # what the Source serves *now*: no body kept from before answers that.
        now_only = only_if_current or unless_sha256 is not None
        if packaged is not None and not now_only:
            async with self.held:  # as many bodies wait for the disk as fetched ones would
                done = await self._write_at_hand(view, path, packaged, unless_sha256)
            if done is not None:
                self.packaged_used += isinstance(done, tuple)
                return done
        ahead = None if now_only else self._from_ahead(view)
        if ahead is not None:
            done = await self._write_at_hand(view, path, ahead, unless_sha256)
            if done is not None:
                self.ahead_used += isinstance(done, tuple)
                return done
        candidates = self.candidates(view)
        backoff = Backoff(initial=self.backoff_initial, maximum=self.backoff_max)
        rounds = not_found = 0
        while True:
            failure: Failure | None = None
            for url in list(candidates):
                try:
                    return await self.fetch_one(url, view, path, unless_sha256), url
                except AlreadyHeld:
                    return Failure(Outcome.OUTDATED, False, OUTDATED_BYTES)
                except (UnsafePath, PathConflict) as exc:  # about the path: no URL can help
                    return path_failure(exc)
                except (FetchError, FixityMismatch) as exc:
                    failure = classify(exc, view)
                    if only_if_current and failure.outcome in NOT_CURRENT and url == view.loc:
                        return Failure(Outcome.OUTDATED, False, f"{NOT_SERVED}: {exc}")
                log.info(
                    "fetching %s for %s failed (%s): %s",
                    url,
                    view.loc,
                    failure.outcome,
                    failure.detail,
                    extra={"loc": view.loc, "outcome": str(failure.outcome)},
                )
                if not failure.retryable:
                    if url == view.loc:
                        return failure
                    candidates.remove(url)
            assert failure is not None  # the loop ended with loc failing
            if failure.outcome is Outcome.NOT_FOUND:
                not_found += 1
                if not_found > self.not_found_retries:
                    return self._maybe_superseded(failure, superseded)
            rounds += 1
            if rounds > self.retries:
                return self._maybe_superseded(failure, superseded)
            if superseded():
                return Failure(Outcome.SUPERSEDED, False, failure.detail)
            await asyncio.sleep(backoff.next())
            if superseded():  # a newer change arrived while this one waited
                return Failure(Outcome.SUPERSEDED, False, failure.detail)

    async def confirm_gone(self, view: ChangeView, superseded: Superseded) -> Failure | None:
        """None once the Source answers 404/410 for ``loc``; else why the file stays.

        A deletion nobody vouched for must not remove a file the Source still
        serves (a forged notification on a broker without ACLs, a replayed old
        one): the Source is asked, with the same retries as a fetch.  A
        deletion that is genuine but quickly followed by a re-creation is
        refused too, correctly: the catch-up this causes finds both.
        """
        backoff = Backoff(initial=self.backoff_initial, maximum=self.backoff_max)
        for attempt in range(self.retries + 1):
            try:
                async with (
                    self.slots,
                    self.fetcher.stream(
                        view.loc,
                        max_bytes=self.max_resource_bytes,
                        timeout=self.timeout,
                        allowed_origins=self.allowed_origins,
                    ) as stream,
                ):
                    status = stream.result.status
                return Failure(
                    Outcome.UNCONFIRMED,
                    False,
                    f"the Source still serves it (HTTP {status}): a deletion pushed without a "
                    "signature is applied only once the Source answers 404 or 410",
                )
            except FetchError as exc:
                if exc.status in GONE_STATUS:
                    return None
                failure = classify(exc, view)
                if not failure.retryable or attempt == self.retries:
                    return failure
            if superseded():
                return Failure(Outcome.SUPERSEDED, False, "a newer change is queued")
            await asyncio.sleep(backoff.next())
        raise AssertionError("unreachable")  # the loop returns on its last attempt

    @staticmethod
    def _maybe_superseded(failure: Failure, superseded: Superseded) -> Failure:
        if superseded():
            return Failure(Outcome.SUPERSEDED, False, failure.detail)
        return failure

    async def fetch_one(
        self, url: str, view: ChangeView, path: Path, unless_sha256: str | None = None
    ) -> Written:
        limit = view.length if view.length is not None else self.max_resource_bytes
        async with self.held:
            # Only transfers hold a slot: a change waiting out a backoff does not.
            async with (
                self.slots,
                self.fetcher.stream(
                    url,
                    max_bytes=limit,
                    timeout=self.timeout,
                    allowed_origins=self.allowed_origins,
                ) as stream,
            ):
                declared = stream.length
                if declared is None or declared > IN_MEMORY_BYTES:
                    return await self.mirror.write_atomic(
                        path, stream, expected_length=view.length, expected_hashes=view.hashes
                    )
                data = await stream.read()
            # Small and of known size (nearly every resource): the transfer is
            # over, so its slot goes to the next fetch while these bytes wait
            # for the mirror's next write batch (verify, write, fsync, rename:
            # one round of fsyncs for every write queued meanwhile).  Holding
            # the slot instead capped the rate at ``concurrency`` writes per
            # round of fsyncs.
            return await self._write_small(view, path, data, unless_sha256)

    async def _write_at_hand(
        self, view: ChangeView, path: Path, data: bytes, unless_sha256: str | None
    ) -> tuple[Written, str] | Failure | None:
        """Write bytes obtained without a request; None if they fail (then fetch as usual)."""
        try:
            written = await self._write_small(view, path, data, unless_sha256)
        except AlreadyHeld:
            return Failure(Outcome.OUTDATED, False, OUTDATED_BYTES)
        except FixityMismatch:
            return None  # bytes of another version: fetch as usual (they were kept ahead)
        except (UnsafePath, PathConflict) as exc:
            return path_failure(exc)
        return written, view.loc

    async def _write_small(
        self, view: ChangeView, path: Path, data: bytes, unless_sha256: str | None
    ) -> Written:
        """Verify and write a body held in memory; one that fails is kept for a newer change."""
        if unless_sha256 is not None and hashlib.sha256(data).hexdigest() == unless_sha256:
            raise AlreadyHeld
        try:
            return await self.mirror.write_bytes(
                path, data, expected_length=view.length, expected_hashes=view.hashes
            )
        except FixityMismatch:
            self._keep_ahead(view.loc, data)
            raise

    def _keep_ahead(self, loc: str, data: bytes) -> None:
        kept = self._ahead.pop(loc, [])
        if data in kept:
            kept.remove(data)
        else:
            self._ahead_bytes += len(data)
        kept.append(data)
        while len(kept) > AHEAD_PER_LOC:
            self._ahead_bytes -= len(kept.pop(0))
        self._ahead[loc] = kept
        while len(self._ahead) > AHEAD_LOCS or self._ahead_bytes > AHEAD_BYTES:
            _, dropped = self._ahead.popitem(last=False)
            self._ahead_bytes -= sum(map(len, dropped))

    def _from_ahead(self, view: ChangeView) -> bytes | None:
        """A body kept for ``view.loc`` with the change's length and one of its digests.

        The digest is checked here (one known algorithm, bodies are small) to
        pick among the kept bodies; the mirror's write checks them all.  A
        length alone could pass bytes of another version: without a digest of
        a known algorithm nothing kept is offered (a fetch decides).
        """
        kept = self._ahead.get(view.loc)
        if not kept:
            return None
        check = None
        for algo, digest in view.hashes.items():
            algo = algo.lower()
            normal = normalize_digest(algo, digest) if algo in HASHLIB_NAMES else None
            if normal is not None:
                check = (HASHLIB_NAMES[algo], normal)
                break
        if check is None:
            return None
        name, want = check
        for data in kept:
            if view.length is not None and len(data) != view.length:
                continue
            if hashlib.new(name, data).hexdigest() == want:
                kept.remove(data)
                self._ahead_bytes -= len(data)
                if not kept:
                    del self._ahead[view.loc]
                return data
        return None
