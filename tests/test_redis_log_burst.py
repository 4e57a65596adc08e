"""Found by the soak (tests/chaos/soak.py): a burst of log readers was refused.

200 WebSocket clients connecting at once each read the Redis log; redis-py's
asyncio pool allows 100 connections by default and raised "Too many
connections" beyond, which the gateway reported as "Redis unavailable" and
refused those clients.  The log's pool now makes callers wait for a free
connection.
"""

from __future__ import annotations

import asyncio

from rsnotify.log.redis_log import MAX_CONNECTIONS, RedisLog
from tests.devstack import Redis


async def test_a_burst_of_readers_waits_for_connections(redis_server: Redis) -> None:
    log = RedisLog(redis_server.url)
    try:
        await log.register("c1", "http://example.org/c1/capabilitylist.xml")
        readers = 5 * MAX_CONNECTIONS  # well past redis-py's default limit of 100 too
        heads = await asyncio.gather(*(log.head("c1") for _ in range(readers)))
        assert heads == [0] * readers
    finally:
        await log.close()
