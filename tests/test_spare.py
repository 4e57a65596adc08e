"""Spare inodes (opt-in): replaces swap a retired inode in, never rewriting one anybody can see.

The pool's tests skip, saying why, where the system cannot swap (no file
leases, no ``renameat2``): ``--spare-inodes`` then falls back to renames.
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import pytest

from rsnotify import spare as spare_module
from rsnotify.simulator.server import SimulatorConfig
from rsnotify.spare import MAX_SPARE_BYTES, SLOT_PREFIX, SparePool, fill
from rsnotify.subscriber.mirror import Mirror
from rsnotify.subscriber.mirror.replace import RenameReplace, SpareSwapReplace
from rsnotify.subscriber.service import SubscriberConfig
from tests.spares import spare_mirror, usable_pool


def filled(pool: SparePool, body: bytes) -> str:
    """A slot from the pool holding ``body``, ready to install."""
    taken = pool.open()
    assert taken is not None, pool.reason
    slot, fd = taken
    try:
        fill(fd, body)
    finally:
        os.close(fd)
    return slot


def replace(pool: SparePool, target: Path, body: bytes) -> None:
    pool.install(filled(pool, body), None, str(target))


@pytest.fixture
def pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SparePool:
    """A pool that reuses a spare at once (MIN_AGE 0), so reuse shows in few steps."""
    monkeypatch.setattr(spare_module, "MIN_AGE", 0.0)
    return usable_pool(tmp_path / "spare", tmp_path / "root")


def test_replaces_alternate_between_two_inodes(pool: SparePool, tmp_path: Path) -> None:
    target = tmp_path / "root" / "a"
    target.write_bytes(b"v0")
    inodes = set()
    for i in range(1, 7):
        replace(pool, target, f"v{i}".encode())
        assert target.read_bytes() == f"v{i}".encode()
        inodes.add(target.stat().st_ino)
    assert len(inodes) == 2  # the file's own first inode and one spare, swapped back and forth
    assert pool.allocated == 1 and pool.reused == 5
    assert [p.name for p in (tmp_path / "root").iterdir()] == ["a"]


def test_an_open_old_version_is_never_rewritten(pool: SparePool, tmp_path: Path) -> None:
    target = tmp_path / "root" / "a"
    target.write_bytes(b"old version")
    with open(target, "rb") as reader:
        for i in range(4):
            replace(pool, target, f"new {i}".encode())
        assert reader.read() == b"old version"
    assert target.read_bytes() == b"new 3"


def test_a_mapped_old_version_is_never_rewritten(pool: SparePool, tmp_path: Path) -> None:
    target = tmp_path / "root" / "a"
    target.write_bytes(b"mapped bytes")
    with open(target, "rb") as handle:
        view = mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ)
    try:  # the descriptor is closed; only the mapping holds the old inode
        for i in range(4):
            replace(pool, target, f"new {i}".encode())
        assert view[:] == b"mapped bytes"
    finally:
        view.close()


def test_a_hard_linked_old_version_is_never_rewritten(pool: SparePool, tmp_path: Path) -> None:
    target = tmp_path / "root" / "a"
    target.write_bytes(b"snapshot")
    os.link(target, tmp_path / "snapshot-of-a")  # as rsync --link-dest does
    for i in range(4):
        replace(pool, target, f"new {i}".encode())
    assert (tmp_path / "snapshot-of-a").read_bytes() == b"snapshot"
    assert target.read_bytes() == b"new 3"


def test_a_chmodded_file_is_not_reused_for_another(pool: SparePool, tmp_path: Path) -> None:
    target = tmp_path / "root" / "a"
    target.write_bytes(b"private")
    target.chmod(0o600)
    replace(pool, target, b"v1")  # the 0600 inode is now the spare
    other = tmp_path / "root" / "b"
    other.write_bytes(b"b0")
    replace(pool, other, b"b1")
    assert other.stat().st_mode & 0o777 == pool._mode  # not 0600
    assert pool.reused == 0


def test_new_names_directories_and_symlinks(pool: SparePool, tmp_path: Path) -> None:
    root = tmp_path / "root"
    replace(pool, root / "new", b"created")  # nothing to swap with: a rename
    assert (root / "new").read_bytes() == b"created"

    (root / "dir").mkdir()
    (root / "dir" / "inner").write_bytes(b"keep")
    taken = pool.open()
    assert taken is not None
    slot, fd = taken
    os.write(fd, b"x")
    os.close(fd)
    with pytest.raises(IsADirectoryError):
        pool.install(slot, None, str(root / "dir"))
    assert (root / "dir" / "inner").read_bytes() == b"keep"
    assert {p.name for p in (tmp_path / "spare").iterdir()} == {slot}  # not the directory

    outside = tmp_path / "outside"
    outside.write_bytes(b"not followed")
    (root / "link").symlink_to(outside)
    replace(pool, root / "link", b"a file now")
    assert not (root / "link").is_symlink() and (root / "link").read_bytes() == b"a file now"
    assert outside.read_bytes() == b"not followed"
    assert not any(p.is_symlink() for p in (tmp_path / "spare").iterdir())


def test_retire_moves_a_deleted_file_into_the_pool(pool: SparePool, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "gone").write_bytes(b"deleted resource")
    assert pool.retire(None, str(root / "gone")) is True
    assert not (root / "gone").exists()
    kept = [p for p in (tmp_path / "spare").iterdir()]
    assert [p.stat().st_size for p in kept] == [0]  # deleted content does not linger
    assert pool.retire(None, str(root / "gone")) is False  # nothing there any more
    (root / "dir").mkdir()
    assert pool.retire(None, str(root / "dir")) is None  # the caller decides (kept)
    (root / "link").symlink_to(root / "dir")
    assert pool.retire(None, str(root / "link")) is None  # the caller unlinks it
    replace(pool, root / "fresh", b"reuses the deleted inode")
    assert pool.reused == 1 and pool.allocated == 0
    assert (root / "fresh").read_bytes() == b"reuses the deleted inode"


def test_slots_are_bounded_and_adopted_after_a_restart(tmp_path: Path) -> None:
    pool = usable_pool(tmp_path / "spare", tmp_path / "root", capacity=2)
    held = [pool.open(), pool.open()]
    assert all(held) and pool.open() is None  # every slot is in use: make a temp file
    for taken in held:
        assert taken is not None
        os.close(taken[1])
        pool.release(taken[0])
    pool.close()
    again = SparePool(tmp_path / "spare", tmp_path / "root", capacity=2)
    replace(again, tmp_path / "root" / "a", b"a")
    assert again.reused == 1  # a file the previous process left in a slot
    assert all(p.name.startswith(SLOT_PREFIX) for p in (tmp_path / "spare").iterdir())


def test_off_across_filesystems(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the temp directory")
    spare = shm / f"rsnotify-test-{os.getpid()}"
    pool = SparePool(spare, tmp_path)
    try:
        assert not pool.enabled and pool.open() is None
        assert "cross-device" in pool.reason.lower()
        assert pool.retire(None, str(tmp_path / "x")) is None
        assert list(tmp_path.iterdir()) == []  # the probe cleaned up after itself
    finally:
        for leftover in spare.iterdir():
            leftover.unlink()
        spare.rmdir()


def test_a_reader_of_a_deleted_file_keeps_its_bytes(pool: SparePool, tmp_path: Path) -> None:
    gone = tmp_path / "root" / "gone"
    gone.write_bytes(b"still being read")
    with open(gone, "rb") as reader:
        assert pool.retire(None, str(gone)) is True
        replace(pool, tmp_path / "root" / "new", b"must not land in the read inode")
        assert reader.read() == b"still being read"
    assert pool.reused == 0


def test_a_spare_rests_before_reuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Oldest first and only after MIN_AGE: an open() racing the swap has long finished."""
    monkeypatch.setattr(spare_module, "MIN_AGE", 3600.0)
    pool = usable_pool(tmp_path / "spare", tmp_path / "root")
    target = tmp_path / "root" / "a"
    target.write_bytes(b"v0")
    oldest_inode = target.stat().st_ino  # the first one retired (file mtimes can tie)
    inodes = set()
    for i in range(1, 5):
        replace(pool, target, f"v{i}".encode())
        inodes.add(target.stat().st_ino)
    assert len(inodes) == 4 and pool.reused == 0  # every retired inode is still resting
    assert oldest_inode not in inodes
    monkeypatch.setattr(spare_module, "MIN_AGE", 0.0)
    replace(pool, target, b"v5")
    assert pool.reused == 1 and target.stat().st_ino == oldest_inode


