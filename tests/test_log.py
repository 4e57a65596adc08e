"""The notification log, one suite for both backends (real Redis, real SQLite file)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from rsnotify.log import Fenced, LogConflict, LogUnavailable, NotificationLog, Retention
from rsnotify.log.redis_log import RedisLog
from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.log.tail_cache import TailCache
from tests.devstack import Redis

C = "example.com-c1-capabilitylist-0badc0de"


@pytest.fixture(params=["redis", "sqlite", "redis+tail-cache", "sqlite+tail-cache"])
async def log_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Callable[[], NotificationLog]]:
    """``make()`` opens a log on the same backing store each call (a 'restart').

    The ``+tail-cache`` variants run the same suite through the publisher's
    in-memory :class:`TailCache` (capacity 3, so reads cross its edge).
    """
    opened: list[NotificationLog] = []
    backend, _, cached = request.param.partition("+")
    server: Redis | None = request.getfixturevalue("redis_server") if backend == "redis" else None

    def make() -> NotificationLog:
        log: NotificationLog = (
            RedisLog(server.url) if server is not None else SQLiteLog(tmp_path / "log.sqlite3")
        )
        if cached:
            log = TailCache(log, capacity=3)
        opened.append(log)
        return log

    yield make
    for log in opened:
        await log.close()


@pytest.fixture
async def log(log_factory: Callable[[], NotificationLog]) -> NotificationLog:
    return log_factory()


async def test_append_assigns_dense_sequence_numbers_and_stores_the_checkpoint(
    log: NotificationLog,
) -> None:
    assert await log.head(C) == 0
    assert await log.earliest(C) == 1
    assert await log.checkpoint(C) is None
    head = await log.append(C, [b"a", b"b", b"c"], expected_head=0, checkpoint="cp1")
    assert head == 3
    head = await log.append(C, [b"d"], expected_head=3, checkpoint="cp2")
    assert head == 4
    records = await log.read(C, after=0)
    assert [(r.seq, r.data) for r in records] == [(1, b"a"), (2, b"b"), (3, b"c"), (4, b"d")]
    assert [r.seq for r in await log.read(C, after=2)] == [3, 4]
    assert [r.seq for r in await log.read(C, after=0, limit=2)] == [1, 2]
    assert await log.checkpoint(C) == "cp2"
    assert all(abs(r.logged_ms - time.time() * 1000) < 60_000 for r in records)


async def test_a_stale_expected_head_is_a_conflict_and_writes_nothing(log: NotificationLog) -> None:
    await log.append(C, [b"a"], expected_head=0, checkpoint="cp1")
    with pytest.raises(LogConflict):
        await log.append(C, [b"x"], expected_head=0, checkpoint="bad")
    assert await log.head(C) == 1
    assert await log.checkpoint(C) == "cp1"
    assert [r.data for r in await log.read(C, 0)] == [b"a"]


async def test_a_stale_fencing_token_is_refused(log: NotificationLog) -> None:
    await log.append(C, [b"a"], expected_head=0, checkpoint="leader2", fence=2)
    with pytest.raises(Fenced):
        await log.append(C, [b"b"], expected_head=1, checkpoint="leader1", fence=1)
    assert await log.head(C) == 1
    assert await log.append(C, [b"c"], expected_head=1, checkpoint="leader3", fence=3) == 2


async def test_an_empty_append_only_moves_the_checkpoint(log: NotificationLog) -> None:
    await log.append(C, [b"a"], expected_head=0, checkpoint="cp1")
    assert await log.append(C, [], expected_head=1, checkpoint="cp-etag") == 1
    assert await log.checkpoint(C) == "cp-etag"


async def test_count_retention_trims_entries_but_never_rewinds_the_head(
    log: NotificationLog,
) -> None:
    await log.append(C, [b"%d" % i for i in range(10)], expected_head=0, checkpoint="c", max_len=4)
    assert await log.head(C) == 10
    assert await log.earliest(C) == 7
    assert [r.seq for r in await log.read(C, 0)] == [7, 8, 9, 10]
    assert await log.trim(C, Retention(max_len=1, max_age_s=None), int(time.time() * 1000)) == 10
    assert await log.trim(C, Retention(max_len=0, max_age_s=None), int(time.time() * 1000)) == 11
    assert await log.read(C, 0) == []
    assert await log.append(C, [b"next"], expected_head=10, checkpoint="c") == 11


async def test_age_retention_drops_entries_older_than_the_cutoff(log: NotificationLog) -> None:
    await log.append(C, [b"old1", b"old2"], expected_head=0, checkpoint="c")
    logged = (await log.read(C, 0))[-1].logged_ms
    # Everything logged so far is older than a cutoff just after it.
    earliest = await log.trim(C, Retention(max_len=None, max_age_s=0.0), logged + 1)
    assert earliest == 3
    await log.append(C, [b"new"], expected_head=2, checkpoint="c")
    new_ms = (await log.read(C, 0))[0].logged_ms
    assert await log.trim(C, Retention(max_len=None, max_age_s=3600.0), new_ms) == 3
    assert [r.data for r in await log.read(C, 0)] == [b"new"]


async def test_an_age_trim_never_takes_an_entry_appended_while_it_runs(
    log_factory: Callable[[], NotificationLog],
) -> None:
    """A quiet collection's entries are all past the cutoff; a change comes during the trim.

    The Redis trim read the head after its scan and trimmed up to it: an
    append landing between the two was removed before any transport pushed
    it.  Each round races one trim with one append (two clients, one loop).
    """
    trimmer, writer = log_factory(), log_factory()
    lost: list[str] = []
    for round_ in range(40):
        c = f"age-{round_}"
        await writer.append(c, [b"old1", b"old2"], expected_head=0, checkpoint="c", logged_ms=1)
        now_ms = int(time.time() * 1000)
        appended = asyncio.create_task(
            writer.append(c, [b"fresh"], expected_head=2, checkpoint="c", logged_ms=now_ms)
        )
        await trimmer.trim(c, Retention(max_len=None, max_age_s=60.0), now_ms)
        assert await appended == 3
        # Read through the trimmer: the writer's tail cache would answer from memory.
        if [r.data for r in await trimmer.read(c, 0)] != [b"fresh"]:
            lost.append(c)
    assert lost == [], f"the trim took the fresh entry of {len(lost)} of 40 collections"


async def test_cursors_only_move_forward(log: NotificationLog) -> None:
    assert await log.cursor(C, "mqtt") == 0
    await log.set_cursor(C, "mqtt", 5)
    await log.set_cursor(C, "mqtt", 3)
    assert await log.cursor(C, "mqtt") == 5
    await log.set_cursor(C, "mqtt", 9)
    assert await log.cursor(C, "mqtt") == 9
    assert await log.cursor(C, "ws") == 0


async def test_wait_returns_as_soon_as_an_append_lands(log: NotificationLog) -> None:
    await log.append(C, [b"a"], expected_head=0, checkpoint="c")
    assert await log.wait(C, after=1, timeout=0.05) == []
    waiter = asyncio.create_task(log.wait(C, after=1, timeout=30))
    await asyncio.sleep(0)  # let the waiter start blocking before the append
    await log.append(C, [b"b"], expected_head=1, checkpoint="c")
    records = await asyncio.wait_for(waiter, 10)
    assert [(r.seq, r.data) for r in records] == [(2, b"b")]


async def test_state_survives_reopening(log_factory: Callable[[], NotificationLog]) -> None:
    first = log_factory()
    await first.register(C, "http://example.com/c1/capabilitylist.xml")
    await first.append(C, [b"a", b"b"], expected_head=0, checkpoint="cp")
    await first.set_cursor(C, "mqtt", 2)
    await first.close()
    second = log_factory()
    assert await second.head(C) == 2
    assert await second.checkpoint(C) == "cp"
    assert await second.cursor(C, "mqtt") == 2
    assert await second.collections() == {C: "http://example.com/c1/capabilitylist.xml"}


async def test_redis_restart_with_aof_keeps_the_log(redis_server: Redis) -> None:
    log = RedisLog(redis_server.url)
    try:
        await log.append(C, [b"a", b"b"], expected_head=0, checkpoint="cp")
        await asyncio.to_thread(redis_server.restart)
        # appendfsync everysec: the restart is a clean shutdown, which flushes the AOF.
        assert await log.head(C) == 2
        assert [r.data for r in await log.read(C, 0)] == [b"a", b"b"]
    finally:
        await log.close()


async def test_an_unreachable_redis_raises_log_unavailable(redis_server: Redis) -> None:
    log = RedisLog(redis_server.url, socket_timeout=1.0)
    try:
        await asyncio.to_thread(redis_server.stop)
        with pytest.raises(LogUnavailable):
            await log.append(C, [b"a"], expected_head=0, checkpoint="cp")
        with pytest.raises(LogUnavailable):
            await log.head(C)
    finally:
        await log.close()


async def test_a_deposed_leader_cannot_sweep_or_store_snapshot_maps(redis_server: Redis) -> None:
    """RedisBlobs' writes are fenced like appends (rsnotify.log.redis_blobs).

    A leader that stalled past its lease wakes up knowing only its own
    snapshots: unfenced, its ``keep`` would delete the maps its successor's
    checkpoint names, and that successor would lose the changes made
    between its snapshots (it could only record the list again).
    """
    from rsnotify import redisurl
    from rsnotify.log.redis_blobs import RedisBlobs

    token: dict[str, int | None] = {"old": 1, "new": 2}
    client = redisurl.client(redis_server.url)
    log = RedisLog(redis_server.url)
    old = RedisBlobs(client, C, fence=lambda: token["old"])
    new = RedisBlobs(client, C, fence=lambda: token["new"])
    try:
        await old.put("s1", b"the deposed leader's map")
        await new.put("s2", b"the new leader's map")  # raises the fence to 2, as its append will
        await log.append(C, [b"a"], expected_head=0, checkpoint="names s2", fence=2)
        with pytest.raises(Fenced):
            await old.keep({"s1"})
        with pytest.raises(Fenced):
            await old.put("s3", b"another")
        assert await new.get("s2") == b"the new leader's map"
        assert await old.get("s3") is None
        token["old"] = None  # it has noticed: not leading, nothing to sweep or store
        await old.keep({"s1"})
        assert await new.get("s2") is not None
        with pytest.raises(Fenced):
            await old.put("s3", b"another")
        await new.keep({"s2"})  # the leader sweeps what no checkpoint names
        assert await new.get("s1") is None
        assert await new.get("s2") == b"the new leader's map"
        # Out of memory is waited out like the log's own appends, not a crash.
        await client.config_set("maxmemory", "1")
        try:
            with pytest.raises(LogUnavailable, match="out of memory"):
                await new.put("s4", b"x" * 10_000)
        finally:
            await client.config_set("maxmemory", "0")
    finally:
        await log.close()
        await client.aclose()


async def test_the_tail_cache_answers_from_memory_and_yields_to_other_writers(
    log_factory: Callable[[], NotificationLog],
) -> None:
    """Reads of what this process appended come from memory and equal the backend's;
    an append by another process in between restarts the ring (it stays dense)."""
    ours, theirs = log_factory(), log_factory()
    cache = ours if isinstance(ours, TailCache) else TailCache(ours, capacity=3)
    backend = cache.inner
    head = await cache.append(C, [b"a", b"b"], expected_head=0, checkpoint="1")
    hits = cache.hits
    assert await cache.read(C, 0) == await backend.read(C, 0)
    assert await cache.wait(C, 1, timeout=1) == await backend.read(C, 1)
    assert cache.hits == hits + 2
    other = theirs.inner if isinstance(theirs, TailCache) else theirs
    head = await other.append(C, [b"c", b"d"], expected_head=head, checkpoint="2")
    head = await cache.append(C, [b"e"], expected_head=head, checkpoint="3")
    everything = await backend.read(C, 0)
    assert [r.data for r in everything] == [b"a", b"b", b"c", b"d", b"e"]
    for after in range(head + 1):
        assert await cache.read(C, after) == everything[after:], after
    # Beyond what it holds, a wait is the backend's: it sees another writer's append.
    waiter = asyncio.ensure_future(cache.wait(C, head, timeout=10))
    await other.append(C, [b"f"], expected_head=head, checkpoint="4")
    assert [r.data for r in await waiter] == [b"f"]


async def test_the_tail_cache_keeps_within_its_byte_budget_and_stays_correct(
    tmp_path: Path,
) -> None:
    """Over its byte budget the cache sheds the oldest records of its biggest ring;
    every read still equals the backend's, whatever the cache holds."""
    backend = SQLiteLog(tmp_path / "log.sqlite3")
    cache = TailCache(backend, capacity=50, max_bytes=1_000)
    other = "example.org-c2-capabilitylist-00000000"
    try:
        heads = {C: 0, other: 0}
        for round_ in range(30):
            for collection, size in ((C, 40), (other, 7)):
                batch = [bytes([65 + round_ % 26]) * size for _ in range(round_ % 4 + 1)]
                heads[collection] = await cache.append(
                    collection, batch, expected_head=heads[collection], checkpoint=str(round_)
                )
                assert cache.bytes <= cache.max_bytes
                held = sum(len(r.data) for ring in cache._rings.values() for r in ring)
                assert held == cache.bytes
        # A batch bigger than the ring keeps the batch's end.
        heads[C] = await cache.append(
            C, [b"x%d" % i for i in range(120)], expected_head=heads[C], checkpoint="big"
        )
        assert len(cache._rings[C]) <= 50 and cache._rings[C][-1].seq == heads[C]
        for collection in (C, other):
            everything = await backend.read(collection, 0, limit=10_000)
            for after in range(0, heads[collection] + 1, 7):
                assert await cache.read(collection, after, limit=10_000) == everything[after:]
        assert cache.hits > 0
    finally:
        await cache.close()


