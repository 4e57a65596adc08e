"""Real Mosquitto, NATS, Redis, web servers and rsnotify processes on loopback, and waiting.

Used by the test suite, ``make demo`` (:mod:`tests.demo`), the chaos and soak
runs and the benchmarks.  It lives here, outside the ``rsnotify`` package,
because it is test infrastructure: it kills process groups, installs an
``atexit`` hook and a SIGTERM handler, and needs ``psutil``; none of that
belongs in a library that operators import.

Integration tests run against the real brokers rsnotify meets in production,
never mocks: a mock cannot reproduce a broker that restarts, stalls or drops
a queue.  Each service runs as our own child process on a free loopback port
(brokers already running on 1883/6379 belong to someone else and are never
touched), in its own directory, with its output captured to files so a
failing test can show what the process said.

One job per module:

* :mod:`.waiting`: :func:`wait_for` / :func:`async_wait_for`, which poll a
  condition until a deadline instead of sleeping and hoping;
* :mod:`.ports`: free loopback ports, and which process listens on one;
* :mod:`.process`: :class:`ManagedProcess`, a child with captured output
  that is always reaped;
* :mod:`.service`: :class:`Service`, the start/stop/restart/pause lifecycle
  of a server on a fixed port;
* :mod:`.brokers`, :mod:`.redis_server`, :mod:`.static`: the servers
  themselves (Mosquitto, NATS, Redis, nginx, ``python -m http.server``);
* :mod:`.sentinel`: a Redis primary, replicas and Sentinels, with failover;
* :mod:`.cluster`: a Redis Cluster (primaries with replicas), with failover.

Importing this package changes no global state; the first
:meth:`ManagedProcess.start` installs the safety nets (see :mod:`.process`).
"""

from __future__ import annotations

from .brokers import Mosquitto, NatsServer, mosquitto_password_line, mqtt_connack
from .cluster import ClusterNode, Failover, RedisCluster
from .ports import HOST, free_port
from .process import STOP_TIMEOUT, ManagedProcess, OutputMark, StrPath, rsnotify_command
from .redis_server import Redis
from .sentinel import Sentinel, SentinelGroup
from .service import Service
from .static import HttpServer, Nginx
from .waiting import DEFAULT_TIMEOUT, async_wait_for, wait_for

__all__ = [
    "DEFAULT_TIMEOUT",
    "HOST",
    "STOP_TIMEOUT",
    "ClusterNode",
    "Failover",
    "HttpServer",
    "ManagedProcess",
    "Mosquitto",
    "NatsServer",
    "Nginx",
    "OutputMark",
    "Redis",
    "RedisCluster",
    "Sentinel",
    "SentinelGroup",
    "Service",
    "StrPath",
    "async_wait_for",
    "free_port",
    "mosquitto_password_line",
    "mqtt_connack",
    "rsnotify_command",
    "wait_for",
]
