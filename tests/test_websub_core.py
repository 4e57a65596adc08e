"""The WebSub hub's sans-I/O core and its subscription stores (no sockets but Redis's)."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from rsnotify.transport import websubproto as proto
from rsnotify.transport.websubproto import Action, Delivery, LeasePolicy, RequestError
from rsnotify.transport.websubstore import MemoryStore, RedisStore, SQLiteStore, SubscriptionStore
from tests.devstack import Redis

HUB = "http://hub.test/"
TOPIC = HUB + "source.test-capabilitylist"


def collection_of(topic: str) -> str | None:
    return topic.removeprefix(HUB) if topic.startswith(HUB) else None


def form(**fields: str) -> dict[str, str]:
    base = {"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": "http://d.test/cb?x=1"}
    base.update({k.replace("_", ".", 1): v for k, v in fields.items()})
    return base


def test_a_well_formed_request_parses() -> None:
    request = proto.parse_request(form(hub_lease_seconds="120", hub_secret="s3cret"), collection_of)
    assert request.mode == "subscribe"
    assert request.collection == "source.test-capabilitylist"
    assert request.lease_seconds == 120
    assert request.secret == b"s3cret"
    other = proto.parse_request(form(hub_topic="http://elsewhere.test/x"), collection_of)
    assert other.collection is None  # parsed, then denied by the hub


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"hub_mode": "watch"}, "hub.mode"),
        ({"hub_callback": "http://d.test/cb\nCRITICAL forged"}, "control characters"),
        ({"hub_callback": "http://d.test:99999/cb"}, "hub.callback"),
        ({"hub_callback": "ftp://d.test/cb"}, "hub.callback"),
        ({"hub_callback": "/relative"}, "hub.callback"),
        ({"hub_callback": "http://d.test/cb#frag"}, "fragment"),
        ({"hub_topic": ""}, "hub.topic"),
        ({"hub_lease_seconds": "-5"}, "lease"),
        ({"hub_lease_seconds": "0"}, "lease"),
        ({"hub_lease_seconds": "soon"}, "lease"),
        ({"hub_secret": "x" * 200}, "secret"),
    ],
)
def test_malformed_requests_are_refused_with_the_reason(
    fields: dict[str, str], reason: str
) -> None:
    with pytest.raises(RequestError, match=reason) as refused:
        proto.parse_request(form(**fields), collection_of)
    assert refused.value.status == 400


def test_a_publish_ping_names_what_changed() -> None:
    """hub.mode=publish is the widespread ping: hub.url (or hub.topic) is what changed."""
    ping = proto.parse_request({"hub.mode": "publish", "hub.url": TOPIC}, collection_of)
    assert ping == proto.PublishRequest(TOPIC)
    topic = proto.parse_request({"hub.mode": "publish", "hub.topic": TOPIC}, collection_of)
    assert topic == proto.PublishRequest(TOPIC)
    with pytest.raises(RequestError, match=r"hub\.url"):
        proto.parse_request({"hub.mode": "publish"}, collection_of)


def test_leases_default_to_the_recommended_bounds() -> None:
    """Change Notification 4.2: not less than 300 s, not more than 2678400 s (a month)."""
    policy = LeasePolicy()
    assert policy.grant(1) == 300
    assert policy.grant(10**9) == 2_678_400
    assert policy.grant(None) == 10 * 24 * 3600
    with pytest.raises(ValueError):
        LeasePolicy(default=100)  # below the minimum


def test_leases_are_clamped_and_defaulted() -> None:
    policy = LeasePolicy(default=600, minimum=2, maximum=3600)
    assert policy.grant(None) == 600
    assert policy.grant(1) == 2
    assert policy.grant(100) == 100
    assert policy.grant(10**9) == 3600


def test_verification_and_denial_urls_keep_the_callback_query() -> None:
    request = proto.parse_request(form(), collection_of)
    url = proto.verification_url(request, "abc", 120)
    query = dict(parse_qsl(urlsplit(url).query))
    assert query == {
        "x": "1",
        "hub.mode": "subscribe",
        "hub.topic": TOPIC,
        "hub.challenge": "abc",
        "hub.lease_seconds": "120",
    }
    denied = dict(parse_qsl(urlsplit(proto.denial_url(request.callback, TOPIC, "no")).query))
    assert denied["hub.mode"] == "denied" and denied["hub.reason"] == "no"


@pytest.mark.parametrize(
    "query", ["a=%2f&b=+x", "token=a%3Db%26c", "flag&x=", "k=v;w=z", "q=%E2%9C%93"]
)
def test_the_callback_query_string_is_kept_byte_for_byte(query: str) -> None:
    """WebSub 5.3: "the hub MUST preserve the query string"; it used to be re-encoded."""
    request = proto.parse_request(form(hub_callback=f"http://d.test/cb?{query}"), collection_of)
    url = proto.verification_url(request, "abc", 300)
    assert url.startswith(f"http://d.test/cb?{query}&hub.mode=subscribe&")
    bare = proto.parse_request(form(hub_callback="http://d.test/cb"), collection_of)
    assert proto.verification_url(bare, "abc", 300).startswith("http://d.test/cb?hub.mode=")


def test_only_the_exact_challenge_in_a_2xx_confirms_intent() -> None:
    assert proto.challenge_answered(200, b"abc", "abc")
    assert proto.challenge_answered(204, b"abc", "abc")
    assert not proto.challenge_answered(200, b"abc\n", "abc")
    assert not proto.challenge_answered(200, b"", "abc")
    assert not proto.challenge_answered(404, b"abc", "abc")


def test_signatures_are_hmac_sha256_of_the_body() -> None:
    body = b"<urlset/>"
    header = proto.signature(body, b"k")
    assert header == "sha256=" + hmac.new(b"k", body, hashlib.sha256).hexdigest()
    assert proto.verify_signature(body, header, b"k")
    assert not proto.verify_signature(body + b" ", header, b"k")
    assert not proto.verify_signature(body, header, b"other")
    assert not proto.verify_signature(body, "sha1=" + header[7:], b"k")
    assert not proto.verify_signature(body, None, b"k")
    sha512 = "sha512=" + hmac.new(b"k", body, hashlib.sha512).hexdigest()
    assert proto.verify_signature(body, sha512, b"k")
    # WebSub 7.1.2: check with the method the hub states, sha1 included.
    sha1 = "sha1=" + hmac.new(b"k", body, hashlib.sha1).hexdigest()
    assert proto.signature_method(body, sha1, b"k") == "sha1"
    assert proto.signature_method(body, sha512, b"k") == "sha512"
    assert proto.signature_method(body, "md5=00", b"k") is None
    headers = proto.content_headers(
        topic=TOPIC, hub=HUB, body=body, secret=None, content_type="application/xml", seq=3, prev=2
    )
    assert proto.SIGNATURE_HEADER not in headers
    assert headers["Link"] == f'<{TOPIC}>; rel="self", <{HUB}>; rel="hub"'
    assert (headers[proto.SEQ_HEADER], headers[proto.PREV_HEADER]) == ("3", "2")


def test_resubscribing_renews_the_lease_and_keeps_the_cursor() -> None:
    first = proto.parse_request(form(hub_secret="a"), collection_of)
    sub = proto.activate(None, first, lease=10, head=40, now=1000.0)
    assert (sub.cursor, sub.expires, sub.secret) == (40, 1010.0, b"a")
    sub.cursor = 55
    again = proto.parse_request(form(hub_secret="b"), collection_of)
    renewed = proto.activate(sub, again, lease=20, head=90, now=1005.0)
    assert renewed is sub
    assert (renewed.cursor, renewed.expires, renewed.secret) == (55, 1025.0, b"b")
    assert not renewed.expired(1024.9) and renewed.expired(1025.0)
    # An expired subscription is not renewed: it starts again at the head.
    fresh = proto.activate(renewed, again, lease=20, head=90, now=2000.0)
    assert fresh is not renewed and fresh.cursor == 90


def test_delivery_plans_in_order_gaps_beyond_retention_and_backs_off() -> None:
    delivery = Delivery(10, backoff_max=1.0)
    assert delivery.plan(earliest=1, head=10) is Action.IDLE
    assert delivery.plan(earliest=1, head=12) is Action.DELIVER
    assert delivery.plan(earliest=11, head=12) is Action.DELIVER
    assert delivery.plan(earliest=12, head=12) is Action.GAP
    delays = [delivery.failed(now=0.0) for _ in range(6)]
    assert delays == [0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert delivery.failed(now=5.0, jitter=0.5) == 0.5 and delivery.next_attempt == 5.5
    delivery.delivered(11)
    assert (delivery.cursor, delivery.failures) == (11, 0)
    delivery.gap_delivered(20, 30)
    assert delivery.cursor == 30
    delivery.gap_delivered(40, 35)  # a head older than the earliest: go on at the earliest
    assert delivery.cursor == 39
    assert [proto.classify_response(s) for s in (200, 202, 410, 404, 500)] == [
        "ok",
        "ok",
        "gone",
        "retry",
        "retry",
    ]


async def _exercise(store: SubscriptionStore) -> None:
    request = proto.parse_request(form(hub_secret="\u00e9\u00e8"), collection_of)
    sub = proto.activate(None, request, lease=10, head=5, now=100.0)
    other = proto.activate(
        None,
        proto.parse_request(form(hub_callback="http://e.test/"), collection_of),
        lease=10,
        head=7,
        now=100.0,
    )
    await store.save(sub)
    await store.save(other)
    await store.save_cursors({sub.key: 9, ("gone", "http://x.test/"): 4})
    await store.save_cursors({sub.key: 8})  # never backwards
    loaded = {s.key: s for s in await store.load()}
    assert set(loaded) == {sub.key, other.key}
    assert loaded[sub.key].cursor == 9 and loaded[other.key].cursor == 7
    assert loaded[sub.key].secret == "\u00e9\u00e8".encode()
    await store.delete(*sub.key)
    await store.delete(*sub.key)
    assert [s.key for s in await store.load()] == [other.key]
    await store.close()


async def test_memory_store() -> None:
    await _exercise(MemoryStore())


async def test_sqlite_store_persists_across_reopen(tmp_path: Path) -> None:
    await _exercise(SQLiteStore(tmp_path / "websub.sqlite3"))
    reopened = SQLiteStore(tmp_path / "websub.sqlite3")
    assert len(await reopened.load()) == 1
    await reopened.close()


async def test_redis_store(redis_server: Redis) -> None:
    await _exercise(RedisStore(redis_server.url))
    again = RedisStore(redis_server.url)
    assert len(await again.load()) == 1
    await again.close()


# --- the Destination's channel, without its server ----------------------------------------


def _channel(events: list[object]) -> object:
    from rsnotify.subscriber.websub import CallbackServer, WebSubChannel

    server = CallbackServer("http://127.0.0.1:9/cb/")
    return WebSubChannel(
        server,
        hub=HUB,
        topic=TOPIC,
        collection="c1",
        sink=events.append,
        secret=b"k",
    )


def test_the_destination_answers_only_the_intent_it_has() -> None:
    from rsnotify.subscriber import events as ev

    events: list[object] = []
    channel: Any = _channel(events)
    assert channel.callback == "http://127.0.0.1:9/cb/c1"
    query = {"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.challenge": "xyz"}
    assert channel.on_verify(query).status == 404, "not subscribing right now"
    channel._intent = "subscribe"
    answer = channel.on_verify({**query, "hub.lease_seconds": "30"})
    assert (answer.status, answer.text, channel.granted) == (200, "xyz", 30)
    assert channel.on_verify({**query, "hub.topic": "http://hub.test/other"}).status == 404
    assert channel.on_verify({**query, "hub.mode": "unsubscribe"}).status == 404
    denied = channel.on_verify({"hub.mode": "denied", "hub.topic": TOPIC, "hub.reason": "no"})
    assert denied.status == 200 and isinstance(events[-1], ev.Disconnected)


def test_the_destination_turns_posts_into_engine_events() -> None:
    from rsnotify.subscriber import events as ev

    events: list[Any] = []
    channel: Any = _channel(events)
    body = b"<urlset/>"
    signed = {proto.SIGNATURE_HEADER: proto.signature(body, b"k"), proto.PREV_HEADER: "41"}
    channel.on_content(body, {**signed, proto.PUBLISHER_SIGNATURE_HEADER: "k1:sha256=00"})
    assert isinstance(events[-1], ev.Message)
    assert (events[-1].payload, events[-1].prev, events[-1].signature) == (
        body,
        41,
        "k1:sha256=00",
    )
    channel.on_content(body, {proto.SIGNATURE_HEADER: proto.signature(body, b"wrong")})
    assert isinstance(events[-1], ev.Invalid)
    channel.on_content(body, {})  # within the same interval: not another catch-up
    assert [type(e) for e in events] == [ev.Message, ev.Invalid]
    # WebSub 7.1.2: sha1, as the hub states it, is accepted (with a warning); empty is no content.
    sha1 = "sha1=" + hmac.new(b"k", body, hashlib.sha1).hexdigest()
    channel.on_content(body, {proto.SIGNATURE_HEADER: sha1})
    assert isinstance(events[-1], ev.Message)
    channel.on_content(b"", {proto.SIGNATURE_HEADER: proto.signature(b"", b"k")})
    assert len(events) == 3
    gap = proto.gap_too_old("c1", 10, 50, 60, "http://s.test/cap.xml", None)
    channel.on_content(
        gap, {proto.SIGNATURE_HEADER: proto.signature(gap, b"k"), proto.TYPE_HEADER: "gap_too_old"}
    )
    assert events[-1] == ev.TooOld(10, 50)


def test_a_flood_of_untrusted_posts_costs_one_catch_up_per_interval() -> None:
    """Issue 22: 100 unsigned POSTs to a Destination's callback caused 100 catch-ups."""
    from rsnotify.subscriber import events as ev
    from rsnotify.subscriber.websub import INVALID_INTERVAL, Throttle

    events: list[Any] = []
    channel: Any = _channel(events)
    for i in range(100):
        channel.on_content(f"<forged n='{i}'/>".encode(), {})
    assert [type(e) for e in events] == [ev.Invalid], "one catch-up, not 100"
    assert channel.untrusted.dropped == 99
    throttle = Throttle(INVALID_INTERVAL)
    assert throttle.allow(0.0) and not throttle.allow(INVALID_INTERVAL - 0.1)
    assert throttle.allow(INVALID_INTERVAL + 0.1), "the next interval gets its catch-up"
