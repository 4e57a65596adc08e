"""A Source built by resync 2.0.1's own CLI (``resync-build``), served by ``python -m http.server``.

What a Destination meets in the wild: the reference tool writes every document (Source
Description, Capability List, Resource List, Change List) and a plain static server
serves them (no ETag, ``Last-Modified`` in whole seconds).  :meth:`ResyncSource.round`
makes one round of creates, updates and deletes the way an operator would run it:
change files, ``resync-build --write-changelist`` against the last Resource List (the
Change List is *replaced*: only this round's changes, grouped by change type, deletions
dated with the deleted file's old modification time), then ``--write-resourcelist`` for
the next round's reference.

:func:`changelist_entries` reads a Change List with resync's own parser, so a test can
compare what rsnotify did with what the reference library says the Source published.

Used by ``test_resync_source.py`` (``subscribe --once``), ``test_resync_publish.py``
(``publish``) and the end-to-end acceptance test.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from resync import ChangeList as ResyncChangeList

from rsnotify.subscriber.mirror import TEMP_PREFIX, path_for
from tests.devstack import ManagedProcess

RESYNC_BUILD = str(Path(sys.executable).with_name("resync-build"))


@dataclass(frozen=True, slots=True)
class Listed:
    """One Change List entry as resync reads it: URI, change, change time (POSIX seconds)."""

    uri: str
    change: str
    timestamp: float


class ResyncSource:
    """A directory served by http.server whose documents resync-build writes."""

    def __init__(self, root: Path, base: str) -> None:
        self.root = root
        self.base = base
        self.files = root / "res"
        self.files.mkdir(parents=True, exist_ok=True)
        (root / ".well-known").mkdir(exist_ok=True)
        self.rounds = 0

    def url(self, name: str) -> str:
        return f"{self.base}{name}"

    def build(self, *args: str) -> None:
        done = subprocess.run(
            [RESYNC_BUILD, *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"resync-build {args}: {done.stdout}{done.stderr}"

    def mapping(self) -> str:
        return f"{self.url('res/')}={self.files}"

    def write_resourcelist(self) -> None:
        self.build(
            "--write-resourcelist",
            "--hash", "md5", "--hash", "sha-256",
            "--capabilitylist-link", self.url("capabilitylist.xml"),
            "--outfile", str(self.root / "resourcelist.xml"),
            self.mapping(),
        )  # fmt: skip

    def write_changelist(self) -> None:
        """The changes since the current Resource List (resync-build compares the two)."""
        self.build(
            "--write-changelist",
            "--reference", str(self.root / "resourcelist.xml"),
            "--hash", "md5", "--hash", "sha-256",
            "--capabilitylist-link", self.url("capabilitylist.xml"),
            "--outfile", str(self.root / "changelist.xml"),
            self.mapping(),
        )  # fmt: skip

    def publish_initial(self) -> None:
        self.write_resourcelist()
        self.build(
            "--write-changelist", "--empty",
            "--capabilitylist-link", self.url("capabilitylist.xml"),
            "--outfile", str(self.root / "changelist.xml"),
        )  # fmt: skip
        self.build(
            "--write-capabilitylist",
            f"resourcelist={self.url('resourcelist.xml')},"
            f"changelist={self.url('changelist.xml')}",
            "--sourcedescription-link", self.url(".well-known/resourcesync"),
            "--outfile", str(self.root / "capabilitylist.xml"),
        )  # fmt: skip
        self.build(
            "--write-sourcedescription", self.url("capabilitylist.xml"),
            "--outfile", str(self.root / ".well-known" / "resourcesync"),
        )  # fmt: skip

    def write(self, name: str, data: bytes, mtime: float | None = None) -> None:
        path = self.files / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if mtime is not None:
            os.utime(path, (mtime, mtime))

    def names(self) -> list[str]:
        """The resources' file names, relative to ``res/``, sorted."""
        return sorted(p.relative_to(self.files).as_posix() for p in self.files.rglob("*")
                      if p.is_file())  # fmt: skip

    def round(
        self,
        rng: random.Random,
        *,
        creates: int = 8,
        updates: int = 7,
        deletes: int = 5,
        plain: bool = False,
    ) -> list[Listed]:
        """Create, update and delete files, then publish this round's Change List.

        Returns the Change List's entries as resync reads them.  Updates and
        deletes pick existing files (as many as there are); new names include
        a space, an ampersand and non-ASCII letters, as real collections do
        (unless ``plain``).
        """
        self.rounds += 1
        existing = self.names()
        rng.shuffle(existing)
        doomed, touched = existing[:deletes], existing[deletes : deletes + updates]
        for name in doomed:
            (self.files / name).unlink()
        for name in touched:
            self.write(name, f"{name} as of round {self.rounds} {rng.random()}\n".encode())
        # plain: names resync-sync itself can fetch (its urllib refuses raw spaces).
        odd = [""] if plain else ["", " with space", " & more", " ü"]
        for k in range(creates):
            name = f"r{self.rounds:03d}/doc{k:02d}{odd[k % len(odd)]}.txt"
            self.write(name, f"{name}, created in round {self.rounds}\n".encode() * (k + 1))
        self.write_changelist()
        self.write_resourcelist()  # the next round's reference
        return changelist_entries(self.root / "changelist.xml")

    def served(self) -> dict[str, str]:
        """loc -> SHA-256 of every served resource file."""
        return {
            self.url("res/" + p.relative_to(self.files).as_posix()): hashlib.sha256(
                p.read_bytes()
            ).hexdigest()
            for p in self.files.rglob("*")
            if p.is_file()
        }


def changelist_entries(path: Path) -> list[Listed]:
    """A Change List's entries in document order, read by resync's own parser."""
    changes = ResyncChangeList()
    changes.parse(str(path))
    return [Listed(r.uri, r.change, float(r.timestamp)) for r in changes]


def served_source(
    tmp_path: Path, process_factory: Callable[..., ManagedProcess]
) -> tuple[ResyncSource, ManagedProcess]:
    """An empty ResyncSource directory and the ``python -m http.server`` serving it."""
    www = tmp_path / "www"
    www.mkdir()
    server = process_factory(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "-d", str(www), "0"],
        name="http.server",
    )
    port = server.wait_for_line(r"Serving HTTP on \S+ port (\d+)", timeout=30).group(1)
    return ResyncSource(www, f"http://127.0.0.1:{port}/"), server


def differences(source: ResyncSource, mirror: Path) -> list[str]:
    """What differs between the served files and a mirror (empty when equal by SHA-256)."""
    expected = {path_for(loc, mirror): sha for loc, sha in source.served().items()}
    found = {p for p in mirror.rglob("*") if p.is_file() and not p.name.startswith(TEMP_PREFIX)}
    out = [f"missing {p}" for p in expected.keys() - found]
    out += [f"extra {p}" for p in found - expected.keys()]
    out += [
        f"differs {p}"
        for p in found & expected.keys()
        if hashlib.sha256(p.read_bytes()).hexdigest() != expected[p]
    ]
    return sorted(out)
