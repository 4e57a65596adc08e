"""Telemetry reporting to Redis: what ``rsnotify dashboard`` reads.

Subscribers (``--report redis://...``) and publishers (``--report``, by
default their ``--redis``) write three kinds of record:

* a **latency sample** per change applied from a notification, into one
  capped stream (``XADD MAXLEN ~``) shared by every subscriber: the change
  time and the times it was detected, published, received and applied, so the
  dashboard can compute end-to-end latency and each stage's share;
* a **status** per process, refreshed every second (and at once when a
  collection's state changes) with a TTL: cursor, state, transport, last gap
  and catch-up, heartbeat.  A status whose heartbeat is older than a few
  intervals means the process is gone (offline); the key itself lingers for a
  day so the dashboard still knows where that subscriber stopped;
* **events** (gaps, catch-ups, replays, connects, disconnects, signature
  failures) into a second capped stream.

Key layout (plain keys, outside any collection's hash tag):

==========================  ===========================================================
``rsn:tm:samples``          stream: ``c`` collection, ``s`` subscriber, ``q`` seq,
                            ``t`` change time, ``d`` detected, ``p`` published,
                            ``r`` received, ``a`` applied (epoch seconds; ``d``/``p``
                            omitted when the notification did not carry them)
``rsn:tm:events``           stream: ``c``, ``s``, ``k`` kind, ``m`` detail, ``j`` JSON data,
                            ``a`` time
``rsn:tm:subscribers``      sorted set: subscriber name -> last report time
``rsn:tm:sub:<name>``       string: the subscriber's status (JSON), ``EX`` one day
``rsn:tm:publishers``       sorted set: publisher id -> last report time
``rsn:tm:pub:<id>``         string: the publisher's status (JSON), ``EX`` one day
==========================  ===========================================================

Reporting must never slow down or break applying changes: callbacks only
append to a bounded buffer; one background task writes batches in a
pipeline; when Redis is slow or down the batch is dropped and counted
(``rsnotify_report_dropped_total``), and the next tick tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError
from redis.retry import Retry

from . import redisurl
from .argtypes import REDIS_SCHEMES
from .cancellation import raise_if_cancelled
from .envelope import LATENCY_STAGES
from .errors import ReportError

log = logging.getLogger("rsnotify.report")

SAMPLES_KEY = "rsn:tm:samples"
EVENTS_KEY = "rsn:tm:events"
SUBSCRIBERS_KEY = "rsn:tm:subscribers"
PUBLISHERS_KEY = "rsn:tm:publishers"
SAMPLES_MAXLEN = 100_000
EVENTS_MAXLEN = 10_000
STATUS_TTL = 24 * 3600
BUFFER = 20_000  # samples held while Redis is slow; beyond that the oldest are dropped
STAGES = LATENCY_STAGES
# Engine states that mean "not applying pushed changes in order yet".
CATCHING_UP = frozenset({"starting", "subscribing", "baseline", "catching-up"})


def subscriber_key(name: str) -> str:
    return f"rsn:tm:sub:{name}"


def publisher_key(publisher_id: str) -> str:
    return f"rsn:tm:pub:{publisher_id}"


def check_url(url: str) -> str:
    """Validate a telemetry URL (the command line uses :func:`rsnotify.argtypes.redis_url`)."""
    scheme = urlsplit(url).scheme
    if scheme not in REDIS_SCHEMES:
        raise ReportError(
            f"{url!r}: a telemetry target must be a redis://, rediss://, unix://, "
            "redis+sentinel:// or redis+cluster:// URL"
        )
    return url


def connect(url: str, *, timeout: float = 2.0) -> aioredis.Redis:
    """A client that fails fast: telemetry is dropped, never waited for."""
    check_url(url)
    try:
        return redisurl.client(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
    except ValueError as exc:
        raise ReportError(f"{url!r}: {exc}") from None


# -- the sample record -----------------------------------------------------------------


def _num(value: float) -> str:
    return f"{value:.6f}"


@dataclass(frozen=True, slots=True)
class LatencySample:
    """One applied change's timeline, in epoch seconds (clocks of three machines)."""

    collection: str
    subscriber: str
    seq: int
    changed: float
    detected: float | None
    published: float | None
    received: float
    applied: float

    def fields(self) -> dict[str, str]:
        out = {
            "c": self.collection,
            "s": self.subscriber,
            "q": str(self.seq),
            "t": _num(self.changed),
            "r": _num(self.received),
            "a": _num(self.applied),
        }
        if self.detected is not None:
            out["d"] = _num(self.detected)
        if self.published is not None:
            out["p"] = _num(self.published)
        return out

    @classmethod
    def from_fields(cls, fields: Mapping[Any, Any]) -> LatencySample:
        """Parse a stream entry (bytes or str keys); ValueError/KeyError for a malformed one.

        On the dashboard's hot path (thousands a second): no decoding of the
        numbers, which ``float``/``int`` read from bytes directly.
        """
        f = fields if b"a" in fields else {k.encode(): v for k, v in fields.items()}
        detected = f.get(b"d")
        published = f.get(b"p")
        sample = cls(
            collection=redisurl.reply_text(f[b"c"]),
            subscriber=redisurl.reply_text(f[b"s"]),
            seq=int(f[b"q"]),
            changed=float(f[b"t"]),
            detected=None if detected is None else float(detected),
            published=None if published is None else float(published),
            received=float(f[b"r"]),
            applied=float(f[b"a"]),
        )
        optional = [t for t in (sample.detected, sample.published) if t is not None]
        times = (sample.changed, sample.received, sample.applied, *optional)
        if not all(math.isfinite(t) for t in times):
            raise ValueError("a latency sample's times must be finite numbers")
        return sample

    def stages(self) -> dict[str, float]:
        """Seconds per stage, clamped at zero (clock skew between machines)."""
        out = {
            "e2e": self.applied - self.changed,
            "apply": self.applied - self.received,
        }
        if self.detected is not None:
            out["detect"] = self.detected - self.changed
            if self.published is not None:
                out["publish"] = self.published - self.detected
        if self.published is not None:
            out["deliver"] = self.received - self.published
        return {k: max(0.0, v) for k, v in out.items()}


