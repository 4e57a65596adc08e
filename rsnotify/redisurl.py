"""Redis URLs, Sentinel and Cluster included, turned into redis-py clients: one place for all.

redis-py reads ``redis://``, ``rediss://`` and ``unix://`` URLs but has no URL
form for Sentinel or Cluster, so this module defines one for each and parses
them here only::

    redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?sentinel_password=...]
    redis+cluster://[[user]:password@]host:port[,host:port...][/0]

Sentinel:

* ``host:port,...``: the Sentinels (at least one; give all of them, any one answers);
* ``service``: the name the Sentinels monitor (``sentinel monitor <service> ...``);
* ``db``: the database number (default 0);
* ``user``/``password``: credentials of the Redis servers (primary and replicas);
* ``sentinel_password``: the Sentinels' own ``requirepass``, if they have one.

A client for a Sentinel URL asks the Sentinels for the current primary at
every (re)connection (redis-py's ``SentinelConnectionPool``): after a failover
the next command that fails on the old primary's connection reconnects to the
promoted replica, and a demoted primary's ``READONLY`` reply is turned into a
reconnection too.

Cluster (issue 19 item 3):

* ``host:port,...``: startup nodes, any of the cluster's nodes (at least one;
  give several, so a client can start while one is down); the client learns
  the rest and the slot map (``CLUSTER SHARDS``/``SLOTS``) from them;
* no path, ``/`` or ``/0``: Redis Cluster has database 0 only (``SELECT`` is
  refused there), so any other number is refused here with that reason rather
  than silently ignored;
* ``user``/``password``: credentials of the cluster's nodes.

A client for a Cluster URL is a redis-py ``RedisCluster``: each command goes
to the primary owning its key's slot, and a ``MOVED`` reply or a lost
connection (a failover) refreshes the slot map.  What rsnotify asks of it:
every command names keys of one slot (per collection the keys share the hash
tag ``{<collection>}``; other keys are read or written one per command), and
reads over several collections are pipelines, which redis-py splits per node.
Two things cannot go through the slot routing and use :func:`primary_for`:
``WAIT`` has no key (redis-py would send it to every primary) and must follow
the write it vouches for *on the same connection* (a fresh connection's
``WAIT`` vouches for nothing).  :func:`primary_for` gives a plain client of
the primary owning a key's slot, on which a pipeline is one connection, as on a
single server, where it returns the client itself.

The log, leader leases, gateways, subscriber cursors, WebSub subscriptions,
the dashboard and telemetry all open Redis through :func:`client` so each of
them gets this.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, TypeAlias
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

__all__ = [
    "CLUSTER_SCHEME",
    "SCHEMES",
    "SENTINEL_SCHEME",
    "Client",
    "ClusterClient",
    "ClusterTarget",
    "SentinelTarget",
    "client",
    "is_cluster",
    "is_sentinel",
    "parse_cluster",
    "parse_sentinel",
    "primary_for",
    "topology_changed",
]

SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
SCHEMES = ("redis", "rediss", "unix", SENTINEL_SCHEME, CLUSTER_SCHEME)


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """A parsed ``redis+sentinel://`` URL."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterTarget:
    """A parsed ``redis+cluster://`` URL."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None


def is_sentinel(url: str) -> bool:
    return url.strip().lower().startswith(SENTINEL_SCHEME + "://")


def is_cluster(url: str) -> bool:
    return url.strip().lower().startswith(CLUSTER_SCHEME + "://")


def _credentials_and_hosts(
    parts: SplitResult, what: str
) -> tuple[str | None, str | None, tuple[tuple[str, int], ...]]:
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    hosts = []
    for item in hostlist.split(","):
        host, colon, port = item.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{item!r}: each {what} must be host:port")
        hosts.append((host.strip("[]"), int(port)))
    return username, password, tuple(hosts)


def parse_sentinel(url: str) -> SentinelTarget:
    """Parse a ``redis+sentinel://`` URL; ValueError says what is wrong with it."""
    parts = urlsplit(url.strip())
    if parts.scheme.lower() != SENTINEL_SCHEME:
        raise ValueError(f"not a {SENTINEL_SCHEME}:// URL")
    username, password, sentinels = _credentials_and_hosts(parts, "Sentinel")
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
        sentinels=sentinels,
        service=unquote(path[0]),
        db=int(path[1]) if len(path) == 2 else 0,
        username=username,
        password=password,
        sentinel_password=query.get("sentinel_password", [None])[-1],
    )


