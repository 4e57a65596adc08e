"""What the dashboard knows, and the snapshot it pushes (pure: time passed in, no I/O).

The collector (:mod:`.collector`) feeds this from Redis and MQTT; the
server turns :meth:`DashboardState.build` into JSON for the page, the API and
``/metrics``.

Definitions the page relies on (also in the README):

* **offline**: the subscriber's last status is older than ``offline_after``
  seconds (it reports every second), or it said it stopped;
* **catching up**: its engine is starting, doing a baseline or catching up,
  or finished a catch-up or replay less than ``hold`` seconds ago (so a
  catch-up shorter than one refresh is still seen);
* **lag** of a subscriber that is online is measured at the instant of its
  last report: sequences = the log's head at that instant minus its cursor,
  seconds = that instant minus the change time of the first change it had
  not applied (0 when it had applied everything logged by then).  For an
  offline subscriber both are measured now.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..report import CATCHING_UP, LatencySample
from .latency import STAGES, LatencyWindows

# Any (strict module): JSON statuses and events as read from Redis, and the JSON rows
# served to the page; each field is checked where it is read.

RING = 20_000  # log entries remembered per collection (seq -> logged, change time)
EVENTS = 200


class LogIndex:
    """The recent tail of one collection's log: when each seq was logged, and its change time.

    Sequence numbers are dense, so entry ``i`` is seq ``first + i``; logged
    times never decrease, so "the head at time t" is a binary search.
    """

    def __init__(self, capacity: int = RING) -> None:
        self.capacity = capacity
        self.first = 0
        self.logged: list[float] = []
        self.changed: list[float | None] = []

    @property
    def last(self) -> int | None:
        return self.first + len(self.logged) - 1 if self.logged else None

    def extend(self, records: Iterable[tuple[int, float, float | None]]) -> None:
        for seq, logged, changed in records:
            last = self.last
            if last is not None and seq <= last:
                continue
            if last is None or seq != last + 1:  # trimmed or skipped: start again here
                self.first = seq
                self.logged = []
                self.changed = []
            self.logged.append(logged)
            self.changed.append(changed)
        if len(self.logged) > 2 * self.capacity:
            drop = len(self.logged) - self.capacity
            self.first += drop
            del self.logged[:drop]
            del self.changed[:drop]

    def get(self, seq: int) -> tuple[float, float | None] | None:
        i = seq - self.first
        if 0 <= i < len(self.logged):
            return self.logged[i], self.changed[i]
        return None

    def head_at(self, t: float) -> int | None:
        """The last seq logged at or before ``t`` (None if the tail does not reach back)."""
        if not self.logged:
            return None
        i = bisect.bisect_right(self.logged, t)
        if i == 0:
            return None
        return self.first + i - 1

    def count_since(self, t: float) -> int:
        return len(self.logged) - bisect.bisect_left(self.logged, t)


@dataclass(slots=True)
class CollectionInfo:
    id: str
    capabilitylist: str = ""
    head: int = 0
    earliest: int | None = None
    index: LogIndex = field(default_factory=LogIndex)


class DashboardState:
    def __init__(
        self,
        now: float,
        *,
        offline_after: float = 5.0,
        stale_after: float = 15.0,
        hold: float = 2.0,
    ) -> None:
        self.offline_after = offline_after
        self.stale_after = stale_after
        self.hold = hold
        self.latency = LatencyWindows(now)
        self.collections: dict[str, CollectionInfo] = {}
        self.subscribers: dict[str, dict[str, Any]] = {}
        self.publishers: dict[str, dict[str, Any]] = {}
        self.mqtt_heads: dict[str, dict[str, Any]] = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENTS)
        self.lookups: dict[tuple[str, int], tuple[float, float | None]] = {}
        self.absent: set[tuple[str, int]] = set()  # looked up, no longer in the log
        self.samples_total = 0
        self.samples_bad = 0
        self.through: str | None = None  # id of the last sample stream entry counted
        self._display: dict[tuple[str, str], str] = {}
        self._ingest: deque[tuple[float, int]] = deque(maxlen=120)

    # -- input -------------------------------------------------------------------------

    def collection(self, cid: str) -> CollectionInfo:
        info = self.collections.get(cid)
        if info is None:
            info = self.collections[cid] = CollectionInfo(cid)
        return info

    def add_samples(
        self, samples: list[LatencySample], last_id: str | None = None
    ) -> list[dict[str, float]]:
        """Count a batch of samples (oldest first); returns each one's stages."""
        stages = [sample.stages() for sample in samples]
        self.latency.add_many(zip(stages, (s.applied for s in samples), strict=True))
        self.samples_total += len(samples)
        if last_id is not None:
            self.through = last_id
        return stages

    def add_event(self, event: Mapping[str, Any]) -> None:
        self.events.appendleft(dict(event))

    def remember(self, collection: str, seq: int, entry: tuple[float, float | None] | None) -> None:
        """A log entry fetched on its own (older than the tail), or None: trimmed away."""
        if len(self.lookups) + len(self.absent) > 10_000:
            self.lookups.clear()
            self.absent.clear()
        if entry is None:
            self.absent.add((collection, seq))
        else:
            self.lookups[(collection, seq)] = entry

    def _entry(self, collection: str, seq: int) -> tuple[float, float | None] | None:
        info = self.collections.get(collection)
        found = info.index.get(seq) if info is not None else None
        return found if found is not None else self.lookups.get((collection, seq))

    def wanted_lookups(self) -> list[tuple[str, int]]:
        """(collection, seq) entries the lag of some subscriber needs and no tail holds."""
        out = []
        for status in self.subscribers.values():
            for cid, cs in (status.get("collections") or {}).items():
                cursor = cs.get("cursor")
                info = self.collections.get(cid)
                if not isinstance(cursor, int) or info is None or cursor >= info.head:
                    continue
                key = (cid, cursor + 1)
                if key not in self.absent and self._entry(cid, cursor + 1) is None:
                    out.append(key)
        return out

    # -- output ------------------------------------------------------------------------

    def _display_state(self, status: Mapping[str, Any], cs: Mapping[str, Any], now: float) -> str:
        at = status.get("at")
        if status.get("stopped") or not isinstance(at, int | float):
            return "offline"
        if now - at > self.offline_after:
            return "offline"
        reported = cs.get("state")
        caught_up = cs.get("caught_up_at")
        if reported in CATCHING_UP:
            return "catching-up"
        if isinstance(caught_up, int | float) and now - caught_up < self.hold:
            return "catching-up"
        if reported in ("live", "polling"):  # polling: push down, Change Lists on a timer
            return str(reported)
        return str(reported or "unknown")

    def _lag(
        self, cid: str, cs: Mapping[str, Any], at: float, offline: bool, now: float
    ) -> tuple[int | None, float | None, float]:
        """(lag in seqs, lag in seconds, the instant they are measured at)."""
        info = self.collections.get(cid)
        cursor = cs.get("cursor")
        ref = now if offline else min(at, now)
        if info is None or not isinstance(cursor, int):
            return None, None, ref
        head = info.head
        if not offline:
            at_ref = info.index.head_at(ref)
            if at_ref is not None:
                head = min(head, at_ref)
            nxt = self._entry(cid, cursor + 1)
            if nxt is not None and nxt[0] > ref:  # logged after the report: not missed yet
                head = min(head, cursor)
        lag_seq = max(0, head - cursor)
        if lag_seq == 0:
            return 0, 0.0, ref
        nxt = self._entry(cid, cursor + 1)
        changed = nxt[1] if nxt is not None else None
        if changed is None:  # the log no longer holds it: its change time is older still
            earliest = info.earliest
            first = self._entry(cid, earliest) if earliest is not None else None
            changed = first[1] if first is not None else cs.get("cursor_datetime")
        lag_s = max(0.0, ref - changed) if isinstance(changed, int | float) else None
        return lag_seq, lag_s, ref

    def subscriber_rows(self, now: float) -> list[dict[str, Any]]:
        """One row per (subscriber, collection): offline first, then catching up, then by name.

        The order does not depend on the figures, so rows do not jump about
        on the page every second.  Times are rounded to the millisecond.
        """
        rows = []
        for name, status in self.subscribers.items():
            at = status.get("at") if isinstance(status.get("at"), int | float) else None
            host, pid = status.get("host"), status.get("pid")
            for cid, cs in (status.get("collections") or {}).items():
                state = self._display_state(status, cs, now)
                lag_seq, lag_s, measured = self._lag(cid, cs, at or now, state == "offline", now)
                info = self.collections.get(cid)
                rows.append(
                    {
                        "subscriber": name,
                        "collection": cid,
                        "state": state,
                        "transport": cs.get("transport") or "poll",
                        # Degraded mode (rsnotify.subscriber.pushhealth): why push is not used.
                        "mode_reason": cs.get("mode_reason") if state == "polling" else None,
                        "cursor": cs.get("cursor"),
                        "head": info.head if info is not None else None,
                        "lag_seq": lag_seq,
                        "lag_s": None if lag_s is None else round(lag_s, 4),
                        "lag_at": round(measured, 3),
                        "heartbeat": None if at is None else round(at, 3),
                        "heartbeat_age_s": None if at is None else round(max(0.0, now - at), 2),
                        "applied": cs.get("applied"),
                        "failed": cs.get("failed"),
                        "last_gap": cs.get("last_gap") or None,
                        "host": host,
                        "pid": pid,
                    }
                )
        order = {"offline": 0, "polling": 1, "catching-up": 1}
        rows.sort(key=lambda r: (order.get(r["state"], 2), r["subscriber"], r["collection"]))
        return rows

    def _transitions(self, rows: list[dict[str, Any]], now: float) -> None:
        """Record offline/online changes the dashboard itself observed as events."""
        seen = set()
        for row in rows:
            key = (row["subscriber"], row["collection"])
            seen.add(key)
            before = self._display.get(key)
            state = row["state"]
            self._display[key] = state
            if before is None or before == state:
                continue
            if state == "offline" or before == "offline":
                kind = "offline" if state == "offline" else "online"
                self.add_event(
                    {
                        "at": now,
                        "collection": row["collection"],
                        "subscriber": row["subscriber"],
                        "kind": kind,
                        "detail": f"{before} -> {state}",
                        "data": {},
                        "source": "dashboard",
                    }
                )
        for key in [k for k in self._display if k not in seen]:
            del self._display[key]

    def _publisher(self, cid: str, now: float) -> dict[str, Any]:
        best: dict[str, Any] | None = None
        for pid, status in self.publishers.items():
            if cid not in (status.get("collections") or {}):
                continue
            at = status.get("at")
            if not isinstance(at, int | float):
                continue
            if best is None or at > best["heartbeat"]:
                best = {
                    "id": pid,
                    "heartbeat": at,
                    "via": "redis",
                    "healthy": bool(status.get("healthy", True)),
                    "stopped": bool(status.get("stopped")),
                }
        head = self.mqtt_heads.get(cid)
        beat = head.get("heartbeat") if head else None
        if isinstance(beat, int | float) and (best is None or beat > best["heartbeat"]):
            best = {
                # head is not None: beat came from it.
                "id": head.get("publisher"),  # type: ignore[union-attr]
                "heartbeat": beat,
                "via": "mqtt",
                "healthy": True,
                "stopped": False,
            }
        if best is None:
            return {"id": None, "heartbeat": None, "age_s": None, "health": "unknown", "via": None}
        age = max(0.0, now - best["heartbeat"])
        if best["stopped"]:
            health = "stopped"
        elif age > self.stale_after:
            health = "stale"
        elif not best["healthy"]:
            health = "degraded"
        else:
            health = "ok"
        return {
            "id": best["id"],
            "heartbeat": best["heartbeat"],
            "age_s": age,
            "health": health,
            "via": best["via"],
        }

    def collection_rows(self, rows: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
        out = []
        names = set(self.collections) | {r["collection"] for r in rows}
        for cid in sorted(names):
            info = self.collection(cid)
            mine = [r for r in rows if r["collection"] == cid]
            lags = [r["lag_s"] for r in mine if r["lag_s"] is not None]
            mqtt = self.mqtt_heads.get(cid) or {}
            out.append(
                {
                    "id": cid,
                    "capabilitylist": info.capabilitylist,
                    "head": info.head,
                    "earliest": info.earliest,
                    "retained": (
                        max(0, info.head - info.earliest + 1) if info.earliest is not None else None
                    ),
                    "rate_10s": info.index.count_since(now - 10.0) / 10.0,
                    "rate_60s": info.index.count_since(now - 60.0) / 60.0,
                    "mqtt_head": mqtt.get("head"),
                    "publisher": self._publisher(cid, now),
                    "subscribers": len(mine),
                    "live": sum(r["state"] == "live" for r in mine),
                    "catching_up": sum(r["state"] == "catching-up" for r in mine),
                    "offline": sum(r["state"] == "offline" for r in mine),
                    "max_lag_s": max(lags) if lags else None,
                }
            )
        return out

    def _ingest_rate(self, now: float) -> float:
        self._ingest.append((now, self.samples_total))
        while len(self._ingest) > 2 and now - self._ingest[0][0] > 10.0:
            self._ingest.popleft()
        t0, n0 = self._ingest[0]
        return (self.samples_total - n0) / (now - t0) if now > t0 else 0.0

    def build(self, now: float) -> dict[str, Any]:
        """The snapshot pushed to the page, served by /api and read by /metrics."""
        self.latency.advance(now)
        rows = self.subscriber_rows(now)
        self._transitions(rows, now)
        collections = self.collection_rows(rows, now)
        latency = self.latency
        names = {r["subscriber"] for r in rows}
        return {
            "v": 1,
            "at": now,
            "offline_after": self.offline_after,
            "hold": self.hold,
            "collections": collections,
            "subscribers": rows,
            "totals": {
                "collections": len(collections),
                "subscribers": len(names),
                "live": sum(r["state"] == "live" for r in rows),
                "catching_up": sum(r["state"] == "catching-up" for r in rows),
                "offline": sum(r["state"] == "offline" for r in rows),
                "samples_per_s": self._ingest_rate(now),
                "samples_total": self.samples_total,
            },
            "latency": {
                "through": self.through,
                "window_start": {w: latency.window_start(w) for w in ("1m", "5m", "60m")},
                "windows": latency.summary(),
                "histograms": {
                    w: {s: latency.histogram(w, s) for s in STAGES} for w in ("1m", "5m", "60m")
                },
                "series_1s": latency.series("1s"),
                "series_1m": latency.series("1m"),
            },
            "events": list(self.events)[:100],
        }