def test_unsettled_spares_wait_for_their_directory(pool: SparePool, tmp_path: Path) -> None:
    """Until the target's directory fsync returned, the old inode may still be named there."""
    target = tmp_path / "root" / "a"
    target.write_bytes(b"v0")
    retired = pool.install(filled(pool, b"v1"), None, str(target), settle=False)
    assert retired is not None
    replace(pool, tmp_path / "root" / "b", b"b")  # does not get the unsettled inode
    assert pool.reused == 0
    pool.settle(retired)
    replace(pool, tmp_path / "root" / "c", b"c")
    assert pool.reused == 1
    gone = tmp_path / "root" / "gone"
    gone.write_bytes(b"x")
    slot = pool.retire(None, str(gone), settle=False)
    assert isinstance(slot, str)
    pool.forget(slot)  # its directory fsync failed: never reused, unlinked
    assert not (tmp_path / "spare" / slot).exists()


def test_large_retired_files_are_not_kept(pool: SparePool, tmp_path: Path) -> None:
    target = tmp_path / "root" / "big"
    target.write_bytes(b"x" * (MAX_SPARE_BYTES + 1))
    replace(pool, target, b"small now")
    assert [p.stat().st_size for p in (tmp_path / "spare").iterdir()] == []
    target.write_bytes(b"y" * (MAX_SPARE_BYTES + 1))
    assert pool.retire(None, str(target)) is None  # the caller unlinks it


