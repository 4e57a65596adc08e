"""What keeps the WebSub hub from being used against others or worn out (issue 22.2).

Any client may ask a hub to call a URL of its choosing: the verification
GET, the denial GET, every delivery POST.  Unchecked, that makes the hub a
request forger (SSRF) aimed at whatever the hub can reach and the client
cannot -- Redis, the dashboard, cloud metadata, ``[::1]`` -- and a client
that asks thousands of times can fill the hub for everybody.  This module
holds the rules, pure except for the resolver adapter at the end:

Callback addresses (:class:`CallbackPolicy`)
    A callback whose host is, or resolves to, a loopback, private,
    link-local, unspecified, multicast or otherwise reserved address is
    refused, unless ``--websub-allow-callback`` names its network (CIDR) or
    its host.  The check runs when the request arrives (after DNS
    resolution: the hub answers 403 without ever contacting the callback)
    and again on every connection the hub opens (:class:`FilteringResolver`
    drops forbidden addresses from every lookup), so a name that resolves
    elsewhere later (DNS rebinding) is refused too.

Admission (:class:`Admission`)
    Subscriptions *and* verifications still pending count against three
    limits: per client address, per callback host, and in total (the
    global cap, configurable).  A request over a limit is refused at once
    (429, or 503 for the global cap) with the reason.

Log lines
    Every string a client chose (callbacks, topics, reasons) is logged
    through :func:`quote`, so a newline in a ``hub.callback`` cannot forge a
    log line.
"""

from __future__ import annotations

import ipaddress
import socket
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from aiohttp.abc import ResolveResult

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
QUOTE_LIMIT = 300


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """A client-chosen string as a log field: ``repr`` escapes newlines and controls."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        return repr(text[:limit]) + "..."
    return repr(text)


def _address(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


def forbidden(address: Address) -> str | None:
    """Why the hub must not call ``address`` by default, or None when it may."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for test, why in (
        (address.is_loopback, "loopback"),
        (address.is_unspecified, "unspecified"),
        (address.is_link_local, "link-local"),
        (address.is_multicast, "multicast"),
        (address.is_private, "private"),
        (address.is_reserved, "reserved"),
    ):
        if test:
            return why
    if not address.is_global:
        return "not globally routable"
    return None


@dataclass(frozen=True, slots=True)
class CallbackPolicy:
    """Which callback addresses the hub may call (``--websub-allow-callback``)."""

    networks: tuple[Network, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, allowed: Iterable[str]) -> CallbackPolicy:
        """``CIDR`` or bare address -> network; anything else -> a host name."""
        networks: list[Network] = []
        hosts: set[str] = set()
        for item in allowed:
            text = item.strip()
            if not text:
                raise ValueError("--websub-allow-callback: empty value")
            try:
                networks.append(ipaddress.ip_network(text.strip("[]"), strict=False))
            except ValueError:
                if "/" in text or any(c in text for c in " \t\r\n"):
                    raise ValueError(
                        f"--websub-allow-callback {text!r}: not a CIDR or host"
                    ) from None
                hosts.add(text.lower().rstrip("."))
        return cls(tuple(networks), frozenset(hosts))

    def host_allowed(self, host: str) -> bool:
        """True when ``host`` is allowed by name (then its addresses are not checked)."""
        return host.lower().rstrip(".") in self.hosts

    def check_address(self, address: Address) -> str | None:
        """Why ``address`` is refused, or None."""
        if any(address in network for network in self.networks):
            return None
        why = forbidden(address)
        return f"{address} is {why}" if why else None

    def check_literal(self, url: str) -> str | None:
        """Why the callback URL is refused, judging by its host alone (None: resolve it)."""
        host = urlsplit(url).hostname or ""
        if self.host_allowed(host):
            return None
        address = _address(host)
        if address is None:
            return None
        return self.check_address(address)

    def check_resolved(self, host: str, addresses: Sequence[str]) -> str | None:
        """Why a host is refused given its resolved addresses (every one must be allowed)."""
        if self.host_allowed(host):
            return None
        if not addresses:
            return f"{host} does not resolve"
        for text in addresses:
            address = _address(text)
            why = self.check_address(address) if address is not None else f"bad address {text}"
            if why is not None:
                return why
        return None


@dataclass(slots=True)
class Admission:
    """Subscriptions and pending verifications, counted per client, per callback host, in all.

    The hub calls :meth:`check` before accepting a request, :meth:`add` for
    each pending verification or active subscription and :meth:`remove`
    when it ends.  Counting pending ones is what keeps 1,000 callbacks that
    never answer from blocking everybody else: each client has its share.
    """

    total: int = 10_000
    per_client: int = 100
    per_host: int = 100
    _clients: Counter[str] = field(default_factory=Counter)
    _hosts: Counter[str] = field(default_factory=Counter)
    _count: int = 0

    def __post_init__(self) -> None:
        if min(self.total, self.per_client, self.per_host) < 1:
            raise ValueError("WebSub limits must be positive")

    @staticmethod
    def host_of(callback: str) -> str:
        return (urlsplit(callback).hostname or "").lower()

    def check(self, client: str, callback: str) -> tuple[int, str] | None:
        """(status, reason) when a new subscription or verification would pass a limit."""
        if self._count >= self.total:
            return 503, f"the hub holds its maximum of {self.total} subscriptions; retry later"
        if self._clients[client] >= self.per_client:
            return 429, f"too many subscriptions from this client (limit {self.per_client})"
        if self._hosts[self.host_of(callback)] >= self.per_host:
            return 429, f"too many subscriptions to this callback host (limit {self.per_host})"
        return None

    def add(self, client: str, callback: str) -> None:
        self._count += 1
        self._clients[client] += 1
        self._hosts[self.host_of(callback)] += 1

    def remove(self, client: str, callback: str) -> None:
        self._count = max(0, self._count - 1)
        for counter, key in ((self._clients, client), (self._hosts, self.host_of(callback))):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]

    @property
    def count(self) -> int:
        return self._count


class FilteringResolver:
    """An aiohttp resolver that never returns an address the policy forbids.

    Wraps aiohttp's default resolver; a lookup whose every address is
    forbidden raises :class:`OSError` (the connection fails like an
    unreachable host).  IP literals do not go through resolvers, which is
    why the hub also checks :meth:`CallbackPolicy.check_literal` before each
    request.
    """

    def __init__(self, policy: CallbackPolicy) -> None:
        from aiohttp.resolver import DefaultResolver

        self.policy = policy
        self._inner = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        if self.policy.host_allowed(host):
            return found
        kept = [r for r in found if self.policy.check_resolved(host, [r["host"]]) is None]
        if not kept:
            raise OSError(f"callback host {host} resolves only to addresses the hub may not call")
        return kept

    async def close(self) -> None:
        await self._inner.close()


async def resolve_host(host: str) -> list[str]:
    """Every address ``host`` resolves to (empty when it does not)."""
    import asyncio

    literal = _address(host)
    if literal is not None:
        return [str(literal)]
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return sorted({str(info[4][0]) for info in infos})