# -- the writer shared by both reporters -----------------------------------------------------


class _Writer:
    """Bounded buffers and one task writing them to Redis in pipelines."""

    def __init__(
        self,
        url: str,
        registry: CollectorRegistry | None,
        *,
        interval: float = 1.0,
        flush: float = 0.2,
    ) -> None:
        self.url = url
        self.redis = connect(url)
        self.interval = interval
        self.flush = flush
        self.samples: deque[tuple[Any, ...]] = deque()
        self.events: deque[dict[str, str]] = deque(maxlen=1000)
        self.sent = 0
        self.dropped = 0
        self._wake = asyncio.Event()
        self._status_now = False
        self._failing = False
        self._sent_metric = self._dropped_metric = self._errors_metric = None
        if registry is not None:
            self._sent_metric = Counter(
                "rsnotify_report_samples_total",
                "Latency samples written to Redis for the dashboard",
                registry=registry,
            )
            self._dropped_metric = Counter(
                "rsnotify_report_dropped_total",
                "Latency samples and events dropped (Redis slow or down, buffer full)",
                registry=registry,
            )
            self._errors_metric = Counter(
                "rsnotify_report_errors_total",
                "Failed telemetry writes to Redis",
                registry=registry,
            )

    def _drop(self, count: int) -> None:
        self.dropped += count
        if self._dropped_metric is not None and count:
            self._dropped_metric.inc(count)

    def add_sample(self, sample: tuple[Any, ...]) -> None:
        if len(self.samples) >= BUFFER:
            self.samples.popleft()
            self._drop(1)
        self.samples.append(sample)
        if len(self.samples) >= 500:
            self._wake.set()

    def add_event(self, fields: dict[str, str]) -> None:
        if len(self.events) == self.events.maxlen:
            self._drop(1)
        self.events.append(fields)
        self._status_now = True
        self._wake.set()

    def status_soon(self) -> None:
        self._status_now = True
        self._wake.set()

    def status(self, now: float) -> tuple[str, str, str, dict[str, Any]] | None:
        """(index key, member, status key, status body); overridden by the reporters."""
        raise NotImplementedError

    def sample_fields(self, sample: tuple[Any, ...]) -> dict[str, str]:
        raise NotImplementedError

    async def _write(self, status_due: bool) -> None:
        now = time.time()
        batch = [self.samples.popleft() for _ in range(min(len(self.samples), 5000))]
        events = list(self.events)
        self.events.clear()
        pipe = self.redis.pipeline(transaction=False)
        # Ignored below: redis-py types xadd's fields as an invariant dict of its
        # own key and value unions, which a dict[str, str] is not.
        for sample in batch:
            pipe.xadd(SAMPLES_KEY, self.sample_fields(sample), maxlen=SAMPLES_MAXLEN)  # type: ignore[arg-type]
        for event in events:
            pipe.xadd(EVENTS_KEY, event, maxlen=EVENTS_MAXLEN)  # type: ignore[arg-type]
        status = self.status(now) if status_due else None
        if status is not None:
            index, member, key, body = status
            pipe.set(key, json.dumps(body, separators=(",", ":")), ex=STATUS_TTL)
            pipe.zadd(index, {member: now})
        if not batch and not events and status is None:
            return
        try:
            await pipe.execute()
        except (RedisError, RedisClusterException, OSError) as exc:
            self._drop(len(batch) + len(events))
            if self._errors_metric is not None:
                self._errors_metric.inc()
            if not self._failing:
                log.warning(
                    "telemetry to %s failing (%s); dropping samples until it answers", self.url, exc
                )
            self._failing = True
            return
        if self._failing:
            log.info("telemetry to %s written again", self.url)
        self._failing = False
        self.sent += len(batch)
        if self._sent_metric is not None and batch:
            self._sent_metric.inc(len(batch))

    async def run(self) -> None:
        """Write until cancelled; on cancellation write what is left (briefly) and close."""
        next_status = 0.0
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.flush):
                        await self._wake.wait()
                self._wake.clear()
                now = time.monotonic()
                due = self._status_now or now >= next_status
                if due:
                    self._status_now = False
                    next_status = now + self.interval
                await self._write(due)
                raise_if_cancelled()
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    self.stopping()
                    await self._write(True)
            with contextlib.suppress(Exception):
                await self.redis.aclose()

    def stopping(self) -> None:
        """Mark the last status as a clean stop (overridden)."""


