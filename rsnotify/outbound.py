"""Turn a logged notification into the bytes a transport sends (pure).

The log stores each envelope once, as canonical JSON.  Every transport (MQTT,
WebSocket, WebSub) renders it the same way: stamp ``published`` with the send
time, encode in the configured format, sign the exact bytes.  Keeping this in
one place is what makes "the same notification" mean the same bytes on every
channel.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from . import envelope, w3cdt
from .log import LogRecord


@dataclass(frozen=True, slots=True)
class Signer:
    """The current signing key (id and secret) plus older keys still accepted."""

    key_id: str
    secret: bytes

    def sign(self, payload: bytes) -> str:
        return envelope.sign(payload, self.secret, self.key_id)


@dataclass(frozen=True, slots=True)
class Rendered:
    seq: int
    payload: bytes
    signature: str | None


def render(
    record: LogRecord,
    *,
    fmt: str = "json",
    signer: Signer | None = None,
    published: datetime | None = None,
) -> Rendered:
    """The payload for one log record in ``fmt`` (``json`` or ``xml``), signed if asked."""
    stamp = w3cdt.format(published) if published is not None else published_now()
    if fmt == "json":
        payload = _stamp(_without_from(record.data), stamp)
    elif fmt == "xml":
        notification = envelope.from_json(record.data, max_bytes=len(record.data))
        notification.published = w3cdt.parse(stamp)
        payload = envelope.to_xml(notification)
    else:
        raise ValueError(f"unknown notification format {fmt!r}")
    signature = signer.sign(payload) if signer is not None else None
    return Rendered(seq=record.seq, payload=payload, signature=signature)


class Renderer:
    """:func:`render` with a memory: each record is rendered once per process.

    A publisher runs MQTT, WebSocket (and WebSub) side by side on the same
    records, moments apart.  Sharing one renderer gives every transport the
    same bytes, the same ``published`` stamp and the same signature for a
    notification (a redelivery after a reconnect included), and spends the
    stamp and the HMAC once instead of once per transport.  Bounded (``size``
    records and ``max_bytes`` of payload): an older record is rendered again
    if asked for (a slow WebSocket client replaying), with a fresh stamp.
    """

    __slots__ = ("_bytes", "_done", "fmt", "max_bytes", "signer", "size")

    def __init__(
        self,
        fmt: str = "json",
        signer: Signer | None = None,
        size: int = 16384,
        max_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        if fmt not in ("json", "xml"):
            raise ValueError(f"unknown notification format {fmt!r}")
        self.fmt = fmt
        self.signer = signer
        self.size = size
        self.max_bytes = max_bytes
        # OrderedDict: popping a plain dict's first key again and again scans
        # the deleted slots before it (quadratic until the dict resizes).
        self._done: OrderedDict[tuple[str, int], Rendered] = OrderedDict()
        self._bytes = 0

    def render(self, collection: str, record: LogRecord) -> Rendered:
        key = (collection, record.seq)
        done = self._done.get(key)
        if done is None:
            done = self._done[key] = render(record, fmt=self.fmt, signer=self.signer)
            self._bytes += len(done.payload)
            while len(self._done) > self.size or self._bytes > self.max_bytes:
                self._bytes -= len(self._done.popitem(last=False)[1].payload)
        return done


_second: list[object] = [None, ""]  # [whole second, its "YYYY-MM-DDThh:mm:ss" text]


def published_now() -> str:
    """The current UTC time as ``YYYY-MM-DDThh:mm:ss.ffffffZ``, for ``published``.

    Every notification a transport sends is stamped: formatting a datetime
    each time was ~5% of the publisher's CPU.  Only the date and time of day
    are formatted, once a second; the microseconds are appended.  Always six
    fraction digits (``isoformat`` drops them on a whole second): the same
    instant, one fixed width.
    """
    ns = time.time_ns()
    second, micros = divmod(ns // 1000, 1_000_000)
    cached = _second
    if cached[0] != second:
        text = datetime.fromtimestamp(second, UTC).replace(tzinfo=None).isoformat()
        cached[0], cached[1] = second, text
    return f"{cached[1]}.{micros:06d}Z"


_SEQ_KEY = b',"seq":'
_FROM_KEY = b',"from":"'


def _without_from(data: bytes) -> bytes:
    """The logged envelope less ``"from"``: the JSON wire form stays as it was.

    ``from`` (the previous change's datetime) is what the Change Notification
    XML needs for its interval; JSON Destinations have the sequence number.
    Its value is a W3C datetime, which holds no quote.
    """
    at = data.find(_FROM_KEY)
    if at < 0:
        return data
    end = data.find(b'"', at + len(_FROM_KEY))
    return data[:at] + data[end + 1 :] if end > 0 else data


def _stamp(data: bytes, stamp: str) -> bytes:
    """Add ``"published"`` to a canonical envelope, keeping it canonical.

    The log holds canonical JSON (sorted keys, compact), and ``"published"``
    sorts immediately before ``"seq"``, which every envelope has: inserting the
    bytes there gives exactly what decoding, adding the key and encoding would,
    at a fraction of the cost.  Anything unexpected takes the long way.
    """
    at = data.find(_SEQ_KEY)
    if at > 0 and b'"published"' not in data and data.count(_SEQ_KEY) == 1:
        prefix = data[:at]
        # No key may sort between "published" and "seq": ensure the one before
        # "seq" sorts before "published" by checking the last key's name.
        last_key = prefix[prefix.rfind(b',"') + 2 : prefix.rfind(b'":')]
        if last_key < b"published":
            return b'%s,"published":"%s"%s' % (prefix, stamp.encode(), data[at:])
    obj = json.loads(data)
    obj["published"] = stamp
    return envelope.dumps(obj)


def head_message(
    collection: str, head: int, earliest: int, *, publisher: str, now: datetime | None = None
) -> bytes:
    """The retained ``head`` message / WebSocket ``hello`` body: where the log stands."""
    body: Mapping[str, object] = {
        "type": "head",
        "collection": collection,
        "head": head,
        "earliest": earliest,
        "heartbeat": w3cdt.format(now or w3cdt.now()),
        "publisher": publisher,
    }
    return envelope.dumps(body)
