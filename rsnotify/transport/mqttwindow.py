"""The pusher's delivery window: lanes, in flight, acks and rewinds, with no I/O.

This is the bookkeeping of :class:`~.mqtt.MqttPusher`, kept apart from paho,
asyncio and the log so that its rules can be tested without a broker
(``tests/test_mqtt_window.py``):

* **Lanes.**  One per collection.  A lane publishes its seqs strictly in
  order: the next seq it may book is above everything it booked on this
  connection (:meth:`DeliveryWindow.sent` refuses anything else).
* **In flight.**  At most ``limit`` messages (notifications and heads
  together) are booked and not yet PUBACKed, whatever the number of lanes.
* **Acks.**  PUBACKs may be booked in any order.  A lane's *acked-through*
  (what its durable cursor may hold) is the highest seq such that every seq
  up to it was acknowledged: it never passes an unacknowledged or refused
  seq, and it never goes back.  An ack from an older connection is ignored:
  that connection's messages are resent anyway.
* **Rewinds.**  On connect and on disconnect every lane forgets what it sent
  and was not acknowledged (``sent_through`` falls back to acked-through);
  publishing then restarts at ``acked-through + 1``.  A subscriber may see
  ``5, 6, 7, 5, 6, 7, 8``: in order per connection, duplicates allowed
  (subscribers deduplicate by seq), never a gap.  A lane whose message the
  broker refused (e.g. an ACL) pauses, then rewinds the same way
  (:meth:`DeliveryWindow.retry`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import WindowError

__all__ = ["Ack", "DeliveryWindow", "Lane", "Sent", "WindowError"]


@dataclass(slots=True)
class Lane:
    """One collection's delivery state.

    ``sent_through`` and ``inflight`` describe the current connection; a
    rewind folds them back to what the broker acknowledged.
    """

    collection: str
    topic: str
    head_topic: str
    ready: bool = False  # the durable cursor has been read
    sent_through: int = 0  # highest seq published (or skipped) on this connection
    inflight: set[int] = field(default_factory=set)  # published, no PUBACK yet
    durable: int = 0  # what the log cursor holds
    refused: bool = False  # the broker refused a message; retry after a pause
    refusals: int = 0  # retries since the last accepted message: the next pause grows with it

    def acked_through(self) -> int:
        return min(self.inflight) - 1 if self.inflight else self.sent_through

    def rewind(self) -> None:
        self.sent_through = self.acked_through()
        self.inflight.clear()


# Not frozen: a frozen dataclass costs ~1 us more to build, once per message and per ack.
@dataclass(slots=True)
class Sent:
    """What one paho message id carries."""

    lane: Lane | None  # None: a head message
    seq: int  # a head message: the head it announced
    size: int
    started: float  # loop time when it was handed over, for the publish latency


@dataclass(slots=True)
class Ack:
    """One PUBACK booked: what it acknowledged, or refused."""

    sent: Sent
    refused: bool
    first_refusal: bool = False  # the lane was not refused before: say so once


class DeliveryWindow:
    """Every lane of one pusher and the messages they have in flight."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the window needs room for one message, not {limit}")
        self.limit = limit
        self.lanes: dict[str, Lane] = {}
        self.conn: int | None = None  # the connection acks are booked for; None: none
        self.epoch = 0  # bumped on every connect and disconnect
        # What the current connection has done: a broker that closes it after
        # PUBLISHes without acknowledging any is refusing them (MQTT 3.1.1).
        self.conn_sent = 0
        self.conn_acked = 0
        self._sent: dict[int, Sent] = {}  # paho message id -> what it carries

    # -- reading -------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self.conn is not None

    def __len__(self) -> int:
        """Messages booked and not yet PUBACKed."""
        return len(self._sent)

    def has_room(self) -> bool:
        return len(self._sent) < self.limit

    def acked(self, lane: Lane) -> int:
        """What the lane's cursor may hold: acked-through once ready, else the stored cursor."""
        return lane.acked_through() if lane.ready else lane.durable

    def cursor_due(self, lane: Lane) -> int | None:
        """The seq to store as the lane's cursor, or None if the stored one is current."""
        if not lane.ready:
            return None
        acked = lane.acked_through()
        return acked if acked > lane.durable else None

    # -- lanes ---------------------------------------------------------------------

    def add(self, collection: str, topic: str, head_topic: str) -> Lane:
        lane = self.lanes.get(collection)
        if lane is None:
            lane = self.lanes[collection] = Lane(collection, topic, head_topic)
        return lane

    def start(self, lane: Lane, cursor: int) -> None:
        """The lane's durable cursor was read: publishing starts after it."""
        lane.durable = lane.sent_through = cursor
        lane.inflight.clear()
        lane.ready = True

    def stored(self, lane: Lane, cursor: int) -> None:
        lane.durable = max(lane.durable, cursor)

    # -- connections ---------------------------------------------------------------

    def connect(self, conn: int) -> None:
        """A new connection: acks are booked for ``conn`` only, lanes start over."""
        self._rewind()
        self.conn = conn
        self.conn_sent = self.conn_acked = 0

    def disconnect(self) -> None:
        self._rewind()
        self.conn = None

    def _rewind(self) -> None:
        self._sent.clear()
        for lane in self.lanes.values():
            lane.rewind()
        self.epoch += 1

    def clear(self) -> None:
        """Forget what is in flight (shutting down): it is resent next time."""
        self.disconnect()

    # -- publishing and acks -------------------------------------------------------

    def skip(self, lane: Lane, through: int) -> None:
        """Seqs up to ``through`` will not be published (trimmed, or never renderable)."""
        if through < lane.sent_through:
            raise WindowError(f"{lane.collection}: skip back to {through}")
        lane.sent_through = through

    def sent(self, mid: int, sent: Sent) -> None:
        """Book a message paho accepted as ``mid``."""
        if not self.has_room():
            raise WindowError(f"{self.limit} messages in flight already")
        if mid in self._sent:
            raise WindowError(f"message id {mid} is in flight already")
        lane = sent.lane
        if lane is not None:
            if sent.seq <= lane.sent_through:
                raise WindowError(
                    f"{lane.collection}: seq {sent.seq} after {lane.sent_through}: out of order"
                )
            lane.inflight.add(sent.seq)
            lane.sent_through = sent.seq
        self._sent[mid] = sent
        self.conn_sent += 1

    def ack(self, conn: int, mid: int, failed: bool) -> Ack | None:
        """Book a PUBACK; None if it is not one this window waits for."""
        if conn != self.conn:
            return None  # an older connection: its lanes were rewound, it will be resent
        sent = self._sent.pop(mid, None)
        if sent is None:
            return None
        self.conn_acked += 1
        lane = sent.lane
        if lane is None:
            return Ack(sent, failed)
        if failed:
            # The seq stays in ``inflight``, so acked-through cannot pass it;
            # the lane pauses and resends from it (:meth:`retry`).
            first = not lane.refused
            lane.refused = True
            return Ack(sent, True, first)
        lane.inflight.discard(sent.seq)
        lane.refusals = 0
        return Ack(sent, False)

    def retry(self, lane: Lane) -> None:
        """After a refusal's pause: resend from the lane's acked-through."""
        lane.refused = False
        lane.refusals += 1
        lane.rewind()
