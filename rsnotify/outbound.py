"""Turn a logged notification into the bytes a transport sends (pure).

The log stores each envelope once, as canonical JSON.  Every transport (MQTT,
WebSocket, WebSub) renders it the same way: stamp ``published`` with the send
time, encode in the configured format, sign the exact bytes.  Keeping this in
one place is what makes "the same notification" mean the same bytes on every
channel.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

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
    stamp = w3cdt.format(published or w3cdt.now())
    if fmt == "json":
        payload = _stamp(record.data, stamp)
    elif fmt == "xml":
        notification = envelope.from_json(record.data, max_bytes=len(record.data))
        notification.published = w3cdt.parse(stamp)
        payload = envelope.to_xml(notification)
    else:
        raise ValueError(f"unknown notification format {fmt!r}")
    signature = signer.sign(payload) if signer is not None else None
    return Rendered(seq=record.seq, payload=payload, signature=signature)


_SEQ_KEY = b',"seq":'


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
