"""Broker URLs: ``mqtt://[user[:password]@]host[:port][/topic]`` and ``mqtts://...`` (pure).

The same URL shape appears in three places: the publisher's ``--mqtt``
option, the subscriber's, and the ``rel="hub"`` links a Capability List
advertises (``mqtt://host:port/<topic>``).  One parser keeps them agreeing on
default ports (1883, and 8883 for TLS), percent-decoding of credentials and
what counts as an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from ..errors import InvalidBrokerURL as InvalidBrokerURL  # argtypes imports it from here

DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883}


@dataclass(frozen=True, slots=True)
class BrokerURL:
    """Where a broker is, how to log in, and whether to use TLS."""

    host: str
    port: int
    tls: bool
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    topic: str = ""  # the path without its leading "/", as in hub links; may be empty

    @property
    def scheme(self) -> str:
        return "mqtts" if self.tls else "mqtt"

    def redacted(self) -> str:
        """The URL for logs: the password never appears."""
        user = f"{self.username}@" if self.username else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        path = f"/{self.topic}" if self.topic else ""
        return f"{self.scheme}://{user}{host}:{self.port}{path}"


def parse_broker_url(url: str) -> BrokerURL:
    """Parse a broker URL or raise :class:`InvalidBrokerURL` saying what is wrong."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:  # bad port, unbalanced brackets
        raise InvalidBrokerURL(f"{url!r} is not a broker URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise InvalidBrokerURL(f"{url!r}: the scheme must be mqtt:// or mqtts://")
    if not parts.hostname:
        raise InvalidBrokerURL(f"{url!r} names no broker host")
    if parts.query or parts.fragment:
        raise InvalidBrokerURL(f"{url!r}: a broker URL takes no query or fragment")
    if port == 0:
        raise InvalidBrokerURL(f"{url!r}: port 0 is not a broker port")
    return BrokerURL(
        host=parts.hostname,
        port=port if port is not None else DEFAULT_PORTS[scheme],
        tls=scheme == "mqtts",
        username=unquote(parts.username) if parts.username is not None else None,
        password=unquote(parts.password) if parts.password is not None else None,
        topic=unquote(parts.path.lstrip("/")),
    )
