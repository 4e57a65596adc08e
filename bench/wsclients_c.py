"""Which client holds :mod:`bench.ws_fanout`'s subscribers: ``bench/wsclients.c``, or Python.

The clients stand for subscribers on other machines, but on the bench's
machine they share the gateway's CPUs: the Python client
(:mod:`bench.wsclients`) costs ~4.3 us per frame, 86-91 % of a core at
200,000 frames/s, so the gateway waited for a CPU and the figure was partly
the harness's.  ``bench/wsclients.c`` is the same client (same commands on
stdin, same JSON replies, same checks) in C, for a fraction of that.

It is compiled here, at run time, with the machine's C compiler (``$CC``,
else ``cc``, else ``gcc``; ``-O2``, libc only) into a directory of the
temporary directory named after the SHA-256 of the source and the compiler
command, so a changed source (or ``$CC``) is rebuilt and an unchanged one is
not.  ``auto`` falls back to the Python
client, with a one-line note, when there is no compiler or the build fails;
``c`` insists.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench._common import BENCH_DIR

SOURCE = BENCH_DIR / "wsclients.c"
IMPLEMENTATIONS = ("auto", "c", "python")


class Unavailable(RuntimeError):
    """The C client cannot be built here (the message says why, on one line)."""


def compiler() -> str | None:
    """The C compiler to use: ``$CC``, else ``cc``, else ``gcc`` on the PATH; None: none."""
    named = os.environ.get("CC")
    if named:
        return shutil.which(named.split()[0]) and named
    return shutil.which("cc") or shutil.which("gcc")


def build() -> Path:
    """The compiled C client: built now, unless a binary of this very source exists."""
    cc = compiler()
    if cc is None:
        raise Unavailable("no C compiler ($CC, cc or gcc)")
    digest = hashlib.sha256(SOURCE.read_bytes() + cc.encode()).hexdigest()[:16]
    # Per user: a directory another user made in /tmp could hold any binary.
    directory = Path(tempfile.gettempdir()) / f"rsnotify-wsclients-{os.getuid()}-{digest}"
    binary = directory / "wsclients"
    directory.mkdir(mode=0o700, exist_ok=True)
    if directory.stat().st_uid != os.getuid():
        raise Unavailable(f"{directory} belongs to another user")
    if binary.exists():
        return binary
    # A private name, then an atomic rename: two runs may build at once.
    partial = directory / f"wsclients.{os.getpid()}"
    try:
        done = subprocess.run([*cc.split(), "-O2", "-o", str(partial), str(SOURCE)],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"{cc} failed: {exc}") from None
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["no message"])[0]
        raise Unavailable(f"{cc} failed ({done.returncode}): {first}")
    os.replace(partial, binary)
    return binary


def command(implementation: str) -> tuple[str, list[str]]:
    """(the implementation that will run, the start of its command line) for ``auto|c|python``.

    The command line goes on with ``PORT COLLECTION COUNT`` and the options
    both clients take (``--nice``, ``--cpus``, ``--poll-ms``).
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"client implementation must be one of {IMPLEMENTATIONS}")
    if implementation != "python":
        try:
            return "c", [str(build())]
        except Unavailable as exc:
            if implementation == "c":
                raise
            print(f"note: C WebSocket client unavailable ({exc}); using the Python client",
                  flush=True)  # fmt: skip
    return "python", [sys.executable, "-m", "bench.wsclients"]