def parse_cluster(url: str) -> ClusterTarget:
    """Parse a ``redis+cluster://`` URL; ValueError says what is wrong with it."""
    parts = urlsplit(url.strip())
    if parts.scheme.lower() != CLUSTER_SCHEME:
        raise ValueError(f"not a {CLUSTER_SCHEME}:// URL")
    username, password, nodes = _credentials_and_hosts(parts, "cluster node")
    path = [p for p in parts.path.split("/") if p]
    if len(path) > 1 or (path and not path[0].isdigit()):
        raise ValueError("the path must be empty, / or /0")
    if path and int(path[0]) != 0:
        raise ValueError(
            f"database {path[0]}: Redis Cluster has only database 0 (give /0 or no path)"
        )
    if parts.query:
        raise ValueError(f"unknown parameter(s): {parts.query}")
    return ClusterTarget(nodes=nodes, username=username, password=password)


class _SentinelPool(SentinelConnectionPool):
    """Sentinel discovery; closing the client closes the connections to the Sentinels too."""

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        await self.sentinel_manager.aclose()


class _BlockingSentinelPool(_SentinelPool, aioredis.BlockingConnectionPool):
    """The same with a bounded pool whose callers wait for a free connection."""


# Any (strict module): RedisCluster's own base classes are typed, but mypy sees
# its multiple inheritance of command mixins as subclassing Any.
_RedisCluster: Any = RedisCluster


class ClusterClient(_RedisCluster):  # type: ignore[misc]
    """redis-py's ``RedisCluster``, plus one plain client per primary for :func:`primary_for`.

    ``max_connections`` (per node) bounds the connections as on a single
    server, but redis-py's cluster nodes refuse a command past the bound
    instead of waiting; so commands wait here for one of ``max_connections``
    places (at most ``pool_timeout`` seconds), and the nodes allow twice that
    (pipelines, which use one connection per node, bypass the wait).
    """

    def __init__(
        self,
        target: ClusterTarget,
        *,
        max_connections: int | None,
        pool_timeout: float,
        **options: Any,
    ) -> None:
        if target.username:
            options["username"] = target.username
        if target.password:
            options["password"] = target.password
        self._node_options = dict(options)
        self._bound = max_connections
        self._pool_timeout = pool_timeout
        self._places = asyncio.Semaphore(max_connections) if max_connections else None
        self._primaries: dict[str, aioredis.Redis] = {}
        self._stale = False
        super().__init__(
            startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
            max_connections=2 * max_connections if max_connections else 1_000,
            **options,
        )

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self._places is None:
            return await super().execute_command(*args, **kwargs)
        async with asyncio.timeout(self._pool_timeout):
            await self._places.acquire()
        try:
            return await super().execute_command(*args, **kwargs)
        finally:
            self._places.release()

    async def primary_for(self, key: str) -> aioredis.Redis:
        """A plain client of the primary that owns ``key``'s slot now (see the module)."""
        await self.initialize()
        if self._stale:
            self._stale = False
            await self.nodes_manager.initialize()
        node = self.get_node_from_key(key)
        found = self._primaries.get(node.name)
        if found is None:
            options = dict(self._node_options, host=node.host, port=node.port)
            if self._bound is None:
                found = aioredis.Redis(**options)
            else:
                found = aioredis.Redis.from_pool(
                    aioredis.BlockingConnectionPool(
                        max_connections=self._bound, timeout=self._pool_timeout, **options
                    )
                )
            self._primaries[node.name] = found
        return found

    def topology_changed(self) -> None:
        """A client from :meth:`primary_for` met a failover: read the slot map again."""
        self._stale = True

    async def aclose(self) -> None:
        primaries, self._primaries = self._primaries, {}
        for primary in primaries.values():
            await primary.aclose()
        await super().aclose()


Client: TypeAlias = "aioredis.Redis | ClusterClient"


async def primary_for(redis: Client, key: str) -> aioredis.Redis:
    """A client of the primary owning ``key``: for WAIT after a write on one connection.

    On a single server or behind Sentinel that is ``redis`` itself; in a
    cluster, a plain client of the slot's primary (kept for the next call).
    After a failover its commands fail (connection lost, or ``MOVED`` from the
    demoted node): call :func:`topology_changed` so the next call asks again.
    """
    if isinstance(redis, ClusterClient):
        return await redis.primary_for(key)
    return redis


def topology_changed(redis: Client) -> None:
    """Tell a cluster client to reread its slot map (no-op for the others)."""
    if isinstance(redis, ClusterClient):
        redis.topology_changed()


def client(
    url: str, *, max_connections: int | None = None, pool_timeout: float = 5.0, **kwargs: Any
) -> Client:
    """A client for ``url``; ``kwargs`` are redis-py connection options (timeouts, retry).

    ``max_connections``: a bounded pool that makes callers wait
    ``pool_timeout`` seconds for a free connection (instead of failing past
    redis-py's limit); None: redis-py's default pool.
    """
    if is_cluster(url):
        return ClusterClient(
            parse_cluster(url), max_connections=max_connections, pool_timeout=pool_timeout,
            **kwargs,
        )  # fmt: skip
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
