"""The mirror: loc -> path mapping (pure, property-tested) and safe atomic writes on real files."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from urllib.parse import quote, unquote_to_bytes, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsnotify.errors import RsNotifyError
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
)

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
]


@pytest.mark.parametrize("loc", HOSTILE)
def test_path_for_refuses_hostile_locs(loc: str) -> None:
    with pytest.raises(UnsafePath):
        path_for(loc, ROOT)


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


async def test_paths_outside_the_root_are_refused(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path / "m")
    with pytest.raises(UnsafePath):
        await mirror.write_atomic(tmp_path / "elsewhere", chunks_of([b"x"]))
    with pytest.raises(UnsafePath):
        await mirror.write_atomic(mirror.root / "http" / ".." / "x", chunks_of([b"x"]))
    with pytest.raises(UnsafePath):
        await mirror.delete(tmp_path / "elsewhere")


def test_cleanup_temp_only_removes_temp_files(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path)
    keep = mirror.path_for("http://s/%25tmp.real")  # a resource that looks like a temp name
    keep.parent.mkdir(parents=True)
    keep.write_bytes(b"resource")
    (keep.parent / f"{TEMP_PREFIX}0123").write_bytes(b"junk")
    (mirror.root / f"{TEMP_PREFIX}root").write_bytes(b"junk")
    assert mirror.cleanup_temp() == 2
    assert keep.read_bytes() == b"resource"
    assert temp_files(mirror.root) == []
