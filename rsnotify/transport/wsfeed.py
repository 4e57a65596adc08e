"""One collection's live WebSocket feed: each frame encoded once, written to many clients at once.

The gateway (:mod:`.ws`) used to feed every client from a writer task of its
own: per notification and per client a task wake-up, a frame built with that
client's ``prev`` and a ``send`` awaited -- some 20 µs of Python per frame,
so 2,000 clients at 100 notifications/s were more than a core.  Here the
common case is one pass, as ``websockets.broadcast`` does it:

* each record is encoded once, as the whole WebSocket frame an unfiltered
  client in step receives (``prev = seq - 1``; RFC 6455 section 5.2 framing
  by ``websockets.frames``, unmasked and without extensions as a server sends
  it, section 5.1), and kept in the tail's ring (:class:`FeedItem`);
* when new records enter the ring, :meth:`Feed.wake_readers` writes those
  bytes to every unfiltered client that is in the ring, open and has room in
  its write buffer, straight to its transport, in chunks of consecutive
  frames (one write per chunk, the same bytes object for every client at
  the same place); frames are appended in seq order and the client's
  :class:`~.wsproto.SendCursor` moves in the same step, so nothing can
  interleave out of order with what its own writer task sends;
* everyone else -- filtered clients (their ``prev`` differs), replays and
  catch-up, an unrenderable record (sent as ``skipped``), a client whose
  buffer is full -- is woken and served by its writer task as before.

Bounded buffers, as before.  A chunk is cut to the room left below the
gateway's ``write_limit`` (at least one frame), and a full buffer hands the
client to its writer, whose ``send`` waits for the buffer to drain; the ring
moves on meanwhile and a client left behind it is ``skipped``.  Unlike
``websockets.broadcast``, which writes to every connection whatever its
buffer holds, a slow client therefore costs at most ``write_limit`` plus two
frames (a chunk's first frame and the writer's one).
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.frames import Frame, Opcode
from websockets.protocol import State

from ..log import NotificationLog
from . import wsproto
from .tail import LogTail
from .wsproto import SendCursor

__all__ = ["Client", "Feed", "FeedItem", "Stream", "feed_item"]


@dataclass(frozen=True, slots=True)
class FeedItem:
    """One rendered record: what filters need, and its frame encoded once for everyone.

    ``wire`` is the whole WebSocket frame of the notification with
    ``prev = seq - 1``; its last ``tail_len`` bytes are the client-independent
    end (:func:`~.wsproto.notification_tail`) from which any other ``prev``'s
    frame is built.  ``wire`` is None when the record could not be rendered
    (it is sent as a one-seq skip).
    """

    seq: int
    loc: str
    change: str
    wire: bytes | None
    tail_len: int = 0
    read_at: float = 0.0  # loop time the tailer read it (0: read for a replay)

    @property
    def tail(self) -> memoryview:
        assert self.wire is not None
        return memoryview(self.wire)[len(self.wire) - self.tail_len :]


def feed_item(
    collection: str, seq: int, loc: str, change: str, tail: bytes | None, read_at: float = 0.0
) -> FeedItem:
    """Encode a record's frame once: the bytes every unfiltered client in step is sent."""
    if tail is None:
        return FeedItem(seq, loc, change, None, 0, read_at)
    frame = wsproto.notification_frame(collection, seq, seq - 1, tail)
    wire = Frame(Opcode.TEXT, frame).serialize(mask=False)
    return FeedItem(seq, loc, change, wire, len(tail), read_at)


@dataclass(eq=False)
class Client:
    """One connection: its streams and the wake-up of its writer task."""

    ws: ServerConnection
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    streams: list[Stream] = field(default_factory=list)
    running: bool = False  # its writer runs: every hello is out, notifications may follow
    log_behind: bool = False  # a replay found its records not in the log yet: look again soon


@dataclass(slots=True, eq=False)
class Stream:
    """One client's subscription to one collection: a reader of that collection's feed."""

    cursor: SendCursor
    feed: Feed
    client: Client
    shared: bool  # unfiltered, no extension: every frame it gets is the shared one

    @property
    def wake(self) -> asyncio.Event:
        return self.client.wake


@dataclass(slots=True)
class _Run:
    """Consecutive frames as one sequence of bytes: where each ends, and the joins made so far."""

    ends: list[int]  # ends[i]: bytes of frames first..first+i
    items: list[bytes]
    joined: dict[int, bytes] = field(default_factory=dict)  # count -> bytes of that many frames

    def fits(self, room: int) -> bool:
        """Whether all the frames fit ``room`` (and there is at least one)."""
        return bool(self.items) and self.ends[-1] <= room

    def first(self, count: int) -> bytes:
        """The first ``count`` frames as one bytes object, joined once for every client."""
        data = self.joined.get(count)
        if data is None:
            data = self.items[0] if count == 1 else b"".join(self.items[:count])
            self.joined[count] = data
        return data


