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
Two things cannot go through the slot routing and use :class:`Primaries`:
``WAIT`` has no key (redis-py would send it to every primary) and must follow
the write it vouches for *on the same connection* (a fresh connection's
``WAIT`` vouches for nothing).  :class:`Primaries` gives a plain client of
the primary owning a key's slot, on which a pipeline is one connection, as on a
single server, where it gives the client itself.

The log, leader leases, gateways, subscriber cursors, WebSub subscriptions,
the dashboard and telemetry all open Redis through :func:`client` so each of
them gets this.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeAlias
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

__all__ = [
    "CLUSTER_SCHEME",
    "SCHEMES",
    "SENTINEL_SCHEME",
    "Client",
    "ClusterClient",
    "ClusterTarget",
    "Primaries",
    "SentinelTarget",
    "client",
    "is_cluster",
    "is_sentinel",
    "parse_cluster",
    "parse_sentinel",
    "reply_text",
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
    """redis-py's ``RedisCluster``, with connection places to wait for (below).

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
        self.node_options = dict(options)  # for Primaries' plain clients
        self.max_connections_per_node = max_connections
        self.pool_timeout = pool_timeout
        self._places = asyncio.Semaphore(max_connections) if max_connections else None
        super().__init__(
            startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
            max_connections=2 * max_connections if max_connections else 1_000,
            **options,
        )

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self._places is None:
            return await _closed_under_us(super().execute_command(*args, **kwargs))
        async with asyncio.timeout(self.pool_timeout):
            await self._places.acquire()
        try:
            return await _closed_under_us(super().execute_command(*args, **kwargs))
        finally:
            self._places.release()

    def register_script(self, script: Any) -> Any:
        return _ClusterScript(self, script)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        if shard_hint:
            raise ValueError("a cluster pipeline takes no shard_hint")
        # Ignored: redis-py declares _event_dispatcher abstract on a mixin that
        # ClusterPipeline sets at run time; RedisCluster.pipeline does just this.
        return _ClusterPipeline(self, transaction)  # type: ignore[abstract]


class _ClusterScript(AsyncScript):
    """A script that runs by its text when ``EVALSHA`` still finds no script after loading.

    A replica promoted by a failover has an empty script cache (Redis does not
    replicate it), and redis-py's retry, ``SCRIPT LOAD`` to every primary,
    goes by the slot map it had, which may not list the new primary yet; the
    second ``EVALSHA`` then fails as the first did.  ``EVAL`` with the text
    works on whichever node owns the slot (and caches the script there).
    """

    async def __call__(
        self, keys: Any = None, args: Any = None, client: Any = None
    ) -> Any:  # Any: the signature of redis-py's untyped AsyncScript.__call__
        try:
            return await super().__call__(keys, args, client)
        except NoScriptError:
            keys, args = list(keys or []), list(args or [])
            # Any: a Redis or RedisCluster, either way with eval(); the text is a str.
            target: Any = self.registered_client if client is None else client
            return await target.eval(self.script, len(keys), *keys, *args)


class _ClusterPipeline(ClusterPipeline):
    """redis-py's cluster pipeline; a connection closed under it is a ConnectionError."""

    __slots__ = ()

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        return await _closed_under_us(super().execute(raise_on_error, allow_redirections))


async def _closed_under_us(command: Awaitable[Any]) -> Any:
    """Await a cluster command; the connection closed under it is a ConnectionError.

    redis-py 8.1's cluster client, to force a new slot map after a failover
    (``CLUSTERDOWN``, repeated ``MOVED``), closes every node's connections,
    those in use by other commands too; such a command then finds its socket
    gone, which surfaces as AttributeError (``'NoneType' object has no
    attribute 'writelines'``).  That is a lost connection like any other:
    callers retry those, and an AttributeError would instead have stopped a
    collection's detection for good.
    """
    try:
        return await command
    except AttributeError as exc:
        raise RedisConnectionError(f"connection closed during a command: {exc}") from exc


Client: TypeAlias = "aioredis.Redis | ClusterClient"


class Primaries:
    """Plain clients of the primaries owning keys' slots: for ``WAIT`` after a write.

    ``WAIT`` must follow the write it vouches for on one connection to the
    primary holding it (see the module).  On a single server or behind
    Sentinel, :meth:`of` is the client itself; in a cluster, a plain client
    of the slot's primary now, kept for the next call.  After a failover its
    commands fail (a lost connection, or ``MOVED`` from the demoted node):
    call :meth:`topology_changed` and the next :meth:`of` reads the slot map
    again.  Owned and closed by its user, not by the cluster client, whose
    ``aclose`` redis-py also calls internally to force a new slot map.
    """

    def __init__(self, redis: Client) -> None:
        self.redis = redis
        self._clients: dict[str, aioredis.Redis] = {}
        self._stale = False

    async def of(self, key: str) -> aioredis.Redis:
        cluster = self.redis
        if not isinstance(cluster, ClusterClient):
            return cluster
        await cluster.initialize()
        if self._stale:
            self._stale = False
            await cluster.nodes_manager.initialize()
        node = cluster.get_node_from_key(key)
        found = self._clients.get(node.name)
        if found is None:
            options = dict(cluster.node_options, host=node.host, port=node.port)
            bound = cluster.max_connections_per_node
            if bound is None:
                found = aioredis.Redis(**options)
            else:
                pool = aioredis.BlockingConnectionPool(
                    max_connections=bound, timeout=cluster.pool_timeout, **options
                )
                found = aioredis.Redis.from_pool(pool)
            self._clients[node.name] = found
        return found

    def topology_changed(self) -> None:
        self._stale = True

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        for found in clients.values():
            await found.aclose()


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


def reply_text(value: bytes | str) -> str:
    """A Redis reply as text, whether or not the client decodes responses."""
    return value.decode() if isinstance(value, bytes) else str(value)
