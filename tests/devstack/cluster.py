"""A Redis Cluster on loopback: primaries, one replica each, failover on demand.

Each node is a :class:`~.redis_server.Redis` with ``cluster-enabled yes`` on
a free port, its cluster bus on a second free port (``cluster-port``, Redis
7.0), so the usual "port + 10000" need not be free too.  The cluster is made
with the commands ``redis-cli --cluster create`` would send (``CLUSTER
ADDSLOTSRANGE``, ``SET-CONFIG-EPOCH``, ``MEET``, ``REPLICATE``), so which
replica follows which primary is ours to say, not a heuristic's.

``cluster-node-timeout`` is 1 s, so an automatic failover (a majority marks
the primary failed, its replica wins the election) takes a few seconds;
:meth:`RedisCluster.fail_over` ``kill -9``'s a primary, waits for that, and
only if it has not happened by ``takeover_after`` forces it with ``CLUSTER
FAILOVER TAKEOVER`` on the replica (reported in the return value).  Only
processes this module started are ever stopped, by their pid.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from .ports import free_port
from .process import StrPath
from .redis_server import Redis
from .waiting import wait_for

__all__ = ["ClusterNode", "Failover", "RedisCluster"]

SLOTS = 16384
NODE_TIMEOUT_MS = 1000


class ClusterNode(Redis):
    """One cluster node; its bus port follows its client port when that changes."""

    name = "redis-cluster-node"

    def __init__(self, directory: StrPath, **options: Any) -> None:
        super().__init__(directory, **options)
        self.bus_port = 0
        self._bus_for: int | None = None

    def config_text(self) -> str:
        if self._bus_for != self.port:  # first start, or a retry on another port
            self._bus_for = self.port
            self.bus_port = free_port()
        return super().config_text() + f"cluster-port {self.bus_port}\n"

    def call(self, *args: Any) -> Any:
        """One command on this node, no retries (None if the node does not answer)."""
        client = self.client(socket_timeout=1.0, socket_connect_timeout=1.0)
        try:
            return client.execute_command(*args)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            return None
        finally:
            client.close()

    def info(self, section: str) -> dict[str, Any]:
        client = self.client(socket_timeout=1.0, socket_connect_timeout=1.0)
        try:
            return dict(client.info(section))
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            return {}
        finally:
            client.close()

    def cluster_ok(self) -> bool:
        info = self.call("CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info or "")
        return "cluster_state:ok" in text

    def is_primary(self) -> bool:
        return self.info("replication").get("role") == "master"

    def replica_in_sync(self) -> bool:
        info = self.info("replication")
        return info.get("role") == "slave" and info.get("master_link_status") == "up"


@dataclass(frozen=True, slots=True)
class Failover:
    old: ClusterNode  # the primary killed (back as a replica now)
    new: ClusterNode  # its replica, promoted
    seconds: float  # from the kill to the promoted replica serving the slots
    forced: bool  # CLUSTER FAILOVER TAKEOVER was needed


class RedisCluster:
    """``primaries`` primaries with ``replicas`` replica(s) each, in ``directory``."""

    def __init__(
        self,
        directory: StrPath,
        *,
        primaries: int = 3,
        replicas: int = 1,
        appendfsync: str = "everysec",
        node_timeout_ms: int = NODE_TIMEOUT_MS,
    ) -> None:
        self.directory = Path(directory)
        config = [
            "cluster-enabled yes",
            "cluster-config-file nodes.conf",
            f"cluster-node-timeout {node_timeout_ms}",
            # A replica may always stand in, however long it was cut off (tests
            # kill and restart nodes; a stale replica is caught by WAIT anyway).
            "cluster-replica-validity-factor 0",
            # The other shards keep serving while one primary is being replaced.
            "cluster-require-full-coverage no",
            "repl-diskless-sync-delay 0",  # see sentinel.QUICK_SYNC
        ]
        count = primaries * (1 + replicas)
        self.nodes = [
            ClusterNode(
                self.directory / f"node-{i}",
                appendfsync=appendfsync,  # type: ignore[arg-type]
                extra_config=config,
            )
            for i in range(count)
        ]
        self.primary_count = primaries
        # replica -> its primary, as made (a failover swaps the roles)
        self._pairs = {
            self.nodes[primaries + r * primaries + p]: self.nodes[p]
            for p in range(primaries)
            for r in range(replicas)
        }

    @property
    def url(self) -> str:
        """The ``redis+cluster://`` URL rsnotify takes (see rsnotify.redisurl)."""
        return "redis+cluster://" + ",".join(f"{n.host}:{n.port}" for n in self.nodes) + "/"

    def start(self, timeout: float = 30.0) -> RedisCluster:
        for node in self.nodes:
            node.start()
        first = self.nodes[0]
        for i, node in enumerate(self.nodes[: self.primary_count]):
            low = i * SLOTS // self.primary_count
            high = (i + 1) * SLOTS // self.primary_count - 1
            node.call("CLUSTER", "ADDSLOTSRANGE", low, high)
            node.call("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        for node in self.nodes[1:]:
            node.call("CLUSTER", "MEET", first.host, first.port, first.bus_port)
        wait_for(
            lambda: all(self._known(n) == len(self.nodes) for n in self.nodes),
            timeout,
            interval=0.05,
            message="the nodes never all met",
        )
        for replica, primary in self._pairs.items():
            primary_id = _text(primary.call("CLUSTER", "MYID"))
            replica.call("CLUSTER", "REPLICATE", primary_id)
        self.wait_healthy(timeout)
        return self

    def _known(self, node: ClusterNode) -> int:
        return len(_text(node.call("CLUSTER", "NODES")).splitlines())

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Every node up, ``cluster_state:ok`` everywhere, every replica in sync."""
        wait_for(
            lambda: all(n.running and n.cluster_ok() for n in self.nodes),
            timeout,
            interval=0.05,
            message=lambda: f"cluster not ok: {[n.cluster_ok() for n in self.nodes]}",
        )
        wait_for(
            lambda: (
                sum(n.replica_in_sync() for n in self.nodes) == len(self.nodes) - self.primary_count
            ),
            timeout,
            interval=0.05,
            message="replicas never synced",
        )

    def primaries(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.running and n.is_primary()]

    def slot(self, key: str) -> int:
        live = next(n for n in self.nodes if n.running)
        return int(live.call("CLUSTER", "KEYSLOT", key))

    def primary_for(self, key: str) -> ClusterNode:
        """The node serving ``key``'s slot now (as a live primary sees the map)."""
        slot = self.slot(key)
        live = next(n for n in self.primaries())
        for low, high, owner, *_ in live.call("CLUSTER", "SLOTS"):
            if low <= slot <= high:
                port = int(owner[1])
                return next(n for n in self.nodes if n.port == port)
        raise AssertionError(f"slot {slot} is served by no one")

    def replica_of(self, primary: ClusterNode) -> ClusterNode:
        primary_id = _text(primary.call("CLUSTER", "MYID"))
        for node in self.nodes:
            if node is primary or not node.running:
                continue
            info = _text(node.call("CLUSTER", "NODES"))
            me = next(line for line in info.splitlines() if "myself" in line)
            if me.split()[3] == primary_id:
                return node
        raise AssertionError(f"{primary.port} has no replica")

    def fail_over(
        self, primary: ClusterNode, *, takeover_after: float = 15.0, timeout: float = 30.0
    ) -> Failover:
        """``kill -9`` ``primary``; wait for its replica's promotion; restart it as a replica."""
        replica = self.replica_of(primary)
        killed = time.monotonic()
        primary.kill()
        forced = False
        try:
            wait_for(
                lambda: replica.is_primary() and replica.cluster_ok(),
                takeover_after,
                interval=0.05,
            )
        except AssertionError:
            forced = True
            replica.call("CLUSTER", "FAILOVER", "TAKEOVER")
            wait_for(
                lambda: replica.is_primary() and replica.cluster_ok(),
                timeout,
                interval=0.05,
                message="the replica was never promoted",
            )
        seconds = time.monotonic() - killed
        primary.start()  # its nodes.conf is stale: the cluster makes it a replica
        wait_for(
            primary.replica_in_sync,
            timeout,
            interval=0.05,
            message="the old primary did not come back as a replica",
        )
        self.wait_healthy(timeout)
        return Failover(old=primary, new=replica, seconds=seconds, forced=forced)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
