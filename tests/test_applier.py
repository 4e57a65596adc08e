"""The change applier against real aiohttp Sources on loopback ports and real files.

Why one module of ~1,700 lines: it tests one component, the :class:`Applier`, and nearly
every test needs the same rig -- the scriptable ``Source`` (``other``: a second origin) and
``Env``'s mirror, store and hooks; what it delegates to (grouped deletions, trust, Resource
Dump packages) is driven through it too, and only the store has a few tests of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import itertools
import random
import zipfile
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from rsnotify.envelope import Notification
from rsnotify.fetch import Fetcher
from rsnotify.metrics import serving
from rsnotify.model import ChangeType, Entry, Link
from rsnotify.subscriber import applier as applier_module
from rsnotify.subscriber import recorder as recorder_module
from rsnotify.subscriber.applier import (
    RECORD_BATCH,
    SETTLE_SLICE,
    Applier,
    Hooks,
    InvalidChange,
    Outcome,
)
from rsnotify.subscriber.baseline import baseline
from rsnotify.subscriber.mirror import TEMP_PREFIX, Mirror
from rsnotify.subscriber.resources import ResourceStore, ResourceStoreError
from tests.devstack import async_wait_for

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def fixity(body: bytes) -> str:
    return f"md5:{hashlib.md5(body).hexdigest()} sha-256:{hashlib.sha256(body).hexdigest()}"


class Source:
    """Serves ``files`` by decoded path, with scripted misbehaviour per path."""

    def __init__(self) -> None:
        self.base = ""
        self.files: dict[str, bytes] = {}
        self.corrupt: dict[str, int] = {}  # path -> wrong bodies still to serve (-1: forever)
        self.statuses: dict[str, list[int]] = {}  # path -> statuses to answer first
        self.stalls: dict[str, int] = {}  # path -> requests still to stall until release
        self.redirects: dict[str, str] = {}
        self.gates: dict[str, asyncio.Event] = {}  # path -> hold requests until set
        self.requests: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.release = asyncio.Event()
        self.app = web.Application()
        self.app.router.add_get("/{path:.*}", self.handle)

    def url(self, path: str) -> str:
        return self.base + path

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.requests.append(path)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if path in self.gates:
                await self.gates[path].wait()
            if self.stalls.get(path, 0) > 0:
                self.stalls[path] -= 1
                await self.release.wait()
            if self.statuses.get(path):
                status = self.statuses[path].pop(0)
                return web.Response(status=status, text=f"status {status}")
            if path in self.redirects:
                raise web.HTTPFound(self.redirects[path])
            if path not in self.files:
                raise web.HTTPNotFound()
            body = self.files[path]
            left = self.corrupt.get(path, 0)
            if left:
                self.corrupt[path] = left - 1 if left > 0 else left
                body = bytes([body[0] ^ 0xFF]) + body[1:] if body else b"?"
            return web.Response(body=body, content_type="application/octet-stream")
        finally:
            self.in_flight -= 1


@pytest.fixture
async def source() -> AsyncIterator[Source]:
    src = Source()
    async with serving(src.app) as base:
        src.base = base
        try:
            yield src
        finally:
            src.release.set()
            for gate in src.gates.values():
                gate.set()


@pytest.fixture
async def other() -> AsyncIterator[Source]:
    """A second origin: a mirror host, or somewhere a forged notification points."""
    src = Source()
    async with serving(src.app) as base:
        src.base = base
        try:
            yield src
        finally:
            src.release.set()


class Env:
    def __init__(self, tmp_path: Path, source: Source, fetcher: Fetcher):
        self.tmp_path = tmp_path
        self.source = source
        self.fetcher = fetcher
        self.mirror = Mirror(tmp_path / "mirror")
        self.store = ResourceStore(tmp_path / "resources.sqlite")
        self.seq = itertools.count(1)
        self.events: list[tuple[str, str, Path]] = []
        self.failures: list[tuple[str, Outcome]] = []

    def applier(self, **options: Any) -> Applier:
        options.setdefault("allowed_origins", [self.source.base])
        options.setdefault("backoff_initial", 0.001)
        options.setdefault("backoff_max", 0.005)
        options.setdefault("timeout", 5.0)
        return Applier(self.mirror, self.store, self.fetcher, **options)

    def note(
        self,
        path_or_loc: str,
        change: str = "created",
        when: datetime = T0,
        *,
        body: bytes | None = None,
        length: int | None = None,
        links: list[dict[str, Any]] | None = None,
        seq: int | None = None,
    ) -> Notification:
        loc = path_or_loc if "://" in path_or_loc else self.source.url(path_or_loc)
        return Notification(
            collection="test",
            seq=seq if seq is not None else next(self.seq),
            capabilitylist=self.source.url("/capabilitylist.xml"),
            changelist=self.source.url("/changelist.xml"),
            loc=loc,
            change=ChangeType(change),
            datetime=when,
            hash=fixity(body) if body is not None else None,
            length=length if length is not None else (len(body) if body is not None else None),
            links=links or [],
        )

    def path(self, loc_or_path: str) -> Path:
        loc = loc_or_path if "://" in loc_or_path else self.source.url(loc_or_path)
        return self.mirror.path_for(loc)

    def recording_hooks(self) -> Hooks:
        def created(change: Notification, path: Path) -> None:
            self.events.append(("created", change.loc, path))

        async def updated(change: Notification, path: Path) -> None:
            await asyncio.sleep(0)
            self.events.append(("updated", change.loc, path))

        def deleted(change: Notification, path: Path) -> None:
            self.events.append(("deleted", change.loc, path))

        def failed(change: Notification, outcome: Outcome, detail: str) -> None:
            self.failures.append((change.loc, outcome))

        return Hooks(on_created=created, on_updated=updated, on_deleted=deleted, on_failed=failed)

    async def outcomes(self, loc_or_path: str) -> list[str]:
        loc = loc_or_path if "://" in loc_or_path else self.source.url(loc_or_path)
        return [r.outcome for r in await self.store.apply_log(loc)]


@pytest.fixture
async def env(tmp_path: Path, source: Source) -> AsyncIterator[Env]:
    async with Fetcher() as fetcher:
        environment = Env(tmp_path, source, fetcher)
        try:
            yield environment
        finally:
            await environment.store.close()


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(TEMP_PREFIX)]


async def assert_never_backwards(store: ResourceStore) -> None:
    """The apply log shows no resource written or deleted by an older change than before."""
    newest: dict[str, datetime] = {}
    for record in await store.apply_log():
        if record.outcome in (Outcome.APPLIED, Outcome.DELETED, Outcome.RECORDED):
            assert record.datetime >= newest.get(record.loc, record.datetime), record
            newest[record.loc] = record.datetime


# --- created / updated ------------------------------------------------------------


async def test_created_is_fetched_verified_and_recorded(env: Env, source: Source) -> None:
    body = b"<xml>resource one</xml>"
    source.files["/r/one.xml"] = body
    applier = env.applier()
    change = env.note("/r/one.xml", body=body, when=at(1))
    assert await applier.apply(change) is Outcome.APPLIED
    path = env.path("/r/one.xml")
    assert path.read_bytes() == body
    state = await env.store.get(change.loc)
    assert state is not None
    assert (state.change, state.datetime, state.seq) == (ChangeType.CREATED, at(1), change.seq)
    assert (state.sha256, state.length) == (hashlib.sha256(body).hexdigest(), len(body))
    log = await env.store.apply_log(change.loc)
    assert [(r.outcome, r.sha256) for r in log] == [("applied", state.sha256)]
    assert temp_files(env.mirror.root) == []


async def test_odd_characters_round_trip(env: Env, source: Source) -> None:
    name = "/ü/e\u0301/😀 &x.txt"
    source.files[name] = b"odd"
    loc = source.url(name)
    assert await env.applier().apply(env.note(loc, body=b"odd")) is Outcome.APPLIED
    assert source.requests == [name]
    path = env.path(loc)
    assert path.relative_to(env.mirror.root).parts[2:] == ("ü", "e\u0301", "😀 &x.txt")
    assert path.read_bytes() == b"odd"
    assert env.mirror.path_for(env.mirror.loc_for(path)) == path


async def test_model_entries_are_accepted_too(env: Env, source: Source) -> None:
    source.files["/e"] = b"entry"
    entry = Entry(
        loc=source.url("/e"),
        lastmod=at(5),  # ResourceSync 1.0: the change time is lastmod
        change=ChangeType.UPDATED,
        hash=fixity(b"entry"),
        links=[Link(rel="duplicate", href=source.url("/e"), pri=1)],
    )
    assert await env.applier().apply(entry) is Outcome.APPLIED
    state = await env.store.get(entry.loc)
    assert state is not None and state.datetime == at(5) and state.seq is None


async def test_unusable_change_objects_are_refused_clearly(env: Env) -> None:
    applier = env.applier()
    with pytest.raises(InvalidChange):
        await applier.apply(Entry(loc="http://s/x", change=ChangeType.CREATED))  # no time
    with pytest.raises(InvalidChange):
        applier.submit(Entry(loc="http://s/x", lastmod=T0))  # no change type
    with pytest.raises(InvalidChange):
        await applier.apply(object())


# --- idempotence and never going backwards -----------------------------------------


async def test_applying_twice_is_a_no_op(env: Env, source: Source) -> None:
    source.files["/a"] = b"v1"
    applier = env.applier()
    change = env.note("/a", body=b"v1", when=at(1))
    assert await applier.apply(change) is Outcome.APPLIED
    before = env.path("/a").stat()
    assert await applier.apply(change) is Outcome.SKIPPED_ALREADY_APPLIED
    after = env.path("/a").stat()
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)
    assert source.requests == ["/a"]
    assert await env.outcomes("/a") == ["applied", "skipped_already_applied"]


async def test_an_older_change_never_overwrites_a_newer_one(env: Env, source: Source) -> None:
    source.files["/a"] = b"v2"
    applier = env.applier()
    assert await applier.apply(env.note("/a", "updated", at(20), body=b"v2")) is Outcome.APPLIED
    source.files["/a"] = b"v1-stale-copy"
    older = [
        env.note("/a", "created", at(10), body=b"v1-stale-copy"),
        env.note("/a", "deleted", at(15)),
    ]
    # An older update is skipped outright (even though the Source now serves its
    # bytes: change times order bytes); an older deletion would make the resource
    # vanish, so the Source is asked (it still serves it: outdated).
    assert [await applier.apply(change) for change in older] == [
        Outcome.SKIPPED_ALREADY_APPLIED,
        Outcome.OUTDATED,
    ]
    assert env.path("/a").read_bytes() == b"v2"
    assert source.requests == ["/a", "/a"]
    await assert_never_backwards(env.store)


async def test_scrambled_submission_keeps_the_newest(env: Env, source: Source) -> None:
    source.files["/s"] = b"latest"
    applier = env.applier()
    newest = env.note("/s", "updated", at(3))
    futures = [
        applier.submit(newest),
        applier.submit(env.note("/s", "created", at(1))),
        applier.submit(env.note("/s", "deleted", at(2))),
    ]
    outcomes = await asyncio.gather(*futures)
    # The older deletion is asked about at the Source (which still serves /s).
    assert outcomes == [Outcome.APPLIED, Outcome.SKIPPED_ALREADY_APPLIED, Outcome.OUTDATED]
    assert env.path("/s").read_bytes() == b"latest"
    await assert_never_backwards(env.store)


async def test_equal_datetimes_use_seq_then_change_type(env: Env, source: Source) -> None:
    source.files["/t"] = b"x"
    applier = env.applier()
    created = env.note("/t", "created", at(1), seq=10)
    updated = env.note("/t", "updated", at(1), seq=11)
    assert await applier.apply(created) is Outcome.APPLIED
    assert await applier.apply(updated) is Outcome.APPLIED  # same second, later seq
    assert await applier.apply(created) is Outcome.SKIPPED_ALREADY_APPLIED
    assert await applier.apply(updated) is Outcome.SKIPPED_ALREADY_APPLIED
    # Without sequence numbers (a Change List walk), the change type decides.
    walked = Entry(loc=updated.loc, lastmod=at(1), change=ChangeType.UPDATED)
    assert await applier.apply(walked) is Outcome.SKIPPED_ALREADY_APPLIED


async def test_state_survives_a_restart(env: Env, source: Source, tmp_path: Path) -> None:
    source.files["/p"] = b"persist"
    change = env.note("/p", body=b"persist", when=at(1))
    assert await env.applier().apply(change) is Outcome.APPLIED
    await env.store.close()
    env.store = ResourceStore(tmp_path / "resources.sqlite")
    env.mirror = Mirror(tmp_path / "mirror")
    assert await env.applier().apply(change) is Outcome.SKIPPED_ALREADY_APPLIED
    assert source.requests == ["/p"]


# --- fixity ------------------------------------------------------------------------


async def test_hash_mismatch_is_retried_until_the_right_bytes(env: Env, source: Source) -> None:
    source.files["/h"] = b"right bytes"
    source.corrupt["/h"] = 2
    applier = env.applier(retries=5)
    assert await applier.apply(env.note("/h", body=b"right bytes")) is Outcome.APPLIED
    assert source.requests == ["/h"] * 3
    assert env.path("/h").read_bytes() == b"right bytes"
    assert await env.outcomes("/h") == ["applied"]
    assert temp_files(env.mirror.root) == []


async def test_hash_always_wrong_is_reported_and_never_applied(env: Env, source: Source) -> None:
    source.files["/h"] = b"version one"
    applier = env.applier(retries=3, hooks=env.recording_hooks())
    assert await applier.apply(env.note("/h", body=b"version one", when=at(1))) is Outcome.APPLIED
    source.files["/h"] = b"version two"
    source.corrupt["/h"] = -1
    changed = env.note("/h", "updated", at(2), body=b"version two")
    assert await applier.apply(changed) is Outcome.HASH_MISMATCH
    assert source.requests == ["/h"] * (1 + 4)  # first apply, then 1 try + 3 retries
    assert env.path("/h").read_bytes() == b"version one"
    assert temp_files(env.mirror.root) == []
    log = await env.store.apply_log(changed.loc)
    assert [r.outcome for r in log] == ["applied", "hash_mismatch"]
    assert "sha-256" in (log[-1].detail or "")
    assert env.failures == [(changed.loc, Outcome.HASH_MISMATCH)]
    state = await env.store.get(changed.loc)
    assert state is not None and state.datetime == at(1)  # not recorded as applied
    source.corrupt["/h"] = 0  # the Source heals: a redelivery applies it
    assert await applier.apply(changed) is Outcome.APPLIED
    assert env.path("/h").read_bytes() == b"version two"


async def test_length_mismatch_is_reported(env: Env, source: Source) -> None:
    source.files["/short"] = b"12345"
    source.files["/long"] = b"1234567890" * 1000
    applier = env.applier(retries=1)
    assert await applier.apply(env.note("/short", length=6)) is Outcome.LENGTH_MISMATCH
    assert await applier.apply(env.note("/long", length=6)) is Outcome.LENGTH_MISMATCH
    assert source.requests == ["/short"] * 2 + ["/long"] * 2
    assert not env.path("/short").exists() and not env.path("/long").exists()
    assert temp_files(env.mirror.root) == []


# --- origins and duplicates ----------------------------------------------------------


async def test_off_origin_loc_is_refused_without_any_request(
    env: Env, source: Source, other: Source
) -> None:
    other.files["/secret"] = b"internal"
    applier = env.applier(hooks=env.recording_hooks())
    forged = env.note(other.url("/secret"), body=b"internal")
    assert await applier.apply(forged) is Outcome.REFUSED_ORIGIN
    forged_delete = env.note(other.url("/secret"), "deleted", at(1))
    assert await applier.apply(forged_delete) is Outcome.REFUSED_ORIGIN
    assert other.requests == [] and source.requests == []
    assert await env.outcomes(forged.loc) == ["refused_origin", "refused_origin"]
    assert env.failures == [(forged.loc, Outcome.REFUSED_ORIGIN)] * 2
    assert not env.mirror.path_for(forged.loc).parent.exists()


async def test_redirect_off_origin_is_refused(env: Env, source: Source, other: Source) -> None:
    other.files["/secret"] = b"internal"
    source.redirects["/moved"] = other.url("/secret")
    applier = env.applier()
    assert await applier.apply(env.note("/moved")) is Outcome.REFUSED_ORIGIN
    assert source.requests == ["/moved"]  # refused once, not retried
    assert other.requests == []


async def test_unsafe_locs_are_refused_without_any_request(env: Env, source: Source) -> None:
    applier = env.applier(allowed_origins=None)
    for loc in [source.url("/a/../../etc/passwd"), source.url("/%2e%2e/x"), "file:///etc/passwd"]:
        assert await applier.apply(env.note(loc)) is Outcome.UNSAFE_PATH
    assert source.requests == []


async def test_duplicate_with_lowest_pri_is_used(env: Env, source: Source, other: Source) -> None:
    body = b"mirrored"
    source.files["/d"] = body
    other.files["/first"] = body
    other.files["/second"] = body
    links = [
        {"rel": "duplicate", "href": other.url("/second"), "pri": 2},
        {"rel": "alternate", "href": other.url("/alt")},
        {"rel": "duplicate", "href": other.url("/first"), "pri": 1},
    ]
    applier = env.applier(allowed_origins=[source.base, other.base])
    change = env.note("/d", body=body, links=links)
    assert await applier.apply(change) is Outcome.APPLIED
    assert other.requests == ["/first"]
    assert source.requests == []
    assert env.path("/d").read_bytes() == body
    log = await env.store.apply_log(change.loc)
    assert other.url("/first") in (log[-1].detail or "")


async def test_duplicates_fall_back_to_loc(env: Env, source: Source, other: Source) -> None:
    body = b"original"
    source.files["/d"] = body
    other.files["/stale"] = b"stale copy"  # wrong hash
    links = [
        {"rel": "duplicate", "href": other.url("/missing"), "pri": 1},  # 404
        {"rel": "duplicate", "href": other.url("/stale"), "pri": 2},
        {"rel": "duplicate", "href": "http://127.0.0.1:9/not-allowed", "pri": 0},
    ]
    applier = env.applier(allowed_origins=[source.base, other.base])
    assert await applier.apply(env.note("/d", body=body, links=links)) is Outcome.APPLIED
    assert other.requests == ["/missing", "/stale"]
    assert source.requests == ["/d"]
    assert env.path("/d").read_bytes() == body


async def test_duplicates_can_be_ignored(env: Env, source: Source, other: Source) -> None:
    source.files["/d"] = b"x"
    other.files["/dup"] = b"x"
    applier = env.applier(allowed_origins=[source.base, other.base], use_duplicates=False)
    links = [{"rel": "duplicate", "href": other.url("/dup"), "pri": 1}]
    assert await applier.apply(env.note("/d", body=b"x", links=links)) is Outcome.APPLIED
    assert other.requests == [] and source.requests == ["/d"]


# --- transient failures -------------------------------------------------------------


async def test_5xx_is_retried(env: Env, source: Source) -> None:
    source.files["/busy"] = b"ok"
    source.statuses["/busy"] = [503, 500, 502]
    assert await env.applier(retries=3).apply(env.note("/busy", body=b"ok")) is Outcome.APPLIED
    assert source.requests == ["/busy"] * 4


async def test_persistent_5xx_gives_up_after_retries(env: Env, source: Source) -> None:
    source.files["/down"] = b"ok"
    source.statuses["/down"] = [503] * 10
    assert await env.applier(retries=2).apply(env.note("/down")) is Outcome.FETCH_FAILED
    assert source.requests == ["/down"] * 3


async def test_timeout_is_retried(env: Env, source: Source) -> None:
    source.files["/slow"] = b"eventually"
    source.stalls["/slow"] = 1
    applier = env.applier(timeout=0.3)
    assert await applier.apply(env.note("/slow", body=b"eventually")) is Outcome.APPLIED
    assert source.requests == ["/slow", "/slow"]


async def test_404_is_retried_a_little_then_reported(env: Env, source: Source) -> None:
    applier = env.applier(retries=5, not_found_retries=2)
    assert await applier.apply(env.note("/gone")) is Outcome.NOT_FOUND
    assert source.requests == ["/gone"] * 3
    source.statuses["/forbidden"] = [403]
    source.files["/forbidden"] = b"x"
    assert await applier.apply(env.note("/forbidden")) is Outcome.FETCH_FAILED
    assert source.requests.count("/forbidden") == 1  # a 403 will not change by retrying


async def test_a_change_with_a_newer_one_queued_is_superseded_without_a_fetch(
    env: Env, source: Source
) -> None:
    source.files["/v"] = b"v2"
    applier = env.applier(retries=5)
    stale = applier.submit(env.note("/v", "created", at(1), body=b"v1"))  # Source moved on
    fresh = applier.submit(env.note("/v", "updated", at(2), body=b"v2"))
    assert await stale is Outcome.SUPERSEDED
    assert await fresh is Outcome.APPLIED
    assert source.requests == ["/v"]  # only the newest bytes were fetched
    assert await env.outcomes("/v") == ["superseded", "applied"]
    assert env.path("/v").read_bytes() == b"v2"


async def test_404_late_in_the_queue_is_not_retried_when_a_newer_change_waits(
    env: Env, source: Source
) -> None:
    source.files["/v"] = b"v2"
    applier = env.applier(retries=5, backoff_initial=0.5)
    stale = applier.submit(env.note("/v", "created", at(1), body=b"v1"))  # Source moved on
    # The newer change arrives while the stale one is retrying.
    await async_wait_for(lambda: source.requests, timeout=10)
    tried = len(source.requests)
    fresh = applier.submit(env.note("/v", "updated", at(2), body=b"v2"))
    assert await stale is Outcome.SUPERSEDED
    assert await fresh is Outcome.APPLIED
    # No further retry of the superseded change: at most the one already in
    # flight when the newer change arrived; the newer change applies from the
    # bytes the stale one fetched (they are v2), so it needs no fetch of its own.
    assert tried <= len(source.requests) <= tried + 1
    assert await env.outcomes("/v") == ["superseded", "applied"]
    assert Outcome.SUPERSEDED.done and not Outcome.HASH_MISMATCH.done


async def test_a_body_fetched_ahead_applies_the_newer_change_without_a_second_fetch(
    env: Env, source: Source
) -> None:
    """The overload freeze: the Source moves on faster than the Destination fetches.

    The stale change's fetch returns the newer version's bytes; they fail its
    check, are kept, and apply the newer change when it comes, with no second
    request (which would return bytes newer still on a hot resource).
    """
    source.files["/v"] = b"v2"
    applier = env.applier(retries=5, backoff_initial=0.5)
    stale = applier.submit(env.note("/v", "created", at(1), body=b"v1"))
    await async_wait_for(lambda: source.requests, timeout=10)
    tried = len(source.requests)
    source.files["/v"] = b"v3"  # the Source moved on again: a fetch now gets v3
    fresh = applier.submit(env.note("/v", "updated", at(2), body=b"v2"))
    assert await stale is Outcome.SUPERSEDED
    # The newer change starts only once the stale one is done (one loc, in order).
    after_stale = len(source.requests)
    assert after_stale >= tried
    assert await fresh is Outcome.APPLIED
    assert len(source.requests) == after_stale  # v2 came from the bytes fetched for v1
    assert env.path("/v").read_bytes() == b"v2"
    # Kept bytes never stand in for another version: v3's change gets v3 (kept
    # from a retry of the stale change, or fetched), never the kept v2.
    assert await applier.apply(env.note("/v", "updated", at(3), body=b"v3")) is Outcome.APPLIED
    assert env.path("/v").read_bytes() == b"v3"
    await assert_never_backwards(env.store)


# --- deletes, metadata only, hooks --------------------------------------------------


async def test_deletes(env: Env, source: Source) -> None:
    source.files["/x"] = b"x"
    applier = env.applier(hooks=env.recording_hooks())
    assert await applier.apply(env.note("/x", body=b"x", when=at(1))) is Outcome.APPLIED
    assert await applier.apply(env.note("/x", "deleted", at(2))) is Outcome.DELETED
    assert not env.path("/x").exists()
    assert await applier.apply(env.note("/never-seen", "deleted", at(2))) is Outcome.DELETED
    assert await applier.apply(env.note("/never-seen", "created", at(1))) is Outcome.OUTDATED
    # a late create does not resurrect a deleted resource: the Source, asked, agrees (404)
    assert source.requests == ["/x", "/never-seen"]
    assert [(kind, path) for kind, _, path in env.events] == [
        ("created", env.path("/x")),
        ("deleted", env.path("/x")),
        ("deleted", env.path("/never-seen")),
    ]


async def test_metadata_only_records_without_fetching(env: Env, source: Source) -> None:
    applier = env.applier(metadata_only=True, hooks=env.recording_hooks())
    created = env.note("/m", body=b"never fetched", when=at(1))
    assert await applier.apply(created) is Outcome.RECORDED
    assert await applier.apply(created) is Outcome.SKIPPED_ALREADY_APPLIED
    assert await applier.apply(env.note("/m", "deleted", at(2))) is Outcome.RECORDED
    assert source.requests == []
    assert not env.path("/m").exists()
    state = await env.store.get(created.loc)
    assert state is not None and state.change is ChangeType.DELETED
    assert [kind for kind, _, _ in env.events] == ["created", "deleted"]
    assert await env.outcomes("/m") == ["recorded", "skipped_already_applied", "recorded"]


async def test_metadata_only_batches_agree_with_one_change_at_a_time(
    env: Env, source: Source, other: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submitted changes are recorded in batches; outcomes equal applying them singly."""
    batch = 500  # RECORD_BATCH's order of magnitude, with fewer changes to apply singly
    assert batch < RECORD_BATCH
    monkeypatch.setattr(recorder_module, "RECORD_BATCH", batch)
    rng = random.Random(7)
    changes = []
    for _ in range(3 * batch):  # more than one batch
        loc = f"/r/{rng.randrange(40)}"
        kind = rng.choice(["created", "updated", "deleted"])
        changes.append(env.note(loc, kind, at(rng.randrange(1, 30))))
    changes.insert(10, env.note(other.url("/forged"), "created", at(5)))  # off-origin
    batched = env.applier(metadata_only=True, hooks=env.recording_hooks())
    outcomes = await asyncio.gather(*(batched.submit(c) for c in changes))
    await batched.drain()
    assert batched.pending == 0

    single_store = ResourceStore(tmp_path / "single.sqlite")
    try:
        single = Applier(
            env.mirror, single_store, env.fetcher, allowed_origins=[source.base],
            metadata_only=True,
        )  # fmt: skip
        expected = [await single.apply(c) for c in changes]
        assert outcomes == expected
        assert Outcome.REFUSED_ORIGIN in outcomes and Outcome.SKIPPED_ALREADY_APPLIED in outcomes

        def fields(state: Any) -> Any:
            return state and (state.change, state.datetime, state.seq, state.sha256, state.length)

        for loc in {c.loc for c in changes}:
            assert fields(await env.store.get(loc)) == fields(await single_store.get(loc))
    finally:
        await single_store.close()
    assert source.requests == [] and other.requests == []
    recorded = [c for c, o in zip(changes, outcomes, strict=True) if o is Outcome.RECORDED]
    assert [(kind, loc) for kind, loc, _ in env.events] == [(c.change, c.loc) for c in recorded]
    await assert_never_backwards(env.store)


