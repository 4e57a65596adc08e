"""Reads what the dashboard shows from Redis (and, optionally, MQTT heads).

Two kinds of reading, each on its own connection:

* a **tail** of the telemetry streams (latency samples and events) with a
  blocking ``XREAD`` per stream, so every sample is counted once, as it arrives;
* a **refresh** once per snapshot: the collections (``rsn:collections``),
  each log's head and earliest entry, the new entries of each log (their
  logged and change times, for lag and publish rate), and the status of every
  subscriber and publisher, in two or three pipelined round trips whatever
  the number of subscribers (in a Redis Cluster redis-py splits each pipeline
  per node and sends the parts at once).

With ``--mqtt`` it also subscribes to the retained ``<prefix>/+/head``
messages, whose heartbeat tells whether a publisher is alive even when it
does not report to Redis (over MQTT 5 or 3.1.1, see :class:`MqttHeads`).
The dashboard never writes to Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import ssl
import time
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import urlsplit

import paho.mqtt.client as mqtt
from redis.exceptions import RedisClusterException, RedisError

from .. import redisurl, w3cdt
from ..backoff import Backoff
from ..cancellation import raise_if_cancelled
from ..collection import is_valid_collection_id
from ..errors import RsNotifyError
from ..log.redis_log import COLLECTIONS_KEY
from ..report import (
    EVENTS_KEY,
    PUBLISHERS_KEY,
    SAMPLES_KEY,
    SUBSCRIBERS_KEY,
    LatencySample,
    publisher_key,
    subscriber_key,
)
from ..transport import mqttsig
from ..transport.mqttlink import BrokerLink, LinkState
from ..transport.mqtturl import parse_broker_url
from ..transport.topics import Topics
from .state import DashboardState, LogIndex

log = logging.getLogger("rsnotify.dashboard")

TAIL_START = 2_000  # log entries read back when a collection is first seen
TAIL_BATCH = 10_000
FORGET_AFTER = 24 * 3600.0  # statuses older than this are not shown at all
BACKFILL = 3600.0

# Stream replies as this module's connections read them (redis-py's default
# legacy reply shapes, without decode_responses), narrower than redis-py's
# types, which cover every protocol and option: ids, field names and values
# are bytes; XRANGE and XREVRANGE return a list, empty for a missing key;
# XREAD returns [[key, entries], ...], empty once its block times out (the
# pairs are lists, only ever unpacked here).
StreamRows = list[tuple[bytes, dict[bytes, bytes]]]
XReadReply = list[tuple[bytes, StreamRows]]


def _log_keys(collection: str) -> tuple[str, str]:
    tag = "{" + collection + "}"
    return f"rsn:{tag}:log", f"rsn:{tag}:meta"


def _seq(stream_id: bytes | str) -> int:
    return int(redisurl.reply_text(stream_id).split("-", 1)[0])


def _log_entry(stream_id: bytes, fields: dict[bytes, bytes]) -> tuple[int, float, float | None]:
    """(seq, logged epoch s, change time epoch s or None) of one log record."""
    logged = int(fields.get(b"t", 0) or 0) / 1000.0
    changed: float | None = None
    try:
        value = json.loads(fields[b"d"]).get("datetime")
        if isinstance(value, str):
            changed = w3cdt.parse(value).timestamp()
    except (ValueError, KeyError, TypeError, AttributeError, RsNotifyError):
        changed = None
    return _seq(stream_id), logged, changed


def _status(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def check_redis_url(url: str) -> str:
    if urlsplit(url).scheme not in redisurl.SCHEMES:
        raise RsNotifyError(
            f"{url!r}: --redis must be a redis://, rediss://, unix://, redis+sentinel:// "
            "or redis+cluster:// URL"
        )
    return url


class Collector:
    """Feeds a :class:`DashboardState`; :meth:`refresh` before each snapshot."""

    def __init__(
        self,
        redis_url: str,
        state: DashboardState,
        *,
        mqtt_url: str | None = None,
        topic_prefix: str = "resourcesync",
        mqtt_protocol: str = "auto",
        on_samples: Callable[[list[LatencySample], list[dict[str, float]]], None] | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.url = check_redis_url(redis_url)
        self.state = state
        self.on_samples = on_samples
        self.on_event = on_event
        try:
            self.redis = redisurl.client(redis_url, socket_timeout=5.0, socket_connect_timeout=5.0)
            self._blocking = redisurl.client(redis_url, socket_connect_timeout=5.0)
        except ValueError as exc:
            raise RsNotifyError(f"{redis_url!r}: {exc}") from None
        self.mqtt = (
            MqttHeads(mqtt_url, topic_prefix, self._on_head, protocol=mqtt_protocol)
            if mqtt_url
            else None
        )
        self.ok = False
        self.error: str | None = None
        self.last_ok: float | None = None
        self._tail_task: asyncio.Task[None] | None = None
        self._samples_id = "0-0"
        self._events_id = "0-0"
        self.backfilled = asyncio.Event()

    # -- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if self.mqtt is not None:
            self.mqtt.start()
        self._tail_task = asyncio.create_task(self._tail())

    async def stop(self) -> None:
        if self._tail_task is not None:
            self._tail_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tail_task
        if self.mqtt is not None:
            await self.mqtt.stop()
        await self.redis.aclose()
        await self._blocking.aclose()

    # -- telemetry streams ------------------------------------------------------------------

    def _ingest_samples(self, rows: StreamRows) -> None:
        if not rows:
            return
        samples = []
        for _stream_id, fields in rows:
            try:
                samples.append(LatencySample.from_fields(fields))
            except (ValueError, KeyError):
                self.state.samples_bad += 1
        stages = self.state.add_samples(samples, redisurl.reply_text(rows[-1][0]))
        if self.on_samples is not None:
            self.on_samples(samples, stages)

    def _ingest_event(self, stream_id: bytes, fields: dict[bytes, bytes]) -> None:
        f = {redisurl.reply_text(k): redisurl.reply_text(v) for k, v in fields.items()}
        try:
            data = json.loads(f.get("j") or "{}")
            at = float(f.get("a") or 0.0)
        except ValueError:
            data, at = {}, 0.0
        event = {
            "at": at if math.isfinite(at) else 0.0,
            "collection": f.get("c", ""),
            "subscriber": f.get("s", ""),
            "kind": f.get("k", ""),
            "detail": f.get("m", ""),
            "data": data if isinstance(data, dict) else {},
            "source": "subscriber",
        }
        self.state.add_event(event)
        if self.on_event is not None:
            self.on_event(event)

    async def _backfill(self) -> None:
        """The last hour of samples still in the stream, and the latest events."""
        self.state.latency.advance(time.time())
        start = f"{int((time.time() - BACKFILL) * 1000)}-0"
        while True:
            rows = cast(
                StreamRows, await self._blocking.xrange(SAMPLES_KEY, start, "+", count=TAIL_BATCH)
            )
            self._ingest_samples(rows)
            if rows:
                self._samples_id = redisurl.reply_text(rows[-1][0])
                start = f"({self._samples_id}"
            if len(rows) < TAIL_BATCH:
                break
            await asyncio.sleep(0)
        recent = cast(StreamRows, await self._blocking.xrevrange(EVENTS_KEY, "+", "-", count=100))
        for stream_id, fields in reversed(recent):
            self._ingest_event(stream_id, fields)
        if recent:
            self._events_id = redisurl.reply_text(recent[0][0])
        if self._samples_id == "0-0":  # nothing in the last hour: count only what comes next
            self._samples_id = start

    async def _tail(self) -> None:
        backoff = Backoff(maximum=5.0)
        while True:
            try:
                await self._backfill()
                break
            except (RedisError, RedisClusterException, OSError) as exc:
                delay = backoff.next()
                log.warning("reading telemetry streams failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
        self.backfilled.set()
        await asyncio.gather(self._follow(SAMPLES_KEY), self._follow(EVENTS_KEY))

    async def _follow(self, key: str) -> None:
        """A blocking ``XREAD`` of one stream, for ever.

        One stream per read: in a Redis Cluster the two streams live in
        different slots, which one ``XREAD`` cannot span (a shared hash tag
        would rename the keys every reporter writes).
        """
        backoff = Backoff(maximum=5.0)
        while True:
            position = self._samples_id if key == SAMPLES_KEY else self._events_id
            try:
                reply = cast(
                    XReadReply,
                    await self._blocking.xread({key: position}, count=TAIL_BATCH, block=1000),
                )
                raise_if_cancelled()
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except (RedisError, RedisClusterException, OSError) as exc:
                delay = backoff.next()
                log.warning("reading %s failed (%s); retrying in %.1fs", key, exc, delay)
                await asyncio.sleep(delay)
                continue
            for _key, rows in reply or ():
                if not rows:
                    continue
                if key == SAMPLES_KEY:
                    self._ingest_samples(rows)
                    self._samples_id = redisurl.reply_text(rows[-1][0])
                else:
                    for stream_id, fields in rows:
                        self._ingest_event(stream_id, fields)
                    self._events_id = redisurl.reply_text(rows[-1][0])

    # -- the per-snapshot refresh -------------------------------------------------------------

    async def refresh(self) -> None:
        """Read collections, heads, log tails and statuses; on failure keep what we had."""
        try:
            await self._refresh()
        except (RedisError, RedisClusterException, OSError) as exc:
            if self.ok or self.error is None:
                log.warning("Redis at %s unavailable: %s", self.url, exc)
            self.ok = False
            self.error = str(exc) or type(exc).__name__
            return
        self.ok = True
        self.error = None
        self.last_ok = time.time()

    async def _refresh(self) -> None:
        state = self.state
        now = time.time()
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(COLLECTIONS_KEY)
        pipe.zrangebyscore(SUBSCRIBERS_KEY, now - FORGET_AFTER, "+inf")
        pipe.zrangebyscore(PUBLISHERS_KEY, now - FORGET_AFTER, "+inf")
        known, subscriber_names, publisher_ids = await pipe.execute()
        collections = {redisurl.reply_text(k): redisurl.reply_text(v) for k, v in known.items()}
        for cid, url in collections.items():
            state.collection(cid).capabilitylist = url
        cids = list(collections)
        subs = [redisurl.reply_text(n) for n in subscriber_names]
        pubs = [redisurl.reply_text(n) for n in publisher_ids]
        pipe = self.redis.pipeline(transaction=False)
        for cid in cids:
            log_key, meta_key = _log_keys(cid)
            pipe.hget(meta_key, "head")
            pipe.xrange(log_key, "-", "+", count=1)
            last = state.collections[cid].index.last
            if last is None:
                pipe.xrevrange(log_key, "+", "-", count=TAIL_START)
            else:
                pipe.xrange(log_key, f"({last}-0", "+", count=TAIL_BATCH)
        # A GET per status, not MGET: statuses are plain keys, in a cluster spread
        # over slots; one pipeline is still one round trip (per node).
        for name in subs:
            pipe.get(subscriber_key(name))
        for pid in pubs:
            pipe.get(publisher_key(pid))
        replies = await pipe.execute()
        for i, cid in enumerate(cids):
            head, first, tail = replies[3 * i : 3 * i + 3]
            info = state.collections[cid]
            info.head = int(head or 0)
            if info.index.last is not None and info.head < info.index.last:
                info.index = LogIndex()  # a new log under the same name (Redis flushed)
            info.earliest = _seq(first[0][0]) if first else info.head + 1
            rows = tail if info.index.last is not None else list(reversed(tail))
            info.index.extend(_log_entry(stream_id, fields) for stream_id, fields in rows)
        rest = replies[3 * len(cids) :]
        statuses, published = rest[: len(subs)], rest[len(subs) :]
        state.subscribers = {
            name: status
            for name, raw in zip(subs, statuses, strict=True)
            if (status := _status(raw)) is not None
        }
        state.publishers = {
            pid: status
            for pid, raw in zip(pubs, published, strict=True)
            if (status := _status(raw)) is not None
        }
        wanted = state.wanted_lookups()
        if wanted:
            pipe = self.redis.pipeline(transaction=False)
            for cid, seq in wanted[:1000]:
                pipe.xrange(_log_keys(cid)[0], f"{seq}-0", f"{seq}-0", count=1)
            for (cid, seq), rows in zip(wanted, await pipe.execute(), strict=False):
                state.remember(cid, seq, _log_entry(*rows[0])[1:] if rows else None)

    # -- MQTT heads ------------------------------------------------------------------------

    def _on_head(self, collection: str, body: dict[str, Any]) -> None:
        beat = body.get("heartbeat")
        try:
            heartbeat = w3cdt.parse(beat).timestamp() if isinstance(beat, str) else None
        except RsNotifyError:
            heartbeat = None
        self.state.mqtt_heads[collection] = {
            "head": body.get("head") if isinstance(body.get("head"), int) else None,
            "earliest": body.get("earliest") if isinstance(body.get("earliest"), int) else None,
            "heartbeat": heartbeat,
            "publisher": str(body.get("publisher") or ""),
            "received": time.time(),
        }


class MqttHeads:
    """Subscribes to every collection's retained head message.

    The connection (MQTT 5, 3.1.1 fallback, reconnects, one-line errors, the
    hop from paho's thread to the loop) is a
    :class:`~rsnotify.transport.mqttlink.BrokerLink`.  Heads are read under
    ``<prefix>/+/head`` whatever the topic naming (broker-safe or legacy);
    the collection is the one the head names, and a head on a topic that is
    not that collection's (safe or legacy) is ignored.
    """

    def __init__(
        self,
        url: str,
        prefix: str,
        on_head: Callable[[str, dict[str, Any]], None],
        *,
        protocol: str = "auto",
    ) -> None:
        self.broker = parse_broker_url(url)
        self.topics = Topics(prefix)
        self.prefix = self.topics.prefix
        self.on_head = on_head
        self.link = BrokerLink(
            self.broker,
            client_id=f"rsnotify-dashboard-{os.getpid()}-{id(self) & 0xFFFF:x}",
            logger=log,
            option="--mqtt",
            protocol=protocol,
            tls=ssl.create_default_context() if self.broker.tls else None,
            reconnect_min=1.0,
            reconnect_max=10.0,
            on_message=self._on_message,
            on_state=self._on_state,
        )

    @property
    def connected(self) -> bool:
        return self.link.connected

    def _on_state(self, state: LinkState) -> None:
        if state.state == "connected":
            # Retained heads arrive after the SUBACK; a refusal shows as none arriving.
            self.link.subscribe([(self.topics.head_filter(), 0)]).add_done_callback(_ignore_outcome)

    def _on_message(self, message: mqtt.MQTTMessage) -> None:
        """In paho's thread: check the head, hand it to the loop."""
        # paho types a payload bytes | bytearray; what it receives is bytes, for which
        # bytes() is the same object (no copy).
        payload, _signature = mqttsig.detach(bytes(message.payload))
        try:
            body = json.loads(payload)
        except ValueError:
            return
        collection = body.get("collection") if isinstance(body, dict) else None
        if not isinstance(collection, str) or not is_valid_collection_id(collection):
            return
        if message.topic not in (self.topics.head(collection), f"{self.prefix}/{collection}/head"):
            return  # a head claiming another collection's name
        self.link.post(self.on_head, collection, body)

    def start(self) -> None:
        self.link.start()

    async def stop(self) -> None:
        await self.link.stop()


def _ignore_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: a connection lost before the SUBACK is not news
