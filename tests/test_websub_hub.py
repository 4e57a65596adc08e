"""The hub's WebSub behaviours one by one: a real hub on a real SQLite log, real HTTP callbacks.

Why one module of ~530 lines: it tests one component, the WebSub hub, through one ``hub``
fixture (its ring and limits sized for these tests), the ``Callback`` server and the
``request``/``subscribe`` helpers; the issue 22.2 guards follow, two of them on that same
hub and the others on a hub, store or parser of their own, beside the behaviours they guard.

Bad requests (400), refusal of an unknown topic, a callback that does not
echo the challenge, unsubscription, ``410 Gone``, and ``gap_too_old`` when a
callback comes back after the log trimmed what it missed -- with the
delivery going on, in order, from the log's earliest seq.  Then what a
Source may hand the hub (Change Notification 4.1), and the guards of issue
22.2: callback addresses, limits counted with pending verifications, no GET
for an unknown topic, a bounded Redis pool, quoted log lines, bounded pages.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiohttp import web
from lxml import etree

from rsnotify import envelope
from rsnotify.envelope import Notification, to_json
from rsnotify.log import Retention
from rsnotify.log.sqlite_log import SQLiteLog
from rsnotify.model import ChangeType
from rsnotify.transport import websubproto as proto
from rsnotify.transport.websub import WebSubHub
from rsnotify.transport.websubguard import CallbackPolicy, FilteringResolver
from rsnotify.transport.websubstore import MemoryStore, RedisStore, Subscription
from tests.devstack import Redis, async_wait_for, free_port

COLLECTION = "source.test-capabilitylist"
CAPABILITY_LIST = "http://source.test/capabilitylist.xml"
CHANGELIST = "http://source.test/changelist.xml"
RSN = f"{{{envelope.RSNOTIFY_NS}}}"
RS = "http://www.openarchives.org/rs/terms/"
LOOPBACK = ["127.0.0.0/8"]  # the tests' callbacks live there: allowed explicitly


class Callback:
    """A callback whose answers the test controls."""

    def __init__(self) -> None:
        self.port = free_port()
        self.gets: list[dict[str, str]] = []
        self.posts: list[tuple[dict[str, str], bytes]] = []
        self.accepted: list[tuple[dict[str, str], bytes]] = []  # the posts answered 2xx
        self.echo = True
        self.status = 204
        self.runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/cb"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/cb", self._get)
        app.router.add_post("/cb", self._post)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _get(self, request: web.Request) -> web.Response:
        self.gets.append(dict(request.query))
        challenge = request.query.get("hub.challenge", "")
        return web.Response(text=challenge if self.echo else challenge + "!")

    async def _post(self, request: web.Request) -> web.Response:
        post = (dict(request.headers), await request.read())
        self.posts.append(post)
        if self.status < 300:
            self.accepted.append(post)
        return web.Response(status=self.status)

    def seqs(self, posts: list[tuple[dict[str, str], bytes]] | None = None) -> list[int]:
        """The rsnotify seqs of every change POSTed, in order (a POST may hold several)."""
        out = []
        for headers, body in self.posts if posts is None else posts:
            if proto.SEQ_HEADER in headers:
                root = etree.fromstring(body)
                out += [
                    int(md.get(RSN + "seq")) for md in root.iter(f"{{{RS}}}md") if md.get("change")
                ]
        return out


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[WebSubHub]:
    log = SQLiteLog(tmp_path / "log.sqlite3")
    await log.register(COLLECTION, CAPABILITY_LIST)
    # A ring of 5: what the hub still holds in memory it delivers even after the log
    # trimmed it; the gap test wants a callback further behind than that.
    hub = WebSubHub(
        log,
        MemoryStore(),
        changelists={COLLECTION: CHANGELIST},
        backoff_max=0.3,
        ring_size=5,
        allow_callbacks=LOOPBACK,
        max_per_client=3,
        max_per_host=3,
        max_subscriptions=5,
        lease=proto.LeasePolicy(minimum=1),
    )
    await hub.start()
    try:
        yield hub
    finally:
        await hub.stop()
        await log.close()


@pytest.fixture
async def callback() -> AsyncIterator[Callback]:
    cb = Callback()
    await cb.start()
    try:
        yield cb
    finally:
        await cb.stop()


async def append(hub: WebSubHub, count: int) -> int:
    head = await hub.log.head(COLLECTION)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    payloads = [
        to_json(
            Notification(
                collection=COLLECTION,
                seq=seq,
                capabilitylist=CAPABILITY_LIST,
                changelist=CHANGELIST,
                loc=f"http://source.test/r{seq}",
                change=ChangeType.UPDATED,
                datetime=start + timedelta(seconds=seq),
            )
        )
        for seq in range(head + 1, head + count + 1)
    ]
    return await hub.log.append(COLLECTION, payloads, expected_head=head, checkpoint="{}")


async def request(
    hub: WebSubHub,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    **fields: str,
) -> tuple[int, str]:
    form = urllib.parse.urlencode({k.replace("_", ".", 1): v for k, v in fields.items()})

    def send() -> tuple[int, str]:
        data = form.encode() if body is None else body
        req = urllib.request.Request(hub.url, data=data, method="POST", headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    return await asyncio.to_thread(send)


async def subscribe(hub: WebSubHub, cb: Callback, secret: str = "s") -> None:
    status, _ = await request(
        hub,
        hub_mode="subscribe",
        hub_topic=hub.topic(COLLECTION),
        hub_callback=cb.url,
        hub_secret=secret,
    )
    assert status == 202
    await async_wait_for(lambda: any(s.callback == cb.url for s in hub.subscriptions()), 10)


async def test_bad_requests_get_400_with_the_reason(hub: WebSubHub, callback: Callback) -> None:
    topic = hub.topic(COLLECTION)
    status, text = await request(hub, hub_mode="watch", hub_topic=topic)
    assert status == 400 and "hub.mode" in text
    status, text = await request(hub, hub_mode="subscribe", hub_topic=topic)
    assert status == 400 and "hub.callback" in text
    status, text = await request(
        hub, hub_mode="subscribe", hub_topic=topic, hub_callback=callback.url, hub_lease_seconds="x"
    )
    assert status == 400 and "lease" in text
    assert callback.gets == [] and hub.subscriptions() == []


async def test_unknown_topics_are_refused_without_a_get_and_unechoed_challenges_fail(
    hub: WebSubHub, callback: Callback
) -> None:
    """Issue 22.2: an unknown topic is refused at once (WebSub 5.1), the callback never called."""
    unknown = hub.url + "no.such-collection"
    status, text = await request(
        hub, hub_mode="subscribe", hub_topic=unknown, hub_callback=callback.url
    )
    assert status == 404 and "unknown topic" in text
    callback.echo = False
    topic = hub.topic(COLLECTION)
    await request(hub, hub_mode="subscribe", hub_topic=topic, hub_callback=callback.url)
    await async_wait_for(lambda: callback.gets, 10)
    assert [g["hub.mode"] for g in callback.gets] == ["subscribe"], "no GET for the unknown topic"
    await append(hub, 3)
    # The hub delivers nothing to a subscription that was never confirmed: a
    # confirmed one (below) gets seqs 4.. while this callback never gets 1..3.
    callback.echo = True
    await subscribe(hub, callback)
    await append(hub, 2)
    await async_wait_for(lambda: callback.seqs() == [4, 5], 10)


async def test_unsubscribe_and_410_end_a_subscription(hub: WebSubHub, callback: Callback) -> None:
    await subscribe(hub, callback)
    await append(hub, 2)
    await async_wait_for(lambda: callback.seqs() == [1, 2], 10)
    status, _ = await request(
        hub, hub_mode="unsubscribe", hub_topic=hub.topic(COLLECTION), hub_callback=callback.url
    )
    assert status == 202
    await async_wait_for(lambda: not hub.subscriptions(), 10)
    assert callback.gets[-1]["hub.mode"] == "unsubscribe"
    assert "hub.lease_seconds" not in callback.gets[-1]

    await subscribe(hub, callback)
    callback.status = 410
    await append(hub, 1)
    await async_wait_for(lambda: not hub.subscriptions(), 10)
    assert callback.seqs() == [1, 2, 3]  # seq 3 was answered 410, and that was the end
    await append(hub, 1)
    await asyncio.sleep(0.5)  # scenario time: a removed subscription gets nothing more
    assert callback.seqs() == [1, 2, 3]


async def test_two_subscribe_requests_verified_at_once_make_one_subscription(
    tmp_path: Path, redis_server: Redis
) -> None:
    """A client that sends its subscribe twice (a retry) gets one subscription, not two.

    The callback holds the first challenge until the second arrives, so both
    verifications would be under way together: each found no subscription
    and added one, and the first's delivery task went on unreachable (every
    change POSTed twice, and after an unsubscribe too).  Verifications of one
    (topic, callback) now take turns.
    """

    class Held(Callback):
        async def _get(self, request: web.Request) -> web.Response:
            self.gets.append(dict(request.query))
            if len(self.gets) == 1:
                # The second challenge comes while this one waits (two verifications
                # at once), or not before it is answered (they take turns).
                with contextlib.suppress(AssertionError):
                    await async_wait_for(lambda: len(self.gets) > 1, timeout=2)
            return web.Response(text=request.query.get("hub.challenge", ""))

    class Remote(RedisStore):
        """The Redis store as if across a network: a save takes 50 ms (a latency, not a wait)."""

        async def save(self, sub: Subscription) -> None:
            await asyncio.sleep(0.05)
            await super().save(sub)

    log = SQLiteLog(tmp_path / "log.sqlite3")
    await log.register(COLLECTION, CAPABILITY_LIST)
    hub = WebSubHub(
        log,
        Remote(redis_server.url),
        changelists={COLLECTION: CHANGELIST},
        allow_callbacks=LOOPBACK,
    )
    await hub.start()
    cb = Held()
    await cb.start()
    try:
        fields = {"hub_topic": hub.topic(COLLECTION), "hub_callback": cb.url}
        statuses = await asyncio.gather(
            request(hub, hub_mode="subscribe", **fields),
            request(hub, hub_mode="subscribe", **fields),
        )
        assert [status for status, _ in statuses] == [202, 202]
        await async_wait_for(lambda: len(cb.gets) == 2, 10)
        await async_wait_for(lambda: [s.callback for s in hub.subscriptions()] == [cb.url], 10)
        await append(hub, 3)
        await async_wait_for(lambda: cb.seqs() == [1, 2, 3], 10)
        status, _ = await request(hub, hub_mode="unsubscribe", **fields)
        assert status == 202
        await async_wait_for(lambda: not hub.subscriptions(), 10)
        await append(hub, 1)
        # Deliveries run per subscription: one left running would have POSTed 1..3 twice
        # by now, and 4 after the unsubscribe.  Ask the hub who is still reading the log.
        await async_wait_for(lambda: not hub._tailers, 10, message="a delivery task reads on")
        assert cb.seqs() == [1, 2, 3]
    finally:
        await cb.stop()
        await hub.stop()
        await log.close()


async def test_a_callback_back_after_the_retention_gets_gap_too_old_then_the_rest_in_order(
    hub: WebSubHub, callback: Callback
) -> None:
    await subscribe(hub, callback, secret="gap-secret")
    await append(hub, 5)
    await async_wait_for(lambda: callback.seqs() == [1, 2, 3, 4, 5], 10)
    callback.status = 503  # the callback fails from now on
    await append(hub, 45)  # seqs 6..50
    await async_wait_for(lambda: len(callback.posts) > 5, 10)  # it is being retried
    await hub.log.trim(COLLECTION, Retention(max_len=10, max_age_s=None), now_ms=0)
    assert await hub.log.earliest(COLLECTION) == 41
    callback.status = 204
    await async_wait_for(lambda: any(proto.TYPE_HEADER in h for h, _ in callback.accepted), 15)
    ok = [(h, b) for h, b in callback.accepted if h.get(proto.TYPE_HEADER) == "gap_too_old"]
    assert len(ok) == 1, "one gap_too_old, then live"
    notice = callback.accepted.index(ok[0])
    assert callback.seqs(callback.accepted[:notice]) == [1, 2, 3, 4, 5], "1..5, then the notice"
    headers, body = ok[0]
    # WebSub 7: the topic's content type, not JSON; not a <urlset> either, so a
    # standard Destination cannot take it for a notification of no changes.
    assert headers["Content-Type"] == "application/xml"
    assert proto.verify_signature(body, headers[proto.SIGNATURE_HEADER], b"gap-secret")
    root = etree.fromstring(body)
    assert root.tag == RSN + "gap"
    assert dict(root.attrib) == {
        "collection": COLLECTION,
        "since": "5",
        "earliest": "41",
        "head": "50",
        "capabilitylist": CAPABILITY_LIST,
        "changelist": CHANGELIST,
    }
    assert proto.read_gap(body) == proto.GapNotice(5, 41, 50)
    # After the gap notice delivery goes on live, after the head (50), in order.
    await append(hub, 3)
    await async_wait_for(lambda: callback.seqs()[-1:] == [53], 10)
    accepted = callback.accepted[notice + 1 :]
    assert callback.seqs(accepted) == [51, 52, 53]
    assert accepted[0][0][proto.PREV_HEADER] == "50"
    for h, b in accepted:
        assert proto.verify_signature(b, h[proto.SIGNATURE_HEADER], b"gap-secret")


# --- a Source hands the hub its notifications (Change Notification 4.1) -----------------


async def test_a_source_publishes_by_xml_post_or_ping_and_the_publisher_reads_at_once(
    hub: WebSubHub,
) -> None:
    told: list[str] = []
    hub.on_publish = told.append
    topic = hub.topic(COLLECTION)
    payload = envelope.compose(
        [],
        capabilitylist=CAPABILITY_LIST,
        from_=datetime(2026, 1, 1, tzinfo=UTC),
        until=datetime(2026, 1, 1, 0, 1, tzinfo=UTC),
    )
    links = f'<{topic}>; rel="self", <{hub.url}>; rel="hub"'
    xml = {"Content-Type": "application/xml", "Link": links}
    assert (await request(hub, body=payload, headers=xml))[0] == 200
    status, text = await request(hub, body=payload, headers={"Content-Type": "application/xml"})
    assert status == 400 and "rel=" in text, "4.1: the POST needs Link self and hub"
    status, _ = await request(hub, body=b"<nonsense/>", headers=xml)
    assert status == 400
    assert (await request(hub, hub_mode="publish", hub_url=topic))[0] == 202
    assert (await request(hub, hub_mode="publish", hub_url=CAPABILITY_LIST))[0] == 202
    assert (await request(hub, hub_mode="publish", hub_url=CHANGELIST))[0] == 202
    assert (await request(hub, hub_mode="publish", hub_url="http://else.test/x"))[0] == 404
    assert told == [COLLECTION] * 4

    # With the publisher's secret, a publish must be signed with it.
    hub.publish_secret = b"pub-secret"
    ping = urllib.parse.urlencode({"hub.mode": "publish", "hub.url": topic}).encode()
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert (await request(hub, body=ping, headers=form))[0] == 403
    good = "sha256=" + hmac.new(b"pub-secret", ping, hashlib.sha256).hexdigest()
    signed = {**form, proto.SIGNATURE_HEADER: good}
    assert (await request(hub, body=ping, headers=signed))[0] == 202
    assert (await request(hub, body=payload, headers=xml))[0] == 403
    assert len(told) == 5


async def test_the_topic_answers_get_and_head_as_section_4_1_says(hub: WebSubHub) -> None:
    topic = hub.topic(COLLECTION)

    def fetch(method: str) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(topic, method=method)
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, dict(response.headers), response.read()

    for method in ("GET", "HEAD"):
        status, headers, body = await asyncio.to_thread(fetch, method)
        assert status == 200 and headers["Content-Type"] == "application/xml"
        links = f'<{topic}>; rel="self", <{hub.url}>; rel="hub"'
        assert headers["Link"] == f'{links}, <{CAPABILITY_LIST}>; rel="resourcesync"'
        assert headers["Content-Length"] == "0" and body == b"", "no content before the first"
    await append(hub, 2)
    status, headers, body = await asyncio.to_thread(fetch, "GET")
    batch = envelope.decode_batch(body)
    assert [n.seq for n in batch.changes] == [2], "the latest notification"
    assert batch.capability == "change-notification"
    assert batch.from_ == datetime(2026, 1, 1, 0, 0, 2, tzinfo=UTC)  # as logged: no "from"


# --- issue 22.2: the hub is no tool against others --------------------------------------


@pytest.mark.parametrize(
    "callback",
    [
        "http://127.0.0.1:6379/",
        "http://localhost:8080/cb",
        "http://[::1]/cb",
        "http://0.0.0.0/cb",
        "http://10.1.2.3/cb",
        "http://192.168.0.7/cb",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:127.0.0.1]/cb",
        "http://224.0.0.1/cb",
    ],
)
async def test_callbacks_to_internal_addresses_are_refused_before_any_request(
    tmp_path: Path, callback: str
) -> None:
    log = SQLiteLog(tmp_path / "log.sqlite3")
    await log.register(COLLECTION, CAPABILITY_LIST)
    async with WebSubHub(log, MemoryStore()) as hub:  # no --websub-allow-callback
        status, text = await request(
            hub, hub_mode="subscribe", hub_topic=hub.topic(COLLECTION), hub_callback=callback
        )
        assert status == 403 and "--websub-allow-callback" in text
        assert not hub._pending and not hub.subscriptions() and hub.admission.count == 0
    await log.close()


async def test_the_allow_list_and_the_resolver_filter_every_connection() -> None:
    policy = CallbackPolicy.parse(["127.0.0.0/8", "internal.example"])
    assert policy.check_literal("http://127.0.0.9/cb") is None
    assert policy.check_literal("http://[::1]/cb") is not None  # only 127/8 was allowed
    assert policy.check_literal("http://internal.example/cb") is None
    assert policy.check_resolved("evil.example", ["93.184.216.34", "10.0.0.1"]) is not None
    assert policy.check_resolved("ok.example", ["93.184.216.34"]) is None
    # At connection time a name that resolves to a forbidden address fails (DNS rebinding).
    resolver = FilteringResolver(CallbackPolicy())
    with pytest.raises(OSError, match="may not call"):
        await resolver.resolve("localhost", 80)
    allowed = FilteringResolver(CallbackPolicy.parse(["127.0.0.0/8"]))
    assert {r["host"] for r in await allowed.resolve("localhost", 80)} == {"127.0.0.1"}
    await resolver.close()
    await allowed.close()
    with pytest.raises(ValueError):
        CallbackPolicy.parse(["10.0.0.0/33"])


class SilentCallback(Callback):
    """Never answers a verification: its subscriptions stay pending."""

    release: asyncio.Event | None = None

    async def _get(self, request: web.Request) -> web.Response:
        self.gets.append(dict(request.query))
        if self.release is None:
            self.release = asyncio.Event()
        await self.release.wait()  # a callback that hangs until the test ends
        return web.Response(text="")


async def test_limits_count_pending_verifications_per_client_per_host_and_in_all(
    hub: WebSubHub,
) -> None:
    """Issue 22.2: 1,000 never-answering callbacks blocked everybody; one client took them all."""
    silent = SilentCallback()
    await silent.start()
    try:
        topic = hub.topic(COLLECTION)
        statuses = []
        for i in range(4):
            status, text = await request(
                hub, hub_mode="subscribe", hub_topic=topic, hub_callback=f"{silent.url}?n={i}"
            )
            statuses.append((status, text))
        assert [s for s, _ in statuses] == [202, 202, 202, 429]
        assert "this client" in statuses[3][1] or "callback host" in statuses[3][1]
        await async_wait_for(lambda: len(silent.gets) == 3, 10)
        assert hub.admission.count == 3, "pending verifications count"
        # The global cap (5 here, --websub-max-subscriptions) is counted the same way.
        hub.admission.per_client = hub.admission.per_host = 100
        for i in range(4, 6):
            status, _ = await request(
                hub, hub_mode="subscribe", hub_topic=topic, hub_callback=f"{silent.url}?n={i}"
            )
            assert status == 202
        status, text = await request(
            hub, hub_mode="subscribe", hub_topic=topic, hub_callback=f"{silent.url}?n=9"
        )
        assert status == 503 and "maximum of 5" in text
    finally:
        for task in list(hub._pending):
            task.cancel()
        await asyncio.gather(*hub._pending, return_exceptions=True)
        if silent.release is not None:
            silent.release.set()
        await silent.stop()
    assert hub.admission.count == 0, "a verification that ended frees its place"


async def test_the_redis_store_keeps_to_a_bounded_pool(redis_factory: object) -> None:
    """Issue 22.2: a burst of verifications opened a connection each ("Too many connections")."""
    redis: Redis = redis_factory(extra_config="maxclients 40")  # type: ignore[operator]
    store = RedisStore(redis.url)
    subs = [
        Subscription(COLLECTION, "http://t/", f"http://cb.test/{i}", None, 300, 2e9, 0)
        for i in range(300)
    ]
    try:
        await asyncio.gather(*(store.save(sub) for sub in subs))
        assert len(await store.load()) == 300
    finally:
        await store.close()


async def test_a_callback_with_a_newline_is_refused_and_logs_are_quoted(
    hub: WebSubHub, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 22: a hub.callback holding a newline forged a CRITICAL line in the text log."""
    topic = hub.topic(COLLECTION)
    forged = "http://127.0.0.1:9/cb\n2026-01-01 CRITICAL rsnotify: forged"
    with caplog.at_level(logging.DEBUG):
        status, text = await request(
            hub, hub_mode="subscribe", hub_topic=topic, hub_callback=forged
        )
        assert status == 400 and "control characters" in text
        quiet = Callback()
        quiet.port = 9  # nothing listens there: the verification fails and is logged
        status, _ = await request(
            hub, hub_mode="subscribe", hub_topic=topic, hub_callback="http://127.0.0.1:9/cb?x=%0A"
        )
        assert status == 202
        await async_wait_for(
            lambda: any("not verified" in r.getMessage() for r in caplog.records), 10
        )
    assert not any("\n" in r.getMessage() for r in caplog.records)