async def test_metadata_only_groups_agree_with_single_submissions(
    env: Env, source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """submit_many (a walk's chunks) mixed with submit: the outcomes of one change at a time."""
    batch = 40
    monkeypatch.setattr(recorder_module, "RECORD_BATCH", batch)  # many batches, few changes
    rng = random.Random(11)
    changes = [
        env.note(f"/g/{rng.randrange(30)}", rng.choice(["created", "updated", "deleted"]),
                 at(rng.randrange(1, 40)))
        for _ in range(7 * batch)
    ]  # fmt: skip
    grouped = env.applier(metadata_only=True, hooks=env.recording_hooks())
    written: list[int] = []  # rows per transaction
    record_rows = env.store.record_rows

    async def counted(rows: list[Any]) -> list[bool]:
        written.append(len(rows))
        return await record_rows(rows)

    monkeypatch.setattr(env.store, "record_rows", counted)
    futures: list[asyncio.Future[Any]] = []
    cuts = [0, 5, 6, 30, 31, 2 * batch + 50, 5 * batch, len(changes)]  # a group > a batch too
    for start, end in itertools.pairwise(cuts):
        part = changes[start:end]
        if len(part) == 1:
            futures.append(grouped.submit(part[0]))
        else:
            futures.append(grouped.submit_many(grouped.read_many(part), part))
    results = await asyncio.gather(*futures)
    outcomes = [o for r in results for o in (r if isinstance(r, list) else [r])]
    await grouped.drain()
    assert grouped.pending == 0
    assert sum(written) == len(changes) and len(written) >= 3  # batches, not one transaction
    assert max(written) == 2 * batch + 50 - 31  # only the group larger than a batch exceeds it
    single_store = ResourceStore(tmp_path / "single.sqlite")
    try:
        single = Applier(
            env.mirror, single_store, env.fetcher, allowed_origins=[source.base],
            metadata_only=True,
        )  # fmt: skip
        assert outcomes == [await single.apply(c) for c in changes]
        for loc in {c.loc for c in changes}:
            mine, theirs = await env.store.get(loc), await single_store.get(loc)
            assert (mine.change, mine.datetime) == (theirs.change, theirs.datetime)  # type: ignore[union-attr]
    finally:
        await single_store.close()
    recorded = [c for c, o in zip(changes, outcomes, strict=True) if o is Outcome.RECORDED]
    assert [(kind, loc) for kind, loc, _ in env.events] == [(c.change, c.loc) for c in recorded]
    await assert_never_backwards(env.store)


async def test_metadata_only_groups_record_their_collection(env: Env) -> None:
    """A walk's recorded rows name their collection, so a re-baseline of that collection
    finds them (``held``) even where the subscriber follows several."""
    applier = env.applier(metadata_only=True)
    changes = [env.note(f"/c/{i}", "created", at(i + 1)) for i in range(8)]
    await applier.submit_many(applier.read_many(changes, collection="col-a"), changes)
    await applier.drain()
    assert sorted(await env.store.held("col-a", before=at(100))) == sorted(c.loc for c in changes)
    assert await env.store.held("col-b", before=at(100)) == []


async def test_metadata_only_groups_fail_with_an_unusable_store(env: Env) -> None:
    """A local failure reaches every group queued, none is answered as recorded."""
    applier = env.applier(metadata_only=True)
    changes = [env.note(f"/u/{i}", "created", at(i)) for i in range(10)]
    await env.store.close()
    first = applier.submit_many(applier.read_many(changes[:6]), changes[:6])
    second = applier.submit_many(applier.read_many(changes[6:]), changes[6:])
    with pytest.raises(ResourceStoreError):
        await asyncio.wait_for(applier.drain(), 5)
    for future in (first, second):
        with pytest.raises(ResourceStoreError):
            future.result()


async def test_submit_many_takes_only_what_the_batch_recorder_records(env: Env) -> None:
    change = env.note("/x", "created", at(1))
    fetching = env.applier()
    with pytest.raises(ValueError):
        fetching.submit_many(fetching.read_many([change]), [change])


# --- metadata_only: one order for the batch recorder and the per-change path ----------


def _held_hooks(env: Env, holds: dict[str, asyncio.Event]) -> tuple[Hooks, set[str]]:
    """env's recording hooks, whose on_created of a loc in ``holds`` waits for its event.

    A slow hook (an indexer called per change) holds the batch recorder: it runs
    a batch's hooks before it answers the batch and writes the next one.  The
    set returned gets the locs whose hook is waiting (or has waited).
    """
    hooks = env.recording_hooks()
    record = hooks.on_created
    entered: set[str] = set()

    async def created(change: Notification, path: Path) -> None:
        record(change, path)
        if change.loc in holds:
            entered.add(change.loc)
            await holds[change.loc].wait()

    hooks.on_created = created
    return hooks, entered


def _listed(loc: str, change: ChangeType, when: datetime) -> list[Entry]:
    return [Entry(loc=loc, change=change, datetime=when)]


async def test_metadata_only_an_unsigned_deletion_comes_after_a_create_still_queued(
    env: Env, source: Source
) -> None:
    """A pushed create waits in the batch recorder, an unsigned deletion of its resource
    is pushed after it: recorded first, the deletion would be written over by the older
    create (the store lets anything replace a provisional state), and the Destination
    would hold a resource the Source has deleted until the next walk of the Change Lists."""
    release = asyncio.Event()
    hooks, entered = _held_hooks(env, {source.url("/slow"): release})
    applier = env.applier(metadata_only=True, hooks=hooks)
    slow = applier.submit(env.note("/slow", "created", at(1)), confirmed=False)
    await async_wait_for(lambda: entered, timeout=10, message="the hook never ran")
    create = applier.submit(env.note("/x", "created", at(1)), confirmed=False)
    deletion = applier.submit(env.note("/x", "deleted", at(2)), confirmed=False)  # the Source: 404
    # Unsigned deletions of other resources, one after the other, each the work the
    # deletion of /x does: it had every chance to be recorded, had it not waited.
    for i in range(3):
        other = env.note(f"/other/{i}", "deleted", at(2))
        assert await applier.apply(other, confirmed=False) is Outcome.RECORDED
    waited = not deletion.done()
    release.set()
    outcomes = await asyncio.wait_for(asyncio.gather(slow, create, deletion), 10)
    assert outcomes == [Outcome.RECORDED] * 3
    x = source.url("/x")
    state = await env.store.get(x)
    assert state is not None and (state.change, state.datetime) == (ChangeType.DELETED, at(2))
    assert [kind for kind, loc, _ in env.events if loc == x] == ["created", "deleted"]
    assert [r.change for r in await env.store.apply_log(x)] == ["created", "deleted"]
    assert waited, "the deletion was decided before the create submitted before it was recorded"


async def test_metadata_only_a_create_pushed_during_an_unsigned_deletion_comes_after_it(
    env: Env, source: Source
) -> None:
    """The deletion waits for the Source's answer; a newer create pushed meanwhile must
    not be recorded before it (the batch recorder would, at once): the deletion, recorded
    after the create, would replace it (provisional, it gives way to an older change)."""
    gate = source.gates["/x"] = asyncio.Event()  # the Source's answer to the deletion, held
    applier = env.applier(metadata_only=True, hooks=env.recording_hooks())
    deletion = applier.submit(env.note("/x", "deleted", at(1)), confirmed=False)
    await async_wait_for(lambda: "/x" in source.requests, timeout=10)
    create = applier.submit(env.note("/x", "created", at(2)), confirmed=False)
    # The recorder records in submission order: had the create gone its way, it is
    # recorded once a change pushed after it is.
    later = applier.submit(env.note("/later", "created", at(2)), confirmed=False)
    assert await asyncio.wait_for(later, 10) is Outcome.RECORDED
    waited = not create.done()
    gate.set()  # 404: the deletion is borne out
    outcomes = await asyncio.wait_for(asyncio.gather(deletion, create), 10)
    assert outcomes == [Outcome.RECORDED, Outcome.RECORDED]
    x = source.url("/x")
    state = await env.store.get(x)
    assert state is not None and (state.change, state.datetime) == (ChangeType.CREATED, at(2))
    assert [kind for kind, loc, _ in env.events if loc == x] == ["deleted", "created"]
    assert waited, "the create was recorded before the deletion submitted before it"


async def test_metadata_only_a_walk_after_an_unsigned_deletion_confirms_it(
    env: Env, source: Source
) -> None:
    """A walk's chunk listing the very deletion that waits for the Source: its entry
    comes after the pushed one and confirms it; recorded first, it was made
    provisional again by the pushed deletion recorded over it."""
    gate = source.gates["/x"] = asyncio.Event()
    applier = env.applier(metadata_only=True)
    deletion = applier.submit(env.note("/x", "deleted", at(1)), confirmed=False)
    await async_wait_for(lambda: "/x" in source.requests, timeout=10)
    listed = _listed(source.url("/x"), ChangeType.DELETED, at(1))
    listed += _listed(source.url("/y"), ChangeType.CREATED, at(1))
    walk = applier.submit_many(applier.read_many(listed), listed)
    later = applier.submit(env.note("/later", "created", at(2)))  # recorded in order, as above
    assert await asyncio.wait_for(later, 10) is Outcome.RECORDED
    waited = not walk.done()
    gate.set()
    assert await asyncio.wait_for(deletion, 10) is Outcome.RECORDED
    assert await asyncio.wait_for(walk, 10) == [Outcome.CONFIRMED, Outcome.RECORDED]
    state = await env.store.get(source.url("/x"))
    assert state is not None and state.change is ChangeType.DELETED and state.confirmed
    assert waited
    await applier.drain()
    assert applier.pending == 0


async def test_metadata_only_the_recorder_decides_on_what_the_other_path_recorded(
    env: Env, source: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch recorder remembers the states its batches leave while it runs; an
    unsigned deletion recorded meanwhile replaces what it knew of that resource, so a
    walk listing the deletion confirms it, as the one-change path does (not "recorded",
    as if the recorder's own create were still the state)."""
    monkeypatch.setattr(recorder_module, "RECORD_BATCH", 1)  # a batch per group
    first_hold, second_hold = asyncio.Event(), asyncio.Event()
    hold1, hold2 = source.url("/hold/1"), source.url("/hold/2")
    hooks, entered = _held_hooks(env, {hold1: first_hold, hold2: second_hold})
    applier = env.applier(metadata_only=True, hooks=hooks)
    listed = _listed(source.url("/x"), ChangeType.CREATED, at(1))
    listed += _listed(hold1, ChangeType.CREATED, at(1))
    first = applier.submit_many(applier.read_many(listed), listed)
    await async_wait_for(lambda: hold1 in entered, timeout=10)
    deletion = applier.submit(env.note("/x", "deleted", at(2)), confirmed=False)  # the Source: 404
    holding = _listed(hold2, ChangeType.CREATED, at(1))
    holding += _listed(source.url("/z"), ChangeType.CREATED, at(1))
    second = applier.submit_many(applier.read_many(holding), holding)  # a batch of its own
    first_hold.set()
    assert await asyncio.wait_for(deletion, 10) is Outcome.RECORDED
    await async_wait_for(lambda: hold2 in entered, timeout=10)  # the same recorder runs on
    listing = _listed(source.url("/x"), ChangeType.DELETED, at(2))
    confirmation = applier.submit_many(applier.read_many(listing), listing)
    second_hold.set()
    assert await asyncio.wait_for(confirmation, 10) == [Outcome.CONFIRMED]
    state = await env.store.get(source.url("/x"))
    assert state is not None and state.change is ChangeType.DELETED and state.confirmed
    assert await first == [Outcome.RECORDED] * 2 and await second == [Outcome.RECORDED] * 2


async def test_metadata_only_abandoning_a_walk_chunk_sent_change_by_change_records_none(
    env: Env, source: Source
) -> None:
    """A chunk holding a resource whose unsigned deletion is in flight goes change by
    change, some to the batch recorder; abandoned (an engine restarting from its
    cursor), none of them may still be recorded after the restart's own."""
    source.gates["/x"] = asyncio.Event()  # never opened: the deletion is abandoned too
    release = asyncio.Event()
    hooks, entered = _held_hooks(env, {source.url("/slow"): release})
    applier = env.applier(metadata_only=True, hooks=hooks)
    deletion = applier.submit(env.note("/x", "deleted", at(1)), confirmed=False)
    await async_wait_for(lambda: "/x" in source.requests, timeout=10)
    slow = applier.submit(env.note("/slow", "created", at(1)))
    await async_wait_for(lambda: entered, timeout=10)  # the recorder holds what comes next
    listed = _listed(source.url("/x"), ChangeType.DELETED, at(1))
    listed += _listed(source.url("/y"), ChangeType.CREATED, at(1))
    walk = applier.submit_many(applier.read_many(listed), listed)
    await asyncio.wait_for(applier.abandon([walk, deletion]), 10)
    for future in (walk, deletion):
        with pytest.raises(asyncio.CancelledError):
            future.result()
    after = applier.submit(env.note("/after", "created", at(2)))  # recorded in order
    release.set()
    assert await asyncio.wait_for(asyncio.gather(slow, after), 10) == [Outcome.RECORDED] * 2
    await asyncio.wait_for(applier.drain(), 10)
    assert await env.store.apply_log(source.url("/y")) == []
    assert await env.store.apply_log(source.url("/x")) == []


async def test_hooks_get_change_and_path_and_their_errors_are_not_fatal(
    env: Env, source: Source, caplog: pytest.LogCaptureFixture
) -> None:
    source.files["/k"] = b"k"
    seen: list[tuple[str, Path, bool]] = []

    class Broken:
        def on_created(self, change: Notification, path: Path) -> None:
            seen.append((change.loc, path, path.exists()))
            raise RuntimeError("hook bug")

        async def on_updated(self, change: Notification, path: Path) -> None:
            seen.append((change.loc, path, path.read_bytes() == b"k2"))

    applier = env.applier(hooks=Broken())
    assert await applier.apply(env.note("/k", when=at(1))) is Outcome.APPLIED
    source.files["/k"] = b"k2"
    assert await applier.apply(env.note("/k", "updated", at(2))) is Outcome.APPLIED
    assert await applier.apply(env.note("/k", "deleted", at(3))) is Outcome.DELETED  # no hook
    loc = source.url("/k")
    assert seen == [(loc, env.path("/k"), True), (loc, env.path("/k"), True)]
    assert "on_created hook failed" in caplog.text


# --- filesystem refusals --------------------------------------------------------------


async def test_symlink_escape_is_refused(env: Env, source: Source, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    host_dir = env.path("/anything").parent
    host_dir.mkdir(parents=True)
    (host_dir / "docs").symlink_to(outside, target_is_directory=True)
    source.files["/docs/evil.txt"] = b"written outside?"
    applier = env.applier()
    assert await applier.apply(env.note("/docs/evil.txt")) is Outcome.UNSAFE_PATH
    (outside / "keep.txt").write_bytes(b"keep")
    assert await applier.apply(env.note("/docs/keep.txt", "deleted", at(1))) is (
        Outcome.UNSAFE_PATH
    )
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert source.requests.count("/docs/evil.txt") == 1  # refused, not retried


async def test_file_directory_conflict_is_reported(env: Env, source: Source) -> None:
    source.files["/a"] = b"file"
    source.files["/a/b"] = b"under"
    applier = env.applier()
    assert await applier.apply(env.note("/a")) is Outcome.APPLIED
    assert await applier.apply(env.note("/a/b")) is Outcome.PATH_CONFLICT
    assert env.path("/a").read_bytes() == b"file"


# --- ordering and concurrency ---------------------------------------------------------


async def test_changes_of_one_resource_apply_in_submission_order(env: Env, source: Source) -> None:
    source.files["/hot"] = b"current"
    others = [f"/cold/{i}" for i in range(24)]
    for path in others:
        source.files[path] = path.encode()
    gate = source.gates["/hot"] = asyncio.Event()  # hold the first fetch of /hot
    applier = env.applier(concurrency=4, hooks=env.recording_hooks())

    hot = [applier.submit(env.note("/hot", "created", at(1)))]
    await async_wait_for(lambda: "/hot" in source.requests, timeout=10)  # held at the gate
    hot += [
        applier.submit(env.note("/hot", "updated", at(2))),
        applier.submit(env.note("/hot", "deleted", at(3))),
        applier.submit(env.note("/hot", "created", at(4))),
    ]
    cold = [applier.submit(env.note(p, body=p.encode(), when=at(1))) for p in others]
    assert applier.pending == len(hot) + len(cold)
    # Every other resource finishes while the first change of /hot is stuck, so its
    # later changes had every chance to overtake it, had ordering not been enforced.
    assert await asyncio.wait_for(asyncio.gather(*cold), 10) == [Outcome.APPLIED] * len(cold)
    assert not any(f.done() for f in hot)
    gate.set()
    await asyncio.wait_for(applier.drain(), 10)
    assert applier.pending == 0
    # The update is superseded (a newer creation of /hot waits behind it: no
    # fetch); the delete still runs, in order, between the two creations.
    assert [f.result() for f in hot] == [
        Outcome.APPLIED,
        Outcome.SUPERSEDED,
        Outcome.DELETED,
        Outcome.APPLIED,
    ]
    hot_loc = source.url("/hot")
    assert [kind for kind, loc, _ in env.events if loc == hot_loc] == [
        "created",
        "deleted",
        "created",
    ]
    assert source.requests.count("/hot") == 2
    assert [r.datetime for r in await env.store.apply_log(hot_loc)] == [at(i) for i in (1, 2, 3, 4)]
    assert env.path("/hot").read_bytes() == b"current"
    await assert_never_backwards(env.store)


async def test_cancelling_a_change_leaves_the_earlier_one_it_waits_for_running(
    env: Env, source: Source
) -> None:
    """A change only waits for the earlier change of its resource; that one is its
    submitter's.  Abandoning one engine's change (the applier is shared by every
    collection, and two may list one resource) must not cancel another's it waits
    behind: that one would never apply, and its engine stop as if it had failed."""
    gate = source.gates["/shared"] = asyncio.Event()  # hold the earlier change's fetch
    source.files["/shared"] = b"shared"
    applier = env.applier()
    earlier = applier.submit(env.note("/shared", body=b"shared"))
    await async_wait_for(lambda: "/shared" in source.requests, timeout=10)
    later = applier.submit(env.note("/shared", "updated", at(2), body=b"shared"))
    await asyncio.wait_for(applier.abandon([later]), 10)
    assert later.cancelled()
    assert not earlier.done()
    gate.set()
    assert await asyncio.wait_for(earlier, 10) is Outcome.APPLIED
    assert env.path("/shared").read_bytes() == b"shared"
    assert await env.outcomes("/shared") == [Outcome.APPLIED]


async def test_different_resources_run_concurrently_up_to_the_limit(
    env: Env, source: Source
) -> None:
    limit = 3
    paths = [f"/c/{i}" for i in range(7)]
    gate = asyncio.Event()
    for path in paths:
        source.files[path] = b"c"
        source.gates[path] = gate
    applier = env.applier(concurrency=limit)
    futures = [applier.submit(env.note(p)) for p in paths]
    # Opens only if `limit` fetches are in flight at once; a serial applier never gets here.
    await async_wait_for(lambda: source.in_flight == limit, message="fetches not concurrent")
    gate.set()
    assert await asyncio.wait_for(asyncio.gather(*futures), 10) == [Outcome.APPLIED] * len(paths)
    assert source.max_in_flight == limit


async def test_deletes_waiting_for_the_disk_hold_no_transfer_slot(
    env: Env, source: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delete waits for the mirror's next write batch; fetches must not wait behind it.

    At 1,000 changes/s a fifth of them deletes, each holding one of 16 transfer
    slots for a batch's tens of milliseconds, left the fetches too few slots.
    """
    disk = asyncio.Event()
    real_delete, real_delete_many = env.mirror.delete, env.mirror.delete_many

    async def slow_delete(path: Path | str) -> bool:
        await disk.wait()  # a write batch that takes its time
        return await real_delete(path)

    async def slow_delete_many(paths: list[Path]) -> list[bool | BaseException]:
        await disk.wait()  # grouped deletions (rsnotify.subscriber.deletions) alike
        return await real_delete_many(paths)

    monkeypatch.setattr(env.mirror, "delete", slow_delete)
    monkeypatch.setattr(env.mirror, "delete_many", slow_delete_many)
    source.files["/kept"] = b"kept"
    applier = env.applier(concurrency=1)
    deletes = [applier.submit(env.note(f"/gone/{i}", "deleted")) for i in range(3)]
    fetched = applier.submit(env.note("/kept", body=b"kept"))
    assert await asyncio.wait_for(fetched, 10) is Outcome.APPLIED
    assert not any(d.done() for d in deletes)
    disk.set()
    assert await asyncio.wait_for(asyncio.gather(*deletes), 10) == [Outcome.DELETED] * 3


async def test_drain_with_nothing_pending_returns(env: Env) -> None:
    applier = env.applier()
    await asyncio.wait_for(applier.drain(), 1)
    assert applier.pending == 0


async def test_local_failures_are_raised_not_reported_as_outcomes(env: Env, source: Source) -> None:
    source.files["/l"] = b"l"
    applier = env.applier()
    await env.store.close()  # the Destination's own state is unusable
    future = applier.submit(env.note("/l"))
    with pytest.raises(ResourceStoreError):
        await asyncio.wait_for(applier.drain(), 5)
    with pytest.raises(ResourceStoreError):
        future.result()
    assert source.requests == []


# --- deletions applied as a group (rsnotify.subscriber.deletions) ----------------------


class Counting:
    """Wraps the mirror's and the store's calls a group makes, to count them (and gate one)."""

    def __init__(self, env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
        self.deletes: list[Path | str] = []
        self.delete_many: list[list[Path]] = []
        self.record_rows: list[int] = []
        self.gate: asyncio.Event | None = None
        real_delete, real_many = env.mirror.delete, env.mirror.delete_many
        real_rows = env.store.record_rows

        async def delete(path: Path | str) -> bool:
            self.deletes.append(path)
            return await real_delete(path)

        async def delete_many(paths: list[Path]) -> list[bool | BaseException]:
            self.delete_many.append(paths)
            if self.gate is not None:
                await self.gate.wait()
            return await real_many(paths)

        async def record_rows(rows: list[tuple[tuple[Any, ...], int]]) -> list[bool]:
            self.record_rows.append(len(rows))
            return await real_rows(rows)

        monkeypatch.setattr(env.mirror, "delete", delete)
        monkeypatch.setattr(env.mirror, "delete_many", delete_many)
        monkeypatch.setattr(env.store, "record_rows", record_rows)


async def test_deletions_submitted_together_are_one_unlink_batch_and_one_transaction(
    env: Env, source: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A walk's thousands of deletions: no task, queue slot and row commit each."""
    applier = env.applier(hooks=env.recording_hooks())
    held = [f"/held/{i}" for i in range(3)]
    for path in held:
        source.files[path] = path.encode()
        assert await applier.apply(env.note(path, body=path.encode(), when=at(1))) is (
            Outcome.APPLIED
        )
    never = [f"/never/{i}" for i in range(47)]  # created and deleted while we were away
    calls = Counting(env, monkeypatch)
    futures = [applier.submit(env.note(p, "deleted", at(2))) for p in held + never]
    assert await asyncio.wait_for(asyncio.gather(*futures), 10) == [Outcome.DELETED] * 50
    assert [len(paths) for paths in calls.delete_many] == [50] and calls.deletes == []
    assert calls.record_rows == [50]
    assert not any(env.path(p).exists() for p in held)
    assert [k for k, _, _ in env.events] == ["created"] * 3 + ["deleted"] * 50
    for path in held:
        assert [(r.outcome, r.detail) for r in await env.store.apply_log(source.url(path))] == [
            ("applied", None),
            ("deleted", None),
        ]
    assert [(r.outcome, r.detail) for r in await env.store.apply_log(source.url(never[0]))] == [
        ("deleted", "no file to remove")
    ]
    state = await env.store.get(source.url(held[0]))
    assert state is not None and (state.change, state.datetime) == (ChangeType.DELETED, at(2))
    assert applier.pending == 0


async def test_a_grouped_deletion_the_state_questions_goes_the_per_change_way(
    env: Env, source: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Older than what the mirror holds (back-dated): the Source is asked, as for one deletion."""
    source.files["/x"] = b"x"
    applier = env.applier()
    assert await applier.apply(env.note("/x", body=b"x", when=at(5))) is Outcome.APPLIED
    calls = Counting(env, monkeypatch)
    x = applier.submit(env.note("/x", "deleted", at(2)))  # the Source still serves /x
    y = applier.submit(env.note("/y", "deleted", at(2)))
    assert await asyncio.wait_for(asyncio.gather(x, y), 10) == [Outcome.OUTDATED, Outcome.DELETED]
    assert env.path("/x").read_bytes() == b"x"
    assert source.requests.count("/x") == 2  # the creation's fetch, then the question
    assert [len(paths) for paths in calls.delete_many] == [1]  # /y only


async def test_a_change_after_a_grouped_deletion_of_its_resource_waits_for_it(
    env: Env, source: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    source.files["/z"] = b"again"
    source.files["/w"] = b"w"
    applier = env.applier(hooks=env.recording_hooks())
    calls = Counting(env, monkeypatch)
    calls.gate = asyncio.Event()  # the group's unlinks take their time
    deletion = applier.submit(env.note("/z", "deleted", at(1)))
    creation = applier.submit(env.note("/z", "created", at(2), body=b"again"))
    unrelated = applier.submit(env.note("/w", "created", at(2), body=b"w"))
    await async_wait_for(lambda: bool(calls.delete_many), timeout=10)
    # A creation submitted with it is fetched and written meanwhile: /z's had every chance.
    assert await asyncio.wait_for(unrelated, 10) is Outcome.APPLIED
    assert not creation.done() and "/z" not in source.requests
    calls.gate.set()
    assert await asyncio.wait_for(asyncio.gather(deletion, creation), 10) == [
        Outcome.DELETED,
        Outcome.APPLIED,
    ]
    assert env.path("/z").read_bytes() == b"again"
    assert [k for k, loc, _ in env.events if loc == source.url("/z")] == ["deleted", "created"]


async def test_refused_and_unsafe_deletions_in_a_group_are_reported_alone(
    env: Env, source: Source, other: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_bytes(b"keep")
    host_dir = env.path("/anything").parent
    host_dir.mkdir(parents=True)
    (host_dir / "docs").symlink_to(outside, target_is_directory=True)
    applier = env.applier(hooks=env.recording_hooks())
    calls = Counting(env, monkeypatch)
    futures = [
        applier.submit(env.note(other.url("/secret"), "deleted", at(1))),  # forged origin
        applier.submit(env.note("/docs/keep.txt", "deleted", at(1))),  # through a symlink
        applier.submit(env.note("/fine", "deleted", at(1))),
    ]
    assert await asyncio.wait_for(asyncio.gather(*futures), 10) == [
        Outcome.REFUSED_ORIGIN,
        Outcome.UNSAFE_PATH,
        Outcome.DELETED,
    ]
    assert (outside / "keep.txt").read_bytes() == b"keep"
    assert [len(paths) for paths in calls.delete_many] == [2]  # the origin is refused first
    assert [outcome for _, outcome in env.failures] == [
        Outcome.REFUSED_ORIGIN,
        Outcome.UNSAFE_PATH,
    ]
    assert [k for k, _, _ in env.events] == ["deleted"]


async def test_abandoning_a_group_unlinks_and_records_nothing_more(
    env: Env, source: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    applier = env.applier()
    for i in range(5):
        source.files[f"/k/{i}"] = b"k"
        assert await applier.apply(env.note(f"/k/{i}", body=b"k", when=at(1))) is Outcome.APPLIED
    calls = Counting(env, monkeypatch)
    calls.gate = asyncio.Event()
    futures = [applier.submit(env.note(f"/k/{i}", "deleted", at(2))) for i in range(5)]
    await async_wait_for(lambda: bool(calls.delete_many), timeout=10)
    await asyncio.wait_for(applier.abandon(futures), 10)
    assert all(f.cancelled() for f in futures) and applier.pending == 0
    calls.gate.set()
    source.files["/after"] = b"a"  # a change applied after it: a straggler had its turn
    assert await applier.apply(env.note("/after", body=b"a", when=at(3))) is Outcome.APPLIED
    await env.mirror.settle()
    assert all(env.path(f"/k/{i}").exists() for i in range(5))
    assert calls.record_rows == []
    # The restart resubmits them, and they apply.
    again = [applier.submit(env.note(f"/k/{i}", "deleted", at(2))) for i in range(5)]
    assert await asyncio.wait_for(asyncio.gather(*again), 10) == [Outcome.DELETED] * 5


async def test_the_hooks_of_a_group_run_side_by_side(env: Env) -> None:
    """As the per-change tasks ran them: a hook waiting on the network holds up no other."""
    started: list[str] = []
    everyone = asyncio.Event()

    async def deleted(change: Notification, path: Path) -> None:
        started.append(change.loc)
        if len(started) == 5:
            everyone.set()
        await everyone.wait()  # in turn, the first would wait here for ever

    applier = env.applier(hooks=Hooks(on_deleted=deleted))
    futures = [applier.submit(env.note(f"/h/{i}", "deleted", at(1))) for i in range(5)]
    assert await asyncio.wait_for(asyncio.gather(*futures), 10) == [Outcome.DELETED] * 5
    assert sorted(started) == sorted(env.source.url(f"/h/{i}") for i in range(5))


async def test_a_group_that_cannot_reach_the_store_fails_each_deletion(env: Env) -> None:
    applier = env.applier()
    await env.store.close()
    futures = [applier.submit(env.note(f"/d/{i}", "deleted", at(1))) for i in range(3)]
    for future in futures:
        with pytest.raises(ResourceStoreError):
            await asyncio.wait_for(future, 10)
    assert applier.pending == 0


# --- the resource store on its own ------------------------------------------------------


async def test_store_state_never_moves_backwards(tmp_path: Path) -> None:
    store = ResourceStore(tmp_path / "r.sqlite")
    try:
        assert await store.record_applied("http://s/a", "updated", at(2), sha256="b") is True
        assert await store.record_applied("http://s/a", "created", at(1), sha256="a") is False
        state = await store.get("http://s/a")
        assert state is not None and (state.change, state.sha256) == (ChangeType.UPDATED, "b")
        await store.record_outcome("http://s/b", "deleted", at(1), outcome="not_found")
        assert await store.get("http://s/b") is None
        assert [(r.loc, r.outcome) for r in await store.apply_log()] == [
            ("http://s/a", "applied"),
            ("http://s/a", "applied"),
            ("http://s/b", "not_found"),
        ]
        assert await store.count() == 1
    finally:
        await store.close()


async def test_store_answers_concurrent_reads_together_and_agrees_with_the_file(
    tmp_path: Path,
) -> None:
    """Reads issued together share one query; the cache never disagrees with SQLite."""
    path = tmp_path / "r.sqlite"
    store = ResourceStore(path, cache_size=50)
    locs = [f"http://s/{i}" for i in range(300)]
    try:
        for i, loc in enumerate(locs[:200]):
            await store.record_applied(loc, "created", at(i % 7 + 1), seq=i)
        reopened = ResourceStore(path, cache_size=50)  # cold cache: every answer from the file
        try:
            states = await asyncio.gather(*(reopened.get(loc) for loc in locs))
            assert [s.seq if s else None for s in states] == [*range(200), *[None] * 100]
            # A write racing reads of the same loc: the answer is the committed state.
            write = asyncio.ensure_future(
                reopened.record_applied(locs[250], "updated", at(9), seq=999)
            )
            read = asyncio.ensure_future(reopened.get(locs[250]))
            await write
            late = await reopened.get(locs[250])
            assert late is not None and late.seq == 999
            assert (await read) is None or (await read).seq == 999
            # Backwards writes are refused by the database, and the cache follows it.
            assert await reopened.record_applied(locs[250], "created", at(1), seq=1) is False
            state = await reopened.get(locs[250])
            assert state is not None and state.seq == 999
        finally:
            await reopened.close()
        for loc in locs:  # the first store's cache (evicting at 50) agrees with the file
            cached = await store.get(loc)
            assert cached == await _fresh_state(path, loc)
    finally:
        await store.close()


async def _fresh_state(path: Path, loc: str) -> Any:
    store = ResourceStore(path, cache_size=0)
    try:
        return await store.get(loc)
    finally:
        await store.close()


def test_store_refuses_an_unusable_path(tmp_path: Path) -> None:
    with pytest.raises(ResourceStoreError):
        ResourceStore(tmp_path)  # a directory


# --- Resource Dump packages ------------------------------------------------------------


def _zip(members: dict[str, bytes], manifest: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("manifest.xml", manifest)
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


async def test_a_hostile_resource_dump_package_cannot_escape_bomb_or_corrupt_the_mirror(
    env: Env, source: Source, tmp_path: Path
) -> None:
    """Member names are never paths; lengths and hashes bound and check every member;
    whatever a package cannot supply correctly is fetched from its loc instead."""
    good, lying, bomb = b"good bytes", b"the right bytes", b"0123456789"
    source.files["/r/lying"] = lying
    source.files["/r/bomb"] = bomb
    source.files["/r/absent"] = b"not in the package"

    def url_entry(path: str, body: bytes, member: str) -> str:
        sha = hashlib.sha256(body).hexdigest()
        return (
            f"<url><loc>{source.url(path)}</loc>"
            f'<rs:md length="{len(body)}" hash="sha-256:{sha}" path="{member}"/></url>'
        )

    manifest = (
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
        'xmlns:rs="http://www.openarchives.org/rs/terms/">'
        '<rs:md capability="resourcedump-manifest" at="2026-01-01T00:00:00Z"/>'
        + url_entry("/r/good", good, "/../../../etc/good")
        + url_entry("/r/lying", lying, "lying")
        + url_entry("/r/bomb", bomb, "bomb")
        + url_entry("/r/absent", b"not in the package", "absent")
        + "</urlset>"
    )
    package = _zip(
        {"../../../etc/good": good, "lying": b"the WRONG bytes", "bomb": b"0" * 50_000_000},
        manifest,
    )
    source.files["/dump/p1.zip"] = package
    source.files["/resourcedump.xml"] = (
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
        'xmlns:rs="http://www.openarchives.org/rs/terms/">'
        '<rs:md capability="resourcedump" at="2026-01-01T00:00:00Z"/>'
        f"<url><loc>{source.url('/dump/p1.zip')}</loc>"
        f'<rs:md length="{len(package)}" type="application/zip"/></url></urlset>'
    ).encode()
    applier = env.applier()
    summary = await baseline(
        env.fetcher, applier, None, collection="c",
        resourcedump_url=source.url("/resourcedump.xml"), workdir=tmp_path / "state",
    )  # fmt: skip
    assert (summary.files, summary.failed, summary.dump_packages) == (4, 0, 1)
    for path, body in (("/r/good", good), ("/r/lying", lying), ("/r/bomb", bomb)):
        assert env.path(path).read_bytes() == body
    assert env.path("/r/absent").read_bytes() == b"not in the package"
    assert sorted(source.requests) == sorted(
        ["/resourcedump.xml", "/dump/p1.zip", "/r/lying", "/r/bomb", "/r/absent"]
    )  # the good member came from the package; the others were fetched
    assert not (tmp_path / "etc").exists() and not list((tmp_path / "state").glob("*.zip"))
    assert all(p.is_relative_to(env.mirror.root) for p in env.mirror.root.rglob("*"))
    await assert_never_backwards(env.store)


async def test_abandon_cancels_everything_in_flight_before_a_restart(
    env: Env, source: Source
) -> None:
    """After a local failure the engine restarts from its cursor: nothing from before may
    still be running (and later rename older bytes over what the restart writes)."""
    gate = source.gates["/held"] = asyncio.Event()
    source.files["/held"] = b"held"
    source.files["/other"] = b"other"
    applier = env.applier()
    futures = [applier.submit(env.note("/held", body=b"held"))]
    futures.append(applier.submit(env.note("/held", "updated", at(2), body=b"held")))
    futures.append(applier.submit(env.note("/other", body=b"other")))
    await async_wait_for(lambda: "/held" in source.requests, timeout=10)
    await asyncio.wait_for(applier.abandon(), 10)
    assert applier.pending == 0
    assert all(f.done() for f in futures)
    assert futures[1].cancelled()  # it was held mid-fetch (the first was superseded by it)
    assert not env.path("/held").exists()
    gate.set()
    # A fresh start applies the same change normally.
    assert await env.applier().apply(env.note("/held", "updated", at(2), body=b"held")) is (
        Outcome.APPLIED
    )


async def test_cancelling_a_baseline_leaves_the_change_it_waits_for_to_its_owner(
    env: Env, source: Source
) -> None:
    """A baseline waits for its changes one after another.  Cancelled while it waits,
    it must not cancel the one change it happens to be waiting for while every other
    goes on: whoever owns the applier abandons them all, or none."""
    gate = source.gates["/a"] = asyncio.Event()  # hold the first change's fetch
    source.files["/a"], source.files["/b"] = b"a", b"b"
    source.files["/resourcelist.xml"] = (
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
        'xmlns:rs="http://www.openarchives.org/rs/terms/">'
        '<rs:md capability="resourcelist" at="2026-01-01T00:00:00Z"/>'
        f"<url><loc>{source.url('/a')}</loc></url><url><loc>{source.url('/b')}</loc></url>"
        "</urlset>"
    ).encode()
    applier = env.applier()
    running = asyncio.create_task(
        baseline(env.fetcher, applier, source.url("/resourcelist.xml"), collection="c")
    )
    await async_wait_for(lambda: "/a" in source.requests, timeout=10)
    # /b done, not only its file in place (its state is recorded after the rename).
    await async_wait_for(lambda: env.path("/b").exists() and applier.pending == 1, timeout=10)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert applier.pending == 1  # /a: still fetching, not cancelled by the baseline
    gate.set()
    await async_wait_for(lambda: applier.pending == 0, timeout=10)
    assert env.path("/a").read_bytes() == b"a"
    assert await env.outcomes("/a") == [Outcome.APPLIED]


async def test_a_resource_dump_package_off_the_sources_origin_is_not_downloaded(
    env: Env, source: Source, other: Source, tmp_path: Path
) -> None:
    other.files["/p.zip"] = _zip({}, "<urlset/>")
    source.files["/resourcedump.xml"] = (
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
        'xmlns:rs="http://www.openarchives.org/rs/terms/">'
        '<rs:md capability="resourcedump" at="2026-01-01T00:00:00Z"/>'
        f"<url><loc>{other.url('/p.zip')}</loc></url></urlset>"
    ).encode()
    summary = await baseline(
        env.fetcher, env.applier(), None, collection="c",
        resourcedump_url=source.url("/resourcedump.xml"), workdir=tmp_path / "state",
    )  # fmt: skip
    assert other.requests == [] and summary.dump_packages == 0
    assert summary.at is None  # incomplete and no Resource List: start from the beginning


# --- changes nobody vouched for (rsnotify.subscriber.trust) -------------------------


async def test_a_provisional_state_never_makes_a_genuine_change_look_old(
    env: Env, source: Source
) -> None:
    """An unsigned "updated" dated later than the truth must not hide the true next change."""
    source.files["/a"] = b"v1"
    applier = env.applier()
    forged = env.note("/a", "updated", at(100))  # no hash: whatever the Source serves
    assert await applier.apply(forged, confirmed=False) is Outcome.APPLIED
    state = await env.store.get(source.url("/a"))
    assert state is not None and not state.confirmed
    source.files["/a"] = b"v2"
    genuine = env.note("/a", "updated", at(50), body=b"v2")
    assert await applier.apply(genuine) is Outcome.APPLIED, "skipped as older than the forgery"
    assert env.path("/a").read_bytes() == b"v2"
    # The log never goes back, and the later (maybe forged) time is never trusted.
    state = await env.store.get(source.url("/a"))
    assert state is not None and not state.confirmed and state.datetime == at(100)
    await assert_never_backwards(env.store)


async def test_an_older_change_is_rechecked_at_the_source_not_applied_blindly(
    env: Env, source: Source
) -> None:
    """A genuine pushed state (provisional), then an older entry from the Change List walk."""
    source.files["/a"] = b"v2"
    source.files["/gone"] = b"still here"
    applier = env.applier()
    for path, body in (("/a", b"v2"), ("/gone", b"still here")):
        pushed = env.note(path, "updated", at(20), body=body)
        assert await applier.apply(pushed, confirmed=False) is Outcome.APPLIED
    requests = len(source.requests)
    # The walk lists an older version (no hash) and an older deletion: the Source is
    # asked, agrees with the mirror, and nothing goes back in time.
    assert await applier.apply(env.note("/a", "created", at(10))) is Outcome.OUTDATED
    assert await applier.apply(env.note("/gone", "deleted", at(15))) is Outcome.OUTDATED
    assert len(source.requests) == requests + 2
    assert env.path("/a").read_bytes() == b"v2" and env.path("/gone").exists()
    await assert_never_backwards(env.store)
    # The walk then lists exactly the pushed change: confirmed, nothing fetched.
    assert await applier.apply(env.note("/a", "updated", at(20), body=b"v2")) is Outcome.CONFIRMED
    assert len(source.requests) == requests + 2
    state = await env.store.get(source.url("/a"))
    assert state is not None and state.confirmed


async def test_an_unsigned_deletion_needs_the_source_to_agree(env: Env, source: Source) -> None:
    source.files["/x"] = b"x"
    source.files["/y"] = b"y"
    applier = env.applier(hooks=env.recording_hooks())
    for path in ("/x", "/y"):
        assert await applier.apply(env.note(path, body=source.files[path], when=at(1))) is (
            Outcome.APPLIED
        )
    assert await applier.apply(env.note("/x", "deleted", at(2)), confirmed=False) is (
        Outcome.UNCONFIRMED
    )
    assert env.path("/x").exists(), "removed although the Source still serves it"
    del source.files["/y"]
    assert await applier.apply(env.note("/y", "deleted", at(2)), confirmed=False) is (
        Outcome.DELETED
    )
    assert not env.path("/y").exists()
    assert ("deleted", env.path("/x")) not in [(k, p) for k, _, p in env.events]
    assert env.failures == [(source.url("/x"), Outcome.UNCONFIRMED)]
    assert await env.outcomes("/x") == ["applied", "unconfirmed"]


async def test_a_date_beyond_the_clock_skew_is_never_trusted(env: Env, source: Source) -> None:
    """Even from a trusted path: a clock that jumped must not freeze a resource."""
    source.files["/a"] = b"v1"
    applier = env.applier(max_skew=60)
    future = datetime.now(UTC) + timedelta(days=3650)
    assert await applier.apply(env.note("/a", "updated", future)) is Outcome.APPLIED
    state = await env.store.get(source.url("/a"))
    assert state is not None and not state.confirmed
    source.files["/a"] = b"v2"
    assert await applier.apply(env.note("/a", "updated", at(5), body=b"v2")) is Outcome.APPLIED
    assert env.path("/a").read_bytes() == b"v2"


async def test_an_old_store_is_migrated_and_its_states_stay_trusted(tmp_path: Path) -> None:
    """A resources.sqlite3 written before provisional states existed opens unchanged."""
    import sqlite3

    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE resources (loc TEXT PRIMARY KEY, change TEXT NOT NULL, "
        "datetime_us INTEGER NOT NULL, seq INTEGER, sha256 TEXT, length INTEGER, "
        "applied_us INTEGER NOT NULL) WITHOUT ROWID;"
        "CREATE TABLE apply_log (id INTEGER PRIMARY KEY AUTOINCREMENT, loc TEXT NOT NULL, "
        "change TEXT NOT NULL, datetime_us INTEGER NOT NULL, seq INTEGER, "
        "applied_us INTEGER NOT NULL, sha256 TEXT, length INTEGER, outcome TEXT NOT NULL, "
        "detail TEXT);"
        "INSERT INTO resources VALUES ('http://s/a', 'created', 1000000, 7, NULL, 3, 1000000);"
        "INSERT INTO apply_log(loc, change, datetime_us, seq, applied_us, outcome) "
        "VALUES ('http://s/a', 'created', 1000000, 7, 1000000, 'applied');"
    )
    db.commit()
    db.close()
    store = ResourceStore(path)
    try:
        state = await store.get("http://s/a")
        assert state is not None and state.confirmed and state.seq == 7
        (record,) = await store.apply_log()
        assert record.confirmed and record.outcome == "applied"
        assert await store.record_applied(
            "http://s/a", "updated", datetime(1970, 1, 1, 0, 0, 2, tzinfo=UTC), confirmed=False
        )
        state = await store.get("http://s/a")
        assert state is not None and not state.confirmed
    finally:
        await store.close()


@pytest.mark.parametrize("signed", [True, False])
async def test_a_walk_settles_what_push_applied_however_often_it_changed(
    env: Env, source: Source, signed: bool
) -> None:
    """A resource changed twice between two walks costs the walk no task and no row.

    Push applied every change; the walk reads them all again from the Change
    List.  Each resource's last entry equals its state, so it and every
    earlier entry of that resource are done (before, the earlier one was
    recorded superseded and the last submitted, fetched nowhere but logged
    as skipped).  Unsigned, the states are provisional and only each
    resource's last entry is confirmed.
    """
    applier = env.applier()
    changes = [("/a", "created", at(1), b"a1"), ("/b", "created", at(2), b"b1"),
               ("/a", "updated", at(3), b"a2")]  # fmt: skip
    entries = []
    for path, change, when, body in changes:
        source.files[path] = body
        note = env.note(path, change, when, body=body)
        assert await applier.apply(note, confirmed=signed) is Outcome.APPLIED
        entries.append(Entry(loc=note.loc, change=note.change, datetime=when,
                             hash=note.hash, length=note.length))  # fmt: skip
    assert await applier.settle_many(entries) == [True, True, True]
    assert await env.outcomes("/a") == ["applied", "applied"] + ([] if signed else ["confirmed"])
    assert await env.outcomes("/b") == ["applied"] + ([] if signed else ["confirmed"])
    state = await env.store.get(source.url("/a"))
    assert state is not None and state.confirmed and state.datetime == at(3)
    # The newest entry not yet applied: that resource's every entry needs work.
    later = Entry(loc=source.url("/a"), change=ChangeType.UPDATED, datetime=at(4))
    assert await applier.settle_many([*entries, later]) == [False, True, False, False]


@pytest.mark.parametrize("signed", [True, False])
async def test_a_walk_settles_in_slices_with_the_loop_running_between(
    env: Env, signed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """settle_many of a walk following push gives the loop back every SETTLE_SLICE entries.

    In one piece, a thousand entries were one step of the loop that every
    notification arriving meanwhile waited for (bench.e2e at 200/s: the
    p99 of change-to-applied).  Sliced, the loop runs between slices, and
    each slice decides at most SETTLE_SLICE entries; the outcome is the same
    as in one piece.
    """
    applier = env.applier()
    count = 2 * SETTLE_SLICE + 7
    entries = []
    for i in range(count):
        loc, when = env.source.url(f"/r{i}"), at(i + 1)
        await env.store.record_applied(loc, ChangeType.CREATED, when, confirmed=signed)
        entries.append(Entry(loc=loc, change=ChangeType.CREATED, datetime=when))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    decided: list[int] = []  # the loop's turn at which each entry was decided
    same_change = applier_module.same_change

    def counting_same_change(state: Any, view: Any) -> bool:
        decided.append(ticks)
        return same_change(state, view)

    monkeypatch.setattr(applier_module, "same_change", counting_same_change)
    running = asyncio.create_task(ticker())
    try:
        assert await applier.settle_many(entries) == [True] * count
    finally:
        running.cancel()
    turns = [len(list(group)) for _, group in itertools.groupby(decided)]
    assert turns == [SETTLE_SLICE, SETTLE_SLICE, 7]  # from the end, the loop ran between
    for entry in (entries[0], entries[SETTLE_SLICE], entries[-1]):
        state = await env.store.get(entry.loc)
        assert state is not None and state.confirmed  # unsigned: confirmed by the walk
    assert await env.outcomes(entries[-1].loc) == ["applied"] + ([] if signed else ["confirmed"])