def _identity() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


# -- subscribers -------------------------------------------------------------------------


def _transports(registry: CollectorRegistry) -> dict[str, str]:
    """collection -> transport, from the subscriber's own ``rsnotify_subscriber_transport``."""
    out: dict[str, str] = {}
    for family in registry.collect():
        if family.name == "rsnotify_subscriber_transport":
            for sample in family.samples:
                out[sample.labels.get("collection", "")] = sample.labels.get("transport", "")
    return out


def _chain(first: Callable[..., None] | None, second: Callable[..., None]) -> Callable[..., None]:
    if first is None:
        return second

    def both(*args: Any) -> None:
        first(*args)
        second(*args)

    return both


class SubscriberReporter(_Writer):
    """Reports one ``rsnotify subscribe`` process: samples, events and a status.

    :meth:`attach` adds the reporter to every collection engine's
    ``on_applied``/``on_event`` callbacks; :meth:`run` is the writing task.
    """

    def __init__(self, url: str, subscriber: Any, *, interval: float = 1.0) -> None:
        super().__init__(url, subscriber.metrics.registry, interval=interval)
        self.subscriber = subscriber
        self.name: str = subscriber.metrics.subscriber
        self.started = time.time()
        self.transports: dict[str, str] = {}
        self.caught_up_at: dict[str, float] = {}
        self.last_event: dict[str, dict[str, Any]] = {}
        self._stopped = False

    def attach(self) -> SubscriberReporter:
        self.transports = _transports(self.subscriber.metrics.registry)
        for cid, engine in self.subscriber.engines.items():
            engine.on_applied = _chain(engine.on_applied, self._applied_callback(cid))
            engine.on_event = _chain(engine.on_event, self._event_callback(cid))
        return self

    def _applied_callback(self, collection: str) -> Callable[..., None]:
        def on_applied(n: Any, received: float, applied: float) -> None:
            try:
                detected = n.detected.timestamp() if n.detected is not None else None
                published = n.published.timestamp() if n.published is not None else None
                self.add_sample(
                    (collection, n.seq, n.datetime.timestamp(), detected, published,
                     received, applied)
                )  # fmt: skip
            except Exception:  # telemetry must never break applying
                self._drop(1)

        return on_applied

    def _event_callback(self, collection: str) -> Callable[..., None]:
        def on_event(kind: str, detail: str, data: dict[str, Any]) -> None:
            try:
                self.event(collection, kind, detail, data)
            except Exception:
                self._drop(1)

        return on_event

    def event(self, collection: str, kind: str, detail: str, data: Mapping[str, Any]) -> None:
        now = time.time()
        if kind == "gap" and detail.startswith("invalid payload") and "sign" in detail:
            self._add_event(collection, "signature", detail, {}, now)
        if kind in ("catch-up", "replay"):
            self.caught_up_at[collection] = now
        self._add_event(collection, kind, detail, data, now)

    def _add_event(
        self, collection: str, kind: str, detail: str, data: Mapping[str, Any], now: float
    ) -> None:
        self.last_event[collection] = {"kind": kind, "at": now}
        self.add_event(
            {
                "c": collection,
                "s": self.name,
                "k": kind,
                "m": detail[:500],
                "j": json.dumps(dict(data), default=str, separators=(",", ":")),
                "a": _num(now),
            }
        )

    def sample_fields(self, sample: tuple[Any, ...]) -> dict[str, str]:
        collection, seq, changed, detected, published, received, applied = sample
        return LatencySample(
            collection, self.name, seq, changed, detected, published, received, applied
        ).fields()

    def collection_status(self, cid: str, engine: Any) -> dict[str, Any]:
        stats = engine.stats
        last_time = getattr(engine.applied, "last_time", None)
        expected = getattr(engine.detector, "expected", None)
        return {
            "cursor": engine.applied_seq,
            "cursor_datetime": last_time.timestamp() if last_time is not None else None,
            "received": expected - 1 if expected is not None else None,
            "state": "stopped" if self._stopped else stats.state,
            "transport": self.transports.get(cid) or "poll",
            "applied": stats.applied,
            "failed": stats.failed,
            "skipped": stats.skipped,
            "gaps": stats.gaps,
            "catchups": stats.catchups,
            "mode": stats.mode,  # push, or polling (degraded mode)
            "mode_reason": stats.mode_reason,
            "last_gap": dict(stats.last_gap),
            "caught_up_at": self.caught_up_at.get(cid),
            "queued": engine.queue.qsize(),
        }

    def status(self, now: float) -> tuple[str, str, str, dict[str, Any]]:
        body = {
            "v": 1,
            "subscriber": self.name,
            **_identity(),
            "at": now,
            "started": self.started,
            "interval": self.interval,
            "stopped": self._stopped,
            "samples": {"sent": self.sent, "dropped": self.dropped},
            "collections": {
                cid: self.collection_status(cid, engine)
                for cid, engine in self.subscriber.engines.items()
            },
        }
        return SUBSCRIBERS_KEY, self.name, subscriber_key(self.name), body

    def stopping(self) -> None:
        self._stopped = True


