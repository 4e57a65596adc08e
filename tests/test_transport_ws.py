"""The WebSocket gateway over real connections and real logs, and its pure protocol.

Why one module of ~760 lines: the gateway tests share the ``gateways`` fixture, the frame
helpers (``recv``, ``recv_until``, ``append``) and, all but one (two gateways on one
Redis), the ``log`` fixture; the pure :mod:`~rsnotify.transport.wsproto` tests at the end
share none of that and could stand alone, but sit beside the gateway that speaks the
protocol they pin down.

Clients here are plain ``websockets`` connections that parse frames with
``json`` themselves, so the gateway is checked against the protocol as
written in :mod:`rsnotify.transport.wsproto`, not against its own helpers
(those get tests of their own at the end).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from rsnotify import envelope, outbound
from rsnotify.collection import collection_id
from rsnotify.envelope import InvalidNotification
from rsnotify.log import NotificationLog, Retention
from rsnotify.log.redis_log import RedisLog
from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.model import ChangeType
from rsnotify.outbound import Signer
from rsnotify.transport import wsproto
from rsnotify.transport.ws import WebSocketGateway
from rsnotify.transport.wsproto import InvalidSubscription, SendCursor
from tests.devstack import Redis, async_wait_for

CAP1 = "http://example.com/c1/capabilitylist.xml"
CAP2 = "http://example.org/c2/capabilitylist.xml"
C1 = collection_id(CAP1)
C2 = collection_id(CAP2)
CAPS = {C1: CAP1, C2: CAP2}
T0 = datetime(2024, 1, 1, tzinfo=UTC)

Frame = dict[str, Any]
MakeGateway = Callable[..., Awaitable[WebSocketGateway]]


# --- helpers -------------------------------------------------------------------


def make_record(
    collection: str, seq: int, *, loc: str | None = None, change: str = "created", pad: int = 0
) -> bytes:
    """A logged envelope as the publisher writes it (canonical JSON, no "published")."""
    notification = envelope.Notification(
        collection=collection,
        seq=seq,
        capabilitylist=CAPS[collection],
        changelist=CAPS[collection].replace("capabilitylist", "changelist"),
        loc=loc or f"http://example.com/res/{seq}" + ("/" + "x" * pad if pad else ""),
        change=ChangeType(change),
        datetime=T0 + timedelta(seconds=seq),
        hash=f"md5:{seq:032x}",
        length=seq,
        detected=T0 + timedelta(seconds=seq, milliseconds=5),
    )
    return envelope.to_json(notification)


async def append(
    log: NotificationLog,
    collection: str,
    count: int,
    *,
    batch: int = 500,
    make: Callable[[int], bytes] | None = None,
) -> int:
    """Append ``count`` records the way a publisher does; returns the new head."""
    head = await log.head(collection)
    build = make or (lambda seq: make_record(collection, seq))
    while count > 0:
        size = min(batch, count)
        payloads = [build(head + i) for i in range(1, size + 1)]
        head = await log.append(collection, payloads, expected_head=head, checkpoint=f"cp{head}")
        count -= size
    return head


async def append_until(log: NotificationLog, collection: str, stop: asyncio.Event) -> int:
    """Append a few records at a time, as fast as the log takes them, until ``stop``."""
    head = await log.head(collection)
    while not stop.is_set():
        head = await append(log, collection, 1 + head % 3)
    return head


def url(gateway: WebSocketGateway, path: str = "/") -> str:
    return f"ws://127.0.0.1:{gateway.port}{path}"


async def recv(ws: ClientConnection, timeout: float = 10.0) -> Frame:
    async with asyncio.timeout(timeout):
        frame: Frame = json.loads(await ws.recv())
    assert isinstance(frame.get("type"), str), frame
    return frame


async def recv_until(
    ws: ClientConnection, done: Callable[[list[Frame]], bool], timeout: float = 20.0
) -> list[Frame]:
    """Frames until ``done(frames)``; fails at the deadline showing the last frames."""
    frames: list[Frame] = []
    try:
        async with asyncio.timeout(timeout):
            while not done(frames):
                frames.append(json.loads(await ws.recv()))
    except TimeoutError:
        raise AssertionError(f"gave up after {len(frames)} frames; last: {frames[-3:]}") from None
    return frames


def notifications(frames: list[Frame], collection: str | None = None) -> list[Frame]:
    return [
        f
        for f in frames
        if f["type"] == "notification" and (collection is None or f["collection"] == collection)
    ]


def reached(collection: str, seq: int) -> Callable[[list[Frame]], bool]:
    return lambda frames: any(
        f["type"] == "notification" and f["collection"] == collection and f["seq"] >= seq
        for f in frames[-1:]
    )


def assert_dense(frames: list[Frame], start: int, end: int) -> None:
    """Every seq start+1..end exactly once, in order, each ``prev`` the one before."""
    seqs = [f["seq"] for f in frames]
    assert seqs == list(range(start + 1, end + 1)), (seqs[:5], seqs[-5:], start, end)
    assert [f["prev"] for f in frames] == [start, *seqs[:-1]]


def without_published(payload: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(payload)
    assert "published" in obj
    del obj["published"]
    return obj


async def close_code(ws: ClientConnection, timeout: float = 10.0) -> int | None:
    async with asyncio.timeout(timeout):
        await ws.wait_closed()
    return ws.close_code


# --- fixtures ------------------------------------------------------------------


@pytest.fixture
async def log(tmp_path: Path) -> AsyncIterator[NotificationLog]:
    sqlite = SQLiteLog(tmp_path / "log.sqlite3")
    for collection, uri in CAPS.items():
        await sqlite.register(collection, uri)
    yield sqlite
    await sqlite.close()


@pytest.fixture
async def gateways() -> AsyncIterator[MakeGateway]:
    started: list[WebSocketGateway] = []

    async def make(log: NotificationLog, **options: Any) -> WebSocketGateway:
        gateway = WebSocketGateway(log, **options)
        await gateway.start()
        started.append(gateway)
        return gateway

    yield make
    for gateway in started:
        await gateway.stop()


# --- delivery --------------------------------------------------------------------


async def test_every_seq_of_two_collections_arrives_once_in_order_with_its_payload(
    log: NotificationLog, gateways: MakeGateway
) -> None:
    gateway = await gateways(log, server_id="gw-1")
    await append(log, C1, 500)
    await append(log, C2, 500)
    async with (
        connect(url(gateway)) as multi,
        connect(url(gateway, f"/{C2}?since=0")) as single,
    ):
        await multi.send(json.dumps({"type": "subscribe", "collections": {C1: 0, C2: 0}}))
        # The other half races with the replay of the first.
        writer = asyncio.gather(append(log, C1, 500, batch=50), append(log, C2, 500, batch=50))
        multi_frames = await recv_until(
            multi,
            lambda fs: len(notifications(fs, C1)) >= 1000 and len(notifications(fs, C2)) >= 1000,
        )
        single_frames = await recv_until(single, reached(C2, 1000))
        await writer

    hellos = [f for f in multi_frames if f["type"] == "hello"]
    assert multi_frames[:2] == hellos
    assert {h["collection"]: h["server"] for h in hellos} == {C1: "gw-1", C2: "gw-1"}
    assert all(h["earliest"] == 1 and 500 <= h["head"] <= 1000 for h in hellos)
    assert single_frames[0]["type"] == "hello" and single_frames[0]["collection"] == C2
    for frames, collections in ((multi_frames, (C1, C2)), (single_frames, (C2,))):
        for collection in collections:
            received = notifications(frames, collection)
            assert_dense(received, 0, 1000)
            records = {r.seq: r.data for r in await log.read(collection, 0, limit=2000)}
            for frame in received:
                assert frame["format"] == "json" and "signature" not in frame
                assert without_published(frame["payload"]) == json.loads(records[frame["seq"]])
    kinds = {f["type"] for f in multi_frames + single_frames}
    assert kinds <= {"hello", "notification", "heartbeat"}, kinds


async def test_resume_from_since_races_appends_without_gap_or_duplicate(
    log: NotificationLog, gateways: MakeGateway
) -> None:
    gateway = await gateways(log)
    await append(log, C1, 200)
    raced = 0
    for round_ in range(6):
        stop = asyncio.Event()
        appender = asyncio.create_task(append_until(log, C1, stop))
        since = None if round_ % 3 == 2 else max(0, await log.head(C1) - 37 * round_)
        query = "" if since is None else f"?since={since}"
        before = await log.head(C1)
        async with connect(url(gateway, f"/{C1}{query}")) as ws:
            hello = await recv(ws)
            assert hello["type"] == "hello"
            raced += hello["head"] > before  # appends landed during the handshake
            start = hello["head"] if since is None else since
            # Keep appending until a notification the replay could not have contained arrives.
            frames = await recv_until(ws, reached(C1, hello["head"] + 3))
            stop.set()
            final = await appender
            frames += await recv_until(ws, reached(C1, final))
        assert_dense(notifications(frames), start, final)
    assert raced >= 3, "the appends did not race with the connects"


async def test_a_since_older_than_retention_gets_gap_too_old_then_live(
    log: NotificationLog, gateways: MakeGateway
) -> None:
    await append(log, C1, 50)
    assert await log.trim(C1, Retention(max_len=10, max_age_s=None), 0) == 41
    gateway = await gateways(log)
    async with connect(url(gateway, f"/{C1}?since=5")) as ws:
        hello = await recv(ws)
        assert (hello["type"], hello["head"], hello["earliest"]) == ("hello", 50, 41)
        gap = await recv(ws)
        assert gap == {
            "type": "gap_too_old",
            "collection": C1,
            "since": 5,
            "earliest": 41,
            "capabilitylist": CAP1,
        }
        await append(log, C1, 2)
        live = await recv_until(ws, reached(C1, 52))
        assert_dense(notifications(live), 50, 52)
    # since + 1 == earliest is still fully replayable: no gap_too_old.
    async with connect(url(gateway, f"/{C1}?since=40")) as ws:
        frames = await recv_until(ws, reached(C1, 52))
        assert [f["type"] for f in frames[:2]] == ["hello", "notification"]
        assert_dense(notifications(frames), 40, 52)


async def test_a_client_that_stops_reading_is_skipped_and_costs_bounded_memory(
    log: NotificationLog, gateways: MakeGateway
) -> None:
    """20,000 notifications of ~3.3 KB pile up behind a client that reads nothing.

    A per-client queue without a bound would hold ~66 MB for it; the process
    (gateway, log and client together) may grow by at most 20 MB of RSS.  The
    gateway's share is the ring of 200 rendered records (~0.7 MB), a 16 KiB
    write buffer and its renderer's memory of recent records (a fixed bound
    whatever the clients do, here 1 MiB; 16 MiB by default, shared by the
    publisher's transports); the rest is allocator slack from the appends.
    """
    queue_size, write_limit, total, warm = 200, 16 * 1024, 20_000, 500
    gateway = await gateways(
        log,
        queue_size=queue_size,
        write_limit=write_limit,
        heartbeat=0.1,
        renderer=outbound.Renderer("json", None, max_bytes=1024 * 1024),
    )
    big = lambda seq: make_record(C1, seq, pad=3000)  # noqa: E731
    process = psutil.Process()
    # No client keepalive: its pongs could not get through while it reads nothing.
    async with connect(url(gateway, f"/{C1}"), max_queue=2, ping_interval=None) as ws:
        assert (await recv(ws))["head"] == 0
        await append(log, C1, warm, make=big)  # also warms up allocator pools and the ring
        frames = await recv_until(ws, reached(C1, warm))

        baseline = process.memory_info().rss
        await append(log, C1, total, batch=250, make=big)
        await async_wait_for(
            lambda: gateway.position(C1) == warm + total, timeout=30, message="tailer lagged"
        )
        growth = process.memory_info().rss - baseline
        buffered = gateway.buffered_bytes()
        print(f"slow client: RSS growth {growth / 1e6:.1f} MB, write buffer {buffered} B")
        assert growth < 20_000_000, growth
        # websockets' own buffer: the high-water mark plus at most one frame (+ a ping).
        assert 0 < buffered <= write_limit + 8192, buffered

        head = warm + total
        frames += await recv_until(
            ws, lambda fs: bool(fs) and fs[-1]["type"] == "heartbeat" and fs[-1]["head"] == head
        )
        await append(log, C1, 1, make=big)
        frames += await recv_until(ws, reached(C1, head + 1))

    last, skips = 0, []
    for frame in frames:  # the client-side continuity rule of the protocol
        if frame["type"] == "notification":
            assert frame["prev"] == last, frame["seq"]
            last = frame["seq"]
        elif frame["type"] == "skipped":
            assert frame["from"] == last + 1, frame
            last = frame["resume"] - 1
            skips.append(frame)
    assert last == head + 1
    assert skips and skips[-1]["resume"] <= head + 1
    assert len(notifications(frames)) < total // 2  # most were dropped, not buffered


@pytest.mark.parametrize("paced", [True, False], ids=["paced", "unpaced-control"])
async def test_a_burst_larger_than_the_ring_reaches_a_live_client_from_memory(
    log: NotificationLog, gateways: MakeGateway, paced: bool
) -> None:
    """The tailer is paced to its fastest client: no skip, and nothing re-read from the log.

    5,000 records of ~4 KB (more than loopback socket buffers absorb) are
    appended as fast as the log takes them, with a ring of 100, while the
    client, after 100 frames, is busy elsewhere: for 1.5 s when paced, where
    the tailer waits for the client (the grace of 5 s exceeds the pause).
    Unpaced (``pace_grace=0``, the control case) the client stays busy until
    the tailer has read all 5,000 (not for a fixed time: with the machine
    loaded the log once filled too slowly for 1.5 s to overflow the ring),
    which pushes it out of the ring.
    """
    gateway = await gateways(log, queue_size=100, pace_grace=5.0 if paced else 0.0)
    async with connect(url(gateway, f"/{C1}"), max_queue=4) as ws:
        assert (await recv(ws))["head"] == 0
        writer = asyncio.create_task(
            append(log, C1, 5_000, batch=500, make=lambda seq: make_record(C1, seq, pad=4000))
        )
        frames: list[Frame] = []
        try:
            async with asyncio.timeout(60):
                while not reached(C1, 5_000)(frames) and not (
                    frames and frames[-1]["type"] == "skipped" and frames[-1]["resume"] > 5_000
                ):
                    frames.append(json.loads(await ws.recv()))
                    if len(frames) == 100 and paced:
                        await asyncio.sleep(1.5)  # the scenario: the client is busy elsewhere
                    elif len(frames) == 100:
                        await async_wait_for(
                            lambda: (gateway.position(C1) or 0) >= 5_000,
                            timeout=40,
                            message="the unpaced tailer never read the whole burst",
                        )
        except TimeoutError:
            seqs = [f["seq"] for f in notifications(frames)]
            kinds = sorted({f["type"] for f in frames})
            pytest.fail(
                f"{len(frames)} frames ({kinds}) in 60 s, seqs {seqs[:3]}..{seqs[-3:]}, last "
                f"{frames[-1:]}, position {gateway.position(C1)}, replayed {gateway.replayed}"
            )
        await writer
    skipped = [f for f in frames if f["type"] == "skipped"]
    if not paced:
        assert skipped or gateway.replayed, "the control run was never pushed out of the ring"
        return
    assert not skipped
    assert_dense(notifications(frames), 0, 5_000)
    assert gateway.replayed == 0


async def test_each_live_record_is_reported_published_once(
    log: NotificationLog, gateways: MakeGateway
) -> None:
    """``on_published`` (the publisher's ws metrics) counts records, not client frames."""
    seen: list[tuple[str, int, float]] = []
    gateway = await gateways(
        log, on_published=lambda c, seq, size, latency: seen.append((c, seq, latency))
    )
    async with connect(url(gateway, f"/{C1}")) as one, connect(url(gateway, f"/{C1}")) as two:
        for ws in (one, two):
            assert (await recv(ws))["type"] == "hello"
        await append(log, C1, 30)
        for ws in (one, two):
            assert_dense(notifications(await recv_until(ws, reached(C1, 30))), 0, 30)
    assert [(c, seq) for c, seq, _ in seen] == [(C1, seq) for seq in range(1, 31)]
    assert all(0 <= latency < 10 for _, _, latency in seen)


async def test_unfiltered_clients_share_frames_beside_filtered_and_replaying_clients(
    log: NotificationLog, gateways: MakeGateway
) -> None:
    """Live unfiltered clients get each frame written once for all; the others are unchanged.

    A filtered client (its own ``prev``) and a replaying one (``since=0``)
    are served by their writer tasks while appends race with them; every
    client sees its stream dense and in order, and the unfiltered ones get
    the same bytes.
    """

    def alternating(seq: int) -> bytes:
        return make_record(C1, seq, change="updated" if seq % 3 == 0 else "created")

    gateway = await gateways(log)
    await append(log, C1, 40, make=alternating)
    async with contextlib.AsyncExitStack() as stack:
        live = [await stack.enter_async_context(connect(url(gateway, f"/{C1}"))) for _ in range(20)]
        replaying = await stack.enter_async_context(connect(url(gateway, f"/{C1}?since=0")))
        filtered = await stack.enter_async_context(
            connect(url(gateway, f"/{C1}?since=40&change=updated"))
        )
        for ws in [*live, replaying, filtered]:
            assert (await recv(ws))["head"] == 40
        writer = asyncio.create_task(append(log, C1, 200, batch=9, make=alternating))
        raw: list[list[str | bytes]] = []
        for ws in live:
            async with asyncio.timeout(20):
                raw.append([await ws.recv() for _ in range(200)])
            assert_dense([json.loads(frame) for frame in raw[-1]], 40, 240)
        assert all(frames == raw[0] for frames in raw)
        assert_dense(notifications(await recv_until(replaying, reached(C1, 240))), 0, 240)
        got = notifications(await recv_until(filtered, reached(C1, 240)))
        expected = list(range(42, 241, 3))
        assert [f["seq"] for f in got] == expected
        assert [f["prev"] for f in got] == [40, *expected[:-1]]
        await writer
    print(f"shared frames: {gateway.shared_frames}, replayed {gateway.replayed}")
    # Most live frames went out as shared bytes (a full buffer falls back to the writer).
    assert gateway.shared_frames >= len(live) * 200 // 2, gateway.shared_frames


async def test_a_token_is_required_in_the_header_or_the_query(
    log: NotificationLog, gateways: MakeGateway
) -> None:
    gateway = await gateways(log, token="s3cret-token")
    refused_with = [({}, ""), ({"Authorization": "Bearer wrong"}, ""), ({}, "?access_token=no")]
    for headers, query in refused_with:
        with pytest.raises(InvalidStatus) as refused:
            async with connect(url(gateway, f"/{C1}{query}"), additional_headers=headers):
                pass
        assert refused.value.response.status_code == 401
        assert refused.value.response.headers["WWW-Authenticate"].startswith("Bearer")
    for headers, query in (
        ({"Authorization": "Bearer s3cret-token"}, ""),
        ({}, "?access_token=s3cret-token"),
    ):
        async with connect(url(gateway, f"/{C1}{query}"), additional_headers=headers) as ws:
            assert (await recv(ws))["type"] == "hello"


async def test_filters_deliver_only_matches_and_prev_skips_the_rest(
    log: NotificationLog, gateways: MakeGateway
) -> None:
    changes = ["created", "updated", "deleted"]

    def mixed(seq: int) -> bytes:
        area = "a" if seq % 2 else "b"
        loc = f"http://example.com/{area}/{seq}"
        return make_record(C1, seq, loc=loc, change=changes[seq % 3])

    def wanted(seq: int) -> bool:
        return seq % 2 == 1 and changes[seq % 3] in ("created", "updated")

    gateway = await gateways(log, heartbeat=0.05)
    await append(log, C1, 60, make=mixed)
    prefix = "http://example.com/a/"
    query = f"?since=0&prefix={prefix}&change=created,updated"
    async with (
        connect(url(gateway, f"/{C1}{query}")) as by_url,
        connect(url(gateway)) as by_frame,
    ):
        await by_frame.send(
            wsproto.subscribe_frame({C1: 0}, prefix=prefix, change=["updated", "created"])
        )
        live = asyncio.create_task(append(log, C1, 60, batch=7, make=mixed))
        for ws in (by_url, by_frame):
            # A heartbeat at head 120 says every seq up to it was sent or filtered out.
            frames = await recv_until(
                ws, lambda fs: bool(fs) and fs[-1]["type"] == "heartbeat" and fs[-1]["head"] == 120
            )
            got = notifications(frames)
            expected = [seq for seq in range(1, 121) if wanted(seq)]
            assert [f["seq"] for f in got] == expected
            assert [f["prev"] for f in got] == [0, *expected[:-1]]
            assert all(json.loads(f["payload"])["loc"].startswith(prefix) for f in got)
        await live


async def test_two_gateways_on_one_redis_send_the_same_sequence(
    redis_server: Redis, gateways: MakeGateway
) -> None:
    publisher, log_a, log_b = (RedisLog(redis_server.url) for _ in range(3))
    try:
        await publisher.register(C1, CAP1)
        await append(publisher, C1, 100)
        gateway_a = await gateways(log_a, server_id="a")
        gateway_b = await gateways(log_b, server_id="b")
        async with (
            connect(url(gateway_a, f"/{C1}?since=0")) as on_a,
            connect(url(gateway_b, f"/{C1}?since=40")) as on_b,
        ):
            hello_a, hello_b = await recv(on_a), await recv(on_b)
            assert (hello_a["server"], hello_b["server"]) == ("a", "b")
            await append(publisher, C1, 300, batch=25)
            frames_a = notifications(await recv_until(on_a, reached(C1, 400)))
            frames_b = notifications(await recv_until(on_b, reached(C1, 400)))
        assert_dense(frames_a, 0, 400)
        assert_dense(frames_b, 40, 400)
        by_seq = {f["seq"]: without_published(f["payload"]) for f in frames_a}
        assert all(without_published(f["payload"]) == by_seq[f["seq"]] for f in frames_b)
        assert [json.loads(r.data) for r in await publisher.read(C1, 40, 1000)] == [
            by_seq[seq] for seq in range(41, 401)
        ]
    finally:
        for log in (publisher, log_a, log_b):
            await log.close()


# --- refusals ----------------------------------------------------------------------


async def expect_refusal(ws: ClientConnection, code: str) -> Frame:
    frame = await recv(ws)
    assert (frame["type"], frame["code"]) == ("error", code), frame
    assert await close_code(ws) == 1008
    return frame


async def test_bad_requests_get_an_error_and_a_close_while_others_are_served(
    log: NotificationLog, gateways: MakeGateway
) -> None:
    gateway = await gateways(log)
    await append(log, C1, 3)
    async with connect(url(gateway, f"/{C1}?since=0")) as bystander:
        assert_dense(notifications(await recv_until(bystander, reached(C1, 3))), 0, 3)
        first_frames: list[str | bytes] = [
            "not json",
            b"\xff\xfe binary",
            json.dumps({"type": "subscribe", "collections": {}}),
            json.dumps({"type": "subscribe", "collections": {"../../etc/passwd": 0}}),
            json.dumps({"type": "subscribe", "collections": {C1: -1}}),
            json.dumps({"type": "hello"}),
            json.dumps([1, 2, 3]),
        ]
        for first in first_frames:
            async with connect(url(gateway)) as ws:
                await ws.send(first)
                hostile = "passwd" in str(first)
                await expect_refusal(ws, "invalid_collection" if hostile else "bad_request")
        paths = {
            "/unknown-collection-00000000": "unknown_collection",
            "/..%2F..%2Fetc%2Fpasswd": "invalid_collection",
            "/../etc/passwd": "invalid_collection",
            "/" + "a" * 4000: "invalid_collection",
            f"/{C1}/extra": "invalid_collection",
            f"/{C1}?since=abc": "bad_request",
            f"/{C1}?since=1&since=2": "bad_request",
            f"/{C1}?change=created,renamed": "bad_request",
            f"/{C1}?since=999": "since_ahead",
        }
        for path, code in paths.items():
            async with connect(url(gateway, path)) as ws:
                frame = await expect_refusal(ws, code)
                assert len(frame["message"]) < 300
        # The bystander still gets live notifications, and new clients are served.
        await append(log, C1, 2)
        assert_dense(notifications(await recv_until(bystander, reached(C1, 5))), 3, 5)
    async with connect(url(gateway, f"/{C1}?since=4")) as ws:
        assert_dense(notifications(await recv_until(ws, reached(C1, 5))), 4, 5)
    await async_wait_for(lambda: gateway.clients == 0, message="handlers did not finish")


async def test_collections_registered_after_start_are_served_without_restart(
    log: NotificationLog, gateways: MakeGateway
) -> None:
    gateway = await gateways(log)
    late_uri = "http://example.net/late/capabilitylist.xml"
    late = collection_id(late_uri)
    assert late not in gateway.collections
    await log.register(late, late_uri)
    await log.append(late, [b"{}"], expected_head=0, checkpoint="cp")  # unrenderable on purpose
    async with connect(url(gateway, f"/{late}?since=0")) as ws:
        hello = await recv(ws)
        assert (hello["collection"], hello["head"]) == (late, 1)
        # A record the gateway cannot render is reported, never silently dropped.
        assert await recv(ws) == {"type": "skipped", "collection": late, "from": 1, "resume": 2}
    assert gateway.collections[late] == late_uri


async def test_stop_closes_clients_with_going_away_and_max_clients_is_enforced(
    log: NotificationLog, gateways: MakeGateway
) -> None:
    changes: list[int] = []
    gateway = await gateways(log, max_clients=1, on_client_change=changes.append)
    async with connect(url(gateway, f"/{C1}")) as ws:
        await recv(ws)
        with pytest.raises(InvalidStatus) as refused:
            async with connect(url(gateway, f"/{C2}")):
                pass
        assert refused.value.response.status_code == 503
        assert gateway.clients == 1
        await gateway.stop()
        assert await close_code(ws) == 1001
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    assert changes == [1, 0]


async def test_signed_xml_notifications_verify_and_parse_into_typed_frames(
    log: NotificationLog, gateways: MakeGateway
) -> None:
    secret = b"shared secret"
    gateway = await gateways(log, fmt="xml", signer=Signer("k1", secret), heartbeat=0.05)
    await append(log, C1, 3)
    async with connect(url(gateway, f"/{C1}?since=1"), max_size=wsproto.MAX_FRAME_BYTES) as ws:
        raw = await recv_until(ws, lambda fs: len(fs) > 3 and fs[-1]["type"] == "heartbeat")
    frames = [wsproto.parse_frame(json.dumps(f)) for f in raw]
    hello = frames[0]
    assert isinstance(hello, wsproto.Hello)
    assert (hello.collection, hello.head, hello.earliest) == (C1, 3, 1)
    assert hello.server == gateway.server_id
    sent = [f for f in frames if isinstance(f, wsproto.Notification)]
    assert [(f.seq, f.prev, f.format) for f in sent] == [(2, 1, "xml"), (3, 2, "xml")]
    for frame in sent:
        envelope.verify(frame.payload, frame.signature, {"k1": secret})
        decoded = envelope.decode(frame.payload)
        assert (decoded.collection, decoded.seq) == (C1, frame.seq)
        assert decoded.loc == f"http://example.com/res/{frame.seq}"
        assert decoded.published is not None
    beat = frames[-1]
    assert isinstance(beat, wsproto.Heartbeat) and beat.head == 3


# --- the pure protocol ----------------------------------------------------------------


def test_parse_frame_returns_typed_frames() -> None:
    now = "2024-01-01T00:00:00Z"
    cases = {
        wsproto.hello(C1, 5, 2, server="s", now=T0): wsproto.Hello(C1, 5, 2, T0, "s"),
        wsproto.gap_too_old(C1, 1, 4, CAP1): wsproto.GapTooOld(C1, 1, 4, CAP1),
        wsproto.skipped(C1, 3, 9): wsproto.Skipped(C1, 3, 9),
        wsproto.heartbeat(C1, 7, now=T0): wsproto.Heartbeat(C1, 7, T0),
        wsproto.error("bad_request", "no", collection=C1): wsproto.Error("bad_request", "no", C1),
        json.dumps({"type": "future-thing", "x": 1}): wsproto.Unknown("future-thing"),
    }
    for text, expected in cases.items():
        assert wsproto.parse_frame(text) == expected
        assert wsproto.parse_frame(text.encode()) == expected
    payload = '{"loc":"http://example.com/é","v":1}'.encode()
    tail = wsproto.notification_tail("json", payload, "k1:sha256=ab")
    frame = wsproto.parse_frame(wsproto.notification_frame(C1, 8, 6, tail))
    assert frame == wsproto.Notification(C1, 8, 6, "json", payload, "k1:sha256=ab")
    assert json.loads(wsproto.heartbeat(C1, 7, now=T0))["heartbeat"] == now


HELLO = {"type": "hello", "collection": C1, "head": 1, "earliest": 1, "heartbeat": "2024"}
NOTE = {"type": "notification", "collection": C1, "seq": 2, "prev": 1, "format": "json"}


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "not json",
        b"\xff\xfe",
        "[1, 2]",
        '{"no": "type"}',
        '{"type": 7}',
        json.dumps({**HELLO, "server": "s", "earliest": 9}),
        json.dumps({**HELLO, "server": "s", "collection": "../x"}),
        json.dumps(HELLO),
        json.dumps({**NOTE, "payload": "x", "prev": 2}),
        json.dumps({**NOTE, "payload": "x", "seq": 0, "prev": 0}),
        json.dumps({**NOTE, "payload": "x", "format": "yaml"}),
        json.dumps({**NOTE, "payload": "\ud800"}),
        json.dumps({**NOTE, "payload": "x", "seq": True}),
        json.dumps({**NOTE, "payload": ""}),
        json.dumps({"type": "skipped", "collection": C1, "from": 5, "resume": 5}),
        json.dumps({"type": "gap_too_old", "collection": C1, "since": 3, "earliest": 4}),
        json.dumps({"type": "heartbeat", "collection": C1, "head": 1, "heartbeat": "yesterday"}),
        json.dumps({"type": "error", "message": "no code"}),
        "[" * 100_000,
        '{"type": "x", "pad": "' + "y" * wsproto.MAX_FRAME_BYTES + '"}',
    ],
)
def test_parse_frame_refuses_garbage(garbage: str | bytes) -> None:
    with pytest.raises(InvalidNotification):
        wsproto.parse_frame(garbage)