async def test_feed_pages_are_bounded(hub: WebSubHub) -> None:
    """Issue 22: feed.atom?page=<4,400 digits> gave HTTP 500 with a traceback."""

    def status_of(url: str) -> int:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    feed = hub.feed_url(COLLECTION)
    assert await asyncio.to_thread(status_of, f"{feed}?page={'9' * 4400}") == 400
    assert await asyncio.to_thread(status_of, f"{feed}?page=99999999999999") == 400
    assert await asyncio.to_thread(status_of, f"{feed}?page=1") == 200


async def test_the_atom_feed_it_advertises_is_a_topic_one_can_subscribe_to(
    hub: WebSubHub, callback: Callback
) -> None:
    """Issue 16: feed.atom said rel=self with a hub that answered "unknown topic" for it."""
    feed = hub.feed_url(COLLECTION)
    status, _ = await request(hub, hub_mode="subscribe", hub_topic=feed, hub_callback=callback.url)
    assert status == 202
    await async_wait_for(lambda: hub.subscriptions(), 10)
    await append(hub, 2)
    await async_wait_for(lambda: callback.posts, 10)
    headers, body = callback.posts[0]
    assert headers["Content-Type"] == "application/atom+xml"  # WebSub 7: the topic's type
    assert f'<{feed}>; rel="self"' in headers["Link"]
    root = etree.fromstring(body)
    assert root.tag == "{http://www.w3.org/2005/Atom}feed"
    assert len(root.findall("{http://www.w3.org/2005/Atom}entry")) >= 1
