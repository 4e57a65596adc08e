"""Issue 17 acceptance: a Destination follows a Source built by ``resync-build`` round after round.

resync 2.0.1's Change Lists are grouped by change type (not forward
chronological, Z39.99 section 12.1), replaced every round, and date every
deletion with the deleted file's old modification time: here an hour before
the baseline, so each deletion is older than the state the mirror holds.
Five rounds of 20 creates, updates and deletes each; after every round the
mirror must equal the served files by SHA-256, no deleted file may survive,
and the apply log must show no older state applied over a newer one.

* ``--once``: the Destination polls by hand after each round (plain file
  names: resync-sync, used as the cross-check, cannot fetch URIs with spaces);
* push: ``rsnotify publish`` on the Source's directory (``--lenient order``)
  and ``rsnotify subscribe --via mqtt://`` on a real Mosquitto.

Then ``resync-sync --baseline`` (the reference library's own client) mirrors
the same Source into another directory: both mirrors must be equal.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rsnotify.subscriber.mirror import loc_for
from tests.devstack import ManagedProcess, Mosquitto, wait_for
from tests.helpers import newer_never_overwritten, read_apply_log

from .resync_source import ResyncSource, differences, served_source

RunProcess = Callable[..., ManagedProcess]
RESYNC_SYNC = str(Path(sys.executable).with_name("resync-sync"))
ROUNDS = 5


def _initial(source: ResyncSource) -> None:
    hour_ago = time.time() - 3600  # deletions of these files are dated before the baseline
    for i in range(30):
        source.write(f"base/{i:02d}.txt", f"resource {i}\n".encode(), hour_ago)
    source.publish_initial()


def _check_log(mirror: Path) -> None:
    """No resource was ever written or deleted by an older change than the one before."""
    records = asyncio.run(read_apply_log(mirror))
    assert newer_never_overwritten(records) == []


def _tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


def _reference_mirror(source: ResyncSource, into: Path, cwd: Path) -> dict[str, str]:
    """What resync-sync itself makes of the Source (its baseline of the current state)."""
    done = subprocess.run(
        [
            RESYNC_SYNC, "--baseline", "--delete",
            "--capabilitylist", source.url("capabilitylist.xml"),
            f"{source.url('res/')}={into}",
        ],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return _tree(into)


def test_once_follows_a_resync_built_source_round_after_round(
    tmp_path: Path,
    process_factory: Callable[..., ManagedProcess],
    rsnotify_process: RunProcess,
) -> None:
    source, _server = served_source(tmp_path, process_factory)
    _initial(source)
    mirror = tmp_path / "mirror"

    def once() -> str:
        process = rsnotify_process(
            "subscribe", source.base, "--into", str(mirror), "--once", "--log-format", "json"
        )
        code = process.wait(timeout=120)
        assert code == 0, process.tail()
        return process.output("stdout")

    assert "baseline: 30 files" in once()
    rng = random.Random(1717)
    deleted: set[str] = set()
    for _ in range(ROUNDS):
        listed = source.round(rng, creates=8, updates=7, deletes=5, plain=True)
        deleted |= {e.uri for e in listed if e.change == "deleted"}
        once()
        assert differences(source, mirror) == []
    assert deleted, "the scenario deletes files"
    _check_log(mirror)
    reference = _reference_mirror(source, tmp_path / "resync-mirror", tmp_path)
    ours = {loc_for(mirror / path, mirror): sha for path, sha in _tree(mirror).items()}
    assert ours == {source.url(f"res/{path}"): sha for path, sha in reference.items()}, (
        "rsnotify and resync-sync made different mirrors"
    )


def test_push_follows_a_resync_built_source_round_after_round(
    tmp_path: Path,
    process_factory: Callable[..., ManagedProcess],
    rsnotify_process: RunProcess,
    mosquitto: Mosquitto,
) -> None:
    source, _server = served_source(tmp_path, process_factory)
    _initial(source)
    mirror = tmp_path / "mirror"
    publisher = rsnotify_process(
        "publish", str(source.root), "--lenient", "order", "--poll", "0.1",
        "--state-dir", str(tmp_path / "publisher"), "--mqtt", mosquitto.url,
        "--log-format", "json",
    )  # fmt: skip
    subscriber = rsnotify_process(
        "subscribe", source.base, "--into", str(mirror), "--via", mosquitto.url,
        "--log-format", "json",
    )  # fmt: skip
    subscriber.wait_for_line(r": live", stream="stdout", timeout=60)
    rng = random.Random(1718)
    for _ in range(ROUNDS):
        source.round(rng, creates=8, updates=7, deletes=5)
        wait_for(
            lambda: not differences(source, mirror),
            timeout=60,
            message=lambda: f"{differences(source, mirror)[:5]}\n{subscriber.tail()}",
        )
    assert publisher.running, publisher.tail()
    assert subscriber.running, subscriber.tail()
    subscriber.terminate()
    _check_log(mirror)
    records = asyncio.run(read_apply_log(mirror))
    pushed = [r for r in records if r.seq is not None and r.outcome in ("applied", "deleted")]
    assert len(pushed) >= ROUNDS * 10, "changes were applied from notifications"