def test_subscribe_frames_and_urls_round_trip_through_the_gateway_parsers() -> None:
    text = wsproto.subscribe_frame({C1: 4, C2: None}, prefix="http://x/", change=["deleted"])
    subscription = wsproto.parse_subscribe(text)
    assert subscription.collections == {C1: 4, C2: None}
    assert subscription.filter == wsproto.Filter("http://x/", frozenset({"deleted"}))
    link = wsproto.subscription_url(
        f"ws://gw:8080/{C1}", since=7, prefix="http://x/a b?", change=["updated", "created"],
        access_token="t&k",
    )  # fmt: skip
    target = link.removeprefix("ws://gw:8080")
    parsed = wsproto.parse_target(target)
    assert parsed is not None and parsed.collections == {C1: 7}
    assert parsed.filter == wsproto.Filter("http://x/a b?", frozenset({"created", "updated"}))
    assert wsproto.query_token(target) == "t&k"
    assert wsproto.parse_target("/?x=1") is None
    assert wsproto.bearer_token("Bearer  abc ") == "abc"
    assert wsproto.bearer_token("Basic abc") is None
    for bad in ({}, {"../x": 1}, {C1: -1}, {C1: True}):
        with pytest.raises(InvalidSubscription):
            wsproto.subscribe_frame(bad)
    with pytest.raises(InvalidSubscription):
        wsproto.subscribe_frame({C1: 0}, change=["renamed"])
    with pytest.raises(InvalidSubscription):
        wsproto.subscription_url("http://gw/x-1", since=1)


def test_send_cursor_replays_then_goes_live_then_skips_when_left_behind() -> None:
    cursor = SendCursor(C1, wsproto.Filter(prefix="http://a/"), position=10, prev=10)
    assert cursor.plan(window_start=50, head=60) == wsproto.REPLAY  # behind the ring: log
    assert cursor.accept(11, "http://b/1", "created") is None  # filtered: prev stays
    assert cursor.accept(12, "http://a/2", "created") == 10
    with pytest.raises(ValueError):
        cursor.accept(14, "http://a/4", "created")
    cursor.position = 49
    assert cursor.plan(window_start=50, head=60) == wsproto.FROM_RING
    assert cursor.live
    cursor.position = 60
    assert cursor.plan(window_start=50, head=60) == wsproto.IDLE
    assert cursor.plan(window_start=100, head=1100) == wsproto.SKIP  # live and left behind
    assert cursor.skip_to(1101) == (61, 1101)
    assert (cursor.position, cursor.prev) == (1100, 1100)
    assert cursor.accept(1101, "http://a/x", "updated") == 1100
