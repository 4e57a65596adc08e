"""The mirror: loc -> path mapping (pure, property-tested) and safe atomic writes on real files.

Why one module of ~1,230 lines: it tests one package, :mod:`rsnotify.subscriber.mirror`; the
writing sections share ``temp_files``, ``chunks_of`` and the ``new_mirror`` fixture (new
temp files or spare inodes), while the pure path-mapping tests at the top share only the
package with them and could stand alone.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote_to_bytes, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsnotify import spare as spare_module
from rsnotify.errors import RsNotifyError
from rsnotify.spare import SparePool
from rsnotify.subscriber.mirror import (
    INDEX_NAME,
    TEMP_PREFIX,
    FixityMismatch,
    Mirror,
    MirrorError,
    PathConflict,
    SymlinkInMirror,
    UnsafePath,
    loc_for,
    path_for,
    paths,
)
from rsnotify.subscriber.mirror.replace import ReplaceStrategy, Staged
from tests.spares import require_spares, spare_mirror

ROOT = Path("/srv/mirror")
REPO = Path(__file__).resolve().parent.parent


async def chunks_of(parts: Iterable[bytes], *, pause: bool = False) -> AsyncIterator[bytes]:
    for part in parts:
        if pause:
            await asyncio.sleep(0)  # hand the loop to other tasks between chunks
        yield part


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(TEMP_PREFIX)]


# --- path mapping: table ----------------------------------------------------------

GOOD = [
    ("http://s/a/b.txt", "http/s/a/b.txt"),
    ("http://s", f"http/s/{INDEX_NAME}"),
    ("http://s/", f"http/s/{INDEX_NAME}"),
    ("http://s/dir/", f"http/s/dir/{INDEX_NAME}"),
    ("http://S:80/a", "http/s/a"),
    ("https://s:443/a", "https/s/a"),
    ("https://s/a", "https/s/a"),
    ("http://s:8080/a", "http/s_8080/a"),
    ("https://s:80/a", "https/s_80/a"),
    ("http://my_host:81/x", "http/my%5Fhost_81/x"),
    ("http://[::1]:8080/x", "http/[::1]_8080/x"),
    ("http://Bücher.example/x", "http/xn--bcher-kva.example/x"),
    ("http://s/a%2Fb", "http/s/a%2Fb"),
    ("http://s/%C3%BC/e%CC%81/%F0%9F%98%80%20&x.txt", "http/s/ü/e\u0301/😀 &x.txt"),
    ("http://s/ü/e\u0301/😀 &x.txt", "http/s/ü/e\u0301/😀 &x.txt"),
    ("http://s/%7Efoo", "http/s/~foo"),
    ("http://s/name?q=1", "http/s/name%3Fq=1"),
    ("http://s/name%3Fq=1", "http/s/name?q=1"),
    ("http://s/name?", "http/s/name%3F"),
    ("http://s/dir/?q=a%20b/c", f"http/s/dir/{INDEX_NAME}%3Fq=a%2520b%2Fc"),
    ("http://s/100%25", "http/s/100%25"),
    ("http://s/%25index", "http/s/%25index"),
    ("http://s/%FF%FE", "http/s/%FF%FE"),
    ("http://s/tab%09x", "http/s/tab%09x"),
    ("http://s/a#fragment", "http/s/a"),
    ("http://s/.hidden/..x/...", "http/s/.hidden/..x/..."),
]


@pytest.mark.parametrize(("loc", "relative"), GOOD)
def test_path_for_maps_inside_the_root(loc: str, relative: str) -> None:
    path = path_for(loc, ROOT)
    assert path == ROOT / relative
    assert path.relative_to(ROOT).parts[0] in ("http", "https")
    assert path_for(loc_for(path, ROOT), ROOT) == path


HOSTILE = [
    "http://s/a/../../etc/passwd",
    "http://s/%2e%2e/x",
    "http://s/%2E%2E",
    "http://s/./x",
    "http://s/a/%2e",
    "http://s/a//b",
    "http://s//etc/passwd",
    "http://s/a%00b",
    "http://s/a\\b",
    "http://s/a%5Cb",
    "http://s/a\nb",
    "http://s/a\tb",
    "file:///etc/passwd",
    "javascript:alert(1)",
    "ftp://s/x",
    "mailto:a@s",
    "data:text/plain,x",
    "/etc/passwd",
    "s/a",
    "",
    "http:///x",
    "http://u:p@s/x",
    "http://../x",
    "http://a b/x",
    "http://%2e%2e/x",
    "http://s:99999/x",
    "http://s/" + "x" * 256,
    "http://s/" + "ü" * 128,
    "http://s/" + "/".join(["d" * 200] * 21),
    # Lone surrogates: not characters (RFC 3629 section 3), refused, not a crash.
    "http://s/\udcff",
    "http://s/a\ud800b/c",
    "http://s/x?q=\udcff",
    "http://\udcff/x",
]


@pytest.mark.parametrize("loc", HOSTILE)
def test_path_for_refuses_hostile_locs(loc: str) -> None:
    with pytest.raises(UnsafePath):
        path_for(loc, ROOT)


# Pieces of hostile and ordinary locs: the short way of _path_for must answer
# exactly as the general way, refusal message included, whatever they make.
# Mostly plain schemes and hosts, so that most examples reach the path's checks.
_SCHEMES = st.sampled_from(["http", "http", "https", "https", "HTTP", "ftp", ""])
_AUTHORITIES = st.sampled_from(
    ["s", "s", "s", "127.0.0.1:40123", "S", "s:80", "s:8080", "s:", "s:x", "s:99999",
     "my_host", "u@s", "[::1]:81", "..", "a..b", "Bücher.example", "%2e%2e", "a b",
     "h" * 64 + "." + "h" * 200, ":", "s:0"]
)  # fmt: skip
_PIECES = st.sampled_from(
    ["a", "a", "B", ".", "..", ".", "..", "%2e", "%", "%25", "%2F", "%00", "\\", "\x00",
     "\t", " ", "ü", "?", "#", "?q=1", "~", ":@!$&'()*+,;=", "%index", "x" * 200,
     "y" * 256, "z" * 255, "\udcff", "\x7f", "_-"]
)  # fmt: skip
_NAMES = st.lists(_PIECES, max_size=2).map("".join)
_ROOTS = st.sampled_from([ROOT, Path("/"), Path("rel/mirror"), Path("/" + "r" * 3800)])


def _answer(mapping: Callable[[str, Path], Path], loc: str, root: Path) -> object:
    try:
        return mapping(loc, root)
    except Exception as exc:  # UnsafePath, or whatever else the general way raises
        return (type(exc), str(exc))


@settings(max_examples=3000, deadline=None)
@given(_SCHEMES, _AUTHORITIES, st.lists(_NAMES, max_size=24), _NAMES, _ROOTS)
def test_the_short_way_maps_as_the_general_way(
    scheme: str, authority: str, directories: list[str], leaf: str, root: Path
) -> None:
    loc = f"{scheme}://{authority}/" + "".join(f"{d}/" for d in directories) + leaf
    short = _answer(paths._path_for.__wrapped__, loc, root)
    assert short == _answer(paths._path_for_general, loc, root)


def test_the_short_way_is_taken_for_plain_locs(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the property above compares is the short way (not the general way twice)."""

    def general(loc: str, root: Path) -> Path:
        raise AssertionError(f"{loc} took the general way")

    monkeypatch.setattr(paths, "_path_for_general", general)
    for loc, relative in [
        ("http://s/a/b.txt", "http/s/a/b.txt"),
        ("https://127.0.0.1:40123/d/", f"https/127.0.0.1_40123/d/{INDEX_NAME}"),
        ("http://S:80/!$&'()*+,;=:@~-_.", "http/s/!$&'()*+,;=:@~-_."),
    ]:
        assert paths._path_for.__wrapped__(loc, ROOT) == ROOT / relative
    with pytest.raises(AssertionError):
        paths._path_for.__wrapped__("http://s/a%20b", ROOT)


