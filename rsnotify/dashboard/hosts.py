"""Which ``Host`` and ``Origin`` the dashboard answers: DNS rebinding and cross-site WebSockets.

Two attacks from a web page the operator happens to visit:

* **DNS rebinding.**  ``evil.example`` first resolves to the attacker's
  server, then to ``127.0.0.1``; the page's scripts, still same-origin with
  ``http://evil.example:8080``, now read the dashboard's ``/api`` and
  ``/metrics``.  The browser sends ``Host: evil.example:8080``, so every
  request whose ``Host`` is not a name the dashboard was configured with is
  refused (403).  Allowed: IP literals (a page can only be same-origin with
  an IP literal by being served from it, and then it is the dashboard or
  another port, which is another origin), ``localhost``, the ``--host`` the
  dashboard binds, and each ``--allow-host NAME`` (``*``: any name).
* **Cross-site WebSocket.**  Browsers do not apply the same-origin policy to
  WebSockets: any page could open ``ws://127.0.0.1:8080/ws`` and read every
  snapshot.  A browser always sends ``Origin`` on a WebSocket handshake, so
  ``/ws`` requires it to be the dashboard's own origin (scheme http(s), and
  the host and port the request was sent to) or one of
  ``--allow-ws-origin ORIGIN``.  A handshake without ``Origin`` comes from a
  program, not a page, and is served.

Pure functions; :mod:`.server` applies them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from urllib.parse import urlsplit

ANY = "*"
DEFAULT_PORTS = {"http": 80, "https": 443}


def split_host(header: str | None) -> tuple[str, int | None] | None:
    """``Host`` header -> (lower-case name without a trailing dot, port); None if malformed."""
    if not header or any(c.isspace() for c in header):
        return None
    try:
        parts = urlsplit(f"//{header}")
        name, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not name or parts.username is not None or parts.path:
        return None
    return name.rstrip("."), port


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def normal_host(name: str) -> str:
    """An ``--allow-host`` or ``--host`` value as :func:`split_host` spells names."""
    return name.strip().strip("[]").rstrip(".").lower()


def host_allowed(header: str | None, bind_host: str, allowed: Collection[str]) -> bool:
    """May a request with this ``Host`` header be answered?"""
    found = split_host(header)
    if found is None:
        return False
    name = found[0]
    if _is_ip(name) or name == "localhost" or ANY in allowed:
        return True
    return name == normal_host(bind_host) or name in {normal_host(a) for a in allowed}


def normal_origin(origin: str) -> str | None:
    """``scheme://host:port`` with the default port spelled out; None if not an http(s) origin."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return None
    host = parts.hostname.rstrip(".")
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port or DEFAULT_PORTS[scheme]}"


def origin_allowed(
    origin: str | None, host_header: str | None, secure: bool, allowed: Collection[str]
) -> bool:
    """May a WebSocket handshake with this ``Origin`` be accepted?"""
    if origin is None:
        return True  # not sent by a browser: no page of somebody else's is involved
    if ANY in allowed:
        return True
    mine = normal_origin(origin)
    if mine is None:  # "null" (sandboxed frames, file://) or garbage
        return False
    if mine in {normal_origin(a) for a in allowed}:
        return True
    found = split_host(host_header)
    if found is None:
        return False
    scheme = "https" if secure else "http"
    name, port = found
    return mine == normal_origin(f"{scheme}://{_bracket(name)}:{port or DEFAULT_PORTS[scheme]}")


def _bracket(name: str) -> str:
    return f"[{name}]" if ":" in name else name
