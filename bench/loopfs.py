"""Which filesystem a benchmark writes to, and a journaled ext4 to write to instead.

Why this exists (issue 21): the figures were measured with the mirror on this
machine's root filesystem, an ext4 created *without a journal*, whose inode
allocator behaves unlike the disks Destinations run (default ``mkfs.ext4``
and XFS have journals).  A bench therefore runs each scenario twice: on the
machine's own disk, and on a journaled ext4 with default ``mkfs.ext4``
options mounted ``data=ordered`` from a loop file it creates and removes
(:func:`loop_ext4`, root only).  Every row names its filesystem
(:func:`describe`), read from the kernel rather than assumed:

* the mount: the longest mount point of ``/proc/self/mounts`` above the path;
* the journal: ``has_journal`` in ``dumpe2fs -h DEVICE``'s features when the
  device is readable, else whether the kernel runs a jbd2 journal for it
  (``/proc/fs/jbd2/<device>-<inode>`` exists for every mounted ext3/ext4
  journal; a container may not open the root block device, as here);
* the data mode: ``data=`` in ``/proc/fs/ext4/<device>/options``.

:func:`loop_ext4` touches only what it made: the image file, the one loop
device ``losetup --find --show`` returned for it, and the mount point it
created; all three are removed on the way out, whatever happened inside.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

TOOLS = ("mkfs.ext4", "losetup", "mount", "umount")
UNMOUNT_DEADLINE = 30.0  # seconds to wait for a busy mount (a child still exiting)


class LoopUnavailable(RuntimeError):
    """The loop ext4 could not be set up; ``str()`` says why (shown to the user)."""


@dataclass(frozen=True, slots=True)
class Filesystem:
    """The filesystem a path is on, as the kernel reports it."""

    label: str  # for tables: "root (ext4, no journal)", "loop (ext4, journal, data=ordered)"
    mountpoint: str
    device: str
    fstype: str
    mount_options: str
    journal: bool | None  # None: not ext*, or not determinable
    data_mode: str | None  # ext3/ext4 data= mode (ordered, writeback, journal)
    features: str | None  # dumpe2fs -h "Filesystem features", when readable
    journal_evidence: str  # how ``journal`` was found


def _unescape(field: str) -> str:
    """``/proc/mounts`` writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _mount_of(path: Path) -> tuple[str, str, str, str]:
    """(device, mount point, type, options) of the mount ``path`` is on: the last
    of the longest matching mount points (a later mount hides an earlier one)."""
    target = os.path.realpath(path)
    best: tuple[str, str, str, str] | None = None
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            device, mountpoint, fstype, options = (_unescape(f) for f in line.split()[:4])
            inside = target == mountpoint or target.startswith(mountpoint.rstrip("/") + "/")
            if inside and (best is None or len(mountpoint) >= len(best[1])):
                best = (device, mountpoint, fstype, options)
    if best is None:
        raise LookupError(f"no mount above {target}")
    return best