def test_unsafe_path_is_a_documented_error() -> None:
    assert issubclass(UnsafePath, RsNotifyError)
    assert issubclass(SymlinkInMirror, UnsafePath)
    assert issubclass(FixityMismatch, MirrorError)


def test_equivalent_spellings_share_a_path_and_different_uris_do_not() -> None:
    assert path_for("http://s/%7e", ROOT) == path_for("http://s/~", ROOT)
    assert path_for("http://s/%c3%bc", ROOT) == path_for("http://s/ü", ROOT)
    distinct = [
        "http://s/a",
        "https://s/a",
        "http://s:81/a",
        "http://s/a/",
        "http://s/a?",
        "http://s/a?b",
        "http://s/a%3Fb",
        "http://s/a%2Fb",
        "http://s/a%252Fb",
        "http://s/%25index",
        "http://s/a_81/x",
        "http://s_81/a",
        "http://s%5F81/a",
        "http://s/\u00e9",
        "http://s/e\u0301",
    ]
    paths = []
    for loc in distinct:
        with_error = None
        try:
            paths.append(path_for(loc, ROOT))
        except UnsafePath as exc:  # only the %5F host is refused (no % in host names)
            with_error = exc
        assert with_error is None or loc == "http://s%5F81/a"
    assert len(set(paths)) == len(paths)


def test_loc_for_rejects_paths_the_mapping_cannot_make() -> None:
    for bad in [
        ROOT.parent / "elsewhere",
        ROOT / "http",
        ROOT / "ftp/s/x",
        ROOT / "http/s" / f"{TEMP_PREFIX}abc",
        ROOT / "http/s/%zz",
        ROOT / "http/s_x/a",
        ROOT / "http/s" / INDEX_NAME / "x",
    ]:
        with pytest.raises(MirrorError):
            loc_for(bad, ROOT)


# --- path mapping: properties ------------------------------------------------------

_SEGMENT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\\"),
    min_size=1,
    max_size=12,
).filter(lambda s: s not in (".", ".."))
_QUERY = st.none() | st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="#"),
    max_size=12,
)


def _build(segments: list[str], trailing: bool, query: str | None, port: int | None) -> str:
    host = "example.org" if port is None else f"example.org:{port}"
    path = "/".join(quote(s, safe="") for s in segments) + ("/" if trailing and segments else "")
    loc = f"https://{host}/{path}"
    if query is not None:
        loc += "?" + quote(query, safe="=&/?:@!$'()*+,;")
    return loc


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_SEGMENT, max_size=5),
    st.booleans(),
    _QUERY,
    st.none() | st.integers(1, 65535),
)
def test_mapping_round_trips(
    segments: list[str], trailing: bool, query: str | None, port: int | None
) -> None:
    loc = _build(segments, trailing, query, port)
    path = path_for(loc, ROOT)
    assert path.relative_to(ROOT).parts[0] == "https"
    assert all(part not in ("", ".", "..") for part in path.relative_to(ROOT).parts)
    back = loc_for(path, ROOT)
    assert path_for(back, ROOT) == path
    parts = urlsplit(back)
    decoded = [unquote_to_bytes(s) for s in parts.path[1:].split("/")]
    expected = [s.encode() for s in segments] + ([b""] if trailing or not segments else [])
    assert decoded == expected
    assert parts.query == urlsplit(loc).query
    assert (parts.port or 443) == (port or 443)


@settings(max_examples=200, deadline=None)
@given(st.lists(_SEGMENT, min_size=1, max_size=3), st.lists(_SEGMENT, min_size=1, max_size=3))
def test_different_resources_never_share_a_path(a: list[str], b: list[str]) -> None:
    if a != b:
        assert path_for(_build(a, False, None, None), ROOT) != path_for(
            _build(b, False, None, None), ROOT
        )


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_any_text_is_mapped_inside_the_root_or_refused(tail: str) -> None:
    try:
        path = path_for("http://s/" + tail, ROOT)
    except UnsafePath:
        return
    parts = path.relative_to(ROOT).parts
    assert parts[:2] == ("http", "s")
    assert all(part not in ("", ".", "..") and "/" not in part for part in parts)
    assert os.path.normpath(path) == str(path)


# --- writing ----------------------------------------------------------------------


async def test_write_atomic_stores_hashes_and_leaves_no_temp(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path / "m")
    path = mirror.path_for("http://s/dir/ü file.txt")
    data = [b"hello ", b"world", b""]
    written = await mirror.write_atomic(path, chunks_of(data))
    body = b"".join(data)
    assert path.read_bytes() == body
    assert written.length == len(body)
    assert written.digests == {
        "md5": hashlib.md5(body).hexdigest(),
        "sha-256": hashlib.sha256(body).hexdigest(),
    }
    length, digests = written  # a plain (length, digests) pair too
    assert length == len(body) and digests is written.digests
    assert temp_files(mirror.root) == []