# -- publishers --------------------------------------------------------------------------


class PublisherReporter(_Writer):
    """Reports one ``rsnotify publish`` process: heartbeat, heads, health."""

    def __init__(self, url: str, publisher: Any, *, interval: float = 1.0) -> None:
        super().__init__(url, publisher.metrics.registry, interval=interval)
        self.publisher = publisher
        self.id: str = publisher.config.publisher_id
        self.started = time.time()
        self._stopped = False

    def sample_fields(self, sample: tuple[Any, ...]) -> dict[str, str]:  # no samples
        return {}

    def status(self, now: float) -> tuple[str, str, str, dict[str, Any]]:
        publisher = self.publisher
        config = publisher.config
        transports = [t for t, on in (("mqtt", config.mqtt), ("websocket", config.ws)) if on]
        body = {
            "v": 1,
            "publisher": self.id,
            **_identity(),
            "at": now,
            "started": self.started,
            "interval": self.interval,
            "stopped": self._stopped,
            "healthy": bool(getattr(publisher, "healthy", True)),
            "transports": transports,
            "collections": {
                cid: {"head": c.head, "capabilitylist": c.capability_list}
                for cid, c in publisher.collections.items()
            },
        }
        return PUBLISHERS_KEY, self.id, publisher_key(self.id), body

    def stopping(self) -> None:
        self._stopped = True
