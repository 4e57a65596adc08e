"""Property: whatever mix of genuine, forged, replayed and future-dated notifications
arrives, the mirror converges to the Source and the Destination's Change List
position never passes what the Source itself listed (rsnotify.subscriber.trust).

Each example runs a real sync engine (applier, mirror directory, SQLite
stores, HTTP fetches and Change List walks) against a minimal Source on a
loopback port (tests/minisource.py).  The push channel is the engine's own
queue: the property is about what the engine believes, and the MQTT path to
that queue is exercised by tests/test_subscriber_hostile.py with a real
broker.  A final head event stands in for the publisher's retained head, as
it would tell a subscriber that the last genuine notifications were lost.

``RSNOTIFY_PROPERTY_EXAMPLES`` raises the number of examples for a deeper run.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsnotify import w3cdt
from rsnotify.envelope import sign
from rsnotify.subscriber import events as ev
from rsnotify.subscriber.sync import CollectionSync
from tests.devstack import async_wait_for
from tests.minisource import Source, differences, fixity, notification, of_entry
from tests.syncrig import running_engine

SECRET = b"the publisher's secret"
NAMES = ("a.txt", "b.txt", "c.txt", "d.txt")
EXAMPLES = int(os.environ.get("RSNOTIFY_PROPERTY_EXAMPLES", "12"))


@dataclass(frozen=True)
class Genuine:
    """The Source changes ``name`` (a delete if ``delete`` and it exists); push may lose it."""

    name: str
    delete: bool
    lost: bool


@dataclass(frozen=True)
class Replay:
    """An earlier genuine notification, sent again (a replay attack or an old redelivery)."""

    back: int


@dataclass(frozen=True)
class Forgery:
    """A notification nobody at the Source wrote."""

    kind: str
    name: str
    seq: str  # "next": the genuine next number, "jump": far ahead, "old": 1


FORGERIES = (
    "created-far-future",  # the probe's finding: datetime 2099
    "updated-far-future",
    "updated-near-future",  # within the clock-skew bound: a provisional state
    "deleted",  # of a resource the Source still serves
    "created-missing",  # a resource the Source never had
    "wrong-hash",
    "garbage",
)

steps = st.lists(
    st.one_of(
        st.builds(
            Genuine,
            st.sampled_from(NAMES),
            st.booleans(),
            st.sampled_from((False, False, False, True)),  # now and then lost on the way
        ),
        st.builds(Replay, st.integers(1, 5)),
        st.builds(
            Forgery,
            st.sampled_from(FORGERIES),
            st.sampled_from(NAMES),
            st.sampled_from(("next", "jump", "old")),
        ),
    ),
    min_size=1,
    max_size=10,
)


class Run:
    """One engine following one Source; genuine notifications numbered as a publisher would."""

    def __init__(self, source: Source, engine: CollectionSync, signed: bool) -> None:
        self.source = source
        self.engine = engine
        self.signed = signed
        self.sent: list[bytes] = []
        self.head = 0
        self.version = 0

    def push(self, payload: bytes, *, genuine: bool) -> None:
        signature = sign(payload, SECRET) if genuine and self.signed else None
        if not genuine and self.signed:
            signature = sign(payload, b"a guess at the secret")
        self.engine.offer(ev.Message(payload, signature))

    def genuine(self, step: Genuine) -> None:
        self.version += 1
        delete = step.delete and step.name in self.source.files
        body = None if delete else f"{step.name} version {self.version}\n".encode()
        entry = self.source.change(step.name, body)
        self.head += 1
        payload = of_entry(self.source, self.head, entry)
        self.sent.append(payload)
        if not step.lost:
            self.push(payload, genuine=True)

    def replay(self, step: Replay) -> None:
        if len(self.sent) >= step.back:
            self.push(self.sent[-step.back], genuine=True)

    def forge(self, step: Forgery) -> None:
        seq = {"next": self.head + 1, "jump": self.head + 1000, "old": 1}[step.seq]
        loc = self.source.url(f"r/{step.name}")
        now = w3cdt.now()
        far = now + timedelta(days=365 * 70)
        near = now + timedelta(seconds=60)
        if step.kind == "garbage":
            self.push(b"\x00not a notification", genuine=False)
            return
        fields: dict[str, object] = {}
        when: datetime
        if step.kind == "created-far-future":
            change, when, loc = "created", far, self.source.url("r/never-existed.txt")
        elif step.kind == "updated-far-future":
            change, when = "updated", far
        elif step.kind == "updated-near-future":
            change, when = "updated", near
        elif step.kind == "deleted":
            change, when = "deleted", now
        elif step.kind == "created-missing":
            change, when, loc = "created", now, self.source.url("r/never-existed.txt")
        else:  # wrong-hash
            change, when = "updated", now
            fields = {"hash": fixity(b"bytes the Source never served")}
        payload = json.dumps(notification(self.source, seq, loc, change, when, **fields))
        self.push(payload.encode(), genuine=False)


async def _scenario(plan: list[Genuine | Replay | Forgery], signed: bool, tmp: Path) -> None:
    source = Source()
    await source.start({"a.txt": b"alpha\n", "b.txt": b"bravo\n"})
    try:
        async with running_engine(
            source, tmp, keys={"k1": SECRET} if signed else None, doubt_interval=0.2
        ) as (engine, task):
            run = Run(source, engine, signed)
            for step in plan:
                if isinstance(step, Genuine):
                    run.genuine(step)
                elif isinstance(step, Replay):
                    run.replay(step)
                else:
                    run.forge(step)
                await asyncio.sleep(0)  # let the engine interleave with the next step
            # Lost notifications with nothing after them are found by the safety poll.
            engine.detector.next_safety_poll = time.monotonic()

            def settled() -> bool:
                if task.done():
                    task.result()  # an engine failure is the test's failure
                return not differences(source, tmp / "mirror")

            await async_wait_for(
                settled,
                timeout=15,
                message=lambda: (
                    f"no convergence: {differences(source, tmp / 'mirror')}, {engine.stats}"
                ),
            )
            newest = max((e.datetime for e in source.changes if e.datetime), default=None)
            position = engine.applied.last_time
            assert position is None or newest is None or position <= newest, (
                f"the Change List position {position} passed the Source's newest change {newest}"
            )
    finally:
        await source.stop()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(plan=steps, signed=st.booleans())
def test_the_mirror_converges_whatever_is_pushed(
    plan: list[Genuine | Replay | Forgery], signed: bool
) -> None:
    with tempfile.TemporaryDirectory(prefix="rsnotify-trust-") as tmp:
        asyncio.run(_scenario(plan, signed, Path(tmp)))