async def test_fixity_mismatch_never_replaces_the_file(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path)
    path = mirror.path_for("http://s/a")
    await mirror.write_atomic(path, chunks_of([b"old"]))
    good = {"sha-256": hashlib.sha256(b"new").hexdigest(), "md5": hashlib.md5(b"new").hexdigest()}

    with pytest.raises(FixityMismatch) as caught:
        await mirror.write_atomic(path, chunks_of([b"bad"]), expected_hashes=good)
    assert set(caught.value.mismatched) == {"md5", "sha-256"}
    assert not caught.value.length_mismatch

    with pytest.raises(FixityMismatch) as caught:
        await mirror.write_atomic(path, chunks_of([b"ne"]), expected_length=3)
    assert caught.value.length_mismatch

    with pytest.raises(FixityMismatch) as too_long:
        await mirror.write_atomic(path, chunks_of([b"new", b"!" * 10]), expected_length=3)
    assert too_long.value.length == 13

    assert path.read_bytes() == b"old"
    assert temp_files(mirror.root) == []

    await mirror.write_atomic(
        path, chunks_of([b"n", b"ew"]), expected_length=3, expected_hashes=good
    )
    assert path.read_bytes() == b"new"


async def test_unknown_hash_algorithms_are_ignored_but_known_ones_checked(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path)
    path = mirror.path_for("http://s/a")
    sha1 = hashlib.sha1(b"x").hexdigest()
    written = await mirror.write_atomic(
        path, chunks_of([b"x"]), expected_hashes={"sha-1": sha1, "whirlpool": "00"}
    )
    assert written.digests["sha-1"] == sha1
    with pytest.raises(FixityMismatch):
        await mirror.write_atomic(path, chunks_of([b"y"]), expected_hashes={"sha-1": sha1})


async def test_a_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path)
    path = mirror.path_for("http://s/big.bin")
    old = b"o" * 300_000
    new_parts = [bytes([i % 251]) * 65536 for i in range(48)]  # ~3 MB
    new = b"".join(new_parts)
    await mirror.write_atomic(path, chunks_of([old]))

    seen: list[bytes | None] = []
    bad: list[int] = []
    stop = threading.Event()

    def read() -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def thread_reader() -> None:  # truly concurrent with the writer
        while not stop.is_set():
            data = read()
            if data not in (old, new):
                bad.append(len(data or b""))
            seen.append(b"t")

    async def loop_reader() -> None:  # runs between every chunk the writer receives
        while not stop.is_set():
            data = read()
            if data not in (old, new):
                bad.append(len(data or b""))
            seen.append(data)
            await asyncio.sleep(0)

    thread = threading.Thread(target=thread_reader)
    thread.start()
    reader = asyncio.create_task(loop_reader())
    try:
        await mirror.write_atomic(path, chunks_of(new_parts, pause=True))
        await asyncio.sleep(0)
    finally:
        stop.set()
        thread.join()
        await reader
    assert bad == []
    assert sum(1 for s in seen if s == old) >= len(new_parts) // 2  # reads happened mid-write
    assert path.read_bytes() == new


async def test_kill_9_mid_write_leaves_only_a_temp_file(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path)
    loc = "http://s/d/victim.txt"
    path = mirror.path_for(loc)
    await mirror.write_atomic(path, chunks_of([b"old"]))
    script = (
        "import asyncio, sys\n"
        "from rsnotify.subscriber.mirror import Mirror\n"
        "async def main():\n"
        "    m = Mirror(sys.argv[1])\n"
        "    async def chunks():\n"
        "        yield b'x' * 65536\n"
        "        yield b'y' * 65536\n"
        "        print('writing', flush=True)\n"
        "        await asyncio.Event().wait()\n"
        "    await m.write_atomic(m.path_for(sys.argv[2]), chunks())\n"
        "asyncio.run(main())\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path), loc],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        text=True,
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 30)
        assert line.strip() == "writing", child.stderr.read()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    assert path.read_bytes() == b"old"
    leftovers = temp_files(mirror.root)
    assert len(leftovers) == 1 and leftovers[0].parent == path.parent
    assert leftovers[0].stat().st_size > 0

    assert Mirror(tmp_path).cleanup_temp() == 1
    assert temp_files(mirror.root) == []
    assert path.read_bytes() == b"old"


async def test_cancelled_write_leaves_nothing_behind(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path)
    path = mirror.path_for("http://s/c")
    started = asyncio.Event()

    async def stalled() -> AsyncIterator[bytes]:
        yield b"partial"
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(mirror.write_atomic(path, stalled()))
    await started.wait()
    assert len(temp_files(mirror.root)) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not path.exists()
    assert temp_files(mirror.root) == []


# --- symlinks and conflicts -------------------------------------------------------


async def test_symlink_escaping_the_root_is_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    mirror = Mirror(tmp_path / "m")
    (mirror.root / "http" / "s").mkdir(parents=True)
    (mirror.root / "http" / "s" / "docs").symlink_to(outside, target_is_directory=True)
    path = mirror.path_for("http://s/docs/x.txt")

    with pytest.raises(SymlinkInMirror):
        await mirror.write_atomic(path, chunks_of([b"pwned"]))
    with pytest.raises(SymlinkInMirror):
        await mirror.write_atomic(mirror.path_for("http://s/docs/new/deeper"), chunks_of([b"x"]))
    (outside / "victim").write_bytes(b"keep")
    with pytest.raises(SymlinkInMirror):
        await mirror.delete(mirror.path_for("http://s/docs/victim"))
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_bytes() == b"keep"


async def test_symlinked_host_directory_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    mirror = Mirror(tmp_path / "m")
    (mirror.root / "http").mkdir()
    (mirror.root / "http" / "s").symlink_to(outside)
    with pytest.raises(SymlinkInMirror):
        await mirror.write_atomic(mirror.path_for("http://s/a"), chunks_of([b"x"]))
    assert list(outside.iterdir()) == []


