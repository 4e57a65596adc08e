"""Issue 22, item 4: a subscriber writes, and cleans up, only in a mirror it owns.

Findings: ``--into /`` was accepted (state in ``/..rsnotify``) and its start-up
walk deleted other applications' ``%tmp.*`` files; a non-empty unrelated
directory lost a user's ``%tmp.precious-user-file``; two subscribers on one
mirror with different ``--state`` directories both ran and the second deleted
the first's in-flight temp file.  Rules: :mod:`rsnotify.subscriber.ownership`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rsnotify import cli
from rsnotify.subscriber import ownership
from rsnotify.subscriber.ownership import MARKER, Facts, How, MirrorInUse, MirrorRefused, judge
from rsnotify.subscriber.service import Subscriber, SubscriberConfig, default_state_dir
from tests.helpers import running_simulator

TEMP = "%tmp.0123456789abcdef"  # the shape of a temp file the mirror itself makes


def facts(**changes: object) -> Facts:
    base = dict(
        path="m",
        is_root=False,
        holds_home=False,
        is_dir=True,
        exists=True,
        has_marker=False,
        foreign=(),
        legacy_state=False,
        adopt=False,
    )
    base.update(changes)
    return Facts(**base)  # type: ignore[arg-type]


def test_judge_claims_new_marked_migrated_and_adopted_directories_and_refuses_the_rest() -> None:
    assert judge(facts(exists=False, is_dir=False)) is How.NEW
    assert judge(facts()) is How.NEW
    assert judge(facts(has_marker=True, foreign=("http",))) is How.MARKED
    assert judge(facts(foreign=("http",), legacy_state=True)) is How.MIGRATED
    assert judge(facts(foreign=("notes.txt",), adopt=True)) is How.ADOPTED
    refusals = {
        "the root directory": facts(is_root=True, adopt=True, has_marker=True),
        "the home directory": facts(holds_home=True, adopt=True, has_marker=True),
        "not a directory": facts(is_dir=False),
        "not empty ('a', 'b', 'c', ...) and not a mirror rsnotify made (no %rsnotify)": facts(
            foreign=("a", "b", "c", "d")
        ),
    }
    for said, found in refusals.items():
        with pytest.raises(MirrorRefused, match=r"^--into m: ") as refused:
            judge(found)
        assert said in str(refused.value)


def test_root_and_home_are_refused_before_anything_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / "projects").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    for into in ("/", str(home), str(tmp_path)):  # tmp_path holds the home directory
        state = tmp_path / "state-of" / into.strip("/").replace("/", "_")
        with pytest.raises(MirrorRefused):
            ownership.claim(into, state, adopt=True)
        assert not state.exists()
    assert not (home / MARKER).exists() and not Path("/", MARKER).exists()
    ownership.claim(home / "projects" / "mirror", tmp_path / "s").release()  # inside is fine


async def test_a_foreign_directory_is_refused_and_adopted_only_on_request(tmp_path: Path) -> None:
    mirror = tmp_path / "downloads"
    precious = mirror / "%tmp.precious-user-file"
    mirror.mkdir()
    precious.write_bytes(b"mine")
    async with running_simulator(resources=3) as (_sim, base):
        refused = Subscriber(SubscriberConfig(source=base, into=str(mirror), once=True))
        with pytest.raises(MirrorRefused, match=r"not empty .* --adopt"):
            await refused.start()
        await refused.stop()
        assert not default_state_dir(str(mirror)).exists()
        assert not (mirror / MARKER).exists()

        adopting = Subscriber(
            SubscriberConfig(source=base, into=str(mirror), once=True, adopt=True)
        )
        try:
            await adopting.start()
            assert await adopting.run_once() == 0
        finally:
            await adopting.stop()
    assert (mirror / MARKER).is_dir()
    assert precious.read_bytes() == b"mine"
    assert len([p for p in (mirror / "http").rglob("*") if p.is_file()]) == 3  # the resources


async def test_a_second_subscriber_on_the_mirror_is_refused_whatever_its_state_directory(
    tmp_path: Path,
) -> None:
    mirror = tmp_path / "mirror"
    async with running_simulator(resources=2) as (_sim, base):
        first = Subscriber(
            SubscriberConfig(source=base, into=str(mirror), state=str(tmp_path / "a"), once=True)
        )
        await first.start()
        try:
            in_flight = mirror / "http" / "127.0.0.1" / TEMP  # the first one's write under way
            in_flight.parent.mkdir(parents=True, exist_ok=True)
            in_flight.write_bytes(b"half a resource")
            second = Subscriber(
                SubscriberConfig(
                    source=base, into=str(mirror), state=str(tmp_path / "b"), once=True
                )
            )
            with pytest.raises(MirrorInUse, match="another rsnotify subscribe is mirroring"):
                await second.start()
            await second.stop()
            assert in_flight.read_bytes() == b"half a resource"
        finally:
            await first.stop()
        third = Subscriber(  # once the first is gone, its leftover temp file is cleaned up
            SubscriberConfig(source=base, into=str(mirror), state=str(tmp_path / "b"), once=True)
        )
        try:
            await third.start()
        finally:
            await third.stop()
        assert not in_flight.exists()


async def test_a_mirror_made_before_the_marker_keeps_working_and_is_marked(
    tmp_path: Path,
) -> None:
    """Migration: the state directory already holds this mirror's cursor, so it is ours."""
    mirror = tmp_path / "mirror"
    async with running_simulator(resources=3) as (_sim, base):
        config = SubscriberConfig(source=base, into=str(mirror), once=True)
        made = Subscriber(config)
        try:
            await made.start()
            assert await made.run_once() == 0
        finally:
            await made.stop()
        os.rmdir(mirror / MARKER)  # what an rsnotify without the marker left behind
        leftover = next((mirror / "http").iterdir()) / TEMP
        leftover.write_bytes(b"left by a kill -9")
        assert (default_state_dir(str(mirror)) / "cursor.sqlite3").is_file()

        again = Subscriber(config)
        try:
            await again.start()
            assert again._mirror_lock is not None
            assert again._mirror_lock.how is How.MIGRATED
            assert await again.run_once() == 0
        finally:
            await again.stop()
    assert (mirror / MARKER).is_dir()
    assert not leftover.exists()


def test_the_command_exits_2_with_one_line_for_a_refused_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RSNOTIFY_CONFIG", raising=False)
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff\xd8")
    argv = ["subscribe", "http://127.0.0.1:9/", "--into", str(foreign), "--log-format", "json"]
    assert cli.main(argv) == 2  # 2: the systemd units do not restart a usage error
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        f"rsnotify subscribe: --into {foreign}: not empty ('cat.jpg') and not a mirror "
        f"rsnotify made (no {MARKER}); give a new or empty directory, or --adopt to take "
        "this one over"
    ]
