"""The pusher's delivery window without a broker: lanes, in flight, acks, rewinds.

:mod:`rsnotify.transport.mqttwindow` is pure, so its rules are checked here
directly: first case by case, then property-style, by driving it the way the
pusher does against a model broker that acknowledges in random order,
refuses now and then and drops the connection, over many seeds.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import pytest

from rsnotify.transport.mqttwindow import DeliveryWindow, Lane, Sent, WindowError


def lane_of(window: DeliveryWindow, name: str = "c1", cursor: int = 0) -> Lane:
    lane = window.add(name, f"t/{name}/changes", f"t/{name}/head")
    window.start(lane, cursor)
    return lane


def send(window: DeliveryWindow, mid: int, lane: Lane | None, seq: int) -> None:
    window.sent(mid, Sent(lane, seq, 10, 0.0))


def sending(count: int) -> tuple[DeliveryWindow, Lane]:
    """Connection 1, with seqs 1..count of one lane in flight as message ids 1..count."""
    window = DeliveryWindow(10)
    lane = lane_of(window)
    window.connect(1)
    for seq in range(1, count + 1):
        send(window, seq, lane, seq)
    return window, lane


# --- case by case -------------------------------------------------------------------


def test_acks_out_of_order_move_the_cursor_only_over_a_contiguous_run() -> None:
    window = DeliveryWindow(10)
    lane = lane_of(window, cursor=4)
    window.connect(1)
    for mid, seq in enumerate(range(5, 10), start=1):  # seqs 5..9 as mids 1..5
        send(window, mid, lane, seq)
    assert window.acked(lane) == 4 and len(window) == 5
    for mid in (3, 5, 2):  # seqs 7, 9, 6
        ack = window.ack(1, mid, failed=False)
        assert ack is not None and not ack.refused
    assert window.acked(lane) == 4  # 5 is still out
    assert window.cursor_due(lane) is None
    window.ack(1, 1, failed=False)  # seq 5
    assert window.acked(lane) == 7  # 8 is still out
    assert window.cursor_due(lane) == 7
    window.stored(lane, 7)
    assert window.cursor_due(lane) is None
    window.ack(1, 4, failed=False)
    assert window.acked(lane) == 9 and len(window) == 0
    assert window.ack(1, 4, failed=False) is None  # a duplicate PUBACK is nothing


def test_a_disconnect_rewinds_to_the_acked_cursor_and_old_acks_are_ignored() -> None:
    window, lane = sending(5)
    window.ack(1, 1, failed=False)
    window.ack(1, 3, failed=False)
    epoch = window.epoch
    window.disconnect()
    assert not window.connected and window.epoch > epoch
    assert lane.sent_through == 1 and not lane.inflight and len(window) == 0
    assert window.ack(1, 2, failed=False) is None  # in flight on a connection now gone
    window.connect(2)
    assert window.ack(1, 4, failed=False) is None  # still the old one
    with pytest.raises(WindowError):
        send(window, 1, lane, 1)  # already acknowledged: never resent
    send(window, 1, lane, 2)  # resending starts right after the acked cursor
    assert window.acked(lane) == 1


def test_the_window_never_holds_more_than_its_limit_and_lanes_book_in_order() -> None:
    window = DeliveryWindow(3)
    one, two = lane_of(window, "c1"), lane_of(window, "c2")
    window.connect(1)
    send(window, 1, one, 1)
    send(window, 2, None, 7)  # a head message counts too
    send(window, 3, two, 1)
    assert not window.has_room()
    with pytest.raises(WindowError):
        send(window, 4, one, 2)
    window.ack(1, 2, failed=False)
    assert window.has_room()
    with pytest.raises(WindowError):
        send(window, 4, one, 1)  # not after what the lane sent
    with pytest.raises(WindowError):
        send(window, 1, one, 2)  # a message id still in flight
    send(window, 4, one, 2)
    with pytest.raises(WindowError):
        window.skip(one, 1)  # skipping goes forward only
    with pytest.raises(ValueError):
        DeliveryWindow(0)


def test_a_refused_message_holds_its_lane_until_the_retry() -> None:
    window, lane = sending(3)
    first = window.ack(1, 2, failed=True)
    again = window.ack(1, 3, failed=True)
    assert first is not None and first.refused and first.first_refusal
    assert again is not None and again.refused and not again.first_refusal
    window.ack(1, 1, failed=False)
    assert lane.refused and window.acked(lane) == 1  # the cursor cannot pass seq 2
    window.retry(lane)
    assert not lane.refused and lane.sent_through == 1 and not lane.inflight
    assert lane.refusals == 1  # the next pause grows ...
    send(window, 4, lane, 2)
    window.ack(1, 4, failed=False)
    assert lane.refusals == 0 and window.acked(lane) == 2  # ... until one is accepted
    head = window.ack(1, 99, failed=True)
    assert head is None


def test_head_acks_and_skipped_seqs() -> None:
    window = DeliveryWindow(5)
    lane = lane_of(window)
    assert window.ack(0, 1, failed=False) is None  # never connected
    window.connect(1)
    send(window, 1, None, 42)
    ack = window.ack(1, 1, failed=False)
    assert ack is not None and ack.sent.lane is None and ack.sent.seq == 42
    window.skip(lane, 6)  # trimmed from the log before it could be pushed
    assert window.acked(lane) == 6 and window.cursor_due(lane) == 6
    send(window, 2, lane, 7)
    assert window.conn_sent == 2 and window.conn_acked == 1


def test_a_lane_not_ready_reports_its_stored_cursor() -> None:
    window = DeliveryWindow(5)
    lane = window.add("c1", "t", "h")
    lane.durable = 9
    assert window.acked(lane) == 9 and window.cursor_due(lane) is None
    assert window.add("c1", "x", "y") is lane  # idempotent


# --- property-style: the window driven against a model broker --------------------------


@dataclass
class Model:
    """What the broker saw and acknowledged, and what the rules say must hold."""

    heads: dict[str, int]  # collection -> last seq in the log
    # (connection, collection, retry number) -> seqs, in the order they went out
    delivered: dict[tuple[int, str, int], list[int]] = field(default_factory=dict)
    retries: dict[str, int] = field(default_factory=dict)
    acked: dict[str, set[int]] = field(default_factory=dict)
    outstanding: dict[int, dict[int, Sent]] = field(default_factory=dict)  # conn -> mid -> sent
    cursors: dict[str, int] = field(default_factory=dict)  # lowest acked-through ever seen


class Driver:
    """Drives a window the way the pusher does, at random, checking every step."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.window = DeliveryWindow(rng.randint(1, 8))
        lanes = rng.randint(1, 3)
        self.model = Model({f"c{i}": rng.randint(0, 40) for i in range(lanes)})
        self.conn = 0
        self.next_mid = 1
        for name in self.model.heads:
            start = rng.randint(0, 3)
            self.model.heads[name] += start
            lane_of(self.window, name, start)
            self.model.acked[name] = set(range(1, start + 1))
            self.model.cursors[name] = start

    def connect(self) -> None:
        self.conn += 1
        self.next_mid = 1  # a fresh paho client numbers its messages from 1 again
        self.window.connect(self.conn)
        self.model.outstanding[self.conn] = {}

    def publish(self) -> bool:
        window = self.window
        if not window.connected or not window.has_room():
            return False
        lanes = [
            lane
            for lane in window.lanes.values()
            if not lane.refused and lane.sent_through < self.model.heads[lane.collection]
        ]
        if not lanes:
            return False
        lane = self.rng.choice(lanes)
        seq = lane.sent_through + 1
        if self.rng.random() < 0.02:  # trimmed or unrenderable: skipped, never sent
            window.skip(lane, seq)
            self.model.acked[lane.collection].add(seq)
            return True
        mid, self.next_mid = self.next_mid, self.next_mid + 1
        sent = Sent(lane, seq, 1, 0.0)
        window.sent(mid, sent)
        self.model.outstanding[self.conn][mid] = sent
        run = (self.conn, lane.collection, self.model.retries.get(lane.collection, 0))
        self.model.delivered.setdefault(run, []).append(seq)
        return True

    def publish_head(self) -> None:
        if self.window.connected and self.window.has_room():
            mid, self.next_mid = self.next_mid, self.next_mid + 1
            sent = Sent(None, 0, 1, 0.0)
            self.window.sent(mid, sent)
            self.model.outstanding[self.conn][mid] = sent

    def ack(self, refuse: float) -> bool:
        outstanding = self.model.outstanding.get(self.conn, {})
        if not self.window.connected or not outstanding:
            return False
        mid = self.rng.choice(list(outstanding))  # any order
        sent = outstanding.pop(mid)
        failed = self.rng.random() < refuse
        ack = self.window.ack(self.conn, mid, failed)
        assert ack is not None and ack.sent is sent and ack.refused == failed
        if sent.lane is not None and not failed:
            self.model.acked[sent.lane.collection].add(sent.seq)
        return True

    def stale_ack(self) -> None:
        for conn, outstanding in self.model.outstanding.items():
            if conn != self.conn and outstanding:
                mid = next(iter(outstanding))
                assert self.window.ack(conn, mid, failed=False) is None
                return

    def retry(self) -> None:
        refused = [lane for lane in self.window.lanes.values() if lane.refused]
        if refused:
            lane = self.rng.choice(refused)
            self.window.retry(lane)  # resends from the cursor on this same connection
            self.model.retries[lane.collection] = self.model.retries.get(lane.collection, 0) + 1

    def check(self) -> None:
        window = self.window
        assert len(window) <= window.limit  # never more in flight than the window
        for name, lane in window.lanes.items():
            acked = window.acked(lane)
            # The cursor never goes back, and never passes a seq not acknowledged.
            assert acked >= self.model.cursors[name]
            self.model.cursors[name] = acked
            assert set(range(1, acked + 1)) <= self.model.acked[name], name
        # Per lane, connection and retry, seqs go out in order, one after
        # another; a seq jumped over is one that was skipped.
        for (_conn, name, _retry), seqs in self.model.delivered.items():
            for a, b in itertools.pairwise(seqs):
                assert b > a and set(range(a + 1, b)) <= self.model.acked[name], (name, seqs)

    def step(self) -> None:
        r = self.rng.random()
        if not self.window.connected:
            if r < 0.3:
                self.connect()
        elif r < 0.45:
            self.publish()
        elif r < 0.85:
            self.ack(refuse=0.03)
        elif r < 0.88:
            self.publish_head()
        elif r < 0.92:
            self.retry()
        elif r < 0.95:
            self.stale_ack()
        elif r < 0.97:
            self.window.disconnect()
        else:
            self.window.disconnect()
            self.connect()  # a reconnect straight away
        self.check()

    def finish(self) -> None:
        """A good connection at the end: everything reaches the broker and is acknowledged."""
        if not self.window.connected:
            self.connect()
        while self.window.lanes and any(lane.refused for lane in self.window.lanes.values()):
            self.retry()
        while self.publish() or self.ack(refuse=0.0):
            self.check()
        for name, lane in self.window.lanes.items():
            assert self.window.acked(lane) == self.model.heads[name], name


@pytest.mark.parametrize("seed", range(100))
def test_random_runs_keep_every_rule(seed: int) -> None:
    driver = Driver(random.Random(seed))
    for _ in range(driver.rng.randint(50, 600)):
        driver.step()
    driver.finish()