def _features(device: str) -> str | None:
    try:
        done = subprocess.run(
            ["dumpe2fs", "-h", device], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in done.stdout.splitlines():
        if line.startswith("Filesystem features:"):
            return line.split(":", 1)[1].strip()
    return None


def describe(path: Path, name: str | None = None) -> Filesystem:
    """The filesystem ``path`` is on; ``name`` prefixes the label (default: the mount point,
    "root" for ``/``)."""
    device, mountpoint, fstype, options = _mount_of(path)
    journal: bool | None = None
    data_mode: str | None = None
    features: str | None = None
    evidence = "not an ext filesystem"
    if fstype in ("ext2", "ext3", "ext4"):
        dev = os.path.basename(device)
        features = _features(device)
        if features is not None:
            journal = "has_journal" in features.split()
            evidence = f"dumpe2fs -h {device}"
        else:
            jbd2 = Path("/proc/fs/jbd2")
            journal = jbd2.is_dir() and any(e.name.startswith(f"{dev}-") for e in jbd2.iterdir())
            evidence = f"/proc/fs/jbd2/{dev}-* {'present' if journal else 'absent'}"
        with_options = Path("/proc/fs/ext4") / dev / "options"
        try:
            kernel_options = with_options.read_text().split()
        except OSError:
            kernel_options = options.split(",")
        data_mode = next(
            (o.split("=", 1)[1] for o in kernel_options if o.startswith("data=")), None
        )
    detail = [fstype]
    if journal is not None:
        detail.append("journal" if journal else "no journal")
    if journal and data_mode:
        detail.append(f"data={data_mode}")
    label = f"{name or ('root' if mountpoint == '/' else mountpoint)} ({', '.join(detail)})"
    return Filesystem(
        label, mountpoint, device, fstype, options, journal, data_mode, features, evidence
    )


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LoopUnavailable(f"{' '.join(argv)}: {exc}") from exc
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise LoopUnavailable(f"{' '.join(argv)}: {why}")
    return done.stdout


def _unmount(mountpoint: Path) -> None:
    """``umount``, retried while the mount is busy (a process of the scenario still
    exiting), then lazily as a last resort so the device can still be detached."""
    deadline = time.monotonic() + UNMOUNT_DEADLINE
    while True:
        done = subprocess.run(["umount", str(mountpoint)], capture_output=True, text=True)
        if done.returncode == 0:
            return
        if time.monotonic() >= deadline:
            print(f"warning: {mountpoint} busy ({done.stderr.strip()}): lazy unmount", flush=True)
            subprocess.run(["umount", "--lazy", str(mountpoint)], check=False)
            return
        time.sleep(0.2)  # polling the kernel's busy state: nothing to wait on


def _detach(device: str) -> None:
    done = subprocess.run(["losetup", "--detach", device], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"warning: losetup --detach {device}: {done.stderr.strip()}", flush=True)


@contextmanager
def loop_ext4(parent: Path, size_bytes: int) -> Iterator[Path]:
    """A fresh ext4 (default ``mkfs.ext4`` options, so with a journal) mounted
    ``data=ordered`` from a sparse image file in ``parent``; yields its mount point.

    Raises :class:`LoopUnavailable` (before yielding) when not root, a tool is
    missing or a step fails, saying which and why.  The image is sparse: it
    takes on ``parent``'s disk only what the filesystem writes (~70 MB of
    journal and metadata at 2 GB, plus the scenario's files).
    """
    if os.geteuid() != 0:
        raise LoopUnavailable("not running as root (mkfs, losetup and mount need it)")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise LoopUnavailable(f"not found on PATH: {', '.join(missing)}")
    with ExitStack() as undo:
        fd, name = tempfile.mkstemp(prefix="loop-ext4-", suffix=".img", dir=parent)
        image = Path(name)
        undo.callback(image.unlink, missing_ok=True)
        try:
            os.ftruncate(fd, size_bytes)
        finally:
            os.close(fd)
        _run(["mkfs.ext4", "-q", "-F", str(image)])
        device = _run(["losetup", "--find", "--show", str(image)]).strip()
        if not device.startswith("/dev/loop"):
            raise LoopUnavailable(f"losetup --find --show printed {device!r}, not a loop device")
        undo.callback(_detach, device)
        mountpoint = Path(tempfile.mkdtemp(prefix="loop-ext4-mnt-", dir=parent))
        undo.callback(mountpoint.rmdir)
        _run(["mount", "-o", "data=ordered", device, str(mountpoint)])
        undo.callback(_unmount, mountpoint)
        yield mountpoint


def disk_usage(root: Path) -> int:
    """Bytes the files under ``root`` take on disk (allocated blocks, like ``du``)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for entry in (*dirnames, *filenames):
            try:
                total += os.lstat(os.path.join(dirpath, entry)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total
