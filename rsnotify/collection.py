"""Collection identifiers: one push channel per Capability List.

A collection id must be stable across restarts and machines (it names Redis
keys, MQTT topics and WebSocket paths), safe in all three (no ``/``, ``+``,
``#``, no leading ``$``), readable, and distinct for distinct Capability
Lists even when two Sources share a path layout.  We take host, port and path
(minus ``.xml``), fold everything outside ``[a-z0-9._-]`` to ``-`` and append
eight hex digits of the full URI's SHA-256 so that two URIs that fold to the
same text still never collide.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import urlsplit

_FOLD = re.compile(r"[^a-z0-9._-]+")
_VALID = re.compile(r"[a-z0-9][a-z0-9._-]{0,199}")


def collection_id(capability_list_uri: str) -> str:
    """The collection slug for a Capability List URI."""
    parts = urlsplit(capability_list_uri)
    host = (parts.hostname or "").lower()
    if parts.port:
        host = f"{host}-{parts.port}"
    path = parts.path
    if path.endswith(".xml"):
        path = path[: -len(".xml")]
    readable = _FOLD.sub("-", f"{host}{path}".lower()).strip("-.")[:120] or "collection"
    digest = hashlib.sha256(capability_list_uri.encode("utf-8")).hexdigest()[:8]
    return f"{readable}-{digest}"


def is_valid_collection_id(value: str) -> bool:
    """True for strings that :func:`collection_id` could have produced.

    Used to refuse hostile collection names from the network (WebSocket
    paths, MQTT topics) before they reach a Redis key or a file name.
    """
    return bool(_VALID.fullmatch(value))
