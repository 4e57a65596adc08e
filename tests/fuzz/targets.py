"""Fuzz targets: every entry point that reads bytes an attacker controls (pure, no I/O).

Each target takes one input and returns normally when rsnotify answered it
the documented way: a value, or one of the exceptions listed here (all from
:mod:`rsnotify.errors` and its families).  Any other exception escapes and is
the finding: it would kill a paho thread, end a WebSocket handler with 1011,
or skip the "drop it and catch up" path callers rely on.

Where something parses, the targets also check it survives a round trip
(serialize, parse again, same value): a Destination re-serializes what it
read (the XML notification form, the Change Lists a publisher writes), so a
value that parses but cannot be written again is a crash waiting downstream.

The same functions back the hypothesis tests (values from
:mod:`tests.fuzz.strategies`) and the atheris runner (raw bytes).
"""

from __future__ import annotations

from dataclasses import replace

from rsnotify import envelope, sitemap
from rsnotify.envelope import InvalidNotification, SignatureError
from rsnotify.errors import DocumentError
from rsnotify.transport import wsproto
from rsnotify.transport.wsproto import InvalidSubscription

#: Small enough that a fuzzer reaches the size and count limits quickly.
FUZZ_LIMITS = sitemap.Limits(max_bytes=1 << 20, max_entries=1000, chunk_size=1 << 16)
#: The same document read in tiny chunks: element boundaries fall mid-chunk.
TINY_CHUNKS = sitemap.Limits(max_bytes=1 << 20, max_entries=1000, chunk_size=7)
KEYS = {"k1": b"fuzz-secret", "k2": b"second key"}


# --- (a) the document parser --------------------------------------------------------


def sitemap_document(data: bytes) -> None:
    """sitemap.parse: a Document or a DocumentError; what parses serializes and re-parses."""
    try:
        document = sitemap.parse(data, limits=FUZZ_LIMITS, allow_unordered=True)
    except DocumentError:
        _streamed_refuses_too(data)
        return
    streamed = list(sitemap.iter_entries(data, limits=TINY_CHUNKS, allow_unordered=True))
    assert streamed == document.entries, "chunk boundaries changed what was read"
    again = sitemap.parse(sitemap.serialize(document), limits=FUZZ_LIMITS, allow_unordered=True)
    assert again == document, "serialize -> parse changed the document"


def _streamed_refuses_too(data: bytes) -> None:
    """The streaming reader may yield some entries first, but must end the same way."""
    try:
        for _ in sitemap.iter_entries(data, limits=TINY_CHUNKS, allow_unordered=True):
            pass
    except DocumentError:
        return
    # parse() also enforces MAX_ENTRIES_PER_DOCUMENT-style limits the stream shares;
    # anything else it refused, the stream must refuse as well.
    raise AssertionError("parse() refused a document the streaming reader accepted")


# --- (b) the envelope decoder ---------------------------------------------------------


def envelope_payload(data: bytes) -> None:
    """envelope.decode: a Notification or InvalidNotification; decoded ones re-encode."""
    try:
        notification = envelope.decode(data)
    except InvalidNotification:
        return
    for fmt in ("json", "xml"):
        again = envelope.decode(envelope.encode(notification, fmt))
        assert _same(again) == _same(notification), f"{fmt} round trip changed it"


def _same(n: envelope.Notification) -> envelope.Notification:
    """The notification as both forms carry it: XML has one lastmod slot for two equal times."""
    lastmod = None if n.lastmod == n.datetime else n.lastmod
    return replace(n, lastmod=lastmod, received=None)


def envelope_signature(data: bytes, signature: str | None) -> None:
    """envelope.verify: silence or SignatureError, whatever the signature string."""
    try:
        envelope.verify(data, signature, KEYS)
    except SignatureError:
        return


# --- (c) the WebSocket frame handler --------------------------------------------------


def ws_server_frame(data: str | bytes) -> None:
    """What a subscriber does with a server frame: parse it, decode a notification's payload.

    Only InvalidNotification may escape: ``WebSocketChannel`` catches exactly that.
    """
    frame = _parse_frame(data)
    if isinstance(frame, wsproto.Notification):
        try:
            envelope.decode(frame.payload)
        except InvalidNotification:
            return


def _parse_frame(data: str | bytes) -> wsproto.Frame | None:
    try:
        return wsproto.parse_frame(data)
    except InvalidNotification:
        return None


def ws_request_target(target: str) -> None:
    """What the gateway does with a handshake's request target and headers.

    The gateway catches InvalidSubscription only; the token helpers must never raise.
    """
    wsproto.query_token(target)
    wsproto.bearer_token(target)
    try:
        wsproto.parse_target(target)
    except InvalidSubscription:
        return


def ws_client_frame(data: str | bytes) -> None:
    """The gateway reading a client's subscribe frame: a Subscription or InvalidSubscription."""
    try:
        subscription = wsproto.parse_subscribe(data)
    except InvalidSubscription:
        return
    # What the gateway accepted, a client can ask for again in the same words.
    frame = wsproto.subscribe_frame(
        subscription.collections,
        prefix=subscription.filter.prefix,
        change=subscription.filter.changes,
    )
    assert wsproto.parse_subscribe(frame) == subscription


# --- raw-bytes entry points (atheris, seeds) ------------------------------------------


def _text(data: bytes) -> str:
    """Bytes as the text a WebSocket library hands over (invalid UTF-8 kept as surrogates)."""
    return data.decode("utf-8", "surrogateescape")


def raw_ws_server(data: bytes) -> None:
    ws_server_frame(data)
    ws_server_frame(_text(data))


def raw_ws_client(data: bytes) -> None:
    text = data.decode("ascii", "surrogateescape")  # request lines arrive as ASCII
    ws_request_target(text)
    ws_client_frame(data)
    ws_client_frame(_text(data))


def raw_envelope(data: bytes) -> None:
    envelope_payload(data)
    head, _, tail = data.partition(b"\n")
    envelope_signature(tail, _text(head))


RAW_TARGETS = {
    "sitemap": sitemap_document,
    "envelope": raw_envelope,
    "ws-server": raw_ws_server,
    "ws-client": raw_ws_client,
}
