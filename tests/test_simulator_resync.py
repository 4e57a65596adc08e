"""``rsnotify simulate`` as a real process, read by the reference client ``resync``.

``resync`` 2.0.1 (the OAI's Python implementation) is the independent check
that the simulator publishes documents other software understands: its
``--baseline`` must mirror the Source exactly as ``/_simulator/state`` says,
and its ``--parse`` must accept every document.
"""

from __future__ import annotations

import hashlib
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest

from rsnotify import sitemap, w3cdt
from tests.devstack import ManagedProcess, free_port, wait_for

RESYNC_SYNC = str(Path(sys.executable).with_name("resync-sync"))
SERVING = re.compile(r"^rsnotify simulate: serving (http://127\.0\.0\.1:\d+/)$")


def http(url: str, method: str = "GET") -> bytes:
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        data: bytes = response.read()
        return data


def http_json(url: str, method: str = "GET") -> Any:
    return json.loads(http(url, method))


def start(run: Callable[..., ManagedProcess], *args: str) -> tuple[ManagedProcess, str]:
    process = run("simulate", "--port", "0", *args)
    match = process.wait_for_line(SERVING, stream="stdout")
    return process, match.group(1)


def resync(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # cwd: resync writes its .resync-client-status.cfg into the working directory.
    return subprocess.run(
        [RESYNC_SYNC, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def every_document(base: str) -> list[str]:
    """URLs of every document reachable from the Source Description."""
    urls = [f"{base}.well-known/resourcesync"]
    for cap in sitemap.parse(http(urls[0])).entries:
        urls.append(cap.loc)
        for entry in sitemap.parse(http(cap.loc)).entries:
            urls.append(entry.loc)
            document = sitemap.parse(http(entry.loc))
            if document.is_index:
                urls.extend(e.loc for e in document)
    return urls


def test_cli_prints_one_serving_line_and_stops_cleanly(
    rsnotify_process: Callable[..., ManagedProcess],
) -> None:
    process, base = start(rsnotify_process, "--rate", "0", "--resources", "2")
    assert process.output("stdout").strip().splitlines() == [f"rsnotify simulate: serving {base}"]
    assert b"capabilitylist" in http(f"{base}.well-known/resourcesync")
    assert process.terminate() == 0
    assert process.output("stderr") == ""  # not a TTY: no status line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--weights", "often"], "weights"),
        (["--spec-version", "2.0"], "spec-version"),
        (["--rate", "-3"], "rate"),
        (["--resourcelist-size", "60000"], "resource list size"),
    ],
)
def test_cli_refuses_bad_options_with_a_clear_message(
    rsnotify_process: Callable[..., ManagedProcess], args: list[str], message: str
) -> None:
    process = rsnotify_process("simulate", "--port", "0", *args)
    assert process.wait() == 2
    assert message in process.output("stderr")
    assert "Traceback" not in process.output("stderr")


def test_cli_refuses_a_foreign_dir(
    rsnotify_process: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    (tmp_path / "mine.txt").write_text("x")
    process = rsnotify_process("simulate", "--port", "0", "--dir", tmp_path)
    assert process.wait() == 2
    assert "not empty" in process.output("stderr")
    assert "Traceback" not in process.output("stderr")


def test_resync_baseline_mirrors_exactly_the_ground_truth(
    rsnotify_process: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    _, base = start(
        rsnotify_process,
        "--collections",
        "2",
        "--resources",
        "25",
        "--resourcelist-size",
        "10",  # the Resource Lists are indexes with parts
        "--changelist-size",
        "40",
        "--rate",
        "2000",
        "--seed",
        "5",
    )
    stats = f"{base}_simulator/stats"
    wait_for(lambda: http_json(stats)["changes"] >= 150, message="simulator made no changes")
    http_json(f"{base}_simulator/pause", "POST")
    state = http_json(f"{base}_simulator/state")["collections"]
    assert len(state) == 2
    for cap, truth in state.items():
        collection = cap[len(base) :].split("/")[0]
        mirror = tmp_path / collection
        done = resync(
            "--baseline",
            "--delete",
            "--capabilitylist",
            cap,
            f"{base}{collection}={mirror}",
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SYNCED" in done.stdout + done.stderr
        files = {
            f"{base}{collection}/{path.relative_to(mirror).as_posix()}": hashlib.sha256(
                path.read_bytes()
            ).hexdigest()
            for path in mirror.rglob("*")
            if path.is_file()
        }
        assert files == truth["resources"]
        assert truth["changes"] > 0
        audit = resync(
            "--audit", "--capabilitylist", cap, f"{base}{collection}={mirror}", cwd=tmp_path
        )
        assert "IN SYNC" in audit.stdout + audit.stderr
    assert http_json(stats)["changes"] == sum(t["changes"] for t in state.values())


def documents_after_changes(
    run: Callable[..., ManagedProcess], *extra: str
) -> tuple[str, list[str]]:
    _, base = start(
        run,
        "--collections",
        "2",
        "--resources",
        "25",
        "--resourcelist-size",
        "10",
        "--changelist-size",
        "15",
        "--rate",
        "0",
        *extra,
    )
    http_json(f"{base}_simulator/advance?n=80", "POST")
    urls = every_document(base)
    # description, 2 capability lists, 2 Resource List indexes and their parts,
    # 2 Change List Indexes, and each collection's closed and open Change Lists
    assert len([u for u in urls if "/resourcelist/" in u]) >= 4
    assert len([u for u in urls if "/changes/" in u]) >= 6
    assert len(urls) >= 1 + 2 + 2 + 4 + 2 + 6
    return base, urls


def test_resync_parses_every_document(
    rsnotify_process: Callable[..., ManagedProcess], tmp_path: Path
) -> None:
    _, urls = documents_after_changes(rsnotify_process)

    def check(url: str) -> None:
        document = sitemap.parse(http(url))
        done = resync("--parse", "--sitemap", url, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert (
            f"Parsed {document.capability} document with {len(document)} entries" in done.stdout
        ), (url, done.stdout, done.stderr)

    with ThreadPoolExecutor(max_workers=3) as pool:
        list(pool.map(check, urls))


def test_resync_reads_spec_1_0_change_times_from_lastmod(
    rsnotify_process: Callable[..., ManagedProcess],
) -> None:
    # In-process use of the library behind resync-sync: its 1.0 mode ignores
    # rs:md datetime, so the change times must come from <lastmod> alone.
    from resync.sitemap import Sitemap
    from resync.w3c_datetime import str_to_datetime

    _, urls = documents_after_changes(rsnotify_process, "--spec-version", "1.0")
    changelists = [u for u in urls if "/changes/" in u]
    for url in changelists:
        ours = sitemap.parse(http(url))
        theirs = Sitemap(spec_version="1.0").parse_xml(fh=BytesIO(http(url)))
        assert theirs.md["capability"] == "changelist"
        assert len(theirs.resources) == len(ours)
        for mine, other in zip(ours, theirs.resources, strict=True):
            assert mine.datetime is None and mine.lastmod is not None
            assert other.uri == mine.loc and other.change == mine.change
            assert other.timestamp == str_to_datetime(w3cdt.format(mine.lastmod))


def test_resync_baseline_from_the_dir_copy_behind_a_static_server(
    rsnotify_process: Callable[..., ManagedProcess],
    process_factory: Callable[..., ManagedProcess],
    tmp_path: Path,
) -> None:
    # The nginx use case: the documents name the static server (--base-url),
    # which serves the --dir copy; the simulator writes it and answers control.
    out = tmp_path / "site"
    port = free_port()
    static_base = f"http://127.0.0.1:{port}/"
    _, live = start(
        rsnotify_process,
        "--dir", out,
        "--base-url", static_base,
        "--resources", "20",
        "--changelist-size", "10",
        "--rate", "0",
    )  # fmt: skip
    assert live != static_base  # the serving line names where the simulator listens
    http_json(f"{live}_simulator/advance?n=35", "POST")  # answers once the copy is written
    static = process_factory(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "-d", out, str(port)],
        name="http.server",
    )
    static.wait_for_line(r"Serving HTTP")
    cap = f"{static_base}c1/capabilitylist.xml"
    state = http_json(f"{live}_simulator/state")["collections"]
    assert list(state) == [cap]
    mirror = tmp_path / "mirror"
    done = resync("--baseline", f"{static_base}c1={mirror}", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    files = {
        f"{static_base}c1/{path.relative_to(mirror).as_posix()}": hashlib.sha256(
            path.read_bytes()
        ).hexdigest()
        for path in mirror.rglob("*")
        if path.is_file()
    }
    assert files == state[cap]["resources"]


def test_cli_shows_a_live_status_line_on_a_terminal(tmp_path: Path) -> None:
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "rsnotify.cli", "simulate", "--rate", "200"],
        stdout=subprocess.PIPE,
        stderr=terminal,
    )
    os.close(terminal)
    seen = b""
    try:
        assert process.stdout is not None
        assert SERVING.match(process.stdout.readline().decode().strip())

        def status_shown() -> bool:
            nonlocal seen
            while select.select([controller], [], [], 0)[0]:
                seen += os.read(controller, 4096)
            return (
                re.search(rb"running \| changes [\d,]+ \| [\d,]+/s \| open list #1", seen)
                is not None
            )

        wait_for(status_shown, message=lambda: f"no status line: {seen!r}")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
        os.close(controller)