async def test_symlink_as_the_final_name_is_replaced_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"keep")
    mirror = Mirror(tmp_path / "m")
    path = mirror.path_for("http://s/link")
    path.parent.mkdir(parents=True)
    path.symlink_to(outside)
    await mirror.write_atomic(path, chunks_of([b"mirror"]))
    assert not path.is_symlink()
    assert path.read_bytes() == b"mirror"
    assert outside.read_bytes() == b"keep"


async def test_a_symlinked_root_is_fine(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    mirror = Mirror(tmp_path / "alias")
    await mirror.write_atomic(mirror.path_for("http://s/a"), chunks_of([b"x"]))
    assert (real / "http" / "s" / "a").read_bytes() == b"x"


async def test_file_and_directory_conflicts_are_reported(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path)
    await mirror.write_atomic(mirror.path_for("http://s/a"), chunks_of([b"file"]))
    with pytest.raises(PathConflict):
        await mirror.write_atomic(mirror.path_for("http://s/a/b"), chunks_of([b"x"]))
    await mirror.write_atomic(mirror.path_for("http://s/d/e"), chunks_of([b"x"]))
    with pytest.raises(PathConflict):
        await mirror.write_atomic(mirror.path_for("http://s/d"), chunks_of([b"x"]))
    assert mirror.path_for("http://s/a").read_bytes() == b"file"
    assert temp_files(mirror.root) == []


async def test_delete(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path)
    path = mirror.path_for("http://s/x/y")
    assert await mirror.delete(path) is False  # directory missing: fine
    await mirror.write_atomic(path, chunks_of([b"x"]))
    assert await mirror.delete(path) is True
    assert not path.exists()
    assert await mirror.delete(path) is False  # already gone: fine
    await mirror.write_atomic(mirror.path_for("http://s/x/z"), chunks_of([b"z"]))
    assert await mirror.delete(mirror.path_for("http://s/x")) is False  # a directory: kept
    assert mirror.path_for("http://s/x/z").read_bytes() == b"z"


def test_a_temp_name_already_taken_is_drawn_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Temp names come from a per-process generator (no syscall per write): O_EXCL
    makes the file fresh, and a name already on disk is replaced by the next draw."""
    import random

    from rsnotify.subscriber.mirror import replace as module

    monkeypatch.setattr(module, "_NAMES", random.Random(7))
    first = f"{TEMP_PREFIX}{random.Random(7).getrandbits(64):016x}"
    (tmp_path / first).write_bytes(b"left by an interrupted write")
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd, name = module.new_temp(dir_fd)
        os.close(fd)
        assert name != first and module._TEMP_NAME.fullmatch(name)
        assert (tmp_path / name).read_bytes() == b""
        assert (tmp_path / first).read_bytes() == b"left by an interrupted write"
        monkeypatch.setattr(module, "_TEMP_ATTEMPTS", 2)
        monkeypatch.setattr(module, "_NAMES", random.Random(7))  # both draws are taken now
        with pytest.raises(FileExistsError):
            module.new_temp(dir_fd)
    finally:
        os.close(dir_fd)


async def test_paths_outside_the_root_are_refused(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path / "m")
    with pytest.raises(UnsafePath):
        await mirror.write_atomic(tmp_path / "elsewhere", chunks_of([b"x"]))
    with pytest.raises(UnsafePath):
        await mirror.write_atomic(mirror.root / "http" / ".." / "x", chunks_of([b"x"]))
    with pytest.raises(UnsafePath):
        await mirror.delete(tmp_path / "elsewhere")


def test_cleanup_temp_only_removes_temp_files_the_mirror_makes_where_it_makes_them(
    tmp_path: Path,
) -> None:
    """Issue 22: ``--into /`` deleted other programs' ``%tmp.*`` files, and a user's
    ``%tmp.precious-user-file`` went too.  Only names of ``_new_temp``'s shape, under
    ``http/`` and ``https/`` (where every resource is), are the mirror's own."""
    mirror = Mirror(tmp_path)
    keep = mirror.path_for("http://s/%25tmp.real")  # a resource that looks like a temp name
    keep.parent.mkdir(parents=True)
    keep.write_bytes(b"resource")
    ours = [keep.parent / f"{TEMP_PREFIX}0123456789abcdef"]
    ours.append(mirror.path_for("https://t/a/b").parent / f"{TEMP_PREFIX}fedcba9876543210")
    ours[1].parent.mkdir(parents=True)
    theirs = [
        keep.parent / f"{TEMP_PREFIX}precious-user-file",
        keep.parent / f"{TEMP_PREFIX}0123",
        keep.parent / f"{TEMP_PREFIX}0123456789ABCDEF",  # upper-case hex: never ours
        mirror.root / f"{TEMP_PREFIX}0123456789abcdef",  # outside http/ and https/
        mirror.root / "other-app" / f"{TEMP_PREFIX}0123456789abcdef",
    ]
    theirs[-1].parent.mkdir()
    for path in ours + theirs:
        path.write_bytes(b"junk")
    assert mirror.cleanup_temp() == 2
    assert not any(p.exists() for p in ours)
    assert all(p.read_bytes() == b"junk" for p in theirs)
    assert keep.read_bytes() == b"resource"


# --- in-memory writes (write_bytes) ------------------------------------------------


MirrorFactory = Callable[[Path], Mirror]


@pytest.fixture(params=["new temp files", "spare inodes"])
def new_mirror(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> MirrorFactory:
    """Mirrors whose batched writes use fresh temp files, or the spare pool (both must hold).

    Spares are reused at once here (MIN_AGE 0), so these tests exercise reuse.
    """
    monkeypatch.setattr(spare_module, "MIN_AGE", 0.0)

    def make(root: Path) -> Mirror:
        if request.param == "new temp files":
            return Mirror(root)
        require_spares(tmp_path)
        mirror = Mirror(root, spare_dir=tmp_path.parent / f"{tmp_path.name}-spare")
        assert mirror.spares is not None and mirror.spares.enabled
        return mirror

    return make


async def test_write_bytes_verifies_before_touching_the_file(
    tmp_path: Path, new_mirror: MirrorFactory
) -> None:
    """The one-job path keeps every rule of write_atomic: fixity first, atomic, no temp."""
    mirror = new_mirror(tmp_path / "m")
    path = mirror.path_for("http://s/dir/ü file.txt")
    written = await mirror.write_bytes(path, b"old")
    assert path.read_bytes() == b"old"
    assert written == (3, {"md5": hashlib.md5(b"old").hexdigest(),
                           "sha-256": hashlib.sha256(b"old").hexdigest()})  # fmt: skip
    good = {"sha-256": hashlib.sha256(b"new").hexdigest(), "md5": hashlib.md5(b"new").hexdigest()}
    with pytest.raises(FixityMismatch) as caught:
        await mirror.write_bytes(path, b"bad", expected_hashes=good)
    assert set(caught.value.mismatched) == {"md5", "sha-256"}
    with pytest.raises(FixityMismatch) as caught:
        await mirror.write_bytes(path, b"new!", expected_length=3, expected_hashes=good)
    assert caught.value.length_mismatch and caught.value.length == 4
    assert path.read_bytes() == b"old"
    assert temp_files(mirror.root) == []
    sha1 = hashlib.sha1(b"new").hexdigest()
    written = await mirror.write_bytes(
        path, b"new", expected_length=3, expected_hashes={**good, "sha-1": sha1, "whirl": "0"}
    )
    assert path.read_bytes() == b"new" and written.digests["sha-1"] == sha1
    assert temp_files(mirror.root) == []


async def test_write_bytes_refuses_symlinks_conflicts_and_outside_paths(
    tmp_path: Path, new_mirror: MirrorFactory
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    mirror = new_mirror(tmp_path / "m")
    (mirror.root / "http" / "s").mkdir(parents=True)
    (mirror.root / "http" / "s" / "docs").symlink_to(outside, target_is_directory=True)
    with pytest.raises(SymlinkInMirror):
        await mirror.write_bytes(mirror.path_for("http://s/docs/x.txt"), b"pwned")
    assert list(outside.iterdir()) == []
    await mirror.write_bytes(mirror.path_for("http://s/a"), b"file")
    with pytest.raises(PathConflict):
        await mirror.write_bytes(mirror.path_for("http://s/a/b"), b"x")
    await mirror.write_bytes(mirror.path_for("http://s/d/e"), b"x")
    with pytest.raises(PathConflict):
        await mirror.write_bytes(mirror.path_for("http://s/d"), b"x")
    with pytest.raises(UnsafePath):
        await mirror.write_bytes(tmp_path / "elsewhere", b"x")
    assert mirror.path_for("http://s/a").read_bytes() == b"file"
    assert temp_files(mirror.root) == []


async def test_write_bytes_finishes_when_its_caller_is_cancelled(
    tmp_path: Path, new_mirror: MirrorFactory
) -> None:
    """Once handed to the worker the write completes; settle() waits for it."""
    mirror = new_mirror(tmp_path)
    path = mirror.path_for("http://s/c")
    task = asyncio.create_task(mirror.write_bytes(path, b"data"))
    await asyncio.sleep(0)  # let the task submit its job
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await mirror.settle()
    assert path.read_bytes() == b"data"
    assert temp_files(mirror.root) == []


async def test_many_concurrent_writes_into_one_directory(
    tmp_path: Path, new_mirror: MirrorFactory
) -> None:
    """Directory fsyncs are shared between concurrent renames; every file still lands."""
    mirror = new_mirror(tmp_path)
    bodies = {f"http://s/res/r{i}": os.urandom(100 + i) for i in range(200)}
    await asyncio.gather(
        *(mirror.write_bytes(mirror.path_for(loc), body) for loc, body in bodies.items()),
        *(mirror.write_atomic(mirror.path_for(loc + "s"), chunks_of([body]))
          for loc, body in bodies.items()),
    )  # fmt: skip
    for loc, body in bodies.items():
        assert mirror.path_for(loc).read_bytes() == body
        assert mirror.path_for(loc + "s").read_bytes() == body
    assert temp_files(mirror.root) == []


async def test_a_batch_walks_each_directory_once(
    tmp_path: Path, new_mirror: MirrorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes and deletes of one batch share the directory's walk from the root, not its safety."""
    from rsnotify.subscriber.mirror import safedirs

    mirror = new_mirror(tmp_path)
    await mirror.write_bytes(mirror.path_for("http://s/res/first"), b"first")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"keep")
    (mirror.path_for("http://s/res/first").parent.parent / "link").symlink_to(outside)
    walks: list[tuple[str, ...]] = []
    real = safedirs.open_dirs

    def counting(root: Path, names: tuple[str, ...], **kwargs: object) -> object:
        walks.append(names)
        return real(root, names, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(safedirs, "open_dirs", counting)
    bodies = {f"http://s/res/r{i}": os.urandom(50 + i) for i in range(100)}
    gone = [mirror.path_for(f"http://s/res/g{i}") for i in range(100)] + [
        mirror.path_for("http://s/res/first"),
        mirror.path_for("http://s/link/victim"),  # through a symlink: refused, as ever
    ]
    _, removed = await asyncio.gather(
        asyncio.gather(*(mirror.write_bytes(mirror.path_for(k), v) for k, v in bodies.items())),
        mirror.delete_many(gone),
    )
    assert all(mirror.path_for(k).read_bytes() == v for k, v in bodies.items())
    assert removed[:100] == [False] * 100 and removed[100] is True
    assert isinstance(removed[101], UnsafePath)
    assert (outside / "victim").read_bytes() == b"keep"
    # One walk of res/ per batch (at most a few batches), and one of link/ (refused).
    assert len(walks) <= 2 * 4, walks
    assert walks.count(("http", "s", "link")) >= 1


class _CountingCondition(threading.Condition):
    """A Condition that counts the threads waiting on it (to know they are parked)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting += 1  # called with the lock held
        try:
            return super().wait(timeout)
        finally:
            self.waiting -= 1


def _parked_syncer(
    monkeypatch: pytest.MonkeyPatch, fail: set[int]
) -> tuple[object, threading.Event, list[tuple[int, float, float]]]:
    """A DirSyncer whose fsync #1 blocks until released and #n in ``fail`` raises."""
    from rsnotify.subscriber.mirror import durability as module

    syncer = module.DirSyncer()
    syncer._cond = _CountingCondition()  # type: ignore[assignment]
    release = threading.Event()
    fsyncs: list[tuple[int, float, float]] = []  # (number, started, finished), monotonic
    real_fsync = os.fsync
    lock = threading.Lock()

    def fake_fsync(fd: int) -> None:
        with lock:
            number = len(fsyncs) + 1
            fsyncs.append((number, 0.0, 0.0))
        started = time.monotonic()
        if number == 1:
            assert release.wait(30)
        real_fsync(fd)
        fsyncs[number - 1] = (number, started, time.monotonic())
        if number in fail:
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(module.os, "fsync", fake_fsync)
    return syncer, release, fsyncs


def test_directory_fsyncs_are_group_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Callers arriving while an fsync runs share the next one, which starts after them."""

    from tests.devstack import wait_for

    syncer, release, fsyncs = _parked_syncer(monkeypatch, fail=set())
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    calls: dict[str, tuple[float, float]] = {}

    def call(name: str) -> None:
        entered = time.monotonic()
        syncer.sync(fd)  # type: ignore[attr-defined]
        calls[name] = (entered, time.monotonic())

    try:
        first = threading.Thread(target=call, args=("first",))
        first.start()
        wait_for(lambda: len(fsyncs) == 1, timeout=10)  # fsync #1 runs (parked)
        others = [threading.Thread(target=call, args=(f"t{i}",)) for i in range(6)]
        for thread in others:
            thread.start()
        wait_for(lambda: syncer._cond.waiting == 6, timeout=10)  # type: ignore[attr-defined]
        release.set()
        for thread in [first, *others]:
            thread.join(30)
    finally:
        release.set()
        os.close(fd)
    assert len(fsyncs) == 2  # seven callers, two fsyncs
    for name, (entered, returned) in calls.items():
        # Some fsync that began after the caller arrived ended before it returned.
        assert any(entered <= s and f <= returned for _, s, f in fsyncs), name
    assert len(calls) == 7


def test_a_failed_shared_directory_fsync_fails_every_caller_it_covered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.devstack import wait_for

    syncer, release, fsyncs = _parked_syncer(monkeypatch, fail={2})
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    errors: dict[str, BaseException | None] = {}

    def call(name: str) -> None:
        try:
            syncer.sync(fd)  # type: ignore[attr-defined]
            errors[name] = None
        except OSError as exc:
            errors[name] = exc

    try:
        first = threading.Thread(target=call, args=("first",))
        first.start()
        wait_for(lambda: len(fsyncs) == 1, timeout=10)
        others = [threading.Thread(target=call, args=(f"t{i}",)) for i in range(4)]
        for thread in others:
            thread.start()
        wait_for(lambda: syncer._cond.waiting == 4, timeout=10)  # type: ignore[attr-defined]
        release.set()
        for thread in [first, *others]:
            thread.join(30)
        assert errors.pop("first") is None  # its fsync (#1) succeeded
        assert len(errors) == 4 and all(isinstance(e, OSError) for e in errors.values())
        syncer.sync(fd)  # type: ignore[attr-defined]  # a later caller gets a fresh fsync (#3)
        assert len(fsyncs) == 3
    finally:
        release.set()
        os.close(fd)


async def test_a_batch_fails_only_its_bad_writes(tmp_path: Path, new_mirror: MirrorFactory) -> None:
    """Writes queued together share a batch; a mismatch or conflict fails only itself."""
    mirror = new_mirror(tmp_path)
    await mirror.write_bytes(mirror.path_for("http://s/d/e"), b"x")  # d is a directory
    good = {f"http://s/res/r{i}": f"body {i}".encode() for i in range(20)}
    wrong = {"md5": hashlib.md5(b"something else").hexdigest()}
    outcomes = await asyncio.gather(
        *(mirror.write_bytes(mirror.path_for(loc), body) for loc, body in good.items()),
        mirror.write_bytes(mirror.path_for("http://s/res/bad"), b"bad", expected_hashes=wrong),
        mirror.write_bytes(mirror.path_for("http://s/d"), b"conflict"),
        return_exceptions=True,
    )
    assert isinstance(outcomes[-2], FixityMismatch)
    assert isinstance(outcomes[-1], PathConflict)
    for (loc, body), written in zip(good.items(), outcomes, strict=False):
        assert written == (len(body), {"md5": hashlib.md5(body).hexdigest(),
                                       "sha-256": hashlib.sha256(body).hexdigest()})  # fmt: skip
        assert mirror.path_for(loc).read_bytes() == body
    assert not mirror.path_for("http://s/res/bad").exists()
    assert temp_files(mirror.root) == []


async def test_a_batched_write_returns_only_once_durable(
    tmp_path: Path, new_mirror: MirrorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per file: fsync of the bytes, then rename, then a directory fsync, then "written".

    The caller (the applier) records a change as applied only after write_bytes
    returns, so this order is what makes a batched apply crash-safe.
    """
    from rsnotify.subscriber.mirror import commit as module

    trace: list[tuple[str, object]] = []
    lock = threading.Lock()
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        real_fsync(fd)
        info = os.fstat(fd)
        with lock:
            trace.append(("fsync", (info.st_dev, info.st_ino)))

    def replace(src: str, dst: str, **kwargs: int) -> None:
        real_replace(src, dst, **kwargs)
        info = os.stat(dst, dir_fd=kwargs["dst_dir_fd"])
        with lock:
            trace.append(("rename", (info.st_dev, info.st_ino)))

    real_install, real_settle = SparePool.install, SparePool.settle
    settled: list[tuple[int, int]] = []  # (trace length at install, at settle) per retired inode

    def install(
        self: SparePool, slot: str, dir_fd: int | None, name: str, *, settle: bool = True
    ) -> str | None:
        retired = real_install(self, slot, dir_fd, name, settle=settle)  # stands for the rename
        info = os.stat(name, dir_fd=dir_fd)
        with lock:
            trace.append(("rename", (info.st_dev, info.st_ino)))
            if retired is not None:
                installed[retired] = len(trace)
        return retired

    def settle(self: SparePool, slot: str) -> None:
        with lock:
            settled.append((installed.pop(slot), len(trace)))
        real_settle(self, slot)

    installed: dict[str, int] = {}
    monkeypatch.setattr(module.os, "fsync", fsync)
    monkeypatch.setattr(module.os, "replace", replace)
    monkeypatch.setattr(SparePool, "install", install)
    monkeypatch.setattr(SparePool, "settle", settle)
    mirror = new_mirror(tmp_path)
    locs = [f"http://s/res/r{i}" for i in range(30)]
    returned: dict[str, int] = {}

    async def write(loc: str, version: str) -> None:
        await mirror.write_bytes(mirror.path_for(loc), f"{loc} {version}".encode())
        with lock:
            returned[loc] = len(trace)  # how much had happened when the caller heard

    directory: os.stat_result | None = None
    for version in ("created", "updated"):  # the update swaps, retiring an inode per file
        trace.clear()
        await asyncio.gather(*(write(loc, version) for loc in locs))
        directory = os.stat(mirror.path_for(locs[0]).parent)
        dir_key = (directory.st_dev, directory.st_ino)
        assert len([e for e in trace if e == ("fsync", dir_key)]) < len(locs)  # shared
        for loc in locs:
            info = os.stat(mirror.path_for(loc))
            inode = (info.st_dev, info.st_ino)
            synced = trace.index(("fsync", inode))
            renamed = trace.index(("rename", inode))
            dir_synced = next(
                i for i, event in enumerate(trace) if i > renamed and event == ("fsync", dir_key)
            )
            assert synced < renamed < dir_synced < returned[loc], loc
        # A retired inode becomes reusable only after a directory fsync that followed its swap.
        if mirror.spares is not None and version == "updated":
            assert len(settled) == len(locs)
        for at_install, at_settle in settled:
            assert ("fsync", dir_key) in trace[at_install:at_settle]
        settled.clear()
    if mirror.spares is not None:
        assert not installed  # every retired inode was settled
        assert mirror.spares.reused > 0 or mirror.spares.allocated > 0


def test_a_batch_starts_writeback_of_every_file_before_its_first_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hint that lets one journal commit cover a whole batch (``commit.start_writeback``).

    It was once looked up as ``os.sync_file_range``, which CPython does not
    have, so it silently never ran: each fsync of a batch then committed a
    journal transaction of its own.  Every file of a batch of several must
    have its writeback started before the batch's first fsync.
    """
    from rsnotify.subscriber.mirror import commit as module
    from rsnotify.subscriber.mirror.durability import DirSyncer
    from rsnotify.subscriber.mirror.replace import make_replace

    real_fadvise, real_fsync = module._FADVISE, os.fsync
    assert real_fadvise is not None, "posix_fadvise is missing: no writeback hint on Linux"
    trace: list[tuple[str, tuple[int, int]]] = []

    def key(fd: int) -> tuple[int, int]:
        info = os.fstat(fd)
        return (info.st_dev, info.st_ino)

    def fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        assert (offset, length, advice) == (0, 0, os.POSIX_FADV_DONTNEED)
        trace.append(("writeback", key(fd)))
        real_fadvise(fd, offset, length, advice)

    def fsync(fd: int) -> None:
        trace.append(("fsync", key(fd)))
        real_fsync(fd)

    monkeypatch.setattr(module, "_FADVISE", fadvise)
    monkeypatch.setattr(module.os, "fsync", fsync)
    root = tmp_path / "mirror"
    root.mkdir()
    strategy = make_replace(root, None)
    items = []
    for i in range(5):
        item = module.prepare_write(root, ("d", f"f{i}"), f"d/f{i}", strategy, reuse=False)
        strategy.write(item, f"body {i}".encode())
        items.append(item)
    files = [key(item.fd) for item in items]
    assert module.commit(items, strategy, DirSyncer()) == [True] * 5
    first_fsync = next(i for i, (what, _) in enumerate(trace) if what == "fsync")
    assert sorted(trace[:first_fsync]) == sorted(("writeback", f) for f in files)
    assert [("fsync", f) for f in files] == [e for e in trace if e[1] in files and e[0] == "fsync"]
    assert [(root / "d" / f"f{i}").read_bytes() for i in range(5)] == [
        f"body {i}".encode() for i in range(5)
    ]


def _staged_batch(root: Path, count: int) -> tuple[list[Staged], ReplaceStrategy]:
    """``count`` writes staged under ``root/d`` (bytes in temp files), and their strategy."""
    from rsnotify.subscriber.mirror import commit as module
    from rsnotify.subscriber.mirror.replace import make_replace

    root.mkdir(exist_ok=True)
    strategy = make_replace(root, None)
    items = []
    for i in range(count):
        item = module.prepare_write(root, ("d", f"f{i}"), f"d/f{i}", strategy, reuse=False)
        strategy.write(item, f"body {i}".encode())
        items.append(item)
    return items, strategy


def test_a_batch_fsyncs_its_temp_files_at_the_same_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flushers fsync together, so the device's cache flushes they ask for merge.

    Each fsync here waits at a barrier for three others: fsyncs one after
    the other would never get there (the barrier times out and the files
    fail).  Every temp file is fsynced exactly once; that each is fsynced
    before its rename is test_a_batched_write_returns_only_once_durable's.
    """
    from concurrent.futures import ThreadPoolExecutor

    from rsnotify.subscriber.mirror import commit as module
    from rsnotify.subscriber.mirror.durability import DirSyncer

    items, strategy = _staged_batch(tmp_path / "mirror", 8)
    temps = {os.fstat(item.fd).st_ino for item in items}
    together = threading.Barrier(4, timeout=10)
    real_fsync = os.fsync
    synced: list[int] = []

    def fsync(fd: int) -> None:
        inode = os.fstat(fd).st_ino
        if inode in temps:
            together.wait()
            synced.append(inode)
        real_fsync(fd)

    monkeypatch.setattr(module.os, "fsync", fsync)
    with ThreadPoolExecutor(4) as pool:
        assert module.commit(items, strategy, DirSyncer(), (pool, 4)) == [True] * 8
    assert sorted(synced) == sorted(temps)
    assert [(tmp_path / "mirror" / "d" / f"f{i}").read_bytes() for i in range(8)] == [
        f"body {i}".encode() for i in range(8)
    ]
    assert temp_files(tmp_path / "mirror") == []


def test_the_writer_fsyncs_one_share_itself_beside_the_flushers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of two hands one file to a flusher and fsyncs the other itself, at once.

    The writer would only wait meanwhile, and each job is a thread wake-up
    (bench._common.handoff_probe_us: 70-200 us of CPU on the bench VM).  Both
    fsyncs meet at a barrier: the writer's own is concurrent, not after.
    """
    from concurrent.futures import Future, ThreadPoolExecutor

    from rsnotify.subscriber.mirror import commit as module
    from rsnotify.subscriber.mirror.durability import DirSyncer

    class Counting(ThreadPoolExecutor):
        submitted = 0

        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
            Counting.submitted += 1
            return super().submit(fn, *args, **kwargs)

    items, strategy = _staged_batch(tmp_path / "mirror", 2)
    temps = {os.fstat(item.fd).st_ino for item in items}
    together = threading.Barrier(2, timeout=10)
    real_fsync = os.fsync
    callers: set[str] = set()

    def fsync(fd: int) -> None:
        if os.fstat(fd).st_ino in temps:
            together.wait()
            callers.add(threading.current_thread().name)
        real_fsync(fd)

    monkeypatch.setattr(module.os, "fsync", fsync)
    with Counting(16, thread_name_prefix="flusher") as pool:
        assert module.commit(items, strategy, DirSyncer(), (pool, 16)) == [True] * 2
    assert Counting.submitted == 1
    assert threading.current_thread().name in callers and len(callers) == 2


def test_a_failed_fsync_fails_only_its_own_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An fsync that fails (EIO) among the flushers: that write is refused, the rest land.

    Its target keeps its old bytes and its temp file is removed; the other
    writes of the batch are renamed and durable as usual.
    """
    from concurrent.futures import ThreadPoolExecutor

    from rsnotify.subscriber.mirror import commit as module
    from rsnotify.subscriber.mirror.durability import DirSyncer

    root = tmp_path / "mirror"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f3").write_bytes(b"old bytes")
    items, strategy = _staged_batch(root, 6)
    bad = os.fstat(items[3].fd).st_ino
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.fstat(fd).st_ino == bad:
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(module.os, "fsync", fsync)
    with ThreadPoolExecutor(3) as pool:
        outcomes = module.commit(items, strategy, DirSyncer(), (pool, 3))
    assert isinstance(outcomes[3], OSError) and outcomes[3].errno == errno.EIO
    assert outcomes[:3] + outcomes[4:] == [True] * 5
    assert (root / "d" / "f3").read_bytes() == b"old bytes"
    for i in (0, 1, 2, 4, 5):
        assert (root / "d" / f"f{i}").read_bytes() == f"body {i}".encode()
    assert temp_files(root) == []
    assert all(item.fd == -1 for item in items)


async def test_a_directory_refusing_swaps_is_written_the_plain_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EXDEV from the swap (project quota, bind mount): the write still lands, plainly."""
    mirror = spare_mirror(tmp_path, monkeypatch)
    path = mirror.path_for("http://s/q/a")
    await mirror.write_bytes(path, b"v1")
    refused: list[str] = []

    def refuse(*args: object) -> None:
        refused.append(str(args[3]))
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(spare_module, "exchange", refuse)
    await mirror.write_bytes(path, b"v2")
    assert path.read_bytes() == b"v2" and refused == ["a"]
    await mirror.write_bytes(path, b"v3")  # that directory is now written the plain way
    assert path.read_bytes() == b"v3" and refused == ["a"]
    assert temp_files(mirror.root) == []


async def test_deletes_share_batches_with_writes(tmp_path: Path, new_mirror: MirrorFactory) -> None:
    """Deletes queued beside writes: each reports as before, and queue order holds per path."""
    mirror = new_mirror(tmp_path)
    for name in ("old", "both"):
        await mirror.write_bytes(mirror.path_for(f"http://s/r/{name}"), b"x")
    await mirror.write_bytes(mirror.path_for("http://s/r/dir/inner"), b"x")
    results = await asyncio.gather(
        mirror.write_bytes(mirror.path_for("http://s/r/new"), b"new"),
        mirror.delete(mirror.path_for("http://s/r/old")),
        mirror.delete(mirror.path_for("http://s/r/missing")),
        mirror.delete(mirror.path_for("http://s/nodir/missing")),
        mirror.delete(mirror.path_for("http://s/r/dir")),
        mirror.delete(mirror.path_for("http://s/r/both")),
        mirror.write_bytes(mirror.path_for("http://s/r/both"), b"again"),
    )
    assert results[1:6] == [True, False, False, False, True]
    assert mirror.path_for("http://s/r/new").read_bytes() == b"new"
    assert not mirror.path_for("http://s/r/old").exists()
    assert mirror.path_for("http://s/r/dir/inner").read_bytes() == b"x"  # a directory: kept
    assert mirror.path_for("http://s/r/both").read_bytes() == b"again"  # delete, then write
    assert temp_files(mirror.root) == []


async def test_writes_of_one_path_keep_their_order_across_batches(
    tmp_path: Path, new_mirror: MirrorFactory
) -> None:
    """Batches run concurrently, but a path in flight holds back its later writes."""
    mirror = new_mirror(tmp_path)
    path = mirror.path_for("http://s/r/hot")
    others = [mirror.write_bytes(mirror.path_for(f"http://s/r/o{i}"), b"o") for i in range(40)]
    hot = [mirror.write_bytes(path, f"v{i}".encode()) for i in range(12)]
    gone = mirror.delete(path)
    last = mirror.write_bytes(path, b"last")
    mixed = [x for pair in zip(others, [*hot, gone, last], strict=False) for x in pair]
    results = await asyncio.gather(*mixed, *others[len(hot) + 2 :])
    assert path.read_bytes() == b"last"
    assert True in results  # the delete found v11 there
    assert temp_files(mirror.root) == []


async def test_close_stops_the_mirrors_own_threads(tmp_path: Path) -> None:
    """The worker threads belong to the mirror (no module-global pools) and end with close()."""
    mirror = Mirror(tmp_path)
    await mirror.write_bytes(mirror.path_for("http://s/small"), b"batched")
    await mirror.write_atomic(mirror.path_for("http://s/big"), chunks_of([b"streamed"]))
    await asyncio.gather(  # a batch of several: its fsyncs go to the flushers
        *(mirror.write_bytes(mirror.path_for(f"http://s/b{i}"), b"batched") for i in range(8))
    )
    durability = mirror.durability
    pools = [durability._batches, durability._streams, durability._flushers]
    threads = [t for pool in pools if pool is not None for t in pool._threads]
    assert durability._flushers is not None and len(threads) >= 3
    await mirror.settle()
    mirror.close()
    assert not any(thread.is_alive() for thread in threads)
    with pytest.raises(RuntimeError, match="closed"):
        await mirror.write_bytes(mirror.path_for("http://s/late"), b"too late")