def test_no_swap_possible_hands_the_slot_back(
    pool: SparePool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    target = tmp_path / "root" / "a"
    target.write_bytes(b"v0")
    slot = filled(pool, b"v1")
    monkeypatch.setattr(spare_module, "exchange", refuse)
    with pytest.raises(spare_module.SpareUnusable):
        pool.install(slot, None, str(target))
    assert target.read_bytes() == b"v0"
    monkeypatch.undo()
    monkeypatch.setattr(spare_module, "MIN_AGE", 0.0)
    replace(pool, target, b"v2")  # the slot came back and is reused
    assert target.read_bytes() == b"v2" and pool.reused == 1


# --- the opt-in: --spare-inodes ---------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "argv"),
    [("subscribe", ["http://source.example/", "--into", "m"]), ("simulate", [])],
)
def test_spare_inodes_are_opt_in(command: str, argv: list[str]) -> None:
    """Off by default (opt-in where measured to pay); --spare-inodes turns them on."""
    from rsnotify import cli

    assert cli.parse_command(command, argv, environ={})[1].spare_inodes is False
    on = cli.parse_command(command, [*argv, "--spare-inodes"], environ={})[1]
    assert on.spare_inodes is True
    assert SubscriberConfig(source="http://s/", into="m").spare_inodes is False
    assert SimulatorConfig().spare_inodes is False


async def inodes_of_versions(mirror: Mirror, path: Path, versions: int) -> list[int]:
    """Write ``versions`` bodies to ``path`` one after another: the inode of each."""
    inodes = []
    for i in range(versions):
        await mirror.write_bytes(path, f"v{i}".encode())
        assert path.read_bytes() == f"v{i}".encode()
        inodes.append(path.stat().st_ino)
    return inodes


async def test_a_mirror_replaces_by_rename_by_default(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path / "m")
    try:
        assert isinstance(mirror.replace_strategy, RenameReplace) and mirror.spares is None
        path = mirror.path_for("http://s/a")
        inodes = await inodes_of_versions(mirror, path, 3)
        assert inodes[0] != inodes[1] != inodes[2]  # a new file each time
        assert await mirror.delete(path) and not path.exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no spare directory
    finally:
        mirror.close()


async def test_a_mirror_given_a_spare_directory_swaps_inodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror = spare_mirror(tmp_path, monkeypatch)
    try:
        assert isinstance(mirror.replace_strategy, SpareSwapReplace) and mirror.spares
        path = mirror.path_for("http://s/a")
        inodes = await inodes_of_versions(mirror, path, 3)
        assert inodes[0] == inodes[2] != inodes[1]  # two inodes, swapped back and forth
    finally:
        mirror.close()


def test_a_spare_directory_that_cannot_swap_falls_back_to_renames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spare_module, "_RENAMEAT2", None)  # not Linux, old glibc
    mirror = Mirror(tmp_path / "m", spare_dir=tmp_path / "spare")
    assert isinstance(mirror.replace_strategy, RenameReplace) and mirror.spares is None
    mirror.close()
