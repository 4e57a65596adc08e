"""The signature on MQTT 3.1.1, which has no properties to carry it (pure).

On MQTT 5 the signature (``<key id>:sha256=<hex>``, an HMAC of the exact
payload bytes) travels beside the payload as the user property
:data:`~rsnotify.envelope.SIGNATURE_PROPERTY`.  MQTT 3.1.1 has no properties,
and a broker forwarding an MQTT 5 message to a 3.1.1 subscriber drops them,
so on a 3.1.1 connection the publisher appends the signature to the payload
in a form the payload's own format ignores:

* JSON: one more member, last: ``{...,"rsnotify-signature":"k1:sha256=..."}``
  (readers ignore unknown fields, wire contract);
* XML: a processing instruction after the root element:
  ``...</urlset><?rsnotify-signature k1:sha256=...?>`` (XML 1.0 allows
  processing instructions there; parsers skip them).

The signed bytes are the payload *without* the trailer: :func:`detach` cuts
exactly the bytes :func:`attach` added, so the HMAC is checked over what the
publisher signed, byte for byte, with no re-serialisation.  A reader that
knows nothing of this still reads the notification; an rsnotify reader
detaches first and verifies as on MQTT 5.  Nothing changes on MQTT 5, so
older subscribers keep working there.
"""

from __future__ import annotations

import json
import re

from ..envelope import SIGNATURE_PROPERTY
from ..errors import TrailerUnsupported

_NAME = SIGNATURE_PROPERTY.encode()
_JSON_TRAILER = re.compile(rb',"' + _NAME + rb'":("(?:[^"\\\x00-\x1f]|\\.){1,512}")\}[ \t\r\n]*\Z')
_XML_TRAILER = re.compile(rb"<\?" + _NAME + rb" ([!-=@-~]{1,512})\?>[ \t\r\n]*\Z")
_TAIL = 1200  # the trailer is shorter than this: search only the payload's end
_XML_SAFE = re.compile(r"[!-=@-~]{1,512}")


def attach(payload: bytes, signature: str) -> bytes:
    """The payload with ``signature`` appended in its format's own syntax."""
    if payload.startswith(b"{") and payload.endswith(b"}") and payload[1:-1].strip():
        value = json.dumps(signature, ensure_ascii=True).encode()
        return payload[:-1] + b',"' + _NAME + b'":' + value + b"}"
    if payload.lstrip().startswith(b"<"):
        if not _XML_SAFE.fullmatch(signature):
            raise TrailerUnsupported(
                f"signature {signature[:40]!r} cannot be carried in an XML processing instruction"
            )
        return payload + b"<?" + _NAME + b" " + signature.encode() + b"?>"
    raise TrailerUnsupported("only JSON and XML payloads can carry a signature trailer")


def detach(payload: bytes) -> tuple[bytes, str | None]:
    """``(signed bytes, signature)``; ``(payload, None)`` when there is no trailer."""
    start = max(0, len(payload) - _TAIL)
    tail = payload[start:]
    match = _JSON_TRAILER.search(tail)
    if match is not None:
        try:
            signature = json.loads(match.group(1))
        except ValueError:
            return payload, None
        return payload[: start + match.start()] + b"}", signature
    match = _XML_TRAILER.search(tail)
    if match is not None:
        return payload[: start + match.start()], match.group(1).decode("ascii")
    return payload, None


def check_key_id(key_id: str) -> None:
    """Refuse a signing key id that the XML trailer could not carry (at start-up, not later)."""
    attach(b"<x/>", f"{key_id}:sha256={'0' * 64}")
