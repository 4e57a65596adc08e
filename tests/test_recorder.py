"""The batch recorder (``--metadata-only``) against the one-change path, row for row.

The recorder decides most changes of a catch-up by a short way (a loc with no
state, or a state dated before the change) and the rest by the rules
(:mod:`rsnotify.subscriber.rules`); the applier's one-change path
(:meth:`Applier.apply`) always takes the rules.  Whatever the states before
(trusted, provisional, dated beyond the clock-skew bound, deleted), both must
write the same apply log and leave the same states.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rsnotify.fetch import Fetcher
from rsnotify.model import ChangeType, Entry
from rsnotify.subscriber.applier import Applier, Outcome
from rsnotify.subscriber.mirror import Mirror
from rsnotify.subscriber.resources import ResourceStore

ORIGIN = "http://source.example"
MAX_SKEW = 60.0


@pytest.fixture
async def fetcher() -> AsyncIterator[Fetcher]:
    async with Fetcher() as fetcher:  # never used: nothing is fetched in metadata-only mode
        yield fetcher


def _log(records: list[Any]) -> list[tuple[Any, ...]]:
    # A refused change's ``confirmed`` is left out: the one-change path logs a
    # refusal as trusted, the recorder as the change was (dated beyond the skew
    # bound: not), long before the short way; it concerns nothing but that column.
    return [
        (r.loc, r.change, r.datetime, r.seq, r.sha256, r.length, r.outcome, r.detail,
         None if r.outcome == Outcome.REFUSED_ORIGIN else r.confirmed)
        for r in records
    ]  # fmt: skip


async def _states(store: ResourceStore, locs: set[str]) -> dict[str, Any]:
    found = {}
    for loc in sorted(locs):
        state = await store.get(loc)
        found[loc] = state and (
            state.change,
            state.datetime,
            state.seq,
            state.sha256,
            state.length,
            state.confirmed,
        )
    return found


@pytest.mark.parametrize("seed", range(6))
async def test_batches_write_what_one_change_at_a_time_writes(
    tmp_path: Path, fetcher: Fetcher, seed: int
) -> None:
    rng = random.Random(seed)
    now = datetime.now(UTC).replace(microsecond=0)
    locs = [f"{ORIGIN}/r/{i}" for i in range(12)] + ["ftp://elsewhere.example/x"]  # refused

    def when() -> datetime:
        # Few distinct times (ties), some beyond the skew bound (unconfirmed changes).
        return now + timedelta(seconds=rng.choice([-40, -20, -20, -5, 0, 0, 30, 90, 150]))

    def entry(loc: str, kind: ChangeType) -> Entry:
        digest = f"{rng.randrange(4):064x}"
        return Entry(
            loc=loc, change=kind, datetime=when(), hash=f"md5:{digest[:32]} sha-256:{digest}",
            length=rng.choice([None, 0, 7]),
        )  # fmt: skip

    stores = [ResourceStore(tmp_path / f"{name}.sqlite") for name in ("batched", "single")]
    try:
        # The same states before, in both: trusted, provisional, beyond the skew bound, deleted.
        for store in stores:
            seeding = random.Random(seed)
            for loc in locs[:10]:
                await store.record_applied(
                    loc,
                    seeding.choice(list(ChangeType)),
                    now + timedelta(seconds=seeding.choice([-20, 0, 30, 90])),
                    confirmed=seeding.random() < 0.6,
                    outcome="recorded",
                )
        changes = []
        for _ in range(400):
            kind = rng.choice(list(ChangeType))
            change = entry(rng.choice(locs), kind)
            if kind is ChangeType.DELETED and change.datetime > now + timedelta(seconds=MAX_SKEW):
                change.datetime = now  # an unconfirmed deletion is not the recorder's
            changes.append(change)
        mirror = Mirror(tmp_path / "mirror")
        options: dict[str, Any] = {
            "allowed_origins": [ORIGIN],
            "metadata_only": True,
            "max_skew": MAX_SKEW,
        }
        batched = Applier(mirror, stores[0], fetcher, **options)
        outcomes: list[Outcome] = []
        start = 0
        while start < len(changes):  # chunks of a walk, of varied sizes
            part = changes[start : start + rng.randrange(1, 60)]
            views = batched.read_many(part, collection="c")
            outcomes += await batched.submit_many(views, part)
            start += len(part)
        await batched.drain()
        single = Applier(mirror, stores[1], fetcher, **options)
        expected = [await single.apply(c, collection="c") for c in changes]
        assert outcomes == expected
        assert {Outcome.RECORDED, Outcome.SKIPPED_ALREADY_APPLIED, Outcome.REFUSED_ORIGIN} <= set(
            outcomes
        )
        assert _log(await stores[0].apply_log()) == _log(await stores[1].apply_log())
        assert await _states(stores[0], set(locs)) == await _states(stores[1], set(locs))
        assert sorted(await stores[0].held("c", before=now + timedelta(days=1))) == sorted(
            await stores[1].held("c", before=now + timedelta(days=1))
        )
    finally:
        for store in stores:
            await store.close()
