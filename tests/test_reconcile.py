"""Reconciliation after a failover (issue 19), end to end: a publisher finds its log rolled back.

A real failover that loses pushed entries needs replication waiting off and
an unlucky promotion (tests/test_sentinel.py shows one); here the outcome is
made directly on a single real Redis, atomically, as a promoted replica
would present it: the stream rebuilt without its last entries and the head
moved back.  The publisher's next append conflicts, it reloads, compares the
log with what it appended and either writes the lost entries again (same
seqs, same bytes) or, when the log holds something else at a pushed seq,
stops appending to the collection and says why.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import redis

from rsnotify.collection import collection_id
from tests.devstack import ManagedProcess, Redis, wait_for

# KEYS: log, meta.  ARGV: entries to lose from the end, a seq to lose in the middle (0: none).
_ROLL_BACK = """
local head = tonumber(redis.call('HGET', KEYS[2], 'head'))
local cut = head - tonumber(ARGV[1])
local rows = redis.call('XRANGE', KEYS[1], '-', cut .. '-0')
redis.call('DEL', KEYS[1])
for _, row in ipairs(rows) do
  if tonumber(string.match(row[1], '^(%d+)')) ~= tonumber(ARGV[2]) then
    redis.call('XADD', KEYS[1], row[1], unpack(row[2]))
  end
end
redis.call('HSET', KEYS[2], 'head', cut)
return {head, cut}
"""


def _post(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, method="POST", data=b"")) as r:
        r.read()


def _run(tmp_path: Path, server: Redis, *, lose: int, hole: int) -> tuple[ManagedProcess, dict]:
    """Publish; roll the log back mid-run; return the publisher and what the log held before."""
    sim = ManagedProcess.rsnotify(
        "simulate", "--port", "0", "--rate", "200", "--max-changes", "800",
        "--changelist-size", "500", "--resources", "50", "--paused", "--seed", "7",
        workdir=tmp_path, name="simulate",
    ).start()  # fmt: skip
    base = sim.wait_for_line(r"serving (http://\S+)").group(1)
    cid = collection_id(f"{base}c1/capabilitylist.xml")
    keys = [f"rsn:{{{cid}}}:log", f"rsn:{{{cid}}}:meta"]
    publisher = ManagedProcess.rsnotify(
        "publish", base, "--redis", server.url, "--poll", "0.05", "--from-beginning",
        "--log-format", "text", workdir=tmp_path, name="publish",
    ).start()  # fmt: skip
    client = server.client()
    try:
        _post(f"{base}_simulator/resume")
        wait_for(lambda: int(client.hget(keys[1], "head") or 0) >= 300, timeout=30)
        before = {int(i.split(b"-")[0]): f[b"d"] for i, f in client.xrange(keys[0], "-", "+")}
        head, cut = client.eval(_ROLL_BACK, 2, *keys, lose, hole)
        before = {seq: data for seq, data in before.items() if seq <= head}
        return publisher, {"cid": cid, "keys": keys, "before": before, "cut": cut, "sim": sim}
    finally:
        client.close()


def test_entries_a_failover_lost_are_written_again_with_the_same_seqs(
    tmp_path: Path, redis_server: Redis
) -> None:
    publisher, run = _run(tmp_path, redis_server, lose=40, hole=0)
    try:
        publisher.wait_for_line(r"wrote them again from memory", timeout=30)
        client: redis.Redis = redis_server.client()
        try:
            wait_for(lambda: int(client.hget(run["keys"][1], "head") or 0) >= 800, timeout=60)
            rows = client.xrange(run["keys"][0], "-", "+")
        finally:
            client.close()
        seqs = [int(i.split(b"-")[0]) for i, _ in rows]
        assert seqs == list(range(1, 801)), "dense, unique"
        after = {int(i.split(b"-")[0]): f[b"d"] for i, f in rows}
        for seq, data in run["before"].items():
            assert after[seq] == data, f"seq {seq} changed meaning"
            assert json.loads(data)["seq"] == seq
    finally:
        publisher.terminate()
        run["sim"].terminate()


def test_a_pushed_seq_the_log_no_longer_holds_stops_the_collection(
    tmp_path: Path, redis_server: Redis
) -> None:
    publisher, run = _run(tmp_path, redis_server, lose=10, hole=5)
    try:
        publisher.wait_for_line(
            r"ERROR .*holds nothing at seq 5, which was pushed; appending to this collection stops",
            timeout=30,
        )
        client: redis.Redis = redis_server.client()
        try:
            head = int(client.hget(run["keys"][1], "head") or 0)
            assert head == run["cut"], "nothing appended after the refusal"
            assert client.xrange(run["keys"][0], "5-0", "5-0") == []
        finally:
            client.close()
    finally:
        publisher.terminate()
        run["sim"].terminate()
