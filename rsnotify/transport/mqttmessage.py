"""What one PUBLISH of the pusher carries besides its topic: payload bytes and properties.

MQTT 5: the signature travels as a user property named
:data:`rsnotify.envelope.SIGNATURE_PROPERTY`, with the content type and the
UTF-8 payload format indicator set.  MQTT 3.1.1 has no properties: the
signature then travels at the end of the payload, in the payload format's
own syntax (:mod:`.mqttsig`).  Pure: nothing here talks to a broker.
"""

from __future__ import annotations

from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from ..envelope import SIGNATURE_PROPERTY
from . import mqttsig

__all__ = ["CONTENT_TYPES", "MessageForm", "PackedOnce"]

CONTENT_TYPES = {"json": "application/json", "xml": "application/xml"}


class PackedOnce(Properties):
    """PUBLISH properties that serialise themselves once.

    paho calls ``pack()`` for every message it sends, and ``pack()`` probes
    all ~40 property names with ``hasattr``: ~8% of the publisher's CPU in a
    burst, for bytes that never change (the pusher never edits properties
    after building them).  Any later assignment drops the cached bytes.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        object.__setattr__(self, "_packed", None)

    def pack(self) -> bytes:
        packed: bytes | None = getattr(self, "_packed", None)
        if packed is None:
            packed = super().pack()
            object.__setattr__(self, "_packed", packed)
        return packed


class MessageForm:
    """Builds ``(payload, properties)`` for a payload, its content type and signature."""

    def __init__(self) -> None:
        self._plain: dict[str, Properties] = {}

    def build(
        self, payload: bytes, content_type: str, signature: str | None, *, v5: bool
    ) -> tuple[bytes, Properties | None]:
        if v5:
            return payload, self.properties(content_type, signature)
        if signature is not None:
            return mqttsig.attach(payload, signature), None
        return payload, None

    def properties(self, content_type: str, signature: str | None) -> Properties:
        if signature is None:
            # Unsigned properties are the same for every message: build them once
            # (paho packs them per publish; building them was ~13% of the CPU).
            cached = self._plain.get(content_type)
            if cached is None:
                cached = self._plain[content_type] = _new_properties(content_type, None)
            return cached
        return _new_properties(content_type, signature)


def _new_properties(content_type: str, signature: str | None) -> Properties:
    props = PackedOnce(PacketTypes.PUBLISH)
    props.ContentType = content_type
    props.PayloadFormatIndicator = 1  # UTF-8 text
    if signature is not None:
        props.UserProperty = [(SIGNATURE_PROPERTY, signature)]
    return props