class Feed(LogTail[FeedItem, Stream]):
    """The live feed of one collection (:class:`~.tail.LogTail`) that writes shared frames itself.

    ``on_sent(seq)`` is called once per record, when its frame is first
    written to a client (the gateway's ``on_published``).  ``progress`` and
    ``progressed`` tell the gateway's pacing that some client moved.
    """

    def __init__(
        self,
        log: NotificationLog,
        collection: str,
        position: int,
        capacity: int,
        render: Callable[[Any, float], FeedItem],
        *,
        batch: int,
        write_limit: int,
        on_sent: Callable[[FeedItem], None],
    ) -> None:
        super().__init__(log, collection, position, capacity, render, batch=batch)
        self.write_limit = write_limit
        self.progress = asyncio.Event()  # set when a client was sent frames from the ring
        self.progressed = 0.0  # loop time of that
        self.announced = position  # last seq passed to on_sent
        self.shared_frames = 0  # frames written as shared bytes (a cost metric)
        self._on_sent = on_sent

    def fastest(self) -> int | None:
        """The furthest position any reader of this feed has been sent up to."""
        return max((s.cursor.position for s in self.readers), default=None)

    def wake_readers(self) -> None:
        """Write the new frames to every client that can take them; wake the others.

        The hot loop: 2,000 clients at 100 records/s are 200,000 passes a
        second, so it reads each attribute once and tests the common case
        (a shared stream in step, room in its buffer) before anything else.
        """
        runs: dict[int, _Run] = {}  # clients at the same place share their bytes
        window_start, position = self.window_start, self.position
        furthest = 0
        for stream in self.readers:
            cursor = stream.cursor
            if cursor.position >= position:
                continue
            client = stream.client
            if client.running and stream.shared and self._write(stream, runs, window_start):
                furthest = max(furthest, cursor.position)
            if cursor.position < position:
                client.wake.set()
        if furthest:
            self.sent(furthest)

    def write_ahead(self, stream: Stream) -> bool:
        """Write shared frames from the ring while ``stream``'s buffer has room; False if none.

        For the client's writer task, catching up within the ring.  Nothing
        is awaited: the cursor moves with each write, so the writer and this
        feed's pass can both write for one stream without reordering.
        """
        if not self._write(stream, {}, self.window_start):
            return False
        self.sent(stream.cursor.position)
        return True

    def _write(self, stream: Stream, runs: dict[int, _Run], window_start: int) -> bool:
        ws = stream.client.ws
        if not stream.shared or ws.protocol.state is not State.OPEN:
            return False
        cursor, transport, position = stream.cursor, ws.transport, self.position
        wrote = False
        # cursor.plan(...) == FROM_RING, spelled out: this runs once per client and record.
        while window_start <= cursor.position + 1 <= position:
            cursor.live = True
            room = self.write_limit - transport.get_write_buffer_size()
            if room <= 0 or transport.is_closing():
                break
            first = cursor.position + 1
            run = runs.get(first)
            if run is None:
                run = runs[first] = self._run(first)
            if run.fits(room):  # the common case: everything new fits
                last, data = first + len(run.items) - 1, run.first(len(run.items))
            else:
                chunk = self._chunk(first, room, run)
                if chunk is None:  # unrenderable: the writer sends it as skipped
                    break
                last, data = chunk
            transport.write(data)
            self.shared_frames += last - cursor.position
            # cursor.send_shared(last), without its checks: a shared stream's
            # filter keeps everything, and last > position by construction.
            cursor.position = cursor.prev = last
            wrote = True
        return wrote

    def sent(self, seq: int) -> None:
        """A client was written frames up to ``seq`` from the ring."""
        self.progressed = asyncio.get_running_loop().time()
        self.progress.set()
        start = max(self.announced + 1, self.window_start)
        for announced in range(start, seq + 1):
            self._on_sent(self.item(announced))
        self.announced = max(self.announced, seq)

    def _chunk(self, first: int, room: int, run: _Run) -> tuple[int, bytes] | None:
        """The last seq and bytes of the frames from ``first`` that fit ``room`` (at least one)."""
        if not run.items:
            return None
        count = max(1, bisect_right(run.ends, room))
        return first + count - 1, run.first(count)

    def _run(self, first: int) -> _Run:
        """Frames from ``first`` on: as many as any buffer has room for, none unrenderable."""
        ends: list[int] = []
        items: list[bytes] = []
        total = 0
        for seq in range(first, self.position + 1):
            wire = self.item(seq).wire
            if wire is None or total >= self.write_limit:
                break
            total += len(wire)
            ends.append(total)
            items.append(wire)
        return _Run(ends, items)