async def test_an_unreachable_redis_is_named_without_its_password() -> None:
    """The messages go to logs and /healthz: a URL's password never does."""
    from rsnotify.errors import CursorStoreUnavailable
    from rsnotify.subscriber.redis_cursor import RedisCursorStore
    from tests.devstack import free_port

    url = f"redis://rs:s3cret-pw@127.0.0.1:{free_port()}/0"  # nothing listens there
    log = RedisLog(url, socket_timeout=0.5)
    try:
        with pytest.raises(LogUnavailable) as raised:
            await log.head("c")
        assert "s3cret-pw" not in str(raised.value)
        assert "rs:<redacted>@127.0.0.1" in str(raised.value)
    finally:
        await log.close()
    cursors = RedisCursorStore(url, "dest", socket_timeout=0.5, patience=0.5)
    try:
        with pytest.raises(CursorStoreUnavailable) as refused:
            await cursors.get("c")
        assert "s3cret-pw" not in str(refused.value) and "<redacted>" in str(refused.value)
    finally:
        await cursors.close()


async def test_an_age_trim_of_exactly_a_page_of_old_entries_takes_them(
    log: NotificationLog,
) -> None:
    """500 entries, all past the cutoff: the Redis trim reads them by pages of 500, and
    an empty last page left them all (seen on the second page: nothing to trim with)."""
    await log.append(C, [b"old"] * 500, expected_head=0, checkpoint="c", logged_ms=1)
    now_ms = int(time.time() * 1000)
    assert await log.trim(C, Retention(max_len=None, max_age_s=60.0), now_ms) == 501
    assert await log.read(C, 0) == []
