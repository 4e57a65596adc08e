"""Property: back-dated creations and deletions never leave the mirror wrong.

Issue 17 item 2.  resync 2.0.1 dates a deletion with the deleted file's old
modification time, and a file copied with ``cp -p`` is a creation dated by its
old mtime: both can be earlier than the baseline that the Destination took,
or than the state the mirror holds.  The rule (rsnotify.subscriber.applier,
``_to_recheck``): a change that would make a resource exist or vanish although
the mirror holds a newer state, and any change read from a list out of
forward chronological order whose time would decide, is checked at the
Source, which says what it holds now; nothing is skipped for its date alone,
and an older update of a list in order never rolls bytes back.

Each example: a real applier, mirror directory and resource store; a Source
on a loopback port (tests/minisource.py) changed step by step, some changes
listed with an old date; a baseline taken from the Source at a random step
(as a Destination starting then would); then the Change List's entries in
forward chronological order of their listed times, as the sync engine
submits a list read out of order.  The mirror must equal the Source.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsnotify.fetch import Fetcher
from rsnotify.model import ChangeType, Entry, sort_chronologically
from rsnotify.subscriber.applier import Applier
from rsnotify.subscriber.mirror import Mirror
from rsnotify.subscriber.resources import ResourceStore
from tests.minisource import Source, differences, fixity

NAMES = ("a.txt", "b.txt", "c.txt")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
EXAMPLES = int(os.environ.get("RSNOTIFY_PROPERTY_EXAMPLES", "40"))


@dataclass(frozen=True)
class Step:
    """Write (or delete) ``name``; ``old`` lists it with an old date (an old mtime)."""

    name: str
    delete: bool
    old: bool


plans = st.tuples(
    st.lists(
        st.builds(Step, st.sampled_from(NAMES), st.booleans(), st.booleans()),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 8),  # the baseline is taken before this step
    st.sets(st.sampled_from(NAMES)),  # the files the Source starts with
)


async def _scenario(steps: list[Step], baseline_at: int, initial: set[str], tmp: Path) -> None:
    source = Source()
    await source.start({name: f"{name} initial\n".encode() for name in sorted(initial)})
    fetcher = Fetcher()
    store = ResourceStore(tmp / "resources.sqlite3")
    mirror = tmp / "mirror"
    applier = Applier(
        Mirror(mirror),
        store,
        fetcher,
        allowed_origins=[source.base],
        retries=0,
        not_found_retries=0,
        backoff_initial=0.001,
        backoff_max=0.002,
    )
    try:
        listed: list[Entry] = []
        unordered = False
        for i, step in enumerate([*steps, None]):
            if i == min(baseline_at, len(steps)):  # the Destination's baseline, taken now
                at = T0 + timedelta(seconds=i) - timedelta(milliseconds=500)
                snapshot = [
                    Entry(
                        loc=source.url(f"r/{name}"),
                        change=ChangeType.CREATED,
                        datetime=at,
                        hash=fixity(data),
                        length=len(data),
                    )
                    for name, data in sorted(source.files.items())
                ]
                await asyncio.gather(*(applier.submit(e, reuse=True) for e in snapshot))
            if step is None:
                break
            when = T0 - timedelta(days=1, seconds=-i) if step.old else T0 + timedelta(seconds=i)
            unordered = unordered or step.old
            loc = source.url(f"r/{step.name}")
            if step.delete and step.name in source.files:
                del source.files[step.name]
                listed.append(Entry(loc=loc, change=ChangeType.DELETED, datetime=when))
            else:
                kind = ChangeType.UPDATED if step.name in source.files else ChangeType.CREATED
                data = f"{step.name} step {i}\n".encode()
                source.files[step.name] = data
                listed.append(
                    Entry(loc=loc, change=kind, datetime=when, hash=fixity(data), length=len(data))
                )
        # The walk: the whole list (read unordered, nothing known after the baseline),
        # sorted by listed time, flagged as out of order when it was.
        futures = [applier.submit(e, unordered=unordered) for e in sort_chronologically(listed)]
        await asyncio.gather(*futures)
        await applier.drain()
        assert differences(source, mirror) == [], [
            (s.name, "delete" if s.delete else "write", "old" if s.old else "") for s in steps
        ]
    finally:
        await fetcher.close()
        await store.close()
        await source.stop()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(plan=plans)
def test_back_dated_creations_and_deletions_converge(
    plan: tuple[list[Step], int, set[str]],
) -> None:
    steps, baseline_at, initial = plan
    with tempfile.TemporaryDirectory(prefix="rsnotify-backdated-") as tmp:
        asyncio.run(_scenario(steps, baseline_at, initial, Path(tmp)))
