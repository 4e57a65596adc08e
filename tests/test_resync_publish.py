"""``rsnotify publish`` on a Source that resync-build writes: every entry logged exactly once.

resync 2.0.1 replaces its Change List every round with that round's changes grouped by
change type, and dates a deletion with the deleted file's old modification time (here an
hour before the baseline), so its lists are out of forward chronological order and the
deletions are older than entries already published.  With ``--lenient order`` the
publisher must log each of them once, over rounds of 20 creates, updates and deletes
(issue 17, item 1).  The log is read independently (sqlite3 and json, not rsnotify's
code) and compared with what resync's own parser reads from each round's Change List.
"""

from __future__ import annotations

import json
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from tests.devstack import ManagedProcess, wait_for

from .resync_source import Listed, served_source

RunProcess = Callable[..., ManagedProcess]
Identity = tuple[str, str, float]


def logged(state: Path) -> tuple[list[Identity], str | None]:
    """The log's entries (loc, change, change time) in sequence order, and the checkpoint."""
    path = state / "log.sqlite3"
    if not path.exists():
        return [], None
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            rows = db.execute("SELECT data FROM log ORDER BY collection, seq").fetchall()
            meta = db.execute("SELECT checkpoint FROM meta").fetchall()
    except sqlite3.OperationalError:  # the publisher has not created its tables yet
        return [], None
    out = []
    for (data,) in rows:
        note = json.loads(data)
        when = datetime.fromisoformat(note["datetime"].replace("Z", "+00:00")).timestamp()
        out.append((note["loc"], note["change"], round(when, 6)))
    return out, meta[0][0] if meta else None


def identity(entry: Listed) -> Identity:
    return (entry.uri, entry.change, round(entry.timestamp, 6))


def test_publish_logs_every_entry_of_resync_built_change_lists_once(
    tmp_path: Path,
    process_factory: Callable[..., ManagedProcess],
    rsnotify_process: RunProcess,
) -> None:
    source, _server = served_source(tmp_path, process_factory)
    rng = random.Random(17)
    hour_ago = time.time() - 3600  # deletions of these files are dated before the baseline
    for i in range(40):
        source.write(f"base/{i:02d}.txt", f"resource {i}\n".encode(), hour_ago)
    source.publish_initial()
    state = tmp_path / "state"
    publisher = rsnotify_process(
        "publish", str(source.root), "--lenient", "order", "--poll", "0.1",
        "--state-dir", str(state), "--log-format", "json",
    )  # fmt: skip

    def started() -> bool:
        checkpoint = logged(state)[1]
        return checkpoint is not None and json.loads(checkpoint).get("started") is True

    wait_for(started, timeout=30, message=publisher.tail)

    expected: list[Identity] = []
    back_dated = 0
    for _ in range(5):
        listed = source.round(rng, creates=8, updates=7, deletes=5)
        assert len(listed) == 20
        latest = max((t for _, _, t in expected), default=None)
        back_dated += sum(1 for e in listed if latest is not None and e.timestamp < latest)
        expected += map(identity, listed)
        want = Counter(expected)
        wait_for(
            lambda want=want: Counter(logged(state)[0]) >= want,
            timeout=30,
            message=lambda: f"not all logged: {publisher.tail()}",
        )
    # A last round of one change: anything logged twice would have come before it.
    sentinel = source.round(rng, creates=1, updates=0, deletes=0)
    expected += map(identity, sentinel)
    wait_for(lambda: identity(sentinel[0]) in logged(state)[0], timeout=30, message=publisher.tail)

    entries, checkpoint = logged(state)
    assert Counter(entries) == Counter(expected)  # each exactly once, none missing
    assert len(entries) == 5 * 20 + 1
    assert back_dated >= 5, "the scenario must have deletions older than earlier changes"
    assert checkpoint is not None and "known" in json.loads(checkpoint)
    assert publisher.running, publisher.tail()
    said = publisher.output("both")
    assert "forward chronological order" in said, "a list read out of order is reported"
