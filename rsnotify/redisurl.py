"""Redis URLs, Sentinel included, turned into redis-py clients: one place for every component.

redis-py reads ``redis://``, ``rediss://`` and ``unix://`` URLs but has no URL
form for Sentinel, so this module defines one and parses it here only::

    redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?sentinel_password=...]

* ``host:port,...``: the Sentinels (at least one; give all of them, any one answers);
* ``service``: the name the Sentinels monitor (``sentinel monitor <service> ...``);
* ``db``: the database number (default 0);
* ``user``/``password``: credentials of the Redis servers (primary and replicas);
* ``sentinel_password``: the Sentinels' own ``requirepass``, if they have one.

A client for a Sentinel URL asks the Sentinels for the current primary at
every (re)connection (redis-py's ``SentinelConnectionPool``): after a failover
the next command that fails on the old primary's connection reconnects to the
promoted replica, and a demoted primary's ``READONLY`` reply is turned into a
reconnection too.  The log, leader leases, gateways, subscriber cursors, the
dashboard and telemetry all open Redis through :func:`client` so each of them
gets this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

__all__ = [
    "SCHEMES",
    "SENTINEL_SCHEME",
    "SentinelTarget",
    "client",
    "is_sentinel",
    "parse_sentinel",
    "reply_text",
]

SENTINEL_SCHEME = "redis+sentinel"
SCHEMES = ("redis", "rediss", "unix", SENTINEL_SCHEME)


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """A parsed ``redis+sentinel://`` URL."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None


def is_sentinel(url: str) -> bool:
    return url.strip().lower().startswith(SENTINEL_SCHEME + "://")


def parse_sentinel(url: str) -> SentinelTarget:
    """Parse a ``redis+sentinel://`` URL; ValueError says what is wrong with it."""
    parts = urlsplit(url.strip())
    if parts.scheme.lower() != SENTINEL_SCHEME:
        raise ValueError(f"not a {SENTINEL_SCHEME}:// URL")
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels = []
    for item in hostlist.split(","):
        host, colon, port = item.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{item!r}: each Sentinel must be host:port")
        sentinels.append((host.strip("[]"), int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ValueError("the path must be /service_name or /service_name/db")
    if len(path) == 2 and not path[1].isdigit():
        raise ValueError(f"{path[1]!r} is not a database number")
    query = parse_qs(parts.query)
    unknown = set(query) - {"sentinel_password"}
    if unknown:
        raise ValueError(f"unknown parameter(s): {', '.join(sorted(unknown))}")
    return SentinelTarget(
        sentinels=tuple(sentinels),
        service=unquote(path[0]),
        db=int(path[1]) if len(path) == 2 else 0,
        username=username,
        password=password,
        sentinel_password=query.get("sentinel_password", [None])[-1],
    )


class _SentinelPool(SentinelConnectionPool):
    """Sentinel discovery; closing the client closes the connections to the Sentinels too."""

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        await self.sentinel_manager.aclose()


class _BlockingSentinelPool(_SentinelPool, aioredis.BlockingConnectionPool):
    """The same with a bounded pool whose callers wait for a free connection."""


def client(
    url: str, *, max_connections: int | None = None, pool_timeout: float = 5.0, **kwargs: Any
) -> aioredis.Redis:
    """A client for ``url``; ``kwargs`` are redis-py connection options (timeouts, retry).

    ``max_connections``: a bounded pool that makes callers wait
    ``pool_timeout`` seconds for a free connection (instead of failing past
    redis-py's limit); None: redis-py's default pool.
    """
    if not is_sentinel(url):
        if max_connections is None:
            return aioredis.Redis.from_url(url, **kwargs)
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=pool_timeout, **kwargs
        )
        return aioredis.Redis.from_pool(pool)
    target = parse_sentinel(url)
    sentinel_kwargs: dict[str, Any] = {
        key: kwargs[key] for key in ("socket_timeout", "socket_connect_timeout") if key in kwargs
    }
    if target.sentinel_password:
        sentinel_kwargs["password"] = target.sentinel_password
    # Any: redis-py's Sentinel is untyped; master_for returns a Redis.
    sentinel: Any = Sentinel
    manager = sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs)
    options: dict[str, Any] = dict(kwargs, db=target.db)
    if target.username:
        options["username"] = target.username
    if target.password:
        options["password"] = target.password
    if max_connections is None:
        primary: aioredis.Redis = manager.master_for(
            target.service, connection_pool_class=_SentinelPool, **options
        )
        return primary
    bounded: aioredis.Redis = manager.master_for(
        target.service,
        connection_pool_class=_BlockingSentinelPool,
        max_connections=max_connections,
        timeout=pool_timeout,
        **options,
    )
    return bounded


def reply_text(value: bytes | str) -> str:
    """A Redis reply as text, whether or not the client decodes responses."""
    return value.decode() if isinstance(value, bytes) else str(value)
